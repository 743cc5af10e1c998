"""A tuning result is never slower than the model it was given.

The merge measures each task's best record against TVM's default schedule and the whole model
against the untuned build, and keeps the faster. A budget too small to win is made deterministic
here with a record that claims to be fast (as a record measured on a differently loaded server
can) but is slow on any machine: a conv whose reduction loops are hoisted outside a parallel loop,
so every reduction step forks and joins the thread pool.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from sharetune.api.summary import Summary
from sharetune.api.topology import SUMMARY_FILE

from .conftest import example_job

pytestmark = pytest.mark.tvm

SLOW_TASK = "fused_conv2d_add_relu"  # the first conv: 7.3 MFLOP, ~1-5 ms unscheduled
FAST_TASK = "fused_conv2d2_add1_relu1"  # the heaviest conv


def _spec(tmp_path: Path) -> Any:
    from sharetune.api.spec import load_job

    return load_job(example_job(tmp_path, trials={"total": 2, "perTask": 1, "perIteration": 1}))  # far too small to win


def _record_shard(spec: Any, shard: Path, schedules: dict[str, Any]) -> None:
    """A shard database with one hand-made record per task in ``schedules`` (name -> fn(sch)),
    each claiming 0.1 us, as a client's JSONDatabase stores them."""
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms

    from sharetune_tuner.model.loader import load_for_spec
    from sharetune_tuner.model.tasks import extract
    from sharetune_tuner.targets import make_target

    target = make_target(spec.target, spec.builder_workers)
    tasks = {t.info.name: t for t in extract(load_for_spec(spec.model).mod, target)}
    shard.mkdir(parents=True, exist_ok=True)
    db = ms.database.JSONDatabase(work_dir=str(shard))
    for name, fn in schedules.items():
        mod = tasks[name].workload
        sch = Schedule(mod)
        fn(sch)
        db.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, db.commit_workload(mod), [1e-7], target, ms.arg_info.ArgInfo.from_entry_func(mod)))


def _slow(sch: Any) -> None:
    block = sch.get_sblock("conv2d_nchw")
    nn, ff, yy, xx, rc, ry, rx = sch.get_loops(block)
    sch.reorder(rc, ry, rx, nn, ff, yy, xx)
    sch.parallel(yy)  # 27 x 32 fork-joins of 64 x 64 multiply-adds each


def _fast(sch: Any) -> None:
    block = sch.get_sblock("conv2d_nchw")
    nn, ff, yy, xx, rc, ry, rx = sch.get_loops(block)
    sch.reorder(nn, ff, yy, rc, ry, rx, xx)
    sch.vectorize(xx)  # 32 output columns at once instead of one 3-tap scalar loop
    sch.decompose_reduction(block, rc)


def _cli_text(summary: dict[str, Any], tmp_path: Path) -> str:
    from sharetune.local.cli import _print_summary

    console = Console(record=True, width=250)
    _print_summary(console, Summary.from_dict({**summary, "tuning_s": 1.0, "trials_per_s": 2.0}), tmp_path)
    return console.export_text()


def test_a_budget_too_small_to_win_delivers_the_untuned_model(tmp_path: Path) -> None:
    from sharetune_tuner.merge import DEFAULT, NO_RECORDS, merge_and_report
    from sharetune_tuner.store import records

    spec = _spec(tmp_path)
    _record_shard(spec, tmp_path / "shard-0", {SLOW_TASK: _slow})
    s = asdict(merge_and_report(spec, [tmp_path / "shard-0"], tmp_path / "out"))
    by_name = {t["name"]: t for t in s["tasks"]}
    slow = by_name[SLOW_TASK]
    assert slow["winner"] == DEFAULT and slow["tuned_us"] > 2 * slow["default_us"], slow
    assert slow["best_latency_us"] == 0.1  # what the record claimed: the merge measured it itself
    assert all(t["winner"] == NO_RECORDS for n, t in by_name.items() if n != SLOW_TASK)
    assert s["tasks_default_won"] == [SLOW_TASK]
    # 2 trials at >= 1 per task: only the two heaviest tasks get a budget, the rest keep their defaults.
    assert [t["budget"] for t in s["tasks"]][:2] == [1, 1] and len(s["tasks_left_at_default"]) == 6
    # The delivered model is the untuned one: nothing to apply, a speed-up of 1.0, said plainly.
    assert s["improved"] is False and s["delivered"] == "untuned" and s["speedup"] == 1.0
    assert s["latency_tuned_ms"] == s["latency_untuned_ms"] and s["best_records"] == 0
    assert records.stats(tmp_path / "out" / "best").total == 0
    assert records.stats(tmp_path / "out" / "records").total == 1  # every trial is still kept
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["improved"] is False
    text = _cli_text(s, tmp_path)
    assert "tuning did not beat TVM's defaults at this budget" in text and "try a larger trials.total" in text
    assert "x)" not in text.split("end-to-end latency")[1].split("\n")[0]  # no speed-up figure


def test_only_records_that_beat_their_default_are_kept(tmp_path: Path) -> None:
    from sharetune_tuner.merge import DEFAULT, TUNED, deliver, faster, merge_and_report
    from sharetune_tuner.store import records

    spec = _spec(tmp_path)
    _record_shard(spec, tmp_path / "shard-0", {SLOW_TASK: _slow, FAST_TASK: _fast})
    summary = merge_and_report(spec, [tmp_path / "shard-0"], tmp_path / "out")
    # What the merge wrote reads back as exactly what it returned (the contract's one wire format).
    assert Summary.read(tmp_path / "out" / SUMMARY_FILE) == summary and summary.version == 1
    s = asdict(summary)
    by_name = {t["name"]: t for t in s["tasks"]}
    assert by_name[SLOW_TASK]["winner"] == DEFAULT
    fast = by_name[FAST_TASK]  # measured 34.2 ms default, 3.6 ms vectorised on the 2-core machine
    assert fast["winner"] == TUNED and faster(fast["tuned_us"], fast["default_us"]), fast
    assert s["candidate_records"] == 2 and s["tasks_default_won"] == [SLOW_TASK]
    # The model with the one kept record (measured 47.4 -> 18.9 ms) is the result.
    assert s["improved"] is True and s["delivered"] == TUNED
    assert s["improved"] == deliver(1, s["latency_untuned_ms"], s["latency_records_ms"])
    assert s["latency_tuned_ms"] == s["latency_records_ms"] < s["latency_untuned_ms"] and s["speedup"] > 1
    assert records.stats(tmp_path / "out" / "best").total == s["best_records"] == 1
    assert s["max_relative_error"] < 1e-3
    text = _cli_text(s, tmp_path)
    assert f"({s['speedup']:.2f}x)" in text and "did not beat" not in text
