"""A client killed with SIGKILL mid-tuning resumes from its records: no trial lost, none redone."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from sharetune_tuner.store import records

from .conftest import Topology, example_job, tuner, wait_until

pytestmark = pytest.mark.tvm


def test_kill9_then_resume(topology: Topology, tmp_path: Path) -> None:
    job = example_job(tmp_path, trials={"total": 20, "perTask": 8, "perIteration": 2},
                      clients={"shards": 1, "builderWorkers": 1})
    work = tmp_path / "shard-0"
    args = ["client", "--job", str(job), "--shard", "0", "--work-dir", str(work),
            "--tracker", topology.tracker_addr, "--key", topology.key]

    first = tuner(args, tmp_path / "client1.log")
    wait_until(lambda: records.stats(work).total >= 6, 240, "6 records")
    first.stop(signal.SIGKILL)
    before = records.stats(work).total
    assert 6 <= before < 20

    second = tuner(args, tmp_path / "client2.log")
    assert second.popen.wait(timeout=300) == 0, second.text()[-3000:]
    result = json.loads(second.text().strip().splitlines()[-1])
    after = records.stats(work)
    assert result["resumed"] == before  # it counted what the killed client had saved
    assert after.total == result["budget"] == 20  # budget met exactly: nothing redone, nothing lost
    assert result["done"] == 20
    # Every trial of the killed client is still there, byte for byte, at the head of the file.
    progress = json.loads((work / "progress.json").read_text())
    assert progress["state"] == "done" and sum(t["done"] for t in progress["tasks"]) == 20
