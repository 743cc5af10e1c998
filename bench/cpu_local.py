"""CPU benchmark of the local topology: 1 client / 1 server vs M clients / N servers.

Same model, target (llvm), trial budget, cost model and seeds; only the topology differs.
Writes bench/results/cpu-local.json and cpu-local.png. Ratios matter more than absolute numbers:
these machines are noisy.

    .venv/bin/python bench/cpu_local.py [--model tiny_cnn] [--total 64] [--shards 2 --servers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def job(name: str, model: str, shape: list[int], total: int, per_task: int, per_iter: int,
        shards: int, servers: int) -> dict:
    return {"apiVersion": "sharetune.io/v1alpha1", "kind": "TuningJob", "metadata": {"name": name},
            "spec": {"model": {"name": model, "inputShape": shape}, "target": "llvm",
                     "trials": {"total": total, "perTask": per_task, "perIteration": per_iter},
                     "servers": {"replicas": servers}, "clients": {"shards": shards},
                     "costModel": "xgb", "seed": 0}}


def run_one(doc: dict, workdir: Path) -> dict:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = workdir / "summary.json"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "sharetune.cli", "run", str(path), "--local",
                        "--workdir", str(workdir / "run"), "--json", str(out)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{doc['metadata']['name']} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    s = json.loads(out.read_text())
    s["wall_s"] = round(time.monotonic() - t0, 1)
    return s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny_cnn")
    ap.add_argument("--shape", default="1,3,64,64")
    ap.add_argument("--total", type=int, default=64)
    ap.add_argument("--per-task", type=int, default=16)
    ap.add_argument("--per-iter", type=int, default=4)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--servers", type=int, default=2)
    a = ap.parse_args()
    shape = [int(x) for x in a.shape.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="sharetune-bench-"))
    base = run_one(job("baseline", a.model, shape, a.total, a.per_task, a.per_iter, 1, 1), tmp / "baseline")
    shared = run_one(job("sharetune", a.model, shape, a.total, a.per_task, a.per_iter, a.shards, a.servers),
                     tmp / "sharetune")
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "model": a.model, "input_shape": shape, "target": "llvm", "total_trials": a.total,
        "baseline": {"clients": 1, "servers": 1},
        "sharetune": {"clients": a.shards, "servers": a.servers},
        "baseline_trials_per_s": round(base["records"] / base["tuning_s"], 4),
        "sharetune_trials_per_s": round(shared["records"] / shared["tuning_s"], 4),
        "baseline_tuning_s": base["tuning_s"], "sharetune_tuning_s": shared["tuning_s"],
        "baseline_tuned_latency_ms": base["latency_tuned_ms"],
        "sharetune_tuned_latency_ms": shared["latency_tuned_ms"],
        "untuned_latency_ms": base["latency_untuned_ms"],
        "baseline_speedup": base["speedup"], "sharetune_speedup": shared["speedup"],
    }
    result["throughput_ratio"] = round(result["sharetune_trials_per_s"] / result["baseline_trials_per_s"], 3)
    result["latency_ratio"] = round(shared["latency_tuned_ms"] / base["latency_tuned_ms"], 3)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "cpu-local.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, RESULTS / "cpu-local.png")
    print(json.dumps(result, indent=2))
    return 0


def plot(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
    labels = ["1 client / 1 server", f"{r['sharetune']['clients']} clients / {r['sharetune']['servers']} servers"]
    ax1.bar(labels, [r["baseline_trials_per_s"], r["sharetune_trials_per_s"]], color=["#999", "#2a7"])
    ax1.set_ylabel("trials / s")
    ax1.set_title(f"throughput ({r['throughput_ratio']}x)")
    ax2.bar(["untuned", *labels], [r["untuned_latency_ms"], r["baseline_tuned_latency_ms"],
                                   r["sharetune_tuned_latency_ms"]], color=["#c44", "#999", "#2a7"])
    ax2.set_ylabel("model latency (ms)")
    ax2.set_title(f"{r['model']} on llvm, {r['total_trials']} trials")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
