"""Spec -> desired Kubernetes objects. Pure: no kopf, no kubernetes client, no TVM.

The reconciler only applies what this module returns, so everything about placement, limits,
security and naming is unit-testable without a cluster.

Privileges, kept minimal and stated:
- The MPS daemon pod is the only one that requests a GPU (``nvidia.com/gpu: 1``) and the only
  one running as root: it creates the per-job pipe/log directory on the host (hostPath
  ``/run/sharetune/mps/<job UID>``: unique, so no two jobs share one) that the servers, a
  different pod, must reach, and makes it usable by the tuner UID. It is not privileged and
  does not escalate. We do not switch the GPU to EXCLUSIVE_PROCESS (that needs a privileged
  pod); MPS works in DEFAULT compute mode.
- Daemon and servers use ``hostIPC``: MPS clients and the MPS server exchange memory handles
  through /dev/shm of the host IPC namespace.
- Servers do not request the GPU (the device plugin would hand out a second one); they follow the
  daemon onto its node (pod affinity) and see exactly the daemon's GPU: the daemon reads its UUID
  through NVML and writes it on its own pod (``GPU_UUID_ANNOTATION``; its ServiceAccount may get
  and patch that pod only), and the servers run (replicas above 0) only once the operator has put
  that UUID in their ``NVIDIA_VISIBLE_DEVICES`` (:func:`pin_servers_patch`); the clients' Job is
  created only then (:func:`plan_clients`). Never ``all``: pods that need no GPU (tracker, clients,
  builders, the S3 clean-up) ask for ``void``.
- Daemons run at the chart's daemon priority (``daemon_priority_class``, a PriorityClass the chart
  creates by default): a daemon that is preempted or evicted ends the CUDA context of every server
  under it, so it must not be among the first to go. A GPU pool's daemon, shared by several jobs,
  also has a PodDisruptionBudget (:func:`plan_pool_budget`): draining its node waits for a person.
- All other pods: non-root UID 1000, no privilege escalation, all capabilities dropped,
  read-only root filesystem with an emptyDir for scratch, RuntimeDefault seccomp (the pod's
  securityContext as well as each container's).

GPU sharing modes (``Sharing``, docs/gpu-pools.md): the above is mode exclusive. In mode pool
the job has no daemon: :func:`plan_pool` is the operator's daemon of one GPU, shared by every job
placed there, and the job's servers are pinned to that GPU's node and use its pipe directory. In
mode devicePlugin each server requests one replica of the device plugin's shared resource.
"""

from __future__ import annotations

import copy
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from .admission import GpuId
from .api import commands
from .api.exitcodes import PERMANENT
from .api.gpuenv import GPU_UUID_ANNOTATION, NO_DRIVER_LIB_DIR, NO_GPU_DEVICES, NO_MULTICAST
from .api.spec import API_GROUP, API_VERSION, KIND, TuningJobSpec
from .api.topology import (
    BUILD_AUTHKEY_FILE_ENV,
    BUILD_KEY_DIR,
    BUILD_KEY_FILE,
    BUILD_PORT,
    GPU_INDEX_LABEL,
    JOB_MANIFEST,
    METRICS_PORT,
    MODEL_DIR,
    MODEL_DIR_ENV,
    MODEL_FILE,
    MPS_HOST_ROOT,
    POD_WORK_DIR,
    POOL_LABEL,
    POOL_NODE_ANNOTATION,
    SERVER_PORT,
    TENANT_ENV,
    TRACKER_PORT,
    ChildNames,
    configmap_uri,
    gpu_groups,
    in_group,
    pool_host_dir,
    pool_pod_name,
    s3_env,
)
from .api.topology import result_location as _result_location
from .api.topology import s3_job_prefix as _s3_job_prefix
from .api.topology import store_uri as _store_uri
from .library_policy import LibraryConfig, library_parts
from .netpolicy import NetworkConfig, job_policy
from .requests import pod_specs, with_default_requests
from .sharing import DEVICE_PLUGIN, EXCLUSIVE, POOL, Sharing

TUNER_UID = 1000
TUNER_GID = 1000  # the tuner pods' group (runAsGroup): the MPS clients' group in a daemon's pipe directory
DEFAULT_IMAGE = "localhost/sharetune-tuner:0.1.0"


@dataclass(frozen=True)
class JobRef:
    name: str
    namespace: str
    uid: str


def labels(job: str, component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "sharetune", "app.kubernetes.io/instance": job,
            "app.kubernetes.io/component": component, "app.kubernetes.io/managed-by": "sharetune",
            "sharetune.io/job": job}


def selector(job: str, component: str) -> dict[str, str]:
    return {"sharetune.io/job": job, "app.kubernetes.io/component": component}


def owner(job: JobRef) -> dict[str, Any]:
    return {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND, "name": job.name, "uid": job.uid,
            "controller": True, "blockOwnerDeletion": True}


def _meta(job: JobRef, name: str, component: str) -> dict[str, Any]:
    return {"name": name, "namespace": job.namespace, "labels": labels(job.name, component),
            "ownerReferences": [owner(job)]}


def store_uri(job: JobRef, spec: TuningJobSpec) -> str:
    return _store_uri(job.namespace, job.name, spec)


def result_location(job: JobRef, spec: TuningJobSpec) -> str:
    return _result_location(job.namespace, job.name, spec)


def _restricted() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": TUNER_UID, "runAsGroup": TUNER_GID,
            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def _pod_restricted() -> dict[str, Any]:
    """The pod-level half of :func:`_restricted`: also binds a container the spec does not name
    (one injected by an admission webhook)."""
    return {"runAsNonRoot": True, "runAsUser": TUNER_UID, "runAsGroup": TUNER_GID,
            "seccompProfile": {"type": "RuntimeDefault"}}


def _store_env(spec: TuningJobSpec) -> list[dict[str, Any]]:
    return s3_env(spec.output.s3)


NO_MULTICAST_ENV = [{"name": k, "value": v} for k, v in NO_MULTICAST.items()]
# The NVIDIA container runtime mounts no GPU into a container asking for "void" (CUDA base
# images default to "all": every GPU of the node, around the device plugin's accounting).
NO_GPU = {"name": "NVIDIA_VISIBLE_DEVICES", "value": NO_GPU_DEVICES}


def _builds_without_gpu(spec: TuningJobSpec) -> list[dict[str, Any]]:
    """The env of a pod that builds kernels but sees no GPU (clients, builders): a cuda job's gets
    the image's stand-in driver library, with which TVM still emits cubins (its CUDA plugin links
    libcuda, which the runtime mounts only where a GPU is seen). Its clients learn the GPU's arch
    from the job's servers (sharetune_tuner.targets)."""
    if spec.target != "cuda":
        return [dict(NO_GPU)]
    return [dict(NO_GPU), {"name": "LD_LIBRARY_PATH", "value": NO_DRIVER_LIB_DIR}]


def _without_gpus(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A CPU job's pods see no GPU (in place)."""
    for pod in (p for o in objs for p in pod_specs(o)):
        for c in pod.get("containers", []):
            if not any(e["name"] == NO_GPU["name"] for e in c["env"]):
                c["env"].append(dict(NO_GPU))
    return objs


def _container(spec: TuningJobSpec, image: str, name: str, args: list[str], *, env: list[dict[str, Any]] | None = None,
               resources: dict[str, Any] | None = None, security: dict[str, Any] | None = None,
               mounts: list[dict[str, Any]] | None = None, probe: bool = True) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": name, "image": image, "imagePullPolicy": spec.image_pull_policy,
        "args": args, "env": [{"name": "PYTHONUNBUFFERED", "value": "1"},
                              *(NO_MULTICAST_ENV if spec.target == "cuda" else []), *(env or [])],
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT}],
        "securityContext": security if security is not None else _restricted(),
        "volumeMounts": [{"name": "scratch", "mountPath": "/tmp"}, *(mounts or [])],
    }
    if resources:
        c["resources"] = copy.deepcopy(resources)
    if probe:
        c["livenessProbe"] = {"httpGet": {"path": "/healthz", "port": "metrics"}, "initialDelaySeconds": 20,
                              "periodSeconds": 20, "failureThreshold": 3}
    return c


def _pod_spec(spec: TuningJobSpec, containers: list[dict[str, Any]], *, volumes: list[dict[str, Any]] | None = None,
              gpu_placement: bool = False, service_account: str | None = None, **extra: Any) -> dict[str, Any]:
    p: dict[str, Any] = {
        "containers": containers,
        "volumes": [{"name": "scratch", "emptyDir": {}}, *(volumes or [])],
        "securityContext": _pod_restricted(),
        "automountServiceAccountToken": service_account is not None,
        "enableServiceLinks": False,
        **extra,
    }
    if service_account:
        p["serviceAccountName"] = service_account
    if spec.raw.get("tolerations"):
        p["tolerations"] = copy.deepcopy(spec.raw["tolerations"])
    if gpu_placement:
        if spec.raw.get("nodeSelector"):
            p["nodeSelector"] = dict(spec.raw["nodeSelector"])
        if spec.raw.get("affinity"):
            p["affinity"] = copy.deepcopy(spec.raw["affinity"])
    return p


def _job_spec_volume(job: JobRef) -> tuple[dict[str, Any], dict[str, Any]]:
    vol = {"name": "job", "configMap": {"name": ChildNames(job.name).spec}}
    mount = {"name": "job", "mountPath": JOB_MANIFEST.rsplit("/", 1)[0], "readOnly": True}
    return vol, mount


def _model_volume(spec: TuningJobSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """An ONNX model from a ConfigMap or PVC, mounted read-only where the tuner looks for it:
    (volumes, mounts, env) for the client and merge pods; empty for zoo/URL models."""
    src = spec.model.onnx
    if src is None or not (src.config_map or src.pvc):
        return [], [], []
    if src.config_map:
        vol = {"name": "model", "configMap": {"name": src.config_map,
                                              "items": [{"key": src.config_map_key, "path": MODEL_FILE}]}}
    else:
        vol = {"name": "model", "persistentVolumeClaim": {"claimName": src.pvc, "readOnly": True}}
    return ([vol], [{"name": "model", "mountPath": MODEL_DIR, "readOnly": True}],
            [{"name": MODEL_DIR_ENV, "value": MODEL_DIR}])


def daemon_names(job: str, spec: TuningJobSpec) -> list[tuple[int | None, str, str]]:
    """(group, MPS daemon pod, servers Deployment) per GPU group."""
    n = ChildNames(job)
    return [(g, in_group(n.mps, g), in_group(n.servers, g)) for g in gpu_groups(spec)]


def servers_scale(job: str, spec: TuningJobSpec, replicas: int) -> list[tuple[str, int]]:
    """Servers Deployments and their replicas for ``servers.replicas`` = ``replicas``: one
    Deployment of ``replicas`` servers per GPU group."""
    return [(srv, replicas) for _, _, srv in daemon_names(job, spec)]


def _group_labels(d: dict[str, str], g: int | None) -> dict[str, str]:
    return d if g is None else {**d, GPU_INDEX_LABEL: str(g)}


def _mps_host_dir(job: JobRef, g: int | None = None) -> str:
    # The job's UID, not its name: "<namespace>-<name>" is the same for team-a/x-y and team-a-x/y.
    return in_group(f"{MPS_HOST_ROOT}/{job.uid}", g)


def _mps_client_parts(job: JobRef, g: int | None = None, gpu: str | None = None
                      ) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """``gpu``: the daemon's GPU UUID, as it published it (None: not yet, so no GPU)."""
    vol = {"name": "mps", "hostPath": {"path": _mps_host_dir(job, g), "type": "DirectoryOrCreate"}}
    mount = {"name": "mps", "mountPath": "/mps"}
    env = [{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/mps/pipe"},
           {"name": "CUDA_MPS_LOG_DIRECTORY", "value": "/mps/log"},
           {"name": "NVIDIA_VISIBLE_DEVICES", "value": gpu or NO_GPU_DEVICES},
           {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}]
    return vol, mount, env


def _follow_daemon(job: JobRef, g: int | None = None) -> dict[str, Any]:
    return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": _group_labels(selector(job.name, "mps-daemon"), g)},
        "topologyKey": "kubernetes.io/hostname"}]}}


def job_manifest(job: JobRef, spec: TuningJobSpec) -> str:
    """What the tuner pods read (--job): the same TuningJob document local mode reads."""
    text: str = yaml.safe_dump({"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND,
                                "metadata": {"name": job.name, "namespace": job.namespace}, "spec": spec.raw},
                               sort_keys=True)
    return text


def _mode(spec: TuningJobSpec, sharing: Sharing | None) -> str | None:
    """The job's GPU sharing mode: None on the CPU; without a Sharing, exclusive (a daemon per job)."""
    if spec.target != "cuda":
        return None
    return sharing.mode if sharing is not None else EXCLUSIVE


def _device(sharing: Sharing | None, g: int | None) -> GpuId:
    """The GPU group ``g``'s GPU in mode pool."""
    assert sharing is not None and sharing.placement is not None
    return sharing.placement.devices[g or 0]


def tracker_key(job: JobRef) -> str:
    """The key the job's servers register under and its clients ask for: the job's UID (random,
    unique), not its name, so no pod can guess it and register a server of its own."""
    return f"sharetune-{job.uid}"


def plan(job: JobRef, spec: TuningJobSpec, image: str = DEFAULT_IMAGE, sharing: Sharing | None = None,
         network: NetworkConfig | None = None, requests: Mapping[str, Mapping[str, str]] | None = None,
         daemon_priority_class: str | None = None, library: LibraryConfig | None = None) -> list[dict[str, Any]]:
    # The servers of a job whose GPU is a daemon's start at 0 replicas, seeing no GPU: the
    # operator pins them to the daemon's GPU once it is published (pin_servers_patch).
    """Every object the running job needs (the merge Job comes later: :func:`plan_merge`).
    ``sharing``: the job's mode (and placement in mode pool); None = exclusive. ``network`` and
    ``requests``: the chart's networkPolicy and defaultRequests values (None: the defaults).
    ``image`` is the chart's tuner image: the job's ``spec.image`` runs its tracker, servers,
    clients and builders, never its MPS daemon (root, hostIPC, a host directory).
    ``daemon_priority_class``: the chart's PriorityClass for MPS daemons (None: none)."""
    daemon_image = image
    image = spec.raw.get("image") or image
    n = ChildNames(job.name)
    objs: list[dict[str, Any]] = []
    # First, so no pod of the job is ever up without it.
    policy = job_policy(n.network_policy, job.namespace, job.name, METRICS_PORT, network or NetworkConfig(),
                        _meta(job, n.network_policy, "network"))
    if policy is not None:
        objs.append(policy)
    objs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(job, n.spec, "spec"),
                 "data": {"job.yaml": job_manifest(job, spec)}})
    objs += _rbac(job, spec)
    if pins_gpu(spec, sharing) and _mode(spec, sharing) == EXCLUSIVE:
        objs += _daemon_identity(job.namespace, ChildNames(job.name).mps,
                                 [name for _, name, _ in daemon_names(job.name, spec)], _meta(job, "", "rbac"))
    objs += [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(job, n.shard(i), "shard"),
              "data": {}} for i in range(spec.shards)]
    # Pre-created so the tuner Role can name it; the merge writes summary.json (and, for
    # ConfigMap output, the records) into it. S3 output keeps only the summary here.
    objs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(job, n.result(spec), "result"), "data": {}})
    if spec.uses_mps and _mode(spec, sharing) == EXCLUSIVE:
        objs += [_mps_daemon(job, spec, daemon_image, g, daemon_priority_class) for g in gpu_groups(spec)]
    objs += _tracker(job, spec, image)
    objs += [_servers(job, spec, image, g, sharing) for g in gpu_groups(spec)]
    objs += _builders(job, spec, image)  # before the clients: their workers warm up meanwhile
    if not pins_gpu(spec, sharing):  # else once the daemon names its GPU: plan_clients
        objs.append(_clients(job, spec, image, library))
    if spec.target != "cuda":
        _without_gpus(objs)
    return with_default_requests(objs, requests)


def _rbac(job: JobRef, spec: TuningJobSpec) -> list[dict[str, Any]]:
    """The tuner pods' identity: update their own shard/result ConfigMaps, nothing else. Secrets
    reach them as env from secretKeyRef (kubelet reads them), never through the API."""
    n = ChildNames(job.name)
    resource_names = [n.shard(i) for i in range(spec.shards)]
    resource_names.append(n.result(spec))
    sa = n.service_account
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(job, sa, "rbac"),
         "automountServiceAccountToken": False},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": _meta(job, sa, "rbac"),
         "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": resource_names,
                    "verbs": ["get", "update", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": _meta(job, sa, "rbac"),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
         "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": job.namespace}]},
    ]


def pins_gpu(spec: TuningJobSpec, sharing: Sharing | None) -> bool:
    """The job's servers (and merge) see a daemon's GPU, named to them once it is published: an
    MPS job of mode exclusive (its own daemons) or pool (the GPU's)."""
    return pins_gpu_in(spec, _mode(spec, sharing))


def pins_gpu_in(spec: TuningJobSpec, mode: str | None) -> bool:
    """:func:`pins_gpu` for a job whose mode is known by name (``status.gpuSharingMode``)."""
    return spec.target == "cuda" and (mode == POOL or ((mode or EXCLUSIVE) == EXCLUSIVE and spec.uses_mps))


def _daemon_identity(namespace: str, name: str, pods: list[str], meta: dict[str, Any]) -> list[dict[str, Any]]:
    """An MPS daemon's ServiceAccount: get and patch its own pod(s) by name (the GPU annotation),
    nothing else. ``meta``: labels and owner (the name and namespace are set here)."""
    m = {**copy.deepcopy(meta), "name": name, "namespace": namespace}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": m, "automountServiceAccountToken": False},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": copy.deepcopy(m),
         "rules": [{"apiGroups": [""], "resources": ["pods"], "resourceNames": pods, "verbs": ["get", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": copy.deepcopy(m),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]},
    ]


# The downward API: a daemon writes its GPU on its own pod.
OWN_POD_ENV = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
               {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]


def published_gpu(annotations: Mapping[str, str] | None, phase: str | None, deleting: bool) -> str | None:
    """The GPU UUID a daemon pod published (its annotation), counted only while the pod runs."""
    if deleting or phase != "Running":
        return None
    uuid = (annotations or {}).get(GPU_UUID_ANNOTATION)
    return str(uuid) if uuid else None


def pin_servers_patch(uuid: str, replicas: int) -> dict[str, Any]:
    """The strategic-merge patch that gives a servers Deployment its daemon's GPU and its replicas
    (env entries merge by name: only ``NVIDIA_VISIBLE_DEVICES`` changes)."""
    return {"spec": {"replicas": replicas, "template": {"spec": {"containers": [
        {"name": "server", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": uuid}]}]}}}}


def _mps_dir_security() -> dict[str, Any]:
    """The init container that hands a daemon's host directory over: root for seconds, only to
    change owners (the kubelet creates a hostPath directory as root); no other capability, no
    escalation, the chart's image and a fixed command."""
    return {"runAsUser": 0, "runAsNonRoot": False, "allowPrivilegeEscalation": False, "privileged": False,
            "capabilities": {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER"]},
            "readOnlyRootFilesystem": True, "seccompProfile": {"type": "RuntimeDefault"}}


def _mps_dir_init(image: str, pull_policy: str) -> dict[str, Any]:
    """The daemon pods' init container: ``/mps`` to the tuner UID/GID (:func:`sharetune_tuner.measure.mps.hand_over`).
    The daemon itself then runs as that UID, not root: a root control daemon without CAP_SETUID
    cannot start the MPS server for a UID-1000 client (measured on an H100: every client failed
    to connect), and one with it could become any user."""
    return {"name": "mps-dir", "image": image, "imagePullPolicy": pull_policy,
            "args": commands.mps_dir("/mps", TUNER_UID, TUNER_GID),
            "env": [dict(NO_GPU)],  # root for seconds: the device plugin's GPU is its container's only
            "securityContext": _mps_dir_security(),
            "volumeMounts": [{"name": "mps", "mountPath": "/mps"}]}


def _daemon_pod_security() -> dict[str, Any]:
    """A daemon pod's: its init container runs as root (:func:`_mps_dir_security`), so only seccomp
    at the pod level; each container says who it runs as."""
    return {"seccompProfile": {"type": "RuntimeDefault"}}


def _daemon_probes() -> dict[str, Any]:
    """An MPS daemon container's probes; readiness and liveness differ on purpose.

    Restarting the container ends the MPS server and with it the CUDA context of every client
    (a pool's: every co-tenant job's servers), and the ``mps-daemon`` wrapper already restarts a
    control daemon that died or stopped answering (and exits when that keeps failing). So:

    - readiness (``/healthz``): the control daemon answered its pipe within the last few seconds,
      i.e. it accepts clients; a slow or mute daemon is out of readiness within ~10 s;
    - liveness (``/livez``): only that the wrapper still supervises (its loop ran within the last
      minutes; no pipe command), with a long failure threshold: the kubelet kills only a wrapper
      that no longer works, minutes after readiness said so, never a daemon that is just slow."""
    return {"readinessProbe": {"httpGet": {"path": "/healthz", "port": "metrics"}, "periodSeconds": 5,
                               "failureThreshold": 2},
            "livenessProbe": {"httpGet": {"path": "/livez", "port": "metrics"}, "initialDelaySeconds": 30,
                              "periodSeconds": 20, "timeoutSeconds": 5, "failureThreshold": 6}}


def _mps_daemon(job: JobRef, spec: TuningJobSpec, image: str, g: int | None = None,
                priority_class: str | None = None) -> dict[str, Any]:
    vol, mount, env = _mps_client_parts(job, g)
    args = commands.mps_daemon(spec, "/mps/pipe", "/mps/log", metrics_port=METRICS_PORT, client_group=TUNER_GID,
                               publish_gpu=True)
    # No NVIDIA_VISIBLE_DEVICES of its own: the device plugin's is the GPU it was given.
    env = [e for e in env if e["name"] != "NVIDIA_VISIBLE_DEVICES"] + copy.deepcopy(OWN_POD_ENV)
    c = _container(spec, image, "mps-daemon", args, env=env,
                   resources={"limits": {"nvidia.com/gpu": "1"}}, mounts=[mount], probe=False)
    c.update(_daemon_probes())
    meta = _meta(job, in_group(ChildNames(job.name).mps, g), "mps-daemon")
    meta["labels"] = _group_labels(meta["labels"], g)
    extra: dict[str, Any] = {"priorityClassName": priority_class} if priority_class else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": _pod_spec(spec, [c], volumes=[vol], gpu_placement=True, hostIPC=True,
                              service_account=ChildNames(job.name).mps,
                              initContainers=[_mps_dir_init(image, spec.image_pull_policy)],
                              securityContext=_daemon_pod_security(), restartPolicy="Always",
                              terminationGracePeriodSeconds=30, **extra)}


def _tracker_addr(job: JobRef) -> str:
    return f"{ChildNames(job.name).tracker}:{TRACKER_PORT}"


def _tracker(job: JobRef, spec: TuningJobSpec, image: str) -> list[dict[str, Any]]:
    name = ChildNames(job.name).tracker
    c = _container(spec, image, "tracker", commands.tracker(TRACKER_PORT, metrics_port=METRICS_PORT), env=[NO_GPU])
    c["ports"].append({"name": "tracker", "containerPort": TRACKER_PORT})
    c["readinessProbe"] = {"tcpSocket": {"port": "tracker"}, "periodSeconds": 2}  # ready = accepting servers
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(job, name, "tracker"),
           "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                    "selector": {"matchLabels": selector(job.name, "tracker")},
                    "template": {"metadata": {"labels": labels(job.name, "tracker")},
                                 "spec": _pod_spec(spec, [c])}}}
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": _meta(job, name, "tracker"),
           "spec": {"selector": selector(job.name, "tracker"),
                    "ports": [{"name": "tracker", "port": TRACKER_PORT, "targetPort": "tracker"},
                              {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"}]}}
    return [dep, svc]


def _mps_limits_env(thread_percentage: int | None, pinned: str | None) -> list[dict[str, Any]]:
    env = []
    if thread_percentage is not None:
        env.append({"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": str(thread_percentage)})
    if pinned:
        env.append({"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": f"0={pinned}"})
    return env


def _pool_client_parts(job: JobRef, spec: TuningJobSpec, sharing: Sharing | None, g: int | None,
                       gpu: str | None = None
                       ) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """What a pod of a pool-mode job needs to be an MPS client of GPU ``dev``'s pool: (volume,
    mount, env, pod fields). Pinned to the GPU's node by name: the ledger chose the node, so the
    job's own affinity is not applied (its nodeSelector was what the ledger matched)."""
    assert sharing is not None
    dev = _device(sharing, g)
    vol = {"name": "mps", "hostPath": {"path": pool_host_dir(sharing.pool_namespace, dev.index), "type": "Directory"}}
    env = [{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/mps/pipe"},
           {"name": "CUDA_MPS_LOG_DIRECTORY", "value": "/mps/log"},
           {"name": "NVIDIA_VISIBLE_DEVICES", "value": gpu or NO_GPU_DEVICES},  # the pool's, once published
           {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
           # The job on the GPU's tenant list: co-tenants of other jobs' measurements (measure/window.py).
           {"name": TENANT_ENV, "value": f"{job.namespace}/{job.name}"}]
    node_selector = {**dict(spec.raw.get("nodeSelector") or {}), "kubernetes.io/hostname": dev.node}
    return vol, {"name": "mps", "mountPath": "/mps"}, env, {"hostIPC": True, "nodeSelector": node_selector}


def _servers(job: JobRef, spec: TuningJobSpec, image: str, g: int | None = None, sharing: Sharing | None = None
             ) -> dict[str, Any]:
    mode = _mode(spec, sharing)
    args = commands.server(spec, _tracker_addr(job), tracker_key(job), SERVER_PORT, SERVER_PORT + 1,
                           metrics_port=METRICS_PORT,
                           require_mps=mode == POOL or (mode == EXCLUSIVE and spec.uses_mps))
    env: list[dict[str, Any]] = [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    resources = copy.deepcopy(spec.raw.get("servers", {}).get("resources") or {})
    pool_label: dict[str, str] = {}
    if mode == POOL:
        dev = _device(sharing, g)
        vol, mount, pool_env, extra = _pool_client_parts(job, spec, sharing, g)
        volumes, mounts = [vol], [mount]
        env += pool_env + _mps_limits_env(spec.servers.thread_percentage, spec.servers.pinned_memory_limit)
        pool_label = {POOL_LABEL: pool_pod_name(dev.node, dev.index)}  # the pool's recovery rolls them
    elif mode == DEVICE_PLUGIN:
        # One replica of the device plugin's MPS share each; the plugin's daemon and mounts. A
        # thread percentage can only lower the plugin's equal split (docs/gpu-pools.md).
        assert sharing is not None
        resources.setdefault("limits", {})[sharing.resource_name] = "1"
        env += _mps_limits_env(spec.servers.thread_percentage, spec.servers.pinned_memory_limit)
    elif spec.uses_mps:
        vol, mount, mps_env = _mps_client_parts(job, g)
        volumes, mounts = [vol], [mount]
        env += mps_env
        env.append({"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": str(spec.servers.thread_percentage)})
        if spec.servers.pinned_memory_limit:
            env.append({"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": f"0={spec.servers.pinned_memory_limit}"})
        extra = {"hostIPC": True, "affinity": _follow_daemon(job, g)}
    elif spec.target == "cuda":
        # No MPS: the stock way, each server owns a whole GPU.
        resources.setdefault("limits", {})["nvidia.com/gpu"] = "1"
    c = _container(spec, image, "server", args, env=env, resources=resources, mounts=mounts)
    c["ports"].append({"name": "rpc", "containerPort": SERVER_PORT})
    own_gpu = spec.target == "cuda" and (not spec.uses_mps or mode == DEVICE_PLUGIN)
    pod = _pod_spec(spec, [c], volumes=volumes, gpu_placement=own_gpu, **extra)
    if mode == EXCLUSIVE and spec.uses_mps and spec.raw.get("affinity"):
        pod["affinity"] = {**copy.deepcopy(spec.raw["affinity"]), **_follow_daemon(job, g)}
    meta = _meta(job, in_group(ChildNames(job.name).servers, g), "server")
    meta["labels"] = {**_group_labels(meta["labels"], g), **pool_label}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
            "spec": {"replicas": 0 if pins_gpu(spec, sharing) else spec.servers.replicas,
                     "selector": {"matchLabels": _group_labels(selector(job.name, "server"), g)},
                     "template": {"metadata": {"labels": {**_group_labels(labels(job.name, "server"), g),
                                                          **pool_label}},
                                  "spec": pod}}}


def _progress_uri(job: JobRef, spec: TuningJobSpec) -> str | None:
    """Where progress goes when the store is not the job's ConfigMaps: still the shard's ConfigMap."""
    return configmap_uri(job.namespace, job.name) if spec.output.s3 is not None else None


def plan_clients(job: JobRef, spec: TuningJobSpec, image: str = DEFAULT_IMAGE,
                 requests: Mapping[str, Mapping[str, str]] | None = None,
                 library: LibraryConfig | None = None) -> dict[str, Any]:
    """The clients' Indexed Job of a job whose GPU is a daemon's (:func:`pins_gpu`), created once
    the first GPU group's daemon has published its GPU: before that no server can run (a pool job
    may wait long for its share) and a client would only wait for one. Clients see no GPU and
    may run on any node. Other jobs' clients come with :func:`plan`."""
    return with_default_requests([_clients(job, spec, spec.raw.get("image") or image, library)], requests)[0]


def _clients(job: JobRef, spec: TuningJobSpec, image: str, library: LibraryConfig | None) -> dict[str, Any]:
    n = ChildNames(job.name)
    vol, mount = _job_spec_volume(job)
    lib = library_parts(spec, job.namespace, library)
    args = commands.client(JOB_MANIFEST, f"{POD_WORK_DIR}/shard", _tracker_addr(job), tracker_key(job),
                           spec.total_servers,
                           store=store_uri(job, spec), progress=_progress_uri(job, spec), metrics_port=METRICS_PORT,
                           build_service=_builders_addr(job, spec), arch_from_servers=spec.target == "cuda",
                           library_args=lib.args)
    mvols, mmounts, menv = _model_volume(spec)
    c = _container(spec, image, "client", args, env=_store_env(spec) + menv + _builds_without_gpu(spec) + lib.env,
                   resources=spec.raw.get("clients", {}).get("resources"),
                   mounts=[mount, {"name": "work", "mountPath": POD_WORK_DIR}, *mmounts, *lib.mounts], probe=False)
    pod = _pod_spec(spec, [c], volumes=[vol, {"name": "work", "emptyDir": {}}, *mvols, *lib.volumes],
                    service_account=n.service_account, restartPolicy="Never")
    _mount_build_key(job, spec, pod)
    # An elastic Indexed Job (completions == parallelism): the operator scales it down to the
    # shards that have a task to tune once a client reports them (reconcile.clamp_clients).
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(job, n.clients, "client"),
            "spec": {"completionMode": "Indexed", "completions": spec.shards, "parallelism": spec.shards,
                     "backoffLimitPerIndex": spec.backoff_limit_per_index,
                     # A bad spec, model or output fails its index at once: retrying cannot fix it.
                     "podFailurePolicy": _fail_fast("client", "FailIndex"),
                     "template": {"metadata": {"labels": labels(job.name, "client")}, "spec": pod}}}


# ---- the build pool (spec.builders; docs/build-pool.md) ------------------------------------------
def _builders_addr(job: JobRef, spec: TuningJobSpec) -> str | None:
    """The clients' --build-service: the headless Service's name, which resolves to every ready
    builder pod (the clients spread each batch over them)."""
    return f"{ChildNames(job.name).builders}:{BUILD_PORT}" if spec.builders is not None else None


def _mount_build_key(job: JobRef, spec: TuningJobSpec, pod: dict[str, Any]) -> None:
    """The job's build key, as a read-only file in the pod's first container (never in its spec,
    args or env: the env holds only the file's path)."""
    if spec.builders is None:
        return
    pod["volumes"].append({"name": "build-key", "secret": {"secretName": ChildNames(job.name).build_key}})
    c = pod["containers"][0]
    c["volumeMounts"].append({"name": "build-key", "mountPath": BUILD_KEY_DIR, "readOnly": True})
    c["env"].append({"name": BUILD_AUTHKEY_FILE_ENV, "value": f"{BUILD_KEY_DIR}/{BUILD_KEY_FILE}"})


def _builders(job: JobRef, spec: TuningJobSpec, image: str) -> list[dict[str, Any]]:
    """The job's build pool: its key Secret, the builders' Deployment (CPU nodes: the builders'
    own nodeSelector/tolerations, not the job's GPU placement), a headless Service and, with
    ``autoscale``, a HorizontalPodAutoscaler on their CPU utilisation."""
    b = spec.builders
    if b is None:
        return []
    n = ChildNames(job.name)
    # Random, made once: the operator creates the Secret once (409 = kept), so a later plan's
    # different key is never applied. Only the clients and builders of this job mount it.
    key = {"apiVersion": "v1", "kind": "Secret", "metadata": _meta(job, n.build_key, "build-key"), "type": "Opaque",
           "stringData": {BUILD_KEY_FILE: secrets.token_urlsafe(32)}}
    args = commands.build_service(f"0.0.0.0:{BUILD_PORT}", metrics_port=METRICS_PORT, workers=b.workers)
    c = _container(spec, image, "builder", args, env=_builds_without_gpu(spec), resources=b.resources or None)
    c["ports"].append({"name": "build", "containerPort": BUILD_PORT})
    # Ready = listening: a batch sent during the workers' warm-up just queues behind it.
    c["readinessProbe"] = {"tcpSocket": {"port": "build"}, "periodSeconds": 2}
    pod = _pod_spec(spec, [c])
    pod.pop("tolerations", None)
    if b.tolerations:
        pod["tolerations"] = copy.deepcopy(b.tolerations)
    if b.node_selector:
        pod["nodeSelector"] = dict(b.node_selector)
    _mount_build_key(job, spec, pod)
    a = b.autoscale
    dep: dict[str, Any] = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": _meta(job, n.builders, "builder"),
           "spec": {"selector": {"matchLabels": selector(job.name, "builder")},
                    "template": {"metadata": {"labels": labels(job.name, "builder")}, "spec": pod}}}
    if a is None:
        dep["spec"]["replicas"] = b.replicas
    # With autoscale the HorizontalPodAutoscaler owns the count: the Deployment states none (it
    # starts at 1 and the HPA raises it to minReplicas at once), so applying this Deployment again
    # never resets the HPA's scale.
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": _meta(job, n.builders, "builder"),
           "spec": {"clusterIP": "None", "selector": selector(job.name, "builder"),
                    "ports": [{"name": "build", "port": BUILD_PORT, "targetPort": "build"},
                              {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"}]}}
    objs = [key, dep, svc]
    if a is not None:
        objs.append({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                     "metadata": _meta(job, n.builders, "builder"),
                     "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": n.builders},
                              "minReplicas": a.min_replicas, "maxReplicas": a.max_replicas,
                              "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {
                                  "type": "Utilization", "averageUtilization": a.target_cpu_percent}}}]}})
    return objs


def _fail_fast(container: str, action: str) -> dict[str, Any]:
    """A pod that exits with a permanent user error (``sharetune.api.exitcodes.PERMANENT``) is not
    retried; the Job's retries stay for crashes and transient faults (exit 1, kills, evictions)."""
    return {"rules": [{"action": action, "onExitCodes": {"containerName": container, "operator": "In",
                                                          "values": sorted(int(c) for c in PERMANENT)}}]}


def plan_merge(job: JobRef, spec: TuningJobSpec, image: str = DEFAULT_IMAGE, shards: int | None = None,
               sharing: Sharing | None = None, requests: Mapping[str, Mapping[str, str]] | None = None,
               gpu: str | None = None, library: LibraryConfig | None = None) -> dict[str, Any]:
    """The merge Job, created once every shard is done. On a GPU job it measures the tuned model
    on the job's GPU as one more MPS client at 100% (mode pool: at the job's share, within its
    booking; mode devicePlugin: on one replica). ``shards``: the shards the clients ran when
    fewer than ``clients.shards`` had a task (the clamp); the ones dropped hold no records.
    ``gpu``: the first GPU group's daemon GPU, as the servers were pinned to it (:func:`pins_gpu`)."""
    image = spec.raw.get("image") or image
    n = ChildNames(job.name)
    vol, mount = _job_spec_volume(job)
    lib = library_parts(spec, job.namespace, library)
    args = commands.merge(JOB_MANIFEST, f"{POD_WORK_DIR}/out", store=store_uri(job, spec),
                          shards=shards or spec.shards, result_configmap=spec.output.config_map,
                          progress=_progress_uri(job, spec), metrics_port=METRICS_PORT, library_args=lib.args,
                          library_job=f"{job.namespace}-{job.name}-{job.uid}")
    mvols, mmounts, menv = _model_volume(spec)
    env = _store_env(spec) + menv + lib.env
    volumes = [vol, {"name": "work", "emptyDir": {}}, *mvols, *lib.volumes]
    mounts = [mount, {"name": "work", "mountPath": POD_WORK_DIR}, *mmounts, *lib.mounts]
    extra: dict[str, Any] = {}
    resources: dict[str, Any] | None = None
    mode = _mode(spec, sharing)
    if mode == POOL:  # under the first GPU's pool, inside the job's share
        vol_, mount_, pool_env, extra = _pool_client_parts(job, spec, sharing, None, gpu)
        volumes.append(vol_)
        mounts.append(mount_)
        env += pool_env + _mps_limits_env(spec.sharing.share, spec.sharing.pinned_memory)
    elif mode == DEVICE_PLUGIN:
        assert sharing is not None
        resources = {"limits": {sharing.resource_name: "1"}}
        if spec.raw.get("nodeSelector"):
            extra = {"nodeSelector": dict(spec.raw["nodeSelector"])}
    elif spec.uses_mps:  # under the first GPU's daemon, as local mode's merge
        g0 = gpu_groups(spec)[0]
        mvol, mmount, menv = _mps_client_parts(job, g0, gpu)
        volumes.append(mvol)
        mounts.append(mmount)
        env += menv
        extra = {"hostIPC": True, "affinity": _follow_daemon(job, g0)}
    elif spec.target == "cuda":  # no MPS: like each server, a GPU of its own from the device plugin
        resources = {"limits": {"nvidia.com/gpu": "1"}}
    c = _container(spec, image, "merge", args, env=env, mounts=mounts, probe=False, resources=resources)
    pod = _pod_spec(spec, [c], volumes=volumes, service_account=n.service_account, restartPolicy="Never", **extra)
    merge = {"apiVersion": "batch/v1", "kind": "Job", "metadata": _meta(job, n.merge, "merge"),
             "spec": {"backoffLimit": 2, "podFailurePolicy": _fail_fast("merge", "FailJob"),
                      "template": {"metadata": {"labels": labels(job.name, "merge")}, "spec": pod}}}
    return with_default_requests(_without_gpus([merge]) if spec.target != "cuda" else [merge], requests)[0]


# ---- S3 clean-up (spec.output.s3.cleanupOnDelete) -------------------------------------------------
S3_CLEANUP_DEADLINE_S = 600  # the Job's activeDeadlineSeconds: scheduling, pulling and deleting
S3_CLEANUP_BACKOFF_LIMIT = 2  # pod retries; the S3 client retries each call itself
S3_CLEANUP_TTL_S = 3600  # a Job left without an owner (a foreground deletion) goes after this
JOB_UID_ANNOTATION = "sharetune.io/job-uid"  # the TuningJob a clean-up Job belongs to


def plan_s3_cleanup(job: JobRef, spec: TuningJobSpec, image: str = DEFAULT_IMAGE,
                    requests: Mapping[str, Mapping[str, str]] | None = None, owned: bool = True) -> dict[str, Any]:
    """The Job that deletes the job's objects from its bucket when the TuningJob is deleted
    (``spec.output.s3.cleanupOnDelete``): ``sharetune-tuner s3-cleanup`` over every key under
    ``[<prefix>/]<namespace>/<job>/``, in the job's namespace, with the job's own credentials as
    env from ``secretKeyRef`` (the kubelet reads the Secret; the operator never does) and from the
    job's network position.

    ``image`` is the chart's tuner image, never the job's ``spec.image``: the command must be the
    operator's own version, and the pod holds the bucket's credentials. No GPU, no API token
    (it talks only to S3), non-root and read-only like every job pod; the job's labels, so the
    job's NetworkPolicy and selectors treat it as one of its pods. Bounded: a few retries, an
    active deadline, and a TTL. ``owned``: owner-referenced to the TuningJob (which the clean-up
    finalizer keeps until the Job has finished, so garbage collection removes it only after);
    False for a foreground deletion, which would delete the Job before it ran: the TTL removes it."""
    s3 = spec.output.s3
    if s3 is None:
        raise ValueError("a job without spec.output.s3 has nothing in a bucket to clean up")
    n = ChildNames(job.name)
    args = commands.s3_cleanup(s3.bucket, _s3_job_prefix(s3.prefix, job.namespace, job.name))
    c = _container(spec, image, "s3-cleanup", args, env=[*_store_env(spec), dict(NO_GPU)],
                   probe=False)
    c["env"] = [e for e in c["env"] if e["name"] not in NO_MULTICAST]  # no CUDA in this pod
    del c["ports"]  # it runs for seconds: nothing to scrape
    c["terminationMessagePolicy"] = "FallbackToLogsOnError"  # its error line, for the operator's Event
    pod = _pod_spec(spec, [c], restartPolicy="Never")
    meta = _meta(job, n.s3_cleanup, "s3-cleanup")
    meta["annotations"] = {JOB_UID_ANNOTATION: job.uid}
    if not owned:
        del meta["ownerReferences"]
    cleanup = {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta,
               "spec": {"backoffLimit": S3_CLEANUP_BACKOFF_LIMIT, "activeDeadlineSeconds": S3_CLEANUP_DEADLINE_S,
                        "ttlSecondsAfterFinished": S3_CLEANUP_TTL_S,
                        "podFailurePolicy": _fail_fast("s3-cleanup", "FailJob"),
                        "template": {"metadata": {"labels": labels(job.name, "s3-cleanup")}, "spec": pod}}}
    return with_default_requests([cleanup], requests)[0]


# ---- GPU pools (mode pool; docs/gpu-pools.md) -----------------------------------------------------
def pool_labels(node: str, index: int) -> dict[str, str]:
    return {"app.kubernetes.io/name": "sharetune", "app.kubernetes.io/component": "gpu-pool",
            "app.kubernetes.io/managed-by": "sharetune", POOL_LABEL: pool_pod_name(node, index),
            GPU_INDEX_LABEL: str(index)}


def plan_pool(node: str, index: int, namespace: str, image: str = DEFAULT_IMAGE,
              tolerations: tuple[dict[str, Any], ...] | list[dict[str, Any]] = (),
              requests: Mapping[str, Mapping[str, str]] | None = None,
              daemon_priority_class: str | None = None) -> dict[str, Any]:
    """The MPS control daemon of GPU ``index`` on ``node``, shared by every pool-mode job placed
    there: the operator's, in its own namespace (no owner: it outlives the jobs, and is deleted
    when idle). Pinned to the node by name and holding one ``nvidia.com/gpu`` (which one is the
    device plugin's choice: the pool is the one MPS server on that device); root and hostIPC for
    the same reasons as a job's daemon; its pipe directory is the GPU's, not a job's. At the
    chart's daemon priority, and guarded by :func:`plan_pool_budget`."""
    name = pool_pod_name(node, index)
    c: dict[str, Any] = {
        "name": "mps-daemon", "image": image, "imagePullPolicy": "IfNotPresent",
        "args": commands.pool_daemon("/mps/pipe", "/mps/log", metrics_port=METRICS_PORT, client_group=TUNER_GID,
                                     publish_gpu=True),
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}, *NO_MULTICAST_ENV,
                {"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/mps/pipe"},
                {"name": "CUDA_MPS_LOG_DIRECTORY", "value": "/mps/log"},
                {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
                *copy.deepcopy(OWN_POD_ENV)],
        "ports": [{"name": "metrics", "containerPort": METRICS_PORT}],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
        "securityContext": _restricted(),
        "volumeMounts": [{"name": "scratch", "mountPath": "/tmp"}, {"name": "mps", "mountPath": "/mps"}],
        **_daemon_probes(),
    }
    pod: dict[str, Any] = {
        "initContainers": [_mps_dir_init(image, "IfNotPresent")],
        "containers": [c],
        "volumes": [{"name": "scratch", "emptyDir": {}},
                    {"name": "mps",
                     "hostPath": {"path": pool_host_dir(namespace, index), "type": "DirectoryOrCreate"}}],
        "nodeSelector": {"kubernetes.io/hostname": node}, "hostIPC": True, "restartPolicy": "Always",
        "securityContext": _daemon_pod_security(),
        # its own identity (plan_pool_identity): it publishes its GPU on its own pod
        "serviceAccountName": name, "automountServiceAccountToken": True,
        "enableServiceLinks": False, "terminationGracePeriodSeconds": 30,
    }
    if tolerations:
        pod["tolerations"] = copy.deepcopy(list(tolerations))
    if daemon_priority_class:
        pod["priorityClassName"] = daemon_priority_class
    daemon = {"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": name, "namespace": namespace, "labels": pool_labels(node, index),
                           "annotations": {POOL_NODE_ANNOTATION: node}},
              "spec": pod}
    return with_default_requests([daemon], requests)[0]


def plan_pool_identity(node: str, index: int, namespace: str) -> list[dict[str, Any]]:
    """GPU ``index``'s pool daemon's ServiceAccount, Role and RoleBinding (named as its pod): get
    and patch that one pod, to publish the GPU it holds. Created before the pool; kept when the
    pool is released (a Role naming only that GPU's pool pod, used again when it comes back)."""
    name = pool_pod_name(node, index)
    return _daemon_identity(namespace, name, [name], {"labels": pool_labels(node, index)})


def plan_pool_budget(node: str, index: int, namespace: str) -> dict[str, Any]:
    """The PodDisruptionBudget of GPU ``index``'s pool daemon on ``node`` (same name, namespace and
    labels). Evicting the daemon (``kubectl drain``, a cluster autoscaler's scale-down) would end
    every co-tenant job's servers at once, so the eviction API refuses it: a drain waits until a
    person deletes the budget or the daemon pod. ``minAvailable: 1`` because the daemon is a bare
    pod (``maxUnavailable`` and percentages need a controller with a scale). A delete is not an
    eviction: the operator still replaces a failed pool and releases an idle one. The budget lives
    as long as the GPU's pool is wanted; one left behind selects no pod until that GPU's pool
    returns, and then guards it again."""
    name = pool_pod_name(node, index)
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace, "labels": pool_labels(node, index)},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {
                "app.kubernetes.io/component": "gpu-pool", POOL_LABEL: name}}}}
