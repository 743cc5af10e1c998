"""From what the cluster shows to the job's status: pure functions, unit-tested without a cluster."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from ..api.progress import Progress
from ..api.summary import Summary
from ..driver import Clamp

PENDING, RUNNING, MERGING, SUCCEEDED, FAILED = "Pending", "Running", "Merging", "Succeeded", "Failed"
FINAL = (SUCCEEDED, FAILED)


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def condition(conditions: list[dict[str, Any]], type_: str, status: str, reason: str, message: str,
              generation: int | None) -> list[dict[str, Any]]:
    """Sets one condition; lastTransitionTime only moves when the status changes (API conventions)."""
    out = [dict(c) for c in conditions]
    for c in out:
        if c["type"] == type_:
            if c["status"] != status:
                c["lastTransitionTime"] = now()
            c.update(status=status, reason=reason, message=message, observedGeneration=generation)
            return out
    out.append({"type": type_, "status": status, "reason": reason, "message": message,
                "observedGeneration": generation, "lastTransitionTime": now()})
    return out


@dataclass
class ShardView:
    index: int
    state: str = "starting"
    done: int = 0
    budget: int = 0
    best_s: float | None = None
    resumed: int = 0
    message: str = ""
    # The partition as the client computed it (the same in every shard): shards with a task to
    # tune, the model's tasks, those with trials. None until the client has extracted its tasks.
    useful_shards: int | None = None
    tasks_total: int | None = None
    tasks_to_tune: int | None = None
    # Measurement fidelity on a shared GPU (the client's window counts): per other job, candidates
    # measured while it was on the GPU; candidates measured alone / beside other jobs.
    co_tenants: dict[str, int] = field(default_factory=dict)
    measured_alone: int = 0
    measured_beside_others: int = 0
    # The tuning library: tasks this shard did not tune because it holds them, records it started from
    tasks_from_library: list[str] = field(default_factory=list)
    library_records: int = 0

    @classmethod
    def from_progress(cls, index: int, text: str | None) -> "ShardView":
        """The shard as its client's progress.json says (the contract's Progress); a shard with
        none yet, or an unreadable one, is starting."""
        p = Progress.from_json(text)
        if p is None:
            return cls(index)
        return cls(index, p.state, p.done, p.budget, p.best_s, p.resumed, p.message, p.useful_shards,
                   p.tasks_total, p.tasks_to_tune, dict(p.co_tenants), p.measured_alone, p.measured_beside_others,
                   list(p.tasks_from_library), p.library_records)

    def as_status(self) -> dict[str, Any]:
        d: dict[str, Any] = {"index": self.index, "state": self.state, "done": self.done, "budget": self.budget}
        if self.best_s is not None:
            d["bestLatencyUs"] = round(self.best_s * 1e6, 3)
        if self.measured_alone or self.measured_beside_others:  # GPU windows (pool and MPS modes)
            d.update(measuredAlone=self.measured_alone, measuredBesideOthers=self.measured_beside_others)
        if self.co_tenants:
            d["coTenants"] = dict(self.co_tenants)
        return d


@dataclass
class Observed:
    shards: list[ShardView]
    clients_succeeded: int = 0
    clients_failed_indexes: str | None = None
    clients_failed: bool = False
    clients_failed_message: str = ""
    merge_exists: bool = False
    merge_succeeded: bool = False
    merge_failed: bool = False
    merge_message: str = ""
    summary: Summary | None = None
    daemon_unschedulable: str | None = None  # the scheduler's message
    unschedulable: str | None = None  # "<component>: <scheduler's message>" of another pod of the job
    secret_problem: str | None = None  # the S3 credentials Secret is missing or lacks a key
    daemons: dict[str, "DaemonView"] = field(default_factory=dict)  # by GPU group ("0", "1", ...)
    client_shards: int = 0  # shards the clients run: clients.shards, or fewer once clamped
    clients_job_shards: int | None = None  # the clients' Job's completions (None: no Job seen)
    clients_finished: bool = False  # the clients' Job is Complete or Failed
    clamp: Clamp | None = None  # the shards report fewer shards with a task than clients.shards


def count_indexes(indexes: str | None, below: int) -> int:
    """How many of an Indexed Job's ``completedIndexes`` ("0-3,5") are below ``below``: indexes
    a clamped Job dropped may still be listed until its controller catches up."""
    n = 0
    for part in (indexes or "").split(","):
        if not part.strip():
            continue
        lo, _, hi = part.partition("-")
        a, b = int(lo), int(hi or lo)
        n += max(0, min(b, below - 1) - a + 1)
    return n


@dataclass
class DaemonView:
    state: str = "absent"  # "absent" | "running" | "failed" (pod ended or deleted) | "pending"
    restarts: int = 0  # container restarts the kubelet did in place


def started(shards: list[ShardView]) -> bool:
    """Some shard is tuning or done: the job's pods could start."""
    return any(s.state in ("tuning", "done") for s in shards)


def mps_recovery(daemon: DaemonView, phase: str | None, seen_restarts: int) -> tuple[bool, bool]:
    """What an MPS daemon fault needs: (recreate the daemon pod, restart the servers).

    The servers' CUDA contexts live inside the daemon's MPS server: when the daemon dies, in-place
    (kubelet restart) or for good (pod failed, evicted or deleted), every server is left with a
    dead context and must be restarted against the new daemon. A bare Pod is not recreated by
    anyone else, so a failed or missing one is the operator's to replace."""
    if phase not in (PENDING, RUNNING):
        return False, False
    recreate = daemon.state in ("absent", "failed")
    return recreate, recreate or daemon.restarts > seen_restarts


def progress_fields(obs: Observed, started: str | None) -> dict[str, Any]:
    done = sum(s.done for s in obs.shards)
    budget = sum(s.budget for s in obs.shards)
    fields: dict[str, Any] = {"shards": [s.as_status() for s in obs.shards], "trialsCompleted": done,
                              "trialsTotal": budget,
                              "progressPercent": int(100 * done / budget) if budget else 0}
    library = sum(s.library_records for s in obs.shards)
    if library or any(s.tasks_from_library for s in obs.shards):  # a job with a tuning library
        fields["libraryRecords"] = library
        fields["tasksFromLibrary"] = sorted(t for s in obs.shards for t in s.tasks_from_library)
    if started:
        t0 = dt.datetime.fromisoformat(started.replace("Z", "+00:00"))
        elapsed = (dt.datetime.now(dt.timezone.utc) - t0).total_seconds()
        fresh = done - sum(s.resumed for s in obs.shards if s.state != "starting")
        if elapsed > 0:
            fields["trialsPerSecond"] = round(max(fresh, done) / elapsed, 4)
    return fields


def result_message(summary: Summary) -> str:
    """What the result is worth, plainly: a speed-up, or that tuning did not beat the defaults."""
    if summary.is_improved:
        return f"{summary.speedup}x faster than untuned"
    measured = summary.speedup_of_records
    return ("not faster than untuned: tuning did not beat TVM's default schedules at this budget"
            + (f" (the tuned records measured {measured}x)" if measured is not None else "")
            + "; the result keeps the default schedules; try a larger trials.total")


def fetch_command(namespace: str, name: str) -> str:
    """How users get a finished job's result (``sharetune result``, tuner-image/sharetune_tuner/result.py):
    the best records as a MetaSchedule database; ``compile`` instead of ``fetch`` builds the model too."""
    return f"sharetune result fetch tj/{name} -n {namespace} -o DIR"


def result_fields(summary: Summary, namespace: str | None = None, name: str | None = None) -> dict[str, Any]:
    """The merge summary's figures in the job's status: the delivered model's latency and
    speed-up (1.0 when tuning did not beat the defaults), which tasks kept their defaults, and
    (given the job's namespace and name) the command that fetches the result."""
    out: dict[str, Any] = {"bestSpeedup": summary.speedup, "untunedLatencyMs": summary.latency_untuned_ms,
                           "tunedLatencyMs": summary.latency_tuned_ms, "trialsCompleted": summary.records,
                           "improved": summary.is_improved}
    if namespace and name:
        out["fetchCommand"] = fetch_command(namespace, name)
    if summary.speedup_of_records is not None:
        out["recordsSpeedup"] = summary.speedup_of_records
    out["tasksLeftAtDefault"] = list(summary.tasks_left_at_default)
    out["tasksDefaultWon"] = list(summary.tasks_default_won)
    if summary.tasks_from_library:  # what was delivered from the library, re-measured by the merge
        out["tasksFromLibrary"] = list(summary.tasks_from_library)
    return out


def improved_condition(conditions: list[dict[str, Any]], summary: Summary,
                       generation: int | None) -> list[dict[str, Any]]:
    """The ``Improved`` condition: True when the result is faster than the untuned model."""
    if summary.is_improved:
        return condition(conditions, "Improved", "True", "FasterThanUntuned", result_message(summary), generation)
    return condition(conditions, "Improved", "False", "NotFasterThanUntuned", result_message(summary), generation)


# What a user checks when a cuda job's pods find no GPU (after the scheduler's own words).
GPU_HINT = ("; no node has a free nvidia.com/gpu for it: check the GPU nodes' allocatable nvidia.com/gpu "
            "(kubectl describe nodes; the NVIDIA device plugin must run there), that spec.nodeSelector and "
            "spec.tolerations match them, and which pods hold their GPUs")


def next_phase(current: str | None, obs: Observed, shards: int) -> tuple[str, str, str]:
    """(phase, reason, message) the job should be in now."""
    if current in FINAL:
        return current, "", ""
    if obs.clients_failed:
        why = "; ".join(f"shard {s.index}: {s.message}" for s in obs.shards if s.state == "failed" and s.message)
        reason = "OutputTooLarge" if "more than a ConfigMap holds" in why else "ShardFailed"
        return FAILED, reason, (f"shard(s) {obs.clients_failed_indexes or '?'} failed after their retries: "
                                f"{why or obs.clients_failed_message}")
    if obs.merge_failed:
        return FAILED, "MergeFailed", obs.merge_message or "the merge job failed"
    if obs.merge_succeeded:
        if obs.summary is None:
            return FAILED, "ResultMissing", "the merge job succeeded but its summary is not in the output store"
        return SUCCEEDED, "Merged", f"{obs.summary.records} trials merged; {result_message(obs.summary)}"
    if obs.clients_succeeded >= shards:
        return MERGING, "ShardsDone", f"all {shards} shards done; merging"
    if obs.daemon_unschedulable:
        return PENDING, "GpuUnavailable", f"the MPS daemon cannot be scheduled: {obs.daemon_unschedulable}{GPU_HINT}"
    tuning = started(obs.shards)
    # Pods that can never start must say so instead of leaving the job silently Pending.
    if obs.secret_problem and not tuning:
        return PENDING, "SecretMissing", obs.secret_problem
    if obs.unschedulable and not tuning:
        gpu = "nvidia.com/gpu" in obs.unschedulable
        return (PENDING, "GpuUnavailable" if gpu else "Unschedulable",
                f"cannot be scheduled: {obs.unschedulable}{GPU_HINT if gpu else ''}")
    if tuning:
        return RUNNING, "Tuning", "clients are tuning"
    return (current or PENDING), "Starting", "waiting for tracker, servers and clients"
