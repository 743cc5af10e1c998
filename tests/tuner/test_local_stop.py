"""A local run stopped by SIGTERM (``timeout``, ``kill``, a CI job's cancel) stops every process it
started: each runs in a session of its own, so nothing else would (found by running the quickstart
under ``timeout``: its tracker, servers, build service and clients outlived it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from ..helpers import wait_for
from .conftest import EXAMPLE, example_job


def _children(pid: int) -> set[int]:
    """Live processes whose parent is ``pid`` (the run's tracker, servers, build service, clients:
    each in a session of its own, so only the parent link names them)."""
    out = set()
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                out.add(int(p.name))
    return out


def _alive(pids: set[int]) -> set[int]:
    left = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if state[state.rindex(")") + 2] != "Z":
            left.add(pid)
    return left


def test_sigterm_stops_the_whole_local_run(tmp_path: Path) -> None:
    work = tmp_path / "run"
    started: set[int] = set()
    p = subprocess.Popen([sys.executable, "-m", "sharetune.cli", "run", str(EXAMPLE), "--local",
                          "--workdir", str(work)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # tracker + 2 servers + build service + 2 clients
        def all_started() -> set[int] | None:
            c = _children(p.pid)
            return c if len(c) >= 6 else None

        started = wait_for("the run's processes started", all_started, timeout_s=120)
        p.send_signal(signal.SIGTERM)
        out = p.communicate(timeout=60)[0].decode(errors="replace")
        assert p.returncode == 128 + signal.SIGTERM, out[-2000:]
        assert "interrupted: stopped by signal SIGTERM; stopping the run" in out, out[-2000:]
        wait_for("every process of the run gone", lambda: not _alive(started), timeout_s=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        for pid in _alive(started):  # what a failing run left: each leads its own process group
            os.killpg(pid, signal.SIGKILL)


def test_ctrl_c_says_the_run_was_interrupted(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the run alone: its processes each lead a session of their own) prints why
    the run stopped, not a bare "failed:", exits 130 as a shell reports it, and stops the run."""
    job = example_job(tmp_path, servers={"replicas": 1}, clients={"shards": 1},
                      trials={"total": 10000, "perTask": 2000, "perIteration": 4})  # still tuning when stopped
    started: set[int] = set()
    # Python raises KeyboardInterrupt on SIGINT only when the signal was not ignored at its start
    # (as in a background job of a non-interactive shell): give the run SIGINT's default.
    p = subprocess.Popen([sys.executable, "-m", "sharetune.cli", "run", str(job), "--local", "--workdir",
                          str(tmp_path / "run")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        def tuning() -> set[int] | None:  # tracker + server + client
            c = _children(p.pid)
            return c if len(c) >= 3 else None

        started = wait_for("the run's processes started", tuning, timeout_s=120)
        p.send_signal(signal.SIGINT)
        out = p.communicate(timeout=60)[0].decode(errors="replace")
        assert p.returncode == 130, out[-2000:]
        assert ("interrupted: Ctrl-C; stopping the run (its records stay in " in out
                and "failed:" not in out), out[-2000:]
        wait_for("every process of the run gone", lambda: not _alive(started), timeout_s=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        for pid in _alive(started):
            os.killpg(pid, signal.SIGKILL)
