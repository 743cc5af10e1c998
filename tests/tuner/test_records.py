"""Merging shard databases: nothing lost, overlapping workloads collapse, best record wins."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("tvm")

import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.testing import te_workload

from sharetune_tuner.store import records

pytestmark = pytest.mark.tvm
TARGET = tvm.target.Target({"kind": "llvm", "num-cores": 1})


def workload(n: int) -> tvm.IRModule:
    return tvm.IRModule({"main": te.create_prim_func(te_workload.matmul(n, n, n))})


def write_shard(d: Path, entries: list[tuple[int, float]]) -> None:
    """entries: (matmul size -> workload, run seconds) committed as real TVM tuning records."""
    d.mkdir(parents=True, exist_ok=True)  # JSONDatabase creates files, not directories
    db = ms.database.JSONDatabase(work_dir=str(d))
    for n, secs in entries:
        mod = workload(n)
        sch = tvm.s_tir.Schedule(mod)
        i, j, _ = sch.get_loops(sch.get_sblock("C"))
        sch.reorder(j, i)  # a real, non-empty trace (empty ones are dropped by dump_pruned)
        wl = db.commit_workload(mod)
        db.commit_tuning_record(ms.database.TuningRecord(
            sch.trace, wl, [secs], TARGET, ms.arg_info.ArgInfo.from_prim_func(mod["main"])))


def test_merge_keeps_every_record_and_the_best_per_workload(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    # Workload 32 is tuned by both shards (overlap); its best record is in shard b.
    write_shard(a, [(16, 5e-6), (16, 3e-6), (32, 9e-6)])
    write_shard(b, [(32, 1e-6), (32, 4e-6), (64, 7e-6)])
    counts = records.merge([a, b], tmp_path / "all", tmp_path / "best")
    assert counts == {"records_in": 6, "records_out": 6, "workloads": 3, "best_records": 3}

    merged = ms.database.JSONDatabase(work_dir=str(tmp_path / "all"))
    assert len(merged.get_all_tuning_records()) == 6
    best = ms.database.JSONDatabase(work_dir=str(tmp_path / "best"))
    got = {n: float(best.query_tuning_record(workload(n), TARGET, "main").run_secs[0]) for n in (16, 32, 64)}
    assert got == pytest.approx({16: 3e-6, 32: 1e-6, 64: 7e-6})
    # The workload table holds each workload once, and record indices point into it.
    s = records.stats(tmp_path / "all")
    assert sorted(s.trials_by_workload.values()) == [1, 2, 3]


def test_naive_concatenation_would_misattribute(tmp_path: Path) -> None:
    """Why merge goes through TVM: shard b's record index 0 means *its* first workload."""
    a, b = tmp_path / "a", tmp_path / "b"
    write_shard(a, [(16, 5e-6)])
    write_shard(b, [(64, 7e-6)])
    cat = tmp_path / "cat"
    cat.mkdir()
    for f in (records.WORKLOADS, records.RECORDS):
        (cat / f).write_bytes((a / f).read_bytes() + (b / f).read_bytes())
    assert sorted(records.stats(cat).trials_by_workload.values()) == [2]  # both land on workload 16
    records.merge([a, b], tmp_path / "m")
    assert sorted(records.stats(tmp_path / "m").trials_by_workload.values()) == [1, 1]


def test_torn_last_line_is_repaired_and_earlier_records_survive(tmp_path: Path) -> None:
    d = tmp_path / "s"
    write_shard(d, [(16, 5e-6), (16, 4e-6)])
    rec = d / records.RECORDS
    whole = rec.read_bytes()
    rec.write_bytes(whole + whole.splitlines(keepends=True)[0][:40])  # kill -9 mid-write
    assert records.stats(d).total == 2
    assert records.repair(d) == 40
    assert rec.read_bytes() == whole
    assert len(ms.database.JSONDatabase(work_dir=str(d)).get_all_tuning_records()) == 2


def test_snapshot_of_a_live_database_is_consistent_and_writes_nothing(tmp_path: Path) -> None:
    """What the shard sync uploads while TVM appends: complete lines only, every record's
    workload present, and the live files untouched (cutting a line TVM is writing corrupted the
    database once: the merge could not load it)."""
    from sharetune_tuner.store.records import RECORDS, WORKLOADS, snapshot

    wl = b'["h0", "ir0"]\n["h1", "ir1"]\n["h2", "i'  # a workload line being written
    recs = (b'[0, [[], [1.0], "t", []]]\n[1, [[], [2.0], "t", []]]\n'
            b'[2, [[], [3.0], "t", []]]\n'  # its workload line is not complete yet
            b'[1, [[], [4.0')  # a torn record line
    (tmp_path / WORKLOADS).write_bytes(wl)
    (tmp_path / RECORDS).write_bytes(recs)
    snap = snapshot(tmp_path)
    assert snap[WORKLOADS] == b'["h0", "ir0"]\n["h1", "ir1"]\n'
    assert snap[RECORDS] == b'[0, [[], [1.0], "t", []]]\n[1, [[], [2.0], "t", []]]\n'
    assert (tmp_path / WORKLOADS).read_bytes() == wl and (tmp_path / RECORDS).read_bytes() == recs
