"""The client's MetaSchedule measure callbacks, as module-level classes with constructor state
(like ``builder.PooledBuilder``): ``@derived_object`` builds the Python instance from the
constructor's arguments, and MetaSchedule calls its ``apply`` after each measured batch.

  ProgressCallback   counts each task's trials, its best latency and the phases into progress + /metrics
  CostModelUpdate    stock ``UpdateCostModel``, except after the shard's very last batch
  StoreBatch, CommitBatch   stock ``AddToDatabase`` split around the cost-model update, storing
                     each batch before the database commits it (write_ahead.py); they share a
                     ``WriteAhead``
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from .. import metrics
from ..store.write_ahead import RecordLines, StoreAhead, tuning_records
from .window import MeasureLog

if TYPE_CHECKING:  # client.py imports this module
    from ..client import ClientConfig, Progress, TaskProgress

log = logging.getLogger("sharetune.write_ahead")

# MetaSchedule profiler scopes -> the phases of sharetune_phase_seconds.
PHASES = {"GenerateMeasureCandidates": "search", "SendToBuilder": "build", "SendToRunner": "run",
          "JoinRunnerFutures": "run", "UpdateCostModel": "cost_model"}


class PhaseExport:
    """Exports a shard's profiler totals into the per-phase counters. The totals are cumulative
    over the shard (one profiler for all its tasks): only their growth since the last export is
    added, so one ``PhaseExport`` serves all the shard's progress callbacks."""

    def __init__(self, job: str, shard: int) -> None:
        self.job, self.shard = job, str(shard)
        self.exported: dict[str, float] = {}

    def __call__(self, table: dict[str, float]) -> None:
        for name, secs in table.items():
            phase = next((p for k, p in PHASES.items() if k in name), None)
            if phase is None:
                continue
            delta = float(secs) - self.exported.get(name, 0.0)
            if delta > 0:
                metrics.PHASE_SECONDS.labels(self.job, self.shard, phase).inc(delta)
                self.exported[name] = float(secs)


def count_windows(progress: Progress, entries: list[dict[str, Any]]) -> None:
    """The runner's window notes (measure_window.note) into the shard's progress report."""
    for e in entries:
        others = e.get("with") or []
        for job in others:
            progress.co_tenants[job] = progress.co_tenants.get(job, 0) + 1
        if others:
            progress.measured_beside_others += 1
        else:
            progress.measured_alone += 1
        progress.unfenced += 0 if e.get("fenced", True) else 1
        progress.window_wait_s = round(progress.window_wait_s + float(e.get("waited_s") or 0.0), 3)


@derived_object
class ProgressCallback(ms.measure_callback.PyMeasureCallback):
    """After each batch of task ``task_id`` (``tasks[task_id]``: the ``tune_tasks`` call's tasks in
    order): its trials, errors and best latency into ``progress`` (written to ``path``) and
    /metrics, then ``cfg.on_round`` (the sync uploads the progress)."""

    def __init__(self, cfg: ClientConfig, progress: Progress, tasks: list[TaskProgress], path: Path,
                 phases: PhaseExport | None = None, windows: MeasureLog | None = None) -> None:
        super().__init__()
        self.cfg, self.progress, self.tasks, self.path = cfg, progress, tasks, path
        self.phases = phases or PhaseExport(cfg.job, cfg.shard)
        self.windows = windows

    def apply(self, task_scheduler: Any, task_id: int, measure_candidates: Any,
              builder_results: Any, runner_results: Any) -> None:
        cfg, progress, task = self.cfg, self.progress, self.tasks[task_id]
        shard = str(cfg.shard)
        for b, r in zip(builder_results, runner_results):
            if b.error_msg is not None:
                status = "build_error"
            elif r.error_msg is not None:
                status = "run_error"
            else:
                status = "ok"
                secs = [float(x) for x in r.run_secs]
                mean = sum(secs) / len(secs)
                if task.best_s is None or mean < task.best_s:
                    task.best_s = mean
                    metrics.BEST_LATENCY.labels(cfg.job, shard, task.name).set(mean)
            if status != "ok":
                progress.errors += 1
            metrics.TRIALS.labels(cfg.job, shard, task.name, status).inc()
            task.done += 1
            progress.done += 1
        metrics.SHARD_DONE.labels(cfg.job, shard).set(progress.done)
        if self.windows is not None:
            count_windows(progress, self.windows.read_new())
        progress.startup.setdefault(
            "first_records_s", round(time.time() - (cfg.process_started_at or progress.started_at), 2))
        prof = ms.Profiler.current()
        if prof is not None:
            self.phases(prof.get())
        progress.write(self.path)
        if cfg.on_round is not None:
            cfg.on_round()


@derived_object
class CostModelUpdate(ms.measure_callback.PyMeasureCallback):
    """Stock ``UpdateCostModel``, except after the shard's final batch: nothing searches after it,
    so training the cost model on it (xgb, ~2 s per client on the H200 machine) would only delay
    the shard's end. ``shard`` counts the shard's trials (``done`` of ``budget``; the client's
    Progress) and is updated after this callback (by the progress callback), so ``done``
    excludes this batch."""

    def __init__(self, shard: Progress | TaskProgress) -> None:
        super().__init__()
        self.shard = shard
        self.update = ms.measure_callback.UpdateCostModel()

    def apply(self, task_scheduler: Any, task_id: int, measure_candidates: Any,
              builder_results: Any, runner_results: Any) -> None:
        if self.shard.done + len(measure_candidates) >= self.shard.budget:
            return
        self.update.apply(task_scheduler, task_id, measure_candidates, builder_results, runner_results)


class WriteAhead:
    """Stock ``AddToDatabase`` for a ``tune_tasks`` call over ``ctxs``, split in two
    measure callbacks that share this: ``StoreBatch`` makes the batch's records and starts storing
    them, ``CommitBatch`` waits for the store and commits them. Put the cost-model update between
    the two: the upload (~50 ms per 1,000 records held, to a local S3) then runs while the cost
    model trains, and the commit still comes before the next search reads the database. ``stage``
    makes the lines for ``database``'s directory; ``job``/``shard`` label the wait in
    ``sharetune_write_ahead_seconds``."""

    def __init__(self, database: Any, stage: RecordLines, ctxs: list[Any], store_ahead: StoreAhead,
                 job: str = "", shard: str = "") -> None:
        self.database, self.stage, self.ctxs = database, stage, ctxs
        self.store_ahead, self.job, self.shard = store_ahead, job, shard
        # Batches being stored, not yet committed: (records, wait for the store).
        self.pending: list[tuple[list[Any], Callable[[], bool]]] = []


@derived_object
class StoreBatch(ms.measure_callback.PyMeasureCallback):
    def __init__(self, ahead: WriteAhead) -> None:
        super().__init__()
        self.ahead = ahead

    def apply(self, task_scheduler: Any, task_id: int, measure_candidates: Any,
              builder_results: Any, runner_results: Any) -> None:
        a = self.ahead
        ctx = a.ctxs[task_id]
        batch = tuning_records(a.database, ctx.mod, ctx.target, measure_candidates, runner_results)
        a.pending.append((batch, a.store_ahead(a.stage.lines(batch))))


@derived_object
class CommitBatch(ms.measure_callback.PyMeasureCallback):
    def __init__(self, ahead: WriteAhead) -> None:
        super().__init__()
        self.ahead = ahead

    def apply(self, task_scheduler: Any, task_id: int, measure_candidates: Any,
              builder_results: Any, runner_results: Any) -> None:
        a = self.ahead
        batch, wait = a.pending.pop()
        t = time.monotonic()
        stored = wait()
        metrics.WRITE_AHEAD_SECONDS.labels(a.job, a.shard, "stored" if stored else "not_stored").observe(
            time.monotonic() - t)
        if not stored:
            # Store unreachable: tuning goes on; these records are safe once the store is back
            # (the sync thread retries), unless the pod dies first.
            log.warning("batch of %d records committed before it was stored", len(batch))
        for rec in batch:
            a.database.commit_tuning_record(rec)
