"""The pure planner: spec -> desired objects, checked without a cluster."""

from __future__ import annotations

from typing import Any

import pytest

from sharetune.api.spec import parse_spec
from sharetune.planner import JobRef, pin_servers_patch, plan, plan_clients, plan_merge, published_gpu, store_uri

JOB = JobRef("tj", "ns1", "uid-1")


def applied(job: JobRef, spec: Any, sharing: Any = None, requests: Any = None, **kw: Any) -> list[dict[str, Any]]:
    """What the operator applies before the merge: plan(), and where a daemon holds the GPU the
    clients it creates once that GPU is named (their only one)."""
    from sharetune.planner import pins_gpu

    clients = [plan_clients(job, spec, requests=requests)] if pins_gpu(spec, sharing) else []
    return [*plan(job, spec, sharing=sharing, requests=requests, **kw), *clients]


def by_kind(objs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for o in objs:
        out.setdefault(o["kind"], []).append(o)
    return out


def containers(o: dict[str, Any]) -> list[dict[str, Any]]:
    spec = o["spec"]["template"]["spec"] if "template" in o["spec"] else o["spec"]
    return spec["containers"]


def pod_spec(o: dict[str, Any]) -> dict[str, Any]:
    return o["spec"]["template"]["spec"] if "template" in o["spec"] else o["spec"]


def test_every_child_is_owned_and_labelled() -> None:
    s = parse_spec("tj", {"model": {"name": "resnet18"}, "target": "cuda"})
    for o in [*plan(JOB, s), plan_merge(JOB, s)]:
        m = o["metadata"]
        assert m["namespace"] == "ns1" and m["name"].startswith("tj-")
        assert m["ownerReferences"] == [{"apiVersion": "sharetune.io/v1alpha1", "kind": "TuningJob", "name": "tj",
                                         "uid": "uid-1", "controller": True, "blockOwnerDeletion": True}]
        assert m["labels"]["sharetune.io/job"] == "tj" and m["labels"]["app.kubernetes.io/managed-by"] == "sharetune"


def test_cpu_job_has_no_daemon_and_requests_no_gpu() -> None:
    s = parse_spec("tj", {"model": {"name": "tiny_cnn"}, "target": "llvm"})
    objs = plan(JOB, s)
    assert not [o for o in objs if o["kind"] == "Pod"]
    for o in objs:
        if o["kind"] in ("Deployment", "Job"):
            assert "gpu" not in str(o).lower().replace("gpusharing", "")
            assert not pod_spec(o).get("hostIPC")


def test_cuda_without_mps_gives_each_server_a_gpu() -> None:
    s = parse_spec("tj", {"model": {"name": "tiny_cnn"}, "target": "cuda", "gpuSharing": {"mps": False}})
    k = by_kind(plan(JOB, s))
    assert "Pod" not in k
    srv = next(d for d in k["Deployment"] if d["metadata"]["name"] == "tj-servers")
    assert containers(srv)[0]["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_mps_job_daemon_servers_and_security() -> None:
    s = parse_spec("tj", {"model": {"name": "resnet18"}, "target": "cuda",
                          "servers": {"replicas": 4, "threadPercentage": 25, "pinnedMemoryLimit": "2G"}})
    k = by_kind(plan(JOB, s))
    daemon = k["Pod"][0]
    dc = containers(daemon)[0]
    assert dc["resources"] == {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "50m", "memory": "64Mi"}}
    # The daemon runs as its clients' UID (a root one without CAP_SETUID cannot serve them); only
    # the init container that hands it the host directory is root, with CHOWN/DAC_OVERRIDE/FOWNER.
    assert dc["securityContext"]["runAsUser"] == 1000 and dc["securityContext"]["runAsNonRoot"] is True
    assert dc["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    (init,) = pod_spec(daemon)["initContainers"]
    assert init["args"] == ["mps-dir", "/mps", "--owner", "1000:1000"] and init["image"] == dc["image"]
    assert init["securityContext"]["runAsUser"] == 0 and init["securityContext"]["privileged"] is False
    assert init["securityContext"]["capabilities"]["add"] == ["CHOWN", "DAC_OVERRIDE", "FOWNER"]
    assert init["securityContext"]["allowPrivilegeEscalation"] is False and init["resources"]["requests"]
    assert init["volumeMounts"] == [{"name": "mps", "mountPath": "/mps"}]
    assert pod_spec(daemon)["hostIPC"] is True
    srv = next(d for d in k["Deployment"] if d["metadata"]["name"] == "tj-servers")
    # No GPU until the daemon has published its own: 0 servers, seeing none ("void", never "all").
    assert srv["spec"]["replicas"] == 0
    sc = containers(srv)[0]
    env = {e["name"]: e.get("value") for e in sc["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25" and env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2G"
    # The daemon publishes its GPU on its own pod, with an identity that may touch that pod only.
    assert "--publish-gpu" in dc["args"] and pod_spec(daemon)["serviceAccountName"] == "tj-mps"
    assert pod_spec(daemon)["automountServiceAccountToken"] is True
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in dc["env"]}  # the device plugin's
    assert {e["name"] for e in dc["env"]} >= {"POD_NAME", "POD_NAMESPACE"}
    role = next(r for r in k["Role"] if r["metadata"]["name"] == "tj-mps")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "resourceNames": ["tj-mps"],
                              "verbs": ["get", "patch"]}]
    # Pinned: the strategic-merge patch sets the UUID and the replicas, and the merge sees it too.
    uuid = "GPU-0b1c2d3e-aaaa-bbbb-cccc-000000000001"
    published = {"sharetune.io/gpu-uuid": uuid}
    assert published_gpu(published, "Running", deleting=False) == uuid
    # only a running daemon's counts: not one starting, nor one on its way out
    assert published_gpu(published, "Pending", False) is None and published_gpu(published, "Running", True) is None
    assert published_gpu({}, "Running", False) is None
    p = pin_servers_patch(uuid, 4)
    assert p["spec"]["replicas"] == 4
    assert p["spec"]["template"]["spec"]["containers"] == [
        {"name": "server", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": uuid}]}]
    menv = {e["name"]: e.get("value") for e in containers(plan_merge(JOB, s, gpu=uuid))[0]["env"]}
    assert menv["NVIDIA_VISIBLE_DEVICES"] == uuid
    # The clients come only then (plan has none); they see no GPU and may run on any node.
    assert "Job" not in k
    clients = plan_clients(JOB, s)
    assert clients["kind"] == "Job" and clients["metadata"]["name"] == "tj-clients"
    cenv = {e["name"]: e.get("value") for e in containers(clients)[0]["env"]}
    assert cenv["NVIDIA_VISIBLE_DEVICES"] == "void" and cenv["LD_LIBRARY_PATH"] == "/opt/sharetune/nocuda"
    assert "affinity" not in pod_spec(clients) and "nodeSelector" not in pod_spec(clients)
    from sharetune_tuner.cli import build_parser

    assert build_parser().parse_args(containers(clients)[0]["args"]).arch_from_servers  # asks them for the arch
    assert "resources" not in sc or "nvidia.com/gpu" not in str(sc["resources"])
    term = pod_spec(srv)["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == {"sharetune.io/job": "tj",
                                                    "app.kubernetes.io/component": "mps-daemon"}
    # Every pod but the daemon: non-root, no escalation, capabilities dropped, read-only root.
    for o in [*k["Deployment"], clients, plan_merge(JOB, s)]:
        for c in containers(o):
            sec = c["securityContext"]
            assert sec["runAsNonRoot"] and sec["runAsUser"] == 1000 and not sec["allowPrivilegeEscalation"]
            assert sec["capabilities"] == {"drop": ["ALL"]} and sec["readOnlyRootFilesystem"]


def test_clients_are_an_indexed_job_and_credentials_come_from_a_secret() -> None:
    s = parse_spec("tj", {"model": {"name": "resnet18"}, "trials": {"total": 128},
                          "clients": {"shards": 5, "backoffLimitPerIndex": 2},
                          "output": {"s3": {"bucket": "bkt", "prefix": "runs/", "endpoint": "http://s3:9000",
                                            "credentialsSecret": {"name": "creds"}}}})
    job = next(o for o in plan(JOB, s) if o["kind"] == "Job")
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 5
    assert job["spec"]["parallelism"] == 5 and job["spec"]["backoffLimitPerIndex"] == 2
    c = containers(job)[0]
    assert c["args"][c["args"].index("--store") + 1] == "s3://bkt/runs/ns1/tj" == store_uri(JOB, s)
    env = {e["name"]: e for e in c["env"]}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": "creds", "key": "AWS_SECRET_ACCESS_KEY"}}
    assert "value" not in env["AWS_ACCESS_KEY_ID"]  # never inline
    assert pod_spec(job)["serviceAccountName"] == "tj-tuner"


def test_scheduling_fields_reach_the_gpu_pods() -> None:
    s = parse_spec("tj", {"model": {"name": "resnet18"}, "target": "cuda",
                          "nodeSelector": {"gpu": "h200"}, "tolerations": [{"key": "gpu", "operator": "Exists"}]})
    k = by_kind(applied(JOB, s))
    assert pod_spec(k["Pod"][0])["nodeSelector"] == {"gpu": "h200"}
    for o in [*k["Deployment"], *k["Job"]]:
        assert pod_spec(o)["tolerations"] == [{"key": "gpu", "operator": "Exists"}]


def test_onnx_models_from_a_configmap_or_pvc_are_mounted_for_clients_and_merge() -> None:
    s = parse_spec("tj", {"model": {"onnx": {"configMap": {"name": "my-model", "key": "net.onnx"}}}})
    for o in (next(o for o in plan(JOB, s) if o["kind"] == "Job"), plan_merge(JOB, s)):
        vols = {v["name"]: v for v in pod_spec(o)["volumes"]}
        assert vols["model"]["configMap"] == {"name": "my-model", "items": [{"key": "net.onnx", "path": "model.onnx"}]}
        c = containers(o)[0]
        assert {"name": "model", "mountPath": "/model", "readOnly": True} in c["volumeMounts"]
        assert {"name": "SHARETUNE_MODEL_DIR", "value": "/model"} in c["env"]
    p = parse_spec("tj", {"model": {"onnx": {"pvc": {"claimName": "models", "path": "a/b.onnx"}}}})
    vols = {v["name"]: v for v in pod_spec(plan_merge(JOB, p))["volumes"]}
    assert vols["model"]["persistentVolumeClaim"] == {"claimName": "models", "readOnly": True}
    # A zoo model mounts nothing.
    z = parse_spec("tj", {"model": {"name": "resnet18"}})
    assert "model" not in {v["name"] for v in pod_spec(plan_merge(JOB, z))["volumes"]}


def test_daemons_outrank_ordinary_pods_and_a_pool_is_guarded_against_eviction() -> None:
    from sharetune.planner import plan_pool, plan_pool_budget

    s = parse_spec("tj", {"model": {"name": "resnet18"}, "target": "cuda", "gpuSharing": {"gpus": 2}})
    objs = plan(JOB, s, daemon_priority_class="st-mps")
    pool = plan_pool("gpu-b", 1, "ops", daemon_priority_class="st-mps")
    daemons = [o for o in objs if o["kind"] == "Pod"]
    assert len(daemons) == 2 and all(pod_spec(d)["priorityClassName"] == "st-mps" for d in [*daemons, pool])
    # Only the daemons; the job's other pods keep their namespace's default priority.
    assert all("priorityClassName" not in pod_spec(o) for o in objs if o["kind"] in ("Deployment", "Job"))
    # None configured (the chart's mpsDaemonPriorityClass off): no field at all.
    assert all("priorityClassName" not in pod_spec(o) for o in [*plan(JOB, s), plan_pool("gpu-b", 1, "ops")]
               if o["kind"] == "Pod")
    budget = plan_pool_budget("gpu-b", 1, "ops")
    assert (budget["apiVersion"], budget["kind"]) == ("policy/v1", "PodDisruptionBudget")
    assert (budget["metadata"]["name"], budget["metadata"]["namespace"]) == (pool["metadata"]["name"], "ops")
    assert budget["spec"] == {"minAvailable": 1, "selector": budget["spec"]["selector"]}  # bare pods: this form only
    sel = budget["spec"]["selector"]["matchLabels"].items()
    assert sel <= pool["metadata"]["labels"].items()  # it selects its GPU's pool ...
    assert not sel <= plan_pool("gpu-b", 0, "ops")["metadata"]["labels"].items()  # ... and no other GPU's
    assert not sel <= plan_pool("gpu-a", 1, "ops")["metadata"]["labels"].items()
    # A pool's daemon, like a job's: the clients' non-root UID; root only in the init container.
    (pc,), (init,) = pod_spec(pool)["containers"], pod_spec(pool)["initContainers"]
    assert pc["securityContext"]["runAsUser"] == 1000 and pc["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert init["args"] == ["mps-dir", "/mps", "--owner", "1000:1000"] and init["securityContext"]["runAsUser"] == 0


def test_a_daemon_goes_unready_long_before_it_is_killed() -> None:
    from sharetune.planner import plan_pool

    s = parse_spec("tj", {"model": {"name": "resnet18"}, "target": "cuda"})
    for daemon in (next(o for o in plan(JOB, s) if o["kind"] == "Pod"), plan_pool("gpu-a", 0, "ops")):
        c = containers(daemon)[0]
        ready, live = c["readinessProbe"], c["livenessProbe"]
        # Readiness: the control pipe answers (sharetune_tuner.measure.mps.MpsDaemon.health); liveness:
        # the wrapper still supervises (MpsDaemon.live), which restarts a mute daemon itself.
        assert ready["httpGet"] == {"path": "/healthz", "port": "metrics"}
        assert live["httpGet"] == {"path": "/livez", "port": "metrics"}
        ready_s = ready["periodSeconds"] * ready["failureThreshold"]
        live_s = live.get("initialDelaySeconds", 0) + live["periodSeconds"] * live["failureThreshold"]
        assert ready_s <= 10 and live_s >= 10 * ready_s


def test_multi_gpu_job_has_a_daemon_and_a_server_group_per_gpu() -> None:
    from sharetune.api.topology import GPU_INDEX_LABEL as GPU_INDEX
    from sharetune.planner import daemon_names, servers_scale

    s = parse_spec("tj", {"model": {"name": "resnet18"}, "target": "cuda",
                          "gpuSharing": {"gpus": 3}, "servers": {"replicas": 4, "threadPercentage": 25}})
    k = by_kind(applied(JOB, s))
    daemons = {p["metadata"]["name"]: p for p in k["Pod"]}
    assert sorted(daemons) == ["tj-mps-0", "tj-mps-1", "tj-mps-2"]
    servers = {d["metadata"]["name"]: d for d in k["Deployment"]
               if d["metadata"]["labels"]["app.kubernetes.io/component"] == "server"}
    assert sorted(servers) == ["tj-servers-0", "tj-servers-1", "tj-servers-2"]
    host_dirs = set()
    for g in range(3):
        daemon, srv = daemons[f"tj-mps-{g}"], servers[f"tj-servers-{g}"]
        assert daemon["metadata"]["labels"][GPU_INDEX] == str(g)
        assert containers(daemon)[0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}  # one GPU each
        assert srv["spec"]["replicas"] == 0  # servers.replicas per GPU, once its daemon's GPU is published
        # The group's servers follow their own daemon (same node, same pipe directory) ...
        term = pod_spec(srv)["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
        assert term["labelSelector"]["matchLabels"][GPU_INDEX] == str(g)
        d_dir = next(v for v in pod_spec(daemon)["volumes"] if v["name"] == "mps")["hostPath"]["path"]
        s_dir = next(v for v in pod_spec(srv)["volumes"] if v["name"] == "mps")["hostPath"]["path"]
        assert d_dir == s_dir and d_dir.endswith(f"-{g}")
        host_dirs.add(d_dir)
        # ... and select only their own pods (no two Deployments fight over one pod).
        assert srv["spec"]["selector"]["matchLabels"][GPU_INDEX] == str(g)
        env = {e["name"]: e.get("value") for e in containers(srv)[0]["env"]}
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        # NVLink multicast stays off in every GPU process.
        assert env["NCCL_NVLS_ENABLE"] == "0" and env["NVSHMEM_DISABLE_NVLS"] == "1"
        assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert len(host_dirs) == 3
    # All clients share all 12 servers through the job's one tracker key.
    args = containers(k["Job"][0])[0]["args"]
    assert args[args.index("--servers") + 1] == "12" and args[args.index("--key") + 1] == "sharetune-uid-1"
    assert [n for _, n, _ in daemon_names("tj", s)] == ["tj-mps-0", "tj-mps-1", "tj-mps-2"]
    assert servers_scale("tj", s, 6) == [("tj-servers-0", 6), ("tj-servers-1", 6), ("tj-servers-2", 6)]
    # Without MPS each server owns a GPU: still one group (Deployment) of servers.replicas per GPU,
    # the same rule local mode follows (sharetune.api.topology.gpu_groups).
    nomps = parse_spec("tj", {"model": {"name": "resnet18"}, "target": "cuda", "gpuSharing": {"gpus": 2, "mps": False}})
    assert servers_scale("tj", nomps, 3) == [("tj-servers-0", 3), ("tj-servers-1", 3)]
    nomps_objs = by_kind(applied(JOB, nomps))
    assert "Pod" not in nomps_objs
    for d in (d for d in nomps_objs["Deployment"] if d["metadata"]["name"].startswith("tj-servers")):
        assert containers(d)[0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # The merge measures under the first GPU's daemon (its pipe directory), as local mode does.
    merge_dir = next(v for v in pod_spec(plan_merge(JOB, s))["volumes"] if v["name"] == "mps")["hostPath"]["path"]
    assert merge_dir == next(v for v in pod_spec(daemons["tj-mps-0"])["volumes"]
                             if v["name"] == "mps")["hostPath"]["path"]
    # One GPU keeps the plain names; a CPU job ignores gpus.
    one = parse_spec("tj", {"model": {"name": "resnet18"}, "target": "cuda"})
    assert [(g, d, v) for g, d, v in daemon_names("tj", one)] == [(None, "tj-mps", "tj-servers")]
    cpu = parse_spec("tj", {"model": {"name": "resnet18"}, "gpuSharing": {"gpus": 4}})
    assert cpu.total_servers == cpu.servers.replicas and "Pod" not in by_kind(plan(JOB, cpu))


def test_permanent_user_errors_are_not_retried() -> None:
    """Exit codes of user errors (bad spec, model, output: sharetune.api.exitcodes.PERMANENT) fail
    the client's index / the merge at once; crashes and kills keep their retries."""
    s = parse_spec("tj", {"model": {"name": "tiny_cnn"}, "clients": {"backoffLimitPerIndex": 3}})
    clients = next(o for o in plan(JOB, s) if o["kind"] == "Job")
    assert clients["spec"]["backoffLimitPerIndex"] == 3
    assert clients["spec"]["podFailurePolicy"] == {"rules": [{"action": "FailIndex", "onExitCodes": {
        "containerName": "client", "operator": "In", "values": [2, 3, 7]}}]}
    assert pod_spec(clients)["restartPolicy"] == "Never"  # what a pod failure policy requires
    merge = plan_merge(JOB, s)
    assert merge["spec"]["podFailurePolicy"]["rules"][0]["action"] == "FailJob"
    assert merge["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["containerName"] == "merge"


def test_a_clamped_job_merges_the_shards_it_kept() -> None:
    """The clients' Job is elastic (completions == parallelism, so the operator may scale both
    down together), and the merge reads as many shards as the clamp kept."""
    s = parse_spec("tj", {"model": {"name": "tiny_cnn"}, "trials": {"total": 192}, "clients": {"shards": 12}})
    clients = next(o for o in plan(JOB, s) if o["kind"] == "Job")
    assert clients["spec"]["completions"] == clients["spec"]["parallelism"] == 12
    args = containers(plan_merge(JOB, s))[0]["args"]
    assert args[args.index("--shards") + 1] == "12"
    args = containers(plan_merge(JOB, s, shards=4))[0]["args"]
    assert args[args.index("--shards") + 1] == "4"


def test_shards_are_sized_to_what_the_budget_can_give_a_task() -> None:
    """No idle client pods: 64 shards over 96 trials of at least two 16-candidate rounds each can
    keep only 3 busy; the spec says so, the planner creates 3."""
    s = parse_spec("tj", {"model": {"name": "resnet50"}, "trials": {"total": 96, "perTask": 64, "perIteration": 16},
                          "clients": {"shards": 64}})
    assert (s.shards, s.shards_asked, s.trials.useful_minimum, s.trials.max_tuned_tasks) == (3, 64, 32, 3)
    assert s.shards_sizing() == ("clients.shards 64 > 3: a budget of 96 trials gives 32 or more to each task it "
                                 "tunes but one (two rounds of trials.perIteration 16), so at most 3 tasks get "
                                 "trials: 3 client shards")
    clients = next(o for o in plan(JOB, s) if o["kind"] == "Job")
    assert clients["spec"]["completions"] == clients["spec"]["parallelism"] == 3
    assert parse_spec("tj", {"model": {"name": "resnet50"}, "clients": {"shards": 4}}).shards_sizing() is None


def test_builders_pool_pods_key_and_autoscaler() -> None:
    """spec.builders: a key Secret, builder pods on CPU nodes behind a headless Service, an HPA;
    the clients reach them by the Service's name and read the key from the mounted Secret."""
    from sharetune_tuner.cli import build_parser

    s = parse_spec("tj", {"model": {"name": "resnet18"}, "target": "cuda", "nodeSelector": {"gpu": "h200"},
                          "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                          "builders": {"replicas": 3, "workers": 6, "nodeSelector": {"pool": "cpu"},
                                       "tolerations": [{"key": "cpu-only", "operator": "Exists"}],
                                       "resources": {"requests": {"cpu": "6"}, "limits": {"cpu": "6"}},
                                       "autoscale": {"minReplicas": 2, "maxReplicas": 8}}})
    objs = applied(JOB, s)
    named = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    key = named["Secret", "tj-build-key"]
    assert len(key["stringData"]["authkey"]) >= 32
    dep, svc = named["Deployment", "tj-builders"], named["Service", "tj-builders"]
    hpa = named["HorizontalPodAutoscaler", "tj-builders"]
    assert [o["kind"] for o in objs].index("Deployment") < [o["kind"] for o in objs].index("Job")
    pod, c = pod_spec(dep), containers(dep)[0]
    args = build_parser().parse_args(c["args"])
    assert (args.cmd, args.listen, args.workers, args.metrics_port) == ("build-service", "0.0.0.0:9192", 6, 9400)
    assert c["resources"] == {"requests": {"cpu": "6"}, "limits": {"cpu": "6"}}
    # The HPA owns the count: a Deployment stating replicas would reset its scale when applied again.
    assert "replicas" not in dep["spec"]
    # CPU nodes: the builders' placement, not the job's GPU one; no GPU, no API identity.
    assert pod["nodeSelector"] == {"pool": "cpu"} and pod["tolerations"] == [{"key": "cpu-only", "operator": "Exists"}]
    assert "affinity" not in pod and "gpu" not in str(c.get("resources")) and not pod["automountServiceAccountToken"]
    assert c["securityContext"]["runAsNonRoot"] and c["readinessProbe"] == {"tcpSocket": {"port": "build"},
                                                                           "periodSeconds": 2}
    assert svc["spec"]["clusterIP"] == "None"  # headless: the name resolves to every ready builder
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert {p["port"] for p in svc["spec"]["ports"]} == {9192, 9400}
    assert hpa["apiVersion"] == "autoscaling/v2" and hpa["spec"]["scaleTargetRef"]["name"] == "tj-builders"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 8)
    assert hpa["spec"]["metrics"][0]["resource"]["target"] == {"type": "Utilization", "averageUtilization": 80}
    # The key: a mounted file for clients and builders alike, never a value in a pod's spec.
    client_job = named["Job", "tj-clients"]
    for o in (dep, client_job):
        p, cc = pod_spec(o), containers(o)[0]
        assert {"name": "build-key", "secret": {"secretName": "tj-build-key"}} in p["volumes"]
        assert {"name": "build-key", "mountPath": "/etc/sharetune/build-key", "readOnly": True} in cc["volumeMounts"]
        assert {"name": "SHARETUNE_BUILD_AUTHKEY_FILE", "value": "/etc/sharetune/build-key/authkey"} in cc["env"]
        assert key["stringData"]["authkey"] not in str(o)
    assert build_parser().parse_args(containers(client_job)[0]["args"]).build_service == "tj-builders:9192"


def test_no_builders_section_no_pool() -> None:
    s = parse_spec("tj", {"model": {"name": "tiny_cnn"}})
    objs = plan(JOB, s)
    assert not [o for o in objs if o["kind"] in ("Secret", "HorizontalPodAutoscaler")]
    assert not [o for o in objs if o["metadata"]["name"] == "tj-builders"]
    job = next(o for o in objs if o["kind"] == "Job")
    assert "--build-service" not in containers(job)[0]["args"] and "build-key" not in str(job)
    s = parse_spec("tj", {"model": {"name": "tiny_cnn"}, "builders": {"replicas": 2}})
    assert not [o for o in plan(JOB, s) if o["kind"] == "HorizontalPodAutoscaler"]  # no autoscale: fixed replicas
    assert next(o for o in plan(JOB, s) if o["metadata"]["name"] == "tj-builders")["spec"]["replicas"] == 2


# ---- GPU sharing modes (docs/gpu-pools.md) --------------------------------------------------------
def _env(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in c["env"]}


def test_pool_mode_servers_join_the_gpu_pool_they_were_placed_on() -> None:
    from sharetune.admission import GpuId, Placement
    from sharetune.api.topology import POOL_LABEL
    from sharetune.planner import plan_pool, plan_pool_identity
    from sharetune.sharing import Sharing

    s = parse_spec("tj", {"model": {"name": "resnet18"}, "target": "cuda", "nodeSelector": {"gpu": "h200"},
                          "affinity": {"nodeAffinity": {}}, "gpuSharing": {"share": 50, "pinnedMemory": "8G"}})
    placed = Sharing("pool", Placement((GpuId("gpu-b", 1),), 50, 8192))
    k = by_kind(plan(JOB, s, sharing=placed))
    assert "Pod" not in k  # no daemon of the job's own: the GPU's pool is the operator's
    srv = next(d for d in k["Deployment"] if d["metadata"]["name"] == "tj-servers")
    pod, c = pod_spec(srv), containers(srv)[0]
    # Pinned to the node the ledger chose (the job's nodeSelector kept, its affinity not applied).
    assert pod["nodeSelector"] == {"gpu": "h200", "kubernetes.io/hostname": "gpu-b"} and "affinity" not in pod
    assert pod["hostIPC"] is True and "nvidia.com/gpu" not in str(c.get("resources"))
    assert next(v for v in pod["volumes"] if v["name"] == "mps")["hostPath"] == {
        "path": "/run/sharetune/pools/sharetune-system/gpu-1", "type": "Directory"}
    env = _env(c)
    # The share split between the 2 servers, the memory budget likewise.
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25" and env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/mps/pipe"
    # On the GPU's tenant list as namespace/name: other jobs' measurements name it (measure/window.py).
    assert env["SHARETUNE_TENANT"] == f"{JOB.namespace}/{JOB.name}"
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void" and srv["spec"]["replicas"] == 0  # until the pool's GPU is known
    assert srv["spec"]["template"]["metadata"]["labels"][POOL_LABEL] == "pool-gpu-b-gpu1"
    # The pool daemon of that GPU: the operator's namespace, no owner, pinned, one GPU, non-root
    # (its init container hands it the host directory), the same pipe directory.
    daemon = plan_pool("gpu-b", 1, "sharetune-system", tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])
    m, dpod, dc = daemon["metadata"], pod_spec(daemon), containers(daemon)[0]
    assert (m["name"], m["namespace"], m["labels"][POOL_LABEL]) == ("pool-gpu-b-gpu1", "sharetune-system",
                                                                     "pool-gpu-b-gpu1")
    assert "ownerReferences" not in m and m["labels"]["app.kubernetes.io/component"] == "gpu-pool"
    assert dpod["nodeSelector"] == {"kubernetes.io/hostname": "gpu-b"} and dpod["hostIPC"] is True
    assert dpod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert dc["resources"] == {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "50m", "memory": "64Mi"}}
    assert dc["securityContext"]["runAsNonRoot"] and not dc["securityContext"]["allowPrivilegeEscalation"]
    assert (next(v for v in dpod["volumes"] if v["name"] == "mps")["hostPath"]["path"]
            == "/run/sharetune/pools/sharetune-system/gpu-1")
    # No default limits on a shared daemon: each job's servers set their own.
    assert dc["args"] == ["mps-daemon", "--pipe-dir", "/mps/pipe", "--log-dir", "/mps/log", "--client-group", "1000",
                          "--publish-gpu", "--metrics-port", "9400"]
    # Its identity: its own pod, get and patch, nothing else (named as the pod).
    assert dpod["serviceAccountName"] == "pool-gpu-b-gpu1" and dpod["automountServiceAccountToken"] is True
    sa, role, binding = plan_pool_identity("gpu-b", 1, "sharetune-system")
    assert sa["metadata"]["name"] == role["metadata"]["name"] == binding["metadata"]["name"] == "pool-gpu-b-gpu1"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "resourceNames": ["pool-gpu-b-gpu1"],
                              "verbs": ["get", "patch"]}]
    # The merge measures under the same pool, inside the job's share and memory budget.
    merge = plan_merge(JOB, s, sharing=placed)
    menv = _env(containers(merge)[0])
    assert menv["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50" and menv["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8G"
    assert menv["SHARETUNE_TENANT"] == env["SHARETUNE_TENANT"]  # not a co-tenant of its own servers
    assert pod_spec(merge)["nodeSelector"]["kubernetes.io/hostname"] == "gpu-b"


def test_pool_mode_multi_gpu_groups_follow_their_own_gpus() -> None:
    from sharetune.admission import GpuId, Placement
    from sharetune.sharing import Sharing

    s = parse_spec("tj", {"model": {"name": "resnet18"}, "target": "cuda", "gpuSharing": {"gpus": 2, "share": 40}})
    placed = Sharing("pool", Placement((GpuId("gpu-a", 0), GpuId("gpu-b", 3)), 40))
    servers = {d["metadata"]["name"]: d for d in plan(JOB, s, sharing=placed) if d["kind"] == "Deployment"
               and d["metadata"]["labels"]["app.kubernetes.io/component"] == "server"}
    for name, node, path in (("tj-servers-0", "gpu-a", "/run/sharetune/pools/sharetune-system/gpu-0"),
                             ("tj-servers-1", "gpu-b", "/run/sharetune/pools/sharetune-system/gpu-3")):
        pod = pod_spec(servers[name])
        assert pod["nodeSelector"]["kubernetes.io/hostname"] == node
        assert next(v for v in pod["volumes"] if v["name"] == "mps")["hostPath"]["path"] == path
        assert _env(containers(servers[name])[0])["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"


def test_device_plugin_mode_servers_request_a_replica_and_run_no_daemon() -> None:
    from sharetune.sharing import Sharing

    s = parse_spec("tj", {"model": {"name": "resnet18"}, "target": "cuda", "nodeSelector": {"gpu": "h200"},
                          "gpuSharing": {"mode": "devicePlugin"}, "servers": {"replicas": 3, "threadPercentage": 20}})
    sharing = Sharing("devicePlugin", resource_name="example.com/mps-gpu")
    k = by_kind(plan(JOB, s, sharing=sharing))
    assert "Pod" not in k
    srv = next(d for d in k["Deployment"] if d["metadata"]["name"] == "tj-servers")
    pod, c = pod_spec(srv), containers(srv)[0]
    assert c["resources"]["limits"] == {"example.com/mps-gpu": "1"} and "nvidia.com/gpu" not in c["resources"]["limits"]
    # The plugin mounts its own pipe directory: no hostPath, no hostIPC, no daemon to follow.
    assert not pod.get("hostIPC") and "mps" not in {v["name"] for v in pod["volumes"]} and "affinity" not in pod
    assert pod["nodeSelector"] == {"gpu": "h200"}
    assert _env(c)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "20"  # can only lower the plugin's split
    merge = plan_merge(JOB, s, sharing=sharing)
    assert containers(merge)[0]["resources"]["limits"] == {"example.com/mps-gpu": "1"}


def test_exclusive_mode_is_todays_plan_and_a_pool_needs_a_placement() -> None:
    import pytest

    from sharetune.sharing import Sharing, SharingConfig

    s = parse_spec("tj", {"model": {"name": "resnet18"}, "target": "cuda", "servers": {"threadPercentage": 30}})
    assert plan(JOB, s, sharing=Sharing("exclusive")) == plan(JOB, s)  # a daemon per job, as before pools
    assert plan_merge(JOB, s, sharing=Sharing("exclusive")) == plan_merge(JOB, s)
    with pytest.raises(ValueError, match="mode pool needs the job's placement"):
        Sharing("pool")
    cfg = SharingConfig()
    assert cfg.mode_of(s) == "pool" and cfg.mode_of(parse_spec("c", {"model": {"name": "resnet18"}})) is None
    nomps = parse_spec("tj", {"model": {"name": "resnet18"}, "target": "cuda", "gpuSharing": {"mps": False}})
    assert cfg.mode_of(nomps) == "exclusive"
    dp = parse_spec("tj", {"model": {"name": "resnet18"}, "target": "cuda", "gpuSharing": {
        "mode": "devicePlugin", "devicePlugin": {"resourceName": "example.com/gpu"}}})
    assert cfg.sharing_of(dp) == Sharing("devicePlugin", None, "example.com/gpu")
    assert SharingConfig(default_mode="devicePlugin").sharing_of(s) == Sharing("devicePlugin", None,
                                                                                 "nvidia.com/gpu.shared")


def test_host_directories_are_keyed_so_no_two_jobs_or_releases_share_one() -> None:
    from sharetune.admission import GpuId, Placement
    from sharetune.planner import plan_pool
    from sharetune.sharing import Sharing

    s = parse_spec("resnet50-gpu", {"model": {"name": "resnet18"}, "target": "cuda"})

    def mps_dir(job: JobRef) -> str:
        daemon = next(o for o in plan(job, s) if o["kind"] == "Pod")
        return next(v for v in pod_spec(daemon)["volumes"] if v["name"] == "mps")["hostPath"]["path"]

    # "<namespace>-<name>" was the same for these two jobs of different tenants.
    a, b = JobRef("resnet50-gpu", "team-a", "uid-a"), JobRef("a-resnet50-gpu", "team", "uid-b")
    assert mps_dir(a) == "/run/sharetune/mps/uid-a" and mps_dir(b) == "/run/sharetune/mps/uid-b"
    # Two releases' pools of the same GPU on one node: two daemons, two pipe directories; each
    # release's servers join their own.
    paths = {ns: next(v for v in pod_spec(plan_pool("gpu-a", 0, ns))["volumes"]
                      if v["name"] == "mps")["hostPath"]["path"]
             for ns in ("sharetune-system", "sharetune-b")}
    assert paths == {"sharetune-system": "/run/sharetune/pools/sharetune-system/gpu-0",
                     "sharetune-b": "/run/sharetune/pools/sharetune-b/gpu-0"}
    placed = Sharing("pool", Placement((GpuId("gpu-a", 0),), 50), pool_namespace="sharetune-b")
    srv = next(o for o in plan(a, s, sharing=placed)
               if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("servers"))
    assert next(v for v in pod_spec(srv)["volumes"] if v["name"] == "mps")["hostPath"]["path"] == paths["sharetune-b"]


def test_only_the_jobs_own_pods_reach_its_tracker_servers_and_builders() -> None:
    from sharetune.netpolicy import NetworkConfig, NetworkConfigError

    s = parse_spec("tj", {"model": {"name": "resnet18"}, "target": "cuda", "builders": {"replicas": 2}})
    objs = applied(JOB, s)
    pol = by_kind(objs)["NetworkPolicy"]
    assert objs[0] is pol[0]  # created before any pod of the job
    spec = pol[0]["spec"]
    assert spec["podSelector"] == {"matchLabels": {"sharetune.io/job": "tj"}} and spec["policyTypes"] == ["Ingress"]
    own, scrapers = spec["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": {"sharetune.io/job": "tj"}}}]}  # any port, same namespace
    assert scrapers == {"from": [{"namespaceSelector": {}}], "ports": [{"protocol": "TCP", "port": 9400}]}
    # Every pod the job runs (merge included) is selected by the policy.
    for o in [*objs, plan_merge(JOB, s)]:
        if o["kind"] in ("Pod", "Deployment", "Job"):
            meta = o["metadata"] if o["kind"] == "Pod" else o["spec"]["template"]["metadata"]
            assert meta["labels"]["sharetune.io/job"] == "tj", o["metadata"]["name"]
    # The tracker key is the job's UID on both sides, never its name.
    k = by_kind(objs)
    srv = next(d for d in k["Deployment"] if d["metadata"]["name"] == "tj-servers")
    for args in (containers(srv)[0]["args"], containers(k["Job"][0])[0]["args"]):
        assert args[args.index("--key") + 1] == "sharetune-uid-1"
    # The chart's values: scrapers narrowed, or no policy at all; bad values name the setting.
    cfg = NetworkConfig.from_env({"SHARETUNE_METRICS_SCRAPERS":
                                  '[{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}]'})
    narrowed = by_kind(applied(JOB, s, network=cfg))["NetworkPolicy"][0]["spec"]["ingress"][1]["from"]
    assert narrowed == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}]
    assert len(by_kind(applied(JOB, s, network=NetworkConfig.from_env({"SHARETUNE_METRICS_SCRAPERS": "[]"})))
               ["NetworkPolicy"][0]["spec"]["ingress"]) == 1
    assert "NetworkPolicy" not in by_kind(applied(JOB, s,
                                               network=NetworkConfig.from_env({"SHARETUNE_NETWORK_POLICY": "false"})))
    for env, words in (({"SHARETUNE_NETWORK_POLICY": "yes"}, "networkPolicy.enabled"),
                       ({"SHARETUNE_METRICS_SCRAPERS": "{"}, "networkPolicy.metricsScrapers"),
                       ({"SHARETUNE_METRICS_SCRAPERS": '[{"pods": 1}]'}, "namespaceSelector, podSelector or ipBlock")):
        with pytest.raises(NetworkConfigError, match=words):
            NetworkConfig.from_env(env)


def test_every_pod_has_requests_and_daemons_run_the_charts_image() -> None:
    from sharetune.admission import GpuId, Placement
    from sharetune.planner import DEFAULT_IMAGE, plan_pool
    from sharetune.requests import RequestsConfigError, from_env
    from sharetune.sharing import Sharing

    user = {"model": {"name": "resnet18"}, "target": "cuda", "image": "registry.example/team/tuner:1",
            "builders": {"replicas": 1}, "clients": {"resources": {"requests": {"cpu": "2"}}}}
    s = parse_spec("tj", user)
    mine = from_env({"SHARETUNE_DEFAULT_REQUESTS": '{"server": {"memory": "2Gi"}}'})
    objs = [*applied(JOB, s, requests=mine), plan_merge(JOB, s, requests=mine),
            *applied(JOB, parse_spec("tj", {**user, "gpuSharing": {"share": 50}}),
                  sharing=Sharing("pool", Placement((GpuId("n", 0),), 50))),
            plan_pool("n", 0, "sharetune-system", requests=mine)]
    seen = set()
    for o in objs:
        if o["kind"] not in ("Pod", "Deployment", "Job"):
            continue
        for c in containers(o):
            seen.add(c["name"])
            assert c["resources"]["requests"], (o["metadata"]["name"], c["name"])  # never BestEffort
            # Daemons (root, hostIPC) always run the chart's image; the rest the job's own.
            assert c["image"] == (DEFAULT_IMAGE if c["name"] == "mps-daemon" else user["image"]), c["name"]
    assert seen == {"mps-daemon", "tracker", "server", "client", "builder", "merge"}
    srv = next(o for o in objs if o["metadata"]["name"] == "tj-servers")
    assert containers(srv)[0]["resources"]["requests"] == {"cpu": "100m", "memory": "2Gi"}  # chart value over default
    clients = next(o for o in objs if o["metadata"]["name"] == "tj-clients")
    assert containers(clients)[0]["resources"] == {"requests": {"cpu": "2"}}  # the spec's own win
    with pytest.raises(RequestsConfigError, match="defaultRequests"):
        from_env({"SHARETUNE_DEFAULT_REQUESTS": '{"webserver": {"cpu": "1"}}'})


def test_pods_that_need_no_gpu_see_none() -> None:
    def gpu_env(o: dict[str, Any]) -> str | None:
        return _env(containers(o)[0]).get("NVIDIA_VISIBLE_DEVICES")

    cpu = parse_spec("tj", {"model": {"name": "tiny_cnn"}, "builders": {"replicas": 1}})
    cpu_pods = [o for o in [*plan(JOB, cpu), plan_merge(JOB, cpu)] if o["kind"] in ("Pod", "Deployment", "Job")]
    assert len(cpu_pods) == 5 and {gpu_env(o) for o in cpu_pods} == {"void"}
    gpu = parse_spec("tj", {"model": {"name": "resnet18"}, "target": "cuda", "builders": {"replicas": 1}})
    tracker = next(o for o in plan(JOB, gpu) if o["kind"] == "Deployment" and o["metadata"]["name"] == "tj-tracker")
    assert gpu_env(tracker) == "void"
    # A cuda job's builders build kernels without a GPU: the image's stand-in driver lets TVM emit cubins.
    builders = next(o for o in plan(JOB, gpu) if o["kind"] == "Deployment" and o["metadata"]["name"] == "tj-builders")
    assert gpu_env(builders) == "void" and _env(containers(builders)[0])["LD_LIBRARY_PATH"] == "/opt/sharetune/nocuda"
    assert "LD_LIBRARY_PATH" not in _env(containers(tracker)[0])  # only where kernels are built
    assert containers(tracker)[0]["readinessProbe"] == {"tcpSocket": {"port": "tracker"}, "periodSeconds": 2}


def test_servers_under_a_daemon_of_ours_never_run_outside_mps() -> None:
    from sharetune.admission import GpuId, Placement
    from sharetune.sharing import Sharing
    from sharetune_tuner.cli import build_parser

    def requires(spec: dict[str, Any], sharing: Any = None) -> bool:
        srv = next(o for o in plan(JOB, parse_spec("tj", spec), sharing=sharing)
                   if o["kind"] == "Deployment" and o["metadata"]["name"].startswith("tj-servers"))
        return bool(build_parser().parse_args(containers(srv)[0]["args"]).require_mps)

    gpu = {"model": {"name": "resnet18"}, "target": "cuda"}
    assert requires(gpu)  # exclusive: the job's own daemon
    assert requires({**gpu, "gpuSharing": {"share": 50}}, Sharing("pool", Placement((GpuId("n", 0),), 50)))
    assert not requires({**gpu, "gpuSharing": {"mode": "devicePlugin"}}, Sharing("devicePlugin"))  # the plugin's
    assert not requires({**gpu, "gpuSharing": {"mps": False}})  # no MPS asked: each server owns a GPU
    assert not requires({"model": {"name": "tiny_cnn"}})


def test_s3_cleanup_is_a_bounded_job_of_the_jobs_own_with_its_credentials_from_the_secret() -> None:
    """cleanupOnDelete runs as a Job in the job's namespace: the operator never reads the Secret
    (the kubelet resolves it into the pod's env) nor calls the job's endpoint itself."""
    from sharetune.api.gpuenv import NO_MULTICAST
    from sharetune.planner import DEFAULT_IMAGE, plan_s3_cleanup
    from sharetune_tuner.cli import build_parser

    user = {"model": {"name": "resnet18"}, "target": "cuda", "image": "registry.example/team/tuner:1",
            "tolerations": [{"key": "gpu", "operator": "Exists"}], "nodeSelector": {"gpu": "h100"},
            "output": {"s3": {"bucket": "bkt", "prefix": "runs/", "endpoint": "http://s3:9000", "region": "eu-1",
                              "credentialsSecret": {"name": "creds", "accessKeyIdKey": "id"},
                              "cleanupOnDelete": True}}}
    s = parse_spec("tj", user)
    job = plan_s3_cleanup(JOB, s, "chart/tuner:2")
    m = job["metadata"]
    assert (job["apiVersion"], job["kind"], m["name"], m["namespace"]) == ("batch/v1", "Job", "tj-s3-cleanup", "ns1")
    assert m["ownerReferences"] == [{"apiVersion": "sharetune.io/v1alpha1", "kind": "TuningJob", "name": "tj",
                                     "uid": "uid-1", "controller": True, "blockOwnerDeletion": True}]
    assert m["annotations"] == {"sharetune.io/job-uid": "uid-1"}
    # The job's labels on the Job and its pod: its NetworkPolicy and selectors count it as the job's.
    for labels in (m["labels"], job["spec"]["template"]["metadata"]["labels"]):
        assert labels["sharetune.io/job"] == "tj" and labels["app.kubernetes.io/managed-by"] == "sharetune"
        assert labels["app.kubernetes.io/component"] == "s3-cleanup"
    # Bounded: a few retries, a deadline, a TTL; a permanent user error is not retried.
    spec = job["spec"]
    assert 0 < spec["backoffLimit"] <= 3 and 0 < spec["activeDeadlineSeconds"] <= 900
    assert spec["ttlSecondsAfterFinished"] > 0 and spec["podFailurePolicy"]["rules"][0]["action"] == "FailJob"
    pod = pod_spec(job)
    assert pod["restartPolicy"] == "Never" and pod["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod and pod["enableServiceLinks"] is False
    assert pod["tolerations"] == user["tolerations"] and "nodeSelector" not in pod  # no GPU placement: a CPU pod
    (c,) = pod["containers"]
    assert c["image"] == "chart/tuner:2"  # the chart's image, never the job's spec.image
    assert plan_s3_cleanup(JOB, s)["spec"]["template"]["spec"]["containers"][0]["image"] == DEFAULT_IMAGE
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] and sc["runAsUser"] == 1000 and not sc["allowPrivilegeEscalation"]
    assert sc["readOnlyRootFilesystem"] and sc["capabilities"] == {"drop": ["ALL"]}
    assert c["resources"] == {"requests": {"cpu": "50m", "memory": "128Mi"}} and "ports" not in c
    env = {e["name"]: e for e in c["env"]}
    assert env["AWS_ACCESS_KEY_ID"] == {"name": "AWS_ACCESS_KEY_ID",
                                        "valueFrom": {"secretKeyRef": {"name": "creds", "key": "id"}}}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": "creds", "key": "AWS_SECRET_ACCESS_KEY"}}
    assert "value" not in env["AWS_ACCESS_KEY_ID"] and "value" not in env["AWS_SECRET_ACCESS_KEY"]  # never inline
    assert env["SHARETUNE_S3_ENDPOINT"]["value"] == "http://s3:9000" and env["AWS_DEFAULT_REGION"]["value"] == "eu-1"
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "void" and not set(NO_MULTICAST) & set(env)  # no CUDA here
    # The tuner's own command, over the job's prefix (the tuner adds the slash: "a" never takes "ab").
    a = build_parser().parse_args(c["args"])
    assert (a.cmd, a.bucket, a.prefix) == ("s3-cleanup", "bkt", "runs/ns1/tj")
    # Foreground deletion removes owned dependents first: then the Job is left to its TTL.
    assert "ownerReferences" not in plan_s3_cleanup(JOB, s, owned=False)["metadata"]
    # The longest job name the CRD admits (48) still gives a Job name within a label value's 63.
    longest = JobRef("j" * 48, "ns1", "uid-1")
    name = plan_s3_cleanup(longest, parse_spec("j" * 48, user))["metadata"]["name"]
    assert name == "j" * 48 + "-s3-cleanup" and len(name) <= 63
    with pytest.raises(ValueError, match="spec.output.s3"):
        plan_s3_cleanup(JOB, parse_spec("tj", {"model": {"name": "tiny_cnn"}}))


def test_no_pod_of_any_mode_sees_every_gpu_of_its_node() -> None:
    from sharetune.api.gpuenv import NO_DRIVER_LIB_DIR
    from sharetune.requests import pod_specs
    from sharetune_dev.manifests import MODES, PUBLISHED_GPU

    for mode, objects in MODES.items():
        if mode == "chart":
            continue  # helm's rendering: the chart makes no tuning pod
        for obj in objects():
            for pod in pod_specs(obj):
                for c in [*pod.get("initContainers", []), *pod["containers"]]:
                    seen = {e["name"]: e.get("value") for e in c.get("env", [])}.get("NVIDIA_VISIBLE_DEVICES")
                    granted = any("gpu" in k for k in (c.get("resources") or {}).get("limits", {}))
                    # The merge sees its daemon's GPU; servers the daemon's or the device plugin's
                    # choice; every other pod none (a cuda job's clients and builders build kernels
                    # with the image's stand-in driver library and ask the servers for the arch).
                    # (servers get theirs by a patch once the daemon has named it: none until then).
                    pinned = c["name"] == "merge" and mode in ("exclusive", "pool") and "nomps" not in obj[
                        "metadata"]["name"]
                    want = PUBLISHED_GPU if pinned else None if granted else "void"
                    assert seen == want, (mode, obj["metadata"]["name"], c["name"], seen)
                    if c["name"] in ("client", "builder") and mode in ("exclusive", "pool", "device-plugin"):
                        assert {e["name"]: e.get("value") for e in c["env"]}["LD_LIBRARY_PATH"] == NO_DRIVER_LIB_DIR


def test_a_pool_jobs_clients_see_no_gpu_and_join_no_pool() -> None:
    s = parse_spec("tj", {"model": {"name": "resnet18"}, "target": "cuda", "gpuSharing": {"share": 50}})
    clients = plan_clients(JOB, s)
    assert "nodeSelector" not in pod_spec(clients) and not pod_spec(clients).get("hostIPC")
    env = {e["name"]: e.get("value") for e in containers(clients)[0]["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void" and "CUDA_MPS_PIPE_DIRECTORY" not in env  # no MPS client
