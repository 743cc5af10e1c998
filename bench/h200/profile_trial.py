"""Where one trial's time goes on the GPU machine: search, build (lowering + NVRTC + export),
and measurement through RPC (session, upload, load, allocation, timing, clean-up), for the stock
path and for sharetune's (pooled builder linking .so, one session kept per runner worker).
Appends one cell to ``h200-profile.jsonl``.

  python bench/h200/profile_trial.py [--target cuda] [--model resnet18]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from common import RUN_ROOT, Group, append_cell, free_port, gpu_name, load_cells, log, tuner_env

CELLS = "h200-profile.jsonl"


def _t(f: Any, *args: Any, **kw: Any) -> tuple[Any, float]:
    t = time.perf_counter()
    r = f(*args, **kw)
    return r, time.perf_counter() - t


def _stats(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    return {"mean_s": round(statistics.mean(xs), 4), "median_s": round(statistics.median(xs), 4),
            "min_s": round(min(xs), 4), "max_s": round(max(xs), 4), "n": len(xs)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--id", default="profile-r18")
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--target", default="cuda")
    ap.add_argument("--n-run", type=int, default=6, help="candidates measured step by step")
    ap.add_argument("--n-build", type=int, default=16)
    ap.add_argument("--search", default="512:64,256:8,128:8",
                    help="population:batch of the first search rounds timed (first = stock, second = sharetune)")
    ap.add_argument("--force", action="store_true")
    a = ap.parse_args()
    if a.id in load_cells(CELLS) and not a.force:
        log(f"{a.id}: already done")
        return 0
    os.environ.update(tuner_env())
    out: dict[str, Any] = {"id": a.id, "model": a.model, "target": a.target, "gpu": gpu_name(),
                           "cpu_count": os.cpu_count(), "errors": []}
    wd = RUN_ROOT / "runs" / a.id
    wd.mkdir(parents=True, exist_ok=True)
    g = Group(wd / "logs")
    try:
        _profile(a, out, g, wd)
    except Exception:
        out["errors"].append(traceback.format_exc()[-3000:])
        log(traceback.format_exc())
    finally:
        g.stop()
    append_cell(CELLS, out)
    return 0


def _profile(a: argparse.Namespace, out: dict[str, Any], g: Group, wd: Path) -> None:
    t = time.perf_counter()
    import tvm_ffi
    from tvm import rpc
    from tvm.s_tir import meta_schedule as ms

    out["import_tvm_s"] = round(time.perf_counter() - t, 3)
    out["torch_importable"] = _torch_importable()
    from common import heaviest
    from sharetune_tuner.build.builder import PooledBuilder, export_shared
    from sharetune_tuner.client import wait_for_tracker
    from sharetune_tuner.measure.runner import SessionRPCRunner
    from sharetune_tuner.model.loader import load
    from sharetune_tuner.model.tasks import extract
    from sharetune_tuner.targets import make_target

    env = tuner_env()
    port = free_port()
    key = "profile"
    g.start("tracker", [sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
                        "--port-end", str(port + 1), "--silent"], env)
    time.sleep(1.0)
    g.start("server", [sys.executable, "-m", "tvm.exec.rpc_server", "--tracker", f"127.0.0.1:{port}", "--key", key,
                       "--host", "127.0.0.1", "--port", "9400", "--port-end", "9430", "--silent"], env)

    target = make_target(a.target)
    out["target_json"] = str(target)
    model, dt = _t(load, name=a.model)
    out["model_load_s"] = round(dt, 2)
    tasks, dt = _t(extract, model.mod, target)
    out["extract_s"] = round(dt, 2)
    out["n_tasks"] = len(tasks)
    task = heaviest(tasks, 1)[0]
    out["task"] = {"name": task.info.name, "flops": task.info.flops, "weight": task.info.weight}
    log(f"task {task.info.name}; {len(tasks)} tasks; extract {out['extract_s']} s")
    wait_for_tracker("127.0.0.1", port, key, 60.0)

    # ---- search ----------------------------------------------------------------------------
    search: dict[str, Any] = {}
    cands_by: dict[str, list[Any]] = {}
    configs = [tuple(int(x) for x in c.split(":")) for c in a.search.split(",")]
    for pop, batch in configs:
        label = f"pop{pop}_batch{batch}"
        ctx = ms.TuneContext(task.workload, target=target, space_generator="post-order-apply",
                             search_strategy=ms.search_strategy.EvolutionarySearch(population_size=pop),
                             task_name=task.info.name, rand_state=0, num_threads=os.cpu_count() or 1)
        spaces, dt_space = _t(ctx.generate_design_space)
        cm = ms.CostModel.create("xgb", num_tuning_cores=os.cpu_count() or 1)
        ctx.pre_tuning(max_trials=256, num_trials_per_iter=batch, design_spaces=spaces,
                       database=ms.database.MemoryDatabase(), cost_model=cm)
        cands, dt = _t(ctx.generate_measure_candidates)
        search[label] = {"design_spaces": len(spaces), "design_space_s": round(dt_space, 3),
                         "first_round_s": round(dt, 3), "candidates": len(cands or []),
                         "per_candidate_s": round(dt / max(1, len(cands or [])), 4)}
        cands_by[label] = list(cands or [])
        log(f"search {label}: {search[label]}")
    out["search"] = search
    labels = list(search)
    cands = cands_by[labels[0]][: a.n_build]

    # ---- build: one candidate at a time, in this process -----------------------------------
    from tvm.support import nvcc

    nvrtc_times: list[float] = []
    orig = nvcc.tvm_callback_cuda_compile

    def timed(code: Any) -> Any:
        t = time.perf_counter()
        try:
            return orig(code)
        finally:
            nvrtc_times.append(time.perf_counter() - t)

    if a.target == "cuda":
        tvm_ffi.register_global_func("tvm_callback_cuda_compile", timed, override=True)
    compile_s, tar_s, so_s = [], [], []
    from tvm.s_tir.meta_schedule.builder.local_builder import default_build, default_export

    for c in cands[:4]:
        lib, dt = _t(default_build, c.sch.mod, target, None)
        compile_s.append(dt)
        _, dt = _t(default_export, lib)
        tar_s.append(dt)
        _, dt = _t(export_shared, lib)
        so_s.append(dt)
    if a.target == "cuda":
        tvm_ffi.register_global_func("tvm_callback_cuda_compile", orig, override=True)
    out["build_one"] = {"compile_total": _stats(compile_s), "nvrtc_in_compile": _stats(nvrtc_times),
                        "export_tar": _stats(tar_s), "export_so": _stats(so_s)}
    log(f"build one: {out['build_one']}")

    # ---- build: a batch through the builders -----------------------------------------------
    inputs = [ms.builder.BuilderInput(c.sch.mod, target) for c in cands]
    stock_b = ms.builder.LocalBuilder()
    res_tar, dt = _t(stock_b.build, inputs)
    pooled = PooledBuilder(max_workers=os.cpu_count() or 1, export_shared_lib=True)
    _, dt_cold = _t(pooled.build, inputs)  # starts the pool's workers
    res_so, dt_warm = _t(pooled.build, inputs)
    out["build_batch"] = {"n": len(inputs), "stock_local_builder_s": round(dt, 3),
                          "pooled_cold_s": round(dt_cold, 3), "pooled_warm_s": round(dt_warm, 3),
                          "stock_errors": sum(r.error_msg is not None for r in res_tar),
                          "pooled_errors": sum(r.error_msg is not None for r in res_so)}
    if res_so and res_so[0].error_msg:
        out["errors"].append("pooled build: " + res_so[0].error_msg[-1500:])
    if res_tar and res_tar[0].error_msg:
        out["errors"].append("stock build: " + res_tar[0].error_msg[-1500:])
    log(f"build batch: {out['build_batch']}")

    ok = [(c, rt, rs) for c, rt, rs in zip(cands, res_tar, res_so) if rt.error_msg is None and rs.error_msg is None]
    dev_type = "cuda" if a.target == "cuda" else "cpu"
    from tvm.s_tir.meta_schedule.runner.utils import alloc_argument_common, run_evaluator_common

    # ---- run: stock, a session per candidate, step by step ----------------------------------
    steps: dict[str, list[float]] = {k: [] for k in ("connect", "upload", "load_module_tar", "alloc_args",
                                                      "evaluate_min100ms", "cleanup", "close", "total")}
    kernel_s: list[float] = []
    for c, rt, _ in ok[: a.n_run]:
        t_all = time.perf_counter()
        tracker = rpc.connect_tracker("127.0.0.1", port)
        sess, dt = _t(tracker.request, key, priority=1, session_timeout=30)
        steps["connect"].append(dt)
        dev = sess.device(dev_type, 0)
        remote = os.path.basename(rt.artifact_path)
        _, dt = _t(sess.upload, rt.artifact_path, remote)
        steps["upload"].append(dt)
        mod, dt = _t(sess.load_module, remote)
        steps["load_module_tar"].append(dt)
        fill = sess.get_function("tvm.contrib.random.random_fill_for_measure")
        args, dt = _t(alloc_argument_common, fill, dev, [x.as_json() for x in c.args_info], 1)
        steps["alloc_args"].append(dt)
        costs, dt = _t(run_evaluator_common, mod, dev, ms.runner.EvaluatorConfig(), args)
        steps["evaluate_min100ms"].append(dt)
        kernel_s.append(statistics.mean(costs))
        del mod, args

        _, dt = _t(lambda s=sess: (s.remove(remote), s.remove(remote + ".so"), s.remove("")))
        steps["cleanup"].append(dt)
        t = time.perf_counter()
        del sess, dev, fill
        steps["close"].append(time.perf_counter() - t)
        steps["total"].append(time.perf_counter() - t_all)
    out["run_stock_steps"] = {k: _stats(v) for k, v in steps.items()}
    out["kernel_s"] = _stats(kernel_s)
    log(f"run stock steps: {out['run_stock_steps']}")

    # ---- run: one session, .so artifacts ----------------------------------------------------
    psteps: dict[str, list[float]] = {k: [] for k in ("upload", "load_module_so", "alloc_args", "evaluate_min20ms",
                                                       "remove", "total")}
    tracker = rpc.connect_tracker("127.0.0.1", port)
    sess, dt = _t(tracker.request, key, priority=1, session_timeout=0)
    out["persistent_connect_s"] = round(dt, 3)
    dev = sess.device(dev_type, 0)
    fill = sess.get_function("tvm.contrib.random.random_fill_for_measure")
    args = None
    for i, (c, _, rs) in enumerate(ok[: a.n_run]):
        t_all = time.perf_counter()
        remote = f"p{i}_{os.path.basename(rs.artifact_path)}"
        _, dt = _t(sess.upload, rs.artifact_path, remote)
        psteps["upload"].append(dt)
        mod, dt = _t(sess.load_module, remote)
        psteps["load_module_so"].append(dt)
        if args is None:
            args, dt = _t(alloc_argument_common, fill, dev, [x.as_json() for x in c.args_info], 1)
            out["persistent_first_alloc_s"] = round(dt, 3)
        psteps["alloc_args"].append(0.0)
        _, dt = _t(run_evaluator_common, mod, dev, ms.runner.EvaluatorConfig(min_repeat_ms=20), args)
        psteps["evaluate_min20ms"].append(dt)
        del mod
        _, dt = _t(sess.remove, remote)
        psteps["remove"].append(dt)
        psteps["total"].append(time.perf_counter() - t_all)
    del sess, dev, fill, args
    out["run_session_steps"] = {k: _stats(v) for k, v in psteps.items()}
    log(f"run session steps: {out['run_session_steps']}")

    # ---- run: the runners end to end on a batch --------------------------------------------
    rcfg = ms.runner.RPCConfig(tracker_host="127.0.0.1", tracker_port=port, tracker_key=key, session_timeout_sec=30)
    batch_tar = [ms.runner.RunnerInput(rt.artifact_path, dev_type, c.args_info) for c, rt, _ in ok]
    batch_so = [ms.runner.RunnerInput(rs.artifact_path, dev_type, c.args_info) for c, _, rs in ok]
    stock_r = ms.runner.RPCRunner(rpc_config=rcfg)
    t = time.perf_counter()
    rr = [f.result() for f in stock_r.run(batch_tar)]
    dt_stock = time.perf_counter() - t
    sess_r = SessionRPCRunner(rcfg, ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=20), max_workers=1)
    t = time.perf_counter()
    rs1 = [f.result() for f in sess_r.run(batch_so)]
    dt_sess_cold = time.perf_counter() - t
    t = time.perf_counter()
    rs2 = [f.result() for f in sess_r.run(batch_so)]
    dt_sess_warm = time.perf_counter() - t
    sess_r.pool.shutdown()
    stock_r.pool.shutdown()
    n = max(1, len(ok))
    out["runner_batch"] = {
        "n": len(ok), "stock_rpc_runner_s": round(dt_stock, 3), "stock_per_candidate_s": round(dt_stock / n, 4),
        "session_runner_first_s": round(dt_sess_cold, 3), "session_runner_warm_s": round(dt_sess_warm, 3),
        "session_per_candidate_s": round(dt_sess_warm / n, 4),
        "stock_errors": sum(r.error_msg is not None for r in rr),
        "session_errors": sum(r.error_msg is not None for r in rs1 + rs2),
        "stock_kernel_s": [round(statistics.mean([float(x) for x in r.run_secs]), 7) for r in rr
                           if r.error_msg is None][:8],
        "session_kernel_s": [round(statistics.mean([float(x) for x in r.run_secs]), 7) for r in rs2
                             if r.error_msg is None][:8],
    }
    for r in rr + rs1:
        if r.error_msg is not None:
            out["errors"].append("runner: " + r.error_msg[-1500:])
            break
    log(f"runner batch: {out['runner_batch']}")

    # ---- per-trial estimate -----------------------------------------------------------------
    s_stock = search[labels[0]]["per_candidate_s"]
    s_st = search[labels[min(1, len(labels) - 1)]]["per_candidate_s"]
    b_stock = out["build_batch"]["stock_local_builder_s"] / max(1, len(inputs))
    b_st = out["build_batch"]["pooled_warm_s"] / max(1, len(inputs))
    out["per_trial_estimate_s"] = {
        "stock": {"search": s_stock, "build": round(b_stock, 4), "run": out["runner_batch"]["stock_per_candidate_s"],
                  "total": round(s_stock + b_stock + out["runner_batch"]["stock_per_candidate_s"], 4)},
        "sharetune_one_client": {"search": s_st, "build": round(b_st, 4),
                                 "run": out["runner_batch"]["session_per_candidate_s"],
                                 "total": round(s_st + b_st + out["runner_batch"]["session_per_candidate_s"], 4)},
        "note": "serial sum for one client: search (first round, untrained model) / batch + builder batch / n + "
                "runner batch / n. Within a client these phases do not overlap; clients overlap each other.",
    }
    log(f"per trial: {out['per_trial_estimate_s']}")


def _torch_importable() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("torch") is not None and __import__("torch") is not None
    except ImportError:
        return False


if __name__ == "__main__":
    sys.exit(main())
