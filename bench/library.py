"""The tuning library on the CPU (target llvm, local mode): what a job gains from earlier ones.

Per seed, arms back to back on one machine, each a fresh library:
  first          tiny_cnn 64x64 with an empty library (mode warm: nothing to start from = cold); its
                 merge adds its records
  again          the same job, mode reuse: time to a result, and its latency against first's
  related-cold   tiny_cnn 96x96 (other shapes: other workloads), no library
  related-warm   the same with the library first filled (mode warm: the cost model learns the
                 64x64 records before the first round; no workload in common to seed)
and (``rank``) the cost model's ranking quality on related-cold's records (held out): Spearman's
rank correlation between the XGB model's scores and the measured run times per workload, the
model untrained (cold) vs trained on a library (warm).

    .venv/bin/python bench/library.py run [--seeds 0,1]      # ~15 min on 2 busy cores
    .venv/bin/python bench/library.py rank --total 192       # the rank cell with a larger library (~10 min)
    .venv/bin/python bench/library.py scale --total 480      # (a) at a 10x budget, seeds 0,1 (~35 min)
    .venv/bin/python bench/library.py remeasure --total 480  # (a) both jobs' results timed in one process
    .venv/bin/python bench/library.py related [--model resnet50|resnet34]
                                # (b) a model after ResNet-18, cold vs warm vs reuse (~40 min)
    .venv/bin/python bench/library.py related --library-per-task 48 --arms warm,seeds
                                # (b) after a larger library; warm with and without its pretraining
    .venv/bin/python bench/library.py rounds                 # (c) best latency per round, cold vs warm (~10 min)
    .venv/bin/python bench/library.py summarize              # bench/results/library.json

MetaSchedule's XGB model answers random scores until it holds 100 records (num_warmup_samples),
so a library of fewer records of the job's target and device leaves its cost model cold: ``rank``
fills a library from one larger first job (``--total``) and measures the held-out records of the
related-cold arms of ``run``. Every library arm starts from its own copy of the library it is
given: a job's merge adds its records to its library, so a second seed on the same one would start
from the first seed's records of its own model.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "h200"))
from real_budget import time_to_reach  # noqa: E402  # one definition of "reached a latency" for every bench

RESULTS = ROOT / "bench" / "results"
CELLS = RESULTS / "library-cells.jsonl"
OUT = RESULTS / "library.json"
PLOT = ROOT / "docs" / "library.png"
TRIALS = {"total": 48, "perTask": 12, "perIteration": 4}
SCALE_SHAPE = [1, 3, 64, 64]  # tiny_cnn's input in ``scale`` and ``remeasure``


def reached_at(curve: list[float | None], target: float) -> int | None:
    """The first step (1-based) at which ``curve`` is within real_budget's tolerance of ``target``
    or below it; None if it never gets there (steps without a value are skipped)."""
    t = time_to_reach([(float(k), v) for k, v in enumerate(curve, start=1) if v], target)
    return int(t) if t is not None else None


def load_cells() -> list[dict[str, Any]]:
    return [json.loads(line) for line in CELLS.read_text().splitlines() if line.strip()]


def append_cell(cell: dict[str, Any]) -> None:
    with CELLS.open("a") as f:
        f.write(json.dumps(cell) + "\n")


def job(name: str, shape: list[int], seed: int, library: dict[str, Any] | None,
        model: str = "tiny_cnn") -> dict[str, Any]:
    spec: dict[str, Any] = {"model": {"name": model, "inputShape": shape}, "target": "llvm",
                            "trials": dict(TRIALS), "servers": {"replicas": 2}, "clients": {"shards": 2},
                            "costModel": "xgb", "seed": seed}
    if library is not None:
        spec["library"] = library
    return {"apiVersion": "sharetune.io/v1alpha1", "kind": "TuningJob", "metadata": {"name": name}, "spec": spec}


def run_one(doc: dict[str, Any], workdir: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """One local run (``env``: variables the job's processes get besides this one's); its summary
    with the wall time from start to result."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = workdir / "summary.json"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "sharetune.cli", "run", str(path), "--local", "--workdir",
                        str(workdir / "run"), "--json", str(out)], capture_output=True, text=True,
                       env={**os.environ, **(env or {})})
    if r.returncode != 0:
        raise SystemExit(f"{doc['metadata']['name']} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    s = json.loads(out.read_text())
    s["wall_s"] = round(time.monotonic() - t0, 1)
    return s


def _cell(arm: str, seed: int, s: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"arm": arm, "seed": seed, "wall_s": s["wall_s"], "tuning_s": s.get("tuning_s"), "records": s["records"],
            "latency_untuned_ms": s["latency_untuned_ms"], "latency_tuned_ms": s["latency_tuned_ms"],
            "speedup": s["speedup"], "tasks_from_library": s.get("tasks_from_library", []),
            "library_records_added": s.get("library_records_added"),
            "date": time.strftime("%Y-%m-%d"), "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            **extra}


def run(seeds: list[int]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="sharetune-library-"))
    RESULTS.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        lib = tmp / f"lib-s{seed}"
        small, large = [1, 3, 64, 64], [1, 3, 96, 96]
        arms = [("first", small, {"path": str(lib), "mode": "warm"}),
                ("again", small, {"path": str(lib), "mode": "reuse"}),
                ("related-cold", large, None),
                ("related-warm", large, {"path": str(lib), "mode": "warm"})]
        for arm, shape, library in arms:
            s = run_one(job(f"lib-{arm}-s{seed}", shape, seed, library), tmp / f"{arm}-s{seed}")
            cell = _cell(arm, seed, s, run_dir=str(tmp / f"{arm}-s{seed}" / "run"), library=str(lib))
            append_cell(cell)
            print(json.dumps({k: cell[k] for k in ("arm", "seed", "wall_s", "latency_tuned_ms", "records")}),
                  flush=True)


def _spearman(a: list[float], b: list[float]) -> float | None:
    import numpy as np

    if len(a) < 3:
        return None
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    c = np.corrcoef(ra, rb)[0, 1]
    return None if math.isnan(c) else float(c)


def rank_quality(lib: Path, held_out: Path, seed: int) -> dict[str, Any]:
    """Spearman's rho between the cost model's scores and minus the measured time, per workload of
    ``held_out`` (a JSONDatabase directory), for an untrained and a library-trained XGB model."""
    import numpy as np
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms

    from sharetune.gpus import cpu_model
    from sharetune_tuner.search import warm_start
    from sharetune_tuner.store.library import Where
    from sharetune_tuner.targets import make_target

    target = make_target("llvm")
    use = warm_start.LibraryUse(str(lib), "local", "warm", Where(cpu_model(), 100))
    found = warm_start.lookup(use, target)
    np.random.seed(seed)
    cold, warm = ms.CostModel.create("xgb", num_tuning_cores=1), ms.CostModel.create("xgb", num_tuning_cores=1)
    learnt = warm_start.pretrain(warm, target, found)
    db = ms.database.JSONDatabase(work_dir=str(held_out))
    import tvm_ffi

    by_wl: dict[int, list[Any]] = {}
    for rec in db.get_all_tuning_records():
        if rec.run_secs and float(rec.run_secs[0]) < 1e9:
            by_wl.setdefault(int(tvm_ffi.structural_hash(rec.workload.mod)), []).append(rec)
    out: dict[str, list[float]] = {"cold": [], "warm": []}
    for recs in by_wl.values():
        mod = recs[0].workload.mod
        ctx = ms.TuneContext(mod=mod, target=target, task_name="held-out")
        cands = []
        for r in recs:
            sch = Schedule(mod, error_render_level="none")
            r.trace.apply_to_schedule(sch, remove_postproc=False)
            cands.append(ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)))
        minus_secs = [-float(np.mean([float(s) for s in r.run_secs])) for r in recs]
        for name, model in (("cold", cold), ("warm", warm)):
            rho = _spearman(list(model.predict(ctx, cands)), minus_secs)
            if rho is not None:
                out[name].append(rho)
    return {"library_records_learnt": learnt, "workloads": len(out["warm"]),
            "rho_cold": [round(x, 3) for x in out["cold"]], "rho_warm": [round(x, 3) for x in out["warm"]],
            "rho_cold_mean": round(float(np.mean(out["cold"])), 3) if out["cold"] else None,
            "rho_warm_mean": round(float(np.mean(out["warm"])), 3) if out["warm"] else None}


def _geo(xs: list[float]) -> float:
    return round(math.exp(sum(math.log(x) for x in xs) / len(xs)), 4)


def summarize() -> dict[str, Any]:
    cells = load_cells()
    by = {(c["arm"], c["seed"]): c for c in cells}  # the latest cell of each (arm, seed)
    seeds = sorted({c["seed"] for c in cells if (("first", c["seed"]) in by and ("again", c["seed"]) in by)})
    per_seed = []
    for s in seeds:
        f, a = by[("first", s)], by[("again", s)]
        rc, rw, rank = by.get(("related-cold", s)), by.get(("related-warm", s)), by.get(("rank", s))
        row: dict[str, Any] = {
            "seed": s, "first_wall_s": f["wall_s"], "again_wall_s": a["wall_s"],
            "again_wall_fraction": round(a["wall_s"] / f["wall_s"], 4),
            "again_latency_ratio": round(a["latency_tuned_ms"] / f["latency_tuned_ms"], 4),
            # against each run's own untuned model, measured in the same merge (a busy machine's
            # drift between the runs cancels): <= 1.0 means the second job's result is as fast
            "again_relative_latency_ratio": round(f["speedup"] / a["speedup"], 4),
            "again_trials": a["records"], "again_tasks_from_library": a["tasks_from_library"]}
        if rc and rw:
            row.update(related_cold_ms=rc["latency_tuned_ms"], related_warm_ms=rw["latency_tuned_ms"],
                       related_latency_ratio=round(rw["latency_tuned_ms"] / rc["latency_tuned_ms"], 4),
                       related_relative_latency_ratio=round(rc["speedup"] / rw["speedup"], 4))
        if rank:
            row.update(rho_cold_mean=rank["rho_cold_mean"], rho_warm_mean=rank["rho_warm_mean"],
                       rank_workloads=rank["workloads"], library_records_learnt=rank["library_records_learnt"],
                       rank_library_trials=rank.get("library_trials"))
        per_seed.append(row)
    fr = [r["again_wall_fraction"] for r in per_seed]
    rel = [r["related_relative_latency_ratio"] for r in per_seed if "related_latency_ratio" in r]
    lr = [r["again_relative_latency_ratio"] for r in per_seed]
    result = {
        "how_measured": {"model": "tiny_cnn", "target": "llvm", "trials": TRIALS, "clients": 2, "servers": 2,
                         "command": "python bench/library.py run --seeds 0,1 && python bench/library.py summarize",
                         "machine": next((c["machine"] for c in reversed(cells) if c.get("machine")), None),
                         "date": max((c.get("date", "") for c in cells), default=None)},
        "per_seed": per_seed,
        "again_wall_fraction": {"geomean": _geo(fr), "worst": max(fr), "goal": "<= 0.05"} if fr else None,
        # latency ratios against each run's own untuned model (see per_seed)
        "again_relative_latency_ratio": {"geomean": _geo(lr), "worst": max(lr)} if lr else None,
        "related_warm_vs_cold_relative_latency": {"geomean": _geo(rel), "worst": max(rel)} if rel else None,
    }
    result.update({**_scale_summary(by), **_rounds_summary(by), **_related_summary(by)})
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    plot(per_seed, result.get("related_model"))
    return result


def _scale_summary(by: dict[tuple[str, int], dict[str, Any]]) -> dict[str, Any]:
    """(a) per first-job budget (``scale``): the second job's wall time over the first's."""
    out: dict[str, Any] = {}
    for total in sorted({c["total"] for c in by.values() if "total" in c}):
        rows = []
        for seed in sorted({s for (arm, s) in by if arm == f"first-t{total}"}):
            f, a = by.get((f"first-t{total}", seed)), by.get((f"again-t{total}", seed))
            if f and a:
                rows.append({"seed": seed, "first_wall_s": f["wall_s"], "again_wall_s": a["wall_s"],
                             "again_trials": a["records"], "again_tasks_from_library": a["tasks_from_library"],
                             "again_wall_fraction": round(a["wall_s"] / f["wall_s"], 4),
                             "again_relative_latency_ratio": round(f["speedup"] / a["speedup"], 4)})
                m = by.get((f"remeasure-t{total}", seed))
                if m:
                    rows[-1].update({k: m[k] for k in ("same_schedules", "one_process_again_over_first")})
        if rows:
            fr = [r["again_wall_fraction"] for r in rows]
            lr = [r["again_relative_latency_ratio"] for r in rows]
            out[str(total)] = {"per_seed": rows, "again_wall_fraction": {"geomean": _geo(fr), "worst": max(fr),
                                                                         "goal": "<= 0.05"},
                               "again_relative_latency_ratio": {"geomean": _geo(lr), "worst": max(lr)}}
            one = [r["one_process_again_over_first"] for r in rows if "one_process_again_over_first" in r]
            if one:  # both results timed in one process: what the merges' separate timings could not settle
                out[str(total)]["one_process_again_over_first"] = {"geomean": _geo(one), "worst": max(one),
                                                                   "seeds": len(one)}
    return {"again_at_larger_budgets": out} if out else {}


def _rounds_summary(by: dict[tuple[str, int], dict[str, Any]]) -> dict[str, Any]:
    """(c) per round k, warm over cold of each task's best latency after its k-th round (tasks
    both arms tuned), geometric mean over tasks and seeds with the worst beside it."""
    ratios: dict[int, list[float]] = {}
    speedups: list[float] = []  # per task: rounds cold needed for its final best / rounds warm needed
    never = 0
    seeds = sorted({s for (arm, s) in by if arm == "rounds-warm" and ("rounds-cold", s) in by})
    for seed in seeds:
        cold, warm = by[("rounds-cold", seed)]["round_bests"], by[("rounds-warm", seed)]["round_bests"]
        for wl in set(cold) & set(warm):
            for k, (c, w) in enumerate(zip(cold[wl], warm[wl]), start=1):
                if c and w:
                    ratios.setdefault(k, []).append(w / c)
            final = cold[wl][-1]
            if not final:
                continue
            reach, got = reached_at(cold[wl], final), reached_at(warm[wl], final)
            if got and reach:
                speedups.append(reach / got)
            else:
                never += 1
    if not ratios:
        return {}
    return {"rounds_warm_over_cold_best_latency": {
        "seeds": seeds, "what": "per task, best latency after its k-th round, warm arm / cold arm (< 1: warm ahead)",
        **{f"round_{k}": {"geomean": _geo(v), "worst": round(max(v), 4), "tasks": len(v)}
           for k, v in sorted(ratios.items())},
        "rounds_to_cold_final": {
            "what": "per task, rounds the cold arm needed to reach its final best (within 2%) / rounds the warm "
                    "arm needed to reach it (> 1: warm sooner); tasks warm never reached it counted apart",
            "geomean": _geo(speedups) if speedups else None, "worst": min(speedups) if speedups else None,
            "tasks": len(speedups), "warm_never_reached": never, "goal": ">= 3.0"}}}


def plot(per_seed: list[dict[str, Any]], related: dict[str, Any] | None = None) -> None:
    """docs/library.png: per seed, the first job's and the second's wall time, the cost model's
    rank correlation cold vs warm, and (b)'s estimated model latency warm over cold over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(13, 3.4))
    for mode, style in (("warm", "--"), ("reuse", "-")):
        for r in (related or {}).get("resnet50", {}).get(mode, {}).get("per_seed", []):
            ys = r["estimate_warm_over_cold"]
            c.plot([(k + 1) / len(ys) for k in range(len(ys))], ys, style, marker=".",
                   label=f"{mode}, seed {r['seed']}")
    c.axhline(1, color="black", linewidth=0.5)
    c.set_xlabel("fraction of each arm's trials")
    c.set_ylabel("ResNet-50 latency, library / cold")
    c.set_title("after a ResNet-18 job (est.)", fontsize=9)
    if related:
        c.legend(fontsize=8)
    seeds = [r["seed"] for r in per_seed]
    x = range(len(seeds))
    a.bar([i - 0.2 for i in x], [r["first_wall_s"] for r in per_seed], 0.4, label="first job (empty library)")
    a.bar([i + 0.2 for i in x], [r["again_wall_s"] for r in per_seed], 0.4, label="same job again (reuse)")
    a.set_xticks(list(x), [f"seed {s}" for s in seeds])
    a.set_ylabel("wall time to result (s)")
    a.legend(fontsize=8)
    ranked = [r for r in per_seed if r.get("rho_cold_mean") is not None]
    b.bar([i - 0.2 for i in range(len(ranked))], [r["rho_cold_mean"] for r in ranked], 0.4, label="cold model")
    b.bar([i + 0.2 for i in range(len(ranked))], [r["rho_warm_mean"] for r in ranked], 0.4,
          label="trained on the library")
    b.axhline(0, color="black", linewidth=0.5)
    b.set_xticks(list(range(len(ranked))), [f"seed {r['seed']}" for r in ranked])
    b.set_ylabel("Spearman rho, held-out records")
    b.legend(fontsize=8)
    fig.suptitle("Tuning library on the CPU (llvm): tiny_cnn (left, middle), ResNet-50 after ResNet-18 (right)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(PLOT, dpi=110)


def rank_cell(total: int) -> None:
    """A library filled by one first job of ``total`` trials (seed 0), then the rank quality on
    each related-cold arm's records that ``run`` left."""
    cells = load_cells()
    held = {c["seed"]: Path(c["run_dir"]) / "result" / "records" for c in cells if c["arm"] == "related-cold"}
    tmp = Path(tempfile.mkdtemp(prefix="sharetune-library-rank-"))
    lib = tmp / "lib"
    doc = job("lib-rank-first", [1, 3, 64, 64], 0, {"path": str(lib), "mode": "warm"})
    doc["spec"]["trials"] = {"total": total, "perTask": total // 4, "perIteration": 4}
    s = run_one(doc, tmp / "first")
    append_cell({"arm": "rank-library", "seed": 0, "library": str(lib), "library_trials": total})
    for seed, records in sorted(held.items()):
        if not records.is_dir():
            continue
        rank = rank_quality(lib, records, seed)
        append_cell({"arm": "rank", "seed": seed, "library_trials": total, "library_job_wall_s": s["wall_s"],
                     **rank})
        print(json.dumps(rank), flush=True)


def scale_cells(total: int, seeds: list[int]) -> None:
    """(a) at a larger budget: the first job ``total`` trials (a quarter per task: the 3 convs and
    the mean get them), then the same job again with ``reuse``; the second job's fixed cost (start-up,
    the merge's re-measurement) against a first job long enough to be worth remembering."""
    tmp = Path(tempfile.mkdtemp(prefix="sharetune-library-scale-"))
    for seed in seeds:
        lib = tmp / f"lib-s{seed}"
        for arm, mode in (("first", "warm"), ("again", "reuse")):
            doc = job(f"lib-{arm}-t{total}-s{seed}", SCALE_SHAPE, seed, {"path": str(lib), "mode": mode})
            doc["spec"]["trials"] = {"total": total, "perTask": total // 4, "perIteration": 8}
            s = run_one(doc, tmp / f"{arm}-t{total}-s{seed}")
            cell = _cell(f"{arm}-t{total}", seed, s, run_dir=str(tmp / f"{arm}-t{total}-s{seed}" / "run"), total=total)
            append_cell(cell)
            print(json.dumps({k: cell[k] for k in ("arm", "seed", "wall_s", "latency_tuned_ms", "records")}),
                  flush=True)
    remeasure_cells(total)


def delivered_traces(run_dir: Path) -> dict[str, str]:
    """Per workload hash, the schedule trace a run's merge delivered (``result/best``)."""
    from sharetune_tuner.store import records

    best = run_dir / "result" / "best"
    workloads, lines = records.read_lines(best / records.WORKLOADS), records.read_lines(best / records.RECORDS)
    return {m.workload: json.dumps(m.body[0], sort_keys=True) for m in records.measured(workloads, lines)}


def side_by_side(first_run: Path, again_run: Path, shape: list[int], rounds: int = 10,
                 model_name: str = "tiny_cnn") -> dict[str, Any]:
    """The two runs' delivered models compiled and timed in one process, taking turns (the
    merge's ``compare``): whether the second job delivered the same schedules, and its latency
    over the first's without the drift of a busy machine between two merges."""
    from sharetune.api.spec import ModelSpec
    from sharetune_tuner import merge
    from sharetune_tuner.model.loader import load_for_spec
    from sharetune_tuner.targets import device_for, make_target

    model = load_for_spec(ModelSpec(name=model_name, input_shape=tuple(shape)))
    target, dev = make_target("llvm"), device_for("llvm")
    x = model.sample_input(seed=0)
    timers = [merge.model_timer(merge.compile_with(run / "result" / "best", model, target), model, x, dev)
              for run in (first_run, again_run)]
    first_s, again_s = merge.compare(timers, rounds=rounds)
    return {"same_schedules": delivered_traces(first_run) == delivered_traces(again_run),
            "one_process_first_ms": round(first_s * 1e3, 4), "one_process_again_ms": round(again_s * 1e3, 4),
            "one_process_again_over_first": round(again_s / first_s, 4)}


def remeasure_cells(total: int) -> None:
    """``side_by_side`` for each (first, again) pair of ``scale --total`` whose runs are still here."""
    cells = load_cells()
    by = {(c["arm"], c["seed"]): c for c in cells}
    for (arm, seed), again in sorted(by.items()):
        first = by.get((f"first-t{total}", seed))
        if arm != f"again-t{total}" or first is None:
            continue
        runs = Path(first["run_dir"]), Path(again["run_dir"])
        if not all((r / "result" / "best").is_dir() for r in runs):
            print(f"seed {seed}: runs no longer here, skipped", flush=True)
            continue
        cell = {"arm": f"remeasure-t{total}", "seed": seed, "total": total, "date": time.strftime("%Y-%m-%d"),
                **side_by_side(*runs, SCALE_SHAPE)}
        append_cell(cell)
        print(json.dumps(cell), flush=True)


def progress_bests(run_dir: Path, steps: int = 20) -> dict[str, list[float | None]]:
    """Per workload, the fastest run time measured once each shard had measured k/``steps`` of its
    records (k = 1..steps): the shards measure at a steady rate side by side, so a fraction of
    their records is a fraction of the tuning time."""
    from sharetune_tuner.store import records

    out: dict[str, list[float | None]] = {}
    for shard in sorted((run_dir / "shards").glob("shard-*")):
        workloads = records.read_lines(shard / records.WORKLOADS)
        lines = records.read_lines(shard / records.RECORDS)
        best: dict[str, float] = {}
        done = 0
        for k in range(1, steps + 1):
            cut = math.ceil(len(lines) * k / steps)
            for m in records.measured(workloads, lines[done:cut]):
                best[m.workload] = min(best.get(m.workload, math.inf), m.secs)
            done = cut
            for wl in {str(w[0]) for w in workloads}:
                out.setdefault(wl, []).append(best.get(wl))
    return out


# The library's job, then the related models tuned after it: model -> (total trials, perTask).
RELATED_FIRST = ("resnet18", 368, 16)
RELATED_FIRST_TASKS = RELATED_FIRST[1] // RELATED_FIRST[2]  # the total is perTask x ResNet-18's tasks
RELATED = {"resnet50": (272, 16),  # 5 of its 34 workloads are ResNet-18's
           "resnet34": (368, 16)}  # all 23 of its workloads are ResNet-18's (more blocks of each)
RELATED_SHAPE = [1, 3, 64, 64]


# The arms of ``related`` besides cold: the job's library mode, and the variables its processes get.
# "seeds" is warm with the cost model left cold: what the library's schedules alone are worth.
RELATED_ARMS: dict[str, tuple[str, dict[str, str]]] = {
    "warm": ("warm", {}), "reuse": ("reuse", {}), "seeds": ("warm", {"SHARETUNE_LIBRARY_PRETRAIN": "off"})}


def _rel(second: str, what: str) -> str:
    return f"rel-{second}-{what}"


def related_variant(second: str, library_per_task: int) -> str:
    """The cells' name for ``second`` after a library of ``library_per_task`` trials per
    ResNet-18 task: the model's own name at the default library size."""
    return second if library_per_task == RELATED_FIRST[2] else f"{second}-lib{library_per_task}"


def related_cells(seeds: list[int], second: str, library_per_task: int = RELATED_FIRST[2],
                  arms: tuple[str, ...] = ("warm", "reuse")) -> None:
    """(b) a related model with workloads in common: one ResNet-18 job fills the library
    (``library_per_task`` trials per task), then ``second`` is tuned cold and with each of ``arms``
    (RELATED_ARMS), each library arm from its own copy of the library, per seed; each arm's per-task
    best over its tuning time and the results timed in one process against the cold one."""
    tmp = Path(tempfile.mkdtemp(prefix="sharetune-library-related-"))
    lib = tmp / "lib"
    variant = related_variant(second, library_per_task)
    name, _, _ = RELATED_FIRST
    doc = job("lib-related-first", RELATED_SHAPE, 0, {"path": str(lib), "mode": "warm"}, model=name)
    doc["spec"]["trials"] = {"total": library_per_task * RELATED_FIRST_TASKS, "perTask": library_per_task,
                             "perIteration": 4}
    s = run_one(doc, tmp / "first")
    tuned = json.loads((tmp / "first" / "run" / "result" / "summary.json").read_text())["tasks"]
    append_cell(_cell(_rel(variant, "library"), 0, s, model=name, library=str(lib), library_per_task=library_per_task,
                      workloads=[t["workload_hash"] for t in tuned if t["trials"]]))
    name = second
    total, per_task = RELATED[second]
    offered = library_bests(lib)  # each library arm tunes on its own copy: the original stays as filled
    for seed in seeds:
        runs = {}
        for what in ("cold", *arms):
            arm = _rel(variant, what)
            mode, env = RELATED_ARMS[what] if what != "cold" else (None, {})
            library = {"path": library_copy(lib, tmp / f"lib-{arm}-s{seed}"), "mode": mode} if mode else None
            doc = job(f"lib-{arm}-s{seed}", RELATED_SHAPE, seed, library, model=name)
            doc["spec"]["trials"] = {"total": total, "perTask": per_task, "perIteration": 4}
            s = run_one(doc, tmp / f"{arm}-s{seed}", env)
            runs[arm] = tmp / f"{arm}-s{seed}" / "run"
            summary = json.loads((runs[arm] / "result" / "summary.json").read_text())
            cell = _cell(arm, seed, s, model=name, run_dir=str(runs[arm]), progress_bests=progress_bests(runs[arm]),
                         tasks={t["workload_hash"]: {"weight": t["weight"], "default_us": t["default_us"]}
                                for t in summary["tasks"]},
                         library_bests=offered if mode else {})
            append_cell(cell)
            print(json.dumps({k: cell[k] for k in ("arm", "seed", "wall_s", "latency_tuned_ms", "records")}),
                  flush=True)
        for arm in (_rel(variant, what) for what in arms):
            both = side_by_side(runs[_rel(variant, "cold")], runs[arm], RELATED_SHAPE, model_name=name)
            cell = {"arm": f"{arm}-remeasure", "seed": seed, "date": time.strftime("%Y-%m-%d"),
                    "cold_ms": both["one_process_first_ms"], "warm_ms": both["one_process_again_ms"],
                    "warm_over_cold": both["one_process_again_over_first"]}
            append_cell(cell)
            print(json.dumps(cell), flush=True)


def _estimate(bests: dict[str, list[float | None]], tasks: dict[str, dict[str, Any]], k: int) -> float | None:
    """The model's latency after step k as MetaSchedule's task scheduler estimates it: each task's
    weight x its best so far (TVM's default, as the cold arm's merge measured it, before a record);
    None while a tuned task has neither."""
    total = 0.0
    for wl, t in tasks.items():
        b = bests.get(wl, [None] * (k + 1))[k]
        secs = b if b is not None else (t["default_us"] * 1e-6 if t.get("default_us") else None)
        if secs is None:
            if wl in bests:
                return None
            continue  # a task nobody tuned (budget 0): the same default in both arms, left out
        total += t["weight"] * secs
    return total


def _with_library(cell: dict[str, Any], steps: int) -> dict[str, list[float | None]]:
    """The arm's per-task bests per step as its merge would deliver them: the library's best of a
    workload (re-measured by the merge) where the arm had measured nothing faster, from step 0 (a
    reused task measures nothing at all)."""
    bests = {wl: list(v) for wl, v in cell["progress_bests"].items()}
    for wl, secs in cell.get("library_bests", {}).items():
        own = bests.get(wl, [None] * steps)
        bests[wl] = [secs if b is None else min(b, secs) for b in own]
    return bests


def _related_rows(by: dict[tuple[str, int], dict[str, Any]], second: str, mode: str) -> list[dict[str, Any]]:
    """(b) per seed: the estimated model latency over the cold and the ``mode`` arm's tuning time,
    the time the cold arm needed to reach its final estimate (within 2%) over the time the library
    arm needed to reach it, and the two results' latency timed in one process."""
    rows = []
    shared = set(by.get((_rel(second, "library"), 0), {}).get("workloads", []))
    for seed in sorted(s for (arm, s) in by if arm == _rel(second, mode) and (_rel(second, "cold"), s) in by):
        cold, warm = by[(_rel(second, "cold"), seed)], by[(_rel(second, mode), seed)]
        tasks = cold["tasks"]
        steps = len(next(iter(cold["progress_bests"].values())))
        curves = {name: [_estimate(bests, tasks, k) for k in range(steps)]
                  for name, bests in (("cold", cold["progress_bests"]), ("warm", _with_library(warm, steps)))}
        final = curves["cold"][-1]
        if final is None:
            continue

        rc, rw = reached_at(curves["cold"], final), reached_at(curves["warm"], final)
        # in seconds: the warm arm's shards also train on the library's records, so its steps are
        # longer; an arm that tuned nothing (every task reused) delivers at the end of its tuning phase
        sc = rc * cold["tuning_s"] / steps if rc else None
        sw = (rw * warm["tuning_s"] / steps if warm["records"] else warm["tuning_s"]) if rw else None
        m = by.get((_rel(second, f"{mode}-remeasure"), seed), {})
        finals = {wl: t["weight"] * b[-1] for wl, t in tasks.items()
                  if (b := cold["progress_bests"].get(wl)) and b[-1] is not None}
        rows.append({
            "seed": seed, "steps": steps, "cold_tuning_s": cold["tuning_s"], "warm_tuning_s": warm["tuning_s"],
            "cold_wall_s": cold["wall_s"], "warm_wall_s": warm["wall_s"], "warm_records": warm["records"],
            "tasks_from_library": len(warm.get("tasks_from_library", [])),
            "cold_reached_at_step": rc, "warm_reached_at_step": rw,
            "cold_reached_s": round(sc, 1) if sc else None, "warm_reached_s": round(sw, 1) if sw else None,
            "time_to_cold_final_ratio": round(sc / sw, 4) if sc and sw else None,
            # a job's result exists once its merge is done: whole jobs, start to result
            "wall_to_result_ratio": round(cold["wall_s"] / warm["wall_s"], 4),
            "shared_workloads": len(shared & set(finals)), "workloads": len(finals),
            "shared_share_of_cold_final": round(sum(v for wl, v in finals.items() if wl in shared)
                                                / sum(finals.values()), 4) if shared and finals else None,
            "estimate_warm_over_cold": [round(w / c, 4) if w and c else None
                                        for w, c in zip(curves["warm"], curves["cold"])],
            "final_warm_over_cold_one_process": m.get("warm_over_cold"),
            "final_warm_over_cold_relative": round(cold["speedup"] / warm["speedup"], 4)})
    return rows


def _related_summary(by: dict[tuple[str, int], dict[str, Any]]) -> dict[str, Any]:
    """(b) per related model and library mode: the rows of :func:`_related_rows`, their geometric
    means and worst runs."""
    out: dict[str, Any] = {}
    variants = sorted({arm[len("rel-"):-len("-library")] for arm, _ in by
                       if arm.startswith("rel-") and arm.endswith("-library")})
    for second in variants:
        for mode in RELATED_ARMS:
            per_seed = _related_rows(by, second, mode)
            if not per_seed:
                continue
            ttq = [r["time_to_cold_final_ratio"] for r in per_seed if r["time_to_cold_final_ratio"]]
            fin = [r["final_warm_over_cold_one_process"] for r in per_seed if r["final_warm_over_cold_one_process"]]
            wall = [r["wall_to_result_ratio"] for r in per_seed]
            out.setdefault(second, {"library_per_task": by[(_rel(second, "library"), 0)].get(
                "library_per_task", RELATED_FIRST[2])})[mode] = {
                "per_seed": per_seed,
                "wall_to_result_ratio": {"geomean": _geo(wall), "worst": min(wall)},
                "time_to_cold_final_ratio": {"geomean": _geo(ttq), "worst": min(ttq), "goal": ">= 3.0"}
                if ttq else None,
                "final_warm_over_cold_one_process": {"geomean": _geo(fin), "worst": max(fin), "goal": "<= 1.0"}
                if fin else None}
    if not out:
        return {}
    return {"related_model": {
        "what": "a model tuned cold vs with a library one ResNet-18 (64x64) job filled, each library arm from "
                "its own copy of it (mode warm: library schedules seed each task's first round, its own "
                "workload's or, where the library has too few, other workloads' transferred, and train the "
                "cost model; "
                "reuse: also tasks the library holds perTask trials of are not tuned; seeds: warm with the cost "
                "model left untrained, SHARETUNE_LIBRARY_PRETRAIN=off); a model named <model>-lib<N>: after a "
                "library of N trials per ResNet-18 task (library_per_task), -planned-order: measured while "
                "the shards' tasks took their turns heaviest first whether the library held them or not "
                "(now the tasks it lacks go first); time in steps of 1/20 "
                "of each arm's records (the shards measure at a steady rate), in seconds the step times the "
                "arm's tuning time (an arm that tuned nothing: its whole tuning phase); the model's latency "
                "estimated per step as sum(weight x task best), a library arm's best including the "
                "library's (its merge offers it); time_to_cold_final_ratio in seconds; wall_to_result_ratio: the cold "
                "job's wall time from start to result over the library job's (where the library arm tunes little, "
                "the step estimate says little: its records come after its start-up)",
        "first": RELATED_FIRST, "models": RELATED, "shape": RELATED_SHAPE, **out}}


def round_bests(run_dir: Path, per_round: int) -> dict[str, list[float | None]]:
    """Per workload, the fastest run time measured after each of its rounds (its records in the
    order the shard measured them, ``per_round`` a round)."""
    from sharetune_tuner.store import records

    out: dict[str, list[float | None]] = {}
    for shard in sorted((run_dir / "shards").glob("shard-*")):
        workloads = records.read_lines(shard / records.WORKLOADS)
        seen: dict[str, list[float]] = {}
        for idx, body in records.read_lines(shard / records.RECORDS):
            secs = records.mean_secs(body[1])
            seen.setdefault(str(workloads[idx][0]), []).append(secs if secs is not None else math.inf)
        for wl, times in seen.items():
            best, curve = math.inf, []
            for k in range(0, len(times), per_round):
                best = min(best, *times[k:k + per_round])
                curve.append(best if math.isfinite(best) else None)  # None: nothing ran yet
            out[wl] = curve
    return out


def library_copy(lib: Path | str, dest: Path) -> str:
    """A copy of ``lib`` for one warm arm: each job's merge adds its records to the library it used,
    so a second seed's warm arm on the same library would start from the first seed's records of
    the very model it tunes."""
    shutil.copytree(lib, dest)
    return str(dest)


def library_bests(lib: Path | str) -> dict[str, float]:
    """The fastest run time per workload the library holds (any key: one machine filled it), as the
    merge of a warm or reuse job offers it."""
    from sharetune_tuner.store.library import entries, open_library

    out: dict[str, float] = {}
    for e in entries(open_library(str(lib)), "local")[0]:
        out[e.key.workload] = min(out.get(e.key.workload, math.inf), e.secs)
    return out


def rounds_cells(seeds: list[int]) -> None:
    """(c) the related model (tiny_cnn 96x96) tuned cold and warm, warm from the library the rank
    cell filled (192 records of tiny_cnn 64x64: past XGB's 100-record warm-up); per task the best
    latency after each round, warm over cold."""
    cells = load_cells()
    libs = [c for c in cells if c["arm"] == "rank-library"]
    if not libs or not Path(libs[-1]["library"]).is_dir():
        raise SystemExit("no rank library here: run `bench/library.py rank` first")
    lib = libs[-1]["library"]
    tmp = Path(tempfile.mkdtemp(prefix="sharetune-library-rounds-"))
    for seed in seeds:
        for arm, mode in (("rounds-cold", None), ("rounds-warm", "warm")):
            library = {"mode": mode, "path": library_copy(lib, tmp / f"lib-{arm}-s{seed}")} if mode else None
            s = run_one(job(f"lib-{arm}-s{seed}", [1, 3, 96, 96], seed, library), tmp / f"{arm}-s{seed}")
            bests = round_bests(tmp / f"{arm}-s{seed}" / "run", TRIALS["perIteration"])
            cell = _cell(arm, seed, s, run_dir=str(tmp / f"{arm}-s{seed}" / "run"), round_bests=bests)
            append_cell(cell)
            print(json.dumps({k: cell[k] for k in ("arm", "seed", "wall_s", "latency_tuned_ms")}), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--seeds", default="0,1")
    k = sub.add_parser("rank")
    k.add_argument("--total", type=int, default=192)
    sc = sub.add_parser("scale")
    sc.add_argument("--total", type=int, default=480)
    sc.add_argument("--seeds", default="0,1")
    rm = sub.add_parser("remeasure")
    rm.add_argument("--total", type=int, default=480)
    rl = sub.add_parser("related")
    rl.add_argument("--seeds", default="0,1")
    rl.add_argument("--model", choices=sorted(RELATED), default="resnet50", help="the model tuned after ResNet-18")
    rl.add_argument("--library-per-task", type=int, default=RELATED_FIRST[2],
                    help="the ResNet-18 job's trials per task that fill the library")
    rl.add_argument("--arms", default="warm,reuse", help=f"besides cold, of {', '.join(RELATED_ARMS)}")
    rd = sub.add_parser("rounds")
    rd.add_argument("--seeds", default="0,1")
    sub.add_parser("summarize")
    a = ap.parse_args()
    if a.cmd == "run":
        run([int(x) for x in a.seeds.split(",")])
    elif a.cmd == "rank":
        rank_cell(a.total)
    elif a.cmd == "scale":
        scale_cells(a.total, [int(x) for x in a.seeds.split(",")])
    elif a.cmd == "remeasure":
        remeasure_cells(a.total)
    elif a.cmd == "related":
        related_cells([int(x) for x in a.seeds.split(",")], a.model, a.library_per_task, tuple(a.arms.split(",")))
    elif a.cmd == "rounds":
        rounds_cells([int(x) for x in a.seeds.split(",")])
    print(json.dumps(summarize(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
