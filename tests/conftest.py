"""Shared fixtures: one real local control plane per test session."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml
from kubernetes import client

if TYPE_CHECKING:
    from sharetune_dev.cluster.harness import LocalCluster
    from sharetune_dev.cluster.s3 import LocalS3


@pytest.fixture(scope="session")
def cluster() -> Iterator["LocalCluster"]:
    from sharetune_dev.cluster.harness import FakeNode, LocalCluster

    c = LocalCluster(nodes=[FakeNode("kwok-gpu-0", gpus=1), FakeNode("kwok-cpu-0", gpus=0)])
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def k8s(cluster):
    """A kubernetes ApiClient bound to the session's cluster."""
    from kubernetes import config

    return config.new_client_from_config(config_file=str(cluster.kubeconfig))


@pytest.fixture(scope="session")
def s3() -> Iterator["LocalS3"]:
    """A real S3-compatible server (gofakes3, built from source) on loopback."""
    from sharetune_dev.cluster.s3 import LocalS3

    srv = LocalS3().start()
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture()
def ns(k8s):
    """A namespace of the test's own on the session's cluster."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(k8s).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    yield name
    # Tests share one cluster with one GPU: give back what this test held.
    client.CoreV1Api(k8s).delete_namespace(name)


CRD = Path(__file__).parents[1] / "crds" / "tuningjobs.sharetune.io.yaml"


def install_crd(k8s: Any) -> None:
    """Creates the TuningJob CRD (if missing) and waits until the API server serves it."""
    ext = client.ApiextensionsV1Api(k8s)
    body = yaml.safe_load(CRD.read_text())
    try:
        ext.create_custom_resource_definition(body)
    except client.ApiException as e:
        if e.status != 409:
            raise
    _wait("CRD established", lambda: any(
        c.type == "Established" and c.status == "True"
        for c in (ext.read_custom_resource_definition(body["metadata"]["name"]).status.conditions or [])))


@pytest.fixture(scope="session")
def crd(k8s) -> None:
    install_crd(k8s)


class Operator:
    """Starts/stops the kopf operator in a thread of this process (restartable mid-test)."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.runner: Any = None

    def start(self) -> None:
        from kopf.testing import KopfRunner

        os.environ["KUBECONFIG"] = str(self.kubeconfig)
        os.environ["SHARETUNE_STATUS_INTERVAL"] = "1"
        # The session's cuda jobs pin today's one-daemon-per-job behaviour; GPU pools have a
        # cluster of their own (tests/operator/test_gpu_pools.py).
        os.environ["SHARETUNE_GPU_SHARING_MODE"] = "exclusive"
        self.runner = KopfRunner(["run", "-A", "--standalone", "-m", "sharetune.controller.handlers"],
                                 timeout=60)
        self.runner.__enter__()

    def stop(self) -> None:
        if self.runner is not None:
            self.runner.__exit__(None, None, None)
            self.runner = None


@pytest.fixture(scope="session")
def operator(cluster, crd) -> Iterator[Operator]:
    op = Operator(cluster.kubeconfig)
    op.start()
    try:
        yield op
    finally:
        op.stop()




def _wait(what: str, fn: Any, timeout_s: float = 60.0) -> Any:
    from .helpers import wait_for

    return wait_for(what, fn, timeout_s)
