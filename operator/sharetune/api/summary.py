"""A job's result summary, the one wire format between the merge and whoever reads its result (the
operator's status, local mode's table, ``sharetune result``): the merge writes ``summary.json``
only through :meth:`Summary.write` and readers parse it only through :meth:`Summary.from_json`.

Versioned like :mod:`.progress`: a reader takes the fields it knows and ignores the others, and a
summary written before a field existed reads with it at its default (``improved`` None: an older
merge without the never-slower rule, whose speed-up says whether it improved). Text that is not a
summary object reads as ``None``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .wire import parse_object, write_atomic

VERSION = 1
TUNED, UNTUNED = "tuned", "untuned"  # what the merge delivered


@dataclass
class TaskSummary:
    """One extracted task: its budget and trials, its best measured candidate, and the merge's
    verdict between TVM's default schedule and the tuned one (``winner``)."""

    name: str
    workload_hash: str = ""
    weight: int = 1
    flops: float = 0.0
    budget: int = 0
    trials: int = 0
    best_latency_us: float | None = None
    default_us: float | None = None
    tuned_us: float | None = None
    winner: str = ""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskSummary:
        def opt(k: str) -> float | None:
            return None if d.get(k) is None else float(d[k])

        return cls(str(d.get("name", "")), str(d.get("workload_hash", "")), int(d.get("weight") or 1),
                   float(d.get("flops") or 0.0), int(d.get("budget") or 0), int(d.get("trials") or 0),
                   opt("best_latency_us"), opt("default_us"), opt("tuned_us"), str(d.get("winner") or ""))


@dataclass
class Summary:
    job: str = ""
    model: str = ""
    input_shape: list[int] = field(default_factory=list)
    target: str = ""
    shards: int = 0
    records: int = 0  # trials merged
    failed_trials: int = 0
    workloads: int = 0
    best_records: int = 0  # records delivered (0 when the untuned model is)
    candidate_records: int = 0
    # The delivered model: the tuned one when it is faster, else the untuned one (speed-up 1.0).
    improved: bool | None = None
    delivered: str = UNTUNED
    latency_untuned_ms: float | None = None
    latency_tuned_ms: float | None = None
    speedup: float | None = None
    # What the kept records measured as a model, delivered or not (None: no record beat its default).
    latency_records_ms: float | None = None
    speedup_of_records: float | None = None
    max_relative_error: float | None = None
    tasks: list[TaskSummary] = field(default_factory=list)
    tasks_left_at_default: list[str] = field(default_factory=list)
    tasks_default_won: list[str] = field(default_factory=list)
    # The tuning library (spec.library): tasks whose delivered record came from it (re-measured here
    # like any record), and the records this job added to it.
    tasks_from_library: list[str] = field(default_factory=list)
    library_records_added: int | None = None
    merge_s: float | None = None
    # The delivered model at each MPS serving share ({pct: ms or None}; None: not measurable here)
    # and how (sharetune_tuner.measure.serving.report); how the merge's latencies were measured.
    latency_ms_by_serving_pct: dict[str, float | None] | None = None
    serving_report: dict[str, Any] = field(default_factory=dict)
    measurement: dict[str, Any] = field(default_factory=dict)
    # Local mode's run: the tuning's wall time and rate.
    tuning_s: float | None = None
    trials_per_s: float | None = None
    version: int = VERSION

    @property
    def is_improved(self) -> bool:
        """The delivered model is faster than the untuned one (a summary without ``improved``:
        its speed-up says it)."""
        if self.improved is not None:
            return self.improved
        return (self.speedup or 0.0) > 1

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def write(self, path: Path) -> None:
        write_atomic(path, self.to_json())

    @classmethod
    def from_json(cls, text: str | bytes | None) -> Summary | None:
        """The summary in ``text``; None when it is empty or not a summary object."""
        return parse_object(text, cls.from_dict)

    @classmethod
    def read(cls, path: Path) -> Summary | None:
        return cls.from_json(path.read_text()) if path.is_file() else None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Summary:
        kw: dict[str, Any] = {k: v for k, v in d.items() if k in _KNOWN and v is not None}
        for name in _INTS:
            if name in kw:
                kw[name] = int(kw[name])
        for name in _FLOATS:
            if name in kw:
                kw[name] = float(kw[name])
        for name in ("job", "model", "target", "delivered"):
            if name in kw:
                kw[name] = str(kw[name])
        if "improved" in kw:
            kw["improved"] = bool(kw["improved"])
        kw["input_shape"] = [int(x) for x in d.get("input_shape") or []]
        kw["tasks"] = [TaskSummary.from_dict(t) for t in d.get("tasks") or [] if isinstance(t, dict)]
        for name in ("tasks_left_at_default", "tasks_default_won"):
            kw[name] = [str(t) for t in d.get(name) or []]
        lat = d.get("latency_ms_by_serving_pct")
        kw["latency_ms_by_serving_pct"] = ({str(k): None if v is None else float(v) for k, v in lat.items()}
                                           if isinstance(lat, dict) else None)
        for name in ("serving_report", "measurement"):
            kw[name] = dict(d[name]) if isinstance(d.get(name), dict) else {}
        kw.setdefault("version", 0)  # written before the field existed
        return cls(**kw)


_KNOWN = {f.name for f in fields(Summary)}
_INTS = ("shards", "records", "failed_trials", "workloads", "best_records", "candidate_records", "version")
_FLOATS = ("latency_untuned_ms", "latency_tuned_ms", "speedup", "latency_records_ms", "speedup_of_records",
           "max_relative_error", "merge_s", "tuning_s", "trials_per_s")
