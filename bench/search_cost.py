"""What a client's evolutionary search costs per candidate, by its shape (SHARETUNE_EVOLUTION: PxG,
population per candidate x generations), on any CPU: the search of a CUDA target needs no GPU.

For each of the K heaviest tasks of a network (CUDA, SHARETUNE_CUDA_ARCH, default sm_90a) and
each shape, R rounds of one batch each, as a client's rounds after a task's first: every round's
candidates are committed to the task's database with made-up run times (the next round's initial
population draws from the best of them, as after real measurements) and the cost model is the
random one (the profile of a real client puts under 2% of its time in XGBoost). One search thread,
so the CPU seconds are the work, not the parallelism. What it does not say: how good the
candidates are (that needs the GPU: real_budget.py's sharetune arm with --evolution).

``--records TAR`` (a real_budget.py arm's tar, CUDA records measured on the GPU): instead, each
task's database holds that arm's measured records of the task and the cost model is XGBoost trained
on them; every round's candidates are scored by that model (the score of a candidate predicted as
fast as the task's best measured record is 1). A proxy for what a search shape finds, on any CPU:
it says how well a shape finds what a model trained on real measurements ranks high, not how fast
the candidates really are.

    python bench/search_cost.py --network mobilenet_v2 --tasks 4 --rounds 3 --variants 8x4,8x2,4x4
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _round(ctx: Any, db: Any, target: Any, workload_mod: Any, rng: random.Random, scorer: Any = None,
           scores: list[list[float]] | None = None) -> tuple[float, int]:
    """One search round and the commit of its candidates; (CPU s of the search, candidates).
    ``scorer``: a cost model whose scores of the round's candidates go to ``scores``; they are then
    committed as slow (they stay measured, the database's best stay the real records)."""
    from tvm.ir.prim import FloatImm
    from tvm.s_tir import meta_schedule as ms

    t = time.process_time()
    cands = ctx.generate_measure_candidates() or []
    cpu = time.process_time() - t
    if scorer is not None and scores is not None:
        scores.append([float(x) for x in scorer.predict(ctx, cands)] if cands else [])
    workload = db.commit_workload(workload_mod)
    results = []
    for c in cands:
        secs = [FloatImm("float32", 1.0 if scorer is not None else rng.uniform(1e-5, 1e-3))]
        db.commit_tuning_record(ms.database.TuningRecord(trace=c.sch.trace, workload=workload, run_secs=secs,
                                                         target=target, args_info=c.args_info))
        results.append(ms.runner.RunnerResult(run_secs=secs, error_msg=None))
    ctx.notify_runner_results(cands, results)
    return cpu, len(cands)


def _real_records(tar: Path) -> list[Any]:
    """The JSON databases of an arm's tar (one per shard), unpacked to a temporary directory."""
    import tarfile
    import tempfile

    from tvm.s_tir import meta_schedule as ms

    d = Path(tempfile.mkdtemp(prefix="search-cost-"))
    with tarfile.open(tar) as t:
        t.extractall(d, filter="data")
    return [ms.database.JSONDatabase(path_workload=str(w),
                                     path_tuning_record=str(w.parent / "database_tuning_record.json"))
            for w in sorted(d.rglob("database_workload.json"))]


def _seeded(dbs: list[Any], ctx: Any, workload_mod: Any) -> tuple[Any, Any, int]:
    """A memory database holding the task's measured records from ``dbs`` and an XGBoost model
    trained on them; (database, model, records)."""
    from tvm.s_tir import meta_schedule as ms

    db = ms.database.MemoryDatabase()
    workload = db.commit_workload(workload_mod)
    cands, results = [], []
    for src in dbs:
        if not src.has_workload(workload_mod):
            continue
        for r in src.get_top_k(src.commit_workload(workload_mod), 1 << 20):
            db.commit_tuning_record(ms.database.TuningRecord(trace=r.trace, workload=workload, run_secs=r.run_secs,
                                                             target=r.target, args_info=r.args_info))
            cands.append(r.as_measure_candidate())
            results.append(ms.runner.RunnerResult(run_secs=r.run_secs, error_msg=None))
    model = ms.cost_model.XGBModel(num_tuning_cores=1)
    if cands:
        model.update(ctx, cands, results)
    return db, model, len(cands)


def measure(network: str, k: int, rounds: int, variants: list[str], batch: int, seed: int,
            records: Path | None = None) -> dict[str, Any]:
    os.environ.setdefault("SHARETUNE_CUDA_ARCH", "sm_90a")
    from tvm.s_tir import meta_schedule as ms

    from sharetune_tuner.client import ClientConfig, parse_evolution, search_strategy
    from sharetune_tuner.model.intrinsics import ensure_registered
    from sharetune_tuner.model.loader import load
    from sharetune_tuner.model.tasks import extract
    from sharetune_tuner.search.partition import order
    from sharetune_tuner.targets import make_target

    ensure_registered()
    target = make_target("cuda")
    every = extract(load(name=network).mod, target)
    keep = [i.key for i in order([t.info for t in every])[:k]]  # the heaviest, as the partitioner orders them
    tasks = sorted((t for t in every if t.info.key in keep), key=lambda t: keep.index(t.info.key))
    out: dict[str, Any] = {"network": network, "tasks": [t.info.name for t in tasks], "rounds": rounds,
                           "batch": batch, "seed": seed, "target": str(target.attrs.get("arch")), "variants": {}}
    real = _real_records(records) if records is not None else None
    if records is not None:
        out["records"] = records.name
    for v in variants:
        evo = parse_evolution(v)
        # The client's own search for a task's later rounds (client.search_strategy).
        cfg = ClientConfig(job="search-cost", shard=0, shards=1, work_dir=Path("."), tracker_host="", tracker_port=0,
                           tracker_key="", servers=1, total_trials=batch * (rounds + 1),
                           trials_per_task=batch * (rounds + 1), trials_per_iter=batch, evolution=evo)
        population = evo.population(batch)
        per_task = []
        for i, task in enumerate(tasks):
            rng = random.Random(seed * 1000 + i)
            strategy = search_strategy(cfg)
            ctx = ms.TuneContext(task.workload, target=target, space_generator="post-order-apply",
                                 search_strategy=strategy, task_name=task.info.name, rand_state=seed,
                                 num_threads=1)
            if real is None:
                db, model, n_real = ms.database.MemoryDatabase(), ms.cost_model.RandomModel(seed=seed), 0
                scorer = None
            else:
                db, model, n_real = _seeded(real, ctx, task.workload)
                scorer = model
            ctx.pre_tuning(max_trials=batch * (rounds + 1), num_trials_per_iter=batch,
                           design_spaces=ctx.generate_design_space(), database=db, cost_model=model)
            if real is None:
                _round(ctx, db, target, task.workload, rng)  # the first round fills the database
            scores: list[list[float]] = []
            cpu = [_round(ctx, db, target, task.workload, rng, scorer, scores) for _ in range(rounds)]
            ctx.post_tuning()
            per_cand = [c / max(1, n) for c, n in cpu]
            per_task.append({"task": task.info.name, "cpu_s_per_round": [round(c, 3) for c, _ in cpu],
                             "candidates": [n for _, n in cpu],
                             "cpu_s_per_candidate": round(statistics.mean(per_cand), 4)})
            if real is not None:
                flat = [x for r in scores for x in r]
                per_task[-1].update(real_records=n_real, score_mean=round(statistics.mean(flat), 4) if flat else None,
                                    score_best_per_round=[round(max(r), 4) if r else None for r in scores])
            print(f"{v} {task.info.name}: {per_task[-1]['cpu_s_per_round']} s per round", flush=True)
        mean = statistics.mean(t["cpu_s_per_candidate"] for t in per_task)
        out["variants"][str(evo)] = {"population": population, "generations": evo.generations, "per_task": per_task,
                                     "cpu_s_per_candidate": round(mean, 4)}
        if real is not None:
            out["variants"][str(evo)]["score_mean"] = round(statistics.mean(
                t["score_mean"] for t in per_task if t["score_mean"] is not None), 4)
    base = out["variants"].get("8x4", {}).get("cpu_s_per_candidate")
    if base:
        for v in out["variants"].values():
            v["vs_8x4"] = round(v["cpu_s_per_candidate"] / base, 3)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--network", default="mobilenet_v2")
    ap.add_argument("--tasks", type=int, default=4, help="the K heaviest tasks")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per task (after one untimed)")
    ap.add_argument("--variants", default="8x4,8x2,4x4,4x2", help="PxG shapes, comma-separated")
    ap.add_argument("--batch", type=int, default=16, help="candidates per round (the client's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--records", type=Path, default=None, help="an arm's tar (real_budget.py): its measured "
                    "records seed each task's database and train the cost model that scores the candidates")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cpu-search-cost.json")
    a = ap.parse_args()
    r = measure(a.network, a.tasks, a.rounds, a.variants.split(","), a.batch, a.seed, a.records)
    r.update(date=time.strftime("%Y-%m-%d"), cpu=_cpu_model(), command="python bench/search_cost.py " +
             " ".join(sys.argv[1:]))
    a.out.write_text(json.dumps(r, indent=2) + "\n")
    for name, v in r["variants"].items():
        print(f"{name}: population {v['population']}, {v['cpu_s_per_candidate']} CPU s per candidate"
              + (f" ({v['vs_8x4']}x of 8x4)" if "vs_8x4" in v else "")
              + (f", model score {v['score_mean']}" if "score_mean" in v else ""))
    return 0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
