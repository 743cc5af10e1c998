"""A/B of a local pool's CPU thread sizing between two revisions, on this machine's CPU.

Several CPU jobs at once (``sharetune run a.yaml b.yaml c.yaml --local``) share the host's cores.
Arm ``before`` is a revision whose clients sized their threads by their own job only; arm
``after`` one that counts every running job's clients and gives the XGBoost cost model the
client's fair share (``cpus.cost_model_threads``). Each arm runs from its own git worktree; the
arms alternate, ``--reps`` times each, back to back:

    python bench/pool_threads.py --before 71d8879 --after HEAD --reps 3

Writes ``bench/results/pool-threads.json``: per run the wall time, trials/s and the shards'
profile phases (cost-model updates, search, builds); per arm geometric means; after / before
with the worst pair beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
PHASES = {"cost_model_s": "MeasureCallback/UpdateCostModel", "sample_init_s": "EvoSearch/SampleInitPopulation",
          "evolve_s": "EvoSearch/Evolve/Mutation", "build_s": "SendToBuilder"}


def worktree(rev: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), rev], check=True,
                   capture_output=True)
    return where


def write_jobs(a: argparse.Namespace, where: Path) -> list[Path]:
    where.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(a.jobs):
        spec = {"model": {"name": "tiny_cnn", "inputShape": [1, 3, 64, 64]}, "target": "llvm", "seed": i,
                "trials": {"total": a.trials, "perTask": a.per_task, "perIteration": a.per_iter},
                "servers": {"replicas": a.shards}, "clients": {"shards": a.shards}, "costModel": "xgb"}
        p = where / f"job-{i}.yaml"
        p.write_text(yaml.safe_dump({"apiVersion": "sharetune.io/v1alpha1", "kind": "TuningJob",
                                     "metadata": {"name": f"job-{i}"}, "spec": spec}))
        paths.append(p)
    return paths


def run_arm(tree: Path, jobs: list[Path], work: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": f"{tree / 'operator'}:{tree / 'tuner-image'}"}
    out = work / "summary.json"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "sharetune.cli", "run", *map(str, jobs), "--local",
                        "--workdir", str(work / "runs"), "--json", str(out)],
                       capture_output=True, text=True, env=env, timeout=3600)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"{tree}: sharetune run failed:\n{(r.stdout + r.stderr)[-3000:]}")
    records = sum(j["records"] for j in json.loads(out.read_text())["jobs"])
    phases = {k: 0.0 for k in PHASES}
    shards = sorted((work / "runs").glob("*/shards/*/progress.json"))
    for p in shards:
        ph = json.loads(p.read_text()).get("phases") or {}
        for k, v in PHASES.items():
            phases[k] += ph.get(v, 0.0)
    return {"wall_s": round(wall, 1), "records": records, "trials_per_s": round(records / wall, 3),
            "per_shard": {k: round(v / max(1, len(shards)), 2) for k, v in phases.items()}}


def geomean(xs: list[float]) -> float:
    return round(statistics.geometric_mean(xs), 3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--trials", type=int, default=32)
    ap.add_argument("--per-task", type=int, default=16)
    ap.add_argument("--per-iter", type=int, default=8)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "pool-threads.json"))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pool-threads-"))
    trees = {arm: worktree(rev, tmp / arm) for arm, rev in (("before", a.before), ("after", a.after))}
    revs = {arm: subprocess.run(["git", "-C", str(t), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip() for arm, t in trees.items()}
    jobs = write_jobs(a, tmp / "jobs")
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    try:
        for rep in range(a.reps):
            for arm in (("before", "after") if rep % 2 == 0 else ("after", "before")):
                res = run_arm(trees[arm], jobs, tmp / f"{arm}-{rep}")
                runs[arm].append(res)
                print(f"rep {rep} {arm}: {res}", flush=True)
    finally:
        for t in trees.values():
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(t)], capture_output=True)
    wall = [x["wall_s"] / y["wall_s"] for x, y in zip(runs["after"], runs["before"])]
    cm = [x["per_shard"]["cost_model_s"] / y["per_shard"]["cost_model_s"]
          for x, y in zip(runs["after"], runs["before"]) if y["per_shard"]["cost_model_s"]]
    res = {"machine_cpus": os.cpu_count(), "revisions": revs, "knobs": {k: getattr(a, k) for k in (
               "reps", "jobs", "shards", "trials", "per_task", "per_iter")},
           "wall_ratio_after_before": geomean(wall), "wall_ratio_worst": round(max(wall), 3),
           "cost_model_ratio_after_before": geomean(cm) if cm else None,
           "arms": {arm: {"wall_s_geomean": geomean([r["wall_s"] for r in rs]), "runs": rs}
                    for arm, rs in runs.items()}}
    Path(a.out).write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k != "arms"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
