"""Turns the H200 cells (bench/results/h200-*.jsonl) into h200-tuning.json,
h200-quality-matrix.json and h200-tuning.png. Runs anywhere (no GPU, no TVM).

  python bench/h200/summarize.py
"""

from __future__ import annotations

import json
import statistics
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


# These -r6 cells ran on a second machine (the intrinsics cache took 29.9 s there against 20.1 s on
# base-r18-r6's), together with the -r7 cells, not with base-r18-r6. Their throughput is compared
# with the other cells of that machine only (SHARED_BUILDER_AB); their latency ratio stands (every r6
# run, the baseline's included, was evaluated together on that machine).
OTHER_MACHINE = {"st-r18-m6n6p50-i16-w6-r6", "st-r18-m6n6p50-i16-s1-r6", "st-r18-m6n6p50-i16-rep-r6"}


def group_rows(cells: dict[str, dict[str, Any]], ev: dict[str, Any], base: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per cell of a round, each against that round's baseline (same machine, same day)."""
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
            "id": c["id"], "mode": c["mode"], "model": c["model"], "round": c.get("round"), "seed": c.get("seed", 0),
            "clients_M": c["clients"], "servers_N": c["servers"],
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
            "throughput_ratio": (None if c["id"] in OTHER_MACHINE
                                 else round(c["trials_per_s"] / base["trials_per_s"], 3)),
            "builder_workers": c.get("builder_workers"),
            "shared_builder": bool(c.get("shared_builder")),
        }
        if c["id"] in OTHER_MACHINE:
            row["machine"] = "the r6 cells' second machine (with the r7 cells): no baseline there"
        if c.get("client_startup"):
            st = c["client_startup"]
            row["client_startup_s"] = {k: round(max(x.get(k, 0.0) for x in st), 2)
                                       for k in ("before_run_client_s", "extract_s", "intrinsics_s", "tracker_wait_s")}
            row["client_startup_s"]["intrinsics_from"] = sorted({x.get("intrinsics") for x in st
                                                                 if x.get("intrinsics")})
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
                                            if row["e2e_within_5pct_of_baseline"] and c["id"] not in OTHER_MACHINE
                                            else None)
        configs.append(row)

    return configs


def best_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    st = [r for r in rows if r["mode"] == "sharetune" and r["throughput_ratio"] is not None]
    return max(st, key=lambda r: (r.get("e2e_within_5pct_of_baseline", False), r["throughput_ratio"]))


def over_seeds(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The best configuration judged over all its seeds (search luck is large at this budget): the
    configuration (M, N, P, candidates per round) whose every seed is within 5% of the baseline's
    latency, with the highest geometric-mean throughput ratio."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        if r["mode"] == "sharetune" and "latency_ratio" in r and r["throughput_ratio"] is not None:
            groups.setdefault((r["clients_M"], r["servers_N"], r["thread_pct_P"], r["candidates_per_round"]),
                              []).append(r)

    gmean = statistics.geometric_mean

    ok = {k: g for k, g in groups.items() if all(r.get("e2e_within_5pct_of_baseline") for r in g)}
    if not ok:
        return None
    k, g = max(ok.items(), key=lambda kv: (len(kv[1]) > 1, gmean([r["throughput_ratio"] for r in kv[1]])))
    return {"clients_M": k[0], "servers_N": k[1], "thread_pct_P": k[2], "candidates_per_round": k[3],
            "runs": [r["id"] for r in g], "seeds": [r["seed"] for r in g],
            "throughput_ratio_gmean": round(gmean([r["throughput_ratio"] for r in g]), 3),
            "throughput_ratio_min": min(r["throughput_ratio"] for r in g),
            "latency_ratio_max": max(r["latency_ratio"] for r in g),
            "time_to_quality_ratio_min": min(r["time_to_quality_ratio"] for r in g),
            "cpu_util_mean_pct": round(sum(r["cpu_util_mean_pct"] for r in g) / len(g), 1)}


def across_rounds(by_round: dict[str, Any], model: str, key: tuple[int, int, int, int], rounds: list[str],
                  builder_workers: int | None, shared: bool = False, any_builder: bool = False) -> dict[str, Any]:
    """One configuration over every round and seed that ran the kept code, each run against its own
    round's baseline: geometric means and the worst run, per goal. Throughput and time to quality
    only for runs on their baseline's machine; latency for every run (evaluated with its baseline)."""
    runs = []
    for rnd in rounds:
        g = by_round.get(f"{rnd}/{model}")
        if not g:
            continue
        for r in g["sweep"]:
            if (r["mode"] == "sharetune"
                    and ((any_builder and (r.get("shared_builder") or r.get("builder_workers") == builder_workers))
                         or (not any_builder and r.get("shared_builder", False) == shared
                                         and (shared or r.get("builder_workers") == builder_workers)))
                    and (r["clients_M"], r["servers_N"], r["thread_pct_P"], r["candidates_per_round"]) == key
                    and "latency_ratio" in r):
                runs.append(r)

    def gmean(xs: list[float]) -> float:
        return round(statistics.geometric_mean(xs), 3)

    same_machine = [r for r in runs if r["throughput_ratio"] is not None]
    tp = [r["throughput_ratio"] for r in same_machine]
    lat = [r["latency_ratio"] for r in runs]
    cpu = [r["cpu_util_mean_pct"] for r in same_machine]
    ttq = [r.get("time_to_quality_ratio") for r in same_machine]
    return {
        "clients_M": key[0], "servers_N": key[1], "thread_pct_P": key[2], "candidates_per_round": key[3],
        "builder": (f"either ({builder_workers} per client or the build service)" if any_builder else
                    "one build service of the host's cores" if shared else f"{builder_workers} workers per client"),
        "rounds": rounds,
        "runs": [{k: r.get(k) for k in ("id", "round", "seed", "wall_s", "throughput_ratio", "latency_ratio",
                                        "time_to_quality_ratio", "cpu_util_mean_pct")} for r in runs],
        "throughput_ratio_gmean": gmean(tp), "throughput_ratio_min": min(tp),
        "latency_ratio_gmean": gmean(lat), "latency_ratio_max": max(lat),
        "time_to_quality_ratio_runs_reaching_quality": f"{sum(1 for x in ttq if x)}/{len(ttq)}",
        "cpu_util_mean_pct": round(sum(cpu) / len(cpu), 1),
        "goals_met_by_gmean": {"throughput_ratio": gmean(tp) >= 5, "latency_ratio": gmean(lat) <= 1.05,
                               "cpu_util": sum(cpu) / len(cpu) >= 85},
        "goals_met_by_every_run": {"throughput_ratio": min(tp) >= 5, "latency_ratio": max(lat) <= 1.05,
                                   "time_to_quality_ratio": all(x and x >= 4 for x in ttq),
                                   "cpu_util": min(cpu) >= 85},
    }


def shared_builder_ab(cells: dict[str, dict[str, Any]], ev: dict[str, Any]) -> dict[str, Any]:
    """One machine (the r6 cells' second machine and the r7 cells), the headline topology (6x6@50%, 16 per
    round): the clients' builds in one build service of the 16 cores against 6 workers per client.
    No baseline ran there, so wall times and their ratio, not throughput ratios."""
    ids = sorted(OTHER_MACHINE | {i for i, c in cells.items() if c.get("round") == "r7"})

    def arm(shared: bool) -> dict[str, Any]:
        runs = [cells[i] for i in ids if bool(cells[i].get("shared_builder")) == shared]
        walls = [c["wall_s"] for c in runs]
        return {"runs": [{"id": c["id"], "seed": c["seed"], "wall_s": c["wall_s"],
                          "cpu_util_mean_pct": c["cpu_util_mean"],
                          "slowest_shard_build_s": round(max(p.get("SendToBuilder", 0.0) for p in c["phases"]), 1),
                          "failed": c["failed"]} for c in runs],
                "wall_s_gmean": round(statistics.geometric_mean(walls), 2),
                "cpu_util_mean_pct": round(sum(c["cpu_util_mean"] for c in runs) / len(runs), 1)}

    shared, own = arm(True), arm(False)
    return {"what": "6x6@50%, 16 per round, on one machine (the r6 cells' second machine + the r7 cells): "
                    "build service (16 workers for all clients) vs 6 builder workers per client",
            "shared_build_service": shared, "own_pool_per_client": own,
            "wall_ratio_own_over_shared_gmean": round(own["wall_s_gmean"] / shared["wall_s_gmean"], 3)}


def goals_met(best: dict[str, Any]) -> dict[str, bool]:
    return {
        "throughput_ratio": best["throughput_ratio"] >= 5,
        "time_to_quality_ratio": bool(best.get("time_to_quality_ratio") and best["time_to_quality_ratio"] >= 4),
        "latency_ratio": bool(best.get("latency_ratio") and best["latency_ratio"] <= 1.05),
        "cpu_util": bool(best["cpu_util_mean_pct"] and best["cpu_util_mean_pct"] >= 85),
    }


def main() -> int:
    cells, evals, prof = _cells("h200-cells.jsonl"), _cells("h200-eval.jsonl"), _cells("h200-profile.jsonl")
    ev = {e["run"]: e for e in evals.values() if "run" in e and "error" not in e}
    # A round = the cells run on one machine with their own baseline; they are compared with each other only.
    rounds: dict[tuple[Any, str], dict[str, dict[str, Any]]] = {}
    for c in cells.values():
        rounds.setdefault((c.get("round"), c["model"]), {})[c["id"]] = c
    by_round = {}
    for (rnd, model), group in rounds.items():
        base_cell = next((c for c in group.values() if c["mode"] == "baseline"), None)
        if base_cell is None:  # the r7 cells: the shared-builder A/B only (shared_builder_ab)
            continue
        rows = group_rows(group, ev, base_cell)
        best = best_of(rows)
        by_round[f"{rnd or 'r1-r2'}/{model}"] = {
            "round": rnd or "r1-r2", "model": model, "gpu": base_cell.get("gpu"),
            "baseline": next(r for r in rows if r["mode"] == "baseline"), "best_sharetune": best,
            "best_config_over_seeds": over_seeds(rows), "goals_met": goals_met(best), "sweep": rows}
    first = by_round["r1-r2/resnet18"]
    head = by_round.get("r3/resnet18", first)
    configs, base = first["sweep"], first["baseline"]
    base = next(c for c in cells.values() if c["id"] == base["id"])
    weights = {t["workload_hash"]: t["weight"] for t in base["tasks"]}
    best = head["best_sharetune"]
    p = next(iter(prof.values()), {})
    out = {
        "what": "ResNet-18 (sharetune zoo, batch 1, 224x224, fp32), its 6 heaviest tasks (conv2d+bias+relu "
                "fusions, by FLOPs x calls), 16 trials each (96 in total), target cuda sm_90a "
                "(targets.make_target('cuda')), one NVIDIA H200 (driver 580.159.04), 16 CPU cores; "
                "xgb cost model, evolutionary search, seed 0 in both arms. Baseline: stock "
                "MetaSchedule tune_tasks, one process, LocalBuilder on all cores, one RPCRunner worker, one "
                "RPC server on the whole GPU, no MPS, 64 candidates per batch, population 512, gradient task "
                "scheduler, RPC session timeout 30 s (stock 10 s). sharetune: local topology (sharetune.local "
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
        "headline": ("'headline_config_across_rounds' is the claim: the best configuration over every round "
                     "and seed of the kept code (r3, r4, r6; 'headline_config_rounds_r3_r4' is the same over r3 "
                     "and r4 only, 'shared_builder_ab' the build-service comparison). "
                     "Below it, the best single round: "
                     "the r3 cells (2026-12-02): the tensor-intrinsics cache in every client, and 16 "
                     "candidates per round (= the baseline's batch per task, i.e. one search round per task) "
                     "in the i16 cells; baseline re-run on the same machine. 'baseline', "
                     "'best_sharetune', 'goals_met' are ResNet-18's r3 cells; every round and model is in "
                     "'by_round' (ratios always against the baseline of the same round)"),
        "baseline": head["baseline"],
        "best_sharetune": best,
        "best_config_over_seeds": head["best_config_over_seeds"],
        "goals": {"throughput_ratio": ">= 5", "time_to_quality_ratio": ">= 4", "latency_ratio": "<= 1.05",
                  "cpu_util": ">= 85%"},
        "goals_met": head["goals_met"],
        "headline_config_across_rounds": across_rounds(by_round, "resnet18", (6, 6, 50, 16), ["r3", "r4", "r6"],
                                                       6, any_builder=True),
        "headline_config_rounds_r3_r4": across_rounds(by_round, "resnet18", (6, 6, 50, 16), ["r3", "r4"], 6),
        "not_kept_round_r5": across_rounds(by_round, "resnet18", (6, 6, 50, 16), ["r5"], 6),
        "shared_build_service_round_r6": across_rounds(by_round, "resnet18", (6, 6, 50, 16), ["r6"], None,
                                                       shared=True),
        "shared_builder_ab": shared_builder_ab(cells, ev),
        "resnet50": {k: v for k, v in by_round.get("r3/resnet50", {}).items() if k != "sweep"} or None,
        "by_round": by_round,
        "profile_one_trial": {k: p.get(k) for k in ("search", "build_one", "build_batch", "run_stock_steps",
                                                    "run_session_steps", "runner_batch", "per_trial_estimate_s",
                                                    "import_tvm_s", "torch_importable")},
        "findings": [
            "Across rounds (6x6@50%, 16 per round, rounds r3, r4, r6, each run against its own round's "
            "baseline): throughput 5.21, 5.48, 5.14, 4.81, 6.32 (geometric mean 5.37; the five runs that ran on "
            "their baseline's machine), latency ratio 0.996, 0.870, 1.109, 1.067, 1.164, 1.154, 1.039, 1.084 "
            "(geometric mean 1.056, eight runs), CPU 78-83%. The sharetune models end at 2.20-2.47 ms in every "
            "round; the baseline's model moved between 2.12 ms (r6), 2.17 ms (r4) and 2.43 ms (r3) with the same "
            "code and seed: at 16 trials per task, search luck decides single-run latency ratios.",
            "The r6 cells (2026-12-03): the clients' builds go to one build service of the host's 16 "
            "cores (sharetune_tuner/build/service.py, local mode's default now) instead of 6 workers per client. "
            "On the baseline's machine: 56.8 s against 358.9 s (6.32x; the baseline had 21 of 96 trials fail, "
            "stock LocalBuilder timeouts), CPU 81.5%. The rest of r6 and all of r7 ran on a second machine (~1.5x "
            "slower: intrinsics cache 29.9 s vs 20.1 s) and no baseline there: build service 75.4, 81.5, 84.6, "
            "109.9 s against own pools 69.9, 99.8, 103.4 s (geometric means 86.9 vs 89.7 s, 3%; CPU 71.5% vs "
            "72.9%): not distinguishable at this noise. What makes the three slowest runs (one with the service, "
            "two with own pools) is one shard's batch: its SendToBuilder took 52-64 s against 19-40 s for the "
            "other shards of the run, i.e. slow candidate builds that neither pool shape shortens. "
            "On the 2-core CPU machine the "
            "service cut the quickstart's tuning from 48.8-50.2 s to 41.3-42.3 s (two A/B pairs).",
            "The r4 cells (2026-12-03): services wait for readiness instead of fixed sleeps (MPS daemon ready "
            "marker, tracker listening), 0.25 s polls, and no cost-model training after a shard's last batch. "
            "Last record to topology exit went from 3.7 s (r3) to 0.4 s; 57.8 s and 61.7 s against a 297 s "
            "baseline (5.14x, 4.81x).",
            "16 builder workers per client (the old default, one per core) with 6 clients on 16 cores: 68 of "
            "96 trials failed (every trial of 4 of the 6 shards; logs not carried back, cause not isolated), "
            "model 1.41x slower. 6 per client (2 x cores / clients) never failed: that is now the default "
            "(sharetune_tuner/build/cpus.py).",
            "The r5 cells (a start-up change, not kept): clients started alongside the MPS daemon and tracker, "
            "servers in the background once both were ready, and each client waited for the tracker only at its first "
            "measurement. The start-up idle disappeared (16 cores busy from 5.6 s, tracker wait 0 s), yet "
            "search and build phases took 35-60% longer and the runs 82.5 s and 75.0 s against a 323.5 s "
            "baseline (3.92x, 4.31x; one run at 86% CPU). Cause not isolated; the "
            "change was reverted (on the 2-core CPU quickstart it had cut tuning from 45 s to 37 s).",
            "Client start-up was the largest fixed cost: every client parsed all of TVM's tensor intrinsics "
            "from TVMScript when MetaSchedule set up its first task (~20 s of one core each, six clients "
            "side by side: the machine sat at 6/16 cores for 21 s). Registering them from a serialised "
            "cache (sharetune_tuner/model/intrinsics.py; built into the tuner image) takes 0.3-0.9 s: in the r3 cells "
            "the slowest client's start-up before its first search (process start, model load, extraction, "
            "intrinsics, tracker wait) is under 8 s, and 6x12@100% went from 109 s (0.81 trials/s, r1-r2) to "
            "80 s (1.10 trials/s).",
            "16 candidates per round (one round per task, as the baseline's batch) at 6x6@50%: 62 s and 59 s "
            "for 96 trials over two seeds (5.21x and 5.48x the baseline's 323 s) with models 0.4% and 13% "
            "faster than the baseline's.",
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
            "Search noise dominates tuned quality at 16 trials per task: the same configuration with seed 1 "
            "instead of 0 ends at 3.00 vs 2.12 ms (P=50) and 3.23 vs 2.38 ms (P=10) end to end; "
            "st-r18-m6n6p10-s1 is no faster than the untuned model (3.21 ms). Differences between "
            "configurations below ~40% are within that spread.",
            "Tuning at a 10% MPS share gives schedules that lose less when served at 10%: the tuned model's "
            "latency at P_s=10 over its own latency at P_s=100 is 1.34-1.47 for all four P_t=10 runs against "
            "1.66-1.91 for all four P_t=100 runs (baseline included); at P_s >= 50 every run is within 5% of "
            "its own 100% latency (h200-quality-matrix.json 'shape').",
            "Isolated kernel timings (how both arms rank candidates) do not predict in-model latency here: "
            "st-r18-m6n6p100's 6 tuned kernels sum to 895 us in isolation against the baseline's 971 us, yet "
            "its model is 245 us slower end to end, with only those 6 kernels differing (checked by compiling "
            "both). The kernel proxy is therefore reported, labelled, and not used for the headline metric.",
        ],
        "not_done": [
            "Goals over every run of the headline configuration (r3, r4, r6): throughput >= 5 by geometric "
            "mean (5.37) but not every run (min 4.81); latency <= 1.05 missed once the r6 runs count (geometric mean "
            "1.056 over 8 runs; 1.006 over r3+r4); time-to-quality >= 4 only for the 2 runs whose model reached "
            "the baseline's quality (5.21, 5.48); CPU >= 85% missed (mean 80%): the tail of a run is one shard's "
            "slow candidate builds and its final measurement, with most cores idle.",
            "The build service's effect on the H200 is not established (one run on the baseline's machine, "
            "3-4 runs per arm on a second, noisier machine, 3% apart); slow single builds were not profiled "
            "(which candidates, whether NVRTC or LLVM).",
            "The r5 cells' slowdown was not explained; the r4 cells' 16-worker failures were not diagnosed "
            "(their client logs were not kept; the -r6 and -r7 cells' process logs are in h200-runs.tar.gz).",
            "ResNet-50: one r3 configuration only (6x6 at 50%, 16 per round, seed 0) against its baseline; "
            "no ResNet-50 quality matrix (not run).",
            "The r3 cells were evaluated for end-to-end latency at 100% without MPS only (the quality matrix is "
            "the r1-r2 cells'); st-r18-m6n6p50-i16-s1-r3 ran by hand (tune_cell.py + evaluate.py): its record "
            "databases were not carried back (its evaluation ran on the device).",
            "Topologies measured: M=N=6 at P in {10, 25, 50, 75, 100}, M=N=3 at 100, M=6/N=12 at 100; no "
            "M != N cells at shares below 100.",
            "st-r18-m6n6p10 and st-r18-m6n6p10-pop8 used the earlier builder (default_build with the "
            "tensor_intrin import; st-r18-m6n6p10 also the 32-per-candidate population); every other sharetune "
            "cell ran the final code.",
            "End-to-end latency measured only for the final models, not at intermediate times.",
            "Several sharetune runs wrote 80 or 88 of 96 budgeted trials (a shard's search returned fewer "
            "candidates than its budget); trials_per_s counts records written.",
            "Seeds: 0 everywhere, plus seed 1 for P=50 and P=10 (st-r18-m6n6p50-s1, st-r18-m6n6p10-s1); the "
            "baseline ran once per round.",
            "CPU utilisation >= 85% was reached by one r3 run (st-r18-m6n12p100-i16-s1-r3, 89.8%), not by the "
            "headline configuration (77.7% / 83.3% over its two seeds).",
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
                     "latency_ms_by_serve_pct": {k: (v or {}).get("median_ms")
                                                 for k, v in e["e2e_by_serve_pct"].items()},
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

    st_rows = [r for r in rows if r["mode"] == "sharetune"]
    qm = {
        "what": "ResNet-18 tuned (6 heaviest tasks x 16 trials) at tuning share P_t, served at share P_s: "
                "end-to-end latency (ms, median) of the whole model in a process with "
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=P_s under one MPS daemon, nothing else on the GPU.",
        "reduced": "P_t measured: 10 (four sharetune runs: two with the earlier builder, seeds 0 and 1 with "
                   "the final code), 25, 50 (seeds 0 and 1), 75, 100 (three sharetune topologies, plus the "
                   "stock baseline without MPS). One run per cell otherwise.",
        "serve_pcts": serve,
        "rows": rows,
        "untuned_ms_by_serve_pct": {k: (v or {}).get("median_ms") for k, v in untuned.items()},
        "slowdown": "latency / the fastest row at the same P_s",
        "all_runs": slowdowns(rows) if rows else None,
        "sharetune_runs_only": slowdowns(st_rows) if rows else None,
        "by_tuning_pct": by_tuning_pct(st_rows, serve, shape=False),
        "shape": by_tuning_pct(st_rows, serve, shape=True),
    }
    qm["noise"] = ("seed 0 vs seed 1 at the same configuration: P_t=50 2.12 vs 3.00 ms, P_t=10 2.38 vs 3.23 ms "
                   "at 100% (no MPS). The absolute level of a run is search luck at this budget, larger than any "
                   "P_t effect in 'by_tuning_pct' (its P_t=75 row is one seed-0 run). 'shape' divides each run by "
                   "its own latency at P_s=100, which removes the level and keeps how the schedules tolerate a "
                   "smaller share: the effect that is consistent across runs.")
    qm["recommended"] = {
        "from": "shape",
        "recommended_tuning_pct": qm["shape"]["recommended_tuning_pct"],
        "worst_case_slowdown": qm["shape"]["worst_case_slowdown"],
        "tuning_pct_by_serving_pct": qm["shape"]["best_tuning_pct_by_serve_pct"],
        "raw_rule_on_by_tuning_pct": {k: qm["by_tuning_pct"][k] for k in
                                      ("recommended_tuning_pct", "worst_case_slowdown")},
        "used_by": "operator/sharetune/serving.py (spec.servers.servingPercentage)",
    }
    (RESULTS / "h200-quality-matrix.json").write_text(json.dumps(qm, indent=2))
    _plot(configs, ev, weights, base, qm)
    print(json.dumps({"best": best["id"], "throughput_ratio": best["throughput_ratio"],
                      "latency_ratio": best.get("latency_ratio"),
                      "time_to_quality_ratio": best.get("time_to_quality_ratio"),
                      "recommended": qm["recommended"]}, indent=1))
    return 0


def by_tuning_pct(rows: list[dict[str, Any]], serve: list[int], shape: bool) -> dict[str, Any]:
    """Rows grouped by tuning share P_t (geometric mean over a group's runs) and the slowdown rule
    on them: slowdown(P_t, P_s) = value / the smallest value at P_s; recommended = the P_t with the
    smallest worst case over P_s. ``shape``: each run's latency over its own latency at P_s=100 first."""
    groups: dict[int, list[dict[str, float]]] = {}
    for r in rows:
        lat = r["latency_ms_by_serve_pct"]
        ref = lat[str(max(serve))] if shape else 1.0
        groups.setdefault(r["tuned_at_pct"], []).append({str(s): lat[str(s)] / ref for s in serve})
    if not groups:
        return {}
    val = {pt: {str(s): statistics.geometric_mean(g[str(s)] for g in gs) for s in serve}
           for pt, gs in sorted(groups.items())}
    low = {str(s): min(v[str(s)] for v in val.values()) for s in serve}
    sd = {pt: {str(s): round(v[str(s)] / low[str(s)], 4) for s in serve} for pt, v in val.items()}
    worst = {pt: max(x.values()) for pt, x in sd.items()}
    rec = min(worst, key=lambda pt: (worst[pt], pt))
    # per serving share: the P_t with the smallest slowdown there; within 0.5% the one nearest P_s
    best_at = {}
    for s in serve:
        tied = [pt for pt in sd if sd[pt][str(s)] <= 1.005]
        best_at[str(s)] = min(tied, key=lambda pt: (abs(pt - s), pt))
    return {"runs_by_tuning_pct": {str(pt): len(gs) for pt, gs in sorted(groups.items())},
            ("relative_latency_by_serve_pct" if shape else "latency_ms_by_serve_pct"):
                {str(pt): {k: round(x, 4) for k, x in v.items()} for pt, v in val.items()},
            "slowdown_by_serve_pct": {str(pt): x for pt, x in sd.items()},
            "worst_case_slowdown_by_tuning_pct": {str(pt): w for pt, w in worst.items()},
            "recommended_tuning_pct": rec, "worst_case_slowdown": worst[rec],
            "best_tuning_pct_by_serve_pct": best_at}


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
