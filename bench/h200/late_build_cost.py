"""Where the build CPU of a real run's late candidates goes: the last records of each shard of a
finished `real_budget.py` arm (its tar), rebuilt on any CPU the way a builder worker builds them
(one long-lived process: lowering, codegen, NVRTC with the shipped hoisted headers + PCH, the .so
link), with NVRTC's own phase timer (``--time``): front end, NVVM optimizer, PTX translation (ptxas).
No GPU: NVRTC and the image's stand-in driver library (source nvrtc_env.sh first).

  source bench/h200/nvrtc_env.sh
  python bench/h200/late_build_cost.py --tar bench/results/rb-resnet50-s0-sharetune.tar.gz --per-shard 8

Writes ``bench/results/late-build-cost.json``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from common import RESULTS

PHASES = {"CUDA C++ Frontend": "frontend", "NVVM Optimizer": "nvvm_optimizer", "PTX Translation": "ptxas"}


def candidates(run: Path, per_shard: int, out_dir: Path) -> list[dict[str, Any]]:
    """The last ``per_shard`` records of each shard's database, as scheduled IRModules (JSON)."""
    import tvm
    import tvm.s_tir as st
    from tvm.s_tir import meta_schedule as ms

    out = []
    for shard in sorted(run.glob("shards/shard-*")):
        db = ms.database.JSONDatabase(path_workload=str(shard / "database_workload.json"),
                                      path_tuning_record=str(shard / "database_tuning_record.json"))
        for i, rec in enumerate(list(db.get_all_tuning_records())[-per_shard:]):
            sch = st.Schedule(rec.workload.mod)
            rec.trace.apply_to_schedule(sch, remove_postproc=False)  # as the measured candidate was
            path = out_dir / f"{shard.name}-{i}.json"
            path.write_text(tvm.ir.save_json(sch.mod))
            out.append({"model": run.name, "task": shard.name, "i": i, "mod": str(path)})
    return out


def phases(csv_path: Path) -> list[dict[str, float]]:
    """NVRTC's ``--time`` table, one dict of phase -> CPU ms per compile (three rows each)."""
    rows: list[dict[str, float]] = []
    with csv_path.open() as f:
        for r in csv.reader(f):
            if len(r) < 3 or r[1].strip() not in PHASES:
                continue
            name = PHASES[r[1].strip()]
            if not rows or name in rows[-1]:
                rows.append({})
            rows[-1][name] = float(r[2])
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tar", required=True, help="a real_budget.py arm's tar.gz (sharetune: shards/shard-*)")
    ap.add_argument("--per-shard", type=int, default=8)
    ap.add_argument("--out", default=str(RESULTS / "late-build-cost.json"))
    ap.add_argument("--machine", default=platform.node(), help="what ran it, in words, for the results page")
    a = ap.parse_args()
    from build_cost import worker

    wd = Path(tempfile.mkdtemp(prefix="late-build-"))
    run = wd / Path(a.tar).name.removesuffix(".tar.gz")
    with tarfile.open(a.tar) as t:
        t.extractall(run, filter="data")
    (wd / "mods").mkdir()
    cands = candidates(run, a.per_shard, wd / "mods")
    (wd / "cands.json").write_text(json.dumps(cands))
    timer = wd / "nvrtc-time.csv"
    os.environ["TVM_CUDA_NVRTC_EXTRA_OPTS"] = f"--time={timer}"
    t0 = time.perf_counter()
    worker("hoist-pch", wd / "cands.json", wd / "rows.json", wd / "art")
    rows = json.loads((wd / "rows.json").read_text())
    ok = [r for r in rows if not r["error"]]
    per = phases(timer)
    mean = lambda xs: round(statistics.mean(xs), 3) if xs else None  # noqa: E731  # a one-line helper
    phase_s = {p: mean([c.get(p, 0.0) / 1000 for c in per]) for p in PHASES.values()}
    out = {"date": time.strftime("%Y-%m-%d"), "machine": a.machine, "cpu": platform.processor() or platform.machine(),
           "command": f"python bench/h200/late_build_cost.py --tar {a.tar} --per-shard {a.per_shard}",
           "tar": Path(a.tar).name, "candidates": len(rows), "errors": len(rows) - len(ok),
           "wall_s": round(time.perf_counter() - t0, 1),
           "cpu_s_per_candidate": {"mean": mean([r["cpu_s"] for r in ok]),
                                   "median": round(statistics.median([r["cpu_s"] for r in ok]), 3) if ok else None,
                                   "max": max((r["cpu_s"] for r in ok), default=None)},
           "nvrtc_cpu_s_per_candidate_mean": mean([r.get("nvrtc_cpu_s", 0.0) for r in ok]),
           "nvrtc_share_of_build": round(sum(r.get("nvrtc_cpu_s", 0.0) for r in ok) / sum(r["cpu_s"] for r in ok), 3)
           if ok else None,
           "nvrtc_phase_s_mean": phase_s, "nvrtc_compiles_timed": len(per),
           "rows": [{k: r.get(k) for k in ("task", "i", "cpu_s", "nvrtc_cpu_s", "error")} for r in rows]}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
