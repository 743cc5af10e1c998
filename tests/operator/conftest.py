"""The operator, in-process (kopf's KopfRunner), against the session's real control plane."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from ..conftest import Operator  # noqa: F401 (the tests restart it)
from ..helpers import wait_for  # noqa: F401 (re-exported for the tests)

GROUP, VERSION, PLURAL = "sharetune.io", "v1alpha1", "tuningjobs"






def tuning_job(name: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": {"name": "tiny_cnn", "inputShape": [1, 3, 64, 64]}, "target": "llvm",
                            "trials": {"total": 8, "perTask": 4, "perIteration": 2},
                            "servers": {"replicas": 1}, "clients": {"shards": 2, "builderWorkers": 1}}
    base.update(spec)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TuningJob", "metadata": {"name": name}, "spec": base}


def get_job(k8s: Any, ns: str, name: str) -> dict[str, Any]:
    return client.CustomObjectsApi(k8s).get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)


def create_job(k8s: Any, ns: str, body: dict[str, Any]) -> dict[str, Any]:
    return client.CustomObjectsApi(k8s).create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)


def finish_pod(k8s: Any, ns: str, pod: str, exit_code: int) -> None:
    """Acting as the kubelet of a kwok node: the pod's only container exited."""
    p = client.CoreV1Api(k8s).read_namespaced_pod(pod, ns)
    c = p.spec.containers[0]
    client.CoreV1Api(k8s).patch_namespaced_pod_status(pod, ns, {"status": {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "containerStatuses": [{"name": c.name, "image": c.image, "imageID": "", "ready": False, "restartCount": 0,
                               "state": {"terminated": {"exitCode": exit_code,
                                                        "reason": "Completed" if exit_code == 0 else "Error"}}}]}})


def running_pods(k8s: Any, ns: str, selector: str) -> list[Any]:
    return [p for p in client.CoreV1Api(k8s).list_namespaced_pod(ns, label_selector=selector).items
            if p.status.phase == "Running" and p.metadata.deletion_timestamp is None]


def as_service_account(k8s: Any, ns: str, sa: str) -> client.ApiClient:
    """An API client holding a token of ServiceAccount ``ns/sa``: exactly that identity's RBAC."""
    import copy

    tok = client.CoreV1Api(k8s).create_namespaced_service_account_token(sa, ns, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))).status.token
    cfg = copy.copy(k8s.configuration)
    cfg.cert_file = cfg.key_file = None
    cfg.api_key, cfg.api_key_prefix = {"authorization": tok}, {"authorization": "Bearer"}
    return client.ApiClient(cfg)


def publish_gpu_as_daemon(k8s: Any, ns: str, pod: str, sa: str, uuid: str) -> None:
    """What an MPS daemon does on a GPU node, which kwok nodes cannot run: the tuner's own
    publishing code writes ``uuid`` on the daemon's pod with the daemon's ServiceAccount."""
    from sharetune_tuner.measure.gpu_identity import publish

    publish(uuid, pod, ns, client.CoreV1Api(as_service_account(k8s, ns, sa)))
