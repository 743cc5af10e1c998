"""A shard's cost model learns what the job's other shards measured: read from the job's store as
their clients upload it (real S3 server, real ShardSync uploads), new records only, failed ones
left out, at most the limit; and from the shards' directories in local mode."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("tvm")

from tvm.s_tir import meta_schedule as ms

from sharetune_tuner.model.intrinsics import ensure_registered
from sharetune_tuner.search.peer_records import LearnFromPeers, PeerRecords, dir_fetch, store_fetch
from sharetune_tuner.store.backends import open_store
from sharetune_tuner.store.sync import ShardSync

from .test_library_jobs import _shard
from .test_records import TARGET

pytestmark = pytest.mark.tvm


def test_a_shard_learns_what_the_other_shards_uploaded(s3_env, tmp_path: Path) -> None:
    store = open_store("s3://peers/ns/job")
    _shard(tmp_path / "s1", 16, [1, 2, 4], [4e-6, 3e-6, 2e-6])
    _shard(tmp_path / "s2", 32, [1, 2], [5e-6, 1e10])  # 1e10: TVM's time of a failed run
    for i in (1, 2):
        assert ShardSync(store, None, i, tmp_path / f"s{i}").sync()
    peers = PeerRecords(store_fetch(store), [1, 2, 3])  # shard 3 has uploaded nothing yet
    assert peers.poll() == 4  # the failed run taught nothing
    cost_model = ms.CostModel.create("xgb", num_tuning_cores=1)
    ensure_registered()  # as the client has them before it learns (TuneContext needs the intrinsics)
    learnt: list[int] = []
    LearnFromPeers(peers, cost_model, TARGET, learnt.append).learn_pending()  # what apply() does
    assert learnt == [4] and cost_model.data_size == 4
    # Only what is new since the last poll: shard 1 measured two more, and uploaded them.
    _shard(tmp_path / "s1", 16, [8, 16], [6e-6, 7e-6])
    assert ShardSync(store, None, 1, tmp_path / "s1").sync()
    assert peers.poll() == 2 and [len(b) for _, _, b in peers.take()] == [2]
    assert peers.take() == []


def test_peers_are_learnt_up_to_the_limit_from_local_directories(tmp_path: Path) -> None:
    _shard(tmp_path / "s1", 16, [1, 2, 4, 8], [4e-6, 3e-6, 2e-6, 1e-6])
    peers = PeerRecords(dir_fetch({0: tmp_path / "s0", 1: tmp_path / "s1"}), [1], limit=3)
    assert peers.poll() == 3
    (_, _, bodies), = peers.take()
    assert [b[1] for b in bodies] == [[1e-6], [2e-6], [3e-6]]  # the fastest first
    assert peers.poll() == 0  # the limit is reached: nothing more, ever
