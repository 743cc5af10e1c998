"""A real node for the local control plane: containerd + runc + CNI bridge, kubelet, kube-proxy, CoreDNS,
and kube-router's firewall as the NetworkPolicy enforcer.

kwok proves the operator talks to Kubernetes correctly; this runs real pods. Everything lives in
one temp directory (containerd root/state/socket, kubelet root dir, pod logs, CNI config and IPAM
state, certificates, logs) and every process runs in a process group of its own, stopped by PID.
What this machine kind needs (``shared/notes/containers-and-kubelet.md``):

* cgroup v1 only: kubelet 1.35 with ``failCgroupV1: false`` and the cgroupfs driver, its pods
  under a cgroup root of their own (``/sharetune-<node>`` in every v1 hierarchy, removed on stop);
* root without CAP_SYS_RESOURCE: containerd's ``restrict_oom_score_adj``, kubelet's own
  ``oomScoreAdj`` left where it is;
* no registry: images are imported with ``ctr images import`` (the pod sandbox image too, a
  hand-made OCI archive around a static Go ``pause``), pods use ``IfNotPresent``/``Never`` and
  image GC is off (a removed image could not be pulled back);
* no IPVS: kube-proxy in iptables mode; its chains are removed with ``kube-proxy --cleanup``;
* the CNI bridge plugin does not enforce NetworkPolicy: kube-router runs with only its firewall
  controller (``--run-firewall``; no routing, no service proxy), which enforces the policies with
  iptables (iptables-nft) and ipset (nftables' own ``queue``, which other enforcers need, is not in
  this kernel). kube-router is a TEST FIXTURE: the version built (``binaries.KUBE_ROUTER_VERSION``)
  has published security flaws, and it is never part of the chart, the images or any install.

Host-wide state it touches, and gives back on stop: a bridge ``stbr<N>`` with 10.200.<N>.1/24,
iptables chains (kube-proxy's ``KUBE-*``, kube-router's ``KUBE-ROUTER-*``/``KUBE-POD-FW-*``/
``KUBE-NWPLCY-*`` and the bridge plugin's ``CNI-*``), kube-router's ipsets, the sysctls kubelet
sets (``vm.overcommit_memory``, ``kernel.panic``, ``kernel.panic_on_oops``: restored), cgroups,
network namespaces and mounts of its pods. One real node per host at a time (a lock file), since
kube-proxy's and kube-router's iptables chains and ipsets are host-global.

CoreDNS runs as a host process bound to the bridge's gateway address; kubelet points pods at it
(``clusterDNS``), so Service names resolve (``<svc>.<ns>.svc.cluster.local``) and Service
ClusterIPs route through kube-proxy's rules. The API server must then listen beyond loopback and
advertise the host's address (``LocalCluster(advertise_address=...)``), because pods reach it
through the ``kubernetes`` Service.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shlex
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from sharetune.procs import ProcessGroup, free_port

from . import binaries
from .harness import SERVICE_CIDR, ClusterError, LocalCluster, _kubeconfig, failure_report
from .pki import _issue, _name, _write_cert, _write_key

PAUSE_IMAGE = f"localhost/sharetune-pause:{binaries.PAUSE_VERSION}"
CLUSTER_DOMAIN = "cluster.local"
LOCK_FILE = Path("/run/sharetune-realnode.lock")
KUBELET_SYSCTLS = ("vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops")
CGROUP_ROOT = Path("/sys/fs/cgroup")
RUNC = shutil.which("runc") or "/usr/sbin/runc"
CNI_BIN_DIR = "/usr/lib/cni"


def images_cache() -> Path:
    return binaries.cache_root() / "images"


def image_store_dir() -> Path:
    """containerd's root kept between runs: images imported and unpacked once per build."""
    return binaries.cache_root() / "containerd"


def default_image_archives() -> list[Path]:
    """The OCI archives ``deploy/images/build.sh`` writes."""
    return [images_cache() / "sharetune-operator.oci.tar", images_cache() / "sharetune-tuner.oci.tar"]


def host_ip() -> str:
    """The address of the interface of the default route (what the API server advertises)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.250", 9))  # no packet is sent: picks the source address of the route
        return str(s.getsockname()[0])


def missing_host_tools() -> list[str]:
    """Debian packages the real node needs (installed by ``.ci/realnode-setup.sh``)."""
    need = {"containerd": "containerd", "containerd-shim-runc-v2": "containerd", "ctr": "containerd",
            "runc": "runc", "iptables": "iptables", "iptables-save": "iptables", "iptables-restore": "iptables",
            "ipset": "ipset", "ip": "iproute2"}
    missing = sorted({pkg for tool, pkg in need.items() if shutil.which(tool) is None})
    if not Path(CNI_BIN_DIR, "bridge").exists():
        missing.append("containernetworking-plugins")
    return missing


def pause_archive() -> Path:
    """An OCI image archive holding the static Go ``pause`` binary (no registry, no builder)."""
    out = images_cache() / f"sharetune-pause-{binaries.PAUSE_VERSION}.oci.tar"
    if out.exists():
        return out
    binaries.ensure(["pause"])
    layer_buf = io.BytesIO()
    with tarfile.open(fileobj=layer_buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        data = binaries.path_of("pause").read_bytes()
        info = tarfile.TarInfo("pause")
        info.size, info.mode, info.mtime = len(data), 0o755, 0
        t.addfile(info, io.BytesIO(data))
    layer = layer_buf.getvalue()

    def blob(b: bytes) -> tuple[str, int]:
        return "sha256:" + hashlib.sha256(b).hexdigest(), len(b)
    layer_d, layer_n = blob(layer)
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Entrypoint": ["/pause"]},
                         "rootfs": {"type": "layers", "diff_ids": [layer_d]}}).encode()
    config_d, config_n = blob(config)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_d, "size": config_n},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_d, "size": layer_n}],
    }).encode()
    manifest_d, manifest_n = blob(manifest)
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_d, "size": manifest_n,
        "annotations": {"io.containerd.image.name": PAUSE_IMAGE,
                        "org.opencontainers.image.ref.name": binaries.PAUSE_VERSION}}]}).encode()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    with tarfile.open(tmp, "w") as t:
        for name, b in (("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index),
                        *((f"blobs/sha256/{d.split(':')[1]}", b) for d, b in
                          ((layer_d, layer), (config_d, config), (manifest_d, manifest)))):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(b), 0o644, 0
            t.addfile(info, io.BytesIO(b))
    tmp.replace(out)
    return out


def archive_names(archive: Path) -> list[str]:
    """The image names an OCI archive's index.json gives (what ``ctr images import`` creates)."""
    with tarfile.open(archive) as t:
        f = t.extractfile("index.json")
        index = json.loads(f.read()) if f else {}
    names = []
    for m in index.get("manifests", []):
        ann = m.get("annotations", {})
        name = ann.get("io.containerd.image.name") or ann.get("org.opencontainers.image.ref.name", "")
        if "/" in name or ":" in name:
            names.append(name)
    return names


def _issue_client(pki_dir: Path, cn: str, org: str | None, stem: str) -> tuple[Path, Path]:
    """A client certificate signed by the cluster's CA (files ``<stem>.crt``/``.key``)."""
    ca_cert = x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki_dir / "ca.key").read_bytes(), password=None)
    key, cert = _issue(ca_key, ca_cert, _name(cn, org), client=True)  # type: ignore[arg-type]  # the CA's key is RSA
    crt, k = pki_dir / f"{stem}.crt", pki_dir / f"{stem}.key"
    _write_cert(crt, cert)
    _write_key(k, key)
    return crt, k


# kubelet's own iptables chains (kube-proxy --cleanup leaves them): table -> chains, and the
# jumps into them from built-in chains.
KUBELET_CHAINS = {"filter": ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY"),
                  "nat": ("KUBE-KUBELET-CANARY",),
                  "mangle": ("KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY")}
KUBELET_JUMPS = (("filter", "INPUT", "KUBE-FIREWALL"), ("filter", "OUTPUT", "KUBE-FIREWALL"))


def remove_kubelet_chains() -> None:
    for tool in ("iptables", "ip6tables"):
        if shutil.which(tool) is None:
            continue
        for table, chain, target in KUBELET_JUMPS:
            while _sh(tool, "-w", "-t", table, "-D", chain, "-j", target, check=False).returncode == 0:
                pass
        for table, chains in KUBELET_CHAINS.items():
            for c in chains:
                _sh(tool, "-w", "-t", table, "-F", c, check=False)
                _sh(tool, "-w", "-t", table, "-X", c, check=False)


# kube-router's firewall (netpol controller): its filter-table chains by prefix, the built-in
# chains that jump into its top-level ones, and its ipsets by prefix (TMP-: the scratch sets of its
# atomic swaps, normally destroyed at once). ``kube-router --cleanup-config`` is not used: in the
# version built it cleans no firewall state (it runs the cleanup on an empty controller, whose
# per-family iptables/ipset handlers are unset) and it also flushes every IPVS service on the host.
KUBE_ROUTER_CHAIN_PREFIXES = ("KUBE-ROUTER-", "KUBE-POD-FW-", "KUBE-NWPLCY-")
KUBE_ROUTER_JUMPS = (("INPUT", "KUBE-ROUTER-INPUT"), ("FORWARD", "KUBE-ROUTER-FORWARD"),
                     ("OUTPUT", "KUBE-ROUTER-OUTPUT"))
KUBE_ROUTER_IPSET_PREFIXES = ("KUBE-SRC-", "KUBE-DST-", "TMP-")


def kube_router_state() -> tuple[list[str], list[str]]:
    """kube-router's firewall chains (filter table) and ipsets present on this host."""
    chains = [ln[1:].split()[0] for ln in _sh("iptables-save", "-t", "filter", check=False).stdout.splitlines()
              if ln.startswith(":") and ln[1:].startswith(KUBE_ROUTER_CHAIN_PREFIXES)]
    sets = [n for n in _sh("ipset", "list", "-n", check=False).stdout.split()
            if n.startswith(KUBE_ROUTER_IPSET_PREFIXES)]
    return chains, sets


def remove_kube_router_state(keep_sets: frozenset[str] = frozenset()) -> None:
    """Removes what kube-router's firewall left (its process stopped): the jumps into its chains,
    its chains, then its ipsets (a set still referenced by a rule cannot be destroyed).
    ``keep_sets``: ipsets that were there before it started."""
    for line in _sh("iptables-save", "-t", "filter", check=False).stdout.splitlines():
        words = shlex.split(line) if line.startswith("-A ") else []
        if len(words) > 2 and (words[1], words[-1]) in KUBE_ROUTER_JUMPS:
            _sh("iptables", "-w", "-t", "filter", "-D", *words[1:], check=False)
    chains, sets = kube_router_state()
    for c in chains:  # flush all first: the chains jump into each other
        _sh("iptables", "-w", "-t", "filter", "-F", c, check=False)
    for c in chains:
        _sh("iptables", "-w", "-t", "filter", "-X", c, check=False)
    for n in sets:
        if n not in keep_sets:
            _sh("ipset", "destroy", n, check=False)


def _sh(*argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), check=check, capture_output=True, text=True, timeout=timeout)


class RealNode:
    """One real node (kubelet + containerd + kube-proxy + CoreDNS + kube-router's firewall) joined
    to a ``LocalCluster``."""

    def __init__(self, cluster: LocalCluster, name: str = "sharetune-node-0",
                 images: list[Path] | None = None, workdir: Path | None = None,
                 image_store: Path | None = None) -> None:
        """``image_store``: a containerd root kept between runs (images imported once, unpacked
        once); None = a fresh one inside the work directory."""
        self.cluster = cluster
        self.image_store = image_store
        self.name = name
        self.images = list(images) if images is not None else default_image_archives()
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="stn-"))  # short: unix socket paths
        self.processes: list[ProcessGroup] = []  # each in a process group of its own
        self.ports: dict[str, int] = {}
        self.node_ip = host_ip()
        self.index: int | None = None
        self.sysctls: dict[str, str] = {}
        self.timings: dict[str, float] = {}
        self._lock_fd: int | None = None
        self._bridge_made = False
        self._ipsets_before: frozenset[str] = frozenset()

    # ---- names ---------------------------------------------------------------------------------
    @property
    def bridge(self) -> str:
        return f"stbr{self.index}"

    @property
    def pod_cidr(self) -> str:
        return f"10.200.{self.index}.0/24"

    @property
    def gateway(self) -> str:
        return f"10.200.{self.index}.1"

    @property
    def sock(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    @property
    def cgroup_name(self) -> str:
        return f"sharetune-{self.name}"

    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    # ---- lifecycle -----------------------------------------------------------------------------
    def start(self, timeout_s: float = 180.0) -> "RealNode":
        missing = missing_host_tools()
        if missing:
            raise ClusterError(f"the real node needs Debian packages {missing} (bash .ci/realnode-setup.sh)")
        if os.geteuid() != 0:
            raise ClusterError("the real node needs root (containerd, kubelet, iptables)")
        self._lock()
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        try:
            binaries.ensure(list(binaries.NODE_BINARIES))
            self.timings["binaries_s"] = time.monotonic() - t0
            self.logs.mkdir(parents=True, exist_ok=True)
            self._prepare_host()
            self._write_configs()
            t = time.monotonic()
            self._start_containerd(deadline)
            self._import_images([pause_archive(), *self.images])
            self.timings["images_s"] = time.monotonic() - t
            self._start_coredns(deadline)
            self._start_kubelet(deadline)
            self._start_kube_proxy(deadline)
            self._start_kube_router(deadline)
        except BaseException as e:
            report = self.failure_report()
            self.stop()
            if isinstance(e, ClusterError):
                raise ClusterError(f"{e}\n{report}") from None
            raise
        self.timings["startup_s"] = time.monotonic() - t0
        return self

    def stop(self) -> None:
        by_name = {p.name: p for p in self.processes}
        for n in ("kube-router", "kube-proxy", "kubelet"):
            if n in by_name:
                by_name[n].stop()
        if "containerd" in by_name and by_name["containerd"].alive():
            # Every pod sandbox: stop (CNI DEL: veth, IP, portmap/masquerade rules) and remove.
            _sh(str(binaries.path_of("crictl")), f"--runtime-endpoint=unix://{self.sock}",
                "--timeout=60s", "rmp", "-a", "-f", check=False, timeout=180)
        if "kube-router" in by_name:
            remove_kube_router_state(self._ipsets_before)
        if "kube-proxy" in by_name:
            _sh(str(binaries.path_of("kube-proxy")), "--cleanup", check=False)
        if "kubelet" in by_name:
            remove_kubelet_chains()
        for p in reversed(self.processes):
            if p.name not in ("kube-router", "kube-proxy", "kubelet"):
                p.stop()
        self._kill_own_shims()
        self.processes.clear()
        self._umount_below(self.workdir)
        if self._bridge_made:
            _sh("ip", "link", "del", self.bridge, check=False)
        self._remove_cgroups()
        for k, v in self.sysctls.items():
            _sh("sysctl", "-q", "-w", f"{k}={v}", check=False)
        self.sysctls.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)
        self._unlock()

    def __enter__(self) -> "RealNode":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def failure_report(self) -> str:
        return failure_report(self.processes, 40)

    def crictl(self, *args: str) -> str:
        return _sh(str(binaries.path_of("crictl")), f"--runtime-endpoint=unix://{self.sock}", *args).stdout

    # ---- host ----------------------------------------------------------------------------------
    def _lock(self) -> None:
        self._lock_fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise ClusterError(f"another real node runs on this host ({LOCK_FILE} is locked)") from None

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = None

    def _prepare_host(self) -> None:
        for k in KUBELET_SYSCTLS:
            self.sysctls[k] = _sh("sysctl", "-n", k).stdout.strip()
        _sh("sysctl", "-q", "-w", "net.ipv4.ip_forward=1", check=False)
        _sh("sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=1", check=False)
        _sh("mount", "--make-rshared", "/")  # volume mount propagation (what systemd does at boot)
        # A bridge and subnet no other cluster on this host uses.
        links = _sh("ip", "-o", "link").stdout
        routes = _sh("ip", "-4", "route").stdout
        for i in range(1, 250):
            if f" stbr{i}:" not in links and f"10.200.{i}." not in routes:
                self.index = i
                break
        else:
            raise ClusterError("no free 10.200.<N>.0/24 subnet / stbr<N> bridge name")
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        self._bridge_made = True
        _sh("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _sh("ip", "link", "set", self.bridge, "up")
        # The pods' cgroup root, in every v1 hierarchy (kubelet requires it to exist).
        for h in self._hierarchies():
            d = h / self.cgroup_name
            d.mkdir(exist_ok=True)
            if h.name == "cpuset":
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (d / f).write_text((h / f).read_text())

    @staticmethod
    def _hierarchies() -> list[Path]:
        out = []
        for line in Path("/proc/mounts").read_text().splitlines():
            _, mnt, fstype, *_ = line.split()
            if fstype == "cgroup" and mnt.startswith(str(CGROUP_ROOT) + "/"):
                out.append(Path(mnt))
        return out

    def _remove_cgroups(self) -> None:
        for h in self._hierarchies():
            root = h / self.cgroup_name
            if not root.exists():
                continue
            for dirpath, _, _ in sorted(os.walk(root), key=lambda w: -len(w[0])):
                try:
                    os.rmdir(dirpath)
                except OSError:
                    pass

    def _umount_below(self, top: Path) -> None:
        prefix = str(top.resolve()) + "/"
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for m in sorted({m for m in mounts if m.startswith(prefix)}, key=len, reverse=True):
            _sh("umount", "-l", m, check=False)

    def _kill_own_shims(self) -> None:
        """containerd shims outlive containerd by design; end those started for our socket."""
        addr = str(self.sock)
        for pid_dir in Path("/proc").iterdir():
            if not pid_dir.name.isdigit():
                continue
            try:
                argv = (pid_dir / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"containerd-shim-runc-v2") and addr.encode() in argv:
                try:
                    os.kill(int(pid_dir.name), 9)
                except ProcessLookupError:
                    pass

    # ---- configuration -------------------------------------------------------------------------
    def _write_configs(self) -> None:
        w = self.workdir
        for n in ("kubelet", "kubelet_healthz", "proxy_healthz", "proxy_metrics", "dns_ready", "dns_health"):
            self.ports[n] = free_port()
        pki = w / "pki"
        pki.mkdir(parents=True, exist_ok=True)
        src = self.cluster.workdir / "pki"
        shutil.copy2(src / "ca.crt", pki / "ca.crt")
        shutil.copy2(src / "ca.key", pki / "ca.key")
        server = self.cluster.server
        crt, key = _issue_client(pki, f"system:node:{self.name}", "system:nodes", "kubelet")
        _kubeconfig(w / "kubelet.kubeconfig", server, pki / "ca.crt", crt, key, f"system:node:{self.name}")
        crt, key = _issue_client(pki, "system:kube-proxy", None, "kube-proxy")
        _kubeconfig(w / "kube-proxy.kubeconfig", server, pki / "ca.crt", crt, key, "system:kube-proxy")
        crt, key = _issue_client(pki, "sharetune-coredns", "system:masters", "coredns")
        _kubeconfig(w / "coredns.kubeconfig", server, pki / "ca.crt", crt, key, "coredns")
        # The test fixture's enforcer lists/watches pods, namespaces, NetworkPolicies, nodes,
        # Services, Endpoints and EndpointSlices (its informers start them all, even with only the
        # firewall on): an admin certificate on this throwaway cluster, like CoreDNS's.
        crt, key = _issue_client(pki, "sharetune-kube-router", "system:masters", "kube-router")
        _kubeconfig(w / "kube-router.kubeconfig", server, pki / "ca.crt", crt, key, "kube-router")
        (pki / "ca.key").unlink()

        cni = w / "cni" / "net.d"
        cni.mkdir(parents=True, exist_ok=True)
        (cni / "10-sharetune.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": f"sharetune-{self.index}",
            "plugins": [
                {"type": "bridge", "bridge": self.bridge, "isGateway": True, "ipMasq": True,
                 "hairpinMode": True,
                 "ipam": {"type": "host-local", "dataDir": str(w / "cni" / "ipam"),
                          "ranges": [[{"subnet": self.pod_cidr, "gateway": self.gateway}]],
                          "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ]}, indent=2))

        c = w / "containerd"
        c.mkdir(parents=True, exist_ok=True)
        (c / "config.toml").write_text(f"""version = 2
root = "{self.image_store or c / 'root'}"
state = "{c / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{self.sock}"
[ttrpc]
  address = "{self.sock}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{c / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{RUNC}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni}"
""")

        own_oom = Path("/proc/self/oom_score_adj").read_text().strip()
        (w / "kubelet.yaml").write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{self.cgroup_name}",
            "containerRuntimeEndpoint": f"unix://{self.sock}",
            "address": self.node_ip, "port": self.ports["kubelet"], "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": self.ports["kubelet_healthz"],
            "authentication": {"x509": {"clientCAFile": str(pki / "ca.crt")},
                               "webhook": {"enabled": True}, "anonymous": {"enabled": False}},
            "authorization": {"mode": "Webhook"},
            "clusterDNS": [self.gateway], "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": "/etc/resolv.conf",
            "failSwapOn": False,
            "oomScoreAdj": int(own_oom),  # root here cannot lower it (no CAP_SYS_RESOURCE)
            "podLogsDir": str(w / "pod-logs"),
            # No registry: an image GC'd away could not be pulled back.
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "4s", "syncFrequency": "10s",
            "maxPods": 110,
        }, indent=2))

        (w / "kube-proxy.yaml").write_text(json.dumps({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(w / "kube-proxy.kubeconfig")},
            "hostnameOverride": self.name, "mode": "iptables",
            "clusterCIDR": self.pod_cidr, "detectLocalMode": "ClusterCIDR",
            "bindAddress": "0.0.0.0",
            "healthzBindAddress": f"127.0.0.1:{self.ports['proxy_healthz']}",
            "metricsBindAddress": f"127.0.0.1:{self.ports['proxy_metrics']}",
            # Leave host-wide knobs alone: no route_localnet, no conntrack table sizing.
            "iptables": {"localhostNodePorts": False, "masqueradeAll": False},
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                          "tcpCloseWaitTimeout": "0s"},
        }, indent=2))

        (w / "Corefile").write_text(f""".:53 {{
    bind {self.gateway}
    errors
    ready 127.0.0.1:{self.ports['dns_ready']}
    health 127.0.0.1:{self.ports['dns_health']}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {w / 'coredns.kubeconfig'} sharetune-local
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    forward . /etc/resolv.conf
    cache 30
    loop
}}
""")

    # ---- components ----------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str]) -> ProcessGroup:
        p = ProcessGroup(name, argv, self.logs / f"{name}.log").start()
        self.processes.append(p)
        return p

    def _wait(self, what: str, check: Callable[[], bool], deadline: float, procs: list[ProcessGroup]) -> None:
        while time.monotonic() < deadline:
            for p in procs:
                if not p.alive():
                    raise ClusterError(f"{p.name} exited while waiting for {what}")
            try:
                if check():
                    return
            except (OSError, ValueError, subprocess.SubprocessError):
                pass
            time.sleep(0.3)
        raise ClusterError(f"timed out waiting for {what}")

    def _start_containerd(self, deadline: float) -> None:
        p = self._spawn("containerd", ["containerd", "--config", str(self.workdir / "containerd" / "config.toml"),
                                       "--log-level", "warn"])

        def ready() -> bool:
            out = _sh(str(binaries.path_of("crictl")), f"--runtime-endpoint=unix://{self.sock}",
                      "info", check=False, timeout=10)
            if out.returncode != 0:
                return False
            conds = {c["type"]: c["status"] for c in json.loads(out.stdout)["status"]["conditions"]}
            return bool(conds.get("RuntimeReady")) and bool(conds.get("NetworkReady"))
        self._wait("containerd CRI ready (runtime + CNI)", ready, deadline, [p])

    def _import_images(self, archives: list[Path]) -> None:
        stamps_file = (self.image_store or self.workdir) / "sharetune-imported.json"
        try:
            stamps = json.loads(stamps_file.read_text())
        except (OSError, ValueError):
            stamps = {}
        present = set(_sh("ctr", f"--address={self.sock}", "-n", "k8s.io", "images", "ls", "-q").stdout.split())
        for a in archives:
            if not a.exists():
                raise ClusterError(f"image archive {a} missing (bash deploy/images/build.sh)")
            st = a.stat()
            names = archive_names(a)
            stamp = {"size": st.st_size, "mtime": st.st_mtime, "names": names}
            if stamps.get(str(a), {}).get("size") == st.st_size and \
                    stamps[str(a)].get("mtime") == st.st_mtime and names and set(names) <= present:
                self.timings[f"import_{a.name}_s"] = 0.0  # already in the kept image store
                continue
            t = time.monotonic()
            r = _sh("ctr", f"--address={self.sock}", "-n", "k8s.io", "images", "import",
                    "--snapshotter=overlayfs", str(a), check=False, timeout=600)
            if r.returncode != 0:
                raise ClusterError(f"ctr images import {a}: {r.stderr.strip()}")
            self.timings[f"import_{a.name}_s"] = time.monotonic() - t
            stamps[str(a)] = stamp
            stamps_file.write_text(json.dumps(stamps, indent=2))

    def _start_coredns(self, deadline: float) -> None:
        p = self._spawn("coredns", [str(binaries.path_of("coredns")), "-conf", str(self.workdir / "Corefile")])

        def ready() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['dns_ready']}/ready", timeout=2) as r:
                return r.status == 200
        self._wait("CoreDNS /ready", ready, deadline, [p])

    def _start_kubelet(self, deadline: float) -> None:
        p = self._spawn("kubelet", [
            str(binaries.path_of("kubelet")),
            f"--config={self.workdir / 'kubelet.yaml'}",
            f"--kubeconfig={self.workdir / 'kubelet.kubeconfig'}",
            f"--root-dir={self.workdir / 'kubelet'}",
            f"--cert-dir={self.workdir / 'kubelet' / 'pki'}",
            f"--hostname-override={self.name}", f"--node-ip={self.node_ip}",
            "--v=1",
        ])

        def ready() -> bool:
            status, node = self.cluster.api("GET", f"/api/v1/nodes/{self.name}")
            if status != 200:
                return False
            conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
            return conds.get("Ready") == "True"
        self._wait(f"node {self.name} Ready", ready, deadline, [p])

    def _start_kube_proxy(self, deadline: float) -> None:
        p = self._spawn("kube-proxy", [str(binaries.path_of("kube-proxy")),
                                       f"--config={self.workdir / 'kube-proxy.yaml'}", "--v=1"])

        def synced() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['proxy_healthz']}/healthz",
                                        timeout=2) as r:
                if r.status != 200:
                    return False
            return "KUBE-SVC-" in _sh("iptables-save", "-t", "nat").stdout
        self._wait("kube-proxy synced (KUBE-SVC-* rules)", synced, deadline, [p])

    def _start_kube_router(self, deadline: float) -> None:
        """kube-router's NetworkPolicy firewall only (a test fixture: see the module docstring).
        It finds this node's pods by the node's InternalIP (their hostIP) and filters traffic to
        them in the filter table's FORWARD (bridged, via br_netfilter) and OUTPUT chains; a
        disallowed connection is REJECTed (the client sees "connection refused")."""
        self._ipsets_before = frozenset(kube_router_state()[1])
        p = self._spawn("kube-router", [
            str(binaries.path_of("kube-router")),
            "--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
            "--run-loadbalancer=false", "--enable-cni=false", "--enable-ipv6=false",
            f"--kubeconfig={self.workdir / 'kube-router.kubeconfig'}",
            f"--hostname-override={self.name}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--health-port=0", "--metrics-port=0",  # no listener on the host's addresses
            "--iptables-sync-period=1m",
        ])

        def synced() -> bool:
            rules = _sh("iptables-save", "-t", "filter").stdout
            return "-j KUBE-ROUTER-FORWARD" in rules and ":KUBE-NWPLCY-DEFAULT" in rules
        self._wait("kube-router firewall (KUBE-ROUTER-* chains)", synced, deadline, [p])


class RealCluster:
    """A ``LocalCluster`` (API server advertised on the host address, no kwok nodes) plus a
    ``RealNode``: what ``python -m sharetune_dev.cluster.realrun`` and the real-node tests run."""

    def __init__(self, images: list[Path] | None = None, workdir: Path | None = None,
                 keep_workdir: bool = False, image_store: Path | None | bool = True) -> None:
        self.cluster = LocalCluster(workdir=workdir, nodes=[], keep_workdir=keep_workdir,
                                    advertise_address=host_ip())
        self.images = images
        # True: containerd's root kept in the cache, so images are imported once per build.
        self.image_store = image_store_dir() if image_store is True else (image_store or None)
        self.node: RealNode | None = None
        self.timings: dict[str, Any] = {}

    def start(self) -> "RealCluster":
        t0 = time.monotonic()
        self.cluster.start()
        self.timings["control_plane_s"] = self.cluster.startup_s
        try:
            self.node = RealNode(self.cluster, images=self.images, image_store=self.image_store).start()
        except BaseException:
            self.cluster.stop()
            raise
        self.timings.update(self.node.timings)
        self.timings["setup_s"] = time.monotonic() - t0
        return self

    def stop(self) -> None:
        if self.node is not None:
            self.node.stop()
            self.node = None
        self.cluster.stop()

    def __enter__(self) -> "RealCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def env(self) -> dict[str, str]:
        return self.cluster.env()

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig

