"""Per-candidate build cost on CUDA, stock NVRTC against the build path sharetune ships: real
tuning candidates of ResNet-18/ResNet-50 conv and dense tasks, each built the way a builder worker
builds it (lowering, codegen, NVRTC, linking the .so), in one long-lived process per NVRTC mode (the
PCH heap is per process, as in our builder workers). Per candidate: CPU-seconds (process +
children: the .so link runs g++), NVRTC seconds, and a hash of the cubin, so a mode that changes
the generated code shows up; candidates whose cubin differs from stock's are then timed on the GPU
both ways.

  python bench/h200/build_cost.py [--models resnet18,resnet50] [--per-task 8] [--modes stock,pch,...]

Appends one cell per run to ``h200-build-cost.jsonl``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from common import RUN_ROOT, append_cell, gpu_name, heaviest, load_cells, log, tuner_env

CELLS = "h200-build-cost.jsonl"


def _cpu() -> float:
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def _pick(tasks: list[Any], k_conv: int) -> list[Any]:
    """The k heaviest conv tasks and the heaviest dense/matmul task."""
    conv = [t for t in heaviest(tasks, len(tasks)) if "conv" in t.info.name][:k_conv]
    dense = [t for t in heaviest(tasks, len(tasks)) if "matmul" in t.info.name or "dense" in t.info.name][:1]
    return conv + dense


def _generate(a: argparse.Namespace, wd: Path) -> list[dict[str, Any]]:
    """Candidates: the first search round of an evolutionary search (random init population picked
    by an untrained cost model), as a real first round builds them; IRModules saved as JSON."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from sharetune_tuner.model.loader import load
    from sharetune_tuner.model.tasks import extract
    from sharetune_tuner.targets import make_target

    target = make_target("cuda")
    out = []
    for model in a.models.split(","):
        tasks = extract(load(name=model).mod, target)
        for task in _pick(tasks, a.conv_tasks):
            ctx = ms.TuneContext(task.workload, target=target, space_generator="post-order-apply",
                                 search_strategy=ms.search_strategy.ReplayTrace(), task_name=task.info.name,
                                 rand_state=a.seed, num_threads=os.cpu_count() or 1)
            spaces = ctx.generate_design_space()
            ctx.pre_tuning(max_trials=a.per_task, num_trials_per_iter=a.per_task, design_spaces=spaces,
                           database=ms.database.MemoryDatabase(), cost_model=None)
            cands = ctx.generate_measure_candidates() or []
            for i, c in enumerate(cands[: a.per_task]):
                p = wd / f"{model}-{task.info.name}-{i}.json"
                p.write_text(tvm.ir.save_json(c.sch.mod))
                out.append({"model": model, "task": task.info.name, "i": i, "mod": str(p),
                            "args": [x.as_json() for x in c.args_info]})
            log(f"{model} {task.info.name}: {len(cands)} candidates")
    return out


# ---- worker: one NVRTC mode, one process -------------------------------------------------------
def worker(mode: str, cands_file: Path, out_file: Path, art_dir: Path) -> None:
    import tvm
    import tvm_ffi

    from sharetune_tuner.build import nvrtc
    from sharetune_tuner.build.builder import build_without_intrinsics, export_shared
    from sharetune_tuner.build.protocol import ARTIFACT_DIR_ENV
    from sharetune_tuner.targets import make_target

    os.environ[ARTIFACT_DIR_ENV] = str(art_dir)
    art_dir.mkdir(parents=True, exist_ok=True)
    nvrtc.install(mode)
    inner = tvm_ffi.get_global_func("tvm_callback_cuda_compile")
    last: dict[str, Any] = {}

    def timed(code: Any) -> Any:
        t, c = time.perf_counter(), time.process_time()
        r = inner(code)
        last["nvrtc_s"], last["nvrtc_cpu_s"] = time.perf_counter() - t, time.process_time() - c
        last["cubin"] = hashlib.sha256(bytes(r)).hexdigest()[:16]
        return r

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", timed, override=True)
    target = make_target("cuda")
    rows = []
    for cand in json.loads(cands_file.read_text()):
        mod = tvm.ir.load_json(Path(cand["mod"]).read_text())
        last.clear()
        c0, t0 = _cpu(), time.perf_counter()
        try:
            lib = build_without_intrinsics(mod, target, None)
            path = export_shared(lib)
            err = None
        except Exception as e:  # a candidate that does not build: counted, not timed
            path, err = None, str(e)[-300:]
        rows.append({**{k: cand[k] for k in ("model", "task", "i")}, "cpu_s": round(_cpu() - c0, 4),
                     "wall_s": round(time.perf_counter() - t0, 4),
                     **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in last.items()},
                     "artifact": path, "error": err})
    out_file.write_text(json.dumps(rows))


# ---- GPU check of candidates whose code changed ----------------------------------------------------
def _kernel_us(path: str, args_info: list[Any]) -> float:
    import numpy as np
    import tvm

    dev = tvm.cuda(0)
    lib = tvm.runtime.load_module(path)
    args = []
    for info in args_info:  # ["TENSOR", dtype, shape]
        _, dtype, shape = info
        args.append(tvm.runtime.tensor(np.random.uniform(-1, 1, shape).astype(dtype), dev))
    f = lib.time_evaluator(lib.entry_name, dev, number=20, repeat=5, min_repeat_ms=50)
    return float(statistics.median(f(*args).results)) * 1e6


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in rows if not r["error"]]
    cpu = [r["cpu_s"] for r in ok]
    nv = [r.get("nvrtc_cpu_s", 0.0) for r in ok]
    per_task: dict[str, list[float]] = {}
    for r in ok:
        per_task.setdefault(f"{r['model']}/{r['task']}", []).append(r["cpu_s"])
    q = lambda xs, p: sorted(xs)[min(len(xs) - 1, int(p * len(xs)))] if xs else None  # noqa: E731  # a one-line helper
    return {"n": len(rows), "errors": len(rows) - len(ok),
            "cpu_s_median": round(statistics.median(cpu), 3) if cpu else None,
            "cpu_s_p10": q(cpu, 0.1), "cpu_s_p90": q(cpu, 0.9),
            "nvrtc_cpu_s_median": round(statistics.median(nv), 3) if nv else None,
            "per_task_cpu_s_median": {k: round(statistics.median(v), 3) for k, v in per_task.items()},
            "cpu_s": cpu}


def summarize(out_path: Path) -> dict[str, Any]:
    """``h200-build-cost.json`` from the cells: per run and task, the CPU-s per candidate before
    (stock) and after (hoist-pch), and the headline cell's trials/s with each NVRTC mode."""
    runs = {}
    for cid, c in load_cells(CELLS).items():
        if "stock" not in c.get("modes", {}) or "hoist-pch" not in c["modes"]:
            continue
        before, after = c["modes"]["stock"], c["modes"]["hoist-pch"]
        runs[cid] = {
            "candidates": before["n"], "cubins_identical": after.get("cubin_same_as_stock"),
            "cubins_differ": after.get("cubin_differs"),
            "cpu_s_median": {"before": before["cpu_s_median"], "after": after["cpu_s_median"]},
            "cpu_s_p10_p90": {"before": [before["cpu_s_p10"], before["cpu_s_p90"]],
                              "after": [after["cpu_s_p10"], after["cpu_s_p90"]]},
            "nvrtc_cpu_s_median": {"before": before["nvrtc_cpu_s_median"], "after": after["nvrtc_cpu_s_median"]},
            "per_task_cpu_s_median": {t: {"before": v, "after": after["per_task_cpu_s_median"].get(t)}
                                      for t, v in before["per_task_cpu_s_median"].items()},
            "cpu_s_distribution": {"before": sorted(before["cpu_s"]), "after": sorted(after["cpu_s"])},
        }
    cells = {}
    for cid, c in load_cells("h200-cells.jsonl").items():
        if cid.endswith("-r10") and "-nv" in cid:
            cells[cid] = {"nvrtc_mode": "stock" if "nvstock" in cid else "hoist-pch", "wall_s": c["wall_s"],
                          "trials_per_s": c["trials_per_s"], "cpu_util_mean": c["cpu_util_mean"],
                          "gpu_util_mean": c["gpu_util_mean"],
                          "intrinsics_built_in_cell": any(p.get("intrinsics") == "built"
                                                          for p in c.get("client_startup") or [])}
    gm = lambda xs: round(statistics.geometric_mean(xs), 3) if xs else None  # noqa: E731  # a one-line helper
    st = [v["trials_per_s"] for v in cells.values() if v["nvrtc_mode"] == "stock"]
    pc = [v["trials_per_s"] for v in cells.values() if v["nvrtc_mode"] == "hoist-pch"]
    summary = {"runs": runs, "headline_cell": {"cells": cells,
                                               "trials_per_s_geomean": {"stock": gm(st), "hoist-pch": gm(pc)},
                                               "ratio_geomean": round(gm(pc) / gm(st), 3) if st and pc else None,
                                               "ratio_worst": round(min(pc) / max(st), 3) if st and pc else None}}
    out_path.write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--summarize", action="store_true", help="write bench/results/h200-build-cost.json and exit")
    ap.add_argument("--id", default="build-cost")
    ap.add_argument("--models", default="resnet18,resnet50")
    ap.add_argument("--conv-tasks", type=int, default=3)
    ap.add_argument("--per-task", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--modes", default="stock,pch,hoist-pch")
    ap.add_argument("--worker", nargs=4, metavar=("MODE", "CANDS", "OUT", "ART"))
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args()
    if a.summarize:
        from common import RESULTS

        summarize(RESULTS / "h200-build-cost.json")
        return 0
    if a.worker:
        worker(a.worker[0], Path(a.worker[1]), Path(a.worker[2]), Path(a.worker[3]))
        return 0
    if a.id in load_cells(CELLS) and not a.force:
        log(f"{a.id}: already done")
        return 0
    os.environ.update(tuner_env())
    wd = RUN_ROOT / "runs" / a.id
    wd.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"id": a.id, "gpu": gpu_name(), "cpu_count": os.cpu_count(), "models": a.models,
                           "per_task": a.per_task, "modes": {}, "errors": []}
    try:
        t = time.perf_counter()
        cands = _generate(a, wd)
        out["generate_s"] = round(time.perf_counter() - t, 1)
        cf = wd / "cands.json"
        cf.write_text(json.dumps(cands))
        # One process per mode, all at once: each is single-threaded and the machine has 16 cores.
        procs = {}
        for mode in a.modes.split(","):
            of = wd / f"rows-{mode}.json"
            procs[mode] = (subprocess.Popen([sys.executable, __file__, "--worker", mode, str(cf), str(of),
                                             str(wd / f"art-{mode}")], env=tuner_env()), of)
        rows_by = {}
        for mode, (p, of) in procs.items():
            p.wait()
            rows_by[mode] = json.loads(of.read_text()) if of.exists() else []
            out["modes"][mode] = _summary(rows_by[mode])
            log(f"{mode}: {({k: v for k, v in out['modes'][mode].items() if k != 'cpu_s'})}")
        stock = {(r["model"], r["task"], r["i"]): r for r in rows_by.get("stock", [])}
        by_key = {(c["model"], c["task"], c["i"]): c for c in cands}
        for mode, rows in rows_by.items():
            if mode == "stock":
                continue
            same = diff = 0
            timed = []
            for r in rows:
                s = stock.get((r["model"], r["task"], r["i"]))
                if not s or r["error"] or s["error"]:
                    continue
                if r.get("cubin") == s.get("cubin"):
                    same += 1
                    continue
                diff += 1
                if len(timed) < 12:
                    args = by_key[(r["model"], r["task"], r["i"])]["args"]
                    timed.append({"cand": f"{r['model']}/{r['task']}/{r['i']}",
                                  "stock_us": round(_kernel_us(s["artifact"], args), 2),
                                  "mode_us": round(_kernel_us(r["artifact"], args), 2)})
            out["modes"][mode].update({"cubin_same_as_stock": same, "cubin_differs": diff, "kernel_check": timed})
            log(f"{mode}: cubin same {same}, differs {diff}; timed {timed[:3]}")
    except Exception:
        out["errors"].append(traceback.format_exc()[-3000:])
        log(traceback.format_exc())
    append_cell(CELLS, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
