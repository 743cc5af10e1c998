"""Fault scenarios: a real TuningJob, mid-tuning, hit by one fault; then did it finish, and is
every record that had been measured in its merged result?

Real parts: the local control plane (etcd, kube-apiserver, controllers, scheduler, kwok), the
operator as its own process (`sharetune operator`), the S3 server, and the tuner processes
(tracker, servers, clients, merge) run from the pods' own args by :class:`ProcessKubelet`
(``sharetune_dev.podsim``, the developer tooling).
Shared by ``tests/faults/test_faults.py`` (asserts) and ``bench/fault_matrix.py`` (the table).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from kubernetes import client

from sharetune.procs import ProcessGroup
from sharetune_dev.podsim import ProcessKubelet

GROUP, VERSION, PLURAL = "sharetune.io", "v1alpha1", "tuningjobs"
FAULTS = ("operator_killed", "client_killed", "server_killed", "tracker_killed", "mps_daemon_killed",
          "pool_daemon_killed", "apiserver_restarted", "etcd_restarted", "s3_down_60s")
POOL_JOBS = ("ft", "fu")  # pool_daemon_killed: two jobs on one GPU pool
TOTAL_TRIALS = 16


@dataclass
class FaultRow:
    fault: str
    job_succeeded: bool
    records_lost: int
    trials_redone: int
    recovery_s: float | None
    records_before_fault: int
    records_in_result: int
    duplicated_children: list[str]
    phase: str
    reason: str
    wall_s: float
    notes: str = ""
    secret_leaks: list[str] = field(default_factory=list)  # places the S3 secret key showed up in


class OperatorProcess:
    """`sharetune operator` as a process of its own, so it can be SIGKILLed like a crashed pod."""

    def __init__(self, kubeconfig: Path, namespace: str, log: Path, env: dict[str, str] | None = None) -> None:
        self.kubeconfig, self.namespace, self.log = kubeconfig, namespace, log
        # Mode exclusive (a daemon per job) unless a test asks for GPU pools.
        self.env = {"SHARETUNE_GPU_SHARING_MODE": "exclusive", **(env or {})}
        self.proc = ProcessGroup("operator", [sys.executable, "-m", "sharetune.cli", "operator", "--namespace",
                                              namespace, "--metrics-port", "-1", "--liveness-port", "-1"], log)
        self.starts = 0

    def start(self) -> None:
        self.proc.env = {**os.environ, "KUBECONFIG": str(self.kubeconfig), "SHARETUNE_STATUS_INTERVAL": "1",
                         **self.env}
        self.proc.start()
        self.starts += 1

    def kill(self) -> None:
        """SIGKILL to the whole group: a crashed pod."""
        self.proc.kill()

    def stop(self) -> None:
        self.proc.stop(grace_s=5)

    def alive(self) -> bool:
        return self.proc.alive()


@dataclass
class FaultEnv:
    cluster: Any  # sharetune_dev.cluster.harness.LocalCluster
    k8s: Any
    s3: Any  # sharetune_dev.cluster.s3.LocalS3
    tmp: Path
    log: Callable[[str], None] = print


def job_body(name: str, fault: str, s3_endpoint: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"model": {"name": "tiny_cnn", "inputShape": [1, 3, 64, 64]}, "target": "llvm",
                            "trials": {"total": TOTAL_TRIALS, "perTask": 4, "perIteration": 2},
                            "servers": {"replicas": 2}, "clients": {"shards": 2, "builderWorkers": 1}}
    if fault == "mps_daemon_killed":
        spec.update(target="cuda", mps=True)
    if s3_endpoint:
        spec["output"] = {"s3": {"endpoint": s3_endpoint, "bucket": "faults", "prefix": "runs",
                                 "credentialsSecret": {"name": "s3-creds"}}}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TuningJob", "metadata": {"name": name}, "spec": spec}


def _job(k8s: Any, ns: str, name: str) -> dict[str, Any]:
    return client.CustomObjectsApi(k8s).get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:
        return None


def measured_records(sim: ProcessKubelet, job: str | None = None) -> Counter[Any]:
    """Every record any client pod (of ``job``) has in its database right now (what was measured)."""
    from sharetune_tuner.store.records import record_keys

    keys: Counter[Any] = Counter()
    for p in sim.history:
        if p.component == "client" and (job is None or p.pod.startswith(f"{job}-clients-")):
            keys |= record_keys(p.work / "emptydir" / "work" / "shard")  # | : a restored copy is not a new trial
    return keys


def _restored(log: Path) -> int:
    import re

    text = log.read_text(errors="replace") if log.exists() else ""
    m = re.search(r"restored (\d+) records", text)
    return int(m.group(1)) if m else 0


def _measured_total(sim: ProcessKubelet) -> int:
    from sharetune_tuner.store.records import stats

    total = 0
    for p in sim.history:
        if p.component == "client":
            total += stats(p.work / "emptydir" / "work" / "shard").total - _restored(p.log)
    return total


def children_report(k8s: Any, ns: str, job: str) -> list[str]:
    """Children that exist more than once (or that the plan does not have): should be empty."""
    sel = f"sharetune.io/job={job}"
    core, apps, batch = client.CoreV1Api(k8s), client.AppsV1Api(k8s), client.BatchV1Api(k8s)
    bad = []
    deps = [d.metadata.name for d in apps.list_namespaced_deployment(ns, label_selector=sel).items]
    jobs = [j.metadata.name for j in batch.list_namespaced_job(ns, label_selector=sel).items]
    svcs = [s.metadata.name for s in core.list_namespaced_service(ns, label_selector=sel).items]
    for kind, names, want in (("Deployment", deps, {f"{job}-tracker", f"{job}-servers"}),
                              ("Job", jobs, {f"{job}-clients", f"{job}-merge"}), ("Service", svcs, {f"{job}-tracker"})):
        if len(names) != len(set(names)) or set(names) - want:
            bad.append(f"{kind}: {sorted(names)}")
    daemons = [p for p in core.list_namespaced_pod(
                   ns, label_selector=sel + ",app.kubernetes.io/component=mps-daemon").items
               if p.metadata.deletion_timestamp is None]
    if len(daemons) > 1:
        bad.append(f"MPS daemon pods: {[p.metadata.name for p in daemons]}")
    # No more live server/tracker pods than asked for (a second ReplicaSet left running, say).
    for comp, want_n in (("server", 2), ("tracker", 1)):
        live = [p for p in core.list_namespaced_pod(
                    ns, label_selector=sel + f",app.kubernetes.io/component={comp}").items
                if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]
        if len(live) > want_n:
            bad.append(f"{comp} pods running: {len(live)} > {want_n}")
    return bad


def run_fault(env: FaultEnv, fault: str, timeout_s: float = 900.0) -> FaultRow:
    assert fault in FAULTS, fault
    if fault == "pool_daemon_killed":
        return run_pool_fault(env, timeout_s)
    k8s, core = env.k8s, client.CoreV1Api(env.k8s)
    ns = f"f-{fault.replace('_', '-')[:20]}-{uuid.uuid4().hex[:5]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    work = env.tmp / ns
    work.mkdir(parents=True)
    use_s3 = fault == "s3_down_60s"
    extra_env: dict[str, str] = {}
    if use_s3:
        core.create_namespaced_secret(ns, client.V1Secret(metadata=client.V1ObjectMeta(name="s3-creds"), string_data={
            "AWS_ACCESS_KEY_ID": "sharetune", "AWS_SECRET_ACCESS_KEY": "fault-test-secret"}))
    op = OperatorProcess(env.cluster.kubeconfig, ns, work / "operator.log")
    sim = ProcessKubelet(k8s, ns, env.cluster.server, env.cluster.pki.ca.cert, workdir=work / "pods",
                         cpu_for_gpu=fault == "mps_daemon_killed", extra_env=extra_env)
    t_start = time.monotonic()
    name = "ft"
    notes = ""
    op.start()
    sim.start()
    try:
        client.CustomObjectsApi(k8s).create_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, job_body(name, fault, env.s3.endpoint if use_s3 else None))
        # Mid-tuning: some trials done, most still owed.
        _wait(env, "trials under way", lambda: (_try(lambda: _job(k8s, ns, name)) or {}).get("status", {})
              .get("trialsCompleted", 0) >= 4, 420)
        before = measured_records(sim)
        done_at_fault = _job(k8s, ns, name)["status"]["trialsCompleted"]
        t_fault = time.monotonic()
        env.log(f"[{fault}] injecting with {sum(before.values())} records measured")
        if fault == "operator_killed":
            op.kill()
            time.sleep(3)
            op.start()
        elif fault == "client_killed":
            sim.kill("client", 0)
        elif fault == "server_killed":
            sim.kill("server", 0)
        elif fault == "tracker_killed":
            sim.kill("tracker", 0)
        elif fault == "mps_daemon_killed":
            sim.kill("mps-daemon", 0)
        elif fault == "apiserver_restarted":
            env.cluster.restart("kube-apiserver", down_s=5)
        elif fault == "etcd_restarted":
            env.cluster.restart("etcd", down_s=5)
        elif fault == "s3_down_60s":
            env.s3.stop()
            time.sleep(60)
            env.s3.start()
        # Recovered = the job moves on again: more trials in its status than at the fault, or a
        # later phase.
        def moving() -> bool:
            st = (_try(lambda: _job(k8s, ns, name)) or {}).get("status", {})
            return st.get("trialsCompleted", 0) > done_at_fault or st.get("phase") in ("Merging", "Succeeded")
        _wait(env, "progress after the fault", moving, timeout_s)
        recovery_s = time.monotonic() - t_fault
        if fault == "mps_daemon_killed":
            st = _wait(env, "MPS recovery in status", lambda: (s := _job(k8s, ns, name)["status"]).get("mpsRecoveries")
                       and s, 120)
            notes = (f"mpsRecoveries={st['mpsRecoveries']} "
                     "(GPU mocked: cuda job run on CPU, stand-in MPS control binary)")
        final = _wait(env, "Succeeded or Failed", lambda: (s := _job(k8s, ns, name)["status"]).get("phase")
                      in ("Succeeded", "Failed") and s, timeout_s)
        result_keys = _result_keys(env, ns, name, use_s3, work)
        lost = before - result_keys
        in_result = sum(result_keys.values())
        reason = next((c.get("reason", "") for c in final.get("conditions", []) if c.get("type") == "Ready"), "")
        row = FaultRow(fault=fault, job_succeeded=final["phase"] == "Succeeded", records_lost=sum(lost.values()),
                       trials_redone=max(0, _measured_total(sim) - in_result), recovery_s=round(recovery_s, 1),
                       records_before_fault=sum(before.values()), records_in_result=in_result,
                       duplicated_children=children_report(k8s, ns, name), phase=final["phase"], reason=reason,
                       wall_s=round(time.monotonic() - t_start, 1), notes=notes)
        if use_s3:
            row.secret_leaks = _leaks(k8s, ns, name, [*(p.log for p in sim.history), op.log], work / "result",
                                      "fault-test-secret")
        if not op.alive():
            row.notes += " operator process not alive at the end"
        return row
    finally:
        sim.stop()
        op.stop()
        _try(lambda: core.delete_namespace(ns))


def run_pool_fault(env: FaultEnv, timeout_s: float = 900.0) -> FaultRow:
    """Two jobs on one GPU pool (mode pool, docs/gpu-pools.md), its MPS daemon killed while both
    tune: the pool restarts in place (its restartCount tells the operator), the servers of both
    jobs are rolled against it, and both jobs Succeed with every record measured before the fault
    (GPU mocked as for mps_daemon_killed: cuda jobs run on the CPU, a stand-in MPS control binary)."""
    k8s, core = env.k8s, client.CoreV1Api(env.k8s)
    ns = f"f-pool-daemon-{uuid.uuid4().hex[:5]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    work = env.tmp / ns
    work.mkdir(parents=True)
    op = OperatorProcess(env.cluster.kubeconfig, ns, work / "operator.log",
                         env={"SHARETUNE_GPU_SHARING_MODE": "pool", "SHARETUNE_GPU_POOL_NAMESPACE": ns})
    sim = ProcessKubelet(k8s, ns, env.cluster.server, env.cluster.pki.ca.cert, workdir=work / "pods", cpu_for_gpu=True)
    t_start = time.monotonic()
    op.start()
    sim.start()
    crs = client.CustomObjectsApi(k8s)
    try:
        for name in POOL_JOBS:
            body = job_body(name, "mps_daemon_killed", None)
            body["spec"].pop("mps", None)
            body["spec"]["gpuSharing"] = {"share": 50}
            body["spec"]["servers"] = {"replicas": 2, "threadPercentage": 25}
            crs.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)
        _wait(env, "both jobs tuning", lambda: all((_try(lambda n=n: _job(k8s, ns, n)) or {}).get("status", {})
                                                   .get("trialsCompleted", 0) >= 4 for n in POOL_JOBS), 420)
        placed = {n: _job(k8s, ns, n)["status"]["gpuPlacement"]["node"] for n in POOL_JOBS}
        assert len(set(placed.values())) == 1, placed  # 50 + 50: both on the one GPU, one pool
        before = {n: measured_records(sim, n) for n in POOL_JOBS}
        done_at_fault = {n: _job(k8s, ns, n)["status"]["trialsCompleted"] for n in POOL_JOBS}
        t_fault = time.monotonic()
        env.log(f"[pool_daemon_killed] injecting with {sum(sum(b.values()) for b in before.values())} records")
        sim.kill("gpu-pool", 0)

        def moving() -> bool:
            sts = [(_try(lambda n=n: _job(k8s, ns, n)) or {}).get("status", {}) for n in POOL_JOBS]
            return all(st.get("trialsCompleted", 0) > done_at_fault[n] or st.get("phase") in ("Merging", "Succeeded")
                       for n, st in zip(POOL_JOBS, sts))
        _wait(env, "both jobs progress after the fault", moving, timeout_s)
        recovery_s = time.monotonic() - t_fault
        apps = client.AppsV1Api(k8s)
        rolled = [n for n in POOL_JOBS if "sharetune.io/restartedAt" in (
            apps.read_namespaced_deployment(f"{n}-servers", ns).spec.template.metadata.annotations or {})]
        finals = {n: _wait(env, f"{n} Succeeded or Failed", lambda n=n: (s := _job(k8s, ns, n)["status"]).get("phase")
                           in ("Succeeded", "Failed") and s, timeout_s) for n in POOL_JOBS}
        lost = in_result = 0
        dups: list[str] = []
        for n in POOL_JOBS:
            keys = _result_keys(env, ns, n, False, work / n)
            lost += sum((before[n] - keys).values())
            in_result += sum(keys.values())
            dups += children_report(k8s, ns, n)
        pools = [p.metadata.name for p in core.list_namespaced_pod(
            ns, label_selector="app.kubernetes.io/component=gpu-pool").items if p.metadata.deletion_timestamp is None]
        if len(pools) > 1:
            dups.append(f"GPU pool pods: {pools}")
        ok = all(f["phase"] == "Succeeded" for f in finals.values())
        reasons = {n: next((c.get("reason", "") for c in f.get("conditions", []) if c.get("type") == "Ready"), "")
                   for n, f in finals.items()}
        return FaultRow(fault="pool_daemon_killed", job_succeeded=ok, records_lost=lost,
                        trials_redone=max(0, _measured_total(sim) - in_result), recovery_s=round(recovery_s, 1),
                        records_before_fault=sum(sum(b.values()) for b in before.values()),
                        records_in_result=in_result, duplicated_children=dups,
                        phase="/".join(f["phase"] for f in finals.values()), reason="/".join(reasons.values()),
                        wall_s=round(time.monotonic() - t_start, 1),
                        notes=f"two jobs on one pool; servers rolled: {rolled}; GPU mocked: cuda jobs run on CPU, "
                              "stand-in MPS control binary")
    finally:
        sim.stop()
        op.stop()
        _try(lambda: core.delete_namespace(ns))


def _leaks(k8s: Any, ns: str, name: str, logs: list[Path], result: Path, secret: str) -> list[str]:
    """Where the secret appears: pod and operator logs, the result store's files, the job's
    status and events (it must appear nowhere)."""
    found = [str(p) for p in logs if p.exists() and secret in p.read_text(errors="replace")]
    found += [str(p) for p in result.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    if secret in json.dumps(_job(k8s, ns, name)):
        found.append("TuningJob")
    events = client.CoreV1Api(k8s).list_namespaced_event(ns).items
    found += [f"event {e.reason}" for e in events if secret in (e.message or "")]
    return found


def _result_keys(env: FaultEnv, ns: str, name: str, use_s3: bool, work: Path) -> Counter[Any]:
    from sharetune_tuner.store.backends import open_store, unpack
    from sharetune_tuner.store.records import record_keys

    if use_s3:
        os.environ.update(AWS_ACCESS_KEY_ID="sharetune", AWS_SECRET_ACCESS_KEY="fault-test-secret",
                          SHARETUNE_S3_ENDPOINT=env.s3.endpoint, AWS_DEFAULT_REGION="us-east-1")
        uri = f"s3://faults/runs/{ns}/{name}"
    else:
        os.environ["KUBECONFIG"] = str(env.cluster.kubeconfig)
        uri = f"configmap://{ns}/{name}"
    data = open_store(uri).get("result")
    if data is None:
        return Counter()
    unpack(data, work / "result")
    return record_keys(work / "result" / "records")


def _wait(env: FaultEnv, what: str, fn: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = _try(fn)
        if v:
            return v
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def as_json(rows: list[FaultRow]) -> list[dict[str, Any]]:
    return [asdict(r) for r in rows]


def dump(rows: list[FaultRow], path: Path, meta: dict[str, Any]) -> None:
    path.write_text(json.dumps({**meta, "rows": as_json(rows)}, indent=1) + "\n")
