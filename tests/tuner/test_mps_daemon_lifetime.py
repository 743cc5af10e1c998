"""The MPS control daemon does not outlive its `sharetune-tuner mps-daemon` wrapper: the wrapper
starts it in a session of its own (to stop it cleanly with `quit`), so a SIGKILLed wrapper used to
leave it running (found as a leftover process after a CI run). Uses the process kubelet's stand-in for
nvidia-cuda-mps-control (sharetune_dev/fake_mps_control.py, a MOCK: the real binary needs NVIDIA's driver;
the H200 runs the real one)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from sharetune.procs import ProcessGroup
from sharetune_dev import fake_mps_control
from sharetune_tuner.mps import READY

from ..helpers import wait_for

FAKE = Path(fake_mps_control.__file__)


def gone(pid: int) -> bool:
    """Exited (a zombie waiting for its reaper counts as exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_a_killed_wrapper_takes_the_control_daemon_with_it(tmp_path: Path) -> None:
    wrapper = tmp_path / "nvidia-cuda-mps-control"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    wrapper.chmod(0o755)
    pipe = tmp_path / "pipe"
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "log")}
    p = ProcessGroup("mps-daemon", [sys.executable, "-m", "sharetune_tuner.cli", "mps-daemon", "--pipe-dir", str(pipe),
                                    "--log-dir", str(tmp_path / "log"), "--control-binary", str(wrapper),
                                    "--no-gpu-check"], tmp_path / "daemon.log", env=env).start()
    control = 0
    try:
        wait_for("daemon ready", lambda: (pipe / READY).exists(), 30)
        control = int((pipe / "fake-control.pid").read_text())
        assert not gone(control) and os.getpgid(control) != p.pid  # its own session, as designed
        p.kill(signal.SIGKILL)  # the wrapper's group only: a crash, no clean stop
        wait_for("control daemon gone with its wrapper", lambda: gone(control), 10)
    finally:
        if control and not gone(control):
            os.kill(control, signal.SIGKILL)
        p.stop(grace_s=0)
