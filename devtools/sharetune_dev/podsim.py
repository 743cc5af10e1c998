"""A process kubelet for sharetune pods on the kwok nodes of the local control plane.

kwok nodes run no containers, so for fault tests this stands in for their kubelet: every
sharetune pod the scheduler bound and kwok marked Running is started as a local process running
that pod's own container args (the real tuner commands), with what a kubelet and the cluster
network would provide swapped in:

- Services: the tracker Service is a fixed loopback port per job, so a restarted tracker keeps
  its address (what a ClusterIP gives);
- volumes: the job-spec ConfigMap becomes a file, ``emptyDir`` a fresh directory per pod (a
  retried pod starts empty, as in a cluster);
- identity: a token of the pod's own ServiceAccount (TokenRequest API), so the tuner processes
  talk to the API server with exactly the pod's RBAC;
- env: values, Secret references (read like the kubelet does) and the downward API.

Exits are reported to the API server like a kubelet does: Job pods (restartPolicy Never) end
Succeeded/Failed with the exit code, so the Job controller retries them; Deployment and daemon
pods (Always) are restarted in place with ``restartCount`` bumped. Deleted pods' processes are
stopped. Fault tests kill processes with :meth:`kill`.

Only for CPU jobs (or a GPU job explicitly turned into a CPU one with ``cpu_for_gpu``, which is
then a mock of the GPU and says so in its test; its MPS daemon pod runs ``fake_mps_control.py`` and
reads its GPU from ``fake_nvml``).
Used by the fault tests (``tests/faults``) and the bad-input tests.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from sharetune.procs import ProcessGroup, free_port

FAKE_MPS_CONTROL = Path(__file__).resolve().with_name("fake_mps_control.py")  # a MOCK of NVIDIA's binary
FAKE_NVML = Path(__file__).resolve().with_name("fake_nvml")  # a MOCK of NVIDIA's NVML bindings (pynvml)
MANAGED = "app.kubernetes.io/managed-by=sharetune"
# The tuner image carries TVM's tensor-intrinsics cache built in (tuner-image/Dockerfile); a pod's
# HOME here is its own fresh folder, so without this every client would parse the intrinsics
# again (~55 s of two busy cores per job). The developer's own cache stands in for the image's.
INTRINSICS_CACHE = os.environ.get("SHARETUNE_INTRINSICS_CACHE") or str(Path.home() / ".cache" / "sharetune")


@dataclass
class PodProc(ProcessGroup):
    """A pod's container as a process group (``name``: the pod's name, ``cwd``: its work dir)."""

    uid: str = ""
    component: str = ""
    restart_always: bool = False
    started_at: float = 0.0

    @property
    def pod(self) -> str:
        return self.name

    @property
    def work(self) -> Path:
        assert self.cwd is not None
        return self.cwd

    def start(self) -> "PodProc":
        super().start()
        self.started_at = time.monotonic()
        return self


@dataclass
class ProcessKubelet:
    k8s: Any
    namespace: str
    server: str  # API server URL
    ca_file: Path
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sharetune-podsim-")))
    cpu_for_gpu: bool = False  # run a cuda job's pods on the CPU (a GPU mock; the test must say so)
    extra_env: dict[str, str] = field(default_factory=dict)
    # Which pods it runs: every sharetune pod, or fewer (e.g. "...,app.kubernetes.io/component=s3-cleanup");
    # the others stay as kwok left them, Running without a process.
    label_selector: str = MANAGED

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.k8s)
        self.procs: dict[str, PodProc] = {}  # by pod uid
        self.done: set[str] = set()
        self.tracker_ports: dict[str, int] = {}  # tracker Service name -> loopback port
        self.history: list[PodProc] = []  # every pod process ever started (work dirs for the tests)
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="podsim", daemon=True)
        self.paused = False  # a node that stopped reporting (API server down): keep processes running

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> "ProcessKubelet":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        with self._lock:
            for p in self.procs.values():
                p.stop(grace_s=5)
            self.procs.clear()

    def _loop(self) -> None:
        while not self._stop.wait(0.3):
            try:
                self.tick()
            except Exception as e:  # the API server may be down (fault tests): retry next tick
                msg = f"{type(e).__name__}: {str(e)[:200]}"
                if not self.errors or self.errors[-1] != msg:
                    self.errors.append(msg)

    # ---- fault injection ------------------------------------------------------------------------
    def running(self, component: str) -> list[PodProc]:
        with self._lock:
            return [p for p in self.procs.values() if p.component == component and p.alive()]

    def kill(self, component: str, index: int = 0, sig: int = signal.SIGKILL) -> PodProc:
        """Kills the process group of the ``index``-th running pod of ``component`` (a crash)."""
        procs = sorted(self.running(component), key=lambda p: p.pod)
        if len(procs) <= index:
            raise LookupError(f"no running {component} pod #{index}: {[p.pod for p in procs]}")
        p = procs[index]
        with self._lock:  # not between a tick's poll and its restart of the same pod
            p.kill(sig)  # the tick reads its exit status and reports or restarts it
        return p

    # ---- the kubelet ----------------------------------------------------------------------------
    def tick(self) -> None:
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=self.label_selector).items
        by_uid = {p.metadata.uid: p for p in pods}
        with self._lock:
            for uid, proc in list(self.procs.items()):
                pod = by_uid.get(uid)
                if pod is None or pod.metadata.deletion_timestamp is not None:
                    proc.stop(grace_s=5)
                    del self.procs[uid]
                    self.done.add(uid)
                    continue
                rc = proc.poll()
                if rc is None:
                    continue
                if proc.restart_always:
                    proc.restarts += 1
                    proc.start()
                    self._report_running(pod, proc)
                else:
                    self._report_exit(pod, rc)
                    del self.procs[uid]
                    self.done.add(uid)
            for pod in pods:
                pod_uid = str(pod.metadata.uid)
                if (pod_uid in self.procs or pod_uid in self.done or pod.metadata.deletion_timestamp is not None
                        or pod.status.phase != "Running"):
                    continue
                proc = self._launch(pod)
                self.procs[pod_uid] = proc
                self.history.append(proc)

    def _report_exit(self, pod: Any, rc: int) -> None:
        c = pod.spec.containers[0]
        self.core.patch_namespaced_pod_status(pod.metadata.name, self.namespace, {"status": {
            "phase": "Succeeded" if rc == 0 else "Failed",
            "containerStatuses": [{"name": c.name, "image": c.image, "imageID": "", "ready": False, "restartCount": 0,
                                   "state": {"terminated": {"exitCode": rc if rc >= 0 else 128 - rc,
                                                            "reason": "Completed" if rc == 0 else "Error"}}}]}})

    def _report_running(self, pod: Any, proc: PodProc) -> None:
        c = pod.spec.containers[0]
        self.core.patch_namespaced_pod_status(pod.metadata.name, self.namespace, {"status": {
            "containerStatuses": [{"name": c.name, "image": c.image, "imageID": "", "ready": True,
                                   "restartCount": proc.restarts, "started": True,
                                   "state": {"running": {"startedAt": _now()}}}]}})

    # ---- pod -> process ---------------------------------------------------------------------------
    def _tracker_port(self, service: str) -> int:
        if service not in self.tracker_ports:
            self.tracker_ports[service] = free_port()
        return self.tracker_ports[service]

    def _launch(self, pod: Any) -> PodProc:
        name = pod.metadata.name
        component = pod.metadata.labels.get("app.kubernetes.io/component", "")
        c = pod.spec.containers[0]
        args = list(c.args or [])
        work = self.workdir / name
        (work / "emptydir").mkdir(parents=True, exist_ok=True)
        pod_env = self._env(pod, c)
        # Volumes: mounts of the job's spec ConfigMap become files, emptyDirs a fresh directory.
        mounts = {m.name: m.mount_path for m in c.volume_mounts or []}
        override: dict[str, str] = {}
        for v in pod.spec.volumes or []:
            path = mounts.get(v.name)
            if path is None:
                continue
            if v.config_map is not None:
                cm = self.core.read_namespaced_config_map(v.config_map.name, self.namespace)
                d = work / "cm" / v.name
                d.mkdir(parents=True, exist_ok=True)
                import base64

                files: dict[str, bytes] = {k: v.encode() for k, v in (cm.data or {}).items()}
                files.update({k: base64.b64decode(v) for k, v in (cm.binary_data or {}).items()})
                paths = {i.key: i.path for i in v.config_map.items or []} or {k: k for k in files}
                for k, path_in_vol in paths.items():
                    val = files[k]
                    if self.cpu_for_gpu and k.endswith(".yaml"):
                        val = _cpu_job(val.decode()).encode()
                    (d / path_in_vol).write_bytes(val)
                override[path] = str(d)
            elif v.empty_dir is not None:
                override[path] = str(work / "emptydir" / v.name)
            elif v.host_path is not None:  # the MPS pipe directory shared by a job's pods
                override[path] = str(self.workdir / "host" / v.host_path.path.strip("/").replace("/", "_"))
        args = [_rewrite_path(a, override) for a in args]
        env = {"PATH": os.environ["PATH"], "HOME": str(work), "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.environ.get("PYTHONPATH", ""), "HOSTNAME": name,
               "SHARETUNE_INTRINSICS_CACHE": INTRINSICS_CACHE, **self.extra_env,
               **{k: _rewrite_path(v, override) for k, v in pod_env.items()},
               "KUBECONFIG": str(self._kubeconfig(pod, work))}
        # A GPU pool's daemon belongs to no job (mode pool: the operator's, shared by the jobs on its GPU).
        tracker_svc = f"{pod.metadata.labels.get('sharetune.io/job', '')}-tracker"
        if "--tracker" in args:
            args[args.index("--tracker") + 1] = f"127.0.0.1:{self._tracker_port(tracker_svc)}"
        extra = ["--metrics-port", "-1"]
        if component == "tracker":
            extra += ["--host", "127.0.0.1", "--port", str(self._tracker_port(tracker_svc))]
        elif component == "server":
            port = free_port()
            extra += ["--host", "127.0.0.1", "--port", str(port), "--port-end", str(port + 20),
                      "--advertise-addr", "127.0.0.1"]
        elif component in ("mps-daemon", "gpu-pool"):
            wrapper = work / "nvidia-cuda-mps-control"
            wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_MPS_CONTROL} \"$@\"\n")
            wrapper.chmod(0o755)
            extra += ["--control-binary", str(wrapper), "--no-gpu-check"]
            # NVML mocked too: "the" GPU's UUID, one per node, published by the daemon as on a GPU node
            env["PYTHONPATH"] = os.pathsep.join(x for x in (str(FAKE_NVML), env["PYTHONPATH"]) if x)
            env["FAKE_NVML_UUID"] = f"GPU-fake-{pod.spec.node_name}"
        argv = [sys.executable, "-m", "sharetune_tuner.cli", *args, *extra]
        (work / "launch.json").write_text(json.dumps({"argv": argv, "env": env}, indent=1))
        return PodProc(name, argv, work / "pod.log", env=env, cwd=work, uid=pod.metadata.uid, component=component,
                       restart_always=pod.spec.restart_policy == "Always").start()

    def _env(self, pod: Any, c: Any) -> dict[str, str]:
        out: dict[str, str] = {}
        for e in c.env or []:
            if e.value is not None:
                out[e.name] = e.value
            elif e.value_from is not None and e.value_from.secret_key_ref is not None:
                ref = e.value_from.secret_key_ref
                sec = self.core.read_namespaced_secret(ref.name, self.namespace)
                import base64

                out[e.name] = base64.b64decode((sec.data or {})[ref.key]).decode()
            elif e.value_from is not None and e.value_from.field_ref is not None:
                out[e.name] = _field(pod, e.value_from.field_ref.field_path)
        return out

    def _kubeconfig(self, pod: Any, work: Path) -> Path:
        """A kubeconfig with a token of the pod's ServiceAccount: the pod's identity, no more."""
        path = work / "kubeconfig"
        sa = pod.spec.service_account_name or "default"
        tok = self.core.create_namespaced_service_account_token(sa, self.namespace, client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))).status.token
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "pod",
            "clusters": [{"name": "c", "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": "pod", "user": {"token": tok}}],
            "contexts": [{"name": "pod", "context": {"cluster": "c", "user": "pod", "namespace": self.namespace}}]}))
        return path


def _now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _field(pod: Any, path: str) -> str:
    if path == "status.podIP":
        return "127.0.0.1"
    if path == "metadata.namespace":
        return str(pod.metadata.namespace)
    if path == "metadata.name":
        return str(pod.metadata.name)
    for prefix, d in (("metadata.annotations", pod.metadata.annotations), ("metadata.labels", pod.metadata.labels)):
        if path.startswith(prefix + "['"):
            return str((d or {}).get(path[len(prefix) + 2:-2], ""))
    raise ValueError(f"downward API field {path} is not simulated")


def _rewrite_path(value: str, override: dict[str, str]) -> str:
    for mount, local in sorted(override.items(), key=lambda kv: -len(kv[0])):
        if value == mount or value.startswith(mount + "/"):
            return local + value[len(mount):]
    return value


def _cpu_job(text: str) -> str:
    """A cuda job's spec turned into a CPU one (GPU mock for the MPS fault on CPU-only machines)."""
    doc = yaml.safe_load(text)
    spec = doc.get("spec", doc)
    if spec.get("target") == "cuda":
        spec["target"] = "llvm"
    return yaml.safe_dump(doc)
