"""A client tunes its shard's tasks together, not one after the other (client.run_client,
capped_search.py): every task's first round is measured before any task's second, each task
stops exactly at its own budget (budgets differ: proportional to cost), and no candidate is
measured twice for a task. A real client (the CLI) on real tasks (llvm, real RPC servers)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import tvm_ffi

from sharetune_tuner.store import records

from .conftest import Topology, example_job, tuner

pytestmark = pytest.mark.tvm
PER_ITER = 4


def test_tasks_take_turns_and_each_stops_at_its_budget(topology: Topology, tmp_path: Path) -> None:
    job = example_job(tmp_path, trials={"total": 20, "perTask": 12, "perIteration": PER_ITER},
                      clients={"shards": 1, "builderWorkers": 1})
    work = tmp_path / "shard-0"
    client = tuner(["client", "--job", str(job), "--shard", "0", "--work-dir", str(work),
                    "--tracker", topology.tracker_addr, "--key", topology.key], tmp_path / "client.log")
    assert client.popen.wait(timeout=300) == 0, client.text()[-3000:]
    progress = json.loads((work / "progress.json").read_text())
    budget = {t["workload_hash"]: t["budget"] for t in progress["tasks"]}
    assert len(budget) == 2 and len(set(budget.values())) == 2, progress["tasks"]  # two tasks, unequal budgets

    hashes = [str(w[0]) for w in records.read_lines(work / records.WORKLOADS)]
    lines = records.read_lines(work / records.RECORDS)
    order = [hashes[idx] for idx, _ in lines]  # the workload of each record, in measurement order
    assert Counter(order) == budget  # each task exactly its budget
    # Taking turns: both tasks' first rounds come before either task's second.
    assert set(order[: 2 * PER_ITER]) == set(budget), order
    # No schedule measured twice for a task.
    traces = [(hashes[idx], json.dumps(body[0], sort_keys=True)) for idx, body in lines]
    assert len(set(traces)) == len(traces)


class ScriptedStrategy:
    """Stands in for TVM's search strategy with a scripted sequence of batches (TVM's own are
    random, so duplicates cannot be staged with them; the test above runs the real ones)."""

    population_size, init_measured_ratio = 0, 0.0  # reads no database unless a test says so

    def __init__(self, batches: list[list[object]]) -> None:
        self.batches, self.notified = batches, []

    def _initialize_with_tune_context(self, context: object) -> None:
        pass

    def pre_tuning(self, *args: object) -> None:
        pass

    def generate_measure_candidates(self) -> list[object] | None:
        return self.batches.pop(0) if self.batches else None

    def notify_runner_results(self, candidates: list[object], results: list[object]) -> None:
        self.notified.append(len(candidates))

    def clone(self) -> ScriptedStrategy:
        return self


def _candidate(n: int) -> object:
    """A real measure candidate: an (unscheduled) schedule of an n x n matmul."""
    import tvm
    from tvm import te
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.testing import te_workload

    mod = tvm.IRModule({"main": te.create_prim_func(te_workload.matmul(n, n, n))})
    return ms.MeasureCandidate(Schedule(mod), ms.arg_info.ArgInfo.from_prim_func(mod["main"]))


def _sizes(batch: object) -> list[int] | None:
    """Which candidates (by matmul size) a batch holds."""
    return None if batch is None else [int(c.args_info[0].shape[0]) for c in batch]


def test_capped_search_ends_at_its_cap_and_never_hands_out_a_schedule_twice() -> None:
    from sharetune_tuner.search.capped_search import CappedSearch

    c = _candidate
    inner = ScriptedStrategy([[c(8), c(8), c(16)], [c(16), c(32)], [c(32)], [c(64), c(8), c(128)], [c(256)]])
    search = CappedSearch(inner, 4)
    assert _sizes(search.generate_measure_candidates()) == [8, 16]  # the batch's second 8 dropped
    assert _sizes(search.generate_measure_candidates()) == [32]  # 16 was handed out before
    # [32]: nothing new, so the inner strategy is told the batch is done and asked again; the
    # next batch is trimmed to the one trial the cap has left
    assert _sizes(search.generate_measure_candidates()) == [64]
    assert inner.notified == [1]
    assert search.generate_measure_candidates() is None  # 4 handed out: the cap
    assert search.measured.dropped == 4  # 8, 16, 32, 8 again
    # A clone (TuneContext.clone(): the next tune_tasks call) shares what was handed out.
    again = search.clone()
    inner.batches = [[c(8), c(512)]]
    assert _sizes(again.generate_measure_candidates()) == [512]
    assert search.measured.dropped == 5


def test_a_resumed_task_does_not_measure_again_what_the_database_holds() -> None:
    """A client restarted over its records: TVM's evolutionary search puts the database's best
    schedules into its population and, in a new process, hands them out again. The schedules here
    are TVM's own (sampled and postprocessed in C++); the database holds them as a killed client
    left them."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from sharetune_tuner.model.intrinsics import ensure_registered
    from sharetune_tuner.search.capped_search import CappedSearch, Measured

    ensure_registered()  # the design space needs them: from the cache, not ~20 s of parsing
    new = _candidate(32)  # unscheduled: not among the sampled schedules below
    mod, target = new.sch.mod, tvm.target.Target({"kind": "llvm", "num-cores": 1})
    ctx = ms.TuneContext(mod, target=target, space_generator="post-order-apply",
                         search_strategy=ms.search_strategy.ReplayTrace(), task_name="matmul", num_threads=1)
    db = ms.database.MemoryDatabase()
    ctx.pre_tuning(max_trials=6, num_trials_per_iter=6, design_spaces=ctx.generate_design_space(), database=db)
    before = list(ctx.generate_measure_candidates())
    workload = db.commit_workload(mod)
    for i, c in enumerate(before):
        db.commit_tuning_record(ms.database.TuningRecord(c.sch.trace, workload, [1e-3 * (i + 1)], target,
                                                         c.args_info))
    distinct = len({tvm_ffi.structural_hash(c.sch.mod) for c in before})

    def first_batch(measured: Measured) -> list[object]:
        inner = ScriptedStrategy([[*before, new]])
        inner.population_size, inner.init_measured_ratio = len(before), 1.0  # it seeds with all of them
        search = CappedSearch(inner, 100, measured)
        search._initialize_with_tune_context(ctx)
        search.pre_tuning(100, 8, [], db, None)
        return search.generate_measure_candidates()

    assert len(first_batch(Measured())) == distinct + 1  # a fresh task: the database is not read
    resumed = Measured(from_database=True)
    assert first_batch(resumed) == [new]
    assert resumed.dropped == len(before)
