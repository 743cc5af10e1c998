"""What capping the CUDA search's unroll step would cost: over finished `real_budget.py` sharetune
arms (their tars), per task the unroll step (``auto_unroll_max_step``) of its fastest record, and how
much slower its best would be without the records of the largest step. No GPU, no build: the
records' own run times.

  python bench/h200/unroll_quality.py bench/results/rb-resnet50-s{2,3,4,5}-sharetune.tar.gz

Writes ``bench/results/unroll-quality.json``.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import statistics
import tarfile
import tempfile
import time
from pathlib import Path

from common import RESULTS
from late_build_cost import step_key, unroll_step


def task_bests(tar: Path) -> list[list[tuple[float, int | None]]]:
    """Per task of the arm: (run ms, unroll step) of every measured record, fastest first (failed
    builds and runs left out, as the library and the merge leave them out: records.measured)."""
    from tvm.s_tir import meta_schedule as ms

    from sharetune.api.topology import RECORDS_FILE, WORKLOADS_FILE
    from sharetune_tuner.store.records import measured, read_lines

    wd = Path(tempfile.mkdtemp(prefix="unroll-quality-"))
    with tarfile.open(tar) as t:
        t.extractall(wd, filter="data")
    out = []
    for shard in sorted(wd.glob("shards/shard-*")):
        workloads = read_lines(shard / WORKLOADS_FILE)
        by: dict[str, list[tuple[float, int | None]]] = collections.defaultdict(list)
        for m in measured(workloads, read_lines(shard / RECORDS_FILE)):
            wl = ms.database.Workload.from_json([m.workload, m.ir])
            by[m.workload].append((1000 * m.secs, unroll_step(ms.database.TuningRecord.from_json(m.body, wl).trace)))
        out += [sorted(v, key=lambda x: x[0]) for v in by.values()]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("tars", nargs="+", type=Path)
    ap.add_argument("--out", default=str(RESULTS / "unroll-quality.json"))
    a = ap.parse_args()
    tasks = [recs for tar in a.tars for recs in task_bests(tar)]
    largest = max((u for recs in tasks for _, u in recs if u is not None), default=None)
    measured = collections.Counter(str(u) for recs in tasks for _, u in recs)
    fastest = collections.Counter(str(recs[0][1]) for recs in tasks)
    without = [rest[0] / recs[0][0] for recs in tasks if (rest := [m for m, u in recs if u != largest])]
    out = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.node()} (reads the records; they were measured "
                                                          "on the arms' GPU machines)",
           "command": "python bench/h200/unroll_quality.py " + " ".join(str(t) for t in a.tars),
           "task_runs": len(without), "largest_step": largest,
           "measured_by_step": dict(sorted(measured.items(), key=lambda kv: step_key(kv[0]))),
           "fastest_by_step": dict(sorted(fastest.items(), key=lambda kv: step_key(kv[0]))),
           "best_without_largest_over_best": {"geomean": round(statistics.geometric_mean(without), 4),
                                              "max": round(max(without), 4),
                                              "tasks_slower": sum(1 for x in without if x > 1.0)}}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
