"""End to end on a real node: real pods, Services, DNS; the chart's operator as a real pod tunes the
example CPU TuningJob through real tracker/server/client/merge pods, surviving a killed client pod,
a killed server pod and a killed operator pod; `helm test` passes."""

from __future__ import annotations

import base64
import io
import json
import tarfile
import time

import yaml

from sharetune_dev.cluster import realrun
from sharetune_dev.cluster.realrun import NAMESPACE, kubectl

GAP_S = 10  # between kills: long enough for the previous victim's replacement to be scheduled
OPERATOR = "app.kubernetes.io/component=operator,app.kubernetes.io/instance=sharetune"
PROBE = """
import socket, ssl, urllib.request
ip = socket.gethostbyname('kubernetes.default.svc.cluster.local')
ctx = ssl.create_default_context(cafile='/var/run/secrets/kubernetes.io/serviceaccount/ca.crt')
tok = open('/var/run/secrets/kubernetes.io/serviceaccount/token').read()
req = urllib.request.Request('https://kubernetes.default.svc/version', headers={'Authorization': 'Bearer ' + tok})
print('PROBE', ip, urllib.request.urlopen(req, context=ctx).status)
"""


def test_pods_reach_services_by_dns_name(real) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": "default"},
           "spec": {"restartPolicy": "Never", "containers": [{
               "name": "probe", "image": "localhost/sharetune-tuner:0.1.0", "imagePullPolicy": "Never",
               "command": ["python", "-c", PROBE]}]}}
    kubectl(real, "apply", "-f", "-", stdin=json.dumps(pod))
    deadline = time.monotonic() + 120
    phase = ""
    while time.monotonic() < deadline and phase not in ("Succeeded", "Failed"):
        time.sleep(1)
        phase = json.loads(kubectl(real, "get", "pod", "probe", "-o", "json").stdout)["status"].get("phase", "")
    logs = kubectl(real, "logs", "probe").stdout
    assert phase == "Succeeded", logs
    assert "PROBE 10.96.0.1 200" in logs  # DNS (CoreDNS) -> Service IP (kube-proxy) -> API server
    kubectl(real, "delete", "pod", "probe", "--wait=false")


def test_tuningjob_succeeds_on_real_pods_despite_killed_pods(real) -> None:
    realrun.helm_install(real)
    op = realrun.pods(real, selector=OPERATOR)
    assert [p["status"]["phase"] for p in op] == ["Running"]
    body = yaml.safe_load(realrun.EXAMPLE.read_text())
    # The example, with twice its trials: with the intrinsics cache it finishes in well under a
    # minute, too soon for three kills spaced so that each recovery is under way before the next.
    body["spec"]["trials"]["total"] *= 2
    body["spec"]["trials"]["perTask"] *= 2
    name = body["metadata"]["name"]
    kubectl(real, "apply", "-n", NAMESPACE, "-f", "-", stdin=json.dumps(body))
    t0 = time.monotonic()
    killed: dict[str, str] = {}
    at: list[float] = []  # when each kill happened: the next one comes GAP_S later

    def faults(j):
        st = j.get("status") or {}
        if "client" not in killed and (st.get("trialsCompleted") or 0) > 0:
            clients = [p for p in realrun.pods(real,
                                               selector=f"sharetune.io/job={name},app.kubernetes.io/component=client")
                       if p["status"]["phase"] == "Running"]
            if clients:
                victim = clients[0]["metadata"]["name"]
                kubectl(real, "delete", "pod", "-n", NAMESPACE, victim, "--grace-period=0", "--force")
                killed["client"] = victim
                at.append(time.monotonic())
        elif "client" in killed and "server" not in killed and time.monotonic() - at[-1] > GAP_S:
            servers = [p for p in realrun.pods(real,
                                               selector=f"sharetune.io/job={name},app.kubernetes.io/component=server")
                       if p["status"]["phase"] == "Running"]
            if servers:
                victim = servers[0]["metadata"]["name"]
                kubectl(real, "delete", "pod", "-n", NAMESPACE, victim, "--grace-period=0", "--force")
                killed["server"] = victim
                at.append(time.monotonic())
        elif "server" in killed and "operator" not in killed and time.monotonic() - at[-1] > GAP_S:
            ops = realrun.pods(real, selector=OPERATOR)
            if ops:
                victim = ops[0]["metadata"]["name"]
                kubectl(real, "delete", "pod", "-n", NAMESPACE, victim, "--grace-period=0", "--force")
                killed["operator"] = victim

    j = realrun.wait_phase(real, name, on_tick=faults)
    wall = time.monotonic() - t0
    st = j["status"]
    assert st["phase"] == "Succeeded", realrun.diagnostics(real)
    assert set(killed) == {"client", "server", "operator"}, killed
    assert st["trialsCompleted"] >= body["spec"]["trials"]["total"]
    assert st["trialsPerSecond"] > 0
    assert st["tunedLatencyMs"] > 0 and st["untunedLatencyMs"] > 0
    assert st["resultLocation"] == f"configmap://{NAMESPACE}/{name}-result"
    result = json.loads(kubectl(real, "get", "cm", f"{name}-result", "-n", NAMESPACE, "-o", "json").stdout)
    blob = base64.b64decode(result["binaryData"]["data.tar.gz"])
    with tarfile.open(fileobj=io.BytesIO(blob)) as t:
        stored = t.getnames()
    assert any("records" in n for n in stored) and any("best" in n for n in stored), stored
    print(f"\nreal node: {name} Succeeded in {wall:.0f}s, {st['trialsCompleted']} trials, "
          f"{st['trialsPerSecond']} trials/s, {st['untunedLatencyMs']} -> {st['tunedLatencyMs']} ms; killed {killed}")


def test_helm_test_passes(real) -> None:
    r = realrun.helm_test(real)
    assert r.returncode == 0, r.stdout + r.stderr + realrun.diagnostics(real)
    assert "TEST SUITE:     sharetune-smoke-test" in r.stdout and "Phase:          Succeeded" in r.stdout, r.stdout
    smoke = realrun.job(real, "sharetune-smoke")  # the TuningJob the hook's pod applied and waited for
    assert smoke["status"]["phase"] == "Succeeded", smoke.get("status")
