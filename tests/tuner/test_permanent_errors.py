"""Local mode does not restart a client that failed with a user error (a model TVM cannot load is
exit 3; no GPU for a cuda job, exit 4): it stops at once with that error, where a crash would be
retried."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from sharetune.api.spec import load_job
from sharetune.gpus import gpu_count
from sharetune.local.run import LocalRun, RunFailed

from .conftest import example_job

pytestmark = [pytest.mark.tvm]


def test_a_model_error_stops_local_mode_without_restarts(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"apiVersion": "sharetune.io/v1alpha1", "kind": "TuningJob",
                                   "metadata": {"name": "bad"},
                                   "spec": {"model": {"onnx": {"path": str(bad)}, "inputShape": [1, 3, 8, 8]},
                                            "clients": {"shards": 1, "builderWorkers": 1},
                                            "servers": {"replicas": 1}}}))
    run = LocalRun(load_job(job), job, tmp_path / "run")
    t0 = time.monotonic()
    try:
        run.start_services()
        with pytest.raises(RuntimeError, match=r"client 0 failed \(model error, not retried\)") as e:
            run.run_clients()
    finally:
        run.stop_all()
    assert "is not a valid ONNX model" in str(e.value)
    assert [p.name for p in run.procs].count("client-0") == 1  # started once
    assert time.monotonic() - t0 < 120


@pytest.mark.skipif(gpu_count() > 0, reason="this host has a GPU")
def test_a_client_that_finds_no_gpu_is_not_restarted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A target error is one a cluster retries (the next pod may land on a node with a GPU), but in
    local mode every client runs on this machine and would find no GPU again."""
    monkeypatch.delenv("SHARETUNE_CUDA_ARCH", raising=False)
    job = example_job(tmp_path, target="cuda", gpuSharing={"mps": False}, servers={"replicas": 1},
                      clients={"shards": 1})
    run = LocalRun(load_job(job), job, tmp_path / "run")
    try:
        # No tracker, no servers: the client fails on its target before it looks for a server.
        with pytest.raises(RunFailed, match=r"client 0 failed \(target error, not retried\)") as e:
            run.run_clients()
    finally:
        run.stop_all()
    assert "NVML found none" in str(e.value) and e.value.exit_code == 4
    assert [p.name for p in run.procs].count("client-0") == 1  # started once
