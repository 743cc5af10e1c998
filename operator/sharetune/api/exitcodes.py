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
