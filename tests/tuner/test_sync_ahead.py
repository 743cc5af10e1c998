"""The shard sync keeps a batch stored ahead of its commit in every upload until the database
has it: a timer or progress upload in between must not take it back out of the store (the
client could be killed right after). Real S3 server; the database files are written by hand as
TVM would append them, line by line."""

from __future__ import annotations

import json
from pathlib import Path

from sharetune_tuner.store import records
from sharetune_tuner.store.backends import open_store, unpack
from sharetune_tuner.store.sync import ShardSync


def _line(i: int) -> bytes:
    return (json.dumps([0, [[["Split", [f"l{i}"], [4, 16]]], [1e-3 * (i + 1)], {"kind": "llvm"}, []]]) + "\n").encode()


def _stored(store, tmp: Path, n: int) -> bytes:
    out = tmp / f"back-{n}"
    unpack(store.get("shard-0") or b"", out)
    return (out / records.RECORDS).read_bytes()


def test_uploads_keep_the_uncommitted_batch(s3_env, tmp_path: Path) -> None:
    store = open_store("s3://sync-ahead/ns/job")
    db = tmp_path / "shard"
    db.mkdir()
    (db / records.WORKLOADS).write_bytes(b'["123", {"mod": "m"}]\n')
    first = _line(0) + _line(1)
    (db / records.RECORDS).write_bytes(first)
    (db / "progress.json").write_text('{"shard": 0, "done": 2}')
    sync = ShardSync(store, None, 0, db, interval_s=600.0).start()
    try:
        batch = _line(2) + _line(3)
        assert sync.write_ahead(batch)(10.0)
        assert _stored(store, tmp_path, 0) == first + batch
        # The progress goes with every upload, next to the shard's object.
        progress = store.s3.get_object(Bucket="sync-ahead", Key="ns/job/shard-0/progress.json")["Body"].read()
        assert progress == b'{"shard": 0, "done": 2}'
        assert sync.sync()  # a timer upload before the commit: the batch stays in the store
        assert _stored(store, tmp_path, 1) == first + batch
        with open(db / records.RECORDS, "ab") as f:  # TVM has appended the first line of two
            f.write(_line(2))
        assert sync.sync()
        assert _stored(store, tmp_path, 2) == first + batch
        with open(db / records.RECORDS, "ab") as f:  # ... and the second: committed
            f.write(_line(3))
        uploads = sync.uploads
        assert sync.sync()
        assert sync.uploads == uploads  # nothing new: the store already had exactly these bytes
        with open(db / records.RECORDS, "ab") as f:  # a later record without a write-ahead
            f.write(_line(4))
        assert sync.sync()
        assert _stored(store, tmp_path, 3) == first + batch + _line(4)  # the old batch is not re-added
    finally:
        sync.stop()
