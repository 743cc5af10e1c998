"""Process plumbing shared by the control-plane harness and the tuner's local mode (stdlib only:
the tuner image imports it without the operator's dependencies)."""

from __future__ import annotations

import os
import signal
import socket
import time


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
    except ProcessLookupError:
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
