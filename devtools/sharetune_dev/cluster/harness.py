"""A real local Kubernetes control plane: etcd, kube-apiserver, controller-manager, scheduler, kwok.

Everything listens on loopback on free ports inside one work directory. Each component runs in a
process group of its own so teardown (by PID, never by name) also takes its children. The API
server runs with real TLS, service-account signing keys and RBAC; kwok simulates nodes, among them
GPU nodes that advertise ``nvidia.com/gpu``.

Used by the pytest fixture (``tests/conftest.py``), the benchmarks and ``sharetune cluster up/down``
(the developer tooling, ``sharetune_dev``; not part of the product).
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sharetune.procs import ProcessGroup, free_port, stop_all, stop_group

from . import binaries
from .pki import ClusterPKI, generate

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
GPU_RESOURCE = "nvidia.com/gpu"
STATE_FILE = "cluster.json"


class ClusterError(RuntimeError):
    """The control plane did not come up; the message carries each component's log tail."""


@dataclass
class FakeNode:
    name: str
    cpu: str = "16"
    memory: str = "64Gi"
    gpus: int = 1
    pods: int = 110
    labels: dict[str, str] = field(default_factory=dict)

    def manifest(self) -> dict[str, Any]:
        capacity = {"cpu": self.cpu, "memory": self.memory, "pods": str(self.pods)}
        labels = {
            "kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64", "type": "kwok", **self.labels,
        }
        if self.gpus:
            capacity[GPU_RESOURCE] = str(self.gpus)
            labels["nvidia.com/gpu.present"] = "true"
        return {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": self.name, "labels": labels,
                         "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"}},
            "status": {"capacity": capacity, "allocatable": capacity},
        }


def failure_report(processes: list[ProcessGroup], lines: int = 25) -> str:
    """Each component's state and log tail: what a failed start or test shows."""
    return "\n".join(f"----- {p.name} [{p.state()}] {p.log} -----\n{p.tail(lines)}" for p in processes)


def _kubeconfig(path: Path, server: str, ca: Path, cert: Path, key: Path, user: str) -> None:
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "sharetune-local",
        "clusters": [{"name": "sharetune-local",
                      "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "sharetune-local",
                      "context": {"cluster": "sharetune-local", "user": user}}],
    }
    path.write_text(json.dumps(doc, indent=2))  # JSON is valid YAML; kubectl reads it


class LocalCluster:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok on loopback."""

    def __init__(self, workdir: Path | None = None, nodes: list[FakeNode] | None = None,
                 keep_workdir: bool = False, advertise_address: str | None = None) -> None:
        self._own_workdir = workdir is None
        # Real node only (node.py): pods reach the API server through the `kubernetes`
        # Service, so it listens on every address and advertises this (non-loopback) one.
        self.advertise_address = advertise_address
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="sharetune-cluster-"))
        self.keep_workdir = keep_workdir
        self.nodes = nodes if nodes is not None else [FakeNode("kwok-gpu-0", gpus=1)]
        self.processes: list[ProcessGroup] = []  # each in a process group of its own
        self.ports: dict[str, int] = {}
        self.pki: ClusterPKI | None = None
        self.startup_s: float | None = None

    # ---- paths -------------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['apiserver']}"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    def env(self) -> dict[str, str]:
        """Environment for child commands (kubectl, helm, the operator) to reach this cluster."""
        bin_dirs = [str(binaries.path_of(n).parent) for n in binaries.CONTROL_PLANE_BINARIES]
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig),
                "PATH": os.pathsep.join([*bin_dirs, os.environ.get("PATH", "")])}

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self, timeout_s: float = 90.0) -> "LocalCluster":
        missing = binaries.missing()
        if missing:
            binaries.ensure()
        t0 = time.monotonic()
        self.logs.mkdir(parents=True, exist_ok=True)
        for n in ("etcd_client", "etcd_peer", "apiserver", "controller_manager", "scheduler", "kwok"):
            self.ports[n] = free_port()
        self.pki = generate(self.workdir / "pki", SERVICE_IP)
        self._write_kubeconfigs()
        try:
            self._start_etcd(t0 + timeout_s)
            self._start_apiserver(t0 + timeout_s)
            self._start_controllers(t0 + timeout_s)
            self._start_kwok_and_nodes(t0 + timeout_s)
        except BaseException as e:
            report = self.failure_report()
            self.stop()
            if isinstance(e, ClusterError):
                raise ClusterError(f"{e}\n{report}") from None
            raise
        self.startup_s = time.monotonic() - t0
        self._save_state()
        return self

    def stop(self) -> None:
        stop_all(self.processes)
        self.processes.clear()
        if self._own_workdir and not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def restart(self, name: str, down_s: float = 0.0, timeout_s: float = 60.0) -> float:
        """Kills one component (e.g. "kube-apiserver", "etcd") by its process group, keeps it down
        for ``down_s``, starts it again with the same flags, ports and data, and waits until the
        API server answers /readyz again. Returns the seconds from the kill to ready (fault tests)."""
        proc = next(p for p in self.processes if p.name == name)
        t0 = time.monotonic()
        proc.kill()
        time.sleep(down_s)
        proc.start()

        def ready() -> bool:
            return self._raw_get("/readyz")[0] == 200
        self._wait(f"{name} back and /readyz", ready, time.monotonic() + timeout_s, [proc])
        return time.monotonic() - t0

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def failure_report(self) -> str:
        return failure_report(self.processes)

    # ---- API access without a client library (the harness must not need one) ------------------
    def _ssl(self) -> ssl.SSLContext:
        assert self.pki is not None
        ctx = ssl.create_default_context(cafile=str(self.pki.ca.cert))
        admin = self.pki.clients["admin"]
        ctx.load_cert_chain(str(admin.cert), str(admin.key))
        return ctx

    def api(self, method: str, path: str, body: dict[str, Any] | None = None,
            timeout_s: float = 10.0) -> tuple[int, dict[str, Any]]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, context=self._ssl(), timeout=timeout_s) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw)
            except ValueError:
                return e.code, {"message": raw.decode(errors="replace")}

    # ---- components --------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> ProcessGroup:
        p = ProcessGroup(name, argv, self.logs / f"{name}.log").start()
        self.processes.append(p)
        return p

    def _wait(self, what: str, check: Callable[[], bool], deadline: float,
              procs: list[ProcessGroup]) -> None:
        while time.monotonic() < deadline:
            for p in procs:
                if not p.alive():
                    raise ClusterError(f"{p.name} exited while waiting for {what}")
            try:
                if check():
                    return
            except (OSError, ValueError, urllib.error.URLError, ssl.SSLError):
                pass
            time.sleep(0.2)
        raise ClusterError(f"timed out waiting for {what}")

    def _start_etcd(self, deadline: float) -> None:
        c, pe = self.ports["etcd_client"], self.ports["etcd_peer"]
        p = self._spawn("etcd", [
            str(binaries.path_of("etcd")), "--name", "default",
            "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{c}", "--advertise-client-urls", f"http://127.0.0.1:{c}",
            "--listen-peer-urls", f"http://127.0.0.1:{pe}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{pe}",
            "--initial-cluster", f"default=http://127.0.0.1:{pe}",
            "--unsafe-no-fsync",  # throw-away test data: fsync costs seconds on these VMs
            "--log-level", "warn",
        ])

        def healthy() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{c}/health", timeout=2) as r:
                return json.loads(r.read()).get("health") == "true"
        self._wait("etcd /health", healthy, deadline, [p])

    def _start_apiserver(self, deadline: float) -> None:
        assert self.pki is not None
        k = self.pki
        p = self._spawn("kube-apiserver", [
            str(binaries.path_of("kube-apiserver")),
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd_client']}",
            f"--bind-address={'0.0.0.0' if self.advertise_address else '127.0.0.1'}",
            f"--advertise-address={self.advertise_address or '127.0.0.1'}",
            *(["--kubelet-preferred-address-types=InternalIP"] if self.advertise_address else []),
            f"--secure-port={self.ports['apiserver']}",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={k.apiserver.cert}", f"--tls-private-key-file={k.apiserver.key}",
            f"--client-ca-file={k.ca.cert}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={k.sa_public}",
            f"--service-account-signing-key-file={k.sa_private}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",  # the MPS daemon pod is the one privileged-ish workload
            f"--kubelet-client-certificate={k.clients['apiserver-kubelet-client'].cert}",
            f"--kubelet-client-key={k.clients['apiserver-kubelet-client'].key}",
            "--v=1",
        ])

        def ready() -> bool:
            status, _ = self._raw_get("/readyz")
            return status == 200
        self._wait("kube-apiserver /readyz", ready, deadline, [p])

    def _raw_get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.server + path, context=self._ssl(), timeout=3) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def _control_loop_flags(self, stem: str, port: str) -> list[str]:
        """Identity, loopback serving and no leader election: shared by controller-manager and
        scheduler (their kubeconfig also authenticates/authorizes /healthz callers)."""
        kubeconfig = self.workdir / f"{stem}.kubeconfig"
        return [f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
                f"--secure-port={self.ports[port]}", f"--cert-dir={self.workdir / (stem + '-certs')}",
                "--leader-elect=false"]

    def _start_controllers(self, deadline: float) -> None:
        assert self.pki is not None
        k = self.pki
        cm = self._spawn("kube-controller-manager", [
            str(binaries.path_of("kube-controller-manager")),
            *self._control_loop_flags("controller-manager", "controller_manager"),
            "--controllers=*",  # garbage collector, job, deployment, replicaset, serviceaccount ...
            "--use-service-account-credentials=true",  # each loop with its bootstrap RBAC role
            f"--service-account-private-key-file={k.sa_private}",
            f"--root-ca-file={k.ca.cert}",
            f"--cluster-signing-cert-file={k.ca.cert}", f"--cluster-signing-key-file={k.ca.key}",
            "--v=1",
        ])
        sch = self._spawn("kube-scheduler", [
            str(binaries.path_of("kube-scheduler")),
            *self._control_loop_flags("scheduler", "scheduler"), "--v=1",
        ])
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # their self-signed serving certs; /healthz only

        def healthz(port: int) -> Callable[[], bool]:
            def check() -> bool:
                with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=insecure,
                                            timeout=2) as r:
                    return r.status == 200
            return check
        self._wait("kube-controller-manager /healthz", healthz(self.ports["controller_manager"]),
                   deadline, [cm])
        self._wait("kube-scheduler /healthz", healthz(self.ports["scheduler"]), deadline, [sch])

        def default_sa() -> bool:
            status, _ = self.api("GET", "/api/v1/namespaces/default/serviceaccounts/default")
            return status == 200
        # Pods cannot be created until the serviceaccount controller made `default`.
        self._wait("the default ServiceAccount", default_sa, deadline, [cm])

    def _start_kwok_and_nodes(self, deadline: float) -> None:
        p = self._spawn("kwok", [
            str(binaries.path_of("kwok")),
            f"--kubeconfig={self.workdir / 'kwok.kubeconfig'}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
            f"--config={Path(__file__).with_name('kwok-stages.yaml')}",
            "--cidr=10.244.0.0/16", "--node-ip=10.244.0.1",
            f"--server-address=127.0.0.1:{self.ports['kwok']}",
        ])
        for n in self.nodes:
            self.add_node(n)

        def nodes_ready() -> bool:
            for n in self.nodes:
                status, node = self.api("GET", f"/api/v1/nodes/{n.name}")
                conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
                if status != 200 or conds.get("Ready") != "True":
                    return False
            return True
        self._wait("kwok nodes Ready", nodes_ready, deadline, [p])

    def add_node(self, node: FakeNode) -> None:
        status, body = self.api("POST", "/api/v1/nodes", node.manifest())
        if status not in (200, 201, 409):
            raise ClusterError(f"creating node {node.name}: {status} {body.get('message')}")

    def _write_kubeconfigs(self) -> None:
        assert self.pki is not None
        server = f"https://127.0.0.1:{self.ports['apiserver']}"
        for stem in ("admin", "controller-manager", "scheduler", "kwok"):
            pair = self.pki.clients[stem]
            _kubeconfig(self.workdir / f"{stem}.kubeconfig", server, self.pki.ca.cert,
                        pair.cert, pair.key, stem)

    # ---- state for the CLI (`cluster up` in one process, `cluster down` in another) -------------
    def _save_state(self) -> None:
        state = {
            "kubeconfig": str(self.kubeconfig), "server": self.server,
            "startup_s": self.startup_s,
            "processes": [{"name": p.name, "pid": p.pid, "argv0": p.argv[0]} for p in self.processes],
        }
        (self.workdir / STATE_FILE).write_text(json.dumps(state, indent=2))


def down(workdir: Path) -> list[str]:
    """Stops the components recorded in ``workdir``'s state file (by PID); returns their names."""
    state_path = workdir / STATE_FILE
    state = json.loads(state_path.read_text())
    stopped = []
    for p in reversed(state["processes"]):
        pid = int(p["pid"])
        # Guard against PID reuse: only signal a process still running the binary we started.
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            continue
        if Path(exe).name != Path(p["argv0"]).name:
            continue
        stop_group(pid)
        stopped.append(p["name"])
    state_path.unlink()
    return stopped
