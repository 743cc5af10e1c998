"""Processes in process groups of their own: the one helper for every process sharetune starts
(local mode, the developer tooling's control plane and process kubelet, tests, benchmarks).

Stdlib only, and nothing else of sharetune: the tuner image imports it without the operator's
dependencies. A process is started in a session of its own, so its process group is exactly the
process and the children it forks (TVM's popen workers, an MPS server): stopping the group stops
them all, and nothing is ever stopped by name.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(pid: int, grace_s: float = 10.0) -> None:
    """SIGTERM the process group led by ``pid``, then SIGKILL what is left after ``grace_s``
    (children such as TVM's popen workers included)."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                break
        except ChildProcessError:  # not our child (CLI `down`): poll for its exit instead
            if not pid_alive(pid):
                break
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Sends ``sig`` to the process group led by ``pid`` (fault injection: a crash, not a stop)
    and reaps the leader if it is our child and died."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        return
    if sig == signal.SIGKILL:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


@dataclass
class ProcessGroup:
    """A command run as the leader of its own process group, its output appended to ``log``."""

    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] | None = None  # None: this process's environment
    cwd: Path | None = None
    popen: subprocess.Popen[bytes] | None = None
    restarts: int = 0  # times a supervisor (local mode, the process kubelet) started it again

    def start(self) -> "ProcessGroup":
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=self.env, cwd=self.cwd, start_new_session=True)
        return self

    @property
    def pid(self) -> int | None:
        return None if self.popen is None else self.popen.pid

    def poll(self) -> int | None:
        """The exit status once the leader has exited, else None (also before ``start``)."""
        return None if self.popen is None else self.popen.poll()

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def wait(self, timeout_s: float | None = None) -> int:
        assert self.popen is not None, f"{self.name} was never started"
        return self.popen.wait(timeout_s)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the group, SIGKILL it after ``grace_s``; what is left of the group after the
        leader exited (an orphaned worker) goes too. The leader is reaped through Popen, so
        ``poll()`` afterwards is its real exit status."""
        if self.popen is None:
            return
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.popen.wait()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """A crash, not a stop: ``sig`` to the whole group, no grace (fault injection)."""
        if self.popen is None:
            return
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            return
        if sig == signal.SIGKILL:
            self.popen.wait()

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def state(self) -> str:
        return "running" if self.alive() else f"exited ({self.poll() if self.popen else 'never started'})"


def stop_all(procs: list[ProcessGroup], grace_s: float = 10.0) -> None:
    """Stops ``procs`` in reverse start order (clients before the services they use)."""
    for p in reversed(procs):
        p.stop(grace_s)


def stop_untracked_children(tracked: set[int]) -> list[int]:
    """SIGKILLs the process group of every live child of this process that leads its own group
    (as :class:`ProcessGroup` starts them) and is not in ``tracked``: one whose start was cut
    short by a signal after the fork, before its Popen was recorded. Linux (/proc); returns them."""
    me, out = os.getpid(), []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) in tracked:
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, ...
        pid = int(d.name)
        if fields[0] != "Z" and int(fields[1]) == me and int(fields[2]) == pid:
            try:
                os.killpg(pid, signal.SIGKILL)
                out.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
    for pid in out:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    return out
