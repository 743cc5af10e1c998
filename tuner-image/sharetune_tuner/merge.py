"""Merge the shards' records, compile the tuned model, check it, measure it, write the summary.

Output directory:
  records/      every trial of every shard (nothing dropped: the source of truth)
  best/         the best record per workload (what deployments apply)
  summary.json  per-task trials and best latency, end-to-end latency untuned vs tuned
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from sharetune.api.spec import TuningJobSpec
from sharetune.api.topology import SUMMARY_FILE

from . import records
from .errors import TunerError
from .model import LoadedModel, load_for_spec
from .targets import device_for, make_target
from .tasks import extract

log = logging.getLogger("sharetune.merge")


def compile_with(db_dir: Path | None, model: LoadedModel, target: Any) -> Any:
    """Compiles with the records in ``db_dir``; None = no records (TVM's default schedules,
    DLight on GPUs): the 'untuned' model the tuned one is compared against."""
    from tvm.s_tir import meta_schedule as ms

    db = ms.database.JSONDatabase(work_dir=str(db_dir)) if db_dir else ms.database.MemoryDatabase()
    return ms.relax_integration.compile_relax(db, model.mod, target, None)


def _vm(executable: Any, dev: Any) -> Any:
    from tvm import relax

    return relax.VirtualMachine(executable, dev)


def _args(model: LoadedModel, x: np.ndarray, dev: Any) -> list[Any]:
    import tvm

    return [tvm.runtime.tensor(x, dev), *[tvm.runtime.tensor(p.numpy(), dev) for p in model.params]]


def run_once(executable: Any, model: LoadedModel, x: np.ndarray, dev: Any) -> np.ndarray:
    out = _vm(executable, dev)["main"](*_args(model, x, dev))
    if isinstance(out, (list, tuple)) or not hasattr(out, "numpy"):
        out = out[0]
    return out.numpy()


def latency_s(executable: Any, model: LoadedModel, x: np.ndarray, dev: Any,
              min_repeat_ms: int = 200, repeat: int = 5) -> float:
    """Median of ``repeat`` timed rounds, each at least ``min_repeat_ms`` long."""
    vm = _vm(executable, dev)
    args = _args(model, x, dev)
    vm["main"](*args)  # warm-up (CUDA: module load, NVRTC)
    res = vm.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms)(*args)
    return float(np.median(res.results))


def outputs_match(reference: np.ndarray, tuned: np.ndarray) -> tuple[bool, float]:
    """Tuned schedules only reorder float arithmetic: equal up to accumulated rounding."""
    scale = float(np.max(np.abs(reference))) or 1.0
    err = float(np.max(np.abs(reference - tuned))) / scale
    return err < 1e-3, err


def merge_and_report(spec: TuningJobSpec, shard_dirs: list[Path], out: Path) -> dict[str, Any]:
    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    counts = records.merge(shard_dirs, out / "records", out / "best")
    if counts["records_in"] == 0:
        raise TunerError(f"no tuning records in {', '.join(map(str, shard_dirs))}")
    model = load_for_spec(spec.model)
    target = make_target(spec.target, spec.builder_workers)
    dev = device_for(spec.target)
    x = model.sample_input(seed=spec.seed)

    untuned = compile_with(None, model, target)
    tuned = compile_with(out / "best", model, target)
    ref, got = run_once(untuned, model, x, dev), run_once(tuned, model, x, dev)
    ok, err = outputs_match(ref, got)
    if not ok:
        raise TunerError(f"the tuned model's output differs from the untuned one (relative error {err:.2e})")
    lat_untuned = latency_s(untuned, model, x, dev)
    lat_tuned = latency_s(tuned, model, x, dev)

    stats = records.stats(out / "records")
    tasks = []
    for t in extract(model.mod, target):
        h = t.info.workload_hash
        tasks.append({"name": t.info.name, "workload_hash": h, "weight": t.info.weight, "flops": t.info.flops,
                      "trials": stats.trials_by_workload.get(h, 0),
                      "best_latency_us": round(stats.best_by_workload[h] * 1e6, 3)
                      if h in stats.best_by_workload else None})
    summary: dict[str, Any] = {
        "job": spec.name, "model": model.name, "input_shape": list(model.input_shape),
        "target": spec.target, "shards": len(shard_dirs),
        "records": counts["records_out"], "failed_trials": stats.failed,
        "workloads": counts["workloads"], "best_records": counts["best_records"],
        "latency_untuned_ms": round(lat_untuned * 1e3, 4), "latency_tuned_ms": round(lat_tuned * 1e3, 4),
        "speedup": round(lat_untuned / lat_tuned, 3), "max_relative_error": err,
        "tasks": sorted(tasks, key=lambda t: -(t["flops"] * t["weight"])),
        "merge_s": round(time.monotonic() - t0, 2),
    }
    from .serving import report as serving_report  # the tuned model at each MPS serving share

    summary.update(serving_report(spec.target, spec.uses_mps, tuned, [x, *[p.numpy() for p in model.params]],
                                  out / "serving"))
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
    log.info("merged %d records; %.3f ms -> %.3f ms (%.2fx)", summary["records"],
             summary["latency_untuned_ms"], summary["latency_tuned_ms"], summary["speedup"])
    return summary
