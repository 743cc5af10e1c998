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
