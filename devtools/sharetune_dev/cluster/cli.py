"""`sharetune cluster up|down|binaries`: the local control plane from the command line.

The product's `sharetune` command finds ``add_parser`` through this distribution's
``sharetune.commands`` entry point (devtools/pyproject.toml); it never imports this package."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import binaries
from .harness import ClusterError, FakeNode, LocalCluster, down

DEFAULT_DIR = binaries.cache_root() / "cluster"


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("cluster", help="a real local Kubernetes control plane (etcd, apiserver, kwok ...)")
    csub = p.add_subparsers(dest="cluster_cmd", required=True)
    up = csub.add_parser("up", help="build/reuse the binaries and start the control plane")
    up.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="work directory (certs, logs, etcd)")
    up.add_argument("--gpu-nodes", type=int, default=1, help="kwok nodes with nvidia.com/gpu: 1")
    up.add_argument("--cpu-nodes", type=int, default=0, help="kwok nodes without GPUs")
    dn = csub.add_parser("down", help="stop the control plane started by `up` (by PID)")
    dn.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    b = csub.add_parser("binaries", help="build (or find cached) pinned binaries")
    b.add_argument("--node", action="store_true", help="also kubelet and kube-proxy")
    p.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    if a.cluster_cmd == "binaries":
        return binaries.main(["--node"] if a.node else [])
    if a.cluster_cmd == "up":
        if (a.dir / "cluster.json").exists():
            print(f"a cluster is already recorded in {a.dir}; run `sharetune cluster down --dir {a.dir}` first",
                  file=sys.stderr)
            return 2
        a.dir.mkdir(parents=True, exist_ok=True)
        nodes = [FakeNode(f"kwok-gpu-{i}", gpus=1) for i in range(a.gpu_nodes)]
        nodes += [FakeNode(f"kwok-cpu-{i}", gpus=0) for i in range(a.cpu_nodes)]
        try:
            c = LocalCluster(workdir=a.dir, nodes=nodes).start()
        except ClusterError as e:
            print(f"cluster failed to start:\n{e}", file=sys.stderr)
            return 1
        print(f"control plane ready in {c.startup_s:.1f}s at {c.server}")
        print(f"export KUBECONFIG={c.kubeconfig}")
        return 0
    stopped = down(a.dir)
    print("stopped: " + (", ".join(stopped) or "nothing was running"))
    return 0
