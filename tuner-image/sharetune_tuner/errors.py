"""Errors the tuner reports to users: each maps to a clear message and a distinct exit code."""

from __future__ import annotations


class TunerError(RuntimeError):
    """A failure the user can act on; the CLI prints its message without a traceback."""

    exit_code = 2


class ModelError(TunerError):
    exit_code = 3


class TargetError(TunerError):
    exit_code = 4


class TrackerError(TunerError):
    exit_code = 5


class MpsError(TunerError):
    exit_code = 6
