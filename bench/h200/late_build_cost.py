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
    """The last ``per_shard`` candidates each shard measured (its records file is in measurement
    order; TVM's database API returns a workload's records fastest first), as scheduled IRModules
    (JSON). Failed ones too: the build service built them as well."""
    import tvm
    import tvm.s_tir as st
    from tvm.s_tir import meta_schedule as ms

    from sharetune.api.topology import RECORDS_FILE, WORKLOADS_FILE
    from sharetune_tuner.store.records import read_lines

    out = []
    for shard in sorted(run.glob("shards/shard-*")):
        workloads = read_lines(shard / WORKLOADS_FILE)
        lines = read_lines(shard / RECORDS_FILE)
        for i, (idx, body) in enumerate(lines[-per_shard:]):
            rec = ms.database.TuningRecord.from_json(body, ms.database.Workload.from_json(workloads[idx]))
            sch = st.Schedule(rec.workload.mod)
            rec.trace.apply_to_schedule(sch, remove_postproc=False)  # as the measured candidate was
            path = out_dir / f"{shard.name}-{i}.json"
            path.write_text(tvm.ir.save_json(sch.mod))
            out.append({"model": run.name, "task": shard.name, "i": i, "mod": str(path),
                        "unroll": unroll_step(rec.trace), "run_ms": run_ms(rec)})
    return out


def unroll_step(trace: Any) -> int | None:
    """The candidate's ``auto_unroll_max_step``: the decision of the trace's SampleCategorical over
    the CUDA rules' unroll steps (ParallelizeVectorizeUnroll), None where the trace has none."""
    for inst in trace.insts:
        if inst.kind.name != "SampleCategorical":
            continue
        choices = [int(c) for c in inst.attrs[0]]
        if choices and choices[-1] >= 512:  # the unroll steps (0, 16, 32, ..., 1024); no other categorical ends so
            return choices[int(trace.decisions[inst])]
    return None


def step_key(step: str) -> int:
    """Sort order of unroll steps written as strings ("None", where a trace has none, first)."""
    return int(step) if step.isdigit() else -1


def run_ms(rec: Any) -> float | None:
    secs = [float(x) for x in (rec.run_secs or [])]
    return round(1000 * statistics.median(secs), 4) if secs else None


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


def by_unroll(rows: list[dict[str, Any]], cands: list[dict[str, Any]]) -> dict[str, Any]:
    """Build CPU per candidate grouped by its unroll step: what a cap on the step would save."""
    groups: dict[str, list[float]] = {}
    for r, c in zip(rows, cands, strict=True):
        if not r["error"]:
            groups.setdefault(str(c["unroll"]), []).append(r["cpu_s"])
    return {k: {"n": len(v), "cpu_s_mean": round(statistics.mean(v), 3), "cpu_s_sum": round(sum(v), 2)}
            for k, v in sorted(groups.items(), key=lambda kv: step_key(kv[0]))}


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
           "by_unroll": by_unroll(rows, cands),
           "rows": [{**{k: r.get(k) for k in ("task", "i", "cpu_s", "nvrtc_cpu_s", "error")},
                     "unroll": c["unroll"], "run_ms": c["run_ms"]} for r, c in zip(rows, cands, strict=True)]}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
