"""Several jobs at once in local mode (`sharetune run A.yaml B.yaml --local`, sharetune.local.pool):
the local ledger's admission order, and two real CPU jobs tuned side by side to their merged
results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sharetune.local.multi import load
from sharetune.local.pool import LocalPool, host_clients, note_co_tenants, pooled
from sharetune_tuner.build.cpus import cost_model_threads


def _write(tmp: Path, name: str, **spec: Any) -> Path:
    base: dict[str, Any] = {"model": {"name": "tiny_cnn", "inputShape": [1, 3, 64, 64]}, "target": "llvm",
                            "trials": {"total": 8, "perTask": 4, "perIteration": 2},
                            "servers": {"replicas": 1}, "clients": {"shards": 1, "builderWorkers": 1}}
    base.update(spec)
    p = tmp / f"{name}.yaml"
    p.write_text(yaml.safe_dump({"apiVersion": "sharetune.io/v1alpha1", "kind": "TuningJob",
                                 "metadata": {"name": name}, "spec": base}))
    return p


def _cuda(tmp: Path, name: str, share: int) -> Path:
    return _write(tmp, name, target="cuda", gpuSharing={"share": share},
                  servers={"replicas": 1, "threadPercentage": share})


def test_one_gpu_is_shared_first_come_first_served(tmp_path: Path) -> None:
    """No GPU needed: the ledger's decisions only (the MPS daemons start in `start`, on the H200)."""
    jobs = load([_cuda(tmp_path, "a", 60), _cuda(tmp_path, "b", 60), _cuda(tmp_path, "c", 30)], tmp_path / "runs")
    assert all(pooled(j.spec) for j in jobs)
    pool = LocalPool(tmp_path / "pool", gpus=1)
    admitted, never = pool.admit(jobs)
    assert [j.spec.name for j in admitted] == ["a"] and not never
    # c (30%) would fit beside a, but b came first and waits: no backfill past the head.
    admitted, _ = pool.admit(jobs[1:])
    assert admitted == []
    pool.release(jobs[0])
    admitted, _ = pool.admit(jobs[1:])
    assert [j.spec.name for j in admitted] == ["b", "c"]  # 60 + 30 <= 100
    assert {d.index for j in admitted for d in j.placement.devices} == {0}
    for j in admitted:
        j.state = "running"
    note_co_tenants(jobs, 5.0)
    assert set(jobs[1].co_tenants) == {"c"} and set(jobs[2].co_tenants) == {"b"} and not jobs[0].co_tenants


def test_a_job_that_can_never_fit_and_duplicate_names_are_refused(tmp_path: Path) -> None:
    jobs = load([_write(tmp_path, "big", target="cuda", gpuSharing={"share": 100, "gpus": 2},
                        servers={"replicas": 1, "threadPercentage": 100})], tmp_path / "runs")
    _, never = LocalPool(tmp_path / "pool", gpus=1).admit(jobs)
    assert "big" in never
    with pytest.raises(SystemExit, match="metadata.name 'x' is used by another job"):
        load([_write(tmp_path, "x"), _write(tmp_path, "x")], tmp_path / "runs")


@pytest.mark.tvm
def test_two_cpu_jobs_run_side_by_side_to_their_results(tmp_path: Path) -> None:
    a, b = _write(tmp_path, "left"), _write(tmp_path, "right", seed=1)
    out = tmp_path / "summary.json"
    r = subprocess.run([sys.executable, "-m", "sharetune.cli", "run", str(a), str(b), "--local",
                        "--workdir", str(tmp_path / "runs"), "--json", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    s = json.loads(out.read_text())
    by = {j["job"]: j for j in s["jobs"]}
    assert set(by) == {"left", "right"}
    for name, other in (("left", "right"), ("right", "left")):
        j = by[name]
        assert j["state"] == "done" and j["records"] == 8 and j["max_relative_error"] < 1e-3
        assert other in j["co_tenants"]  # they ran at the same time, and each summary says so
        assert (tmp_path / "runs" / name / "result" / "summary.json").exists()
    assert "2 jobs in" in r.stdout and "left" in r.stdout and "right" in r.stdout
    # Each job's client knew the other job's client shared the host's CPUs (its threads sized by that).
    for name in ("left", "right"):
        log = (tmp_path / "runs" / name / "logs" / "client-0.log").read_text()
        assert f"cost model {cost_model_threads(2)} (2 clients on this host)" in log, log[-2000:]


def test_clients_count_every_running_job_on_the_host(tmp_path: Path) -> None:
    """A local pool's jobs share the host's CPUs: a job starting beside others sizes its clients'
    threads by all their clients; a job that has finished no longer counts."""
    jobs = load([_write(tmp_path, n, clients={"shards": k}, trials={"total": 4 * k, "perTask": 4, "perIteration": 2})
                 for n, k in (("a", 1), ("b", 2), ("c", 3))], tmp_path / "runs")  # budgets that keep k shards busy
    assert host_clients(jobs, jobs) == 6  # started together
    jobs[0].state = "running"
    assert host_clients(jobs, [jobs[2]]) == 1 + 3  # b still queued
    jobs[0].state = "done"
    assert host_clients(jobs, [jobs[1]]) == 2
    assert cost_model_threads(6, cpus=16) == 2 and cost_model_threads(1, cpus=16) == 16
    assert cost_model_threads(64, cpus=16) == 1
