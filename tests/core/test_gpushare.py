"""One status tick of GPU sharing (sharetune.gpushare): decisions from the API objects as the
operator lists them, including the restart drill of the issue in pure form (30 jobs at once on 2
one-GPU nodes, the operator killed mid-way again and again: never more than 100 % on a GPU,
every job runs)."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

from sharetune.admission import GpuId
from sharetune.api.spec import parse_spec
from sharetune.gpushare import PoolPod, device_plugin_message, plan_tick
from sharetune.sharing import SharingConfig

NOW = dt.datetime(2026, 12, 4, 3, 0, tzinfo=dt.timezone.utc)
A, B = GpuId("gpu-a", 0), GpuId("gpu-b", 0)


def node(name: str, gpus: int = 1, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}}}


def job(name: str, t: int, share: int | None = None, ns: str = "ns", status: dict[str, Any] | None = None,
        **spec: Any) -> dict[str, Any]:
    gs = {"share": share} if share is not None else {}
    return {"metadata": {"name": name, "namespace": ns, "creationTimestamp": f"2026-12-04T02:00:{t:02d}Z"},
            "spec": {"model": {"name": "resnet18"}, "target": "cuda", "gpuSharing": {**gs, **spec.pop("gs", {})},
                     **spec},
            "status": status or {"phase": "Pending"}}


def placed(node_: str, share: int, phase: str = "Running") -> dict[str, Any]:
    return {"phase": phase, "gpuPlacement": {"mode": "pool", "node": node_, "gpu": 0, "share": share}}


def test_a_tick_admits_queues_and_keeps_one_pool_per_gpu_in_use() -> None:
    bodies = [
        job("a", 1, 50, status=placed("gpu-a", 50)),
        job("b", 2, 60),
        job("c", 3, 60),
        job("d", 4, 50, gs={"pinnedMemory": "8G"}),
        job("done", 0, 100, status=placed("gpu-b", 100, "Succeeded")),  # finished: holds nothing
        job("excl", 0, gs={"mode": "exclusive"}),  # not the ledger's
        {**job("cpu", 0), "spec": {"model": {"name": "resnet18"}}},
    ]
    bodies.append({**job("gone", 0, 100, status=placed("gpu-a", 100)),
                   "metadata": {**job("gone", 0)["metadata"], "deletionTimestamp": "2026-12-04T02:59:00Z"}})
    pools = [PoolPod("pool-gpu-a-gpu0", A, "running"),
             PoolPod("pool-gpu-z-gpu0", GpuId("gpu-z", 0), "running"),  # no job: marked idle
             PoolPod("pool-gpu-y-gpu0", GpuId("gpu-y", 0), "running", idle_since="2026-12-04T02:50:00Z")]
    plan = plan_tick(bodies, [node("gpu-a"), node("gpu-b")], {}, pools, SharingConfig(pool_idle_s=300), NOW)
    assert list(plan.admit) == [("ns", "b")]  # spread: the idle GPU
    assert plan.admit[("ns", "b")] == {"mode": "pool", "node": "gpu-b", "gpu": 0, "share": 60, "pinnedMemory": "",
                                       "devices": [{"node": "gpu-b", "gpu": 0}], "mpsClients": 4,
                                       "admittedAt": "2026-12-04T03:00:00Z"}
    # c (60 %) fits nowhere now; d (50 %) would fit on gpu-a but waits behind c: first come first served.
    assert plan.waiting[("ns", "c")][0] == 1 and plan.waiting[("ns", "d")][0] == 2
    assert plan.waiting[("ns", "c")][1].startswith("waiting for a GPU share of 60%: position 1 of 2 in the queue")
    assert plan.allocated == {A: 50, B: 60}
    assert plan.create_pools == {"pool-gpu-b-gpu0": B}
    assert plan.mark_idle == ["pool-gpu-z-gpu0"] and plan.delete_pools == ["pool-gpu-y-gpu0"]
    # With backfill d passes c.
    back = plan_tick(bodies, [node("gpu-a"), node("gpu-b")], {}, pools, SharingConfig(backfill=True), NOW)
    assert set(back.admit) == {("ns", "b"), ("ns", "d")} and back.admit[("ns", "d")]["pinnedMemory"] == "8G"


def test_gpus_held_by_other_pods_are_not_offered_and_failed_pools_are_replaced() -> None:
    bodies = [job("a", 1, 50, status=placed("gpu-a", 50)), job("b", 2, 50)]
    plan = plan_tick(bodies, [node("gpu-a", gpus=2)], {"gpu-a": 1}, [PoolPod("pool-gpu-a-gpu0", A, "failed")],
                     SharingConfig(), NOW)
    # Of gpu-a's 2 GPUs one is held elsewhere: b joins a on GPU 0 rather than a second GPU.
    assert plan.admit[("ns", "b")]["gpu"] == 0
    assert plan.replace_pools == ["pool-gpu-a-gpu0"] and plan.create_pools == {"pool-gpu-a-gpu0": A}
    assert plan.roll_servers == {"pool-gpu-a-gpu0": 0}  # its jobs' servers hold dead CUDA contexts
    # Restarted in place (the kubelet's restart): the servers are rolled once per restart.
    restarted = PoolPod("pool-gpu-a-gpu0", A, "running", restarts=2, restarts_answered=1)
    plan = plan_tick(bodies, [node("gpu-a")], {}, [restarted], SharingConfig(), NOW)
    assert plan.roll_servers == {"pool-gpu-a-gpu0": 2} and plan.create_pools == {}
    answered = PoolPod("pool-gpu-a-gpu0", A, "running", restarts=2, restarts_answered=2)
    assert plan_tick(bodies, [node("gpu-a")], {}, [answered], SharingConfig(), NOW).roll_servers == {}
    # A job on a node without GPUs can never run here: it does not block the others.
    plan = plan_tick([job("x", 1, 10, nodeSelector={"gpu": "b200"}), job("y", 2, 10)], [node("gpu-a")], {}, [],
                     SharingConfig(), NOW)
    assert plan.never == {("ns", "x"): "needs 1 GPU; on nodes matching gpu=b200 there are 0"}
    assert list(plan.admit) == [("ns", "y")]


def test_thirty_jobs_two_gpus_operator_killed_mid_way() -> None:
    """The issue's drill, pure: each tick the operator may die after writing only some of the
    placements it decided; the next one starts from the jobs' status alone."""
    rng = random.Random(16)
    bodies = [job(f"j{i:02d}", i, rng.choice([10, 20, 25, 30, 50, 60])) for i in range(30)]
    nodes = [node("gpu-a"), node("gpu-b")]
    succeeded: set[str] = set()
    admitted: list[str] = []
    for _ in range(500):
        plan = plan_tick(bodies, nodes, {}, [], SharingConfig(), NOW)
        written = rng.randint(0, len(plan.admit))  # killed after this many status writes
        for key in list(plan.admit)[:written]:
            b = next(b for b in bodies if b["metadata"]["name"] == key[1])
            assert "gpuPlacement" not in b["status"], f"{key} placed twice"
            b["status"] = {"phase": "Running", "gpuPlacement": plan.admit[key]}
            admitted.append(key[1])
        # Never more than 100 % on a GPU, as the jobs' status records it.
        for gpu in ("gpu-a", "gpu-b"):
            assert sum(b["status"]["gpuPlacement"]["share"] for b in bodies if b["status"].get("phase") == "Running"
                       and b["status"]["gpuPlacement"]["node"] == gpu) <= 100
        for b in bodies:  # some running jobs finish
            if b["status"].get("phase") == "Running" and rng.random() < 0.3:
                b["status"]["phase"] = "Succeeded"
                succeeded.add(b["metadata"]["name"])
        if len(succeeded) == 30:
            break
    assert len(succeeded) == 30 and len(admitted) == 30


def test_device_plugin_jobs_are_told_what_their_thread_percentage_can_do() -> None:
    s = parse_spec("j", {"model": {"name": "resnet18"}, "target": "cuda", "gpuSharing": {"mode": "devicePlugin"},
                         "servers": {"replicas": 3, "threadPercentage": 40}})
    assert device_plugin_message(s, "nvidia.com/gpu.shared") == (
        "mode devicePlugin: each of the 3 servers requests one nvidia.com/gpu.shared; the device plugin splits each "
        "GPU equally between its replicas, and servers.threadPercentage 40% can only lower a server's split, never "
        "raise it")
    # Not the ledger's: a devicePlugin job is neither placed nor queued.
    plan = plan_tick([job("dp", 1, gs={"mode": "devicePlugin"})], [node("gpu-a")], {}, [], SharingConfig(), NOW)
    assert plan.admit == {} and plan.waiting == {}


def test_co_tenant_spans_open_close_and_reopen() -> None:
    from sharetune.gpushare import co_tenant_status

    a, b = ("ns", "a"), ("ns", "b")
    s1 = co_tenant_status(None, {a}, "t1")
    assert s1 == {"ns/a": {"since": "t1"}}
    assert co_tenant_status(s1, {a}, "t2") is None  # unchanged: no status write
    s2 = co_tenant_status(s1, {b}, "t3")
    assert s2 == {"ns/a": {"since": "t1", "until": "t3"}, "ns/b": {"since": "t3"}}
    s3 = co_tenant_status(s2, {a, b}, "t4")  # a is back: its span reopens from its first sight
    assert s3 == {"ns/a": {"since": "t1"}, "ns/b": {"since": "t3"}}
    assert co_tenant_status({}, set(), "t5") is None
