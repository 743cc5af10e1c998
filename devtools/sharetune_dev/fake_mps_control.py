"""A stand-in for ``nvidia-cuda-mps-control`` on machines without NVIDIA's driver (a MOCK, used
only because the real binary cannot run without a GPU; the real one is exercised on the H200).

It speaks the two ways sharetune uses the real one: ``-f`` runs the daemon in the foreground
until it is killed; without arguments it reads one command from stdin, answers it when the
foreground daemon is alive (``quit`` stops it), and fails like the real client when none is.
Every command it answers is appended to ``fake-control.commands`` in the pipe directory, so a
test can check what the daemon was told (e.g. a default thread percentage, which caps clients).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path


def pid_file() -> Path:
    return Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/mps-pipe")) / "fake-control.pid"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def main() -> int:
    if sys.argv[1:] == ["-f"]:
        pid_file().parent.mkdir(parents=True, exist_ok=True)
        pid_file().write_text(str(os.getpid()))
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while True:
            time.sleep(3600)
    command = sys.stdin.readline().strip()
    try:
        pid = int(pid_file().read_text())
    except (OSError, ValueError):
        pid = 0
    if not pid or not alive(pid):
        print("Cannot find MPS control daemon process", file=sys.stderr)
        return 1
    with open(pid_file().with_name("fake-control.commands"), "a") as log:
        log.write(command + "\n")
    if command == "quit":
        os.kill(pid, signal.SIGTERM)
    print("0" if command == "get_server_list" else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
