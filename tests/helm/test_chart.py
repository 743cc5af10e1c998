"""The Helm chart and the plain manifests, on a real control plane of their own (the chart owns
the CRD, so it must not meet the CRD other tests created)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from ..helpers import wait_for

if TYPE_CHECKING:
    from sharetune_dev.cluster.harness import LocalCluster

ROOT = Path(__file__).parents[2]
CHART = ROOT / "helm" / "sharetune"
pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def helm_cluster() -> Iterator["LocalCluster"]:
    from sharetune_dev.cluster.harness import FakeNode, LocalCluster

    c = LocalCluster(nodes=[FakeNode("kwok-gpu-0", gpus=1)]).start()
    try:
        yield c
    finally:
        c.stop()


def helm(cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    from sharetune_dev.cluster import binaries

    return subprocess.run([str(binaries.path_of("helm")), *args], capture_output=True, text=True,
                          env=cluster.env() if cluster else None, check=check, timeout=120)


def kubectl(cluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    from sharetune_dev.cluster import binaries

    return subprocess.run([str(binaries.path_of("kubectl")), *args], input=stdin, capture_output=True, text=True,
                          env=cluster.env(), timeout=120)


def test_chart_crd_is_the_crd() -> None:
    assert (CHART / "files" / "tuningjobs.sharetune.io.yaml").read_bytes() == \
        (ROOT / "crds" / "tuningjobs.sharetune.io.yaml").read_bytes(), "copy crds/ into helm/sharetune/files/"


def test_deploy_manifests_have_not_drifted() -> None:
    sys.path.insert(0, str(ROOT / "deploy"))
    import generate

    assert generate.render() == (ROOT / "deploy" / "sharetune.yaml").read_text(), \
        "deploy/sharetune.yaml drifted from the chart: run deploy/generate.py"


def test_dashboard_json_is_generated_from_code() -> None:
    from sharetune_dev.dashboard import render

    assert (CHART / "files" / "dashboard.json").read_text() == render(), \
        ("helm/sharetune/files/dashboard.json drifted: "
         "python -m sharetune_dev.dashboard > helm/sharetune/files/dashboard.json")


def test_alert_rules_pass_promtool(tmp_path: Path) -> None:
    import shutil

    promtool = shutil.which("promtool")
    assert promtool, "promtool comes with Debian's prometheus package (.ci/setup.sh installs it)"
    out = helm(None, "template", "x", str(CHART), "--set", "prometheusRule.enabled=true",
               "--show-only", "templates/prometheusrule.yaml").stdout
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(yaml.safe_load(out)["spec"]))
    r = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
    assert r.returncode == 0 and "SUCCESS: 3 rules found" in r.stdout, r.stdout + r.stderr


def test_lint_and_values_schema() -> None:
    assert "0 chart(s) failed" in helm(None, "lint", str(CHART)).stdout
    assert helm(None, "lint", str(CHART), "--set", "rbac.clusterWide=true",
                "--set", "metrics.serviceMonitor.enabled=true").returncode == 0
    bad = helm(None, "lint", str(CHART), "--set", "rbac.clusterWide=maybe", check=False)
    assert bad.returncode != 0 and "clusterWide" in bad.stdout + bad.stderr
    typo = helm(None, "template", "x", str(CHART), "--set", "imagee.tag=1", check=False)
    assert typo.returncode != 0 and "imagee" in typo.stderr


def test_gpu_sharing_values_reach_the_operator() -> None:
    """The chart's gpuSharing values become the operator's environment, which
    SharingConfig.from_env reads back as they were set (docs/gpu-pools.md)."""
    from sharetune.sharing import SharingConfig

    def env_of(*sets: str) -> dict[str, str]:
        out = helm(None, "template", "x", str(CHART), "-n", "ops", "--show-only", "templates/deployment.yaml",
                   *[a for s in sets for a in ("--set", s)]).stdout
        env = yaml.safe_load(out)["spec"]["template"]["spec"]["containers"][0]["env"]
        assert {"name": "SHARETUNE_GPU_POOL_NAMESPACE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in env
        return {e["name"]: e["value"] for e in env if "value" in e} | {"SHARETUNE_GPU_POOL_NAMESPACE": "ops"}

    assert SharingConfig.from_env(env_of()) == SharingConfig(pool_namespace="ops")
    c = SharingConfig.from_env(env_of("gpuSharing.defaultMode=exclusive", "gpuSharing.overcommit=1.5",
                                      "gpuSharing.backfill=true", "gpuSharing.poolIdleSeconds=30",
                                      "gpuSharing.crossNamespace=true",
                                      "gpuSharing.devicePlugin.resourceName=example.com/gpu",
                                      "gpuSharing.poolTolerations[0].key=nvidia.com/gpu",
                                      "gpuSharing.poolTolerations[0].operator=Exists"))
    assert c == SharingConfig(default_mode="exclusive", overcommit=1.5, backfill=True, pool_idle_s=30,
                              cross_namespace=True, device_plugin_resource="example.com/gpu", pool_namespace="ops",
                              pool_tolerations=({"key": "nvidia.com/gpu", "operator": "Exists"},))
    bad = helm(None, "template", "x", str(CHART), "--set", "gpuSharing.defaultMode=mps", check=False)
    assert bad.returncode != 0 and "defaultMode" in bad.stderr


def test_network_policy_and_request_values_reach_the_operator() -> None:
    """networkPolicy and defaultRequests become the operator's environment, read back by the
    planner's config as they were set; a typo in either is refused by the chart's schema."""
    from sharetune import requests as pod_requests
    from sharetune.netpolicy import NetworkConfig

    def env_of(*sets: str) -> dict[str, str]:
        out = helm(None, "template", "x", str(CHART), "-n", "ops", "--show-only", "templates/deployment.yaml",
                   *[a for s in sets for a in ("--set", s)]).stdout
        return {e["name"]: e["value"] for e in yaml.safe_load(out)["spec"]["template"]["spec"]["containers"][0]["env"]
                if "value" in e}

    assert NetworkConfig.from_env(env_of()) == NetworkConfig()
    assert pod_requests.from_env(env_of()) == pod_requests.DEFAULT_REQUESTS
    env = env_of("networkPolicy.metricsScrapers[0].namespaceSelector.matchLabels.team=mon",
                 "defaultRequests.server.memory=2Gi")
    assert NetworkConfig.from_env(env).metrics_scrapers == ({"namespaceSelector": {"matchLabels": {"team": "mon"}}},)
    assert pod_requests.from_env(env)["server"] == {"cpu": "100m", "memory": "2Gi"}
    assert not NetworkConfig.from_env(env_of("networkPolicy.enabled=false")).enabled
    for bad in ("defaultRequests.web.cpu=1", "networkPolicy.metricsScrapers[0].pods=x"):
        r = helm(None, "template", "x", str(CHART), "--set", bad, check=False)
        assert r.returncode != 0 and bad.split(".")[1].split("[")[0] in r.stderr, r.stderr


def test_mps_daemon_priority_class_values_reach_the_operator() -> None:
    """mpsDaemonPriorityClass: the chart's own class (named after the release namespace: it is
    cluster-scoped), an existing one by name, or none; the operator gets the name the daemons use."""
    from sharetune.controller.context import DAEMON_PRIORITY_ENV

    def render(*sets: str) -> tuple[str, list[dict]]:
        out = helm(None, "template", "x", str(CHART), "-n", "ops", *[a for s in sets for a in ("--set", s)]).stdout
        docs = [d for d in yaml.safe_load_all(out) if d]
        dep = next(d for d in docs if d["kind"] == "Deployment")
        env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}
        return env[DAEMON_PRIORITY_ENV], [d for d in docs if d["kind"] == "PriorityClass"]

    name, classes = render()
    assert name == "sharetune-operator-ops-mps-daemon" and [c["metadata"]["name"] for c in classes] == [name]
    assert (classes[0]["value"], classes[0]["preemptionPolicy"], classes[0]["globalDefault"]) == (
        1000000, "Never", False)
    assert render("mpsDaemonPriorityClass.create=false", "mpsDaemonPriorityClass.name=gpu-critical") == (
        "gpu-critical", [])
    assert render("mpsDaemonPriorityClass.create=false") == ("", [])
    bad = helm(None, "template", "x", str(CHART), "--set", "mpsDaemonPriorityClass.name=Not_A_Name", check=False)
    assert bad.returncode != 0 and "mpsDaemonPriorityClass" in bad.stderr


@pytest.mark.parametrize("cluster_wide", [False, True])
def test_template_is_valid_for_the_api_server(helm_cluster, cluster_wide: bool) -> None:
    kubectl(helm_cluster, "create", "namespace", "dry")
    out = helm(helm_cluster, "template", "st", str(CHART), "-n", "dry", "--set", f"rbac.clusterWide={cluster_wide}",
               "--skip-tests").stdout
    r = kubectl(helm_cluster, "apply", "--dry-run=server", "-f", "-", stdin=out)
    assert r.returncode == 0, r.stderr
    docs = [d for d in yaml.safe_load_all(out) if d]
    kinds = {d["kind"] for d in docs}
    assert kinds == {"ServiceAccount", "CustomResourceDefinition", "Deployment", "Service", "ConfigMap",
                     "ClusterRole", "ClusterRoleBinding", "PriorityClass"} | (
                         set() if cluster_wide else {"Role", "RoleBinding"})
    # The GPU share ledger's cluster-wide view (nodes, GPUs other pods hold) is read-only.
    view = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-gpu-view"))
    assert {v for r in view["rules"] for v in r["verbs"]} <= {"get", "list", "watch"}


def test_helm_test_hook_is_valid_and_least_privileged(helm_cluster) -> None:
    """The `helm test` hook itself (a real run needs nodes that run pods: the real-node stage)."""
    kubectl(helm_cluster, "create", "namespace", "hook")
    out = helm(helm_cluster, "template", "st", str(CHART), "-n", "hook",
               "--show-only", "templates/tests/smoke-test.yaml").stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    # The pod's admission looks its ServiceAccount up: create the identity for real, then
    # let the API server validate the pod (dry run).
    identity = yaml.safe_dump_all([d for d in docs if d["kind"] != "Pod"])
    assert kubectl(helm_cluster, "apply", "-f", "-", stdin=identity).returncode == 0
    r = kubectl(helm_cluster, "apply", "--dry-run=server", "-f", "-", stdin=out)
    assert r.returncode == 0, r.stderr
    assert all(d["metadata"]["annotations"]["helm.sh/hook"] == "test" for d in docs)
    role = next(d for d in docs if d["kind"] == "Role")
    assert role["rules"] == [{"apiGroups": ["sharetune.io"], "resources": ["tuningjobs"],
                              "verbs": ["get", "create", "delete"]}]
    pod = next(d for d in docs if d["kind"] == "Pod")
    assert pod["spec"]["containers"][0]["args"] == ["smoke-test", "--namespace=hook"]


def test_install_upgrade_uninstall(helm_cluster) -> None:
    api = config.new_client_from_config(config_file=str(helm_cluster.kubeconfig))
    apps, ext = client.AppsV1Api(api), client.ApiextensionsV1Api(api)
    r = helm(helm_cluster, "install", "st", str(CHART), "-n", "sharetune-system", "--create-namespace", "--wait",
             "--timeout", "90s")
    assert "STATUS: deployed" in r.stdout and "TuningJob CRD is kept" in r.stdout  # NOTES.txt
    dep = apps.read_namespaced_deployment("sharetune-operator", "sharetune-system")
    assert dep.spec.strategy.type == "Recreate" and dep.spec.replicas == 1
    c = dep.spec.template.spec.containers[0]
    assert c.security_context.read_only_root_filesystem and not c.security_context.allow_privilege_escalation
    assert "--namespace=sharetune-system" in c.args and c.liveness_probe.http_get.path == "/healthz"
    assert ext.read_custom_resource_definition("tuningjobs.sharetune.io").spec.names.short_names == ["tj"]

    helm(helm_cluster, "upgrade", "st", str(CHART), "-n", "sharetune-system", "--set", "tunerImage=localhost/t:2")
    wait_for("upgraded env", lambda: {e.name: e.value for e in apps.read_namespaced_deployment(
        "sharetune-operator", "sharetune-system").spec.template.spec.containers[0].env}["SHARETUNE_TUNER_IMAGE"]
        == "localhost/t:2")

    helm(helm_cluster, "uninstall", "st", "-n", "sharetune-system", "--wait")
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    for read in (lambda: apps.read_namespaced_deployment("sharetune-operator", "sharetune-system"),
                 lambda: core.read_namespaced_service_account("sharetune-operator", "sharetune-system"),
                 lambda: core.read_namespaced_service("sharetune-operator-metrics", "sharetune-system"),
                 lambda: rbac.read_namespaced_role("sharetune-operator", "sharetune-system"),
                 lambda: rbac.read_namespaced_role_binding("sharetune-operator", "sharetune-system")):
        with pytest.raises(ApiException) as e:
            read()
        assert e.value.status == 404
    # As documented: the CRD (and with it every TuningJob) survives the uninstall.
    assert ext.read_custom_resource_definition("tuningjobs.sharetune.io")
