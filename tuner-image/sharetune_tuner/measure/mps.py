"""The CUDA MPS control daemon as a supervised process.

We run ``nvidia-cuda-mps-control -f`` (foreground) rather than ``-d`` so that we own its PID: a
crash is seen at once, the daemon is started again with the same defaults, and stop = ``quit``
through the control pipe, then SIGTERM/SIGKILL of its process group if it does not go.
Thread-percentage and pinned-memory defaults apply to MPS servers started afterwards; tuning
servers set their own limits through the environment as MPS clients.

Two checks, served on the metrics port, for a pod's two probes: ``health`` (``/healthz``,
readiness) is whether the control daemon answered its pipe recently, i.e. accepts clients;
``live`` (``/livez``, liveness) is only whether this wrapper still supervises. A restart of the
pod ends the MPS server and every client's CUDA context, co-tenant jobs' included, while the
wrapper restarts a dead or mute control daemon itself: a slow daemon must go unready long
before anything kills it.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sharetune.api.topology import MPS_READY_FILE

from .. import metrics
from ..errors import MpsError
from . import window as measure_window

log = logging.getLogger("sharetune.mps")


READY = MPS_READY_FILE  # in the pipe directory: the daemon answers and has its defaults
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
# Readiness: the control pipe answered within this (the supervisor asks every 2 s).
ANSWER_FRESH_S = 10.0
# Liveness: the supervising loop ran within this. Above its longest legitimate pause: restarting a
# mute daemon (a 10 s check, up to 50 s to stop it, up to ~35 s to start and configure it).
SUPERVISOR_STALL_S = 180.0


def wait_for_daemon(timeout_s: float, stop: threading.Event | None = None, poll_s: float = 0.5) -> Path:
    """Blocks until the MPS daemon of ``$CUDA_MPS_PIPE_DIRECTORY`` is ready (its READY marker);
    returns the pipe directory. A CUDA process started before that would run outside MPS without
    a word (CUDA falls back to a context of its own), taking the whole GPU and no share limit, so
    a process that must be an MPS client waits here and otherwise fails with :class:`MpsError`."""
    pipe = os.environ.get(PIPE_ENV)
    if not pipe:
        raise MpsError(f"this process must run under MPS but {PIPE_ENV} is not set: "
                       "run it with the MPS daemon's pipe directory")
    marker = Path(pipe) / READY
    deadline = time.monotonic() + timeout_s
    waiter = stop or threading.Event()  # never set without a caller's stop: a plain sleep
    while not marker.exists():
        if time.monotonic() > deadline:
            raise MpsError(f"no MPS daemon became ready in {pipe} within {timeout_s:.0f} s ({READY} missing): "
                           "check the job's MPS daemon (or the GPU pool's) on this node")
        if waiter.wait(poll_s):
            break
    return Path(pipe)


def hand_over(root: Path, uid: int, gid: int) -> int:
    """Gives a daemon's host directory ``root`` (and everything under it) to ``uid``:``gid`` and
    makes its ``pipe`` and ``log`` directories; returns how many entries changed owner.

    Why: the MPS control daemon runs as the same non-root UID as its clients (the tuning servers,
    the merge). A control daemon running as root spawns each client's MPS server under the
    client's UID, which needs CAP_SETUID/CAP_SETGID; without them a non-root client fails with
    "MPS client failed to connect" (control.log: "Failed to start server using uid 1000, error:
    Operation not permitted"), measured on an H100 (bench/h200/mps_isolation_probe.sh). So only
    this step, an init container of seconds, is root: the kubelet creates a hostPath directory
    owned by root. Symbolic links are changed themselves, never followed: a client that planted
    one under the directory cannot make this change a path outside it."""
    root.mkdir(parents=True, exist_ok=True)
    for sub in ("pipe", "log"):
        (root / sub).mkdir(exist_ok=True)
    changed = 0
    paths = [root]
    for top, dirs, files in os.walk(root, followlinks=False):
        paths.extend(Path(top) / n for n in (*dirs, *files))
    for path in paths:
        st = path.lstat()
        if (st.st_uid, st.st_gid) != (uid, gid):
            os.lchown(path, uid, gid)
            changed += 1
    root.chmod(0o750)  # the daemon and its clients (one UID); no one else on the node
    return changed


def _dies_with(parent: int) -> Callable[[], None]:
    """The control daemon runs in a session of its own (stopped with ``quit``, then its group), so
    a SIGKILLed wrapper would leave it running: in a pod the container's end takes it along, but in
    local mode and the fault simulator it stayed (found as a leftover after a CI run). The kernel
    sends it SIGTERM when the thread that started it ends; ``run`` starts it from the main thread,
    i.e. when the wrapper process ends."""

    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before the fork: the child only calls it
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM)
        if os.getppid() != parent:  # the wrapper died before prctl took effect
            os._exit(1)

    return preexec


class MpsDaemon:
    def __init__(self, pipe_dir: Path, log_dir: Path, thread_percentage: int | None = None,
                 pinned_memory_limit: str | None = None, control_binary: str = "nvidia-cuda-mps-control",
                 require_gpu: bool = True, client_group: int | None = None) -> None:
        self.pipe_dir, self.log_dir = Path(pipe_dir), Path(log_dir)
        self.thread_percentage = thread_percentage
        self.pinned_memory_limit = pinned_memory_limit
        self.control_binary = control_binary
        self.require_gpu = require_gpu
        self.client_group = client_group  # the clients' GID: measure_window.prepare
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.last_answer = False
        self.answered_at: float | None = None  # monotonic time of the control pipe's last answer
        self.ticked_at = time.monotonic()  # of the supervisor's last step

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
                "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

    def preflight(self) -> str:
        binary = shutil.which(self.control_binary)
        if binary is None:
            raise MpsError(f"{self.control_binary} not found: CUDA MPS needs the NVIDIA driver's MPS "
                           "binaries on the PATH (a GPU node with the driver mounted)")
        if self.require_gpu:
            try:
                import pynvml

                pynvml.nvmlInit()
                count = pynvml.nvmlDeviceGetCount()
                pynvml.nvmlShutdown()
            except Exception as e:
                raise MpsError(f"no NVIDIA GPU visible to the MPS daemon (NVML: {e})") from None
            if count == 0:
                raise MpsError("no NVIDIA GPU visible to the MPS daemon (NVML found 0 devices)")
        return binary

    def control(self, command: str, timeout_s: float = 10.0) -> tuple[int, str]:
        """Sends one command to the daemon through its pipe, as `echo cmd | nvidia-cuda-mps-control`."""
        try:
            r = subprocess.run([self.control_binary], input=command + "\n", capture_output=True, text=True,
                               env=self.env, timeout=timeout_s)
        except (subprocess.TimeoutExpired, OSError) as e:
            return 1, str(e)
        return r.returncode, (r.stdout + r.stderr).strip()

    def start(self) -> None:
        binary = self.preflight()
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        (self.pipe_dir / READY).unlink(missing_ok=True)
        measure_window.prepare(self.pipe_dir, self.client_group)  # before READY: servers find their windows at start
        self.log_dir.mkdir(parents=True, exist_ok=True)
        out = open(self.log_dir / "sharetune-mps-control.out", "ab")
        self.proc = subprocess.Popen([binary, "-f"], env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=_dies_with(os.getpid()))
        out.close()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = (self.log_dir / "sharetune-mps-control.out").read_text(errors="replace")[-400:]
                raise MpsError(f"MPS control daemon exited with {self.proc.returncode}: {tail.strip()}")
            if self.control("get_server_list")[0] == 0:
                break
            time.sleep(0.3)
        else:
            raise MpsError("MPS control daemon did not answer within 15 s")
        if self.thread_percentage is not None:
            self._must(f"set_default_active_thread_percentage {self.thread_percentage}")
        if self.pinned_memory_limit:
            self._must(f"set_default_device_pinned_mem_limit 0 {self.pinned_memory_limit}")
        # Local mode starts the servers once this exists (instead of after a fixed sleep).
        (self.pipe_dir / READY).touch()
        self.answered_at = time.monotonic()
        log.info("MPS control daemon up (pid %d, pipe %s)", self.proc.pid, self.pipe_dir)

    def _must(self, command: str) -> None:
        rc, out = self.control(command)
        if rc != 0:
            raise MpsError(f"MPS rejected {command!r}: {out}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def health(self) -> tuple[bool, str]:
        """Readiness: the control daemon runs and answered its pipe within ``ANSWER_FRESH_S``."""
        if not self.alive():
            return False, "MPS control daemon not running"
        if self.answered_at is None or time.monotonic() - self.answered_at > ANSWER_FRESH_S:
            return False, f"MPS control daemon has not answered for more than {ANSWER_FRESH_S:.0f} s"
        return True, "ok"

    def live(self) -> tuple[bool, str]:
        """Liveness: the supervisor (``run``) stepped within ``SUPERVISOR_STALL_S``; a dead or
        mute control daemon is its to restart, not a reason to end the pod."""
        stalled = time.monotonic() - self.ticked_at
        if stalled > SUPERVISOR_STALL_S:
            return False, f"the MPS daemon's supervisor has not run for {stalled:.0f} s"
        return True, "ok"

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.alive():
            self.control("quit", timeout_s=20)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc = None

    def cleanup(self) -> None:
        """Removes the pipe and log directories (on the host, through the job's hostPath), so a
        deleted job leaves no sockets behind for the next one."""
        for d in (self.pipe_dir, self.log_dir):
            shutil.rmtree(d, ignore_errors=True)

    def run(self, stop: threading.Event, poll_s: float = 2.0, max_restarts: int = 20) -> int:
        """Keeps the daemon up until ``stop``: a dead or mute daemon is started again."""
        self.ticked_at = time.monotonic()
        self.start()
        try:
            while not stop.wait(poll_s):
                self.ticked_at = time.monotonic()
                self.last_answer = self.alive() and self.control("get_server_list")[0] == 0
                metrics.MPS_UP.labels(str(self.pipe_dir)).set(int(self.last_answer))
                if self.last_answer:
                    self.answered_at = time.monotonic()
                    continue
                if self.restarts >= max_restarts:
                    log.error("MPS control daemon failed %d times: giving up", self.restarts)
                    return 1
                log.warning("MPS control daemon %s: starting it again",
                            "died" if not self.alive() else "stopped answering")
                self.stop()
                self.restarts += 1
                self.ticked_at = time.monotonic()
                self.start()
        finally:
            self.stop()
            if stop.is_set():  # SIGTERM = the job is going away; a crash keeps them for diagnosis
                self.cleanup()
        return 0
