"""The MPS control daemon does not outlive its `sharetune-tuner mps-daemon` wrapper: the wrapper
starts it in a session of its own (to stop it cleanly with `quit`), so a SIGKILLed wrapper used to
leave it running (found as a leftover process after a CI run). Uses the process kubelet's stand-in for
nvidia-cuda-mps-control (sharetune_dev/fake_mps_control.py, a MOCK: the real binary needs NVIDIA's driver;
the H200 runs the real one). Also the wrapper's two health checks, a pod's readiness and liveness."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from sharetune.procs import ProcessGroup, free_port
from sharetune_dev import fake_mps_control
from sharetune_tuner.measure import mps
from sharetune_tuner.measure.mps import READY

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
    port = free_port()
    p = ProcessGroup("mps-daemon", [sys.executable, "-m", "sharetune_tuner.cli", "mps-daemon", "--pipe-dir", str(pipe),
                                    "--log-dir", str(tmp_path / "log"), "--control-binary", str(wrapper),
                                    "--no-gpu-check", "--metrics-port", str(port)], tmp_path / "daemon.log",
                     env=env).start()
    control = 0
    try:
        wait_for("daemon ready", lambda: (pipe / READY).exists(), 30)
        # The pod's probes: readiness (the control pipe answers) and liveness (the wrapper supervises).
        for path in ("/healthz", "/livez"):
            assert wait_for(path, lambda path=path: _get(port, path) == 200, 30)
        control = int((pipe / "fake-control.pid").read_text())
        assert not gone(control) and os.getpgid(control) != p.pid  # its own session, as designed
        p.kill(signal.SIGKILL)  # the wrapper's group only: a crash, no clean stop
        wait_for("control daemon gone with its wrapper", lambda: gone(control), 10)
    finally:
        if control and not gone(control):
            os.kill(control, signal.SIGKILL)
        p.stop(grace_s=0)


def _get(port: int, path: str) -> int:
    try:
        return int(urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5).status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def test_a_mute_daemon_is_unready_but_only_a_stalled_supervisor_is_not_live(tmp_path: Path) -> None:
    """Readiness and liveness differ: a control daemon that stops answering leaves readiness at
    once (its wrapper restarts it in place), while liveness, whose failure restarts the pod and
    ends every client's CUDA context, fails only when the wrapper itself no longer supervises."""
    from sharetune_tuner.service import StatusServer

    d = mps.MpsDaemon(tmp_path / "pipe", tmp_path / "log", require_gpu=False)
    d.proc = subprocess.Popen(["sleep", "60"])  # stands for a running control daemon
    srv = StatusServer(0, d.health, host="127.0.0.1", live=d.live).start()
    try:
        assert (_get(srv.port, "/healthz"), _get(srv.port, "/livez")) == (503, 200)  # not answered yet
        d.answered_at = time.monotonic()
        assert (_get(srv.port, "/healthz"), _get(srv.port, "/livez")) == (200, 200)
        d.answered_at -= mps.ANSWER_FRESH_S + 1  # mute since: out of readiness, not killed for it
        assert (_get(srv.port, "/healthz"), _get(srv.port, "/livez")) == (503, 200)
        d.ticked_at -= mps.SUPERVISOR_STALL_S + 1  # the supervisor stopped stepping: now it is
        assert _get(srv.port, "/livez") == 503
    finally:
        srv.stop()
        d.proc.kill()
        d.proc.wait()
