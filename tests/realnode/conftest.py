"""The real-node stage: a real kubelet + containerd node under the local control plane.

Runs only when asked (``SHARETUNE_REALNODE=1``, what ``bash .ci/realnode`` sets): it needs root,
containerd/runc/CNI plugins (``.ci/realnode-setup.sh``) and the images from
``deploy/images/build.sh``, and it changes host networking state while it runs (a bridge,
iptables chains), so the ordinary suite (``bash .ci/run``) skips it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from sharetune_dev.cluster.node import RealCluster


def pytest_collection_modifyitems(config, items):
    if os.environ.get("SHARETUNE_REALNODE") == "1":
        return
    skip = pytest.mark.skip(reason="real-node stage: run `bash .ci/realnode` (SHARETUNE_REALNODE=1)")
    for item in items:
        if "tests/realnode/" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture(scope="module")
def real() -> Iterator["RealCluster"]:
    from sharetune_dev.cluster.node import RealCluster, missing_host_tools

    missing = missing_host_tools()
    if missing or os.geteuid() != 0:
        pytest.fail(f"real node needs root and {missing}: bash .ci/realnode-setup.sh")
    rc = RealCluster().start()
    try:
        yield rc
    finally:
        rc.stop()
