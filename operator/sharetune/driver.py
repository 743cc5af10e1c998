"""The rules that run a TuningJob's shards, stated once for both orchestrators: the operator's
status loop (``controller/``) and local mode (``sharetune.local``) apply these decisions,
each with its own means (a Job patch or a process stop, a pod's retry or a process restart).
Pure: no kopf, no kubernetes client, no TVM.

- **Clamp**: once a client has reported its partition (every client computes the same one), the
  shards without a task to tune stop and the merge reads only the others (:func:`shard_clamp`).
- **Restart or fail**: a client that exits 0 is done; one that exits with a user error of
  :mod:`.api.exitcodes` fails the job with that error, at once; any other failure is retried from
  the client's records, a bounded number of times (:func:`client_exit`). The operator states the
  same rule to Kubernetes: the clients' Job fails an index on a permanent code
  (``podFailurePolicy``) and retries others up to ``clients.backoffLimitPerIndex``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from .api.exitcodes import NOT_RESTARTED_LOCALLY, PERMANENT, ExitCode


class ShardReport(Protocol):
    """What a shard's progress says about the partition (``api.progress.Progress`` and the
    operator's ``ShardView`` both carry it): None until the client has extracted its tasks."""

    @property
    def useful_shards(self) -> int | None: ...

    @property
    def tasks_total(self) -> int | None: ...

    @property
    def tasks_to_tune(self) -> int | None: ...


@dataclass(frozen=True)
class Clamp:
    shards: int  # shards with a task to tune: 0..shards-1
    message: str


def shard_clamp(spec_shards: int, shards: Sequence[ShardReport], asked: int | None = None) -> Clamp | None:
    """The clamp of ``clients.shards`` to the shards that have a task to tune, once a client has
    reported its partition; None while none has, or when every shard has a task. The partition
    leaves shards empty only from the highest index down (``partition.useful_shards``), so the
    clients keep every task when the highest shards stop. ``asked``: clients.shards as written,
    when the budget sized the job below it (the message)."""
    reported = [s for s in shards if s.useful_shards is not None]
    if not reported:
        return None
    r = min(reported, key=lambda s: s.useful_shards or 0)
    k = max(1, r.useful_shards or 0)
    if k >= spec_shards:
        return None
    tasks = r.tasks_to_tune if r.tasks_to_tune is not None else k
    rest = (f" (the budget gives trials to {tasks} of the model's {r.tasks_total} tasks; the rest keep TVM's "
            f"defaults)" if r.tasks_total is not None and r.tasks_total > tasks else "")
    plural = "s" if k != 1 else ""
    return Clamp(k, f"clients.shards {asked or spec_shards} > {tasks} tasks to tune: "
                    f"clamped to {k} shard{plural}{rest}")


class Verdict(Enum):
    DONE = "done"  # exited 0: the shard is tuned
    RESTART = "restart"  # a crash or transient fault: again, from the shard's records
    FAIL = "fail"  # a user error a retry cannot fix: the job fails with it, at once
    GIVE_UP = "give-up"  # a crash or fault again, with no attempt left: the job fails


def client_exit(rc: int, attempts: int, max_attempts: int, one_machine: bool = False) -> Verdict:
    """What a client's exit code ``rc`` means for its shard after ``attempts`` runs of it (the
    first run is attempt 1). ``one_machine``: every attempt runs where this one did (local mode),
    so a target this machine cannot make (cuda without a GPU) is not retried either; a cluster
    retries it, as the next pod may land on another node."""
    if rc == ExitCode.OK:
        return Verdict.DONE
    if rc in (NOT_RESTARTED_LOCALLY if one_machine else PERMANENT):
        return Verdict.FAIL
    return Verdict.RESTART if attempts < max_attempts else Verdict.GIVE_UP
