"""How a local run (`sharetune run --local`, one job or several) is stopped by a signal: Ctrl-C
(SIGINT), or SIGTERM from `timeout`, `kill` or a CI job's cancel, turned into the same
KeyboardInterrupt so one handler stops the run's process groups, and what it then says."""

from __future__ import annotations

import signal
from typing import Any


class Stopped(KeyboardInterrupt):
    """A stop by a signal other than SIGINT (which Python raises as a bare KeyboardInterrupt)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by signal {signal.Signals(signum).name}")
        self.signum = signum


def raise_stopped(signum: int, _frame: Any) -> None:
    """A signal handler (for SIGTERM): the run's processes each run in a session of their own, so
    nothing but the run itself would stop them."""
    raise Stopped(signum)


def interrupted(e: KeyboardInterrupt) -> tuple[str, int]:
    """Why the run stopped, and the code it exits with: 128 + the signal's number, as a shell
    reports a process that a signal ended (130 for Ctrl-C, 143 for SIGTERM)."""
    if isinstance(e, Stopped):
        return str(e), 128 + e.signum
    return "Ctrl-C", 128 + signal.SIGINT
