"""The job's NetworkPolicy, enforced on a real node (kube-router's firewall, started by ``RealNode``):
while the example CPU TuningJob (with a builder pod) tunes, TCP connections to every port its
tracker, servers and builder declare are tried from probe pods:

* a pod of another namespace: no port opens, refused or timed out (the chart's metrics scrapers
  are narrowed to the ``monitoring`` namespace here, so the metrics port neither);
* a pod of the job's namespace without the job's label: no port opens;
* a pod of the ``monitoring`` namespace: the metrics port only;
* a pod of the job's namespace with the job's label (``sharetune.io/job: <job>``): every port
  accepts it before the failed attempts, and none refuses it after them, so the refusals come
  from the policy, not from ports that were not listening (nor from a network that drops everything).

The job must still tune to the end, its clients' builds sent to the builder pod."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import yaml

from sharetune_dev.cluster import realrun
from sharetune_dev.cluster.realrun import NAMESPACE, kubectl

OTHER_NS = "netpol-outsider"
MONITORING_NS = "monitoring"
METRICS_PORT = 9400
IMAGE = "localhost/sharetune-tuner:0.1.0"
CONNECT_TIMEOUT_S = 3.0
TARGETS = ("tracker", "server", "builder")
BUILT = re.compile(r"candidates built: remote (\d+), here (\d+)")
# Run in a probe pod: connect to each (ip, port) of argv[1] at once; print {"ip:port": outcome}.
CONNECT = f"""
import json, socket, sys
from concurrent.futures import ThreadPoolExecutor
def one(t):
    s = socket.socket()
    s.settimeout({CONNECT_TIMEOUT_S})
    try:
        s.connect((t[0], t[1]))
        return "open"
    except ConnectionRefusedError:
        return "refused"
    except socket.timeout:
        return "timeout"
    except OSError as e:
        return "error " + str(e.errno)
    finally:
        s.close()
ts = json.loads(sys.argv[1])
with ThreadPoolExecutor(len(ts)) as ex:
    print(json.dumps({{f"{{i}}:{{p}}": r for (i, p), r in zip(ts, ex.map(one, ts))}}))
"""


def _probe_pod(name: str, namespace: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": {"terminationGracePeriodSeconds": 0, "automountServiceAccountToken": False,
                     "containers": [{"name": "probe", "image": IMAGE, "imagePullPolicy": "Never",
                                     "command": ["python", "-c", "import time; time.sleep(3600)"]}]}}


def _running(real, namespace: str, name: str) -> bool:
    r = kubectl(real, "get", "pod", name, "-n", namespace, "-o", "json", check=False)
    return r.returncode == 0 and json.loads(r.stdout)["status"].get("phase") == "Running"


def _connect(real, source: tuple[str, str], targets: list[tuple[str, int]]) -> dict[str, str]:
    ns, pod = source
    r = kubectl(real, "exec", "-n", ns, pod, "--", "python", "-c", CONNECT, json.dumps(targets), timeout=60)
    return json.loads(r.stdout.strip().splitlines()[-1])


def _targets(real, job: str) -> dict[str, tuple[str, int]]:
    """'<component> <pod>/<port name>' -> (pod IP, port) for every declared port of the job's
    tracker, server and builder pods that run."""
    out = {}
    for p in realrun.pods(real, selector=f"sharetune.io/job={job}"):
        comp = p["metadata"]["labels"].get("app.kubernetes.io/component")
        if comp not in TARGETS or p["status"].get("phase") != "Running" or not p["status"].get("podIP"):
            continue
        for c in p["spec"]["containers"]:
            for port in c.get("ports", []):
                out[f"{comp} {p['metadata']['name']}/{port.get('name', port['containerPort'])}"] = \
                    (p["status"]["podIP"], int(port["containerPort"]))
    return out


def test_only_the_jobs_own_pods_reach_its_tracker_servers_and_builders(real) -> None:
    t_start = time.monotonic()
    for ns in (OTHER_NS, MONITORING_NS):
        kubectl(real, "create", "namespace", ns)
    scrapers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": MONITORING_NS}}}]
    realrun.helm_install(real, values=("--set-json", f"networkPolicy.metricsScrapers={json.dumps(scrapers)}"))
    body = yaml.safe_load(realrun.EXAMPLE.read_text())
    name = body["metadata"]["name"]
    # Twice the example's trials (it may otherwise end before every target has been probed) and
    # one builder pod, so the build service's port is among the targets.
    body["spec"]["trials"]["total"] *= 2
    body["spec"]["trials"]["perTask"] *= 2
    body["spec"]["builders"] = {"replicas": 1, "workers": 1,
                                "resources": {"requests": {"cpu": "250m", "memory": "512Mi"},
                                              "limits": {"cpu": "500m", "memory": "1Gi"}}}
    sources = {
        "member": (NAMESPACE, "probe-member", {"sharetune.io/job": name}),
        "same-namespace": (NAMESPACE, "probe-unlabelled", None),
        "other-namespace": (OTHER_NS, "probe-outsider", None),
        "monitoring": (MONITORING_NS, "probe-scraper", None),
    }
    for ns, pod, labels in sources.values():
        kubectl(real, "apply", "-f", "-", stdin=json.dumps(_probe_pod(pod, ns, labels)))
    deadline = time.monotonic() + 180
    while not all(_running(real, ns, pod) for ns, pod, _ in sources.values()):
        assert time.monotonic() < deadline, kubectl(real, "get", "pods", "-A", "-o", "wide").stdout
        time.sleep(1)

    kubectl(real, "apply", "-n", NAMESPACE, "-f", "-", stdin=json.dumps(body))
    t_job = time.monotonic()

    # Wait for the targets: 1 tracker, the servers, the builder, each pod running and every
    # declared port seen accepting a connection from the job's own pod. Probed as soon as they
    # run, before the clients' sessions: a TVM RPC server accepts nothing while it serves one
    # session (its listen backlog is 1; further connection attempts time out).
    want = {"tracker": 1, "server": body["spec"]["servers"]["replicas"], "builder": 1}
    member = sources["member"][:2]
    opened: set[tuple[str, int]] = set()
    deadline = time.monotonic() + 300
    while True:
        phase = (realrun.job(real, name).get("status") or {}).get("phase")
        assert phase not in ("Succeeded", "Failed"), f"{name} {phase} before its pods were probed"
        targets = _targets(real, name)
        have = {c: len({k.split("/")[0] for k in targets if k.startswith(c + " ")}) for c in want}
        pending = sorted(set(targets.values()) - opened)
        if pending:
            seen_open = _connect(real, member, pending)
            opened |= {a for a in pending if seen_open[f"{a[0]}:{a[1]}"] == "open"}
        if have == want and set(targets.values()) <= opened:
            break
        assert time.monotonic() < deadline, f"targets {have} of {want}; open {opened}; last: {targets}\n" \
            + realrun.diagnostics(real)
        time.sleep(2)
    t_ready = time.monotonic()
    policy = json.loads(kubectl(real, "get", "networkpolicy", f"{name}-network", "-n", NAMESPACE,
                                "-o", "json").stdout)  # the operator creates it before the job's pods
    assert policy["spec"]["podSelector"] == {"matchLabels": {"sharetune.io/job": name}}

    addrs = sorted(set(targets.values()))
    seen = {s: _connect(real, sources[s][:2], addrs) for s in ("same-namespace", "other-namespace", "monitoring")}
    # After: the targets still listen ("timeout": an RPC server busy with a session, whose full
    # backlog drops the attempt; a port no longer listening would answer "refused").
    seen["member"] = _connect(real, member, addrs)
    t_probed = time.monotonic()

    table = {k: {s: seen[s][f"{ip}:{port}"] for s in seen} for k, (ip, port) in sorted(targets.items())}
    report = json.dumps(table, indent=1)
    for k, (ip, port) in targets.items():
        row = table[k]
        assert row["member"] in ("open", "timeout"), report
        for s in ("same-namespace", "other-namespace"):
            assert row[s] in ("refused", "timeout"), f"{s} reached {k}\n{report}"
        if port == METRICS_PORT:
            assert row["monitoring"] == "open", report
        else:
            assert row["monitoring"] in ("refused", "timeout"), f"monitoring reached {k}\n{report}"

    j = realrun.wait_phase(real, name)
    st = j["status"]
    assert st["phase"] == "Succeeded", realrun.diagnostics(real)
    assert st["trialsCompleted"] >= body["spec"]["trials"]["total"]
    remote = 0
    for p in realrun.pods(real, selector=f"sharetune.io/job={name},app.kubernetes.io/component=client"):
        m = BUILT.search(kubectl(real, "logs", "-n", NAMESPACE, p["metadata"]["name"], check=False).stdout)
        remote += int(m.group(1)) if m else 0
    assert remote > 0, "no candidate was built on the builder pod\n" + realrun.diagnostics(real)
    outcomes = {s: sorted({v for v in seen[s].values()}) for s in seen}
    print(f"\nnetwork isolation: {len(targets)} ports of {sum(want.values())} pods; outcomes {outcomes}; "
          f"pods ready {t_ready - t_job:.0f}s after apply, probes {t_probed - t_ready:.1f}s; {name} Succeeded "
          f"{time.monotonic() - t_job:.0f}s after apply ({st['trialsCompleted']} trials, {remote} built remotely); "
          f"test {time.monotonic() - t_start:.0f}s\n{report}")
    for ns, pod, _ in sources.values():
        kubectl(real, "delete", "pod", pod, "-n", ns, "--wait=false", check=False)
