"""Pinned Kubernetes-side binaries, built from source with the Go toolchain and cached.

There is no Docker engine, no registry and no Debian package for the Kubernetes server
components on our machines, but the Go module proxy is reachable. Each binary is built from a
tiny wrapper module:

* Kubernetes components: ``k8s.io/kubernetes`` refuses ``go install pkg@v`` because its go.mod
  replaces every staging module by a local path. The wrapper requires k8s.io/kubernetes and
  replaces each staging module (``k8s.io/api`` ...) by its published ``v0.<minor>.<patch>``.
* etcd: ``go.etcd.io/etcd/server/v3`` has replace directives too; the wrapper's own ``main``
  calls ``etcdmain.Main``.
* kwok, helm, CoreDNS, crictl, kube-router and kube-score install cleanly with ``go install``.
* checkov (a Python linter, not Go) is pip-installed at a pinned version into a virtualenv of its
  own next to its entry point, never into the product's .venv (its dependencies pin versions of
  boto3, pyyaml ... that the product need not share).

Binaries land in ``$XDG_CACHE_HOME/sharetune/bin/<component>-<version>/`` so a second run is a
cache hit costing nothing, and a version bump builds into a fresh directory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

K8S_VERSION = "1.35.4"
ETCD_VERSION = "3.6.16"
KWOK_VERSION = "0.7.0"
HELM_VERSION = "3.22.0"
# S3-compatible server for tests: gofakes3 (MIT) with its on-disk afero backend, so data survives
# a server restart. MinIO is AGPL and not used. It does not verify request signatures.
S3_SERVER_VERSION = "1.2.0"
# Real-node stage only (built on demand): cluster DNS, a CRI client for teardown, the sandbox
# ("pause") process of every pod.
COREDNS_VERSION = "1.14.7"
CRICTL_VERSION = "1.34.0"
PAUSE_VERSION = "3.10-sharetune"
# The real node's NetworkPolicy enforcer (its firewall controller only; node.py). A TEST FIXTURE:
# the version the module proxy serves has published security flaws, so it is never part of the
# chart, the images or anything installed on a cluster; it only proves on the throwaway real node
# that the policies the operator creates are enforced by a real implementation.
KUBE_ROUTER_VERSION = "2.1.0"
# Static linters of the chart's and the planner's objects (tests/helm/test_linters.py,
# docs/security.md "Accepted findings"); never installed on a cluster. From empty Go and pip caches
# on 2 cores: kube-score ~40 s (go install), checkov ~35-60 s (pip, ~180 MB).
KUBE_SCORE_VERSION = "1.20.0"
CHECKOV_VERSION = "3.3.30"

# The staging modules k8s.io/kubernetes v1.35 replaces with ./staging/src/k8s.io/<name>.
K8S_STAGING_MODULES = (
    "api", "apiextensions-apiserver", "apimachinery", "apiserver", "cli-runtime", "client-go",
    "cloud-provider", "cluster-bootstrap", "code-generator", "component-base",
    "component-helpers", "controller-manager", "cri-api", "cri-client", "csi-translation-lib",
    "dynamic-resource-allocation", "endpointslice", "externaljwt", "kms", "kube-aggregator",
    "kube-controller-manager", "kube-proxy", "kube-scheduler", "kubectl", "kubelet", "metrics",
    "mount-utils", "pod-security-admission", "sample-apiserver", "sample-cli-plugin",
    "sample-controller",
)

K8S_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
# Only needed by the real-node stage; built on demand.
K8S_NODE_COMMANDS = ("kubelet", "kube-proxy")

CONTROL_PLANE_BINARIES = ("etcd", *K8S_COMMANDS, "kwok", "helm")
TEST_BINARIES = ("s3-server", "kube-score", "checkov")
NODE_BINARIES = (*K8S_NODE_COMMANDS, "coredns", "crictl", "pause", "kube-router")
ALL_BINARIES = (*CONTROL_PLANE_BINARIES, *TEST_BINARIES)


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "sharetune"


@dataclass(frozen=True)
class Binary:
    name: str
    version: str

    @property
    def path(self) -> Path:
        return cache_root() / "bin" / f"{self.name}-{self.version}" / self.name


def binary(name: str) -> Binary:
    if name in K8S_COMMANDS or name in K8S_NODE_COMMANDS:
        return Binary(name, K8S_VERSION)
    versions = {"etcd": ETCD_VERSION, "kwok": KWOK_VERSION, "helm": HELM_VERSION, "s3-server": S3_SERVER_VERSION,
                "coredns": COREDNS_VERSION, "crictl": CRICTL_VERSION, "pause": PAUSE_VERSION,
                "kube-router": KUBE_ROUTER_VERSION, "kube-score": KUBE_SCORE_VERSION, "checkov": CHECKOV_VERSION}
    if name not in versions:
        raise KeyError(f"unknown binary {name!r}")
    return Binary(name, versions[name])


def path_of(name: str) -> Path:
    return binary(name).path


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    # Static, reproducible builds; no cgo needed by any of these binaries.
    env.setdefault("CGO_ENABLED", "0")
    env.setdefault("GOFLAGS", "-buildvcs=false")
    env.setdefault("GOPROXY", "https://proxy.golang.org,direct")
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> None:
    print(f"[binaries] {' '.join(cmd)}  (in {cwd})", file=sys.stderr, flush=True)
    subprocess.run(cmd, cwd=cwd, env=env, check=True)


def _k8s_wrapper(workdir: Path) -> None:
    minor = "0." + K8S_VERSION.split(".", 1)[1]
    lines = [
        "module sharetune.local/k8sbuild",
        "",
        "go 1.25.0",
        "",
        f"require k8s.io/kubernetes v{K8S_VERSION}",
        "",
        "replace (",
    ]
    lines += [f"\tk8s.io/{m} => k8s.io/{m} v{minor}" for m in K8S_STAGING_MODULES]
    lines += [")", ""]
    (workdir / "go.mod").write_text("\n".join(lines))
    # A tools file so `go mod tidy` keeps every command's dependencies.
    imports = "\n".join(f'\t_ "k8s.io/kubernetes/cmd/{c}"' for c in (*K8S_COMMANDS, *K8S_NODE_COMMANDS))
    (workdir / "tools.go").write_text(f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n")


def _etcd_wrapper(workdir: Path) -> None:
    (workdir / "go.mod").write_text(
        "module sharetune.local/etcdbuild\n\ngo 1.26.0\n\n"
        f"require go.etcd.io/etcd/server/v3 v{ETCD_VERSION}\n"
    )
    (workdir / "main.go").write_text(
        "package main\n\nimport (\n\t\"os\"\n\n\t\"go.etcd.io/etcd/server/v3/etcdmain\"\n)\n\n"
        "func main() { etcdmain.Main(os.Args) }\n"
    )


_S3_MAIN = """package main

// An S3-compatible server for sharetune's tests: gofakes3 over a directory on disk.
import (
	"flag"
	"log"
	"net/http"
	"os"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3afero"
	"github.com/spf13/afero"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9000", "listen address")
	dir := flag.String("dir", "", "data directory")
	flag.Parse()
	if err := os.MkdirAll(*dir, 0o755); err != nil {
		log.Fatal(err)
	}
	backend, err := s3afero.MultiBucket(afero.NewBasePathFs(afero.NewOsFs(), *dir))
	if err != nil {
		log.Fatal(err)
	}
	faker := gofakes3.New(backend, gofakes3.WithAutoBucket(true))
	log.Printf("s3 server on %s, data in %s", *addr, *dir)
	log.Fatal(http.ListenAndServe(*addr, faker.Server()))
}
"""


def _s3_wrapper(workdir: Path) -> None:
    (workdir / "go.mod").write_text(
        "module sharetune.local/s3server\n\ngo 1.24\n\n"
        f"require github.com/johannesboyne/gofakes3 v{S3_SERVER_VERSION}\n")
    (workdir / "main.go").write_text(_S3_MAIN)


_PAUSE_MAIN = """package main

// The sandbox process of every pod on the real node: holds the pod's namespaces, reaps orphans
// (it is PID 1 with a shared process namespace) and exits on SIGINT/SIGTERM.
import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s == syscall.SIGCHLD {
			for {
				var ws syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}
"""


def _pause_wrapper(workdir: Path) -> None:
    (workdir / "go.mod").write_text("module sharetune.local/pause\n\ngo 1.24\n")
    (workdir / "main.go").write_text(_PAUSE_MAIN)


def _install(dest: Path, built: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    shutil.copy2(built, tmp)
    os.chmod(tmp, 0o755)
    tmp.replace(dest)  # atomic: a half-copied binary is never mistaken for a cache hit


def _install_checkov() -> None:
    """checkov in a virtualenv of its own, ``<cache>/bin/checkov-<version>/venv``; the entry point
    (a symlink into it) is made last, so a half-done install is never a cache hit."""
    dest = path_of("checkov")
    venv = dest.parent / "venv"
    shutil.rmtree(venv, ignore_errors=True)  # a venv is not relocatable: build it in place
    dest.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    _run([sys.executable, "-m", "venv", str(venv)], dest.parent, env)
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "--progress-bar", "off",
          f"checkov=={CHECKOV_VERSION}"], dest.parent, env)
    tmp = dest.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(venv / "bin" / "checkov")
    tmp.replace(dest)


def build(names: list[str]) -> dict[str, float]:
    """Builds the missing binaries among ``names``; returns seconds spent per binary (0 = cached)."""
    env = _go_env()
    spent: dict[str, float] = {}
    work = cache_root() / "gobuild"
    work.mkdir(parents=True, exist_ok=True)
    k8s_missing = [n for n in names if (n in K8S_COMMANDS or n in K8S_NODE_COMMANDS)
                   and not path_of(n).exists()]
    for n in names:
        spent[n] = 0.0
    if k8s_missing:
        wd = work / f"k8s-{K8S_VERSION}"
        wd.mkdir(parents=True, exist_ok=True)
        _k8s_wrapper(wd)
        _run(["go", "mod", "tidy"], wd, env)
        for n in k8s_missing:
            t0 = time.monotonic()
            out = wd / "out" / n
            _run(["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(out), f"k8s.io/kubernetes/cmd/{n}"], wd, env)
            _install(path_of(n), out)
            spent[n] = time.monotonic() - t0
    # Binaries whose wrapper module has its own main package.
    for n, write_wrapper in (("etcd", _etcd_wrapper), ("s3-server", _s3_wrapper), ("pause", _pause_wrapper)):
        if n in names and not path_of(n).exists():
            t0 = time.monotonic()
            wd = work / f"{n}-{binary(n).version}"
            wd.mkdir(parents=True, exist_ok=True)
            write_wrapper(wd)
            _run(["go", "mod", "tidy"], wd, env)
            _run(["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(wd / n), "."], wd, env)
            _install(path_of(n), wd / n)
            spent[n] = time.monotonic() - t0
    if "checkov" in names and not path_of("checkov").exists():
        t0 = time.monotonic()
        _install_checkov()
        spent["checkov"] = time.monotonic() - t0
    simple = {
        "kwok": f"sigs.k8s.io/kwok/cmd/kwok@v{KWOK_VERSION}",
        "helm": f"helm.sh/helm/v3/cmd/helm@v{HELM_VERSION}",
        "coredns": f"github.com/coredns/coredns@v{COREDNS_VERSION}",
        "crictl": f"sigs.k8s.io/cri-tools/cmd/crictl@v{CRICTL_VERSION}",
        # Test fixture only (see KUBE_ROUTER_VERSION). ~3 min on 2 cores.
        "kube-router": f"github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@v{KUBE_ROUTER_VERSION}",
        "kube-score": f"github.com/zegl/kube-score/cmd/kube-score@v{KUBE_SCORE_VERSION}",
    }
    for n, pkg in simple.items():
        if n in names and not path_of(n).exists():
            t0 = time.monotonic()
            with tempfile.TemporaryDirectory() as gobin:
                e = dict(env, GOBIN=gobin)
                _run(["go", "install", "-trimpath", "-ldflags=-s -w", pkg], work, e)
                _install(path_of(n), Path(gobin) / n)
            spent[n] = time.monotonic() - t0
    return spent


def ensure(names: tuple[str, ...] | list[str] = CONTROL_PLANE_BINARIES) -> dict[str, Path]:
    build(list(names))
    return {n: path_of(n) for n in names}


def missing(names: tuple[str, ...] | list[str] = CONTROL_PLANE_BINARIES) -> list[str]:
    return [n for n in names if not path_of(n).exists()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sharetune-binaries", description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", default=list(ALL_BINARIES))
    p.add_argument("--node", action="store_true",
                   help="also build the real node's binaries (kubelet, kube-proxy, coredns, crictl, pause, "
                        "kube-router)")
    p.add_argument("--json", help="write per-binary build seconds to this file")
    a = p.parse_args(argv)
    names = list(a.names) + (list(NODE_BINARIES) if a.node else [])
    t0 = time.monotonic()
    spent = build(names)
    total = time.monotonic() - t0
    for n in names:
        print(f"{n:26s} {path_of(n)}  ({spent[n]:.1f}s)")
    print(f"total {total:.1f}s")
    if a.json:
        Path(a.json).write_text(json.dumps({"total_s": total, "per_binary_s": spent}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
