"""Multi-job benchmark: three different jobs on one GPU through one pool vs one after another.

Three jobs (ResNet-18, MobileNet-V2, ResNet-50 by default), each with the headline cells' budget
(96 trials, 16 per task, 16 candidates per round) and the same spec in both arms: a share of
``--share`` (33) % of the GPU, ``--servers`` (3) servers at share/servers % each, as many clients.

    python3 bench/h200/multi_job.py tune --arm solo --job resnet18       # one job alone (the stock way:
    python3 bench/h200/multi_job.py tune --arm solo --job mobilenet_v2   #   it owns the GPU), one device
    python3 bench/h200/multi_job.py tune --arm solo --job resnet50       #   command each
    python3 bench/h200/multi_job.py tune --arm pool                      # the three at once, one MPS daemon
    python3 bench/h200/multi_job.py evaluate    # every job's best records compiled, measured alone, whole GPU
    python3 bench/h200/multi_job.py summarize   # no GPU: h200-multi-job.json

``tune`` runs ``sharetune run ... --local`` (the product's local mode: one job, or several through
sharetune/local/pool.py), samples CPU and GPU utilisation (common.Sampler), appends the arm to
``h200-multi-job-arms.jsonl`` in $OUT and keeps each job's result folder under the run root.
``evaluate`` measures in one process, after tuning, so no arm's latency is disturbed by another
job's kernels (the pool arm's own merges measured beside the other jobs). Arms of one comparison
run back to back on one machine (``machine`` is recorded). Smoke test on a CPU machine:
``--jobs tiny_cnn,tiny_cnn --target llvm``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from common import Sampler, append_cell, export_results, load_cells, log, tuner_env

ARMS = "h200-multi-job-arms.jsonl"
EVAL = "h200-multi-job-eval.jsonl"
ROOT = Path(os.environ.get("BENCH_ROOT", "/tmp/sharetune-bench")) / "multi-job"
INPUT_SHAPES = {"tiny_cnn": [1, 3, 64, 64]}


def machine() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown"


def job_names(a: argparse.Namespace) -> list[str]:
    models = a.jobs.split(",")
    return [f"{m.replace('_', '-')}-{i}" if models.count(m) > 1 else m.replace("_", "-") for i, m in enumerate(models)]


def write_specs(a: argparse.Namespace, where: Path) -> list[Path]:
    """One TuningJob YAML per job; the same spec in both arms (only concurrency differs)."""
    where.mkdir(parents=True, exist_ok=True)
    pct = a.share // a.servers
    paths = []
    for name, model in zip(job_names(a), a.jobs.split(",")):
        spec: dict[str, Any] = {
            "model": {"name": model, **({"inputShape": INPUT_SHAPES[model]} if model in INPUT_SHAPES else {})},
            "target": a.target, "trials": {"total": a.trials, "perTask": a.per_task, "perIteration": a.per_iter},
            "servers": {"replicas": a.servers}, "clients": {"shards": a.servers}, "costModel": "xgb", "seed": a.seed}
        if a.target == "cuda":
            spec["servers"]["threadPercentage"] = pct
            spec["gpuSharing"] = {"share": a.share}
        p = where / f"{name}.yaml"
        p.write_text(yaml.safe_dump({"apiVersion": "sharetune.io/v1alpha1", "kind": "TuningJob",
                                     "metadata": {"name": name}, "spec": spec}))
        paths.append(p)
    return paths


def shard_windows(job_dir: Path) -> dict[str, Any]:
    """The job's shards' measurement-window counts (their progress reports): candidates measured
    alone or beside other jobs, per other job, and how long measurements waited for a merge."""
    out: dict[str, Any] = {"measured_alone": 0, "measured_beside_others": 0, "co_tenants": {}, "window_wait_s": 0.0}
    for p in sorted(job_dir.glob("shards/*/progress.json")):
        prog = json.loads(p.read_text())
        out["measured_alone"] += prog.get("measured_alone", 0)
        out["measured_beside_others"] += prog.get("measured_beside_others", 0)
        out["window_wait_s"] = round(out["window_wait_s"] + prog.get("window_wait_s", 0.0), 3)
        for k, n in (prog.get("co_tenants") or {}).items():
            out["co_tenants"][k] = out["co_tenants"].get(k, 0) + n
    return out


def tune(a: argparse.Namespace) -> int:
    arm_id = f"mj-{a.arm}-{a.job or 'all'}-s{a.seed}-{a.round}"
    if arm_id in load_cells(ARMS):
        log(f"{arm_id}: already done")
        return 0
    run_dir = ROOT / arm_id
    specs = write_specs(a, run_dir / "jobs")
    names = job_names(a)
    if a.arm == "solo":
        pick = [i for i, n in enumerate(names) if n == a.job]
        if not pick:
            raise SystemExit(f"--job {a.job}: not one of {names}")
        specs, names = [specs[pick[0]]], [names[pick[0]]]
    out_json = run_dir / "summary.json"
    argv = [sys.executable, "-m", "sharetune.cli", "run", *map(str, specs), "--local", "--json", str(out_json),
            "--workdir", str(run_dir / ("runs" if a.arm == "pool" else f"runs/{names[0]}"))]
    sampler = Sampler(period_s=0.5).start()
    t0 = time.time()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=a.timeout_s, env=tuner_env())
    t1 = time.time()
    sampler.stop()
    (run_dir / "run.log").write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        log(f"{arm_id}: sharetune run failed ({r.returncode}):\n{(r.stdout + r.stderr)[-3000:]}")
        return 1
    summary = json.loads(out_json.read_text())
    jobs = summary["jobs"] if "jobs" in summary else [{**summary, "job": names[0], "wall_s": round(t1 - t0, 1)}]
    dirs = {n: str(run_dir / "runs" / n) for n in names}
    cell = {"id": arm_id, "arm": a.arm, "round": a.round, "seed": a.seed, "machine": machine(),
            "knobs": {"jobs": a.jobs, "share": a.share, "servers": a.servers, "clients": a.servers,
                      "thread_pct": a.share // a.servers, "trials": a.trials, "per_task": a.per_task,
                      "per_iter": a.per_iter, "target": a.target},
            "wall_s": round(t1 - t0, 1), "records": sum(j.get("records", 0) for j in jobs),
            "jobs": [{**{k: j.get(k) for k in ("job", "state", "records", "wall_s", "trials_per_s",
                                                "latency_untuned_ms", "latency_tuned_ms", "speedup", "co_tenants",
                                                "gpu", "share", "measurement")},
                      # per task: best latency as measured while tuning (beside co-tenants in the pool
                      # arm) and the same record re-measured by the merge alone (exclusive window)
                      "tasks": [{k: t.get(k) for k in ("name", "trials", "best_latency_us", "tuned_us")}
                                for t in j.get("tasks") or []],
                      "windows": shard_windows(run_dir / "runs" / j["job"]),
                      "phases": shard_phases(run_dir / "runs" / j["job"])}
                     for j in jobs],
            "result_dirs": dirs, **sampler.summary(t0, t1)}
    cell["trials_per_s"] = round(cell["records"] / cell["wall_s"], 3)
    append_cell(ARMS, cell)
    export_results()
    log(f"{arm_id}: {cell['records']} trials in {cell['wall_s']} s, CPU {cell['cpu_util_mean']}%, "
        f"GPU {cell['gpu_util_mean']}%")
    return 0


def delivered_records(result: Path) -> Path | None:
    """The records the job delivered (the merge's ``best/``: per task the best record that beat
    TVM's default; none when the tuned model was not faster), or None for the untuned model.
    Runs archived before ``best/`` was kept are rebuilt from ``records/`` and the merge's verdicts
    in ``summary.json`` (the same best record per workload, the tasks the tuned record won)."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    from sharetune_tuner.merge import TUNED, write_db
    from sharetune_tuner.store import records

    best = result / "best"
    if not best.is_dir():
        summary = json.loads((result / "summary.json").read_text())
        won = {t["workload_hash"] for t in summary.get("tasks", []) if t.get("winner") == TUNED}
        scratch = result.parent / "eval" / "all-best"
        records.merge([result / "records"], scratch / "records", scratch / "best")
        cands = ms.database.JSONDatabase(work_dir=str(scratch / "best")).get_all_tuning_records()
        kept = [r for r in cands if str(tvm_ffi.structural_hash(r.workload.mod)) in won] if summary["improved"] else []
        write_db(best, kept)
    n = len(records.read_lines(best / "database_tuning_record.json"))
    return best if n else None


def compile_with_best(best: Path, model_name: str, target_kind: str, so: Path) -> None:
    from sharetune_tuner.merge import compile_with
    from sharetune_tuner.model.loader import load
    from sharetune_tuner.targets import make_target

    so.parent.mkdir(parents=True, exist_ok=True)
    compile_with(best, load(name=model_name), make_target(target_kind)).export_library(str(so))


def eval_id(seed: int, round_: str) -> str:
    # "-delivered": the round m2 evaluation before evaluate compiled the delivered records (every
    # task's best raw record, id without the suffix) stays in the file, apart.
    return f"mj-eval-s{seed}-{round_}-delivered"


def evaluate(a: argparse.Namespace) -> int:
    """Every job's delivered model of every arm (the merge's ``best/`` records applied; the
    untuned model where the job delivered that), then measured in one process on the whole GPU
    with nothing else running (evaluate.py's measurement)."""
    from evaluate import measure_models, prepare_untuned

    arms = [c for c in load_cells(ARMS).values() if c["round"] == a.round and c["seed"] == a.seed]
    models: dict[str, list[tuple[str, str]]] = {}  # model -> (arm/job, .so)
    for c in arms:
        for j, model in zip(job_names(argparse.Namespace(jobs=c["knobs"]["jobs"])), c["knobs"]["jobs"].split(",")):
            d = c["result_dirs"].get(j)
            if d is None:
                continue
            best = delivered_records(Path(d) / "result")
            if best is None:  # the job delivered the untuned model: that is what it serves
                models.setdefault(model, []).append((f"{c['id']}/{j}", "untuned"))
                continue
            so = Path(d) / "eval" / "model.so"
            if not so.exists():
                compile_with_best(best, model, c["knobs"]["target"], so)
            models.setdefault(model, []).append((f"{c['id']}/{j}", str(so)))
    out: dict[str, Any] = {"id": eval_id(a.seed, a.round), "round": a.round, "seed": a.seed,
                           "machine": machine(), "compiled": "delivered", "models": {}}
    for model, runs in models.items():
        untuned = ROOT / f"untuned-{model}.so"
        if not untuned.exists():
            prepare_untuned(model, a.target, untuned)
        runs = [(k, str(untuned) if so == "untuned" else so) for k, so in runs]
        measured = measure_models(list(dict.fromkeys([str(untuned), *[so for _, so in runs]])), model, a.target,
                                  a.repeat)
        out["models"][model] = {"untuned": measured[str(untuned)],
                                **{k: {**measured[so], "delivered": "untuned" if so == str(untuned) else "tuned"}
                                   for k, so in runs}}
    append_cell(EVAL, out)
    export_results()
    return 0


# The CPU-side phases of a shard (TVM's profiler, seconds) that show what limits a pool's gain:
# building candidates, the cost model's updates, sampling the initial population.
CPU_PHASES = {"build_s": "SendToBuilder", "cost_model_s": "MeasureCallback/UpdateCostModel",
              "sample_init_s": "EvoSearch/SampleInitPopulation", "measure_s": "JoinRunnerFutures"}


def shard_phases(job_dir: Path) -> dict[str, float] | None:
    """Mean per shard of CPU_PHASES and of the time to the first records (start-up)."""
    rows = []
    for p in sorted(job_dir.glob("shards/*/progress.json")):
        prog = json.loads(p.read_text())
        ph = prog.get("phases") or {}
        rows.append({**{k: ph.get(v, 0.0) for k, v in CPU_PHASES.items()},
                     "first_records_s": (prog.get("startup") or {}).get("first_records_s") or 0.0,
                     "shard_s": prog.get("updated_at", 0.0) - prog.get("started_at", 0.0)})
    if not rows:
        return None
    return {k: round(sum(r[k] for r in rows) / len(rows), 1) for k in rows[0]}


def geomean(xs: list[float]) -> float:
    return round(statistics.geometric_mean(xs), 3)


def summarize_seed(arms: dict[str, dict[str, Any]], ev: dict[str, Any] | None) -> dict[str, Any]:
    """One run of the comparison (one seed): the pool arm against its solo arms."""
    pool = next((c for c in arms.values() if c["arm"] == "pool"), None)
    solos = [c for c in arms.values() if c["arm"] == "solo"]
    if pool is None or not solos:
        raise SystemExit(f"need the pool arm and the solo arms; have {sorted(arms)}")
    sequential_s = sum(c["wall_s"] for c in solos)
    res: dict[str, Any] = {
        "seed": pool["seed"], "same_machine": len({c["machine"] for c in arms.values()}) == 1,
        "evaluated": ev is not None,
        "makespan_s": {"concurrent": pool["wall_s"], "sequential": round(sequential_s, 1)},
        "makespan_ratio": round(pool["wall_s"] / sequential_s, 3),
        "trials_per_s": {"concurrent": pool["trials_per_s"],
                         "sequential": round(sum(c["records"] for c in solos) / sequential_s, 3)},
        "cpu_util_mean": {"concurrent": pool["cpu_util_mean"],
                          "sequential": [c["cpu_util_mean"] for c in solos]},
        "gpu_util_mean": {"concurrent": pool["gpu_util_mean"],
                          "sequential": [c["gpu_util_mean"] for c in solos]},
        # The CPU as the bound: the machine-seconds of CPU each arm kept busy, and the makespan
        # ratio the sequential arm's CPU work would allow at 100 % CPU (no GPU or start-up limit).
        "cpu_busy_machine_s": {"concurrent": round(pool["wall_s"] * pool["cpu_util_mean"] / 100, 1),
                               "sequential": round(sum(c["wall_s"] * c["cpu_util_mean"] for c in solos) / 100, 1)},
        "jobs": {}}
    res["cpu_bound_makespan_ratio"] = round(res["cpu_busy_machine_s"]["sequential"] / sequential_s, 3)
    for j in pool["jobs"]:
        solo = next((c for c in solos if c["jobs"][0]["job"] == j["job"]), None)
        row: dict[str, Any] = {"co_tenants": j.get("co_tenants"), "trials": j.get("records"),
                               "solo_trials": solo["jobs"][0].get("records") if solo else None,
                               "wall_s": j.get("wall_s"), "solo_wall_s": solo["wall_s"] if solo else None}
        if solo is not None and j.get("speedup") and solo["jobs"][0].get("speedup"):
            # The merges' own measurement (alone, each against the untuned model it measured in
            # the same process): delivered latency pool / solo, each over its own untuned.
            row["merge_latency_ratio_vs_solo"] = round(solo["jobs"][0]["speedup"] / j["speedup"], 3)
        if ev is not None and solo is not None:
            model = next(m for m, runs in ev["models"].items() if f"{pool['id']}/{j['job']}" in runs)
            conc = ev["models"][model][f"{pool['id']}/{j['job']}"].get("median_ms")
            alone = ev["models"][model][f"{solo['id']}/{j['job']}"].get("median_ms")
            untuned = ev["models"][model]["untuned"].get("median_ms")
            row.update(latency_ms=conc, solo_latency_ms=alone, untuned_ms=untuned,
                       evaluate_latency_ratio_vs_solo=round(conc / alone, 3) if conc and alone else None)
        # The job's latency against solo: the independent re-measure where it ran, else the merges'.
        for src in ("evaluate", "merge"):
            if row.get(f"{src}_latency_ratio_vs_solo"):
                row.update(latency_ratio_vs_solo=row[f"{src}_latency_ratio_vs_solo"], latency_measured_by=src)
                break
        row["windows"] = j.get("windows")
        row["merge_measurement"] = j.get("measurement")
        # How co-tenancy moved measured latencies: per task, the best latency measured while tuning
        # over the same record re-measured alone by the merge; pool arm over solo arm (the solo
        # ratio holds what differs between the two measurements other than co-tenants).
        shift = {arm: tuning_vs_alone(c["jobs"][0] if arm == "solo" else j)
                 for arm, c in (("pool", pool), ("solo", solo)) if c is not None}
        row["tuning_vs_alone"] = shift
        if shift.get("pool") and shift.get("solo"):
            row["co_tenancy_shift"] = round(shift["pool"] / shift["solo"], 3)
        # what the shards spent their CPU time on, pool vs solo (mean per shard)
        row["cpu_phases_per_shard"] = {
            arm: c_j.get("phases") or shard_phases(ROOT / c["id"] / "runs" / c_j["job"])
            for arm, c, c_j in (("pool", pool, j), ("solo", solo, solo["jobs"][0] if solo else None)) if c_j}
        res["jobs"][j["job"]] = row
    return res


def summarize(a: argparse.Namespace) -> int:
    """Every seed of the round: per-seed results under ``runs``; at the top the geometric means
    over seeds with the worst run beside them (latency only over evaluated seeds)."""
    cells = [c for c in load_cells(ARMS).values() if c["round"] == a.round]
    evals = load_cells(EVAL)
    seeds = sorted({c["seed"] for c in cells if c["arm"] == "pool"})
    # Evaluations from before evaluate compiled the delivered model (they applied every task's
    # best raw record, including the tasks whose default won) do not count as the jobs' latency.
    runs = [summarize_seed({c["id"]: c for c in cells if c["seed"] == s}, evals.get(eval_id(s, a.round)))
            for s in seeds]
    if not runs:
        raise SystemExit(f"round {a.round}: no pool arm recorded")
    ms = [r["makespan_ratio"] for r in runs]
    tput = [r["trials_per_s"]["concurrent"] / r["trials_per_s"]["sequential"] for r in runs]
    res: dict[str, Any] = {
        "round": a.round, "seeds": seeds, "same_machine": all(r["same_machine"] for r in runs),
        "makespan_ratio": geomean(ms), "makespan_ratio_worst": max(ms),
        "trials_per_s_ratio": geomean(tput), "trials_per_s_ratio_worst": round(min(tput), 3),
        "cpu_bound_makespan_ratio": geomean([r["cpu_bound_makespan_ratio"] for r in runs]),
        # latency_measured_by "merge": each job's merge timed its delivered model alone (exclusive
        # window) against the untuned model in the same process; the ratio is pool / solo of that.
        "jobs": {}, "not_run": [f"evaluate seed {r['seed']} (the independent re-measure of the delivered models)"
                                for r in runs if not r["evaluated"]],
        "runs": runs}
    for job in runs[0]["jobs"]:
        lat = [r["jobs"][job]["latency_ratio_vs_solo"] for r in runs if r["jobs"][job].get("latency_ratio_vs_solo")]
        shift = [r["jobs"][job]["co_tenancy_shift"] for r in runs if r["jobs"][job].get("co_tenancy_shift")]
        res["jobs"][job] = {
            "latency_ratio_vs_solo": geomean(lat) if lat else None,
            "latency_ratio_vs_solo_worst": max(lat) if lat else None, "latency_seeds": len(lat),
            "latency_measured_by": sorted({r["jobs"][job]["latency_measured_by"] for r in runs
                                           if r["jobs"][job].get("latency_measured_by")}),
            "co_tenancy_shift": geomean(shift) if shift else None,
            "co_tenancy_shift_range": [min(shift), max(shift)] if shift else None}
    allshift = [r["jobs"][j]["co_tenancy_shift"] for r in runs for j in r["jobs"]
                if r["jobs"][j].get("co_tenancy_shift")]
    if allshift:
        res["co_tenancy_shift"] = {"geomean": geomean(allshift), "min": min(allshift), "max": max(allshift)}
    path = Path(a.out)
    path.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k != "runs"}, indent=2))
    return 0


def tuning_vs_alone(job: dict[str, Any]) -> float | None:
    """Geometric mean over tasks of (best latency measured while tuning) / (re-measured alone)."""
    r = [t["best_latency_us"] / t["tuned_us"] for t in job.get("tasks") or []
         if t.get("best_latency_us") and t.get("tuned_us")]
    return geomean(r) if r else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("stage", choices=("tune", "evaluate", "summarize"))
    ap.add_argument("--arm", choices=("solo", "pool"), default="pool")
    ap.add_argument("--job", default=None, help="solo arm: which job (its name: the model, - for _)")
    ap.add_argument("--jobs", default="resnet18,mobilenet_v2,resnet50")
    ap.add_argument("--target", default="cuda")
    ap.add_argument("--share", type=int, default=33)
    ap.add_argument("--servers", type=int, default=3)
    ap.add_argument("--trials", type=int, default=96)
    ap.add_argument("--per-task", type=int, default=16)
    ap.add_argument("--per-iter", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--round", default="m2")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--timeout-s", type=float, default=560)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results" / "h200-multi-job.json"))
    a = ap.parse_args(argv)
    return {"tune": tune, "evaluate": evaluate, "summarize": summarize}[a.stage](a)


if __name__ == "__main__":
    sys.exit(main())
