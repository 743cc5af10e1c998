"""`sharetune cluster up/down` starts detached components and stops them by PID."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster


def test_cluster_up_then_down(tmp_path: Path) -> None:
    workdir = tmp_path / "c"
    up = subprocess.run([sys.executable, "-m", "sharetune.cli", "cluster", "up", "--dir", str(workdir)],
                        capture_output=True, text=True, timeout=180)
    assert up.returncode == 0, up.stderr
    assert "control plane ready" in up.stdout
    state = json.loads((workdir / "cluster.json").read_text())
    pids = [p["pid"] for p in state["processes"]]
    assert {p["name"] for p in state["processes"]} == {
        "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"}
    assert all(Path(f"/proc/{pid}").exists() for pid in pids)
    # A second `up` on the same directory refuses instead of leaking a second cluster.
    again = subprocess.run([sys.executable, "-m", "sharetune.cli", "cluster", "up", "--dir", str(workdir)],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "already recorded" in again.stderr

    dn = subprocess.run([sys.executable, "-m", "sharetune.cli", "cluster", "down", "--dir", str(workdir)],
                        capture_output=True, text=True, timeout=120)
    assert dn.returncode == 0, dn.stderr
    for pid in pids:
        # Gone, or a zombie of an unrelated reaper: never still running our binary.
        try:
            os.kill(pid, 0)
            alive = Path(f"/proc/{pid}/exe").exists()
        except ProcessLookupError:
            alive = False
        assert not alive, f"pid {pid} survived `cluster down`"


def test_failure_shows_component_log_tails(tmp_path: Path) -> None:
    from sharetune_dev.cluster.harness import ClusterError, LocalCluster

    c = LocalCluster(workdir=tmp_path / "bad")
    # Occupy etcd's client port choice by forcing a bogus etcd flag through a subclass hook.
    orig = c._spawn

    def spawn(name: str, argv: list[str]):
        if name == "etcd":
            argv = [*argv, "--no-such-flag"]
        return orig(name, argv)
    c._spawn = spawn
    with pytest.raises(ClusterError) as e:
        c.start(timeout_s=20)
    msg = str(e.value)
    assert "etcd exited" in msg and "----- etcd" in msg and "no-such-flag" in msg
