"""The operator on the real control plane: children, validation, status, scaling, failure,
deletion, restarts, and a real tuning run with the test acting as the pods' kubelet."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from ..tuner.conftest import free_port, registered, tuner, wait_until
from .conftest import (
    GROUP,
    PLURAL,
    VERSION,
    Operator,
    as_service_account,
    create_job,
    finish_pod,
    get_job,
    publish_gpu_as_daemon,
    running_pods,
    tuning_job,
    wait_for,
)

pytestmark = [pytest.mark.cluster]


from sharetune.controller.kube import read_or_none as maybe


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


def test_invalid_specs_are_rejected_with_readable_messages(k8s, crd, ns) -> None:
    cases = [
        ({"servers": {"threadPercentage": 0}},
         "spec.servers.threadPercentage in body should be greater than or equal to 1"),
        ({"servers": {"threadPercentage": 101}}, "should be less than or equal to 100"),
        ({"clients": {"shards": 0}}, "spec.clients.shards in body should be greater than or equal to 1"),
        ({"servers": {"replicas": 0}}, "spec.servers.replicas in body should be greater than or equal to 1"),
        ({"model": {"name": "resnet18", "onnx": {"url": "http://m/x.onnx"}}},
         "set exactly one of model.name or model.onnx"),
        ({"model": {"onnx": {"url": "http://m/x.onnx", "pvc": {"claimName": "c", "path": "/m"}}}},
         "set exactly one of onnx.path (local mode only), onnx.url, onnx.configMap, onnx.pvc"),
        ({"target": "tpu"}, 'spec.target: Unsupported value: "tpu"'),
        ({"trials": {"total": 4, "perTask": 8}}, "trials.perTask cannot exceed trials.total"),
        ({"model": {"name": "vgg"}}, 'spec.model.name: Unsupported value: "vgg"'),
        ({"output": {"s3": {"bucket": "b"}}}, "spec.output.s3.credentialsSecret: Required value"),
        ({"image": "tuner:1 --privileged"}, "spec.image in body should match"),
    ]
    for spec, message in cases:
        with pytest.raises(ApiException) as e:
            create_job(k8s, ns, tuning_job("bad", **spec))
        assert e.value.status == 422
        assert message in json.loads(e.value.body)["message"], (spec, e.value.body)


def test_immutable_fields_are_rejected_after_creation(k8s, crd, ns) -> None:
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


def test_cpu_job_children_env_and_security(k8s, operator, ns) -> None:
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
    # The tracker key is the job's UID, not its guessable name.
    uid = get_job(k8s, ns, "cpu")["metadata"]["uid"]
    assert c.args[:5] == ["server", "--tracker", "cpu-tracker:9190", "--key", f"sharetune-{uid}"]
    # Only the job's own pods may connect to them (the metrics port also from the chart's scrapers),
    # as the real API server stored the policy.
    pol = client.NetworkingV1Api(k8s).read_namespaced_network_policy("cpu-network", ns).spec
    assert pol.pod_selector.match_labels == {"sharetune.io/job": "cpu"} and pol.policy_types == ["Ingress"]
    assert pol.ingress[0].var_from[0].pod_selector.match_labels == {"sharetune.io/job": "cpu"}
    assert pol.ingress[0].ports is None and [p.port for p in pol.ingress[1].ports] == [9400]
    # Progress reporting identity: may patch only its own ConfigMaps.
    role = client.RbacAuthorizationV1Api(k8s).read_namespaced_role("cpu-tuner", ns)
    assert role.rules[0].resource_names == ["cpu-shard-0", "cpu-shard-1", "cpu-result"]
    assert role.rules[0].verbs == ["get", "update", "patch"]


def test_gpu_job_places_servers_with_the_mps_daemon(k8s, operator, ns) -> None:
    create_job(k8s, ns, tuning_job("gpu", target="cuda", servers={"replicas": 3, "threadPercentage": 25,
                                                                   "pinnedMemoryLimit": "4G"}))
    core = client.CoreV1Api(k8s)
    # The session's cluster has one GPU; earlier tests' pods may still be leaving it.
    daemon = wait_for("daemon scheduled", lambda: (p := maybe(core.read_namespaced_pod, "gpu-mps", ns))
                      and p.spec.node_name and p, timeout_s=180)
    assert daemon.spec.node_name == "kwok-gpu-0" and daemon.spec.host_ipc
    c = daemon.spec.containers[0]
    assert c.resources.limits == {"nvidia.com/gpu": "1"}
    # Keyed by the job's UID: no two jobs' names can map to one host directory.
    assert daemon.spec.volumes[1].host_path.path == f"/run/sharetune/mps/{get_job(k8s, ns, 'gpu')['metadata']['uid']}"
    # No default share on the daemon (it would cap every process, the serving report's too); the
    # servers carry theirs (below).
    assert "--thread-percentage" not in c.args and c.args[c.args.index("--pinned-memory-limit") + 1] == "4G"

    # No server runs before the daemon has published the GPU the device plugin gave it.
    apps = client.AppsV1Api(k8s)
    srv = wait_for("servers", lambda: maybe(apps.read_namespaced_deployment, "gpu-servers", ns))
    assert srv.spec.replicas == 0
    assert {e.name: e.value for e in srv.spec.template.spec.containers[0].env}["NVIDIA_VISIBLE_DEVICES"] == "void"
    # The daemon's identity may write its own pod and nothing else (kwok runs no daemon: the test
    # publishes with the tuner's code and the daemon's ServiceAccount token).
    uuid = "GPU-8e6a3f8c-0000-4000-8000-00000000c0de"
    with pytest.raises(client.ApiException) as refused:
        client.CoreV1Api(as_service_account(k8s, ns, "gpu-mps")).patch_namespaced_pod(
            "gpu-hog-elsewhere", ns, {"metadata": {"annotations": {"x": "y"}}})
    assert refused.value.status == 403
    batch = client.BatchV1Api(k8s)
    assert maybe(batch.read_namespaced_job, "gpu-clients", ns) is None  # nor any client
    publish_gpu_as_daemon(k8s, ns, "gpu-mps", "gpu-mps", uuid)
    servers = wait_for("3 servers scheduled", lambda: (ps := [p for p in core.list_namespaced_pod(
        ns, label_selector="sharetune.io/job=gpu,app.kubernetes.io/component=server").items
        if p.spec.node_name]) and len(ps) == 3 and ps)
    wait_for("the pin in the status", lambda: get_job(k8s, ns, "gpu")["status"].get("serversGpuByGroup")
             == {"0": uuid})
    for p in servers:
        assert p.spec.node_name == daemon.spec.node_name  # followed the daemon
        sc = p.spec.containers[0]
        assert not (sc.resources.limits or {}).get("nvidia.com/gpu")  # not granted a second GPU
        env = {e.name: e.value for e in sc.env}
        assert env["NVIDIA_VISIBLE_DEVICES"] == uuid  # exactly the daemon's GPU, never "all"
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4G"
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/pipe" and p.spec.host_ipc
    # The clients come now, seeing no GPU (they ask the servers for its architecture).
    clients = wait_for("the clients' Job", lambda: maybe(batch.read_namespaced_job, "gpu-clients", ns))
    assert {e.name: e.value for e in clients.spec.template.spec.containers[0].env}["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_a_second_gpu_job_waits_with_a_clear_reason(k8s, operator, ns) -> None:
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


def test_scale_servers_live(k8s, operator, ns) -> None:
    create_job(k8s, ns, tuning_job("scale", servers={"replicas": 1}))
    apps = client.AppsV1Api(k8s)
    wait_for("servers deployment", lambda: maybe(apps.read_namespaced_deployment, "scale-servers", ns))
    client.CustomObjectsApi(k8s).patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "scale",
                                                                {"spec": {"servers": {"replicas": 4}}})
    wait_for("4 replicas", lambda: apps.read_namespaced_deployment("scale-servers", ns).spec.replicas == 4)
    wait_for("4 running server pods", lambda: len(running_pods(
        k8s, ns, "sharetune.io/job=scale,app.kubernetes.io/component=server")) == 4)


def test_failed_shard_is_retried_then_the_job_fails_with_a_reason(k8s, operator, ns) -> None:
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


def test_a_finished_job_is_deleted_after_its_ttl(k8s, operator, ns) -> None:
    create_job(k8s, ns, tuning_job("brief", clients={"shards": 1, "backoffLimitPerIndex": 0},
                                   ttlSecondsAfterFinished=0))
    pod = wait_for("its pod", lambda: next(iter(running_pods(k8s, ns, "job-name=brief-clients")), None))
    finish_pod(k8s, ns, pod.metadata.name, 1)

    def gone() -> bool:
        try:
            get_job(k8s, ns, "brief")
        except ApiException as e:
            return e.status == 404
        return False
    wait_for("deleted after ttl 0", gone, 90)


def test_delete_garbage_collects_children(k8s, operator, ns) -> None:
    create_job(k8s, ns, tuning_job("gone"))
    wait_for("children", lambda: children(k8s, ns, "gone")["Job"])
    client.CustomObjectsApi(k8s).delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "gone")
    empty = {"ConfigMap": [], "Pod/mps": [], "Service": [], "Deployment": [], "Job": [], "Role": []}
    wait_for("every child collected", lambda: children(k8s, ns, "gone") == empty, 90)


def test_operator_restart_mid_job_duplicates_nothing(k8s, operator: Operator, ns) -> None:
    create_job(k8s, ns, tuning_job("restart"))
    before = wait_for("all children", lambda: (c := children(k8s, ns, "restart"))["Job"]
                      and len(c["ConfigMap"]) == 4 and c)
    operator.stop()
    operator.start()  # resume handlers run again for the existing job
    wait_for("resumed", lambda: get_job(k8s, ns, "restart")["status"].get("phase"))
    import time

    time.sleep(3)
    assert children(k8s, ns, "restart") == before
    pods = client.CoreV1Api(k8s).list_namespaced_pod(ns, label_selector="job-name=restart-clients").items
    assert len(pods) == 2


def as_local(args: list[str], **replace: str) -> list[str]:
    """A pod's container args with the in-cluster paths/addresses swapped for local ones."""
    out = list(args)
    for flag, value in replace.items():
        flag = "--" + flag.replace("_", "-")
        out[out.index(flag) + 1] = value
    return out


@pytest.mark.parametrize("output", ["configmap", "s3"])
def test_a_real_tuning_run_through_the_operator(k8s, cluster, operator, ns, tmp_path: Path, output: str,
                                                request) -> None:
    """The test acts as the pods: it runs the very args of the pods' containers (the real tuner
    commands, with the store the operator chose) locally, then reports their exit to the API
    server like a kubelet would. The job is submitted as users do, `sharetune run FILE` without
    --local, which follows it to the end and prints the summary."""
    import os

    env = {"KUBECONFIG": str(cluster.kubeconfig)}
    spec: dict[str, Any] = {}
    if output == "s3":
        s3 = request.getfixturevalue("s3")
        client.CoreV1Api(k8s).create_namespaced_secret(ns, client.V1Secret(
            metadata=client.V1ObjectMeta(name="s3-creds"),
            string_data={"AWS_ACCESS_KEY_ID": "sharetune", "AWS_SECRET_ACCESS_KEY": "not-a-real-secret"}))
        spec["output"] = {"s3": {"endpoint": s3.endpoint, "bucket": "tuning", "prefix": "runs",
                                 "credentialsSecret": {"name": "s3-creds"}}}
        # The bucket exists before the job, as a user's does: a client that reads its shard's
        # object before any write would otherwise meet a missing bucket (a clear error, by design).
        import boto3

        with contextlib.suppress(Exception):  # made by an earlier run of this test
            boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1", aws_access_key_id="sharetune",
                         aws_secret_access_key="not-a-real-secret").create_bucket(Bucket="tuning")
        # What the kubelet would inject from the Secret and the pod's env.
        env.update(AWS_ACCESS_KEY_ID="sharetune", AWS_SECRET_ACCESS_KEY="not-a-real-secret",
                   AWS_DEFAULT_REGION="us-east-1", SHARETUNE_S3_ENDPOINT=s3.endpoint)
    os.environ.update(env)
    submitted = tmp_path / "real.yaml"
    submitted.write_text(yaml.safe_dump(tuning_job("real", **spec)))
    cli = subprocess.Popen([sys.executable, "-m", "sharetune.cli", "run", str(submitted), "-n", ns],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **env})
    wait_for("clients Job", lambda: running_pods(k8s, ns, "job-name=real-clients"))
    manifest = client.CoreV1Api(k8s).read_namespaced_config_map("real-spec", ns).data["job.yaml"]
    job_file = tmp_path / "job.yaml"
    job_file.write_text(manifest)
    client_args = client.BatchV1Api(k8s).read_namespaced_job("real-clients", ns).spec.template.spec.containers[0].args
    port = free_port()
    procs = [tuner(["tracker", "--host", "127.0.0.1", "--port", str(port)], tmp_path / "tracker.log")]
    try:
        base = free_port()
        key = client_args[client_args.index("--key") + 1]  # the job's tracker key, as the planner gave its clients
        procs.append(tuner(["server", "--tracker", f"127.0.0.1:{port}", "--key", key, "--host", "127.0.0.1",
                            "--port", str(base), "--port-end", str(base + 1)], tmp_path / "server.log"))
        wait_until(lambda: registered(port, key) == 1, 60, "server registered")
        clients = [tuner([*as_local(client_args, job=str(job_file), work_dir=str(tmp_path / f"w{i}"),
                                    tracker=f"127.0.0.1:{port}", metrics_port="-1"),
                          "--shard", str(i), "--sync-interval", "2"], tmp_path / f"client{i}.log") for i in range(2)]
        # Progress reaches the TuningJob's status while the clients tune.
        wait_for("Running with trials", lambda: (s := get_job(k8s, ns, "real")["status"]).get("phase") == "Running"
                 and s.get("trialsCompleted", 0) > 0 and s, timeout_s=240, every=1)
        for c in clients:
            assert c.popen.wait(timeout=600) == 0, c.text()[-2000:]
        for p in running_pods(k8s, ns, "job-name=real-clients"):
            finish_pod(k8s, ns, p.metadata.name, 0)
        status = wait_for("Merging", lambda: (s := get_job(k8s, ns, "real")["status"]).get("phase") == "Merging" and s,
                          timeout_s=60)
        assert status["trialsCompleted"] == status["trialsTotal"] == 8
        merge_pod = wait_for("merge pod", lambda: running_pods(k8s, ns, "job-name=real-merge"))[0]
        merge_args = as_local(merge_pod.spec.containers[0].args, job=str(job_file), out=str(tmp_path / "out"),
                              metrics_port="-1")
        r = subprocess.run([sys.executable, "-m", "sharetune_tuner.cli", *merge_args], capture_output=True,
                           text=True, timeout=600, env={**os.environ, **env})
        assert r.returncode == 0, r.stderr[-3000:]
        finish_pod(k8s, ns, merge_pod.metadata.name, 0)
        job = wait_for("Succeeded", lambda: (j := get_job(k8s, ns, "real"))["status"].get("phase") == "Succeeded" and j,
                       timeout_s=60)
        st = job["status"]
        out = cli.communicate(timeout=60)[0]
        assert cli.returncode == 0, out
        assert f"tuningjob {ns}/real created" in out and f"tuningjob {ns}/real succeeded in " in out, out
        assert ": 8 trials" in out and f"sharetune result fetch tj/real -n {ns} -o DIR" in out, out
        again = subprocess.run([sys.executable, "-m", "sharetune.cli", "run", str(submitted), "-n", ns, "--detach"],
                               capture_output=True, text=True, timeout=60, env={**os.environ, **env})
        assert again.returncode == 2 and f"already exists: delete it (kubectl delete tj real -n {ns})" in again.stdout
        # The status carries the merge's measurements (8 trials are too few to promise a speed-up:
        # tuning quality is pinned by the local end-to-end test with a real budget).
        summary = json.loads(client.CoreV1Api(k8s).read_namespaced_config_map("real-result", ns).data["summary.json"])
        assert st["bestSpeedup"] == summary["speedup"] > 0
        assert (st["untunedLatencyMs"], st["tunedLatencyMs"]) == (summary["latency_untuned_ms"],
                                                                  summary["latency_tuned_ms"])
        assert st["trialsCompleted"] == 8 and st["progressPercent"] == 100 and st["completionTime"]
        # The records are in the store: every trial, plus the best per workload.
        from sharetune_tuner.store.backends import open_store, unpack
        from sharetune_tuner.store.records import stats

        store_uri = client_args[client_args.index("--store") + 1]
        if output == "s3":
            assert store_uri == f"s3://tuning/runs/{ns}/real"
            assert st["resultLocation"] == f"s3://tuning/runs/{ns}/real/result"
        else:
            assert st["resultLocation"] == f"configmap://{ns}/real-result"
        unpack(open_store(store_uri).get("result"), tmp_path / "fetched")
        every = stats(tmp_path / "fetched" / "records")
        assert every.total == 8
        # 8 trials go to the two heaviest convs (the useful minimum each); the best records hold
        # those of them that beat TVM's default schedule (the never-worse merge).
        assert stats(tmp_path / "fetched" / "best").total == summary["best_records"] <= len(every.best_by_workload) == 2
        # The processes' logs are collected into the same store.
        logs = tmp_path / "fetched" / "logs"
        assert ("shard 1/2" in (logs / "shard-1.log").read_text()
                and "merged 8 records" in (logs / "merge.log").read_text())
        reasons = [e.reason for e in client.CoreV1Api(k8s).list_namespaced_event(
            ns, field_selector="involvedObject.name=real").items]
        for r_ in ("Created", "Tuning", "ShardsDone", "Merged"):
            assert r_ in reasons, reasons
        # Credentials never land in the status, the events or the result summary.
        blob = (json.dumps(st) + json.dumps(reasons)
                + json.dumps(json.loads((tmp_path / "fetched" / "summary.json").read_text())))
        assert "not-a-real-secret" not in blob
    finally:
        if cli.poll() is None:
            cli.kill()
        for p in reversed(procs):
            p.stop(signal.SIGTERM)


def test_s3_cleanup_on_delete_uses_a_finalizer_only_when_asked(k8s, cluster, operator, ns, s3,
                                                               tmp_path: Path) -> None:
    """cleanupOnDelete: a finalizer only on the jobs that ask. On deletion a Job in the job's
    namespace deletes its objects, with the job's own Secret resolved into the pod's env by the
    kubelet (here the process kubelet, which runs the clean-up pods' real command; the operator
    reads no Secret); the TuningJob goes once it has finished. A clean-up the store refuses
    fails its Job: a Warning names what was left and how to remove it, and the TuningJob still goes."""
    import boto3

    from sharetune_dev.podsim import MANAGED, ProcessKubelet

    from ..helpers import DenyingS3

    core = client.CoreV1Api(k8s)
    core.create_namespaced_secret(ns, client.V1Secret(
        metadata=client.V1ObjectMeta(name="creds"),
        string_data={"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}))
    out = {"s3": {"endpoint": s3.endpoint, "bucket": "cleanup", "credentialsSecret": {"name": "creds"},
                  "cleanupOnDelete": True}}
    b = boto3.client("s3", endpoint_url=s3.endpoint, region_name="us-east-1", aws_access_key_id="k",
                     aws_secret_access_key="s")
    # Only the clean-up pods run as processes; the jobs' tuning pods stay as kwok keeps them.
    sim = ProcessKubelet(k8s, ns, cluster.server, cluster.pki.ca.cert, workdir=tmp_path / "pods",
                         label_selector=MANAGED + ",app.kubernetes.io/component=s3-cleanup")
    with DenyingS3() as denied:
        create_job(k8s, ns, tuning_job("keep", output={**out, "s3": {**out["s3"], "cleanupOnDelete": False}}))
        create_job(k8s, ns, tuning_job("wipe", output=out))
        create_job(k8s, ns, tuning_job("fore", output=out))
        create_job(k8s, ns, tuning_job("denied", output={**out, "s3": {**out["s3"], "endpoint": denied.endpoint}}))
        for job in ("wipe", "fore", "denied"):
            wait_for(f"finalizer on {job}", lambda: "sharetune.io/cleanup" in (
                get_job(k8s, ns, job)["metadata"].get("finalizers") or []))
        wait_for("keep job started", lambda: get_job(k8s, ns, "keep").get("status", {}).get("phase"))
        assert not get_job(k8s, ns, "keep")["metadata"].get("finalizers")
        for job in ("keep", "wipe", "fore", "ab"):  # "ab": a job named like wipe's prefix must keep its objects
            b.put_object(Bucket="cleanup", Key=f"{ns}/{job}/shard-0.tar.gz", Body=b"records")
        b.put_object(Bucket="cleanup", Key=f"{ns}/wipe/result/summary.json", Body=b"{}")
        sim.start()
        try:
            for job in ("keep", "wipe", "denied"):
                client.CustomObjectsApi(k8s).delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, job)
            # A foreground deletion removes the owned children first: the clean-up Job is not one.
            client.CustomObjectsApi(k8s).delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "fore",
                                                                         propagation_policy="Foreground")
            wait_for("keep job gone", lambda: maybe(get_job, k8s, ns, "keep") is None, timeout_s=30)
            for job in ("wipe", "fore"):
                wait_for(f"{job} job gone", lambda: maybe(get_job, k8s, ns, job) is None, timeout_s=120)
            # The Job's pods retry (backoffLimit) with the Job controller's backoff, then it fails.
            wait_for("denied job gone", lambda: maybe(get_job, k8s, ns, "denied") is None, timeout_s=240)
        finally:
            sim.stop()
    keys = sorted(o["Key"] for o in b.list_objects_v2(Bucket="cleanup").get("Contents", []))
    assert keys == [f"{ns}/ab/shard-0.tar.gz", f"{ns}/keep/shard-0.tar.gz"]
    fore = client.BatchV1Api(k8s).read_namespaced_job("fore-s3-cleanup", ns)  # left to its TTL
    assert not fore.metadata.owner_references and fore.spec.ttl_seconds_after_finished
    ran = sorted(p.pod for p in sim.history)
    assert [p for p in ran if p.startswith("wipe-s3-cleanup-")] and not [p for p in ran if p.startswith("keep-")]
    wiped = json.loads(next(p for p in sim.history if p.pod.startswith("wipe-s3-cleanup-")).tail(1))
    assert wiped == {"bucket": "cleanup", "prefix": f"{ns}/wipe/", "deleted": 2}
    assert len([p for p in ran if p.startswith("denied-s3-cleanup-")]) == 3  # backoffLimit 2: three tries

    def events(job: str) -> list[Any]:
        return core.list_namespaced_event(ns, field_selector=f"involvedObject.name={job}").items

    for job in ("wipe", "fore"):
        assert [(e.type, e.reason) for e in events(job) if e.reason.startswith("S3")] == [("Normal", "S3CleanedUp")]
    (warning,) = [e for e in events("denied") if e.reason == "S3CleanupFailed"]
    assert warning.type == "Warning"
    assert f"the job's objects under s3://cleanup/{ns}/denied/ were left in the bucket: Job denied-s3-cleanup " \
           "BackoffLimitExceeded" in warning.message, warning.message
    assert f"aws s3 rm --recursive s3://cleanup/{ns}/denied/ --endpoint-url {denied.endpoint}" in warning.message
    # Waiting on the Job is no news: kopf's retries are not posted as Events on the TuningJobs.
    assert not [e for j in ("wipe", "fore", "denied") for e in events(j) if "temporarily" in (e.message or "")]


def test_operator_exports_metrics(operator) -> None:
    from prometheus_client import REGISTRY, generate_latest

    text = generate_latest(REGISTRY).decode()
    for name in ("sharetune_operator_jobs{phase=", "sharetune_operator_reconcile_seconds_bucket",
                 "sharetune_operator_children_created_total{kind=\"Job\"}",
                 "sharetune_operator_phase_transitions_total"):
        assert name in text, name


def test_smoke_test_command_applies_a_job_and_reports_when_it_does_not_finish(k8s, cluster, operator, ns) -> None:
    """The `helm test` hook's command. Here no pod runs (kwok), so it must time out, clearly."""
    import os

    r = subprocess.run([sys.executable, "-m", "sharetune.cli", "smoke-test", "--namespace", ns, "--timeout", "8"],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)})
    assert r.returncode == 1 and "sharetune-smoke did not finish in 8s (phase Pending)" in r.stderr
    job = get_job(k8s, ns, "sharetune-smoke")
    assert job["spec"]["target"] == "llvm" and job["spec"]["ttlSecondsAfterFinished"] == 600
