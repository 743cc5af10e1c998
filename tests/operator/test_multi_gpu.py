"""A job over several GPUs on a control plane with two one-GPU kwok nodes: one MPS daemon per
GPU placed by the scheduler wherever a GPU is free (here: one per node), each GPU's servers on
their daemon's node, live scaling per GPU, and a dead daemon replaced with only its own servers
restarted. (Measuring on several real GPUs needs a multi-GPU machine: bench/multi_gpu.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from ..faults.scenarios import OperatorProcess
from ..helpers import wait_for
from .conftest import GROUP, PLURAL, VERSION, publish_gpu_as_daemon, tuning_job

pytestmark = [pytest.mark.cluster]


@pytest.fixture(scope="module")
def two_gpu_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, Path]]:
    from sharetune_dev.cluster.harness import FakeNode, LocalCluster

    from ..conftest import install_crd

    cluster = LocalCluster(nodes=[FakeNode("gpu-a", gpus=1), FakeNode("gpu-b", gpus=1)]).start()
    try:
        k8s = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        install_crd(k8s)
        yield cluster, k8s, tmp_path_factory.mktemp("multi-gpu")
    finally:
        cluster.stop()


def _pods(core: Any, ns: str, component: str) -> list[Any]:
    return [p for p in core.list_namespaced_pod(ns, label_selector=f"app.kubernetes.io/component={component}").items
            if p.metadata.deletion_timestamp is None]


def test_servers_spread_over_gpus_follow_their_daemons(two_gpu_nodes) -> None:
    cluster, k8s, tmp = two_gpu_nodes
    core, apps = client.CoreV1Api(k8s), client.AppsV1Api(k8s)
    ns = "multi"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    op = OperatorProcess(cluster.kubeconfig, ns, tmp / "operator.log")
    op.start()
    try:
        client.CustomObjectsApi(k8s).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, tuning_job(
            "mg", target="cuda", gpuSharing={"gpus": 2}, servers={"replicas": 2, "threadPercentage": 50}))
        daemons = wait_for("both daemons running", lambda: (d := _pods(core, ns, "mps-daemon")) and len(d) == 2
                           and all(p.status.phase == "Running" for p in d) and d, timeout_s=90)
        node_of = {p.metadata.labels["sharetune.io/gpu-index"]: p.spec.node_name for p in daemons}
        assert sorted(node_of.values()) == ["gpu-a", "gpu-b"]  # each daemon got a GPU of its own
        # Each daemon publishes its GPU (kwok runs none: the tuner's code with the daemon's identity).
        for g in (0, 1):
            publish_gpu_as_daemon(k8s, ns, f"mg-mps-{g}", "mg-mps", f"GPU-0000000{g}-aaaa")
        servers = wait_for("4 servers bound", lambda: (s := _pods(core, ns, "server")) and len(s) == 4
                           and all(p.spec.node_name for p in s) and s, timeout_s=90)
        for p in servers:
            assert p.spec.node_name == node_of[p.metadata.labels["sharetune.io/gpu-index"]], p.metadata.name
        # Live scaling is per GPU.
        client.CustomObjectsApi(k8s).patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "mg",
                                                                    {"spec": {"servers": {"replicas": 3}}})
        wait_for("3 per GPU", lambda: [apps.read_namespaced_deployment(f"mg-servers-{g}", ns).spec.replicas
                                       for g in (0, 1)] == [3, 3], timeout_s=60)

        def template(g: int) -> dict[str, str]:
            return apps.read_namespaced_deployment(f"mg-servers-{g}", ns).spec.template.metadata.annotations or {}

        before0 = template(0)
        # GPU 1's daemon dies for good (its pod Failed, as the kubelet reports it).
        dead = next(p for p in daemons if p.metadata.labels["sharetune.io/gpu-index"] == "1")
        core.patch_namespaced_pod_status(dead.metadata.name, ns, {"status": {"phase": "Failed"}})
        wait_for("daemon 1 replaced", lambda: any(p.metadata.name == "mg-mps-1" and p.metadata.uid != dead.metadata.uid
                                                  for p in _pods(core, ns, "mps-daemon")), timeout_s=60)
        # Its servers stop until the new pod publishes its GPU (the device plugin may give another),
        # then run again on that one.
        wait_for("servers of GPU 1 stopped", lambda: apps.read_namespaced_deployment("mg-servers-1", ns).spec.replicas
                 == 0, timeout_s=60)
        wait_for("new daemon running", lambda: any(p.metadata.name == "mg-mps-1" and p.status.phase == "Running"
                                                   and p.metadata.uid != dead.metadata.uid
                                                   for p in _pods(core, ns, "mps-daemon")), timeout_s=60)
        publish_gpu_as_daemon(k8s, ns, "mg-mps-1", "mg-mps", "GPU-00000009-bbbb")
        wait_for("servers of GPU 1 on the new GPU", lambda: (d := apps.read_namespaced_deployment("mg-servers-1", ns))
                 .spec.replicas == 3 and {e.name: e.value for e in d.spec.template.spec.containers[0].env}[
                     "NVIDIA_VISIBLE_DEVICES"] == "GPU-00000009-bbbb", timeout_s=60)
        assert template(0) == before0  # GPU 0's servers were left alone
        # the status is patched after the Deployment, in the same tick
        crs = client.CustomObjectsApi(k8s)
        job = wait_for("the pins in the status", lambda: (j := crs.get_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, "mg"))["status"].get("serversGpuByGroup", {}).get("1") == "GPU-00000009-bbbb"
            and j, timeout_s=30)
        assert job["status"]["mpsRecoveries"] == 1
        assert job["status"]["mpsDaemonRestartsByGpu"] == {"1": 0}
        assert job["status"]["serversGpuByGroup"] == {"0": "GPU-00000000-aaaa", "1": "GPU-00000009-bbbb"}
        args = apps.read_namespaced_deployment("mg-servers-1", ns).spec.template.spec.containers[0].args
        assert args[args.index("--thread-percentage") + 1] == "50"
    finally:
        op.stop()
