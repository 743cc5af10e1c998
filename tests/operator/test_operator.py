"""The operator on the real control plane: children, validation, status, scaling, failure,
deletion, restarts, and a real tuning run with the test acting as the pods' kubelet."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from ..tuner.conftest import free_port, registered, tuner, wait_until
from .conftest import (GROUP, PLURAL, VERSION, Operator, create_job, finish_pod, get_job, running_pods,
                       tuning_job, wait_for)

pytestmark = [pytest.mark.cluster]


def maybe(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def children(k8s: Any, ns: str, job: str) -> dict[str, list[str]]:
    sel = f"sharetune.io/job={job}"
    core, apps, batch, rbac = (client.CoreV1Api(k8s), client.AppsV1Api(k8s), client.BatchV1Api(k8s),
                               client.RbacAuthorizationV1Api(k8s))
    return {
        "ConfigMap": sorted(o.metadata.name for o in core.list_namespaced_config_map(ns, label_selector=sel).items),
        "Pod/mps": sorted(o.metadata.name for o in core.list_namespaced_pod(
            ns, label_selector=sel + ",app.kubernetes.io/component=mps-daemon").items),
        "Service": sorted(o.metadata.name for o in core.list_namespaced_service(ns, label_selector=sel).items),
        "Deployment": sorted(o.metadata.name for o in apps.list_namespaced_deployment(ns, label_selector=sel).items),
        "Job": sorted(o.metadata.name for o in batch.list_namespaced_job(ns, label_selector=sel).items),
        "Role": sorted(o.metadata.name for o in rbac.list_namespaced_role(ns, label_selector=sel).items),
    }


def test_invalid_specs_are_rejected_with_readable_messages(k8s, crd, ns) -> None:  # type: ignore[no-untyped-def]
    cases = [
        ({"servers": {"threadPercentage": 0}}, "spec.servers.threadPercentage in body should be greater than or equal to 1"),
        ({"servers": {"threadPercentage": 101}}, "should be less than or equal to 100"),
        ({"clients": {"shards": 0}}, "spec.clients.shards in body should be greater than or equal to 1"),
        ({"servers": {"replicas": 0}}, "spec.servers.replicas in body should be greater than or equal to 1"),
        ({"model": {"name": "resnet18", "onnx": {"url": "http://m/x.onnx"}}}, "set exactly one of model.name or model.onnx"),
        ({"model": {"onnx": {"url": "http://m/x.onnx", "pvc": {"claimName": "c", "path": "/m"}}}},
         "set exactly one of onnx.url, onnx.configMap, onnx.pvc"),
        ({"target": "tpu"}, 'spec.target: Unsupported value: "tpu"'),
        ({"trials": {"total": 4, "perTask": 8}}, "trials.perTask cannot exceed trials.total"),
        ({"model": {"name": "vgg"}}, 'spec.model.name: Unsupported value: "vgg"'),
        ({"output": {"s3": {"bucket": "b"}}}, "spec.output.s3.credentialsSecret: Required value"),
    ]
    for spec, message in cases:
        with pytest.raises(ApiException) as e:
            create_job(k8s, ns, tuning_job("bad", **spec))
        assert e.value.status == 422
        assert message in json.loads(e.value.body)["message"], (spec, e.value.body)


def test_immutable_fields_are_rejected_after_creation(k8s, crd, ns) -> None:  # type: ignore[no-untyped-def]
    create_job(k8s, ns, tuning_job("imm"))
    api = client.CustomObjectsApi(k8s)
    for patch, message in [({"spec": {"target": "cuda"}}, "target is immutable"),
                           ({"spec": {"clients": {"shards": 5}}}, "clients.shards is immutable"),
                           ({"spec": {"trials": {"total": 99}}}, "trials are immutable")]:
        with pytest.raises(ApiException) as e:
            api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "imm", patch)
        assert e.value.status == 422 and message in e.value.body
    # Scaling servers is allowed (and applied live: see test_scale_servers_live).
    api.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "imm", {"spec": {"servers": {"replicas": 3}}})


def test_cpu_job_children_env_and_security(k8s, operator, ns) -> None:  # type: ignore[no-untyped-def]
    create_job(k8s, ns, tuning_job("cpu"))
    wait_for("phase Pending", lambda: get_job(k8s, ns, "cpu").get("status", {}).get("phase"))
    got = children(k8s, ns, "cpu")
    assert got == {"ConfigMap": ["cpu-result", "cpu-shard-0", "cpu-shard-1", "cpu-spec"], "Pod/mps": [],
                   "Service": ["cpu-tracker"], "Deployment": ["cpu-servers", "cpu-tracker"],
                   "Job": ["cpu-clients"], "Role": ["cpu-tuner"]}
    batch, apps = client.BatchV1Api(k8s), client.AppsV1Api(k8s)
    j = batch.read_namespaced_job("cpu-clients", ns)
    assert (j.spec.completion_mode, j.spec.completions, j.spec.backoff_limit_per_index) == ("Indexed", 2, 3)
    owner = j.metadata.owner_references[0]
    assert (owner.kind, owner.name, owner.controller) == ("TuningJob", "cpu", True)
    srv = apps.read_namespaced_deployment("cpu-servers", ns).spec.template.spec
    c = srv.containers[0]
    assert not srv.host_ipc and not (c.resources and c.resources.limits)  # CPU job: no GPU, no MPS
    assert c.security_context.run_as_non_root and not c.security_context.allow_privilege_escalation
    assert c.args[:5] == ["server", "--tracker", "cpu-tracker:9190", "--key", "cpu"]
    # Progress reporting identity: may patch only its own ConfigMaps.
    role = client.RbacAuthorizationV1Api(k8s).read_namespaced_role("cpu-tuner", ns)
    assert role.rules[0].resource_names == ["cpu-shard-0", "cpu-shard-1", "cpu-result"]
    assert role.rules[0].verbs == ["get", "update", "patch"]


def test_gpu_job_places_servers_with_the_mps_daemon(k8s, operator, ns) -> None:  # type: ignore[no-untyped-def]
    create_job(k8s, ns, tuning_job("gpu", target="cuda", servers={"replicas": 3, "threadPercentage": 25,
                                                                   "pinnedMemoryLimit": "4G"}))
    core = client.CoreV1Api(k8s)
    daemon = wait_for("daemon scheduled", lambda: (p := maybe(core.read_namespaced_pod, "gpu-mps", ns))
                      and p.spec.node_name and p)
    assert daemon.spec.node_name == "kwok-gpu-0" and daemon.spec.host_ipc
    c = daemon.spec.containers[0]
    assert c.resources.limits == {"nvidia.com/gpu": "1"}
    assert daemon.spec.volumes[1].host_path.path == f"/run/sharetune/mps/{ns}-gpu"
    assert "--thread-percentage" in c.args and c.args[c.args.index("--thread-percentage") + 1] == "25"

    servers = wait_for("3 servers scheduled", lambda: (ps := [p for p in core.list_namespaced_pod(
        ns, label_selector="sharetune.io/job=gpu,app.kubernetes.io/component=server").items
        if p.spec.node_name]) and len(ps) == 3 and ps)
    for p in servers:
        assert p.spec.node_name == daemon.spec.node_name  # followed the daemon
        sc = p.spec.containers[0]
        assert not (sc.resources.limits or {}).get("nvidia.com/gpu")  # not granted a second GPU
        env = {e.name: e.value for e in sc.env}
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4G"
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/pipe" and p.spec.host_ipc


def test_a_second_gpu_job_waits_with_a_clear_reason(k8s, operator, ns) -> None:  # type: ignore[no-untyped-def]
    # The cluster's only GPU is held by a pod of another job: the daemon cannot be scheduled.
    core = client.CoreV1Api(k8s)
    core.create_namespaced_pod(ns, client.V1Pod(metadata=client.V1ObjectMeta(name="gpu-hog"), spec=client.V1PodSpec(
        containers=[client.V1Container(name="c", image="x", resources=client.V1ResourceRequirements(
            limits={"nvidia.com/gpu": "1"}))])))
    create_job(k8s, ns, tuning_job("waits", target="cuda"))
    job = wait_for("GpuUnavailable", lambda: (j := get_job(k8s, ns, "waits")).get("status", {}).get("message", "")
                   .startswith("the MPS daemon cannot be scheduled") and j, timeout_s=60)
    assert job["status"]["phase"] == "Pending"
    assert "Insufficient nvidia.com/gpu" in job["status"]["message"]
    ready = next(c for c in job["status"]["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "GpuUnavailable" and ready["status"] == "False"


def test_scale_servers_live(k8s, operator, ns) -> None:  # type: ignore[no-untyped-def]
    create_job(k8s, ns, tuning_job("scale", servers={"replicas": 1}))
    apps = client.AppsV1Api(k8s)
    wait_for("servers deployment", lambda: maybe(apps.read_namespaced_deployment, "scale-servers", ns))
    client.CustomObjectsApi(k8s).patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "scale",
                                                                {"spec": {"servers": {"replicas": 4}}})
    wait_for("4 replicas", lambda: apps.read_namespaced_deployment("scale-servers", ns).spec.replicas == 4)
    wait_for("4 running server pods", lambda: len(running_pods(
        k8s, ns, "sharetune.io/job=scale,app.kubernetes.io/component=server")) == 4)


def test_failed_shard_is_retried_then_the_job_fails_with_a_reason(k8s, operator, ns) -> None:  # type: ignore[no-untyped-def]
    create_job(k8s, ns, tuning_job("flaky", clients={"shards": 2, "backoffLimitPerIndex": 1}))
    sel = "job-name=flaky-clients"
    for attempt in range(2):  # the first failure is retried (a new pod for index 1), the second is final
        pod = wait_for(f"index 1 pod, attempt {attempt}", lambda: next((
            p for p in running_pods(k8s, ns, sel)
            if p.metadata.annotations.get("batch.kubernetes.io/job-completion-index") == "1"), None))
        finish_pod(k8s, ns, pod.metadata.name, 1)
    pod0 = wait_for("index 0 pod", lambda: next((p for p in running_pods(k8s, ns, sel)), None))
    finish_pod(k8s, ns, pod0.metadata.name, 0)
    job = wait_for("Failed", lambda: (j := get_job(k8s, ns, "flaky"))["status"].get("phase") == "Failed" and j, 90)
    failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and failed["reason"] == "ShardFailed"
    assert "shard(s) 1 failed after their retries" in failed["message"]
    events = client.CoreV1Api(k8s).list_namespaced_event(ns, field_selector="involvedObject.name=flaky").items
    assert any(e.reason == "ShardFailed" and e.type == "Warning" for e in events)


def test_delete_garbage_collects_children(k8s, operator, ns) -> None:  # type: ignore[no-untyped-def]
    create_job(k8s, ns, tuning_job("gone"))
    wait_for("children", lambda: children(k8s, ns, "gone")["Job"])
    client.CustomObjectsApi(k8s).delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "gone")
    empty = {"ConfigMap": [], "Pod/mps": [], "Service": [], "Deployment": [], "Job": [], "Role": []}
    wait_for("every child collected", lambda: children(k8s, ns, "gone") == empty, 90)


def test_operator_restart_mid_job_duplicates_nothing(k8s, operator: Operator, ns) -> None:  # type: ignore[no-untyped-def]
    create_job(k8s, ns, tuning_job("restart"))
    before = wait_for("children", lambda: (c := children(k8s, ns, "restart"))["Job"] and c)
    operator.stop()
    operator.start()  # resume handlers run again for the existing job
    wait_for("resumed", lambda: get_job(k8s, ns, "restart")["status"].get("phase"))
    import time

    time.sleep(3)
    assert children(k8s, ns, "restart") == before
    pods = client.CoreV1Api(k8s).list_namespaced_pod(ns, label_selector="job-name=restart-clients").items
    assert len(pods) == 2


def test_a_real_tuning_run_through_the_operator(k8s, cluster, operator, ns, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The test acts as the pods: it runs the real tracker/server/client/merge commands the pods
    would run (with the store the operator chose), then reports their exit to the API server."""
    create_job(k8s, ns, tuning_job("real"))
    wait_for("clients Job", lambda: running_pods(k8s, ns, "job-name=real-clients"))
    manifest = client.CoreV1Api(k8s).read_namespaced_config_map("real-spec", ns).data["job.yaml"]
    job_file = tmp_path / "job.yaml"
    job_file.write_text(manifest)
    env_kube = {"KUBECONFIG": str(cluster.kubeconfig)}
    import os

    os.environ.update(env_kube)
    port = free_port()
    procs = [tuner(["tracker", "--host", "127.0.0.1", "--port", str(port)], tmp_path / "tracker.log")]
    try:
        base = free_port()
        procs.append(tuner(["server", "--tracker", f"127.0.0.1:{port}", "--key", "real", "--host", "127.0.0.1",
                            "--port", str(base), "--port-end", str(base + 1)], tmp_path / "server.log"))
        wait_until(lambda: registered(port, "real") == 1, 60, "server registered")
        store = f"configmap://{ns}/real"
        clients = [tuner(["client", "--job", str(job_file), "--shard", str(i), "--work-dir", str(tmp_path / f"w{i}"),
                          "--tracker", f"127.0.0.1:{port}", "--key", "real", "--store", store, "--sync-interval", "2"],
                         tmp_path / f"client{i}.log") for i in range(2)]
        # Progress reaches the TuningJob's status while the clients tune.
        wait_for("Running with trials", lambda: (s := get_job(k8s, ns, "real")["status"]).get("phase") == "Running"
                 and s.get("trialsCompleted", 0) > 0 and s, timeout_s=240, every=1)
        for i, c in enumerate(clients):
            assert c.popen.wait(timeout=600) == 0, c.text()[-2000:]
        pods = {p.metadata.annotations["batch.kubernetes.io/job-completion-index"]: p
                for p in running_pods(k8s, ns, "job-name=real-clients")}
        for p in pods.values():
            finish_pod(k8s, ns, p.metadata.name, 0)
        status = wait_for("Merging", lambda: (s := get_job(k8s, ns, "real")["status"]).get("phase") == "Merging" and s,
                          timeout_s=60)
        assert status["trialsCompleted"] == status["trialsTotal"] == 8
        merge_pod = wait_for("merge pod", lambda: running_pods(k8s, ns, "job-name=real-merge"))[0]
        r = subprocess.run([sys.executable, "-m", "sharetune_tuner.cli", "merge", "--job", str(job_file),
                            "--store", store, "--out", str(tmp_path / "out")], capture_output=True, text=True,
                           timeout=600, env={**os.environ, **env_kube})
        assert r.returncode == 0, r.stderr[-3000:]
        finish_pod(k8s, ns, merge_pod.metadata.name, 0)
        job = wait_for("Succeeded", lambda: (j := get_job(k8s, ns, "real"))["status"].get("phase") == "Succeeded" and j,
                       timeout_s=60)
        st = job["status"]
        assert st["bestSpeedup"] > 1.0 and st["tunedLatencyMs"] < st["untunedLatencyMs"]
        assert st["trialsCompleted"] == 8 and st["progressPercent"] == 100
        assert st["resultLocation"] == f"configmap://{ns}/real-result" and st["completionTime"]
        # The records are in the store: every trial, plus the best per workload.
        from sharetune_tuner.records import stats
        from sharetune_tuner.store import open_store, unpack

        unpack(open_store(store).get("result"), tmp_path / "fetched")
        assert stats(tmp_path / "fetched" / "records").total == 8
        assert stats(tmp_path / "fetched" / "best").total == len(stats(tmp_path / "fetched" / "records").trials_by_workload)
        reasons = [e.reason for e in client.CoreV1Api(k8s).list_namespaced_event(
            ns, field_selector="involvedObject.name=real").items]
        for r_ in ("Created", "Tuning", "ShardsDone", "Merged"):
            assert r_ in reasons, reasons
    finally:
        for p in reversed(procs):
            p.stop(signal.SIGTERM)
