"""The local control plane is a real Kubernetes: objects persist, controllers act, the
scheduler binds, kwok runs pods, the garbage collector follows ownerReferences and the API
server validates."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from ..helpers import wait_for  # noqa: F401 (re-exported for the tests)

pytestmark = pytest.mark.cluster






def test_namespace_and_configmap_roundtrip(k8s, ns: str) -> None:
    core = client.CoreV1Api(k8s)
    core.create_namespaced_config_map(ns, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="cfg"), data={"records": "[1, 2, 3]"}))
    got = core.read_namespaced_config_map("cfg", ns)
    assert got.data == {"records": "[1, 2, 3]"}
    assert got.metadata.uid and got.metadata.resource_version


def test_tls_and_rbac_are_enforced(cluster) -> None:
    import ssl
    import urllib.error
    import urllib.request

    # Anonymous: TLS verifies against our CA, but RBAC forbids listing pods.
    ctx = ssl.create_default_context(cafile=str(cluster.pki.ca.cert))
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(cluster.server + "/api/v1/pods", context=ctx, timeout=5)
    assert e.value.code == 403
    # The scheduler's identity may read pods but not delete namespaces (bootstrap RBAC).
    out = subprocess.run(["kubectl", "--kubeconfig", str(cluster.workdir / "scheduler.kubeconfig"),
                          "auth", "can-i", "delete", "namespaces"],
                         capture_output=True, text=True, env=cluster.env())
    assert out.stdout.strip() == "no"


def test_deployment_becomes_running_pods_on_kwok_gpu_node(k8s, ns: str) -> None:
    apps, core = client.AppsV1Api(k8s), client.CoreV1Api(k8s)
    labels = {"app": "gpu-echo"}
    apps.create_namespaced_deployment(ns, client.V1Deployment(
        metadata=client.V1ObjectMeta(name="gpu-echo"),
        spec=client.V1DeploymentSpec(
            replicas=2, selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(
                    node_selector={"nvidia.com/gpu.present": "true"},
                    containers=[client.V1Container(name="c", image="localhost/none:latest")])))))
    rs = wait_for("a ReplicaSet", lambda: client.AppsV1Api(k8s).list_namespaced_replica_set(ns).items)
    assert rs[0].metadata.owner_references[0].kind == "Deployment"

    def running() -> list[Any]:
        pods = core.list_namespaced_pod(ns, label_selector="app=gpu-echo").items
        ok = [p for p in pods if p.status.phase == "Running" and p.spec.node_name == "kwok-gpu-0"]
        return ok if len(ok) == 2 else []
    pods = wait_for("2 Running pods on kwok-gpu-0", running)
    assert all(p.status.pod_ip for p in pods)
    dep = wait_for("deployment available", lambda: (
        d := apps.read_namespaced_deployment("gpu-echo", ns)).status.available_replicas == 2 and d)
    assert dep.status.ready_replicas == 2


def test_gpu_request_is_scheduled_only_where_gpus_are(k8s, ns: str) -> None:
    core = client.CoreV1Api(k8s)
    res = client.V1ResourceRequirements(limits={"nvidia.com/gpu": "1"})
    for name in ("gpu-a", "gpu-b"):
        core.create_namespaced_pod(ns, client.V1Pod(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="x", resources=res)])))
    # One GPU in the cluster: exactly one pod binds to the GPU node, the other stays Pending
    # with the scheduler's real reason.
    wait_for("gpu-a or gpu-b bound", lambda: any(
        core.read_namespaced_pod(n, ns).spec.node_name for n in ("gpu-a", "gpu-b")))

    def unschedulable() -> Any:
        for n in ("gpu-a", "gpu-b"):
            p = core.read_namespaced_pod(n, ns)
            for c in p.status.conditions or []:
                if c.type == "PodScheduled" and c.reason == "Unschedulable":
                    return c
        return None
    cond = wait_for("an Unschedulable condition", unschedulable)
    assert "Insufficient nvidia.com/gpu" in cond.message
    bound = [core.read_namespaced_pod(n, ns).spec.node_name for n in ("gpu-a", "gpu-b")]
    assert sorted(b for b in bound if b) == ["kwok-gpu-0"]


def test_garbage_collector_follows_owner_references(k8s, ns: str) -> None:
    core = client.CoreV1Api(k8s)
    owner = core.create_namespaced_config_map(ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner")))
    ref = client.V1OwnerReference(api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid)
    core.create_namespaced_config_map(ns, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="child", owner_references=[ref])))
    core.delete_namespaced_config_map("owner", ns)

    def child_gone() -> bool:
        try:
            core.read_namespaced_config_map("child", ns)
            return False
        except ApiException as e:
            return e.status == 404
    wait_for("child ConfigMap garbage-collected", child_gone)


def test_invalid_object_is_rejected_with_the_real_message(k8s, ns: str) -> None:
    core = client.CoreV1Api(k8s)
    with pytest.raises(ApiException) as e:
        core.create_namespaced_config_map(ns, client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="Not_A_DNS_Name")))
    assert e.value.status == 422
    assert "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters" in e.value.body


def test_job_controller_runs_an_indexed_job(k8s, ns: str) -> None:
    batch = client.BatchV1Api(k8s)
    batch.create_namespaced_job(ns, client.V1Job(
        metadata=client.V1ObjectMeta(name="idx"),
        spec=client.V1JobSpec(
            completions=3, parallelism=3, completion_mode="Indexed",
            template=client.V1PodTemplateSpec(spec=client.V1PodSpec(
                restart_policy="Never", containers=[client.V1Container(name="c", image="x")])))))
    # kwok completes pods owned by Jobs: the Job controller then marks the Job Complete.
    job = wait_for("Job complete", lambda: (
        j := batch.read_namespaced_job("idx", ns)).status.succeeded == 3 and j, timeout_s=90)
    assert job.status.completed_indexes == "0-2"


def test_sharetune_job_pods_wait_for_their_kubelet(k8s, ns: str) -> None:
    """kwok completes ordinary Job pods, but leaves sharetune's Running: tests act as their kubelet."""
    batch, core = client.BatchV1Api(k8s), client.CoreV1Api(k8s)
    labels = {"app.kubernetes.io/managed-by": "sharetune"}
    batch.create_namespaced_job(ns, client.V1Job(
        metadata=client.V1ObjectMeta(name="held"),
        spec=client.V1JobSpec(template=client.V1PodTemplateSpec(
            metadata=client.V1ObjectMeta(labels=labels),
            spec=client.V1PodSpec(restart_policy="Never", containers=[client.V1Container(name="c", image="x")])))))
    pod = wait_for("held pod Running", lambda: next(
        (p for p in core.list_namespaced_pod(ns, label_selector="job-name=held").items
         if p.status.phase == "Running"), None))
    time.sleep(3)
    assert core.read_namespaced_pod(pod.metadata.name, ns).status.phase == "Running"
    # Acting as the kubelet: the container exits 0, the Job controller counts it.
    core.patch_namespaced_pod_status(pod.metadata.name, ns, {"status": {
        "phase": "Succeeded", "containerStatuses": [{
            "name": "c", "image": "x", "imageID": "", "ready": False, "restartCount": 0,
            "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}})
    wait_for("Job succeeded", lambda: batch.read_namespaced_job("held", ns).status.succeeded == 1)
