"""Would transfer-tuning help a related model? A probe, before building it into the client.

For each of a network's tasks whose workload a tuning library does not hold (the tasks ``warm``
and ``reuse`` cannot help), two first rounds of K candidates, measured on this CPU (llvm):

  random     K schedules sampled from the task's design space (ReplayTrace: what a cold task's
             first round measures)
  transfer   the client's transfer (warm_start.Lookup.donors, capped_search.seed_candidates and
             capped_search.ranked: other workloads' fastest schedules replayed on this task's module,
             ranked by a cost model trained on the library) and the K best measured; topped up with
             random ones when fewer apply

Per task it records both arms' best-of-first-k for k = 1..K (transfer's over random's), how many
transfer candidates matched random's best of K, and a round of K/2 transferred plus K/2 random
against random's K; across tasks the geometric means.

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


def _transferred(ctx: Any, model: Any, donors: list[Any]) -> list[Any]:
    """The client's transfer (capped_search.seed_candidates, then ranked by ``model``), each
    scheduled module once."""
    import tvm_ffi

    from sharetune_tuner.search.capped_search import ranked, seed_candidates

    seen: set[int] = set()
    out = []
    for c in ranked(model, ctx, seed_candidates(ctx, donors)):
        h = tvm_ffi.structural_hash(c.sch.mod)
        if h not in seen:
            seen.add(h)
            out.append(c)
    return out


def probe(a: argparse.Namespace) -> dict[str, Any]:
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from sharetune_tuner.model.loader import load
    from sharetune_tuner.model.tasks import extract
    from sharetune_tuner.search.partition import order
    from sharetune_tuner.search.warm_start import LibraryUse, lookup, pretrain
    from sharetune_tuner.store.library import Where, entries, open_library

    found, _ = entries(open_library(a.library), a.scope)
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
    tasks = ([by_key[info.key] for info in new] if a.replay_only else tasks)[:a.tasks]
    # The client's own lookup, for the device and share the library's records were measured at.
    library = lookup(LibraryUse(a.library, a.scope, "warm", Where(found[0].key.device, found[0].key.share)), target)
    model = ms.cost_model.XGBModel(num_warmup_samples=0)
    learnt = pretrain(model, target, library)
    if a.replay_only:
        return replay_cost(a, target, tasks, library, model, learnt)
    rows = []
    for i, t in enumerate(tasks):
        ctx = ms.TuneContext(t.workload, target=target, space_generator="post-order-apply",
                             search_strategy=ms.search_strategy.ReplayTrace(max_fail_count=100),
                             task_name=t.info.name, rand_state=a.seed * 1000 + i, num_threads=1)
        t0 = time.time()
        wl = ms.database.Workload(t.workload).as_json()[0]
        pool = _transferred(ctx, model, library.donors(wl, a.per_donor))
        rand = _random(ctx, a.k)
        transfer = pool[:a.k] + rand[:max(0, a.k - len(pool))]
        secs_r = _measure(rand, target)
        secs_t = _measure(transfer, target)
        best = lambda xs, k: min(xs[:k], default=math.inf)  # noqa: E731  # a one-line helper
        goal = best(secs_r, a.k)
        match = next((k for k in range(1, a.k + 1) if best(secs_t, k) <= goal), None)
        half = a.k // 2  # half a round transferred, half random: best of both against random's whole round
        mixed = min(best(secs_t, half), best(secs_r, a.k - half))
        rows.append({"task": t.info.name, "applied": len(pool), "random_ms": [round(s * 1e3, 4) for s in secs_r],
                     "transfer_ms": [round(s * 1e3, 4) for s in secs_t],
                     "best_ratio": round(best(secs_t, a.k) / goal, 4) if math.isfinite(goal) else None,
                     "transfer_k_to_random_best": match,
                     "best_ratio_at_k": [_ratio(best(secs_t, k), best(secs_r, k)) for k in range(1, a.k + 1)],
                     "mixed_ratio": round(mixed / goal, 4) if math.isfinite(goal) else None,
                     "wall_s": round(time.time() - t0, 1)})
        print(json.dumps({k: rows[-1][k] for k in ("task", "applied", "best_ratio", "transfer_k_to_random_best")}),
              flush=True)
    ratios = [r["best_ratio"] for r in rows if r["best_ratio"] and math.isfinite(r["best_ratio"])]
    return {
        "date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} cores, {_cpu()}",
        "command": " ".join(["python bench/transfer_probe.py", *sys.argv[1:]]),
        "network": a.network, "input": a.input, "k": a.k, "seed": a.seed, "per_donor": a.per_donor,
        "library_records": len(found), "library_workloads": len(library.same_share), "model_learnt_from": learnt,
        "tasks_total": len(every), "tasks_shared": shared, "tasks_probed": len(rows),
        "best_ratio_geomean": _geo(ratios),
        "best_ratio_at_k_geomean": [_geo([r["best_ratio_at_k"][k] for r in rows if r["best_ratio_at_k"][k]])
                                    for k in range(a.k)],
        "mixed_ratio_geomean": _geo([r["mixed_ratio"] for r in rows if r["mixed_ratio"]]),
        "tasks_transfer_matched_random_best": sum(r["transfer_k_to_random_best"] is not None for r in rows),
        "rows": rows,
    }


def replay_cost(a: argparse.Namespace, target: Any, tasks: list[Any], library: Any, model: Any,
                learnt: int) -> dict[str, Any]:
    """What transfer costs a client per fresh task, nothing measured: every donor replayed on the
    task's module (capped_search.seed_candidates) and the cost model's ranking of those that apply,
    in CPU seconds. Every task counts, held or not: its donors are the other workloads'."""
    from tvm.s_tir import meta_schedule as ms

    from sharetune_tuner.search.capped_search import ranked, seed_candidates

    rows = []
    for i, t in enumerate(tasks):
        ctx = ms.TuneContext(t.workload, target=target, space_generator="post-order-apply",
                             search_strategy=ms.search_strategy.ReplayTrace(max_fail_count=100),
                             task_name=t.info.name, rand_state=a.seed * 1000 + i, num_threads=1)
        donors = library.donors(ms.database.Workload(t.workload).as_json()[0], a.per_donor)
        c0 = time.process_time()
        cands = seed_candidates(ctx, donors)
        c1 = time.process_time()
        ranked(model, ctx, cands)
        c2 = time.process_time()
        rows.append({"task": t.info.name, "donors": len(donors), "applied": len(cands),
                     "replay_cpu_s": round(c1 - c0, 3), "rank_cpu_s": round(c2 - c1, 3)})
        print(json.dumps(rows[-1]), flush=True)
    total = [r["replay_cpu_s"] + r["rank_cpu_s"] for r in rows]
    return {"date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} cores, {_cpu()}",
            "command": " ".join(["python bench/transfer_probe.py", *sys.argv[1:]]),
            "network": a.network, "input": a.input, "target": str(target.kind.name), "per_donor": a.per_donor,
            "library_records": len(library.same_device), "model_learnt_from": learnt, "tasks": len(rows),
            "cpu_s_per_task": {"mean": round(statistics.mean(total), 3), "max": round(max(total), 3),
                               "sum": round(sum(total), 2)} if total else None,
            "rows": rows}


def _ratio(x: float, y: float) -> float | None:
    return round(x / y, 4) if math.isfinite(x) and math.isfinite(y) else None


def _geo(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and math.isfinite(x)]
    return round(math.exp(statistics.mean(math.log(x) for x in xs)), 4) if xs else None


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
    p.add_argument("--replay-only", action="store_true", help="time transfer's replay and ranking per task "
                   "(every task, none measured; any target, e.g. a CUDA library on a CPU machine)")
    p.add_argument("--out", default=str(OUT))
    a = p.parse_args()
    random.seed(a.seed)
    res = probe(a)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k != "rows"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
