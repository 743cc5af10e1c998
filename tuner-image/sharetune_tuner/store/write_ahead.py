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

The measure callbacks that use these (``StoreBatch``, ``CommitBatch``) are in callbacks.py.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import records

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
