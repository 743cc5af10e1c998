"""Writes bench/results/fault-matrix.json: one row per fault injected into a mid-tuning job
(tests/faults/scenarios.py), from one run of the fault test suite.

  .venv/bin/python bench/fault_matrix.py

Columns: job_succeeded, records_lost (records measured before the fault that are missing from
the merged result), trials_redone (trials measured more than once because a copy was lost),
recovery_s (fault -> the job's status shows new trials or a later phase), plus context.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    rows_file = Path(tempfile.mkstemp(prefix="fault-rows-", suffix=".jsonl")[1])
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/faults", *sys.argv[1:]],
                       cwd=ROOT, env={**os.environ, "SHARETUNE_FAULT_ROWS": str(rows_file)})
    rows = [json.loads(line) for line in rows_file.read_text().splitlines() if line.strip()]
    out = {
        "what": "A 16-trial tiny_cnn CPU TuningJob (2 shards, 2 servers) on the local control plane, operator as a "
                "process, the pods' tuner commands run by devtools/sharetune_dev/podsim.py; one fault injected "
                "once >= 4 "
                "trials are done. The MPS row runs a cuda+MPS job's pods on the CPU with a stand-in MPS control "
                "binary (no GPU here): it tests detection and recovery, not the NVIDIA daemon.",
        "goal": "every row job_succeeded with records_lost = 0",
        "goal_met": bool(rows) and all(x["job_succeeded"] and x["records_lost"] == 0 for x in rows),
        "pytest_exit": r.returncode,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "wall_s": round(time.monotonic() - t0, 1),
        "rows": rows,
    }
    path = ROOT / "bench" / "results" / "fault-matrix.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("goal_met", "pytest_exit", "wall_s")}))
    return 0 if out["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
