"""Faults while a job is mid-tuning (issue: nothing lost, nothing crashes).

Each test runs a real 16-trial CPU TuningJob on a control plane of this module's own (so
restarting its API server or etcd disturbs no other test), with the operator as a process and
the pods' tuner commands run by the process kubelet (sharetune_dev.podsim), injects one fault,
and checks: the job Succeeded, every record measured before the fault is in the merged result,
no child object exists twice. The MPS row mocks the GPU (see scenarios.py / podsim.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict

import pytest

from .scenarios import FAULTS, FaultEnv, run_fault

pytestmark = [pytest.mark.cluster, pytest.mark.faults]


@pytest.fixture(scope="module")
def fault_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultEnv]:
    from kubernetes import config

    from sharetune_dev.cluster.harness import FakeNode, LocalCluster
    from sharetune_dev.cluster.s3 import LocalS3

    cluster = LocalCluster(nodes=[FakeNode("kwok-gpu-0", gpus=1), FakeNode("kwok-cpu-0", gpus=0)]).start()
    s3 = LocalS3().start()
    try:
        from ..conftest import install_crd

        k8s = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        install_crd(k8s)
        yield FaultEnv(cluster, k8s, s3, tmp_path_factory.mktemp("faults"))
    finally:
        s3.close()
        cluster.stop()


@pytest.mark.parametrize("fault", FAULTS)
def test_job_survives_fault_without_losing_records(fault_env: FaultEnv, fault: str) -> None:
    row = run_fault(fault_env, fault)
    print(row)
    out = os.environ.get("SHARETUNE_FAULT_ROWS")  # bench/fault_matrix.py collects the rows
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(asdict(row)) + "\n")
    assert row.job_succeeded, row
    assert row.records_before_fault > 0, "the fault must hit a job mid-tuning"
    assert row.records_lost == 0, row
    assert row.records_in_result >= 16, row  # the whole budget is in the result
    assert row.duplicated_children == [], row
    assert row.secret_leaks == [], row.secret_leaks
    if fault == "pool_daemon_killed":  # both jobs' servers were rolled against the restarted pool
        assert "servers rolled: ['ft', 'fu']" in row.notes, row
    if fault == "mps_daemon_killed":
        assert "mpsRecoveries=" in row.notes
