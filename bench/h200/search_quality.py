"""Does a cheaper cold search propose candidates as fast as the evolutionary one?

While a client's cost model is cold (``client.first_round_search``) its search ranks by noise, so
what matters is the *distribution* of the candidates each search proposes. Whole tuning cells give
16 per task per run under MPS and co-tenancy noise, and best-of-16 varied 50-87 us between runs of
one arm (H200 r12-r14): too few samples to tell arms apart. Here the two halves are taken apart:

  propose    each arm's first round for every (task, seed), exactly as a client builds it
             (``client.search_strategy`` + a cold XGB model), candidates saved as JSONDatabase
             records (traces, run_secs null), with the search's wall and CPU seconds. CPU only:
             runs anywhere (the target is the H200's sm_90a unless a GPU says otherwise).
  measure    on the GPU, alone (no MPS, no co-tenants): every candidate built by the product's
             builder (PooledBuilder, hoist-pch NVRTC) and timed by stock LocalRunner with the
             client's evaluator (number 3, repeat 1, min 20 ms); one (seed, task) group at a time,
             the arms' candidates shuffled together so drift hits every arm alike; the first
             candidate of each arm is timed again at the group's end (measurement noise).
             Resumable: groups already in the results file are skipped; ``--budget-s`` bounds a call.
  summarize  per arm against evolutionary: best-of-batch per (seed, task) pair (geometric mean and
             a bootstrap interval over seeds), the expected best-of-batch of the pooled
             distribution, medians, failures, search seconds -> ``h200-search-quality.json``
             (``--target llvm``: ``cpu-search-quality.json``, measured on the machine it runs on).

  python bench/h200/search_quality.py propose --seeds 0-7 --jobs 2
  python bench/h200/search_quality.py measure --budget-s 540
  python bench/h200/search_quality.py summarize
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from common import RESULTS, RUN_ROOT, heaviest, log, parse_cpus

ARMS = ("evolutionary", "lite", "short", "replay")
# The client's measurement (client.run_client): what a trial's latency means in every cell.
EVALUATOR = {"number": 3, "repeat": 1, "min_repeat_ms": 20}


def results_name(target: str) -> str:
    """h200-search-quality (CUDA, the H200) or cpu-search-quality (llvm, the machine it runs on)."""
    return f"{'h200' if target == 'cuda' else 'cpu'}-search-quality"


def _cands_root(a: argparse.Namespace) -> Path:
    return Path(a.cands) if a.cands else RUN_ROOT / "search-quality" / a.model


def _job_dir(root: Path, arm: str, seed: int, task: int) -> Path:
    return root / f"{arm}-s{seed}-t{task}"


# ---- propose (CPU) -----------------------------------------------------------------------------------
_TASKS: list[Any] = []


def _load_tasks(model: str, k: int, kind: str) -> None:
    """Worker initializer: the model's k heaviest tasks, extracted once per process."""
    if kind == "cuda" and not _has_gpu():  # proposing on a CPU machine: the H200's arch, which measures them
        os.environ.setdefault("SHARETUNE_CUDA_ARCH", "sm_90a")
    from sharetune_tuner.model.intrinsics import ensure_registered
    from sharetune_tuner.model.loader import load
    from sharetune_tuner.model.tasks import extract
    from sharetune_tuner.targets import make_target

    ensure_registered()
    _TASKS[:] = heaviest(extract(load(name=model).mod, make_target(kind)), k)


def _has_gpu() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


def _search(arm: str, seed: int, task: int, batch: int, threads: int, out: str) -> dict[str, Any]:
    """One client's first search round of one task with ``arm`` as its cold search."""
    from tvm.s_tir import meta_schedule as ms

    from sharetune_tuner.client import ClientConfig, first_round_search, search_strategy

    t = _TASKS[task]
    d = Path(out)
    cfg = ClientConfig(job="search-quality", shard=0, shards=1, work_dir=d, tracker_host="", tracker_port=0,
                       tracker_key="", servers=1, total_trials=batch, trials_per_task=batch,
                       trials_per_iter=batch, cold_search=arm)
    cost_model = ms.CostModel.create("xgb", num_tuning_cores=threads)  # cold: random scores
    t0, c0 = time.perf_counter(), time.process_time()
    ctxs, _ = ms.relax_integration.extracted_tasks_to_tune_contexts(
        [t.extracted], work_dir=str(d.parent / "logs"),
        strategy=search_strategy(cfg, first_round_search(cfg, cost_model, 0) or "evolutionary"),
        num_threads=threads, seed=seed * 1000 + task)
    ctx = ctxs[0]
    ctx.pre_tuning(max_trials=batch, num_trials_per_iter=batch,
                   design_spaces=ctx.space_generator.generate_design_space(ctx.mod),
                   database=ms.database.MemoryDatabase(), cost_model=cost_model)
    cands = list(ctx.search_strategy.generate_measure_candidates() or [])
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    tmp = d.with_name(d.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    db = ms.database.JSONDatabase(work_dir=str(tmp))
    wl = db.commit_workload(ctx.mod)
    for c in cands:
        db.commit_tuning_record(ms.database.TuningRecord(c.sch.trace, wl, None, ctx.target, c.args_info))
    meta = {"arm": arm, "seed": seed, "task": task, "task_name": t.info.name, "workload_hash": t.info.workload_hash,
            "proposed": len(cands), "search_s": round(wall, 2), "search_cpu_s": round(cpu, 2), "threads": threads}
    (tmp / "meta.json").write_text(json.dumps(meta))
    shutil.rmtree(d, ignore_errors=True)
    tmp.rename(d)  # a job is done iff its directory exists
    return meta


def propose(a: argparse.Namespace) -> int:
    root = _cands_root(a)
    root.mkdir(parents=True, exist_ok=True)
    seeds = parse_cpus(a.seeds)
    # Seed-major order: a cut-short run still has every arm of every task for its first seeds.
    todo = [(arm, s, t) for s in seeds for t in range(a.tasks) for arm in a.arms.split(",")
            if not _job_dir(root, arm, s, t).exists()]
    log(f"propose: {len(todo)} searches to run in {a.jobs} processes -> {root}")
    done = 0
    with ProcessPoolExecutor(max_workers=a.jobs, mp_context=get_context("spawn"), initializer=_load_tasks,
                             initargs=(a.model, a.tasks, a.target)) as pool:
        futs = [pool.submit(_search, arm, s, t, a.batch, a.threads, str(_job_dir(root, arm, s, t)))
                for arm, s, t in todo]
        for f in futs:
            try:
                m = f.result()
                done += 1
                log(f"[{done}/{len(todo)}] {m['arm']} s{m['seed']} {m['task_name']}: {m['proposed']} candidates, "
                    f"search {m['search_s']} s ({m['search_cpu_s']} CPU-s)")
            except Exception:
                log(traceback.format_exc()[-2000:])
    return 0 if done == len(todo) else 1


# ---- measure (GPU) -----------------------------------------------------------------------------------
def _groups(root: Path) -> dict[tuple[int, int], list[tuple[dict[str, Any], Path]]]:
    out: dict[tuple[int, int], list[tuple[dict[str, Any], Path]]] = {}
    for meta_path in sorted(root.glob("*/meta.json")):
        m = json.loads(meta_path.read_text())
        out.setdefault((m["seed"], m["task"]), []).append((m, meta_path.parent))
    return out


def _rows(model: str, target: str) -> list[dict[str, Any]]:
    from common import load_cells

    return [c for c in load_cells(results_name(target) + ".jsonl").values() if c["model"] == model]


def _us(res: Any) -> float | None:
    if res.error_msg is not None or not res.run_secs:
        return None
    secs = [float(x) for x in res.run_secs]
    return round(statistics.mean(secs) * 1e6, 3)


def measure(a: argparse.Namespace) -> int:
    from tvm.s_tir import meta_schedule as ms

    from common import append_cell, gpu_name
    from sharetune_tuner.build.builder import PooledBuilder
    from sharetune_tuner.model.intrinsics import ensure_registered
    from sharetune_tuner.targets import make_target

    t_start = time.monotonic()
    ensure_registered()
    target = make_target(a.target)
    groups = _groups(_cands_root(a))
    done = {(r["seed"], r["task"]) for r in _rows(a.model, a.target)}
    todo = [k for k in sorted(groups) if k not in done]
    log(f"measure: {len(todo)} of {len(groups)} (seed, task) groups left")
    cores = os.cpu_count() or 1
    builder = PooledBuilder(max_workers=cores, timeout_sec=60.0, export_shared_lib=True)
    dev_type = "cuda" if a.target == "cuda" else "cpu"
    runner = ms.runner.LocalRunner(timeout_sec=30, evaluator_config=ms.runner.EvaluatorConfig(**EVALUATOR))
    avg_group_s = 0.0
    try:
        for n, key in enumerate(todo):
            if time.monotonic() - t_start + max(avg_group_s, 20.0) > a.budget_s:
                log(f"budget: {len(todo) - n} groups left for the next call")
                break
            t0 = time.monotonic()
            cands: list[tuple[str, int, Any]] = []
            metas = {}
            for m, d in groups[key]:
                metas[m["arm"]] = m
                db = ms.database.JSONDatabase(work_dir=str(d), allow_missing=False)
                for i, rec in enumerate(db.get_all_tuning_records()):
                    cands.append((m["arm"], i, rec.as_measure_candidate()))
            random.Random(f"{key}").shuffle(cands)
            built = builder.build([ms.builder.BuilderInput(c.sch.mod, target) for _, _, c in cands])
            t_built = time.monotonic()
            ok = [(arm, i, c, b) for (arm, i, c), b in zip(cands, built) if b.error_msg is None]
            # The first candidate of each arm (its index in ok) is timed twice: at its place and again at the end.
            first: dict[str, int] = {}
            for j, (arm, _, _, _) in enumerate(ok):
                first.setdefault(arm, j)
            order = ok + [ok[j] for j in first.values()]
            futs = runner.run([ms.runner.RunnerInput(b.artifact_path, dev_type, c.args_info) for _, _, c, b in order])
            results = [f.result() for f in futs]
            lat = [_us(r) for r in results]
            run_errors = {str(r.error_msg)[-300:] for r in results if r.error_msg is not None}
            row: dict[str, Any] = {"id": f"{a.model}-s{key[0]}-t{key[1]}", "model": a.model, "seed": key[0],
                                   "task": key[1],
                                   "task_name": next(iter(metas.values()))["task_name"], "gpu": gpu_name(),
                                   "build_s": round(t_built - t0, 1), "run_s": round(time.monotonic() - t_built, 1),
                                   "run_errors": sorted(run_errors)[:3], "arms": {}}
            for arm, m in metas.items():
                mine = {i: None for (ar, i, _) in cands if ar == arm}
                for (ar, i, _, _), us in zip(ok, lat[:len(ok)]):
                    if ar == arm:
                        mine[i] = us
                row["arms"][arm] = {"proposed": m["proposed"], "search_s": m["search_s"],
                                    "search_cpu_s": m["search_cpu_s"],
                                    "build_errors": sum(1 for (ar, _, _), b in zip(cands, built)
                                                        if ar == arm and b.error_msg is not None),
                                    "us": [mine[i] for i in sorted(mine)]}
            row["remeasured"] = [[lat[j], us] for j, us in zip(first.values(), lat[len(ok):])]
            append_cell(results_name(a.target) + ".jsonl", row)
            for b in built:
                if b.artifact_path:
                    shutil.rmtree(os.path.dirname(b.artifact_path), ignore_errors=True)
            dt = time.monotonic() - t0
            avg_group_s = dt if not avg_group_s else 0.5 * (avg_group_s + dt)
            valid = {arm: sum(1 for x in v["us"] if x is not None) for arm, v in row["arms"].items()}
            log(f"[{n + 1}/{len(todo)}] s{key[0]} {row['task_name']}: built {row['build_s']} s, "
                f"ran {row['run_s']} s, valid {valid}")
    finally:
        builder.shutdown()
    from common import export_results

    export_results()
    return 0


# ---- summarize (no GPU) ------------------------------------------------------------------------------
def expected_best(xs: list[float], k: int) -> float:
    """E[min of k drawn without replacement from xs]: the best of one k-candidate round if the
    round were a random draw from the arm's pooled candidates."""
    s = sorted(xs)
    n = len(s)
    k = min(k, n)
    # P(the i-th smallest is the minimum) = C(n-1-i, k-1) / C(n, k), built up term by term in
    # floats (the bootstrap calls this ~10^5 times; exact binomials of n ~ 150 are too slow).
    w, total = k / n, 0.0
    for i in range(n - k + 1):
        total += w * s[i]
        if n - 1 - i > 0:
            w *= (n - i - k) / (n - 1 - i)
    return total


_gm = statistics.geometric_mean


def _bootstrap(by_seed: dict[int, list[Any]], stat: Callable[[list[Any]], float], n: int,
               seed: int) -> tuple[float, float]:
    """95% bootstrap interval of ``stat`` over the items of resampled seeds: whole seeds are
    resampled (the tasks of one seed ran in one process, so seeds are the independent unit)."""
    seeds = sorted(by_seed)
    rng = random.Random(seed)
    out = sorted(stat([x for s in (rng.choice(seeds) for _ in seeds) for x in by_seed[s]]) for _ in range(n))
    return out[int(0.025 * n)], out[int(0.975 * n) - 1]


def _expected_ratio(rows: list[dict[str, Any]], arm: str, batch: int) -> float:
    """Geometric mean over tasks of the arm's expected best-of-batch over evolutionary's, both from
    the pooled candidates of ``rows``."""
    ratios = []
    for t in {r["task"] for r in rows}:
        mine = [x for r in rows if r["task"] == t for x in r["arms"][arm]["us"] if x is not None]
        base = [x for r in rows if r["task"] == t for x in r["arms"]["evolutionary"]["us"] if x is not None]
        if mine and base:
            ratios.append(expected_best(mine, batch) / expected_best(base, batch))
    return _gm(ratios)


def summarize(a: argparse.Namespace) -> dict[str, Any]:
    rows = _rows(a.model, a.target)
    if not rows:
        raise SystemExit(f"no rows in {results_name(a.target)}.jsonl: run measure first")
    batch = a.batch
    arms = [x for x in ARMS if all(x in r["arms"] for r in rows)]
    tasks = sorted({(r["task"], r["task_name"]) for r in rows})
    per_task: dict[str, Any] = {}
    rows_by_seed: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        rows_by_seed.setdefault(r["seed"], []).append(r)
    pooled: dict[str, dict[int, list[float]]] = {arm: {} for arm in arms}
    for r in rows:
        for arm in arms:
            pooled[arm].setdefault(r["task"], []).extend(x for x in r["arms"][arm]["us"] if x is not None)
    for t, name in tasks:
        per_task[name] = {arm: {"valid": len(pooled[arm][t]), "median_us": round(statistics.median(pooled[arm][t]), 2),
                                "p10_us": round(sorted(pooled[arm][t])[len(pooled[arm][t]) // 10], 2),
                                "expected_best_of_batch_us": round(expected_best(pooled[arm][t], batch), 2)}
                          for arm in arms if pooled[arm].get(t)}
    out: dict[str, Any] = {"model": a.model, "target": a.target, "rows": len(rows),
                           "seeds": sorted({r["seed"] for r in rows}), "batch": batch,
                           "gpu": rows[0].get("gpu"), "evaluator": EVALUATOR, "per_task": per_task, "arms": {}}
    for arm in arms:
        lost = sum(batch - sum(1 for x in r["arms"][arm]["us"] if x is not None) for r in rows)
        best_pairs: dict[int, list[float]] = {}
        for r in rows:
            mine = [x for x in r["arms"][arm]["us"] if x is not None]
            base = [x for x in r["arms"]["evolutionary"]["us"] if x is not None]
            if mine and base:
                best_pairs.setdefault(r["seed"], []).append(min(mine) / min(base))
        flat = [x for v in best_pairs.values() for x in v]
        lo, hi = _bootstrap(best_pairs, _gm, 4000, 0) if len(best_pairs) > 1 else (None, None)
        exp_ratio = [expected_best(pooled[arm][t], batch) / expected_best(pooled["evolutionary"][t], batch)
                     for t, _ in tasks if pooled[arm].get(t) and pooled["evolutionary"].get(t)]
        med_ratio = [statistics.median(pooled[arm][t]) / statistics.median(pooled["evolutionary"][t])
                     for t, _ in tasks if pooled[arm].get(t) and pooled["evolutionary"].get(t)]
        cpu = [r["arms"][arm]["search_cpu_s"] for r in rows]
        wall = [r["arms"][arm]["search_s"] for r in rows]
        out["arms"][arm] = {
            "rounds": len(rows), "trials_lost": lost,
            "best_of_batch_vs_evolutionary_geomean": round(_gm(flat), 4) if flat else None,
            "best_of_batch_vs_evolutionary_ci95": [round(lo, 4), round(hi, 4)] if lo else None,
            "best_of_batch_vs_evolutionary_worst": round(max(flat), 4) if flat else None,
            "expected_best_vs_evolutionary_geomean": round(_gm(exp_ratio), 4) if exp_ratio else None,
            "expected_best_vs_evolutionary_ci95": [round(x, 4) for x in _bootstrap(
                rows_by_seed, lambda pick: _expected_ratio(pick, arm, batch), 1000, 1)]  # noqa: B023 (used at once)
            if len(best_pairs) > 1 else None,
            "median_vs_evolutionary_geomean": round(_gm(med_ratio), 4) if med_ratio else None,
            "search_cpu_s_median": round(statistics.median(cpu), 2),
            "search_s_median": round(statistics.median(wall), 2),
            "search_cpu_s_vs_evolutionary": round(
                sum(cpu) / sum(r["arms"]["evolutionary"]["search_cpu_s"] for r in rows), 3),
        }
    noise = [abs(b / a_ - 1) for r in rows for a_, b in r.get("remeasured", []) if a_ and b]
    out["remeasure_abs_diff_median"] = round(statistics.median(noise), 4) if noise else None
    (RESULTS / (results_name(a.target) + ".json")).write_text(json.dumps(out, indent=1) + "\n")
    for arm, v in out["arms"].items():
        log(f"{arm}: {v}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("step", choices=("propose", "measure", "summarize"))
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--target", default="cuda", help="cuda (the benchmark); llvm only to smoke-test the steps on a CPU")
    ap.add_argument("--tasks", type=int, default=6, help="the model's k heaviest tasks (the headline cell's 6)")
    ap.add_argument("--batch", type=int, default=16, help="candidates per round (the headline cell's 16)")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--seeds", default="0-7")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 1)))
    ap.add_argument("--threads", type=int, default=1, help="search threads per process")
    ap.add_argument("--cands", default=None, help="candidates directory (default $BENCH_RUN_ROOT/search-quality/MODEL)")
    ap.add_argument("--budget-s", type=float, default=540.0)
    a = ap.parse_args()
    if a.step == "propose":
        return propose(a)
    if a.step == "measure":
        return measure(a)
    summarize(a)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
