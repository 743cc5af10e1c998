"""Errors the tuner reports to users: each maps to a clear message and a distinct exit code
(the registry: ``sharetune.api.exitcodes``)."""

from __future__ import annotations

# Defined with the contract (local mode raises them too, without importing the tuner); the
# tuner's modules import them from here.
from sharetune.api.errors import ModelError, MpsError, TargetError, TrackerError, TunerError

__all__ = ["ModelError", "MpsError", "TargetError", "TrackerError", "TunerError"]
