"""Security as tests, on the real API server's authorizer (RBAC), not by reading YAML:

- the operator's ServiceAccount (the chart's Role) can do exactly the API calls the operator
  makes, listed below with the code that needs each, and nothing else: it creates a job's build
  key Secret but reads no Secret (a job's S3 credentials reach only its pods, through the kubelet);
- a job's pods (their ServiceAccount) can update their own shard/result ConfigMaps and nothing
  else: no Secret, no other ConfigMap, nothing in another namespace.

(Pod security contexts are pinned in tests/core/test_planner.py; credentials in logs, events,
status and the store are checked by the S3 real-run and fault tests.)
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from .conftest import create_job, tuning_job, wait_for

pytestmark = [pytest.mark.cluster]
CHART = Path(__file__).parents[2] / "helm" / "sharetune"

# (apiGroup, resource) -> verbs the operator uses, and why.
OPERATOR_NEEDS: dict[tuple[str, str], set[str]] = {
    # kopf watch/patch; TTL delete
    ("sharetune.io", "tuningjobs"): {"get", "list", "watch", "patch", "update", "delete"},
    ("sharetune.io", "tuningjobs/status"): {"get", "patch", "update"},  # status loop
    ("", "configmaps"): {"get", "list", "watch", "create", "update", "patch"},  # spec/shard/result CMs; snapshot list
    ("", "pods"): {"get", "list", "watch", "create", "delete", "patch"},  # MPS daemon/GPU pool pods; a pool's idle mark
    ("", "services"): {"get", "create"},  # tracker Service
    ("", "serviceaccounts"): {"get", "create"},  # the job pods' identity
    ("", "secrets"): {"create"},  # a job's build key (spec.builders); never read (S3 clean-up runs in a job's Job)
    ("autoscaling", "horizontalpodautoscalers"): {"create"},  # spec.builders.autoscale
    ("", "events"): {"create", "patch"},
    ("events.k8s.io", "events"): {"create", "patch"},
    # tracker/servers; restart after an MPS fault; a pool's servers
    ("apps", "deployments"): {"get", "list", "create", "patch"},
    ("apps", "deployments/scale"): {"patch"},  # live scaling
    ("batch", "jobs"): {"get", "list", "watch", "create", "patch"},  # clients, merge, S3 clean-up; snapshot list; clamp
    ("rbac.authorization.k8s.io", "roles"): {"create"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"create"},
    ("networking.k8s.io", "networkpolicies"): {"create"},  # each job's NetworkPolicy
    ("policy", "poddisruptionbudgets"): {"create", "delete"},  # a GPU pool daemon's budget (gpupool.py)
}


def _can(k8s: Any, user: str, ns: str, verb: str, resource: str, group: str = "", name: str | None = None,
         subresource: str | None = None) -> bool:
    sar = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=user, groups=["system:serviceaccounts", f"system:serviceaccounts:{ns}", "system:authenticated"],
        resource_attributes=client.V1ResourceAttributes(namespace=ns, verb=verb, resource=resource, group=group,
                                                        name=name, subresource=subresource)))
    return bool(client.AuthorizationV1Api(k8s).create_subject_access_review(sar).status.allowed)


def test_operator_service_account_has_exactly_what_it_uses(k8s, cluster, ns) -> None:
    from sharetune_dev.cluster import binaries

    out = subprocess.run([str(binaries.path_of("helm")), "template", "st", str(CHART), "-n", ns,
                          "--show-only", "templates/rbac.yaml", "--show-only", "templates/serviceaccount.yaml"],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    for d in docs:
        d["metadata"]["namespace"] = ns
    role = next(d for d in docs if d["kind"] == "Role")
    granted: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for g in rule["apiGroups"]:
            for r in rule["resources"]:
                granted.setdefault((g, r), set()).update(rule["verbs"])
    assert granted == OPERATOR_NEEDS  # nothing more, nothing less than the list above
    # Applied for real, the API server's authorizer agrees, and refuses what is not listed.
    rbac, core = client.RbacAuthorizationV1Api(k8s), client.CoreV1Api(k8s)
    sa = next(d for d in docs if d["kind"] == "ServiceAccount")
    core.create_namespaced_service_account(ns, sa)
    rbac.create_namespaced_role(ns, role)
    rbac.create_namespaced_role_binding(ns, next(d for d in docs if d["kind"] == "RoleBinding"))
    user = f"system:serviceaccount:{ns}:{sa['metadata']['name']}"
    wait_for("RBAC in effect", lambda: _can(k8s, user, ns, "create", "jobs", "batch"))
    for (group, resource), verbs in OPERATOR_NEEDS.items():
        res, _, sub = resource.partition("/")
        for verb in verbs:
            assert _can(k8s, user, ns, verb, res, group, subresource=sub or None), (verb, group, resource)
    for verb, resource, group in [("get", "secrets", ""), ("list", "secrets", ""), ("watch", "secrets", ""),
                                  ("update", "secrets", ""),
                                  ("delete", "configmaps", ""), ("delete", "deployments", "apps"),
                                  ("create", "pods/exec", ""), ("update", "roles", "rbac.authorization.k8s.io"),
                                  ("bind", "roles", "rbac.authorization.k8s.io"),
                                  ("escalate", "roles", "rbac.authorization.k8s.io"),
                                  ("delete", "namespaces", ""), ("create", "customresourcedefinitions",
                                                                 "apiextensions.k8s.io")]:
        res, _, sub = resource.partition("/")
        assert not _can(k8s, user, ns, verb, res, group, subresource=sub or None), (verb, resource)
    # Namespaced by default: nothing in another namespace.
    assert not _can(k8s, user, "default", "create", "pods")
    assert not _can(k8s, user, "default", "get", "secrets")
    # The GPU share ledger's cluster-wide view: read nodes and list pods anywhere, nothing else.
    view = next(d for d in docs if d["kind"] == "ClusterRole")
    binding = next(d for d in docs if d["kind"] == "ClusterRoleBinding")
    rbac.create_cluster_role(view)
    rbac.create_cluster_role_binding(binding)
    try:
        wait_for("GPU view in effect", lambda: _can(k8s, user, "", "list", "nodes"))
        assert _can(k8s, user, "default", "list", "pods") and _can(k8s, user, "", "watch", "nodes")
        for verb, resource, where in [("patch", "nodes", ""), ("get", "pods", "default"), ("create", "pods", "default"),
                                      ("list", "secrets", "default"), ("delete", "pods", "default")]:
            assert not _can(k8s, user, where, verb, resource), (verb, resource, where)
    finally:
        rbac.delete_cluster_role_binding(binding["metadata"]["name"])
        rbac.delete_cluster_role(view["metadata"]["name"])


def test_job_pods_reach_only_their_own_configmaps(k8s, operator, ns) -> None:
    create_job(k8s, ns, tuning_job("sec"))
    from sharetune.controller.kube import read_or_none

    wait_for("job's Role",
             lambda: read_or_none(client.RbacAuthorizationV1Api(k8s).read_namespaced_role, "sec-tuner", ns))
    user = f"system:serviceaccount:{ns}:sec-tuner"
    wait_for("RBAC in effect", lambda: _can(k8s, user, ns, "patch", "configmaps", name="sec-shard-0"))
    for cm in ("sec-shard-0", "sec-shard-1", "sec-result"):
        for verb in ("get", "update", "patch"):
            assert _can(k8s, user, ns, verb, "configmaps", name=cm), (verb, cm)
    denied = [("get", "secrets", None, ns), ("list", "secrets", None, ns), ("get", "secrets", "s3-creds", ns),
              ("patch", "configmaps", "sec-spec", ns),  # its own spec stays as the operator wrote it
              ("patch", "configmaps", "other-shard-0", ns), ("create", "configmaps", None, ns),
              ("delete", "configmaps", "sec-shard-0", ns), ("list", "configmaps", None, ns),
              ("patch", "configmaps", "sec-shard-0", "default"), ("create", "configmaps", None, "default"),
              ("create", "pods", None, ns), ("get", "tuningjobs", "sec", ns)]
    for verb, resource, name, where in denied:
        group = "sharetune.io" if resource == "tuningjobs" else ""
        assert not _can(k8s, user, where, verb, resource, group, name=name), (verb, resource, name, where)
