"""Would transfer-tuning help a related model? A probe, before building it into the client.

For each of a network's tasks whose workload a tuning library does not hold (the tasks ``warm``
and ``reuse`` cannot help), two first rounds of K candidates, measured on this CPU (llvm):

  random     K schedules sampled from the task's design space (ReplayTrace: what a cold task's
             first round measures)
  transfer   every library schedule of any other workload replayed on this task's module (trace
             decisions that no longer divide a loop fall back to TVM's own default; postprocessing
             re-run), the ones that apply ranked by a cost model trained on the library
             (warm_start.pretrain) and the K best measured; topped up with random ones when fewer apply

Per task it records both arms' best-of-first-k for k = 1..K and how many transfer candidates
matched random's best of K; across tasks the geometric mean of transfer's best over random's.

    PYTHONPATH=operator:tuner-image python bench/transfer_probe.py --library DIR --scope local \\
        --network resnet50 --input 64 --tasks 12 --k 8
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "cpu-transfer-probe.json"


def _measure(cands: list[Any], target: Any) -> list[float]:
    """Mean run seconds of each candidate (inf where it fails to build or run)."""
    from tvm.s_tir import meta_schedule as ms

    builder = ms.builder.LocalBuilder(max_workers=os.cpu_count() or 1, timeout_sec=120)
    runner = ms.runner.LocalRunner(evaluator_config=ms.runner.EvaluatorConfig(number=3, repeat=1,
                                                                             min_repeat_ms=40))
    built = builder.build([ms.builder.BuilderInput(c.sch.mod, target) for c in cands])
    out: list[float] = [math.inf] * len(cands)
    inputs, where = [], []
    for i, (c, b) in enumerate(zip(cands, built)):
        if b.error_msg is not None:
            print(f"build error: {b.error_msg.strip().splitlines()[-1][:300]}", file=sys.stderr)
        else:
            inputs.append(ms.runner.RunnerInput(b.artifact_path, "cpu", c.args_info))
            where.append(i)
    for i, fut in zip(where, runner.run(inputs)):
        r = fut.result()
        if r.error_msg is None and r.run_secs:
            out[i] = statistics.mean(float(s) for s in r.run_secs)
        else:
            print(f"run error: {(r.error_msg or 'no time').strip().splitlines()[-1][:300]}", file=sys.stderr)
    return out


def _random(ctx: Any, k: int) -> list[Any]:
    from tvm.s_tir import meta_schedule as ms

    ctx.pre_tuning(max_trials=k, num_trials_per_iter=k, design_spaces=ctx.generate_design_space(),
                   database=ms.database.MemoryDatabase(), cost_model=ms.cost_model.RandomModel(seed=0))
    cands = list(ctx.generate_measure_candidates() or [])
    ctx.post_tuning()
    return cands[:k]


def _transferred(mod: Any, target: Any, ctx: Any, donors: list[tuple[Any, list[Any]]]) -> list[Any]:
    """Every donor trace that applies to ``mod`` and passes postprocessing, as measure candidates
    (deduplicated by the scheduled module's structure)."""
    import tvm_ffi
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms

    postprocs = ctx.space_generator.postprocs
    seen: set[int] = set()
    out = []
    for workload, bodies in donors:
        for body in bodies:
            try:
                trace = ms.database.TuningRecord.from_json(body, workload).trace
                sch = Schedule(mod, error_render_level="none")
                trace.apply_to_schedule(sch, remove_postproc=True)
                if not all(p.apply(sch) for p in postprocs):
                    continue
            except Exception:  # a trace whose blocks or loops this module does not have
                continue
            h = tvm_ffi.structural_hash(sch.mod)
            if h in seen:
                continue
            seen.add(h)
            out.append(ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)))
    return out


def probe(a: argparse.Namespace) -> dict[str, Any]:
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from sharetune_tuner.model.loader import load
    from sharetune_tuner.model.tasks import extract
    from sharetune_tuner.search.partition import order
    from sharetune_tuner.search.warm_start import Lookup, pretrain
    from sharetune_tuner.store.library import entries, open_library

    found, irs = entries(open_library(a.library), a.scope)
    if not found:
        raise SystemExit(f"{a.library} scope {a.scope}: no records")
    target = tvm.target.Target(found[0].record[2])
    every = extract(load(name=a.network, input_shape=(1, 3, a.input, a.input)).mod, target)
    held = {e.key.workload for e in found}
    new = [t for t in order([t.info for t in every])]
    by_key = {t.info.key: t for t in every}
    tasks = []
    for info in new:
        t = by_key[info.key]
        wl = ms.database.Workload(t.workload).as_json()[0]
        if wl not in held:
            tasks.append(t)
    shared = len(every) - len(tasks)
    tasks = tasks[:a.tasks]
    # Donors: each library workload's best records, fastest first.
    per_wl: dict[str, list[Any]] = {}
    for e in sorted(found, key=lambda e: e.secs):
        per_wl.setdefault(e.key.workload, []).append(e.record)
    donors = [(ms.database.Workload.from_json([wl, irs[wl]]), recs[:a.per_donor])
              for wl, recs in sorted(per_wl.items()) if wl in irs]
    model = ms.cost_model.XGBModel(num_warmup_samples=0)
    learnt = pretrain(model, target, Lookup({}, found, irs))
    rows = []
    for i, t in enumerate(tasks):
        ctx = ms.TuneContext(t.workload, target=target, space_generator="post-order-apply",
                             search_strategy=ms.search_strategy.ReplayTrace(max_fail_count=100),
                             task_name=t.info.name, rand_state=a.seed * 1000 + i, num_threads=1)
        t0 = time.time()
        pool = _transferred(t.workload, target, ctx, donors)
        if pool:
            scores = list(model.predict(ctx, pool))
            pool = [c for _, _, c in sorted(zip(scores, range(len(pool)), pool), key=lambda x: (-x[0], x[1]))]
        rand = _random(ctx, a.k)
        transfer = pool[:a.k] + rand[:max(0, a.k - len(pool))]
        secs_r = _measure(rand, target)
        secs_t = _measure(transfer, target)
        best = lambda xs, k: min(xs[:k], default=math.inf)  # noqa: E731  # a one-line helper
        goal = best(secs_r, a.k)
        match = next((k for k in range(1, a.k + 1) if best(secs_t, k) <= goal), None)
        rows.append({"task": t.info.name, "applied": len(pool), "random_ms": [round(s * 1e3, 4) for s in secs_r],
                     "transfer_ms": [round(s * 1e3, 4) for s in secs_t],
                     "best_ratio": round(best(secs_t, a.k) / goal, 4) if math.isfinite(goal) else None,
                     "transfer_k_to_random_best": match, "wall_s": round(time.time() - t0, 1)})
        print(json.dumps({k: rows[-1][k] for k in ("task", "applied", "best_ratio", "transfer_k_to_random_best")}),
              flush=True)
    ratios = [r["best_ratio"] for r in rows if r["best_ratio"] and math.isfinite(r["best_ratio"])]
    return {
        "date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} cores, {_cpu()}",
        "command": " ".join(["python bench/transfer_probe.py", *sys.argv[1:]]),
        "network": a.network, "input": a.input, "k": a.k, "seed": a.seed, "per_donor": a.per_donor,
        "library_records": len(found), "library_workloads": len(per_wl), "model_learnt_from": learnt,
        "tasks_total": len(every), "tasks_shared": shared, "tasks_probed": len(rows),
        "best_ratio_geomean": round(math.exp(statistics.mean(math.log(r) for r in ratios)), 4) if ratios else None,
        "tasks_transfer_matched_random_best": sum(r["transfer_k_to_random_best"] is not None for r in rows),
        "rows": rows,
    }


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--library", required=True)
    p.add_argument("--scope", default="local")
    p.add_argument("--network", default="resnet50")
    p.add_argument("--input", type=int, default=64)
    p.add_argument("--tasks", type=int, default=12, help="the heaviest tasks the library does not hold")
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--per-donor", type=int, default=4, help="records of each library workload tried")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(OUT))
    a = p.parse_args()
    random.seed(a.seed)
    res = probe(a)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k != "rows"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
