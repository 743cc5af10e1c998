"""Evaluation cell: the tuned models of finished tuning cells, measured on the GPU.

For every run: merge its shard databases, compile the whole model with the best records
(``compile_relax``, the tasks that were not tuned get TVM's default GPU schedules, same for every
run), and re-build each record that improved a task's best during tuning (the best-so-far
sequence, in measurement order). Then, on the GPU:
  * no MPS daemon, whole GPU: each model's end-to-end latency, and each improving record's kernel
    latency (what the quality-over-time curves and ``time_to_quality`` are made of: tuning-time
    measurements of runs under MPS at P% are not comparable with each other, re-measuring at 100%
    makes them so);
  * under one MPS daemon, a measuring process per serving share P_s
    (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE): each model's end-to-end latency (the quality matrix).
Appends one cell per run to ``h200-eval.jsonl`` (id ``eval-<run id>``).

  python bench/h200/evaluate.py --runs base-r18,st-r18-m4n4p25 [--serve 10,25,50,75,100]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import RUN_ROOT, append_cell, load_cells, log, mps_env, mps_start, mps_stop, tuner_env

EVAL = "h200-eval.jsonl"
CELLS = "h200-cells.jsonl"


# ---- stage A: CPU work per run (subprocess) ----------------------------------------------------
def _lines(p: Path) -> list[Any]:
    from sharetune_tuner.store.records import read_lines

    return read_lines(p)


def improving_records(cell: dict[str, Any]) -> list[dict[str, Any]]:
    """Records that lowered their task's best (by the run's own measurement), in time order."""
    rows = []
    for db in cell["db_dirs"]:
        wls = _lines(Path(db) / "database_workload.json")
        recs = _lines(Path(db) / "database_tuning_record.json")
        times = cell["record_times"].get(db, [])
        for i, (widx, body) in enumerate(recs):
            secs = [float(x) for x in (body[1] or [])]
            mean = sum(secs) / len(secs) if secs else 1e10
            if mean >= 1e9 or not 0 <= widx < len(wls):
                continue
            t = times[i] if i < len(times) else cell["wall_s"]
            rows.append({"db": db, "index": i, "t": t, "workload": str(wls[widx][0]), "tuned_s": mean})
    rows.sort(key=lambda r: (r["t"], r["db"], r["index"]))
    best: dict[str, float] = {}
    out = []
    for r in rows:
        if r["tuned_s"] < best.get(r["workload"], float("inf")):
            best[r["workload"]] = r["tuned_s"]
            out.append(r)
    return out


def compile_model(db_dirs: list[Path], model_name: str, target_kind: str, wd: Path) -> dict[str, int]:
    """Merges ``db_dirs`` into ``wd/records`` (every record) and ``wd/best`` (the best record per
    workload), compiles the whole model with ``wd/best`` (``compile_relax``; tasks without a record
    get TVM's defaults) and exports it to ``wd/model.so``; returns the merge's counts."""
    from sharetune_tuner.merge import compile_with
    from sharetune_tuner.model.loader import load
    from sharetune_tuner.store import records
    from sharetune_tuner.targets import make_target

    wd.mkdir(parents=True, exist_ok=True)
    target = make_target(target_kind)
    model = load(name=model_name)
    counts = records.merge(db_dirs, wd / "records", wd / "best")
    ex = compile_with(wd / "best", model, target)
    ex.export_library(str(wd / "model.so"))
    return counts


def prepare(run_id: str, model_name: str, target_kind: str) -> None:
    """Merge, compile the model with the best records, build the improving records."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from sharetune_tuner.build.builder import PooledBuilder
    from sharetune_tuner.targets import make_target

    cell = load_cells(CELLS)[run_id]
    wd = RUN_ROOT / "runs" / run_id / "eval"
    t0 = time.time()
    target = make_target(target_kind)
    counts = compile_model([Path(d) for d in cell["db_dirs"]], model_name, target_kind, wd)
    t_compile = time.time() - t0
    imp = improving_records(cell)
    inputs, keep = [], []
    cache: dict[str, Any] = {}
    for r in imp:
        db = r["db"]
        if db not in cache:
            cache[db] = (_lines(Path(db) / "database_workload.json"), _lines(Path(db) / "database_tuning_record.json"))
        wls, recs = cache[db]
        widx, body = recs[r["index"]]
        wl = ms.database.Workload.from_json(wls[widx])
        rec = ms.database.TuningRecord.from_json(body, wl)
        sch = tvm.s_tir.Schedule(wl.mod)
        rec.trace.apply_to_schedule(sch, remove_postproc=False)
        inputs.append(ms.builder.BuilderInput(sch.mod, target))
        keep.append({**r, "args_info": [a.as_json() for a in rec.args_info]})
    builder = PooledBuilder(max_workers=4, timeout_sec=120, export_shared_lib=True)
    built = builder.build(inputs) if inputs else []
    builder.shutdown()
    for k, b in zip(keep, built):
        k["artifact"] = b.artifact_path
        k["build_error"] = None if b.error_msg is None else b.error_msg[-500:]
    (wd / "prepared.json").write_text(json.dumps({
        "run": run_id, "model_so": str(wd / "model.so"), "merge": counts, "compile_s": round(t_compile, 1),
        "prepare_s": round(time.time() - t0, 1), "improving": keep}))


def prepare_untuned(model_name: str, target_kind: str, path: Path) -> None:
    from sharetune_tuner.merge import compile_with
    from sharetune_tuner.model.loader import load
    from sharetune_tuner.targets import make_target

    compile_with(None, load(name=model_name), make_target(target_kind)).export_library(str(path))


# ---- stage B/C: GPU measurement (subprocesses) -------------------------------------------------
def measure_models(paths: list[str], model_name: str, target_kind: str, repeat: int) -> dict[str, Any]:
    import numpy as np
    import tvm
    from tvm import relax

    from sharetune_tuner.model.loader import load
    from sharetune_tuner.targets import device_for

    model = load(name=model_name)
    dev = device_for(target_kind)
    x = model.sample_input(seed=0)
    args = [tvm.runtime.tensor(x, dev), *[tvm.runtime.tensor(p.numpy(), dev) for p in model.params]]
    out: dict[str, Any] = {}
    ref = None
    for p in paths:
        try:
            vm = relax.VirtualMachine(tvm.runtime.load_module(p), dev)
            y = vm["main"](*args)
            y = (y[0] if isinstance(y, (list, tuple)) or not hasattr(y, "numpy") else y).numpy()
            if ref is None:
                ref = y
            err = float(np.max(np.abs(ref - y)) / (np.max(np.abs(ref)) or 1.0))
            res = vm.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=100)(*args)
            out[p] = {"median_ms": round(float(np.median(res.results)) * 1e3, 4),
                      "min_ms": round(float(np.min(res.results)) * 1e3, 4), "rel_err_vs_first": err}
        except Exception as e:  # one broken model must not hide the others
            out[p] = {"error": f"{type(e).__name__}: {e}"[-800:]}
    return out


def measure_records(prepared: list[dict[str, Any]], target_kind: str) -> dict[str, Any]:
    from tvm.s_tir import meta_schedule as ms

    runner = ms.runner.LocalRunner(timeout_sec=60, evaluator_config=ms.runner.EvaluatorConfig(
        number=5, repeat=3, min_repeat_ms=50))
    dev_type = "cuda" if target_kind == "cuda" else "cpu"
    out: dict[str, Any] = {}
    for prep in prepared:
        items = [r for r in prep["improving"] if r.get("artifact")]
        inputs = [ms.runner.RunnerInput(r["artifact"], dev_type,
                                        [ms.arg_info.ArgInfo.from_json(a) for a in r["args_info"]]) for r in items]
        res = runner.run(inputs) if inputs else []
        vals = []
        for r in res:
            rr = r.result()
            if rr.error_msg is None:
                secs = sorted(float(s) for s in rr.run_secs)
                vals.append(secs[len(secs) // 2])
            else:
                vals.append(None)
        out[prep["run"]] = vals
    return out


def _sub(args: list[str], env: dict[str, str], timeout: float) -> Any:
    r = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"{args[0]} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="", help="comma list of tuning cell ids (default: all not evaluated)")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--target", default="cuda")
    ap.add_argument("--serve", default="10,25,50,75,100", help="MPS serving percentages ('' = none)")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--stage", default="all", help=argparse.SUPPRESS)
    ap.add_argument("--arg", default="", help=argparse.SUPPRESS)
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args()

    if a.stage == "prepare":
        prepare(a.arg, a.model, a.target)
        return 0
    if a.stage == "untuned":
        prepare_untuned(a.model, a.target, Path(a.arg))
        return 0
    if a.stage == "models":
        print(json.dumps(measure_models(a.arg.split(","), a.model, a.target, a.repeat)))
        return 0
    if a.stage == "records":
        preps = [json.loads(Path(p).read_text()) for p in a.arg.split(",")]
        print(json.dumps(measure_records(preps, a.target)))
        return 0

    os.environ.update(tuner_env())
    env = dict(os.environ)
    cells = load_cells(CELLS)
    done = load_cells(EVAL)
    runs = [r for r in (a.runs.split(",") if a.runs else list(cells)) if r and r in cells
            and cells[r]["model"] == a.model and (a.force or f"eval-{r}" not in done)
            and all((Path(d) / "database_tuning_record.json").exists() for d in cells[r]["db_dirs"])]
    if not runs:
        log("evaluate: nothing to do")
        return 0
    t0 = time.time()
    log(f"evaluate: {runs}")
    # stage A: CPU, in parallel
    untuned = RUN_ROOT / f"untuned-{a.model}-{a.target}.so"
    procs = {r: subprocess.Popen([sys.executable, __file__, "--stage", "prepare", "--arg", r, "--model", a.model,
                                  "--target", a.target], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True) for r in runs}
    if not untuned.exists():
        procs["__untuned__"] = subprocess.Popen([sys.executable, __file__, "--stage", "untuned", "--arg", str(untuned),
                                                 "--model", a.model, "--target", a.target], env=env,
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    failed = {}
    for r, p in procs.items():
        _, err = p.communicate(timeout=480)
        if p.returncode != 0:
            failed[r] = err[-3000:]
            log(f"prepare {r} failed:\n{err[-3000:]}")
    runs = [r for r in runs if r not in failed]
    t_prep = time.time() - t0
    preps = {r: json.loads((RUN_ROOT / "runs" / r / "eval" / "prepared.json").read_text()) for r in runs}
    paths = [str(untuned)] + [preps[r]["model_so"] for r in runs]
    log(f"prepared in {t_prep:.0f} s")
    # stage B: whole GPU, no MPS daemon
    full = _sub(["--stage", "models", "--arg", ",".join(paths), "--model", a.model, "--target", a.target,
                 "--repeat", str(a.repeat)], env, 300)
    recs = _sub(["--stage", "records", "--arg", ",".join(str(RUN_ROOT / "runs" / r / "eval" / "prepared.json")
                                                          for r in runs), "--target", a.target], env, 300)
    log("measured at 100% (no MPS)")
    # stage C: under MPS, one process per serving share
    by_pct: dict[int, Any] = {}
    pcts = [int(x) for x in a.serve.split(",") if x.strip()] if a.target == "cuda" else []
    if pcts:
        mps_start()
        try:
            for pct in pcts:
                e = {**env, **mps_env(), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(pct)}
                by_pct[pct] = _sub(["--stage", "models", "--arg", ",".join(paths), "--model", a.model,
                                    "--target", a.target, "--repeat", str(a.repeat)], e, 300)
                log(f"measured under MPS at {pct}%")
        finally:
            mps_stop()
    for r in runs:
        p = preps[r]["model_so"]
        imp = preps[r]["improving"]
        cell = {
            "id": f"eval-{r}", "run": r, "model": a.model, "target": a.target,
            "e2e_100_nomps": full.get(p), "untuned_100_nomps": full.get(str(untuned)),
            "e2e_by_serve_pct": {str(k): v.get(p) for k, v in by_pct.items()},
            "untuned_by_serve_pct": {str(k): v.get(str(untuned)) for k, v in by_pct.items()},
            "merge": preps[r]["merge"], "compile_s": preps[r]["compile_s"],
            "improving": [{k: x[k] for k in ("db", "index", "t", "workload", "tuned_s", "build_error")}
                          | {"remeasured_100_s": v} for x, v in zip(imp, recs.get(r, []))],
            "eval_wall_s": round(time.time() - t0, 1),
        }
        append_cell(EVAL, cell)
        log(f"eval {r}: e2e {cell['e2e_100_nomps']}")
    for r, err in failed.items():
        append_cell(EVAL, {"id": f"eval-failed-{r}-{int(time.time())}", "run": r, "error": err})
    return 0


if __name__ == "__main__":
    sys.exit(main())
