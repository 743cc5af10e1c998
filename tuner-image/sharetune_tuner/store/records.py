"""Tuning-record files of MetaSchedule's JSONDatabase: count, repair after a crash, merge.

Layout of one database directory (what ``JSONDatabase(work_dir=...)`` writes, append-only):
  database_workload.json       one line per workload: [structural hash, IR JSON]
  database_tuning_record.json  one line per trial: [workload line index, [trace, run_secs, target, args]]
Concatenating two shards' files is wrong (indices point into each shard's own workload file), so
merging goes through TVM's database API, which re-keys workloads by structural hash.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sharetune.api.topology import RECORDS_FILE as RECORDS
from sharetune.api.topology import WORKLOADS_FILE as WORKLOADS


def _complete_lines(path: Path) -> tuple[list[Any], int]:
    """Parsed JSON lines, and the byte length of the complete, valid prefix of the file."""
    if not path.exists():
        return [], 0
    return _parse_prefix(path.read_bytes())


def snapshot(db_dir: Path) -> dict[str, bytes]:
    """A consistent copy of a database that TVM may be appending to right now, without writing
    to it (cutting a live file would corrupt the line TVM is writing): records are read first,
    then workloads, so every record's workload line is in the copy; a torn last line and records
    whose workload line is not there yet are left for the next snapshot."""
    recs_path, wls_path = db_dir / RECORDS, db_dir / WORKLOADS
    rec_data = recs_path.read_bytes() if recs_path.exists() else b""
    wl_data = wls_path.read_bytes() if wls_path.exists() else b""
    workloads, wl_good = _parse_prefix(wl_data)
    out = bytearray()
    start = 0
    for value, end in _lines(rec_data):
        if value is not None:
            idx = value[0] if isinstance(value, list) and value else None
            if not isinstance(idx, int) or not 0 <= idx < len(workloads):
                break
            out += rec_data[start:end]
        start = end
    return {WORKLOADS: wl_data[:wl_good], RECORDS: bytes(out)}


def _lines(data: bytes) -> Iterator[tuple[Any, int]]:
    """(parsed JSON line or None for a blank one, byte offset just past it) over the complete,
    valid prefix of JSON-lines data: stops at a line without newline or one that does not parse."""
    pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            return
        line = data[pos:nl]
        value = None
        if line.strip():
            try:
                value = json.loads(line)
            except ValueError:
                return
        pos = nl + 1
        yield value, pos


def _parse_prefix(data: bytes) -> tuple[list[Any], int]:
    out: list[Any] = []
    good = 0
    for value, good in _lines(data):
        if value is not None:
            out.append(value)
    return out, good


def parse_lines(data: bytes) -> list[Any]:
    """The JSON lines of a database file's complete, valid prefix (a torn last line left out)."""
    return _parse_prefix(data)[0]


def read_lines(path: Path) -> list[Any]:
    """The complete, valid JSON lines of a records/workloads (or any JSON-lines) file."""
    return _complete_lines(path)[0]


def repair(db_dir: Path) -> int:
    """Cuts a torn last line (kill -9 mid-write) so TVM can load the database; returns bytes cut."""
    cut = 0
    for name in (WORKLOADS, RECORDS):
        p = db_dir / name
        if not p.exists():
            continue
        _, good = _complete_lines(p)
        size = p.stat().st_size
        if good < size:
            with open(p, "r+b") as f:
                f.truncate(good)
                f.flush()
                os.fsync(f.fileno())
            cut += size - good
    return cut


@dataclass
class RecordStats:
    trials_by_workload: Counter[str]  # structural hash -> records
    best_by_workload: dict[str, float]  # structural hash -> best mean run seconds (valid runs)
    total: int
    failed: int


def mean_secs(run_secs: Any) -> float | None:
    """A record's mean run time in seconds; None for a failed run."""
    if not run_secs:
        return None
    vals = [float(x) for x in run_secs]
    m = sum(vals) / len(vals)
    return None if m >= 1e9 else m  # MetaSchedule stores 1e10 for failed runs


@dataclass(frozen=True)
class Measured:
    """One measured record with its workload, as a JSONDatabase's two files hold them."""
    workload: str  # the workload's structural hash
    ir: Any  # the workload's IRModule (TVM's JSON)
    body: list[Any]  # [trace, run_secs, target, args_info]
    secs: float  # mean run time


def measured(workloads: list[Any], lines: list[Any]) -> Iterator[Measured]:
    """The measured records among a database's record ``lines``: lines that name no workload of
    ``workloads`` (a torn or foreign line) and failed builds or runs (nothing to learn from their
    time, nothing to deliver) are left out."""
    for line in lines:
        idx, body = (line[0], line[1]) if isinstance(line, list) and len(line) == 2 else (None, None)
        if not isinstance(idx, int) or not 0 <= idx < len(workloads) or not isinstance(body, list) or len(body) < 3:
            continue
        secs = mean_secs(body[1])
        if secs is not None:
            yield Measured(str(workloads[idx][0]), workloads[idx][1], body, secs)


def stats(db_dir: Path) -> RecordStats:
    """Reads a database directory without TVM (cheap enough to poll for progress)."""
    workloads, _ = _complete_lines(db_dir / WORKLOADS)
    records, _ = _complete_lines(db_dir / RECORDS)
    hashes = [str(w[0]) for w in workloads]
    trials: Counter[str] = Counter()
    best: dict[str, float] = {}
    failed = 0
    for idx, body in records:
        if not 0 <= idx < len(hashes):
            continue
        h = hashes[idx]
        trials[h] += 1
        secs = mean_secs(body[1] if len(body) > 1 else None)
        if secs is None:
            failed += 1
        elif secs < best.get(h, float("inf")):
            best[h] = secs
    return RecordStats(trials, best, sum(trials.values()), failed)


def merge(shard_dirs: list[Path], out_dir: Path, best_dir: Path | None = None) -> dict[str, int]:
    """Merges shard databases into ``out_dir`` (every record kept) and, if given, ``best_dir``
    (the best record per workload). Overlapping workloads across shards collapse into one
    workload entry. Returns counts for the summary."""
    from tvm.s_tir import meta_schedule as ms

    out_dir.mkdir(parents=True, exist_ok=True)
    for f in (WORKLOADS, RECORDS):  # merging is a pure function of the shards: start empty
        (out_dir / f).unlink(missing_ok=True)
    merged = ms.database.JSONDatabase(work_dir=str(out_dir))
    n_in = 0
    for d in shard_dirs:
        if not (d / RECORDS).exists():
            continue
        repair(d)
        db = ms.database.JSONDatabase(work_dir=str(d), allow_missing=False)
        for rec in db.get_all_tuning_records():
            wl = merged.commit_workload(rec.workload.mod)
            merged.commit_tuning_record(ms.database.TuningRecord(
                rec.trace, wl, rec.run_secs, rec.target, rec.args_info))
            n_in += 1
    counts = {"records_in": n_in, "records_out": len(merged.get_all_tuning_records())}
    if best_dir is not None:
        best_dir.mkdir(parents=True, exist_ok=True)
        for f in (WORKLOADS, RECORDS):
            (best_dir / f).unlink(missing_ok=True)
        merged.dump_pruned(ms.database.JSONDatabase(work_dir=str(best_dir)))
        counts["best_records"] = stats(best_dir).total
    counts["workloads"] = len(stats(out_dir).trials_by_workload)
    return counts


def record_keys(db_dir: Path) -> Counter[tuple[str, str, tuple[str, ...]]]:
    """Each record's identity independent of the database it sits in: (workload structural hash,
    trace, run times to 6 significant digits). The merge re-keys workload indices and re-writes
    the JSON, so this is what "the merged records contain every trial measured" compares."""
    workloads, _ = _complete_lines(db_dir / WORKLOADS)
    recs, _ = _complete_lines(db_dir / RECORDS)
    hashes = [str(w[0]) for w in workloads]
    keys: Counter[tuple[str, str, tuple[str, ...]]] = Counter()
    for idx, body in recs:
        if not 0 <= idx < len(hashes):
            continue
        secs = tuple(f"{float(x):.6g}" for x in (body[1] or [])) if len(body) > 1 else ()
        keys[(hashes[idx], json.dumps(body[0], sort_keys=True), secs)] += 1
    return keys
