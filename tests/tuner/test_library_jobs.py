"""Jobs that use the tuning library: the budget a reused task frees, the cost model trained before
the first round, the merge taking (and re-measuring) library records, and two local runs of the
quickstart job, the second reusing what the first added."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tvm")

import tvm
import tvm_ffi
from tvm.s_tir import meta_schedule as ms

from sharetune_tuner.merge import with_library
from sharetune_tuner.model.intrinsics import ensure_registered
from sharetune_tuner.search import warm_start
from sharetune_tuner.store import library
from sharetune_tuner.store.library import Entry, Key, Where

from .conftest import example_job
from .test_records import TARGET, workload

pytestmark = pytest.mark.tvm


def _shard(d: Path, n: int, splits: list[int], secs: list[float]) -> None:
    """Distinct real schedules of matmul ``n`` (its i loop split by each factor), with run times."""
    d.mkdir(parents=True, exist_ok=True)
    db = ms.database.JSONDatabase(work_dir=str(d))
    mod = workload(n)
    wl = db.commit_workload(mod)
    for f, s in zip(splits, secs):
        sch = tvm.s_tir.Schedule(mod)
        i, _, _ = sch.get_loops(sch.get_sblock("C"))
        sch.split(i, factors=[None, f])
        db.commit_tuning_record(ms.database.TuningRecord(sch.trace, wl, [s], TARGET,
                                                         ms.arg_info.ArgInfo.from_prim_func(mod["main"])))


def _lookup(tmp_path: Path, where: Where) -> warm_start.Lookup:
    lib = library.open_library(str(tmp_path / "lib"))
    use = warm_start.LibraryUse(str(tmp_path / "lib"), "ns", "warm", where)
    for n in (16, 32):
        _shard(tmp_path / f"db{n}", n, [1, 2, 4, 8], [4e-6, 3e-6, 2e-6, 5e-6])
        library.add(lib, "ns", f"uid-{n}", library.contribution(tmp_path / f"db{n}", f"ns/{n}", Where("cpu-a", 100)))
    return warm_start.lookup(use, TARGET)


def test_a_reused_task_gives_its_trials_to_the_others() -> None:
    held = warm_start.Lookup({"w1": [_entry("w1")] * 8}, [], {})
    budget, reused = warm_start.reused_budgets({"a": 8, "b": 30, "c": 10, "d": 0},
                                               {"a": "w1", "b": "w2", "c": "w3", "d": "w1"}, held, per_task=8)
    assert reused == ["a"] and budget == {"a": 0, "b": 36, "c": 12, "d": 0}  # 8 freed, 3:1
    # One trial short of perTask: tuned again.
    assert warm_start.reused_budgets({"a": 8}, {"a": "w1"}, held, per_task=9) == ({"a": 8}, [])


def test_tasks_the_library_lacks_take_their_first_rounds_first() -> None:
    held = warm_start.Lookup({"w1": [_entry("w1")], "w3": [_entry("w3")]}, [], {})
    # a shard's tasks heaviest first: the held ones go last, each side keeps its order
    assert held.first_rounds_order(["w1", "w2", "w3", "w4"]) == [1, 3, 0, 2]
    assert warm_start.Lookup({}, [], {}).first_rounds_order(["w1", "w2"]) == [0, 1]


def _entry(wl: str, secs: float = 1e-6) -> Entry:
    return Entry(Key(wl, "t", "cpu-a", 100), secs, [], "j")


def test_the_cost_model_learns_only_records_of_its_target_and_device(tmp_path: Path) -> None:
    found = _lookup(tmp_path, Where("cpu-a", 100))
    assert sorted(len(v) for v in found.same_share.values()) == [4, 4]
    cost_model = ms.CostModel.create("xgb", num_tuning_cores=1)
    ensure_registered()  # as the client has them before it learns (TuneContext needs the intrinsics)
    assert warm_start.pretrain(cost_model, TARGET, found) == 8 and cost_model.data_size == 8
    elsewhere = _lookup(tmp_path / "b", Where("cpu-b", 100))  # measured on another CPU model
    assert elsewhere.same_device == [] and warm_start.pretrain(ms.CostModel.create("xgb"), TARGET, elsewhere) == 0
    # A library larger than the limit teaches every workload its fastest records, not the first
    # workload all of its own.
    small = ms.CostModel.create("xgb", num_tuning_cores=1)
    assert warm_start.pretrain(small, TARGET, found, limit=4) == 4
    groups = [(wl, found.irs[wl], [e.record for e in es]) for wl, es in found.same_share.items()]
    taught = warm_start.replayed(TARGET, groups, 4, "library")
    assert sorted(len(c) for _, _, c, _ in taught) == [2, 2]
    assert [float(r.run_secs[0]) for _, _, _, rs in taught for r in rs] == pytest.approx([2e-6, 3e-6] * 2)


def test_a_task_the_library_lacks_starts_from_other_workloads_schedules(tmp_path: Path) -> None:
    """Transfer: matmul 64, which the library holds nothing of, gets its first batch from the
    schedules of matmul 16 and 32 replayed on its own module, ranked by the library-trained model;
    that batch is the library's, not the search's."""
    from sharetune_tuner.search.capped_search import CappedSearch, Measured

    found = _lookup(tmp_path, Where("cpu-a", 100))  # 16 and 32, each split by 1, 2, 4, 8
    h = {n: str(tvm_ffi.structural_hash(workload(n))) for n in (16, 32, 64)}
    donors = found.donors(h[64])
    # Every workload's fastest first (the 4-split at 2e-6), then every second fastest, ...
    assert [(e.key.workload, e.secs) for e in donors[:4]] == [
        (min(h[16], h[32]), 2e-6), (max(h[16], h[32]), 2e-6), (min(h[16], h[32]), 3e-6), (max(h[16], h[32]), 3e-6)]
    assert {e.key.workload for e in found.donors(h[16])} == {h[32]} and len(found.donors(h[64], limit=3)) == 3

    ensure_registered()
    cost_model = ms.CostModel.create("xgb", num_tuning_cores=1)
    warm_start.pretrain(cost_model, TARGET, found)
    counted: list[int] = []
    strategy = CappedSearch(ms.search_strategy.ReplayTrace(), 8, Measured(), [], donors, 2, counted.append)
    ctx = ms.TuneContext(mod=workload(64), target=TARGET, space_generator="post-order-apply",
                         search_strategy=strategy, task_name="mm64", rand_state=1, num_threads=1)
    ctx.pre_tuning(max_trials=8, num_trials_per_iter=4, design_spaces=ctx.generate_design_space(),
                   database=ms.database.MemoryDatabase(), cost_model=cost_model)
    batch = ctx.generate_measure_candidates()
    assert counted == [2] and len(batch) == 2 and strategy.seed_batch
    for c in batch:  # the library's split replayed on 64's own loop: 64 = outer x one of its factors
        (split,) = [i for i in c.sch.trace.insts if i.kind.name == "Split"]
        f = int(split.inputs[-1])
        assert f in {1, 2, 4, 8} and [int(c.sch.get(lp).extent) for lp in split.outputs] == [64 // f, f]
    assert len({tvm_ffi.structural_hash(c.sch.mod) for c in batch}) == 2
    # The next batch is the search's own.
    assert not strategy.transfer and strategy.generate_measure_candidates() is not None


def test_the_merge_offers_a_faster_library_record_and_keeps_a_faster_own(tmp_path: Path) -> None:
    found = _lookup(tmp_path, Where("cpu-a", 100))  # best: 2e-6 for both workloads
    _shard(tmp_path / "job", 16, [16], [1e-6])  # the job's own record of 16 is faster
    _shard(tmp_path / "job", 32, [16], [9e-6])  # ... of 32 slower
    own = ms.database.JSONDatabase(work_dir=str(tmp_path / "job")).get_all_tuning_records()
    hashes = {n: str(tvm_ffi.structural_hash(workload(n))) for n in (16, 32, 64)}
    got, from_library = with_library(own, found, set(hashes.values()))
    assert from_library == {hashes[32]}
    secs = {str(tvm_ffi.structural_hash(r.workload.mod)): float(r.run_secs[0]) for r in got}
    assert secs == pytest.approx({hashes[16]: 1e-6, hashes[32]: 2e-6})
    # A job with no records of a workload the library holds gets the library's; one not in the model, none.
    got, from_library = with_library([], found, {hashes[16], hashes[64]})
    assert from_library == {hashes[16]} and len(got) == 1


def test_a_second_job_reuses_what_the_first_added(tmp_path: Path) -> None:
    """The quickstart job twice on one library: the first (warm, library empty) tunes and adds its
    records; the second (reuse) tunes no task the first covered, and its merge re-measures the
    library's records against TVM's defaults and delivers a tuned model."""
    lib = tmp_path / "lib"

    def run(name: str, mode: str) -> dict:
        (tmp_path / name).mkdir()
        job = example_job(tmp_path / name, trials={"total": 16, "perTask": 8, "perIteration": 4},
                          clients={"shards": 1}, servers={"replicas": 1}, library={"path": str(lib), "mode": mode})
        out = tmp_path / name / "summary.json"
        r = subprocess.run([sys.executable, "-m", "sharetune.cli", "run", str(job), "--local",
                            "--workdir", str(tmp_path / name / "run"), "--json", str(out)],
                           capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return json.loads(out.read_text())

    first = run("first", "warm")
    assert first["records"] == 16 and first["library_records_added"] == first["records"]
    assert first["tasks_from_library"] == []
    second = run("second", "reuse")
    tuned_first = {t["name"] for t in first["tasks"] if t["trials"] >= 8}
    assert tuned_first and all(t["trials"] == 0 for t in second["tasks"] if t["name"] in tuned_first)
    assert second["records"] < first["records"]  # its budget went to tasks the first left (if any)
    # What the library gave was re-measured here: every task it delivered beat TVM's default now.
    by_name = {t["name"]: t for t in second["tasks"]}
    assert second["tasks_from_library"] and all(
        by_name[n]["winner"] == "tuned" and by_name[n]["tuned_us"] < by_name[n]["default_us"]
        for n in second["tasks_from_library"])
    assert second["improved"] and second["speedup"] > 1.5
