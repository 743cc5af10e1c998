"""Runs the H200 benchmark plan cell by cell within one device command's time, skipping cells
already in the results files, so the same command can simply be repeated until the plan is done:

  source .device/tvm-b/install.sh && python3 bench/h200/sweep.py --budget-s 530

A cell starts only if its estimated duration fits in what is left of ``--budget-s``; what came out
(results JSON-lines, the runs' record databases, the log) is copied to $OUT.

The record databases go to ``$OUT/h200-runs.tar.gz`` for the operator of the sweep: keep it
(``bench/results/*.tar.gz`` is git-ignored, never committed) and hand it back with
``--prior-runs`` (or ``$BENCH_PRIOR_RUNS``) so a fresh machine restores the earlier runs; without
it the sweep starts without them. bench/h200/README.md says how to get the last committed one back
from git history.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from common import RUN_ROOT, add_prior_runs_arg, export_results, load_cells, log, restore_runs, tuner_env

HERE = Path(__file__).resolve().parent
CELLS, PROFILE, EVAL = "h200-cells.jsonl", "h200-profile.jsonl", "h200-eval.jsonl"


def plan(model: str, tasks: int, trials: int) -> list[dict]:
    base = ["--model", model, "--tasks", str(tasks), "--trials", str(trials)]
    m = "r18" if model == "resnet18" else "r50"

    def st(clients: int, servers: int, pct: int, extra: list[str] | None = None, suffix: str = "") -> dict:
        cid = f"st-{m}-m{clients}n{servers}p{pct}{suffix}"
        return {"id": cid, "file": CELLS, "est": 150,
                "argv": ["tune_cell.py", "--id", cid, "--mode", "sharetune", *base, "--clients", str(clients),
                         "--servers", str(servers), "--pct", str(pct), *(extra or [])]}

    # The r3 cells' evaluation measures end-to-end latency at 100% only (the quality matrix is the r1-r2 cells').
    ev_r3 = {"id": "evaluate-r3", "file": None, "round": "r3", "est": 330,
             "argv": ["evaluate.py", "--model", model, "--serve", ""]}
    ev_r4 = {**ev_r3, "id": "evaluate-r4", "round": "r4"}
    # Cells already in the results files are skipped. The first five ran on 2026-12-02; the two P=10
    # sharetune cells ran before build_without_intrinsics (and st-r18-m6n6p10 with 32 candidates of
    # population per candidate): the -v2 cells rerun the current code.
    return [
        {"id": f"base-{m}", "file": CELLS, "est": 380,
         "argv": ["tune_cell.py", "--id", f"base-{m}", "--mode", "baseline", *base]},
        {"id": "profile-r18", "file": PROFILE, "est": 200, "argv": ["profile_trial.py", "--id", "profile-r18"]},
        st(6, 6, 10),
        st(6, 6, 10, ["--pop-per-cand", "8"], "-pop8"),
        st(6, 6, 100),
        # the rest of the quality matrix's tuning shares, and topology variants (ran 2026-12-02)
        st(6, 6, 25, suffix="-v2"),
        st(6, 6, 50, suffix="-v2"),
        st(6, 6, 75, suffix="-v2"),
        st(6, 6, 10, suffix="-v2"),
        st(3, 3, 100, suffix="-v2"),
        st(6, 12, 100, suffix="-v2"),
        # (the evaluations of these rounds ran between them; all done)
        # r3 (ran 2026-12-02 on whichever GPU the machine had: the cells record it): the
        # tensor-intrinsics cache in every client (start-up), its own baseline on the same machine,
        # and candidates per round = 16, the baseline's batch per task (one search round per task).
        {"id": f"base-{m}-r3", "file": CELLS, "est": 390,
         "argv": ["tune_cell.py", "--id", f"base-{m}-r3", "--mode", "baseline", "--round", "r3", *base]},
        st(6, 12, 100, ["--round", "r3"], "-r3"),
        st(6, 12, 100, ["--round", "r3", "--per-iter", "16"], "-i16-r3"),
        ev_r3,
        st(6, 6, 50, ["--round", "r3", "--per-iter", "16"], "-i16-r3"),
        st(6, 12, 100, ["--round", "r3", "--per-iter", "16", "--seed", "1"], "-i16-s1-r3"),
        dict(ev_r3),
        # r4: the headline topology with the start-up/tail fixes (services wait for
        # readiness instead of fixed sleeps, 0.25 s polls, no cost-model training after a shard's last
        # batch), first with r3's 6 builder workers per client, then with the product default (one per
        # core: a straggling shard can then use the cores the finished ones left), then seed 1.
        {"id": f"base-{m}-r4", "file": CELLS, "est": 390,
         "argv": ["tune_cell.py", "--id", f"base-{m}-r4", "--mode", "baseline", "--round", "r4", *base]},
        st(6, 6, 50, ["--round", "r4", "--per-iter", "16", "--builder-workers", "16"], "-i16-w16-r4"),
        st(6, 6, 50, ["--round", "r4", "--per-iter", "16"], "-i16-r4"),
        st(6, 6, 50, ["--round", "r4", "--per-iter", "16", "--builder-workers", "16", "--seed", "1"], "-i16-w16-s1-r4"),
        ev_r4,
        # r5: clients start at once, with the MPS daemon and the tracker; servers
        # follow when both are ready; a client waits for the tracker only at its first measurement.
        # Measured slower than r4 and reverted (the change: bench/h200/README.md, from git history):
        # re-running these cells now measures the r4 code.
        {"id": f"base-{m}-r5", "file": CELLS, "est": 330,
         "argv": ["tune_cell.py", "--id", f"base-{m}-r5", "--mode", "baseline", "--round", "r5", *base]},
        st(6, 6, 50, ["--round", "r5", "--per-iter", "16"], "-i16-r5"),
        st(6, 6, 50, ["--round", "r5", "--per-iter", "16", "--seed", "1"], "-i16-s1-r5"),
        {**ev_r3, "id": "evaluate-r5", "round": "r5"},
        st(6, 6, 50, ["--round", "r5", "--per-iter", "16", "--builder-workers", "8"], "-i16-w8-r5"),
        # r6: the clients share one build service of the host's 16 cores
        # (build/service.py, local mode's default now) against r4's 6 workers per client (-w6),
        # both against this round's own baseline; then seed 1.
        {"id": f"base-{m}-r6", "file": CELLS, "est": 330,
         "argv": ["tune_cell.py", "--id", f"base-{m}-r6", "--mode", "baseline", "--round", "r6", *base]},
        st(6, 6, 50, ["--round", "r6", "--per-iter", "16"], "-i16-r6"),
        st(6, 6, 50, ["--round", "r6", "--per-iter", "16", "--builder-workers", "6"], "-i16-w6-r6"),
        st(6, 6, 50, ["--round", "r6", "--per-iter", "16", "--seed", "1"], "-i16-s1-r6"),
        st(6, 6, 50, ["--round", "r6", "--per-iter", "16"], "-i16-rep-r6"),
        {**ev_r3, "id": "evaluate-r6", "round": "r6"},
        # r7: r6's cells ran on two machines (the second ~1.5x slower: intrinsics cache 29.9 s vs
        # 20.1 s), so the shared-service vs own-pool A/B is repeated on one machine, two seeds each,
        # interleaved. No baseline cell (not run).
        st(6, 6, 50, ["--round", "r7", "--per-iter", "16"], "-i16-r7"),
        st(6, 6, 50, ["--round", "r7", "--per-iter", "16", "--builder-workers", "6"], "-i16-w6-r7"),
        st(6, 6, 50, ["--round", "r7", "--per-iter", "16", "--seed", "1"], "-i16-s1-r7"),
        st(6, 6, 50, ["--round", "r7", "--per-iter", "16", "--builder-workers", "6", "--seed", "1"], "-i16-w6-s1-r7"),
    ]


def st_estimate(step: dict, fallback: float) -> float:
    """A sharetune cell's duration: the finished cell of the current code (the ones that record their
    builder) with the same topology and the nearest share, plus a margin."""
    argv = step["argv"]
    key = (int(argv[argv.index("--clients") + 1]), int(argv[argv.index("--servers") + 1]))
    pct = int(argv[argv.index("--pct") + 1])
    done = [c for c in load_cells(CELLS).values() if c.get("mode") == "sharetune" and c.get("builder")
            and (c.get("clients"), c.get("servers")) == key and c.get("wall_s")]
    if not done:
        return fallback
    near = min(done, key=lambda c: (abs(c["thread_pct"] - pct), -c["wall_s"]))
    return near["wall_s"] + 35


def pending_eval(model: str, round_: str | None) -> list[str]:
    cells, done = load_cells(CELLS), load_cells(EVAL)
    return [c["id"] for c in cells.values() if c.get("model") == model and c.get("round") == round_
            and f"eval-{c['id']}" not in done
            and all((Path(d) / "database_tuning_record.json").exists() for d in c["db_dirs"])]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=530)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--tasks", type=int, default=6)
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--only", default="", help="comma list of cell ids to run (default: the whole plan)")
    ap.add_argument("--dry-run", action="store_true")
    add_prior_runs_arg(ap)
    a = ap.parse_args()
    t0 = time.monotonic()
    os.environ.update(tuner_env())
    RUN_ROOT.mkdir(parents=True, exist_ok=True)
    restore_runs(a.prior_runs)  # a fresh machine: earlier runs, if given
    # The tuner image ships TVM's tensor intrinsics pre-parsed (Dockerfile); on this machine the
    # same cache is built once here, before any timed cell (sharetune_tuner/model/intrinsics.py).
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "sharetune_tuner.model.intrinsics"], capture_output=True, text=True)
    log(f"sweep: intrinsics cache {r.stdout.strip() or r.stderr[-500:]} ({time.monotonic() - t:.1f} s)")
    st_walls = [c["wall_s"] for c in load_cells(CELLS).values() if c.get("mode") == "sharetune"]
    for step in plan(a.model, a.tasks, a.trials):
        if a.only and step["id"] not in a.only.split(","):
            continue
        if step["file"] is None:
            runs = pending_eval(a.model, step.get("round"))
            if not runs:
                continue
            est = 60 + 20 * len(runs)  # measured: evaluate-r4, 4 runs, 55 s
            step = {**step, "argv": [*step["argv"], "--runs", ",".join(runs)]}
        else:
            if step["id"] in load_cells(step["file"]):
                continue
            est = step["est"]
            if step["id"].startswith("st-") and st_walls:
                est = st_estimate(step, max(st_walls) + 40)
        left = a.budget_s - (time.monotonic() - t0)
        if est > left:
            log(f"sweep: {step['id']} needs ~{est:.0f} s, {left:.0f} s left: stopping here")
            break
        log(f"sweep: {step['id']} (~{est:.0f} s, {left:.0f} s left)")
        if a.dry_run:
            continue
        with open(RUN_ROOT / "sweep.log", "a") as f:
            f.write(f"\n=== {step['id']} {time.strftime('%H:%M:%S')}\n")
            f.flush()
            try:
                r = subprocess.run([sys.executable, str(HERE / step["argv"][0]), *step["argv"][1:]],
                                   stdout=f, stderr=subprocess.STDOUT, timeout=max(30.0, left - 5))
                log(f"sweep: {step['id']} exited {r.returncode}")
            except subprocess.TimeoutExpired:
                log(f"sweep: {step['id']} ran out of time")
        if step["id"].startswith("st-"):
            st_walls = [c["wall_s"] for c in load_cells(CELLS).values() if c.get("mode") == "sharetune"]
        os.system(f"tail -n 4 {RUN_ROOT / 'sweep.log'} >&2")
    export_results()
    out = os.environ.get("OUT")
    if out and not a.dry_run:  # for the operator of the sweep (--prior-runs next time), not for git
        with tarfile.open(Path(out) / "h200-runs.tar.gz", "w:gz") as tar:
            for p in (RUN_ROOT / "runs").glob("*/**/*"):
                if p.is_file() and (p.name.startswith("database_") or p.name in ("progress.json", "client.json",
                                                                                 "job.yaml", "prepared.json")):
                    tar.add(p, arcname=str(p.relative_to(RUN_ROOT)))
                # the -r6 and -r7 cells: the processes' logs too (a failed trial's reason is in them)
                elif p.suffix == ".log" and p.parent.name == "logs" and p.stat().st_size < 2_000_000 \
                        and any(p.parent.parent.name.endswith(r) for r in ("-r6", "-r7")):
                    tar.add(p, arcname=str(p.relative_to(RUN_ROOT)))
        if (RUN_ROOT / "sweep.log").exists():
            (Path(out) / "sweep.log").write_text((RUN_ROOT / "sweep.log").read_text()[-400_000:])
    log(f"sweep: done in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
