"""The GPU share ledger (sharetune.admission): rules by example, then random job streams with
finishing and deleted jobs and operator restarts (the ledger rebuilt from the jobs' status,
sometimes after a crash between admitting and writing the status) at random points."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sharetune.admission import (
    DoubleBooking,
    Gpu,
    GpuId,
    Ledger,
    Placement,
    Policy,
    Request,
    gpus_of_node,
    placement_of,
    placement_status,
    request_of,
)
from sharetune.api.spec import parse_spec

A0, A1, B0 = GpuId("a", 0), GpuId("a", 1), GpuId("b", 0)


def req(name: str, share: int, t: int, ns: str = "ns", memory: int = 0, gpus: int = 1,
        selector: tuple[tuple[str, str], ...] = (), clients: int = 0) -> Request:
    return Request((ns, name), f"2026-12-04T00:00:{t:02d}Z", share, memory, gpus, selector, clients)


def test_spread_puts_each_job_on_the_least_allocated_gpu() -> None:
    ledger = Ledger([Gpu(A0), Gpu(A1), Gpu(B0)])
    out = ledger.admit([req("j1", 30, 1), req("j2", 50, 2), req("j3", 20, 3), req("j4", 40, 4)])
    assert [out.placed[k].devices for k in out.placed] == [(A0,), (A1,), (B0,), (B0,)]
    assert [ledger.allocated(g) for g in (A0, A1, B0)] == [30, 50, 60]
    assert out.queue == [] and out.unplaceable == {}


def test_shares_never_sum_past_100_unless_the_chart_overcommits() -> None:
    jobs = [req(f"j{i}", 40, i) for i in range(4)]
    strict = Ledger([Gpu(A0)])
    out = strict.admit(jobs)
    assert list(out.placed) == [("ns", "j0"), ("ns", "j1")] and strict.allocated(A0) == 80
    assert out.queue == [("ns", "j2"), ("ns", "j3")] and out.position(("ns", "j3")) == 2
    loose = Ledger([Gpu(A0)], Policy(overcommit=1.5))
    loose.admit(jobs)
    assert loose.allocated(A0) == 120  # 150 % would take a fourth 40 % job: 160 does not fit


def test_first_come_first_served_and_backfill() -> None:
    busy = {("ns", "old"): Placement((A0,), 50)}
    waiting = [req("big", 60, 1), req("small", 10, 2)]
    fifo = Ledger.rebuild([Gpu(A0)], busy)
    out = fifo.admit(waiting)
    assert out.placed == {} and out.queue == [("ns", "big"), ("ns", "small")]  # small waits behind big
    back = Ledger.rebuild([Gpu(A0)], busy, Policy(backfill=True))
    out = back.admit(waiting)
    assert list(out.placed) == [("ns", "small")] and out.queue == [("ns", "big")]
    # Order is creation time, then namespace and name; not the order they are listed in.
    out = Ledger([Gpu(A0)]).admit([req("b", 60, 5), req("a", 60, 5), req("c", 60, 1)])
    assert list(out.placed) == [("ns", "c")] and out.queue == [("ns", "a"), ("ns", "b")]


def test_a_job_that_can_never_fit_does_not_block_the_queue() -> None:
    ledger = Ledger([Gpu(A0, 81920, (("gpu", "h200"),)), Gpu(B0, 40960, (("gpu", "a100"),))])
    out = ledger.admit([req("three", 10, 1, gpus=3), req("huge", 10, 2, memory=100_000),
                        req("nowhere", 10, 3, selector=(("gpu", "b200"),)), req("ok", 10, 4)])
    assert list(out.placed) == [("ns", "ok")]
    assert out.unplaceable == {
        ("ns", "three"): "needs 3 GPUs; on the cluster's GPU nodes there are 2",
        ("ns", "huge"): "needs 1 GPU with 100000 MiB of memory each; on the cluster's GPU nodes there are 0",
        ("ns", "nowhere"): "needs 1 GPU; on nodes matching gpu=b200 there are 0"}


def test_memory_is_booked_and_never_overcommitted() -> None:
    ledger = Ledger([Gpu(A0, 81920)], Policy(overcommit=2.0))
    out = ledger.admit([req("j1", 10, 1, memory=51200), req("j2", 10, 2, memory=51200), req("j3", 10, 3)])
    assert list(out.placed) == [("ns", "j1")] and out.queue == [("ns", "j2"), ("ns", "j3")]
    assert ledger.memory_booked(A0) == 51200


def test_namespaces_share_a_gpu_only_where_allowed() -> None:
    jobs = [req("x", 30, 1, ns="team-a"), req("y", 30, 2, ns="team-b"), req("z", 30, 3, ns="team-a")]
    apart = Ledger([Gpu(A0), Gpu(B0)])
    apart.admit(jobs)
    assert {k[0] for k in apart.tenants(A0)} == {"team-a"} and {k[0] for k in apart.tenants(B0)} == {"team-b"}
    one_gpu = Ledger([Gpu(A0)])
    out = one_gpu.admit(jobs)
    assert list(out.placed) == [("team-a", "x")] and out.queue == [("team-b", "y"), ("team-a", "z")]
    together = Ledger([Gpu(A0)], Policy(cross_namespace=True))
    assert len(together.admit(jobs).placed) == 3


def test_multi_gpu_jobs_get_distinct_gpus_and_release_frees_them() -> None:
    ledger = Ledger([Gpu(A0), Gpu(A1), Gpu(B0)])
    out = ledger.admit([req("wide", 50, 1, gpus=2)])
    p = out.placed[("ns", "wide")]
    assert len(set(p.devices)) == 2 and ledger.in_use() == set(p.devices)
    assert ledger.release(("ns", "wide")) == p and ledger.in_use() == set()
    assert all(ledger.allocated(g) == 0 for g in (A0, A1, B0))
    with pytest.raises(DoubleBooking):
        ledger.book(("ns", "x"), Placement((A0, A0), 10))
    ledger.book(("ns", "x"), Placement((A0,), 10))
    with pytest.raises(DoubleBooking):
        ledger.book(("ns", "x"), Placement((A1,), 10))
    assert ledger.admit([req("x", 10, 1)]).placed == {}  # already placed: skipped


def test_an_mps_server_never_gets_more_than_48_clients() -> None:
    """Small shares let many jobs on a GPU, but its one MPS server takes 48 processes: past
    that every new session and merge fails (measured on the H200), so jobs wait instead."""
    ledger = Ledger([Gpu(GpuId("n", 0))])
    out = ledger.admit([req(f"j{i}", 5, i, clients=6) for i in range(10)])  # 50 % of SMs, 60 clients
    assert len(out.placed) == 8 and out.queue == [("ns", "j8"), ("ns", "j9")]
    assert ledger.mps_clients(GpuId("n", 0)) == 48 and ledger.allocated(GpuId("n", 0)) == 40
    ledger.release(("ns", "j0"))
    assert list(ledger.admit([req("j8", 5, 8, clients=6), req("j9", 5, 9, clients=6)]).placed) == [("ns", "j8")]
    never = Ledger([Gpu(GpuId("n", 0))]).admit([req("big", 10, 1, clients=49)])
    assert "servers.replicas" in never.unplaceable[("ns", "big")] and "48" in never.unplaceable[("ns", "big")]


def test_status_round_trip_and_requests_from_specs() -> None:
    p = Placement((GpuId("gpu-a", 1), GpuId("gpu-b", 0)), 40, 8192, 4)
    st_ = placement_status(p, "8G", "2026-12-04T00:00:00Z")
    assert st_["node"] == "gpu-a" and st_["gpu"] == 1 and st_["share"] == 40 and st_["mode"] == "pool"
    assert placement_of({"gpuPlacement": st_}) == p
    assert placement_of({}) is None and placement_of({"gpuPlacement": {"mode": "exclusive", "share": 100}}) is None
    assert placement_of({"gpuPlacement": {"mode": "pool", "share": 30, "node": "n", "gpu": 2}}) == \
        Placement((GpuId("n", 2),), 30, 0)
    s = parse_spec("j", {"model": {"name": "resnet18"}, "target": "cuda", "nodeSelector": {"gpu": "h200"},
                         "gpuSharing": {"share": 40, "pinnedMemory": "8G", "gpus": 2}})
    r = request_of("ns", "j", "2026-12-04T00:00:00Z", s)
    assert (r.share, r.memory_mib, r.gpus, r.node_selector) == (40, 8192, 2, (("gpu", "h200"),))
    assert r.mps_clients == s.servers.replicas + 2  # a session per server, the merge and its serving child


def test_gpus_of_a_node() -> None:
    assert [g.id.index for g in gpus_of_node("n", {"nvidia.com/gpu": "4"}, {})] == [0, 1, 2, 3]
    # One GPU held by a pod that is not a pool daemon: three open to pools.
    assert [g.id.index for g in gpus_of_node("n", {"nvidia.com/gpu": "4"}, {}, held_elsewhere=1)] == [0, 1, 2]
    # A pool in use keeps its index even when other pods now hold more GPUs.
    assert [g.id.index for g in gpus_of_node("n", {"nvidia.com/gpu": "4"}, {}, held_elsewhere=3, in_use=[3])] == [3]
    assert [g.id.index for g in gpus_of_node("n", {"nvidia.com/gpu": "2"}, {}, in_use=[1])] == [0, 1]
    g = gpus_of_node("n", {"nvidia.com/gpu": 1}, {"nvidia.com/gpu.memory": "81559", "gpu": "h200"})[0]
    assert g.memory_mib == 81559 and ("gpu", "h200") in g.labels
    assert gpus_of_node("cpu", {"cpu": "8"}, {}) == []


# ---- random streams ------------------------------------------------------------------------------
@dataclass
class World:
    """The cluster as the operator sees it: jobs, and the placements their statuses record."""

    gpus: list[Gpu]
    policy: Policy
    waiting: dict[tuple[str, str], Request] = field(default_factory=dict)
    running: dict[tuple[str, str], Request] = field(default_factory=dict)
    status: dict[tuple[str, str], Placement] = field(default_factory=dict)  # written placements
    clock: int = 0
    admitted: list[tuple[str, str]] = field(default_factory=list)


gpu_sets = st.lists(st.tuples(st.sampled_from(["n1", "n2"]), st.integers(0, 1),
                              st.sampled_from([None, 40960, 81920]), st.sampled_from(["h200", "a100"])),
                    min_size=1, max_size=3, unique_by=lambda t: (t[0], t[1]))
submit = st.tuples(st.just("submit"), st.sampled_from(["ns1", "ns2"]), st.sampled_from([5, 10, 25, 30, 50, 60, 100]),
                   st.sampled_from([0, 0, 8192, 30000, 50000]), st.sampled_from([1, 1, 1, 2, 3]),
                   st.sampled_from([(), (), (("gpu", "h200"),)]))
ops = st.lists(st.one_of(
    submit, submit, submit,  # jobs come faster than they go: queues form
    st.tuples(st.just("finish"), st.integers(0, 50)),
    st.tuples(st.just("delete"), st.integers(0, 50)),
    st.tuples(st.just("tick")), st.tuples(st.just("tick")),
    st.tuples(st.just("restart")),
    st.tuples(st.just("crash"), st.integers(0, 5)),  # killed after writing only this many placements
), min_size=10, max_size=120)


def check(world: World, ledger: Ledger) -> None:
    cap = world.policy.capacity
    for g in world.gpus:
        tenants = [k for k, p in world.status.items() if g.id in p.devices]
        assert sum(world.status[k].share for k in tenants) <= cap, (g.id, tenants)
        if g.memory_mib is not None:
            assert sum(world.status[k].memory_mib for k in tenants) <= g.memory_mib
        assert sum(world.status[k].mps_clients for k in tenants) <= world.policy.mps_clients
        if not world.policy.cross_namespace:
            assert len({k[0] for k in tenants}) <= 1, tenants
    assert len(world.admitted) == len(set(world.admitted)), "a job placed twice"
    assert ledger.placements == world.status


def tick(world: World, ledger: Ledger, write: int | None = None) -> Ledger:
    """One admission round. ``write``: the operator dies after writing this many placements to
    the jobs' status; the ledger it had is lost and rebuilt from what was written."""
    # Every live job is handed in, placed or not, as the operator's tick does: none is placed twice.
    out = ledger.admit([*world.waiting.values(), *world.running.values()])
    placed = list(out.placed.items())
    # FIFO: strict, the queue's head could not be placed; with backfill, no job that waits could.
    # (Room only shrinks during a round, so what did not fit then does not fit now.)
    if out.queue:
        for key in out.queue if world.policy.backfill else out.queue[:1]:
            assert ledger.choose(world.waiting[key]) is None, key
        if not world.policy.backfill:
            head = world.waiting[out.queue[0]].order
            assert all(world.waiting[k].order < head for k, _ in placed)
    for key, p in placed[:write]:
        world.status[key] = p
        world.admitted.append(key)
        world.running[key] = world.waiting.pop(key)
    if write is not None:
        return Ledger.rebuild(world.gpus, world.status, world.policy)
    return ledger


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(gpu_sets, st.sampled_from([1.0, 1.0, 1.5]), st.booleans(), st.booleans(), ops)
def test_random_streams_keep_the_rules(gpus, overcommit, backfill, cross_ns, stream) -> None:
    world = World([Gpu(GpuId(n, i), mem, (("gpu", kind),)) for n, i, mem, kind in gpus],
                  Policy(overcommit=overcommit, backfill=backfill, cross_namespace=cross_ns))
    ledger = Ledger(world.gpus, world.policy)
    for op in stream:
        if op[0] == "submit":
            _, ns, share, mem, n, sel = op
            world.clock += 1
            r = Request((ns, f"j{world.clock}"), f"2026-12-04T00:{world.clock // 60:02d}:{world.clock % 60:02d}Z",
                        share, mem, n, sel, 3 + (share * 7) % 20)  # MPS clients: a few jobs fill a server
            world.waiting[r.key] = r
        elif op[0] in ("finish", "delete") and world.status:
            key = sorted(world.status)[op[1] % len(world.status)]
            del world.status[key], world.running[key]  # finished or deleted: the share is released at once
            ledger.release(key)
        elif op[0] == "delete" and world.waiting:
            del world.waiting[sorted(world.waiting)[op[1] % len(world.waiting)]]  # deleted while waiting
        elif op[0] == "tick":
            ledger = tick(world, ledger)
        elif op[0] == "restart":
            ledger = Ledger.rebuild(world.gpus, world.status, world.policy)
        elif op[0] == "crash":
            ledger = tick(world, ledger, write=op[1])
        check(world, ledger)
    # Every job that can fit at all runs eventually: finish the running ones, admit, repeat.
    for _ in range(len(world.waiting) + 1):
        for key in list(world.status):
            del world.status[key], world.running[key]
            ledger.release(key)
        ledger = tick(world, ledger)
        check(world, ledger)
        if not world.waiting or all(ledger.why_never(r) for r in world.waiting.values()):
            break
    assert all(ledger.why_never(r) for r in world.waiting.values()), world.waiting
