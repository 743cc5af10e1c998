"""Idempotent creation of child objects: a deterministic name per child, 409 = already there.

Running the reconciler again (operator restart at any point) therefore never duplicates
children; what exists is left as it is, except the fields we manage explicitly (replicas).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from .status import now


def create(api: client.ApiClient, obj: dict[str, Any]) -> bool:
    """Creates ``obj``; False when it already existed."""
    kind, ns = obj["kind"], obj["metadata"]["namespace"]
    creators: dict[str, Callable[..., Any]] = {
        "ConfigMap": client.CoreV1Api(api).create_namespaced_config_map,
        "Secret": client.CoreV1Api(api).create_namespaced_secret,  # the build pool's key (spec.builders)
        "HorizontalPodAutoscaler": client.AutoscalingV2Api(api).create_namespaced_horizontal_pod_autoscaler,
        "ServiceAccount": client.CoreV1Api(api).create_namespaced_service_account,
        "Service": client.CoreV1Api(api).create_namespaced_service,
        "Pod": client.CoreV1Api(api).create_namespaced_pod,
        "Role": client.RbacAuthorizationV1Api(api).create_namespaced_role,
        "RoleBinding": client.RbacAuthorizationV1Api(api).create_namespaced_role_binding,
        "Deployment": client.AppsV1Api(api).create_namespaced_deployment,
        "Job": client.BatchV1Api(api).create_namespaced_job,
        "NetworkPolicy": client.NetworkingV1Api(api).create_namespaced_network_policy,
        "PodDisruptionBudget": client.PolicyV1Api(api).create_namespaced_pod_disruption_budget,  # GPU pools
    }
    fn = creators[kind]
    try:
        fn(ns, obj)
    except ApiException as e:
        if e.status == 409:
            return False
        raise
    return True


def scale_deployment(api: client.ApiClient, namespace: str, name: str, replicas: int) -> None:
    client.AppsV1Api(api).patch_namespaced_deployment_scale(name, namespace, {"spec": {"replicas": replicas}})


def is_rejection(e: ApiException) -> bool:
    """A 4xx the same request will get again (invalid object, forbidden, quota), as opposed to
    conflicts, throttling and server errors, which are worth retrying."""
    return e.status is not None and 400 <= e.status < 500 and e.status not in (404, 408, 409, 429)


def reason(e: ApiException) -> str:

    try:
        return str(json.loads(e.body or "").get("message", e.reason))
    except (TypeError, ValueError):
        return str(e.reason)


def restart_deployment(api: client.ApiClient, namespace: str, name: str) -> None:
    """What `kubectl rollout restart` does: a new template annotation rolls every pod."""
    client.AppsV1Api(api).patch_namespaced_deployment(name, namespace, {"spec": {"template": {"metadata": {
        "annotations": {"sharetune.io/restartedAt": now()}}}}})


def read_or_none(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
