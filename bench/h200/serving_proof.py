"""The merge's serving report on the H200: a finished tuning cell's shards merged by the real
``sharetune_tuner.merge.merge_and_report`` (what the merge pod and local mode run) as an MPS client of
a job-style MPS daemon (``sharetune_tuner.measure.mps.MpsDaemon``), so summary.json gets
``latency_ms_by_serving_pct``. Writes ``$OUT/h200-serving-report.json``.

  python3 bench/h200/serving_proof.py [--run st-r18-m6n6p10-pop8] [--prior-runs h200-runs.tar.gz]

The run's record databases must be under $BENCH_RUN_ROOT/runs (a sweep on this machine, or
``--prior-runs`` / ``$BENCH_PRIOR_RUNS``: a sweep's h200-runs.tar.gz, restored on a fresh machine).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from common import RUN_ROOT, add_prior_runs_arg, load_cells, log, restore_runs, tuner_env


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", default="st-r18-m6n6p10-pop8")
    add_prior_runs_arg(ap)
    a = ap.parse_args()
    os.environ.update(tuner_env())
    restore_runs(a.prior_runs)
    cell = load_cells("h200-cells.jsonl")[a.run]
    from sharetune.api.spec import parse_spec
    from sharetune_tuner.measure.mps import MpsDaemon
    from sharetune_tuner.merge import merge_and_report

    spec = parse_spec(f"serving-{a.run}", {"model": {"name": cell["model"]}, "target": "cuda",
                                          "gpuSharing": {"mps": True}, "clients": {"shards": len(cell["db_dirs"])},
                                          "servers": {"threadPercentage": cell["thread_pct"]}})
    mps = RUN_ROOT / "proof-mps"
    os.environ["CUDA_MPS_PIPE_DIRECTORY"] = str(mps / "pipe")
    os.environ["CUDA_MPS_LOG_DIRECTORY"] = str(mps / "log")
    daemon = MpsDaemon(mps / "pipe", mps / "log")
    t0 = time.monotonic()
    daemon.start()
    try:
        summary = asdict(merge_and_report(spec, [Path(d) for d in cell["db_dirs"]], RUN_ROOT / "proof" / a.run))
    finally:
        daemon.stop()
    res = {"run": a.run, "tuned_at_pct": cell["thread_pct"], "wall_s": round(time.monotonic() - t0, 1),
           "summary": summary}
    log(f"serving report: {summary.get('latency_ms_by_serving_pct')}")
    out = os.environ.get("OUT")
    if out:
        (Path(out) / "h200-serving-report.json").write_text(json.dumps(res, indent=2))
    print(json.dumps({k: summary.get(k) for k in ("latency_tuned_ms", "latency_ms_by_serving_pct")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
