"""The end-to-end run on a real node: ``helm install`` the chart (the operator as a real pod),
``kubectl apply`` a TuningJob, wait for it. Shared by ``tests/realnode`` and ``bench/real_node.py``.

    python -m sharetune_dev.cluster.realrun [--install]   # a real local cluster in the foreground (root)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from . import binaries
from .harness import ClusterError
from .node import RealCluster

ROOT = Path(__file__).resolve().parents[3]  # devtools/sharetune_dev/cluster/ -> the repository
CHART = ROOT / "helm" / "sharetune"
EXAMPLE = ROOT / "examples" / "tiny-cpu.yaml"
NAMESPACE = "sharetune-system"
RELEASE = "sharetune"
# No registry: the kubelet must never try to pull (the images were imported into containerd).
NEVER_PULL = ["--set", "image.pullPolicy=Never"]


def run(rc: RealCluster, tool: str, *args: str, stdin: str | None = None, check: bool = True,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([str(binaries.path_of(tool)), *args], input=stdin, capture_output=True, text=True,
                       env=rc.env(), timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{tool} {' '.join(args)} -> {r.returncode}\n{r.stdout}\n{r.stderr}")
    return r


def kubectl(rc: RealCluster, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return run(rc, "kubectl", *args, **kw)


def helm_install(rc: RealCluster, namespace: str = NAMESPACE, timeout: str = "5m",
                 values: tuple[str, ...] = ()) -> float:
    """Installs the chart and waits until the operator pod is Ready; returns the seconds spent.
    ``values``: more helm arguments (``--set ...``, ``--set-json ...``)."""
    t0 = time.monotonic()
    run(rc, "helm", "install", RELEASE, str(CHART), "-n", namespace, "--create-namespace", *NEVER_PULL,
        *values, "--wait", "--timeout", timeout, timeout=400)
    return time.monotonic() - t0


def helm_test(rc: RealCluster, namespace: str = NAMESPACE, timeout: str = "15m") -> subprocess.CompletedProcess[str]:
    # No --logs: the hook's delete policy removes the test pod once it succeeded.
    return run(rc, "helm", "test", RELEASE, "-n", namespace, "--timeout", timeout, check=False, timeout=1000)


def job(rc: RealCluster, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    r = kubectl(rc, "get", "tuningjob", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else {}


def pods(rc: RealCluster, namespace: str = NAMESPACE, selector: str | None = None) -> list[dict[str, Any]]:
    args = ["get", "pods", "-n", namespace, "-o", "json"] + (["-l", selector] if selector else [])
    return json.loads(kubectl(rc, *args).stdout)["items"]


def wait_phase(rc: RealCluster, name: str, phases: tuple[str, ...] = ("Succeeded", "Failed"),
               timeout_s: float = 1500, namespace: str = NAMESPACE, on_tick: Any = None) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        last = job(rc, name, namespace)
        if (last.get("status") or {}).get("phase") in phases:
            return last
        if on_tick is not None:
            on_tick(last)
        time.sleep(3)
    raise TimeoutError(f"TuningJob {name} not in {phases} after {timeout_s:.0f}s: {last.get('status')}\n"
                       + diagnostics(rc, namespace))


def diagnostics(rc: RealCluster, namespace: str = NAMESPACE) -> str:
    out = [kubectl(rc, "get", "pods,jobs,deploy,cm", "-n", namespace, "-o", "wide", check=False).stdout,
           kubectl(rc, "get", "events", "-n", namespace, "--sort-by=.lastTimestamp", check=False).stdout[-4000:]]
    for p in pods(rc, namespace):
        logs = kubectl(rc, "logs", "-n", namespace, p["metadata"]["name"], "--all-containers", "--tail=15",
                       check=False)
        out.append(f"--- {p['metadata']['name']} ---\n{logs.stdout}{logs.stderr}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """``python -m sharetune_dev.cluster.realrun``: a real local cluster in the foreground (root) until
    Ctrl-C/SIGTERM, then everything is stopped and the host state given back."""
    import argparse
    import signal

    p = argparse.ArgumentParser(prog="python -m sharetune_dev.cluster.realrun", description=main.__doc__)
    p.add_argument("--install", action="store_true",
                   help="also helm install the chart (operator as a pod, images never pulled)")
    a = p.parse_args(argv)
    stop = {"now": False}

    def on_signal(*_: object) -> None:
        stop["now"] = True
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        rc = RealCluster().start()
    except ClusterError as e:
        print(f"real cluster failed to start:\n{e}", file=sys.stderr)
        return 1
    try:
        print(f"real node {rc.node.name if rc.node else ''} ready in {rc.timings['setup_s']:.1f}s "
              f"(images {rc.timings.get('images_s', 0):.1f}s)", flush=True)
        if a.install:
            print(f"chart installed in {helm_install(rc):.1f}s (namespace {NAMESPACE})", flush=True)
        print(f"export KUBECONFIG={rc.kubeconfig}\nCtrl-C stops it.", flush=True)
        while not stop["now"]:
            time.sleep(0.5)
    finally:
        rc.stop()
        print("stopped", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
