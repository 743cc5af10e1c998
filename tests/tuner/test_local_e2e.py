"""The README's main job, for real: local mode with tracker + 2 servers + 2 clients on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sharetune.api.progress import VERSION as PROGRESS_VERSION
from sharetune.api.progress import Progress
from sharetune.api.topology import PROGRESS_FILE
from sharetune_tuner.store import records

from .conftest import EXAMPLE

pytestmark = pytest.mark.tvm


def test_local_run_tunes_merges_and_beats_untuned(tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    r = subprocess.run([sys.executable, "-m", "sharetune.cli", "run", str(EXAMPLE), "--local",
                        "--workdir", str(tmp_path / "run"), "--json", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads(out.read_text())
    shard_totals = [records.stats(tmp_path / "run" / "shards" / f"shard-{i}").total for i in range(2)]
    assert all(n > 0 for n in shard_totals)  # both shards tuned
    assert s["records"] == sum(shard_totals) == 48  # the merged store holds every trial
    assert s["workloads"] == 4 and s["best_records"] == sum(t["winner"] == "tuned" for t in s["tasks"]) >= 3
    assert s["max_relative_error"] < 1e-3  # the tuned model computes what the untuned one does
    assert s["speedup"] > 1.5, s  # and is faster (measured 5.9x with this budget)
    tuned = [t for t in s["tasks"] if t["flops"] > 1e6]
    assert tuned and all(t["trials"] >= 8 and t["best_latency_us"] for t in tuned)
    assert "end-to-end latency: untuned" in r.stdout
    # The two clients built every candidate in the shared build service (none fell back).
    service_log = (tmp_path / "run" / "logs" / "build-service.log").read_text()
    assert "build service stopped: 48 builds (ok 48" in service_log, service_log[-2000:]
    for i in range(2):
        assert "unusable" not in (tmp_path / "run" / "logs" / f"client-{i}.log").read_text()
        # What each client wrote reads through the contract's Progress, and round-trips.
        text = (tmp_path / "run" / "shards" / f"shard-{i}" / PROGRESS_FILE).read_text()
        p = Progress.from_json(text)
        assert p is not None and p.version == PROGRESS_VERSION and p.state == "done" and p.shard == i
        assert p.done == shard_totals[i] == sum(t.done for t in p.tasks) <= p.budget and p.best_s
        assert Progress.from_json(p.to_json()) == p
    # Nothing left running: the run's processes were stopped by process group.
    ps = subprocess.run(["pgrep", "-f", str(tmp_path / "run")], capture_output=True, text=True)
    assert ps.stdout.strip() == ""
