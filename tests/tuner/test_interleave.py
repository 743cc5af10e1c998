"""A client tunes its shard's tasks together, not one after the other (client.run_client,
capped_search.py): every task's first round is measured before any task's second, each task
stops exactly at its own budget (budgets differ: proportional to cost), and no candidate is
measured twice for a task. A real client (the CLI) on real tasks (llvm, real RPC servers)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from sharetune_tuner import records

from .conftest import Topology, example_job, tuner

pytestmark = pytest.mark.tvm
PER_ITER = 4


def test_tasks_take_turns_and_each_stops_at_its_budget(topology: Topology, tmp_path: Path) -> None:
    job = example_job(tmp_path, trials={"total": 20, "perTask": 12, "perIteration": PER_ITER},
                      clients={"shards": 1, "builderWorkers": 1})
    work = tmp_path / "shard-0"
    client = tuner(["client", "--job", str(job), "--shard", "0", "--work-dir", str(work),
                    "--tracker", topology.tracker_addr, "--key", topology.key], tmp_path / "client.log")
    assert client.popen.wait(timeout=300) == 0, client.text()[-3000:]
    progress = json.loads((work / "progress.json").read_text())
    budget = {t["workload_hash"]: t["budget"] for t in progress["tasks"]}
    assert len(budget) == 2 and len(set(budget.values())) == 2, progress["tasks"]  # two tasks, unequal budgets

    hashes = [str(w[0]) for w in records.read_lines(work / records.WORKLOADS)]
    lines = records.read_lines(work / records.RECORDS)
    order = [hashes[idx] for idx, _ in lines]  # the workload of each record, in measurement order
    assert Counter(order) == budget  # each task exactly its budget
    # Taking turns: both tasks' first rounds come before either task's second.
    assert set(order[: 2 * PER_ITER]) == set(budget), order
    # No schedule measured twice for a task.
    traces = [(hashes[idx], json.dumps(body[0], sort_keys=True)) for idx, body in lines]
    assert len(set(traces)) == len(traces)
