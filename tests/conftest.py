"""Shared fixtures: one real local control plane per test session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session")
def cluster() -> Iterator["LocalCluster"]:
    from sharetune.cluster.harness import FakeNode, LocalCluster

    c = LocalCluster(nodes=[FakeNode("kwok-gpu-0", gpus=1), FakeNode("kwok-cpu-0", gpus=0)])
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def k8s(cluster):  # type: ignore[no-untyped-def]
    """A kubernetes ApiClient bound to the session's cluster."""
    from kubernetes import client, config

    return config.new_client_from_config(config_file=str(cluster.kubeconfig))


@pytest.fixture(scope="session")
def s3() -> Iterator["LocalS3"]:
    """A real S3-compatible server (gofakes3, built from source) on loopback."""
    from sharetune.cluster.s3 import LocalS3

    srv = LocalS3().start()
    try:
        yield srv
    finally:
        srv.stop()
