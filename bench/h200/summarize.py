"""Turns the H200 cells (bench/results/h200-*.jsonl) into h200-tuning.json,
h200-quality-matrix.json and h200-tuning.png. Runs anywhere (no GPU, no TVM).

  python bench/h200/summarize.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "results"


def _cells(name: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    p = RESULTS / name
    if p.exists():
        for line in p.read_text().splitlines():
            if line.strip():
                c = json.loads(line)
                out[c["id"]] = c
    return out


def kernel_curve(ev: dict[str, Any], weights: dict[str, int]) -> list[tuple[float, float]]:
    """(t, sum over the tuned tasks of calls x kernel latency at 100% of the best-so-far record):
    defined once every task has a valid record."""
    best: dict[str, float] = {}
    out = []
    for x in ev["improving"]:
        if x.get("remeasured_100_s") is None:
            continue
        best[x["workload"]] = x["remeasured_100_s"]
        if all(h in best for h in weights):
            out.append((x["t"], sum(w * best[h] for h, w in weights.items())))
    return out


def first_time_below(curve: list[tuple[float, float]], threshold: float) -> float | None:
    for t, v in curve:
        if v <= threshold:
            return t
    return None


def main() -> int:
    cells, evals, prof = _cells("h200-cells.jsonl"), _cells("h200-eval.jsonl"), _cells("h200-profile.jsonl")
    ev = {e["run"]: e for e in evals.values() if "run" in e and "error" not in e}
    base = next(c for c in cells.values() if c["mode"] == "baseline")
    weights = {t["workload_hash"]: t["weight"] for t in base["tasks"]}
    base_ev = ev.get(base["id"])
    base_curve = kernel_curve(base_ev, weights) if base_ev else []
    base_e2e = base_ev["e2e_100_nomps"]["median_ms"] if base_ev else None
    base_kernel_final = base_curve[-1][1] if base_curve else None
    base_t_own = first_time_below(base_curve, 1.05 * base_kernel_final) if base_curve else None

    configs = []
    for c in cells.values():
        e = ev.get(c["id"])
        curve = kernel_curve(e, weights) if e else []
        row: dict[str, Any] = {
            "id": c["id"], "mode": c["mode"], "clients_M": c["clients"], "servers_N": c["servers"],
            "thread_pct_P": c["thread_pct"], "mps": c.get("mps", False),
            "population_per_candidate": c.get("pop_per_cand") if c["mode"] == "sharetune" else 8,
            "candidates_per_round": c["per_iter"],
            "builder": c.get("builder", "PooledBuilder(default_build: imports tensor_intrin), export .so")
            if c["mode"] == "sharetune" else "LocalBuilder (stock: fresh pool per batch)",
            "runner": "SessionRPCRunner" if c["mode"] == "sharetune" else "RPCRunner (stock, max_workers=1)",
            "trials": c["records"], "budget": c["budget"], "failed_trials": c["failed"],
            "wall_s": c["wall_s"], "first_record_s": c["first_record_s"],
            "trials_per_s": c["trials_per_s"],
            "trials_per_s_after_first_record": round(c["records"] / max(c["wall_s"] - c["first_record_s"], 1e-9), 3),
            "cpu_util_mean_pct": c["cpu_util_mean"], "gpu_util_mean_pct": c["gpu_util_mean"],
            "throughput_ratio": round(c["trials_per_s"] / base["trials_per_s"], 3),
        }
        if e:
            row["e2e_latency_ms_100pct_no_mps"] = e["e2e_100_nomps"]["median_ms"]
            row["latency_ratio"] = round(e["e2e_100_nomps"]["median_ms"] / base_e2e, 4) if base_e2e else None
            row["e2e_within_5pct_of_baseline"] = bool(base_e2e and e["e2e_100_nomps"]["median_ms"] <= 1.05 * base_e2e)
            if curve and base_kernel_final:
                t_q = first_time_below(curve, 1.05 * base_kernel_final)
                row["tuned_kernels_latency_us_final"] = round(curve[-1][1] * 1e6, 1)
                row["kernel_proxy_time_to_quality_s"] = t_q
                row["kernel_proxy_time_to_quality_ratio"] = round(base_t_own / t_q, 3) if t_q and base_t_own else None
            # The stated metric: time to an end-to-end latency within 5% of the baseline's final one.
            # Only final models were measured end to end: a run that ends above the threshold never
            # reached it within its budget.
            row["time_to_quality_ratio"] = (round(base["wall_s"] / c["wall_s"], 3)
                                            if row["e2e_within_5pct_of_baseline"] else None)
        configs.append(row)

    st = [r for r in configs if r["mode"] == "sharetune"]
    best = max(st, key=lambda r: (r.get("e2e_within_5pct_of_baseline", False), r["throughput_ratio"]))
    p = next(iter(prof.values()), {})
    out = {
        "what": "ResNet-18 (sharetune zoo, batch 1, 224x224, fp32), its 6 heaviest tasks (conv2d+bias+relu "
                "fusions, by FLOPs x calls), 16 trials each (96 in total), target cuda sm_90a "
                "(targets.make_target('cuda')), one NVIDIA H200 (driver 580.159.04), 16 CPU cores; "
                "xgb cost model, evolutionary search, seed 0 in both arms. Baseline: stock "
                "MetaSchedule tune_tasks, one process, LocalBuilder on all cores, one RPCRunner worker, one "
                "RPC server on the whole GPU, no MPS, 64 candidates per batch, population 512, gradient task "
                "scheduler, RPC session timeout 30 s (stock 10 s). sharetune: local topology (sharetune_tuner.local "
                "processes), M clients on LPT shards of the 6 tasks, N RPC servers under one MPS daemon at P% "
                "each, 8 candidates per round, one RPC session per client and server "
                "(runner.SessionRPCRunner), builds linked by the builder. Torch hidden from every tuner process.",
        "how_measured": {
            "wall_s": "from starting the first process of the topology (tracker/servers/MPS daemon) to the "
                      "last client's exit; includes model load, task extraction and process start-up",
            "trials_per_s": "records written (failed trials included) / wall_s",
            "record times": "a record counts from the moment it is in the database file (polled every "
                            "0.5 s); stock tune_tasks commits a task's batch when it joins its runner futures, "
                            "which with one 16-trial batch per task happens at the end of the run",
            "cpu_util": "psutil.cpu_percent of the whole machine every 0.5 s during wall_s",
            "gpu_util": "NVML utilization.gpu every 0.5 s during wall_s",
            "e2e latency": "compile_relax with the run's best record per task (other 17 tasks: TVM's default "
                           "GPU schedules, identical in all runs), relax VM, median of 10 x >=100 ms, "
                           "no MPS daemon, whole GPU",
            "kernel proxy": "sum over the 6 tuned tasks of calls x kernel latency of the best-so-far record, "
                            "the records re-measured in isolation at 100% (LocalRunner, no MPS); curves in "
                            "h200-eval.jsonl 'improving'",
        },
        "baseline": next(r for r in configs if r["mode"] == "baseline"),
        "best_sharetune": best,
        "sweep": configs,
        "goals": {"throughput_ratio": ">= 5", "time_to_quality_ratio": ">= 4", "latency_ratio": "<= 1.05",
                  "cpu_util": ">= 85%"},
        "goals_met": {
            "throughput_ratio": best["throughput_ratio"] >= 5,
            "time_to_quality_ratio": bool(best.get("time_to_quality_ratio") and best["time_to_quality_ratio"] >= 4),
            "latency_ratio": bool(best.get("latency_ratio") and best["latency_ratio"] <= 1.05),
            "cpu_util": bool(best["cpu_util_mean_pct"] and best["cpu_util_mean_pct"] >= 85),
        },
        "profile_one_trial": {k: p.get(k) for k in ("search", "build_one", "build_batch", "run_stock_steps",
                                                    "run_session_steps", "runner_batch", "per_trial_estimate_s",
                                                    "import_tvm_s", "torch_importable")},
        "findings": [
            "NVRTC runs in the builder, not at module load: the runtime CUDA plugin is loaded on the GPU "
            "machine, so tvm.compile JIT-compiles each candidate (1.74 s of a 1.88 s build) and ships a cubin; "
            "loading it on the server takes 0.5 ms (.so) / 22 ms (.tar, linked there).",
            "Stock LocalBuilder: 33.4 s for a batch of 16 (3 of 16 timed out at 30 s) against 3.2 s for a warm "
            "pool: every fresh builder worker runs `import tvm.s_tir.tensor_intrin` (MetaSchedule's "
            "default_build does), which parses every target's tensor intrinsics from TVMScript (~10 s of CPU "
            "for CUDA's alone, 14.5 s measured on the CPU machine). In the baseline SendToBuilder took 195 s "
            "of 354 s and 18 of 96 trials failed with 'LocalBuilder: Timeout, killed after 30.0 seconds'.",
            "Stock RPCRunner: 0.67 s per candidate (a new session each time: 0.15 s to get it through the "
            "tracker, 0.24 s for the first allocation, which creates the session process's CUDA context, "
            "0.27 s of timing at >= 100 ms) against 0.05 s with one session kept per worker "
            "(SessionRPCRunner) and 20 ms minimum timing; kernels themselves take 0.1-1.4 ms.",
            "Search: a first evolutionary round costs 19.6 s for population 512 / 64 candidates, 12.5 s for "
            "256 / 8 and 8.1 s for 128 / 8 on 16 cores, i.e. 0.31, 1.57, 1.01 s per candidate: the client's "
            "32-per-candidate population made search the largest per-trial cost; now 8 per candidate.",
            "GPU utilisation stays at 2-4% in every configuration: the GPU is idle; tuning is CPU-bound "
            "(search and NVRTC), so MPS shares do not limit throughput.",
            "Tuning at a 10% MPS share picks schedules that are faster at 10% and slower at 100% (see the "
            "quality matrix); kernel latencies measured at 10% rank candidates differently from 100%.",
            "Isolated kernel timings (how both arms rank candidates) do not predict in-model latency here: "
            "st-r18-m6n6p100's 6 tuned kernels sum to 895 us in isolation against the baseline's 971 us, yet "
            "its model is 245 us slower end to end, with only those 6 kernels differing (checked by compiling "
            "both). The kernel proxy is therefore reported, labelled, and not used for the headline metric.",
        ],
        "not_done": [
            "ResNet-50: not run (device time).",
            "Sweep reduced to M=N=6 with P in {10, 100} (plus a population ablation); the planned (3,3,25), "
            "(2,2,50), (1,1,100), (2,2,75), (3,6,25) cells (bench/h200/sweep.py) were not run.",
            "The two P=10 sharetune runs used the earlier builder (default_build with the tensor_intrin import) "
            "and, for st-r18-m6n6p10, the 32-per-candidate population; only st-r18-m6n6p100 ran the final code.",
            "End-to-end latency measured only for the final models, not at intermediate times.",
            "st-r18-m6n6p100 wrote 88 of 96 budgeted trials (one shard's search returned fewer candidates).",
            "One run per configuration, seed 0: no variance estimate.",
        ],
    }
    (RESULTS / "h200-tuning.json").write_text(json.dumps(out, indent=2))

    # ---- quality matrix ------------------------------------------------------------------------
    rows = []
    for r in configs:
        e = ev.get(r["id"])
        if not e or not e.get("e2e_by_serve_pct"):
            continue
        rows.append({"run": r["id"], "mode": r["mode"], "tuned_at_pct": r["thread_pct_P"],
                     "tuned_under_mps": r["mps"],
                     "latency_ms_by_serve_pct": {k: (v or {}).get("median_ms") for k, v in e["e2e_by_serve_pct"].items()},
                     "latency_ms_100pct_no_mps": e["e2e_100_nomps"]["median_ms"]})
    untuned = next((e["untuned_by_serve_pct"] for e in ev.values() if e.get("untuned_by_serve_pct")), {})
    serve = sorted({int(k) for r in rows for k in r["latency_ms_by_serve_pct"]})

    def slowdowns(sub: list[dict[str, Any]]) -> dict[str, Any]:
        best_at = {s: min(r["latency_ms_by_serve_pct"][str(s)] for r in sub) for s in serve}
        res = {}
        for r in sub:
            sd = {str(s): round(r["latency_ms_by_serve_pct"][str(s)] / best_at[s], 4) for s in serve}
            res[r["run"]] = {"tuned_at_pct": r["tuned_at_pct"], "slowdown_by_serve_pct": sd,
                             "worst_case_slowdown": max(sd.values())}
        rec = min(res.items(), key=lambda kv: kv[1]["worst_case_slowdown"])
        return {"per_run": res, "recommended_run": rec[0], "recommended_tuning_pct": rec[1]["tuned_at_pct"],
                "worst_case_slowdown": rec[1]["worst_case_slowdown"]}

    qm = {
        "what": "ResNet-18 tuned (6 heaviest tasks x 16 trials) at tuning share P_t, served at share P_s: "
                "end-to-end latency (ms, median) of the whole model in a process with "
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=P_s under one MPS daemon, nothing else on the GPU.",
        "reduced": "P_t measured: 10 (two sharetune runs) and 100 (the stock baseline, no MPS; sharetune with 6 "
                   "servers at 100% under MPS). P_t in {25, 50, 75} not run (device time). Rows also differ in "
                   "search settings (see h200-tuning.json), so P_t is not the only variable.",
        "serve_pcts": serve,
        "rows": rows,
        "untuned_ms_by_serve_pct": {k: (v or {}).get("median_ms") for k, v in untuned.items()},
        "slowdown": "latency / the fastest row at the same P_s",
        "all_runs": slowdowns(rows) if rows else None,
        "sharetune_runs_only": slowdowns([r for r in rows if r["mode"] == "sharetune"]) if rows else None,
    }
    (RESULTS / "h200-quality-matrix.json").write_text(json.dumps(qm, indent=2))
    _plot(configs, ev, weights, base, qm)
    print(json.dumps({"best": best["id"], "throughput_ratio": best["throughput_ratio"],
                      "latency_ratio": best.get("latency_ratio"), "time_to_quality_ratio": best.get("time_to_quality_ratio"),
                      "recommended_tuning_pct": qm["all_runs"] and qm["all_runs"]["recommended_tuning_pct"]}, indent=1))
    return 0


def _plot(configs: list[dict[str, Any]], ev: dict[str, Any], weights: dict[str, int], base: dict[str, Any],
          qm: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(17, 4.8))
    names = [c["id"].replace("-r18", "") for c in configs]
    ax[0].bar(names, [c["trials_per_s"] for c in configs], color=["grey" if c["mode"] == "baseline" else "tab:blue"
                                                                   for c in configs])
    for i, c in enumerate(configs):
        ax[0].text(i, c["trials_per_s"], f"{c['throughput_ratio']:.2f}x\ncpu {c['cpu_util_mean_pct']:.0f}%",
                   ha="center", va="bottom", fontsize=8)
    ax[0].set_ylabel("trials / s (wall, start-up included)")
    ax[0].set_title("H200, ResNet-18 6 tasks x 16 trials")
    ax[0].tick_params(axis="x", rotation=25, labelsize=8)
    for c in configs:
        e = ev.get(c["id"])
        if not e:
            continue
        curve = kernel_curve(e, weights)
        if curve:
            ax[1].step([t for t, _ in curve] + [c["wall_s"]],
                       [v * 1e6 for _, v in curve] + [curve[-1][1] * 1e6],
                       where="post", label=c["id"].replace("-r18", ""))
    ax[1].set_xlabel("s since start")
    ax[1].set_ylabel("sum calls x kernel latency @100% (us)")
    ax[1].set_title("tuned kernels, best so far (isolated re-measure;\nfrom when every task has a record)", fontsize=10)
    ax[1].legend(fontsize=7)
    rows = qm["rows"]
    serve = qm["serve_pcts"]
    if rows:
        data = [[r["latency_ms_by_serve_pct"][str(s)] for s in serve] for r in rows]
        im = ax[2].imshow(data, cmap="viridis_r", aspect="auto")
        ax[2].set_xticks(range(len(serve)), [f"{s}%" for s in serve])
        ax[2].set_yticks(range(len(rows)), [f"{r['run'].replace('-r18', '')} (P_t={r['tuned_at_pct']})" for r in rows],
                         fontsize=8)
        for i, row in enumerate(data):
            for j, v in enumerate(row):
                ax[2].text(j, i, f"{v:.2f}", ha="center", va="center", color="w", fontsize=8)
        ax[2].set_xlabel("serving share P_s (MPS)")
        ax[2].set_title("end-to-end latency (ms)")
        fig.colorbar(im, ax=ax[2])
    fig.tight_layout()
    fig.savefig(RESULTS / "h200-tuning.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
