"""The serving report: the tuned model's latency at each serving share of the GPU.

A model tuned at one MPS share is deployed at another (the serving process's
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE). After the merge, for a cuda job with MPS, this measures the
tuned model once per serving share in :data:`SERVING_PCTS`, each in its own process (the share is
fixed when a process creates its CUDA context) under the job's MPS daemon, and puts
``latency_ms_by_serving_pct`` into summary.json. CPU targets and jobs without MPS get ``None``
and a reason.

  python -m sharetune_tuner.measure.serving --lib model.so --inputs inputs.npz   # one share (the env's)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("sharetune.serving")

SERVING_PCTS = (10, 25, 50, 75, 100)
KEY = "latency_ms_by_serving_pct"


def skip_reason(target: str, uses_mps: bool, env: dict[str, str] | None = None,
                probe: Callable[[dict[str, str]], bool] | None = None) -> str | None:
    """Why no serving report can be measured, or None when it can."""
    if target != "cuda":
        return f"target {target}: serving shares are MPS shares of a GPU"
    if not uses_mps:
        return "the job runs without MPS (spec.gpuSharing.mps: false): no MPS daemon to serve under"
    env = dict(os.environ if env is None else env)
    if not env.get("CUDA_MPS_PIPE_DIRECTORY"):
        return "CUDA_MPS_PIPE_DIRECTORY is not set: not an MPS client of the job's daemon"
    if not (probe or daemon_answers)(env):
        return f"no MPS daemon answers at {env['CUDA_MPS_PIPE_DIRECTORY']}"
    return None


def daemon_answers(env: dict[str, str], control: str = "nvidia-cuda-mps-control") -> bool:
    """The daemon answers get_server_list; where the control binary is not in this container (a
    merge pod needs only the pipe directory), its control pipe exists."""
    if shutil.which(control) is None:
        return (Path(env.get("CUDA_MPS_PIPE_DIRECTORY", "/nonexistent")) / "control").exists()
    try:
        r = subprocess.run([control], input="get_server_list\n", capture_output=True, text=True, env=env,
                           timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def measure_one(lib: Path, inputs: Path, pct: int, env: dict[str, str] | None = None,
                timeout_s: float = 300.0) -> dict[str, Any]:
    """One serving share: a fresh process with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=pct."""
    e = {**(os.environ if env is None else env), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(pct)}
    try:
        r = subprocess.run([sys.executable, "-m", "sharetune_tuner.measure.serving", "--lib", str(lib),
                            "--inputs", str(inputs)], env=e, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines:
        return {"error": f"exit {r.returncode}: {r.stderr.strip()[-500:]}"}
    return dict(json.loads(lines[-1]))


def report(target: str, uses_mps: bool, executable: Any, arrays: list[Any], work_dir: Path,
           pcts: tuple[int, ...] = SERVING_PCTS,
           measure: Callable[[Path, Path, int], dict[str, Any]] | None = None,
           probe: Callable[[dict[str, str]], bool] | None = None) -> dict[str, Any]:
    """The summary's serving keys: ``latency_ms_by_serving_pct`` ({pct: ms or None}, or None when
    it cannot be measured) and ``serving_report`` (how, per-share details or the reason)."""
    reason = skip_reason(target, uses_mps, probe=probe)
    if reason is not None:
        log.info("no serving report: %s", reason)
        return {KEY: None, "serving_report": {"reason": reason}}
    import numpy as np

    t0 = time.monotonic()
    work_dir.mkdir(parents=True, exist_ok=True)
    lib, inputs = work_dir / "tuned.so", work_dir / "inputs.npz"
    executable.export_library(str(lib))
    np.savez(inputs, *[np.asarray(a) for a in arrays])
    detail: dict[str, Any] = {}
    try:
        for pct in pcts:
            detail[str(pct)] = (measure or measure_one)(lib, inputs, pct)
            log.info("serving share %d%%: %s", pct, detail[str(pct)])
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    lat = {k: v.get("median_ms") for k, v in detail.items()}
    return {KEY: lat, "serving_report": {
        "reason": None, "how": "one process per share with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE set, under "
        "the job's MPS daemon; median of 5 rounds of >= 100 ms", "per_pct": detail,
        "pipe_dir": os.environ.get("CUDA_MPS_PIPE_DIRECTORY"), "seconds": round(time.monotonic() - t0, 1)}}


def _measure_here(lib: Path, inputs: Path, repeat: int = 5) -> dict[str, Any]:
    import numpy as np
    import tvm
    from tvm import relax

    dev = tvm.cuda(0)
    with np.load(inputs) as z:
        args = [tvm.runtime.tensor(z[f"arr_{i}"], dev) for i in range(len(z.files))]
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(lib)), dev)
    vm["main"](*args)  # warm-up: module load
    res = vm.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=100)(*args)
    out: dict[str, Any] = {"median_ms": round(float(np.median(res.results)) * 1e3, 4),
                           "min_ms": round(float(np.min(res.results)) * 1e3, 4),
                           "thread_pct": os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")}
    try:
        out["sms_seen"] = int(dev.multi_processor_count)
    except Exception:  # informative only
        pass
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="measure a compiled model at this process's MPS share")
    ap.add_argument("--lib", type=Path, required=True)
    ap.add_argument("--inputs", type=Path, required=True, help=".npz: arr_0 the input, then the params")
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args(argv)
    print(json.dumps(_measure_here(a.lib, a.inputs, a.repeat)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
