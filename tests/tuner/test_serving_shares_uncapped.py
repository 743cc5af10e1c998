"""The serving report must measure each share in a process that really gets it. MPS lets a
client's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE only lower the daemon's default, so a job daemon that
set its default to the tuning share (25%) capped the merge's serving processes at 25%: on the H200
the report showed the same latency and 32 SMs at 25, 50, 75 and 100%. Here the job's daemon, started
with the very command both topologies build, runs the stand-in control binary (a MOCK of
nvidia-cuda-mps-control: the real one needs NVIDIA's driver; the H200 runs the real one), which
records what it is told; the MPS rule (effective share = min(daemon default, client's)) is applied
to that record."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sharetune.api import commands
from sharetune.api.spec import parse_spec
from sharetune.planner import JobRef, plan
from sharetune.procs import ProcessGroup
from sharetune_dev import fake_mps_control
from sharetune_tuner.measure.mps import READY
from sharetune_tuner.measure.serving import SERVING_PCTS

from ..helpers import wait_for

SPEC = {"model": {"name": "resnet18"}, "target": "cuda",
        "servers": {"replicas": 4, "threadPercentage": 25, "pinnedMemoryLimit": "4G"}}


def effective_share(daemon_commands: list[str], requested: int) -> int:
    """What MPS gives a client that asks for ``requested`` percent under this daemon."""
    default = 100
    for c in daemon_commands:
        if c.startswith("set_default_active_thread_percentage"):
            default = int(c.split()[1])
    return min(default, requested)


def test_the_jobs_daemon_leaves_every_serving_share_reachable(tmp_path: Path) -> None:
    spec = parse_spec("tj", SPEC)
    wrapper = tmp_path / "nvidia-cuda-mps-control"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {fake_mps_control.__file__} \"$@\"\n")
    wrapper.chmod(0o755)
    pipe, logs = tmp_path / "pipe", tmp_path / "log"
    args = commands.mps_daemon(spec, str(pipe), str(logs))
    p = ProcessGroup("mps-daemon", [sys.executable, "-m", "sharetune_tuner.cli", *args,
                                    "--control-binary", str(wrapper), "--no-gpu-check"], tmp_path / "daemon.log",
                     env={**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe)}).start()
    try:
        wait_for("daemon ready", lambda: (pipe / READY).exists() or not p.alive(), 30)
        assert p.alive(), p.tail()
        told = (pipe / "fake-control.commands").read_text().splitlines()
    finally:
        p.stop()
    assert "set_default_device_pinned_mem_limit 0 4G" in told  # the memory default is still set
    for pct in SERVING_PCTS:  # the merge's serving processes get the share they ask for
        assert effective_share(told, pct) == pct, (pct, told)
    # ... while every tuning server still runs at the tuning share, from its own environment.
    servers = [o for o in plan(JobRef("tj", "ns", "u"), spec) if o["kind"] == "Deployment"
               and o["metadata"]["labels"]["app.kubernetes.io/component"] == "server"]
    for d in servers:
        env = {e["name"]: e.get("value") for e in d["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
        assert effective_share(told, int(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"])) == 25
