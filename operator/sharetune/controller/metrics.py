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

# GPU pools (mode pool, docs/gpu-pools.md): the ledger after each status tick.
GPU_SHARE = Gauge("sharetune_gpu_allocated_share_percent", "Share of a GPU booked by pool-mode jobs",
                  ["node", "gpu"])
GPU_QUEUE = Gauge("sharetune_gpu_queue_length", "Pool-mode jobs waiting for a GPU share")
GPU_WAIT = Histogram("sharetune_gpu_wait_seconds", "Time from a job's creation to its GPU share's admission",
                     buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200))
