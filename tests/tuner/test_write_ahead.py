"""A measured batch is in the job's store before the client's database commits it: real
MetaSchedule tuning of a small matmul on the CPU, the shard synced to a real S3 server. At every
commit the test reads the store back: it must already hold the batch, byte for byte what TVM
then appends. (Why: a client pod killed between its database commit and the upload lost those
records; the fault suite saw it, see write_ahead.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

pytest.importorskip("tvm")

import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.testing import te_workload

from sharetune_tuner.build.builder import build_without_intrinsics
from sharetune_tuner.measure.callbacks import CommitBatch, StoreBatch, WriteAhead
from sharetune_tuner.model.intrinsics import ensure_registered
from sharetune_tuner.store import records
from sharetune_tuner.store.backends import open_store, unpack
from sharetune_tuner.store.sync import ShardSync
from sharetune_tuner.store.write_ahead import RecordLines

pytestmark = pytest.mark.tvm
BUDGET, PER_ITER = 8, 4  # two measured batches


def _tune(db_dir: Path, store_ahead: Any) -> None:
    # As the client builds: tensor intrinsics from the cache, a builder that does not parse them
    # in every fresh worker (stock's default_build does, ~30 s a batch on two cores).
    ensure_registered()
    mod = tvm.IRModule({"main": te.create_prim_func(te_workload.matmul(64, 64, 64))})
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    database = ms.database.JSONDatabase(work_dir=str(db_dir))
    ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                         search_strategy=ms.search_strategy.EvolutionarySearch(population_size=16,
                                                                               init_min_unmeasured=8),
                         task_name="matmul", num_threads=2, rand_state=1)
    stage = RecordLines(db_dir)
    ahead = WriteAhead(database, stage, [ctx], store_ahead, "wa-test", "0")
    try:
        ms.tune_tasks(tasks=[ctx], task_weights=[1.0], work_dir=str(db_dir / "logs"), max_trials_global=BUDGET,
                      max_trials_per_task=BUDGET, num_trials_per_iter=PER_ITER,
                      builder=ms.builder.LocalBuilder(max_workers=2, f_build=build_without_intrinsics),
                      runner=ms.runner.LocalRunner(),
                      database=database, cost_model=ms.CostModel.create("random"),
                      # As the client has them, the cost-model update in the middle.
                      measure_callbacks=[StoreBatch(ahead), ms.measure_callback.RemoveBuildArtifact(),
                                         ms.measure_callback.UpdateCostModel(), CommitBatch(ahead)],
                      task_scheduler="round-robin")
    finally:
        stage.close()


def test_batch_is_stored_before_the_database_commits_it(s3_env, tmp_path: Path) -> None:
    store = open_store("s3://write-ahead/ns/job")
    db_dir = tmp_path / "shard"
    db_dir.mkdir()
    sync = ShardSync(store, None, 0, db_dir, interval_s=3600.0).start()  # only the write-ahead uploads
    seen: list[tuple[bytes, bytes, bytes]] = []  # (local records, batch lines, stored records)

    def store_ahead(lines: bytes) -> Any:
        wait = sync.write_ahead(lines)

        def check() -> bool:  # the commit callback's wait: what the store and the database hold
            ok = wait()
            local = (db_dir / records.RECORDS).read_bytes() if (db_dir / records.RECORDS).exists() else b""
            back = tmp_path / f"stored-{len(seen)}"
            unpack(store.get("shard-0") or b"", back)
            seen.append((local, lines, (back / records.RECORDS).read_bytes()))
            assert ok
            return ok

        return check

    try:
        _tune(db_dir, store_ahead)
    finally:
        sync.stop()
    assert len(seen) == BUDGET // PER_ITER
    for local, lines, stored in seen:
        assert lines.count(b"\n") == PER_ITER
        assert not local.endswith(lines)  # not committed yet ...
        assert stored == local + lines  # ... but already stored, after what was stored before
    final = (db_dir / records.RECORDS).read_bytes()
    assert final == seen[-1][2]  # TVM appended exactly the lines that were stored ahead of it
    assert records.stats(db_dir).total == BUDGET
    # The final sync found nothing new to store: the write-ahead copies were already the shard's.
    assert sync.uploads == len(seen)
    # Each wait is on /metrics: every batch stored, none committed first.
    assert REGISTRY.get_sample_value("sharetune_write_ahead_seconds_count",
                                     {"tuning_job": "wa-test", "shard": "0", "outcome": "stored"}) == len(seen)
    assert REGISTRY.get_sample_value("sharetune_write_ahead_seconds_count",
                                     {"tuning_job": "wa-test", "shard": "0", "outcome": "not_stored"}) is None
    unpack(store.get("shard-0") or b"", tmp_path / "final")
    assert records.record_keys(tmp_path / "final") == records.record_keys(db_dir)
