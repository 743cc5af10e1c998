"""The one process-group helper: a stop reaches the whole group, records the leader's real exit
status, and escalates to SIGKILL after the grace period."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from sharetune.procs import ProcessGroup, pid_alive

# The leader forks a child that ignores SIGTERM (like a stuck TVM popen worker), prints its PID,
# and exits 3 on SIGTERM itself.
LEADER = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); \
time.sleep(60)"])
print(child.pid, flush=True)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))
time.sleep(60)
"""


def test_stop_takes_the_group_and_keeps_the_exit_status(tmp_path: Path) -> None:
    p = ProcessGroup("leader", [sys.executable, "-c", LEADER], tmp_path / "leader.log").start()
    deadline = time.monotonic() + 20
    while not (tmp_path / "leader.log").read_text().strip() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int((tmp_path / "leader.log").read_text().split()[0])
    assert p.alive() and pid_alive(child)
    p.stop(grace_s=5)
    assert p.poll() == 3  # the leader's own status, not 0
    deadline = time.monotonic() + 5
    while pid_alive(child) and time.monotonic() < deadline:  # orphaned: reaped by init
        time.sleep(0.05)
    assert not pid_alive(child) or open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_leader_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    p = ProcessGroup("stubborn", [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                  "signal.SIG_IGN); print('up', flush=True); time.sleep(60)"],
                     tmp_path / "s.log").start()
    deadline = time.monotonic() + 20
    while "up" not in (tmp_path / "s.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    t = time.monotonic()
    p.stop(grace_s=0.5)
    assert p.poll() == -9 and time.monotonic() - t < 5
    assert os.getpid() != p.pid
