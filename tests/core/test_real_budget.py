"""The real-budget metrics (bench/h200/real_budget.py) on synthetic curves: no TVM, no GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "h200"))
rb = pytest.importorskip("real_budget")


def side(points: list[tuple[float, float]], untuned: float = 10.0, tps: float = 1.0, window: float = 540.0) -> dict:
    return {"trials_per_s": tps, "window_s": window,
            "curve": rb.step_curve([{"t": t, "median_ms": ms} for t, ms in points], untuned)}


def test_time_to_quality_ratio_is_the_baseline_time_to_its_final_over_sharetune_time_to_it() -> None:
    base = side([(60, 9.0), (120, 8.0), (240, 7.0), (540, 7.0)], tps=1.0)
    st = side([(60, 7.5), (120, 6.9), (240, 6.0), (540, 5.5)], tps=3.0)
    c = rb.compare(base, st)
    assert c["baseline_time_to_final_s"] == 240  # first reached 7.0 at 240 s
    assert c["sharetune_time_to_baseline_final_s"] == 120
    assert c["time_to_quality_ratio"] == 2.0
    assert c["throughput_ratio"] == 3.0
    assert c["latency_ratio"] == round(5.5 / 7.0, 4)


def test_sharetune_that_never_reaches_the_baseline_gets_no_ratio_but_an_upper_bound() -> None:
    base = side([(60, 8.0), (120, 6.0), (540, 6.0)])
    st = side([(60, 9.0), (540, 7.0)], window=540)
    c = rb.compare(base, st)
    assert c["time_to_quality_ratio"] is None
    assert c["time_to_quality_ratio_below"] == round(120 / 540, 3)
    assert c["latency_ratio"] > 1


def test_tolerance_and_failed_checkpoints() -> None:
    # within 2% counts as reached; a checkpoint whose model failed (None) keeps the previous value
    base = side([(60, 8.0), (540, 8.0)])
    st = side([(30, None), (60, 8.1), (540, 8.1)])
    assert st["curve"] == [(0.0, 10.0), (60.0, 8.1), (540.0, 8.1)]
    assert rb.compare(base, st)["time_to_quality_ratio"] == 1.0
    assert rb.time_to_reach(st["curve"], 8.0, tol=0.0) is None


def test_baseline_that_never_improved_gives_no_ratio() -> None:
    c = rb.compare(side([(540, 10.0)]), side([(60, 5.0), (540, 5.0)]))
    assert c["time_to_quality_ratio"] is None and "never improved" in c["time_to_quality_note"]


def test_geometric_means_over_seeds_with_the_worst_run() -> None:
    rows = [{"seed": 0, "throughput_ratio": 2.0, "time_to_quality_ratio": 4.0, "latency_ratio": 0.9},
            {"seed": 1, "throughput_ratio": 8.0, "time_to_quality_ratio": None, "latency_ratio": 1.1}]
    agg = rb.aggregate(rows)
    assert agg["throughput_ratio"] == {"geomean": 4.0, "worst": 2.0, "runs_with_value": "2/2"}
    assert agg["time_to_quality_ratio"] == {"geomean": 4.0, "worst": 4.0, "runs_with_value": "1/2"}
    assert agg["latency_ratio"]["worst"] == 1.1


def test_summarize_cells_pairs_arms_of_one_network_and_seed() -> None:
    arms, evs = {}, {}
    for seed in (0, 1):
        for arm, tps in (("stock", 0.5), ("stock-tuned", 1.0), ("sharetune", 2.0)):
            arms[rb.arm_id("resnet50", seed, arm)] = {"trials_per_s": tps, "window_s": 540, "machine": "m",
                                                     "trials": int(tps * 540)}
        evs[rb.eval_id("resnet50", seed)] = {
            "id": rb.eval_id("resnet50", seed), "network": "resnet50", "seed": seed, "untuned_ms": 10.0,
            "arms": {arm: {"run": rb.arm_id("resnet50", seed, arm),
                           "curve": [{"t": 60, "median_ms": a}, {"t": 540, "median_ms": b}]}
                     for arm, (a, b) in (("stock", (9.0, 8.0)), ("stock-tuned", (8.0, 7.0)),
                                         ("sharetune", (7.0, 5.0)))}}
    n = rb.summarize_cells(arms, evs)["resnet50"]
    assert n["vs"]["stock"]["throughput_ratio"]["geomean"] == 4.0
    assert n["vs"]["stock-tuned"]["throughput_ratio"]["geomean"] == 2.0
    assert n["vs"]["stock"]["time_to_quality_ratio"]["geomean"] == 540 / 60
    assert n["vs"]["stock"]["per_seed"][0]["same_machine"] is True
    assert n["speedup_vs_untuned"]["sharetune"]["geomean"] == 2.0
    assert n["speedup_vs_untuned"]["stock"]["worst"] == 1.25


def test_goals_are_judged_per_network_and_only_over_every_headline_network() -> None:
    agg = {"throughput_ratio": {"geomean": 7.0, "worst": 6.5}, "late_throughput_ratio": {"geomean": 4.0},
           "time_to_quality_ratio": {"geomean": None},
           "latency_ratio": {"geomean": 0.9, "worst": 0.97}}
    tuned = {"throughput_ratio": {"geomean": 1.5, "worst": 1.4}, "time_to_quality_ratio": {"geomean": 2.5},
             "latency_ratio": {"geomean": 1.0}}
    nets = {"resnet50": {"vs": {"stock": agg, "stock-tuned": tuned},
                         "speedup_vs_untuned": {"sharetune": {"geomean": 2.0, "worst": 1.9}}}}
    g = rb.goals(nets, headline=("resnet50",))
    assert g["goals_met"] == {"throughput_vs_stock": True, "late_throughput_vs_stock": False,
                              "time_to_quality_vs_stock": None, "final_latency_vs_stock": True,
                              "throughput_vs_stock_tuned": False, "late_throughput_vs_stock_tuned": None,
                              "time_to_quality_vs_stock_tuned": True, "tuned_vs_untuned": True}
    assert g["goal_values"]["resnet50"]["final_latency_vs_stock"] == {"geomean": 0.9, "worst": 0.97, "goal": "<= 0.95"}
    # a headline network that was not run leaves every goal unjudged, whatever the others say
    both = rb.goals(nets, headline=("resnet50", "mobilenet_v2"))
    assert set(both["goals_met"].values()) == {None}
    assert both["goals_met_by_network"]["resnet50"]["throughput_vs_stock"] is True


def test_the_late_rate_counts_only_the_window_second_half_after_start_up() -> None:
    # stock: a slow start (first measurement at 70 s), then 1 trial/s; sharetune: 4/s from 40 s
    stock = {"window_s": 180, "measured_times": [70.5 + i for i in range(110)], "record_times": {"db": [179.0]}}
    shard = [40.0 + i / 4 for i in range(561)]
    st = {"window_s": 180, "record_times": {"shards/shard-0": shard[::2], "shards/shard-1": shard[1::2]}}
    assert rb.late_trials_per_s(stock) == 1.0  # measured, not committed, as its trials are counted
    assert rb.late_trials_per_s(st) == 4.0
    c = rb.compare({**side([(180, 9.0)], tps=80 / 180, window=180), "late_trials_per_s": 1.0},
                   {**side([(180, 5.0)], tps=560 / 180, window=180), "late_trials_per_s": 4.0})
    assert (c["throughput_ratio"], c["late_throughput_ratio"]) == (7.0, 4.0)


STOCK_LOG = """2026-12-06 04:30:56 [INFO] [task_scheduler.cc:208] Sending 63 sample(s) to builder
2026-12-06 04:31:20 [INFO] [task_scheduler.cc:216] Build errors: 2 sample(s)
2026-12-06 04:31:20 [INFO] [task_scheduler.cc:218] Sending 61 valid sample(s) to runner
2026-12-06 04:31:20 [INFO] [task_scheduler.cc:208] Sending 6 sample(s) to builder
2026-12-06 04:31:53 [INFO] [task_scheduler.cc:216] Build errors: 4 sample(s)
2026-12-06 04:31:53 [INFO] [task_scheduler.cc:218] Sending 2 valid sample(s) to runner
"""


def test_build_errors_tell_timeouts_from_candidates_that_do_not_compile() -> None:
    # without reasons: a batch that took the whole timeout lost its errors to it (the second,
    # 33 s; its send line shares a second with the first batch's error count), the first did not
    b = rb.build_errors(STOCK_LOG)
    assert (b["builds_sent"], b["build_errors"], b["build_timeouts"]) == (69, 6, 4)
    # with baseline_client's reasons, they decide
    reasons = STOCK_LOG + ("build error: LocalBuilder: Timeout | LocalBuilder: Timeout, killed after 30.0 seconds\n"
                           "build error: Traceback | RuntimeError: NVRTC compilation failed\n")
    r = rb.build_errors(reasons)
    assert r["build_timeouts"] == 1 and r["build_error_reasons"] == {
        "LocalBuilder: Timeout, killed after N seconds": 1, "RuntimeError: NVRTC compilation failed": 1}


def test_a_baseline_that_lost_builds_to_its_timeout_is_reported_but_not_aggregated() -> None:
    arms, evs = {}, {}
    for seed in (0, 1):
        for arm, tps in (("stock", 0.5), ("sharetune", 2.0)):
            arms[rb.arm_id("resnet50", seed, arm)] = {"arm": arm, "trials_per_s": tps, "window_s": 540,
                                                     "machine": "m", "trials": int(tps * 540)}
        evs[rb.eval_id("resnet50", seed)] = {
            "id": rb.eval_id("resnet50", seed), "network": "resnet50", "seed": seed, "untuned_ms": 10.0,
            "arms": {arm: {"run": rb.arm_id("resnet50", seed, arm), "curve": [{"t": 540, "median_ms": ms}]}
                     for arm, ms in (("stock", 8.0), ("sharetune", 5.0))}}
    arms[rb.arm_id("resnet50", 1, "stock")].update(trials_per_s=0.1, builds_sent=69, build_errors=6, build_timeouts=4)
    vs = rb.summarize_cells(arms, evs)["resnet50"]["vs"]["stock"]
    assert vs["throughput_ratio"]["geomean"] == 4.0 and vs["seeds"] == [0] and vs["left_out"] == [1]
    assert vs["per_seed"][1]["not_a_fair_baseline"] == "lost 4 of 69 builds to LocalBuilder's 30-s timeout"


def test_the_trial_rates_count_every_pair_of_arms_evaluated_or_not() -> None:
    arms, evs = {}, {}
    for seed, rates in ((0, (1.0, 4.0)), (1, (1.0, 9.0))):
        for arm, rate in zip(("stock", "sharetune"), rates):
            arms[rb.arm_id("resnet50", seed, arm)] = {
                "arm": arm, "network": "resnet50", "seed": seed, "trials_per_s": rate, "window_s": 200,
                "machine": "m", "trials": int(rate * 200),
                "measured_times": [150.0 + i / rate for i in range(int(rate * 50))]}  # rate / 2 in (100, 200]
    evs["e"] = {"network": "resnet50", "seed": 0, "untuned_ms": 10.0,  # seed 1 never evaluated
                "arms": {arm: {"run": rb.arm_id("resnet50", 0, arm), "curve": [{"t": 200, "median_ms": ms}]}
                         for arm, ms in (("stock", 8.0), ("sharetune", 5.0))}}
    vs = rb.summarize_cells(arms, evs)["resnet50"]["vs"]["stock"]
    assert vs["latency_ratio"]["runs_with_value"] == "1/1"
    assert vs["late_throughput_ratio"]["geomean"] == 6.0 and vs["late_throughput_ratio"]["worst"] == 4.0
    assert vs["throughput_ratio"]["geomean"] == 6.0 and vs["throughput_ratio"]["seeds"] == [0, 1]
    assert [(r["seed"], r["evaluated"]) for r in vs["rates_per_seed"]] == [(0, True), (1, False)]


def test_a_search_variant_is_kept_beside_the_shipped_arm_not_in_its_place() -> None:
    assert rb.arm_name("sharetune", "4x4", "8x4") == "sharetune-e4x4"
    assert rb.arm_name("sharetune", "8x4", "8x4") == "sharetune"  # the default named explicitly
    assert rb.arm_name("sharetune", "", "8x4") == "sharetune"
    assert rb.arm_name("stock", "4x4", "8x4") == "stock"
    assert rb.arm_name("sharetune", "2x4", "4x4", per_iter=32) == "sharetune-e2x4-b32"
    assert rb.arm_name("sharetune", "", "4x4", per_iter=rb.ST_PER_ITER) == "sharetune"
    arms, runs = {}, {}
    for arm, tps, ms in (("stock", 0.5, 8.0), ("sharetune", 2.0, 5.0), ("sharetune-e4x4", 3.0, 4.0)):
        arms[rb.arm_id("resnet50", 0, arm)] = {"trials_per_s": tps, "window_s": 240, "machine": "m", "trials": 1}
        runs[arm] = {"run": rb.arm_id("resnet50", 0, arm), "curve": [{"t": 240, "median_ms": ms}]}
    evs = {"e": {"network": "resnet50", "seed": 0, "untuned_ms": 10.0, "arms": runs}}
    n = rb.summarize_cells(arms, evs)["resnet50"]
    assert n["vs"]["stock"]["throughput_ratio"]["geomean"] == 4.0  # the shipped arm's, not the variant's
    assert n["runs"][0]["arms"]["sharetune-e4x4"]["speedup_vs_untuned"] == 2.5
    assert n["variants"]["sharetune-e4x4"]["vs"]["stock"]["throughput_ratio"]["geomean"] == 6.0
