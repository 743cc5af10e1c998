"""GPU pools on the real control plane (mode pool, docs/gpu-pools.md): two one-GPU kwok nodes, the
operator as a process of its own (killed mid-way), jobs that ask for 60% of a GPU each. Covers
admission before any server exists, the queue (position, reason, no children while waiting),
release on deletion, the ledger rebuilt after an operator kill (no double booking), a pool daemon
replaced with its servers rolled, idle pools released, and mode devicePlugin's pod specs."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config

from sharetune.api.gpuenv import GPU_UUID_ANNOTATION

from ..faults.scenarios import OperatorProcess
from ..helpers import wait_for
from .conftest import GROUP, PLURAL, VERSION, publish_gpu_as_daemon, tuning_job

pytestmark = [pytest.mark.cluster]

NS = "pools"
POOL_SELECTOR = "app.kubernetes.io/component=gpu-pool"
PRIORITY_CLASS = "st-mps-daemon"


@pytest.fixture(scope="module")
def two_gpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, OperatorProcess]]:
    from sharetune_dev.cluster.harness import FakeNode, LocalCluster

    from ..conftest import install_crd

    cluster = LocalCluster(nodes=[FakeNode("gpu-a", gpus=1), FakeNode("gpu-b", gpus=1)]).start()
    op = None
    try:
        k8s = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        install_crd(k8s)
        client.CoreV1Api(k8s).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
        client.SchedulingV1Api(k8s).create_priority_class(client.V1PriorityClass(  # as the chart creates it
            metadata=client.V1ObjectMeta(name=PRIORITY_CLASS), value=1000000, preemption_policy="Never"))
        op = OperatorProcess(cluster.kubeconfig, NS, tmp_path_factory.mktemp("pools") / "operator.log",
                             env={"SHARETUNE_GPU_SHARING_MODE": "pool", "SHARETUNE_GPU_POOL_NAMESPACE": NS,
                                  "SHARETUNE_GPU_POOL_IDLE_SECONDS": "3",
                                  "SHARETUNE_MPS_DAEMON_PRIORITY_CLASS": PRIORITY_CLASS})
        op.start()
        yield cluster, k8s, op
    finally:
        if op is not None:
            op.stop()
        cluster.stop()


def _job(name: str, share: int, pct: int) -> dict[str, Any]:
    return tuning_job(name, target="cuda", servers={"replicas": 1, "threadPercentage": pct},
                      gpuSharing={"share": share})


def _status(k8s: Any, name: str) -> dict[str, Any]:
    return client.CustomObjectsApi(k8s).get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name).get(
        "status") or {}


def _placements(k8s: Any) -> dict[str, str]:
    items = client.CustomObjectsApi(k8s).list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"]
    return {j["metadata"]["name"]: j["status"]["gpuPlacement"]["node"] for j in items
            if (j.get("status") or {}).get("gpuPlacement")}


def _pools(core: Any) -> list[Any]:
    return [p for p in core.list_namespaced_pod(NS, label_selector=POOL_SELECTOR).items
            if p.metadata.deletion_timestamp is None]


def _events(core: Any, name: str, reason: str) -> list[Any]:
    return [e for e in core.list_namespaced_event(NS).items
            if e.involved_object.name == name and e.reason == reason]


def _deployment(apps: Any, name: str) -> Any:
    try:
        return apps.read_namespaced_deployment(name, NS)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def test_shares_are_admitted_queued_released_and_survive_an_operator_kill(two_gpus) -> None:
    _, k8s, op = two_gpus
    core, apps, crs = client.CoreV1Api(k8s), client.AppsV1Api(k8s), client.CustomObjectsApi(k8s)
    for name in ("j1", "j2", "j3"):
        crs.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, _job(name, 60, 50))
    placed = wait_for("two jobs placed", lambda: (p := _placements(k8s)) and len(p) == 2 and p, timeout_s=60)
    assert sorted(placed.values()) == ["gpu-a", "gpu-b"]  # 60 + 60 > 100: one job per GPU
    waiting = ({"j1", "j2", "j3"} - set(placed)).pop()
    st = wait_for("the third waits in the queue", lambda: (s := _status(k8s, waiting)).get("queuePosition") == 1
                  and s, timeout_s=30)
    assert st["phase"] == "Pending" and "position 1 of 1" in st["message"] and st["gpu"] == "queued #1"
    assert any(c["reason"] == "WaitingForGpuShare" for c in st["conditions"] if c["type"] == "Ready")
    assert _deployment(apps, f"{waiting}-servers") is None  # nothing of a waiting job runs
    # The admitted ones: a pool daemon per GPU, servers pinned to their GPU's node, attached to its pool.
    pools = wait_for("two pools running", lambda: (p := _pools(core)) and len(p) == 2
                     and all(x.status.phase == "Running" for x in p) and p, timeout_s=60)
    pool_of = {p.metadata.annotations["sharetune.io/node"]: p.metadata.name for p in pools}
    # Each pool daemon runs at the chart's daemon priority and has its PodDisruptionBudget: a
    # drain's eviction of it is refused.
    assert all((p.spec.priority_class_name, p.spec.priority) == (PRIORITY_CLASS, 1000000) for p in pools)
    policy = client.PolicyV1Api(k8s)
    assert sorted(b.metadata.name for b in policy.list_namespaced_pod_disruption_budget(NS).items) == sorted(
        pool_of.values())
    victim = pools[0].metadata.name
    with pytest.raises(client.ApiException) as refused:
        core.create_namespaced_pod_eviction(victim, NS, client.V1Eviction(
            metadata=client.V1ObjectMeta(name=victim, namespace=NS)))
    assert refused.value.status == 429
    # Each pool daemon publishes the GPU it holds (kwok runs none: the tuner's code, the pool's identity).
    for node, pool in pool_of.items():
        publish_gpu_as_daemon(k8s, NS, pool, pool, f"GPU-{node}-1")
    for name, node in placed.items():
        dep = wait_for(f"{name}'s servers on their GPU", lambda n=name: (d := _deployment(apps, f"{n}-servers"))
                       and d.spec.replicas == 1 and d, timeout_s=30)
        pod = dep.spec.template.spec
        assert {e.name: e.value for e in pod.containers[0].env}["NVIDIA_VISIBLE_DEVICES"] == f"GPU-{node}-1"
        assert pod.node_selector["kubernetes.io/hostname"] == node and pod.host_ipc
        assert dep.spec.template.metadata.labels["sharetune.io/gpu-pool"] == pool_of[node]
        env = {e.name: e.value for e in pod.containers[0].env}
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
        assert "nvidia.com/gpu" not in ((pod.containers[0].resources.limits or {}))  # the pool holds the GPU
        assert _status(k8s, name)["gpu"] == f"{node}/0 @60%"
        assert _events(core, name, "GpuShareAdmitted")
        assert _status(k8s, name)["gpuSharingMode"] == "pool"
    assert not [p for p in core.list_namespaced_pod(NS).items
                if (p.metadata.labels or {}).get("app.kubernetes.io/component") == "mps-daemon"]  # no job daemons

    # The operator dies and comes back: the ledger is rebuilt from the jobs' status, nothing is booked twice.
    op.kill()
    op.start()
    crs.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, _job("j4", 30, 30))
    wait_for("j4 queued behind the head", lambda: _status(k8s, "j4").get("queuePosition") == 2, timeout_s=60)
    assert _placements(k8s) == placed and _status(k8s, waiting)["queuePosition"] == 1

    # A job deleted releases its share at once: the head of the queue gets that GPU, then j4 fits beside it.
    gone = next(iter(placed))
    crs.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, gone)
    after = wait_for("the queue moves", lambda: (p := _placements(k8s)) and waiting in p and "j4" in p and p,
                     timeout_s=60)
    assert after[waiting] == placed[gone]
    for node in ("gpu-a", "gpu-b"):
        assert sum({"j1": 60, "j2": 60, "j3": 60, "j4": 30}[j] for j, n in after.items() if n == node) <= 100
    assert _status(k8s, waiting).get("queuePosition") is None
    assert _events(core, waiting, "GpuShareAdmitted")
    # Jobs on one GPU say so, with since when (co-tenants disturb measurements).
    mates = [j for j, n in after.items() if n == after[waiting]]
    assert len(mates) == 2
    for j in mates:
        other = next(m for m in mates if m != j)
        wait_for(f"{j} names {other} as co-tenant", lambda j=j, other=other: f"{NS}/{other}" in (
            _status(k8s, j).get("coTenants") or {}), timeout_s=30)

    # A pool daemon dies for good: replaced, and the servers attached to it rolled.
    node = after[waiting]
    dead = next(p for p in _pools(core) if p.metadata.annotations["sharetune.io/node"] == node)
    core.patch_namespaced_pod_status(dead.metadata.name, NS, {"status": {"phase": "Failed"}})
    wait_for("pool replaced", lambda: any(p.metadata.name == dead.metadata.name and p.metadata.uid != dead.metadata.uid
                                          for p in _pools(core)), timeout_s=60)
    on_it = [j for j, n in after.items() if n == node]
    wait_for("its servers rolled", lambda: all("sharetune.io/restartedAt" in (
        apps.read_namespaced_deployment(f"{j}-servers", NS).spec.template.metadata.annotations or {})
        for j in on_it), timeout_s=60)
    # The new pool pod was given another GPU of the node: its servers follow it there.
    wait_for("new pool running", lambda: any(p.metadata.name == dead.metadata.name and p.status.phase == "Running"
                                             for p in _pools(core)), timeout_s=60)
    publish_gpu_as_daemon(k8s, NS, dead.metadata.name, dead.metadata.name, f"GPU-{node}-2")
    wait_for("its servers on the new GPU", lambda: all({e.name: e.value for e in apps.read_namespaced_deployment(
        f"{j}-servers", NS).spec.template.spec.containers[0].env}["NVIDIA_VISIBLE_DEVICES"] == f"GPU-{node}-2"
        for j in on_it), timeout_s=60)

    # Every job gone: the pools go idle and are released.
    for j in after:
        crs.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, j)
    wait_for("idle pools released", lambda: not _pools(core), timeout_s=90)
    wait_for("and their budgets", lambda: not policy.list_namespaced_pod_disruption_budget(NS).items, timeout_s=30)


def test_device_plugin_mode_requests_shared_replicas_and_no_daemon(two_gpus) -> None:
    _, k8s, _ = two_gpus
    apps, crs = client.AppsV1Api(k8s), client.CustomObjectsApi(k8s)
    crs.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, tuning_job(
        "dp", target="cuda", servers={"replicas": 2, "threadPercentage": 40},
        gpuSharing={"mode": "devicePlugin", "devicePlugin": {"resourceName": "example.com/gpu.shared"}}))
    dep = wait_for("dp's servers", lambda: _deployment(apps, "dp-servers"), timeout_s=60)
    c = dep.spec.template.spec.containers[0]
    assert c.resources.limits["example.com/gpu.shared"] == "1" and "nvidia.com/gpu" not in c.resources.limits
    assert {e.name: e.value for e in c.env}["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
    assert "sharetune.io/gpu-pool" not in (dep.spec.template.metadata.labels or {})
    core = client.CoreV1Api(k8s)
    assert not [p for p in core.list_namespaced_pod(NS).items
                if (p.metadata.labels or {}).get("sharetune.io/job") == "dp"
                and (p.metadata.labels or {}).get("app.kubernetes.io/component") == "mps-daemon"]
    st = _status(k8s, "dp")
    assert not st.get("gpuPlacement") and st["gpuSharingMode"] == "devicePlugin"
    assert st["gpu"] == "2 x example.com/gpu.shared"
    said = _events(core, "dp", "DevicePluginShare")
    assert said and "40% can only lower" in said[0].message
    crs.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "dp")


def _act_as_kubelet_and_tuner(core: Any, k8s: Any) -> None:
    """What the pods would do on real nodes, for every job that got this far: a pool daemon
    publishes its GPU (the clients come once it has), its clients exit 0, then its merge writes
    the summary and exits 0 (kwok runs no process; the tuning itself is covered by the tests that
    run it)."""
    from .conftest import finish_pod

    for pool in _pools(core):
        if pool.status.phase == "Running" and GPU_UUID_ANNOTATION not in (pool.metadata.annotations or {}):
            publish_gpu_as_daemon(k8s, NS, pool.metadata.name, pool.metadata.name, f"GPU-{pool.metadata.name}")

    for p in core.list_namespaced_pod(NS, label_selector="app.kubernetes.io/component in (client,merge)").items:
        if p.status.phase != "Running" or p.metadata.deletion_timestamp is not None:
            continue
        job = p.metadata.labels["sharetune.io/job"]
        if p.metadata.labels["app.kubernetes.io/component"] == "merge":
            core.patch_namespaced_config_map(f"{job}-result", NS, {"data": {"summary.json": json.dumps(
                {"records": 8, "speedup": 1.5, "latency_untuned_ms": 3.0, "latency_tuned_ms": 2.0})}})
        finish_pod(k8s, NS, p.metadata.name, 0)


def test_thirty_jobs_on_two_gpus_through_an_operator_kill(two_gpus) -> None:
    """30 jobs at 50% applied at once on 2 GPUs, the operator SIGKILLed mid-way: never more than
    100% booked on a GPU, every job Succeeds, in creation order per GPU slot (first come first served)."""
    _, k8s, op = two_gpus
    core, crs = client.CoreV1Api(k8s), client.CustomObjectsApi(k8s)
    names = [f"d{i:02d}" for i in range(30)]
    for n in names:
        crs.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, _job(n, 50, 50))
    worst, killed, t0 = 0, False, time.monotonic()
    admitted_order: list[str] = []
    while time.monotonic() - t0 < 420:
        items = [j for j in crs.list_namespaced_custom_object(GROUP, VERSION, NS, PLURAL)["items"]
                 if j["metadata"]["name"] in names]
        booked: dict[str, int] = {}
        for j in items:
            st = j.get("status") or {}
            gp = st.get("gpuPlacement")
            if gp and j["metadata"]["name"] not in admitted_order:
                admitted_order.append(j["metadata"]["name"])
            if gp and st.get("phase") not in ("Succeeded", "Failed"):
                booked[gp["node"]] = booked.get(gp["node"], 0) + gp["share"]
        worst = max([worst, *booked.values()])
        assert worst <= 100, booked
        done = [j for j in items if (j.get("status") or {}).get("phase") == "Succeeded"]
        assert not [j for j in items if (j.get("status") or {}).get("phase") == "Failed"]
        if len(done) == len(names):
            break
        if not killed and len(done) >= 10:
            op.kill()  # mid-way: some jobs admitted and running, the rest queued
            op.start()
            killed = True
        _act_as_kubelet_and_tuner(core, k8s)
        time.sleep(0.3)
    assert killed and len(done) == len(names), f"{len(done)} of {len(names)} Succeeded"
    assert worst == 100  # two jobs per GPU at a time: the GPUs were shared, not serialised
    # First come first served: jobs were admitted in creation order (two at a time per GPU, so
    # order within one tick's admissions may interleave, never by more than the 4 slots).
    assert all(abs(admitted_order.index(n) - i) < 4 for i, n in enumerate(names)), admitted_order
    for n in names:
        crs.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, n)
