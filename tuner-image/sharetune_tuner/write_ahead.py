"""A measured batch reaches the job's store before the local database (write-ahead).

Stock ``AddToDatabase`` appends a batch to the shard's JSONDatabase; the upload to the store
came later (after the cost model trained on the batch, seconds with xgb). A client pod killed
in between (SIGKILL, node lost) took the batch's records with its emptyDir: the fault suite saw
2 of 16 records lost that way. Here the batch's record lines are made first, the shard is stored
*as it will be* with them, and only then are they committed locally: every record a client's
database holds is already in the store, and a pod killed before the commit only costs the
replacement pod a re-measure of that batch (``trials_redone``), never a record.

The lines must be byte-identical to what TVM will append (so the next plain upload sees nothing
new), and each carries the index of its workload's line, which JSONDatabase does not expose. A
scratch JSONDatabase loaded from a copy of the workload file writes exactly those lines.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import metrics, records

log = logging.getLogger("sharetune.write_ahead")

STAGE = "write-ahead"  # the scratch database's directory, in the shard's work dir

# Starts storing the shard with these record lines appended; the returned wait() says whether
# it was stored (ShardSync.write_ahead).
StoreAhead = Callable[[bytes], Callable[[], bool]]


class RecordLines:
    """Makes the JSON lines JSONDatabase will append for a batch of tuning records."""

    def __init__(self, db_dir: Path) -> None:
        self.db_dir = db_dir
        # Next to the database, not in /tmp: a killed client's scratch copy goes with its work dir.
        self._dir = db_dir / STAGE
        shutil.rmtree(self._dir, ignore_errors=True)
        self._dir.mkdir(parents=True)
        self._workloads_size = -1
        self._db: Any = None

    def lines(self, batch: list[Any]) -> bytes:
        from tvm.s_tir import meta_schedule as ms

        wl = self.db_dir / records.WORKLOADS
        size = wl.stat().st_size
        if size != self._workloads_size:  # a workload was committed: indices as of now
            shutil.copyfile(wl, self._dir / records.WORKLOADS)
            (self._dir / records.RECORDS).write_bytes(b"")
            self._db = ms.database.JSONDatabase(path_workload=str(self._dir / records.WORKLOADS),
                                                path_tuning_record=str(self._dir / records.RECORDS))
            self._workloads_size = size
        for rec in batch:
            self._db.commit_tuning_record(rec)
        out = self._dir / records.RECORDS
        data = out.read_bytes()
        out.write_bytes(b"")  # TVM appends (opens the file per line): empty for the next batch
        return data

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)


def tuning_records(database: Any, mod: Any, target: Any, candidates: Any, runner_results: Any) -> list[Any]:
    """What stock AddToDatabase commits for a batch: one record per candidate, a failed one with
    run time 1e10 s (so the search never picks it, and a resumed shard does not measure it again)."""
    from tvm.ir.prim import FloatImm
    from tvm.s_tir import meta_schedule as ms

    workload = database.commit_workload(mod)
    out = []
    for cand, res in zip(candidates, runner_results, strict=True):
        secs = res.run_secs if res.run_secs is not None else [FloatImm("float32", 1e10)]
        out.append(ms.database.TuningRecord(trace=cand.sch.trace, workload=workload, run_secs=secs,
                                            target=target, args_info=cand.args_info))
    return out


def make_write_ahead_callbacks(database: Any, stage: RecordLines, mod: Any, target: Any,
                               store_ahead: StoreAhead, job: str = "", shard: str = "") -> tuple[Any, Any]:
    """Stock ``AddToDatabase`` for one task's ``tune_tasks`` (``mod``, ``target``) as two measure
    callbacks: the first makes the batch's records and starts storing them, the second waits for
    the store and commits them. Put the cost-model update between the two: the upload (~50 ms per
    1,000 records held, to a local S3) then runs while the cost model trains, and the commit
    still comes before the next search reads the database. ``stage`` makes the lines for
    ``database``'s directory; ``job``/``shard`` label the wait in ``sharetune_write_ahead_seconds``."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    pending: list[tuple[list[Any], Callable[[], bool]]] = []

    @derived_object
    class StoreBatch(ms.measure_callback.PyMeasureCallback):
        def apply(self, task_scheduler: Any, task_id: int, measure_candidates: Any,
                  builder_results: Any, runner_results: Any) -> None:
            batch = tuning_records(database, mod, target, measure_candidates, runner_results)
            pending.append((batch, store_ahead(stage.lines(batch))))

    @derived_object
    class CommitBatch(ms.measure_callback.PyMeasureCallback):
        def apply(self, task_scheduler: Any, task_id: int, measure_candidates: Any,
                  builder_results: Any, runner_results: Any) -> None:
            batch, wait = pending.pop()
            t = time.monotonic()
            stored = wait()
            metrics.WRITE_AHEAD_SECONDS.labels(job, shard, "stored" if stored else "not_stored").observe(
                time.monotonic() - t)
            if not stored:
                # Store unreachable: tuning goes on; these records are safe once the store is back
                # (the sync thread retries), unless the pod dies first.
                log.warning("batch of %d records committed before it was stored", len(batch))
            for rec in batch:
                database.commit_tuning_record(rec)

    return StoreBatch(), CommitBatch()
