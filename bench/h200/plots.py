"""The figures of docs/benchmarks.md, from the H200 results (no GPU, no TVM):

  docs/h200-throughput.png       trials/s and end-to-end latency per configuration
  docs/h200-quality-over-time.png  best-so-far tuned-kernel latency over time; final model latency vs wall time
  docs/h200-quality-heatmap.png  the quality matrix: latency per run x serving share, and the per-P_t slowdowns
  docs/h200-multi-job.png        three jobs through one GPU pool vs one after another
  docs/h200-search-quality.png   the candidates each cold search proposes, per task

  python bench/h200/plots.py     (after summarize.py)
  python bench/h200/plots.py multi-job   (after multi_job.py summarize; that figure only)
  python bench/h200/plots.py search-quality   (after search_quality.py summarize; that figure only)
"""

from __future__ import annotations

import json
import sys
from typing import Any

from summarize import RESULTS, _cells, kernel_curve

DOCS = RESULTS.parents[1] / "docs"


def _short(run: str) -> str:
    return run.replace("st-r18-", "").replace("-r18", "")


def main() -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if sys.argv[1:] == ["multi-job"]:
        multi_job(plt)
        return 0
    if sys.argv[1:] == ["search-quality"]:
        search_quality(plt)
        return 0

    tuning = json.loads((RESULTS / "h200-tuning.json").read_text())
    qm = json.loads((RESULTS / "h200-quality-matrix.json").read_text())
    # The figures of the first sweep (the r1-r2 cells); the r3 cells have their own figure (_rounds).
    configs: list[dict[str, Any]] = tuning["by_round"]["r1-r2/resnet18"]["sweep"]
    base = tuning["by_round"]["r1-r2/resnet18"]["baseline"]

    # ---- throughput and final latency per configuration ------------------------------------------
    order = sorted(configs, key=lambda c: (c["mode"] != "baseline", c["thread_pct_P"], c["id"]))
    fig, ax = plt.subplots(1, 2, figsize=(14, 4.6))
    names = [_short(c["id"]) for c in order]
    colors = ["grey" if c["mode"] == "baseline" else "tab:blue" for c in order]
    ax[0].bar(names, [c["trials_per_s"] for c in order], color=colors)
    for i, c in enumerate(order):
        ax[0].text(i, c["trials_per_s"], f"{c['throughput_ratio']:.2f}x\n{c['cpu_util_mean_pct']:.0f}% cpu",
                   ha="center", va="bottom", fontsize=7)
    ax[0].axhline(5 * base["trials_per_s"], ls="--", color="tab:red", lw=1)
    ax[0].text(len(order) - 0.5, 5 * base["trials_per_s"], "goal 5x", color="tab:red", ha="right", va="bottom",
               fontsize=8)
    ax[0].set_ylabel("trials / s (wall, start-up included)")
    ax[0].set_title("tuning throughput (ResNet-18, 6 tasks x 16 trials, one H200)")
    ax[0].tick_params(axis="x", rotation=40, labelsize=8)
    ax[0].set_ylim(0, 5.6 * base["trials_per_s"])
    lat = [c.get("e2e_latency_ms_100pct_no_mps") for c in order]
    ax[1].bar(names, [v or 0 for v in lat], color=colors)
    b = base["e2e_latency_ms_100pct_no_mps"]
    ax[1].axhline(1.05 * b, ls="--", color="tab:red", lw=1)
    ax[1].text(len(order) - 0.5, 1.05 * b, "baseline + 5%", color="tab:red", ha="right", va="bottom", fontsize=8)
    untuned = qm["untuned_ms_by_serve_pct"].get("100")
    if untuned:
        ax[1].axhline(untuned, ls=":", color="k", lw=1)
        ax[1].text(-0.5, untuned, "untuned", fontsize=8, va="bottom")
    for i, v in enumerate(lat):
        if v:
            ax[1].text(i, v, f"{v / b:.2f}", ha="center", va="bottom", fontsize=7)
    ax[1].set_ylabel("end-to-end latency, ms (whole GPU, no MPS)")
    ax[1].set_title("tuned model latency (label: / baseline)")
    ax[1].tick_params(axis="x", rotation=40, labelsize=8)
    fig.tight_layout()
    fig.savefig(DOCS / "h200-throughput.png", dpi=110)
    plt.close(fig)

    # ---- quality over time -----------------------------------------------------------------------
    cells, evals = _cells("h200-cells.jsonl"), _cells("h200-eval.jsonl")
    ev = {e["run"]: e for e in evals.values() if "run" in e and "error" not in e}
    bcell = next(c for c in cells.values() if c["mode"] == "baseline")
    weights = {t["workload_hash"]: t["weight"] for t in bcell["tasks"]}
    fig, ax = plt.subplots(1, 2, figsize=(14, 4.8))
    for c in sorted(cells.values(), key=lambda c: (c["mode"] != "baseline", c["thread_pct"], c["id"])):
        e = ev.get(c["id"])
        curve = kernel_curve(e, weights) if e else []
        if curve:
            ax[0].step([t for t, _ in curve] + [c["wall_s"]], [v * 1e6 for _, v in curve] + [curve[-1][1] * 1e6],
                       where="post", label=_short(c["id"]), lw=2.2 if c["mode"] == "baseline" else 1.2,
                       color="k" if c["mode"] == "baseline" else None)
    ax[0].set_ylim(500, 3000)  # one st-r18-m6n6p75-v2 record re-measures at ~35 ms: clipped
    ax[0].set_xlabel("s since the run started")
    ax[0].set_ylabel("sum of calls x kernel latency, us")
    ax[0].set_title("6 tuned kernels, best so far (re-measured in isolation at 100%;\n"
                    "from when every task has a record; y clipped at 3 ms)", fontsize=10)
    ax[0].legend(fontsize=7, ncol=2)
    for c in configs:
        v = c.get("e2e_latency_ms_100pct_no_mps")
        if v is None:
            continue
        mk = "s" if c["mode"] == "baseline" else "o"
        ax[1].scatter(c["wall_s"], v, marker=mk, color="k" if c["mode"] == "baseline" else "tab:blue")
        ax[1].annotate(_short(c["id"]), (c["wall_s"], v), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax[1].axhline(1.05 * b, ls="--", color="tab:red", lw=1)
    if untuned:
        ax[1].axhline(untuned, ls=":", color="k", lw=1)
    ax[1].set_xlabel("wall time of the run, s")
    ax[1].set_ylabel("final end-to-end latency, ms")
    ax[1].set_title("final model latency vs time spent (dashed: baseline + 5%, dotted: untuned)", fontsize=10)
    fig.tight_layout()
    fig.savefig(DOCS / "h200-quality-over-time.png", dpi=110)
    plt.close(fig)

    # ---- quality heatmap -------------------------------------------------------------------------
    serve = qm["serve_pcts"]
    rows = sorted(qm["rows"], key=lambda r: (r["tuned_at_pct"], r["mode"] != "baseline", r["run"]))
    shape = qm["shape"]["slowdown_by_serve_pct"]
    fig, ax = plt.subplots(1, 2, figsize=(14, 5.2), gridspec_kw={"width_ratios": [1.25, 1]})
    data = [[r["latency_ms_by_serve_pct"][str(s)] for s in serve] for r in rows]
    im = ax[0].imshow(data, cmap="viridis_r", aspect="auto")
    ax[0].set_xticks(range(len(serve)), [f"{s}%" for s in serve])
    ax[0].set_yticks(range(len(rows)), [f"P_t={r['tuned_at_pct']}: {_short(r['run'])}" for r in rows], fontsize=8)
    for i, row in enumerate(data):
        for j, v in enumerate(row):
            ax[0].text(j, i, f"{v:.2f}", ha="center", va="center", color="w", fontsize=7)
    ax[0].set_xlabel("serving share P_s (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)")
    ax[0].set_title("end-to-end latency (ms) per tuning run")
    fig.colorbar(im, ax=ax[0])
    pts = sorted(shape, key=int)
    sd = [[shape[p][str(s)] for s in serve] for p in pts]
    im2 = ax[1].imshow(sd, cmap="magma_r", aspect="auto", vmin=1.0)
    ax[1].set_xticks(range(len(serve)), [f"{s}%" for s in serve])
    ax[1].set_yticks(range(len(pts)), [f"P_t={p} (n={qm['shape']['runs_by_tuning_pct'][p]})" for p in pts])
    rec = qm["recommended"]
    for i, row in enumerate(sd):
        for j, v in enumerate(row):
            best = rec["tuning_pct_by_serving_pct"][str(serve[j])] == int(pts[i])
            ax[1].text(j, i, f"{v:.3f}" + ("*" if best else ""), ha="center", va="center",
                       color="w" if v > 1.12 else "k", fontsize=8)
    ax[1].set_xlabel("serving share P_s")
    ax[1].set_title(f"slowdown vs best P_t at each P_s (level-normalised, geo-mean)\n* = table entry; "
                    f"recommended default P_t={rec['recommended_tuning_pct']} (worst {rec['worst_case_slowdown']:.3f})",
                    fontsize=9)
    fig.colorbar(im2, ax=ax[1])
    fig.tight_layout()
    fig.savefig(DOCS / "h200-quality-heatmap.png", dpi=110)
    plt.close(fig)
    _rounds(plt, tuning, ["r3/resnet18", "r3/resnet50"], "h200-r3.png",
            "H200, r3 cells: 96 trials (6 tasks x 16); blue ResNet-18, orange ResNet-50; dashed: goal 5x")
    _rounds(plt, tuning, ["r4/resnet18", "r5/resnet18"], "h200-r4-r5.png",
            "H200 rounds r4 (blue) and r5 (orange, change not kept), ResNet-18, 96 trials; dashed: goal 5x")
    if (RESULTS / "h200-multi-job.json").exists():
        multi_job(plt)
    print("wrote", *(DOCS / n for n in ("h200-throughput.png", "h200-quality-over-time.png", "h200-quality-heatmap.png",
                                         "h200-r3.png", "h200-r4-r5.png")))
    return 0


def _rounds(plt: Any, tuning: dict[str, Any], keys: list[str], file: str, title: str) -> None:
    """Throughput and latency ratios of every run of the given rounds ("r3/resnet18", ...), each
    against the baseline of its own round and model, coloured by key, with the goals drawn in."""
    rows = [r for key in keys if key in tuning["by_round"]
            for r in tuning["by_round"][key]["sweep"] if r["mode"] == "sharetune"]
    if not rows:
        return
    names = [r["id"].replace("st-", "") for r in rows]
    fig, ax = plt.subplots(1, 2, figsize=(14, 4.6))
    palette = {f"{r.get('round') or 'r1-r2'}/{r['model']}": c for r, c in zip(
        [next(x for x in tuning["by_round"][k]["sweep"]) for k in keys if k in tuning["by_round"]],
        ["tab:blue", "tab:orange", "tab:green"])}
    colours = [palette[f"{r.get('round') or 'r1-r2'}/{r['model']}"] for r in rows]
    ax[0].bar(names, [r["throughput_ratio"] for r in rows], color=colours)
    for i, r in enumerate(rows):
        ax[0].text(i, r["throughput_ratio"],
                   f"{r['throughput_ratio']:.2f}x\n{r['wall_s']:.0f} s, cpu {r['cpu_util_mean_pct']:.0f}%",
                   ha="center", va="bottom", fontsize=8)
    ax[0].axhline(5, ls="--", color="k", lw=1)
    ax[0].set_ylim(0, 1.2 * max(r["throughput_ratio"] for r in rows))
    ax[0].set_ylabel("throughput ratio (trials/s vs the round's baseline)")
    ax[0].set_title(title, fontsize=9)
    ax[0].tick_params(axis="x", rotation=20, labelsize=8)
    lat = [r.get("latency_ratio") or 0 for r in rows]
    ax[1].bar(names, lat, color=colours)
    for i, v in enumerate(lat):
        ax[1].text(i, v, f"{v:.3f}", ha="center", va="bottom", fontsize=8)
    ax[1].axhline(1.05, ls="--", color="k", lw=1)
    ax[1].set_ylabel("end-to-end latency / baseline's (100% GPU, no MPS)")
    ax[1].set_title("tuned model quality (dashed: goal <= 1.05)", fontsize=9)
    ax[1].tick_params(axis="x", rotation=20, labelsize=8)
    fig.tight_layout()
    fig.savefig(DOCS / file, dpi=110)
    plt.close(fig)


def search_quality(plt: Any) -> None:
    """docs/h200-search-quality.png: per task, the distribution (CDF) of every candidate each cold
    search proposed in a first round, timed alone on the GPU; the fast end is what a round keeps."""
    from common import load_cells

    sq = json.loads((RESULTS / "h200-search-quality.json").read_text())
    rows = [r for r in load_cells("h200-search-quality.jsonl").values() if r["model"] == sq["model"]]
    arms = list(sq["arms"])
    tasks = list(sq["per_task"])
    colors = {"evolutionary": "black", "lite": "tab:orange", "short": "tab:green", "replay": "tab:blue"}
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, task in zip(axes.flat, tasks):
        lo, hi = float("inf"), 0.0
        for arm in arms:
            xs = sorted(x for r in rows if r["task_name"] == task for x in r["arms"][arm]["us"] if x is not None)
            lo, hi = min(lo, xs[0]), max(hi, xs[len(xs) // 2])
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", color=colors.get(arm),
                    label=f"{arm}: E[best of {sq['batch']}] "
                          f"{sq['per_task'][task][arm]['expected_best_of_batch_us']:.0f} us")
        ax.set_xscale("log")
        ax.set_xlim(0.9 * lo, 1.1 * hi)
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.set_ylim(0, 0.5)  # the fast half: a round keeps its best
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("candidate latency, us (alone on the GPU)", fontsize=8)
        ax.legend(fontsize=7, loc="upper left")
    axes.flat[0].set_ylabel("fraction of candidates at or below")
    summary = ", ".join(f"{a} {v['best_of_batch_vs_evolutionary_geomean']:.2f}x "
                        f"({v['search_cpu_s_vs_evolutionary']:.2f}x CPU)"
                        for a, v in sq["arms"].items() if a != "evolutionary")
    fig.suptitle(f"{sq['model']}: first-round candidates of each cold search, {sq['rows']} (seed, task) rounds; "
                 f"a round's best vs evolutionary: {summary}", fontsize=10)
    fig.tight_layout()
    fig.savefig(DOCS / "h200-search-quality.png", dpi=110)


def multi_job(plt: Any) -> None:
    """docs/h200-multi-job.png from h200-multi-job.json: makespans per seed; per job its delivered
    latency pool / solo and the co-tenancy shift; where the shards' CPU time went, pool vs solo."""
    mj = json.loads((RESULTS / "h200-multi-job.json").read_text())
    runs = mj["runs"]
    jobs = list(mj["jobs"])
    fig, ax = plt.subplots(1, 3, figsize=(16, 4.6))
    x = range(len(runs))
    ax[0].bar([i - 0.2 for i in x], [r["makespan_s"]["sequential"] for r in runs], 0.4, label="one after another",
              color="grey")
    ax[0].bar([i + 0.2 for i in x], [r["makespan_s"]["concurrent"] for r in runs], 0.4, label="one pool, concurrent",
              color="tab:blue")
    for i, r in enumerate(runs):
        ax[0].text(i + 0.2, r["makespan_s"]["concurrent"],
                   f"{r['makespan_ratio']:.2f}x\nGPU {r['gpu_util_mean']['concurrent']:.0f}%"
                   f"\nCPU {r['cpu_util_mean']['concurrent']:.0f}%", ha="center", va="bottom", fontsize=8)
    ax[0].set_xticks(list(x), [f"seed {r['seed']}" for r in runs])
    ax[0].set_ylabel("makespan of the three jobs, s")
    ax[0].set_ylim(0, 1.3 * max(r["makespan_s"]["sequential"] for r in runs))
    ax[0].set_title("ResNet-18 + MobileNet-V2 + ResNet-50, 96 trials each", fontsize=10)
    ax[0].legend(fontsize=8, loc="upper right")
    w = 0.8 / max(1, len(runs))
    for k, r in enumerate(runs):
        ax[1].bar([i + (k - (len(runs) - 1) / 2) * w for i in range(len(jobs))],
                  [r["jobs"][j].get("latency_ratio_vs_solo") or 0
                   for j in jobs], w * 0.9, label=f"seed {r['seed']}")
        for i, j in enumerate(jobs):
            shift = r["jobs"][j].get("co_tenancy_shift")
            if shift:
                ax[1].plot(i + (k - (len(runs) - 1) / 2) * w, shift, "kx")
    ax[1].axhline(1.05, ls="--", color="tab:red", lw=1)
    ax[1].axhline(1.0, ls=":", color="k", lw=1)
    ax[1].set_xticks(range(len(jobs)), jobs)
    ax[1].set_ylim(0.6, 1.4)
    ax[1].set_ylabel("pool / solo")
    by = {"evaluate": "evaluate, alone", "merge": "the merges' own measurement, alone"}
    src = " / ".join(sorted({by[r["jobs"][j]["latency_measured_by"]] for r in runs for j in jobs
                             if r["jobs"][j].get("latency_measured_by")}))
    ax[1].set_title(f"bars: delivered latency pool / solo ({src}); dashed: goal 1.05\n"
                    "x: co-tenancy shift of latencies measured while tuning", fontsize=9)
    ax[1].legend(fontsize=8)
    phases = [("build_s", "builds"), ("cost_model_s", "cost model"), ("sample_init_s", "init. population"),
              ("measure_s", "measuring"), ("first_records_s", "to first records")]
    means = {arm: [sum(r["jobs"][j]["cpu_phases_per_shard"][arm][k] for r in runs for j in jobs)
                   / (len(runs) * len(jobs))
                   for k, _ in phases] for arm in ("solo", "pool")}
    for k, (arm, color) in enumerate((("solo", "grey"), ("pool", "tab:blue"))):
        ax[2].bar([i + (k - 0.5) * 0.4 for i in range(len(phases))], means[arm], 0.4, color=color, label=arm)
    ax[2].set_xticks(range(len(phases)), [n for _, n in phases], fontsize=8)
    ax[2].set_ylabel("s per shard (mean over jobs and seeds)")
    ax[2].set_title("what limits the gain: the shards' CPU work on 16 shared cores", fontsize=10)
    ax[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(DOCS / "h200-multi-job.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
