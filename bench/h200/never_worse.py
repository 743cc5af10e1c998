"""Never-worse delivery on the H200: the headline configuration's tuned latency against stock, both delivered
by the never-worse merge (``sharetune_tuner.merge.merge_and_report``: per task the faster of the
best record and TVM's default schedule, and the whole model never slower than untuned).

Run the two cells of one round first (back to back, same machine), e.g.
  python3 bench/h200/tune_cell.py --id base-r18-r8 --mode baseline --round=r8
  python3 bench/h200/tune_cell.py --id st-r18-m6n6p50-i16-r8 --mode sharetune --clients 6 --servers 6 \
      --pct 50 --per-iter 16 --round=r8
then, on the same machine:
  python3 bench/h200/never_worse.py --stock base-r18-r8 --sharetune st-r18-m6n6p50-i16-r8
Writes ``$OUT/h200-never-worse.jsonl`` (one line per round) and the cells via ``export_results``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from common import RUN_ROOT, export_results, load_cells, log, tuner_env

KEEP = ("records", "latency_untuned_ms", "latency_tuned_ms", "speedup", "improved", "speedup_of_records",
        "tasks_left_at_default", "merge_s")


def merged(run_id: str) -> dict:
    from sharetune.api.spec import parse_spec
    from sharetune_tuner.merge import merge_and_report

    cell = load_cells("h200-cells.jsonl")[run_id]
    # Measured on the whole GPU without MPS, as the headline's latency always was.
    spec = parse_spec(f"nw-{run_id}", {"model": {"name": cell["model"]}, "target": "cuda",
                                       "gpuSharing": {"mps": False}, "clients": {"shards": len(cell["db_dirs"])},
                                       "seed": cell.get("seed", 0)})
    t0 = time.monotonic()
    s = asdict(merge_and_report(spec, [Path(d) for d in cell["db_dirs"]], RUN_ROOT / "never-worse" / run_id))
    out = {k: s.get(k) for k in KEEP if k in s}
    out["tasks"] = [{k: t.get(k) for k in ("name", "trials", "best_latency_us", "default_us", "tuned_us", "winner")
                     if k in t} for t in s.get("tasks", [])]
    out["wall_s"] = round(time.monotonic() - t0, 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stock", required=True, help="the round's stock baseline cell id")
    ap.add_argument("--sharetune", required=True, help="the round's sharetune cell id")
    a = ap.parse_args()
    os.environ.update(tuner_env())
    res = {"round": a.sharetune.rsplit("-", 1)[-1], "stock": merged(a.stock), "sharetune": merged(a.sharetune)}
    res["latency_ratio"] = round(res["sharetune"]["latency_tuned_ms"] / res["stock"]["latency_tuned_ms"], 4)
    log(f"stock {res['stock']['latency_tuned_ms']} ms, sharetune {res['sharetune']['latency_tuned_ms']} ms: "
        f"ratio {res['latency_ratio']}")
    out = os.environ.get("OUT")
    if out:
        with open(Path(out) / "h200-never-worse.jsonl", "a") as f:
            f.write(json.dumps(res) + "\n")
        export_results()
    print(json.dumps({k: res[k] for k in ("round", "latency_ratio")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
