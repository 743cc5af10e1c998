"""Operator metrics (prometheus-client): jobs by phase, reconcile time, errors, children."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

JOBS = Gauge("sharetune_operator_jobs", "TuningJobs seen, by phase", ["phase"])
RECONCILE = Histogram("sharetune_operator_reconcile_seconds", "Time per reconcile", ["handler"],
                      buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10))
ERRORS = Counter("sharetune_operator_errors", "Reconcile errors", ["handler", "reason"])
CHILDREN = Counter("sharetune_operator_children_created", "Child objects created", ["kind"])
TRANSITIONS = Counter("sharetune_operator_phase_transitions", "Phase transitions", ["phase"])


class JobPhases:
    """Jobs by phase, kept from the watch stream itself (no extra API calls): the JOBS gauge."""

    PHASES = ("Pending", "Running", "Merging", "Succeeded", "Failed")

    def __init__(self) -> None:
        self._by_uid: dict[str, str] = {}

    def observe(self, uid: str, phase: str | None, deleted: bool) -> None:
        if deleted:
            self._by_uid.pop(uid, None)
        else:
            self._by_uid[uid] = phase or "Pending"
        counts = dict.fromkeys(self.PHASES, 0)
        for p in self._by_uid.values():
            counts[p] = counts.get(p, 0) + 1
        for p, n in counts.items():
            JOBS.labels(p).set(n)
