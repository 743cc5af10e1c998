"""Multi-GPU scale-out of local mode on one host: the same model and trial budget tuned on 1, 2, 4
(and 8) GPUs, one MPS daemon and SERVERS servers per GPU, CLIENTS_PER_GPU clients per GPU sharing
all servers through one tracker key. Writes bench/results/multi-gpu.json:

  trials/s per GPU count and scaling efficiency = (trials/s on G GPUs / G) / trials/s on 1 GPU.

Run on a lent multi-GPU machine (e.g. nvidia-h200-x2 / -x4), with TVM installed as in
bench/h200/README.md and NVLink multicast off (the script sets the variables for every process):

  python3 bench/multi_gpu.py --model resnet18 --trials 192 --gpus 1,2,4

Each count is one `sharetune run --local` (a process tree of its own, stopped by process group),
its output in <work dir>/mg<G>.log.
Not run yet: the machines lent so far had one GPU (see docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

from sharetune.api.gpuenv import NO_MULTICAST
from sharetune.procs import ProcessGroup

ROOT = Path(__file__).resolve().parents[1]


def gpu_count() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return 0


def run_once(model: str, gpus: int, trials: int, servers: int, clients_per_gpu: int, pct: int, work: Path) -> dict:
    job = {"apiVersion": "sharetune.io/v1alpha1", "kind": "TuningJob", "metadata": {"name": f"mg{gpus}"},
           "spec": {"model": {"name": model}, "target": "cuda",
                    "trials": {"total": trials, "perTask": max(1, trials // 8), "perIteration": 8},
                    "gpuSharing": {"mps": True, "gpus": gpus},
                    "servers": {"replicas": servers, "threadPercentage": pct},
                    "clients": {"shards": clients_per_gpu * gpus}}}
    path = work / f"mg{gpus}.yaml"
    path.write_text(yaml.safe_dump(job))
    out = work / f"mg{gpus}.json"
    t0 = time.monotonic()
    p = ProcessGroup(f"mg{gpus}", [sys.executable, "-m", "sharetune.cli", "run", str(path), "--local", "--workdir",
                                   str(work / f"run{gpus}"), "--json", str(out)], work / f"mg{gpus}.log",
                     {**os.environ, **NO_MULTICAST}).start()
    try:
        rc = p.wait()
    finally:
        p.stop()  # an interrupted bench leaves no tuning processes behind
    wall = time.monotonic() - t0
    if rc != 0:
        print(f"{gpus} GPU(s): exit {rc}, {p.log}:\n{p.tail()}", file=sys.stderr)
    summary = json.loads(out.read_text()) if out.exists() else {}
    return {"gpus": gpus, "exit": rc, "wall_s": round(wall, 1), "trials": summary.get("records"),
            "tuning_s": summary.get("tuning_s"), "trials_per_s": summary.get("trials_per_s"),
            "latency_tuned_ms": summary.get("latency_tuned_ms")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--trials", type=int, default=192)
    ap.add_argument("--gpus", default="1,2,4,8")
    ap.add_argument("--servers", type=int, default=4, help="servers per GPU")
    ap.add_argument("--clients-per-gpu", type=int, default=4)
    ap.add_argument("--pct", type=int, default=25)
    a = ap.parse_args()
    have = gpu_count()
    counts = [g for g in (int(x) for x in a.gpus.split(",")) if g <= have]
    if not counts:
        print(f"no GPUs here ({have}): nothing to measure", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="multi-gpu-"))
    rows = [run_once(a.model, g, a.trials, a.servers, a.clients_per_gpu, a.pct, work) for g in counts]
    base = next((r["trials_per_s"] for r in rows if r["gpus"] == 1 and r["trials_per_s"]), None)
    for r in rows:
        r["scaling_efficiency"] = round(r["trials_per_s"] / r["gpus"] / base, 3) if base and r["trials_per_s"] else None
    result = {"what": f"{a.model}, {a.trials} trials, {a.servers} servers/GPU at {a.pct}% "
                      "under one MPS daemon per GPU, "
                      f"{a.clients_per_gpu} clients/GPU, one tracker key", "gpus_visible": have,
              "cpus": os.cpu_count(), "goal": ">= 0.85 scaling efficiency at 2 GPUs", "rows": rows}
    (ROOT / "bench" / "results" / "multi-gpu.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
