"""Exit codes of the tuner's commands: one registry, read by the tuner (which exits with them),
the operator's pod specs and local mode (which tell a user error from a transient fault by them).

0 is success; 1 an unexpected failure (a traceback: a bug or a transient fault worth a retry).
Every other code is a failure the user must act on, and retrying the same pod cannot fix it.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    UNEXPECTED = 1
    USAGE = 2  # a bad spec or command line
    MODEL = 3  # the model cannot be loaded, imported or tuned
    TARGET = 4  # the target cannot be made here (no GPU for cuda)
    TRACKER = 5  # no RPC server reachable through the tracker
    MPS = 6  # the MPS control daemon cannot run
    OUTPUT_TOO_LARGE = 7  # the records do not fit a ConfigMap
    STORE = 8  # the output store cannot be reached or refuses


# Failures a retry of the same pod cannot fix: the spec, the model or the output is wrong.
PERMANENT: frozenset[ExitCode] = frozenset({ExitCode.USAGE, ExitCode.MODEL, ExitCode.OUTPUT_TOO_LARGE})

# What local mode does not restart either: it runs every process on this one machine, so a target
# it cannot make here (target cuda without a GPU) stays missing however often a client restarts.
# (A cluster retries it, as PERMANENT leaves it: the Job's next pod may be scheduled elsewhere.)
NOT_RESTARTED_LOCALLY: frozenset[ExitCode] = PERMANENT | {ExitCode.TARGET}


def passed_on(rc: int | None) -> ExitCode:
    """The code a supervisor (local mode) exits with when a process it ran failed with ``rc``: the
    process's own where it is a user error of this registry, else UNEXPECTED (a traceback, a kill
    by a signal: negative)."""
    if rc is None or rc == ExitCode.OK or rc not in set(ExitCode):
        return ExitCode.UNEXPECTED
    return ExitCode(rc)
