"""Errors sharetune reports to users, from the tuner's processes and from local mode alike: each
maps to a clear message and a distinct exit code (the registry: ``sharetune.api.exitcodes``)."""

from __future__ import annotations

from .exitcodes import ExitCode


class TunerError(RuntimeError):
    """A failure the user can act on; the CLI prints its message without a traceback."""

    exit_code: ExitCode = ExitCode.USAGE


class ModelError(TunerError):
    exit_code = ExitCode.MODEL


class TargetError(TunerError):
    exit_code = ExitCode.TARGET


class TrackerError(TunerError):
    exit_code = ExitCode.TRACKER


class MpsError(TunerError):
    exit_code = ExitCode.MPS
