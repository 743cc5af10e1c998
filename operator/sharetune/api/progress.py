"""A shard's progress, the one wire format between a tuning client and whoever follows it (the
operator's status loop, local mode): the client writes ``progress.json`` only through
:meth:`Progress.write` and readers parse it only through :meth:`Progress.from_json`.

Versioned: ``version`` says which fields a writer knew. A reader takes the fields it knows and
ignores the others, so a newer client's file still reads (its new fields are not seen), and an
older client's file reads with the missing fields at their defaults. Text that is not a progress
object reads as ``None``: a half-synced or foreign file never stops a status tick."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .wire import parse_object, write_atomic

VERSION = 1


@dataclass
class TaskProgress:
    name: str
    workload_hash: str
    budget: int
    done: int
    best_s: float | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskProgress:
        best = d.get("best_s")
        return cls(str(d.get("name", "")), str(d.get("workload_hash", "")), int(d.get("budget", 0)),
                   int(d.get("done", 0)), None if best is None else float(best))


@dataclass
class Progress:
    job: str
    shard: int
    shards: int
    state: str = "starting"  # starting, tuning, done, failed
    budget: int = 0
    done: int = 0
    resumed: int = 0  # trials found in the database at start
    errors: int = 0
    started_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    tasks: list[TaskProgress] = field(default_factory=list)
    message: str = ""
    # The same in every shard (each computes the same partition): how many shards have a task to
    # tune (exactly shards 0..useful_shards-1), of the model's tasks_total tasks the budgets give
    # trials to tasks_to_tune. The operator scales the clients' Job down to useful_shards.
    useful_shards: int | None = None
    tasks_total: int | None = None
    tasks_to_tune: int | None = None
    phases: dict[str, float] = field(default_factory=dict)  # MetaSchedule profiler totals, seconds
    # Measurement fidelity on a shared GPU (measure/window.py): per other job, how many of this
    # shard's candidates were measured while it was on the GPU; candidates measured with no other
    # job there; measurements that waited past a merge's exclusive window (unfenced) and the wait.
    co_tenants: dict[str, int] = field(default_factory=dict)
    measured_alone: int = 0
    measured_beside_others: int = 0
    window_wait_s: float = 0.0
    unfenced: int = 0
    # Where the start-up went, seconds (process start to run_client, extraction, tensor
    # intrinsics, tracker wait, first round's records): start-up is fixed cost on every shard.
    startup: dict[str, Any] = field(default_factory=dict)
    # The tuning library (spec.library): tasks not tuned because it holds them (reuse), and the
    # library records this shard started from (its tasks' first rounds and its cost model).
    tasks_from_library: list[str] = field(default_factory=list)
    library_records: int = 0
    # Records of the job's other shards this shard's cost model learnt from (peer_records.py).
    peer_records: int = 0
    version: int = VERSION

    @property
    def best_s(self) -> float | None:
        """The fastest measured candidate over the shard's tasks (None before any)."""
        best = [t.best_s for t in self.tasks if t.best_s]
        return min(best) if best else None

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    def write(self, path: Path) -> None:
        self.updated_at = time.time()
        write_atomic(path, self.to_json())

    @classmethod
    def from_json(cls, text: str | bytes | None) -> Progress | None:
        """The progress in ``text``; None when it is empty or not a progress object."""
        return parse_object(text, cls.from_dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Progress:
        known = {f.name for f in fields(cls)} - {"job", "shard", "shards"}
        kw: dict[str, Any] = {k: v for k, v in d.items() if k in known and v is not None}
        for name in _INTS:
            if name in kw:
                kw[name] = int(kw[name])
        for name in _OPTIONAL_INTS:
            kw[name] = None if d.get(name) is None else int(d[name])
        for name in ("state", "message"):
            if name in kw:
                kw[name] = str(kw[name])
        co = kw.get("co_tenants")
        kw["co_tenants"] = {str(k): int(v) for k, v in co.items()} if isinstance(co, dict) else {}
        kw["tasks"] = [TaskProgress.from_dict(t) for t in d.get("tasks") or [] if isinstance(t, dict)]
        lib = d.get("tasks_from_library")
        kw["tasks_from_library"] = [str(t) for t in lib] if isinstance(lib, list) else []
        kw.setdefault("version", 0)  # written before the field existed
        return cls(job=str(d.get("job", "")), shard=int(d.get("shard", 0)), shards=int(d.get("shards", 1)), **kw)


_INTS = ("budget", "done", "resumed", "errors", "library_records", "peer_records", "measured_alone",
         "measured_beside_others", "unfenced", "version")
_OPTIONAL_INTS = ("useful_shards", "tasks_total", "tasks_to_tune")
