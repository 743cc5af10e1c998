"""Keeps a shard's records and progress in the job's store while the client tunes.

The local database is the working copy. Each measured batch is stored before the database
commits it (``write_ahead``: the store never lags what a killed pod's database held); after
every search round (``poke``), every ``interval_s`` and at exit the shard is packed and put into
the store with its progress JSON next to it, and the progress also into the progress sink when
there is one (an S3 job's shard ConfigMap, where the operator reads it).
A failed upload (store down) keeps the records on disk and is retried on the next tick: trials
are never lost, only reported later. A restarted client pod restores its shard from the store
before tuning, then resumes from those records.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sharetune.api.progress import Progress
from sharetune.api.topology import CLIENT_LOG as LOG
from sharetune.api.topology import PROGRESS_FILE as PROGRESS
from sharetune.api.topology import shard_object

from ..errors import TunerError
from . import records
from .backends import OutputTooLarge, Store, StoreError, StoreFailure, pack_bytes, unpack

log = logging.getLogger("sharetune.sync")
FILES = [records.WORKLOADS, records.RECORDS, PROGRESS, LOG]


class ShardSync:
    def __init__(self, store: Store, progress: Store | None, shard: int, work_dir: Path,
                 interval_s: float = 10.0) -> None:
        """``store`` holds the shard (and its progress, next to it); ``progress``, if given, gets
        the progress too (and a failure's report instead of ``store``)."""
        self.store, self.progress, self.shard = store, progress, shard
        self.work_dir, self.interval_s = work_dir, interval_s
        self.name = shard_object(shard)
        self._last: str | None = None
        self._stop = threading.Event()
        self._poked = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="shard-sync", daemon=True)
        self.uploads = 0
        self.failures = 0
        self._failing = False  # the last upload failed: write_ahead does not wait for the store
        # A batch stored ahead of its commit: (its record lines, the records file's length they
        # follow). Every upload includes it until the database has it: an upload in between
        # (timer, progress) must not take it back out of the store.
        self._uncommitted: tuple[bytes, int] | None = None
        # The write-ahead waiting for its upload: (set once tried, [stored?]). Only the sync
        # thread puts to the store (and stop() once it has ended): uploads stay in order.
        self._waiting: tuple[threading.Event, list[bool]] | None = None
        self._ahead_lock = threading.Lock()

    def restore(self) -> int:
        """Puts the stored shard into ``work_dir`` unless the local copy is already at least as
        long (same pod restarted in place); returns how many records the work dir then holds."""
        data = self.store.get(self.name)
        if data:
            tmp = self.work_dir.with_name(self.work_dir.name + ".restore")
            unpack(data, tmp)
            if records.stats(tmp).total > records.stats(self.work_dir).total:
                self.work_dir.mkdir(parents=True, exist_ok=True)
                for f in FILES[:2]:
                    if (tmp / f).exists():
                        (tmp / f).replace(self.work_dir / f)
        return records.stats(self.work_dir).total

    def _snapshot(self) -> dict[str, bytes]:
        # A snapshot, never a repair: TVM may be appending to these files right now.
        files = records.snapshot(self.work_dir)
        for name in (PROGRESS, LOG):
            if (self.work_dir / name).exists():
                files[name] = (self.work_dir / name).read_bytes()
        return files

    def sync(self) -> bool:
        """Stores the shard as it is, plus the batch stored ahead of its commit, if any."""
        files = self._snapshot()
        with self._ahead_lock:
            if self._uncommitted is not None:
                pending, after = self._uncommitted
                rec = files[records.RECORDS]
                if len(rec) < after + len(pending):  # not (fully) committed yet: TVM appends these
                    files[records.RECORDS] = rec[:after] + pending
                else:
                    self._uncommitted = None
        h = hashlib.sha256()
        for name, data in sorted(files.items()):
            h.update(name.encode() + b"\0" + data)
        digest = h.hexdigest()
        if digest == self._last:
            return True  # nothing new since the last upload
        progress_text = files.get(PROGRESS, b"{}").decode(errors="replace")
        data = pack_bytes(files)
        try:
            self.store.put(self.name, data, extra={PROGRESS: progress_text})
            if self.progress is not None:
                self.progress.put_text(self.name, PROGRESS, progress_text)
        except OutputTooLarge:
            raise  # permanent: no retry makes the shard fit (the client fails with its exit code)
        except StoreError as e:
            self.failures += 1
            self._failing = True
            log.warning("upload of %s failed (%s); the records stay on disk and are retried", self.name, e)
            return False
        self._last = digest
        self.uploads += 1
        self._failing = False
        return True

    def poke(self) -> None:
        """A search round ended (its progress is written): upload now (from the sync thread, so
        a slow or down store never stalls tuning)."""
        self._poked.set()

    def write_ahead(self, pending: bytes) -> Callable[..., bool]:
        """Starts storing the shard with ``pending`` (a measured batch's record lines, not yet
        committed); returns ``wait(timeout_s=20)``: True once stored. The wait is bounded, and
        does not wait at all while the store is failing: tuning then goes on and the sync thread
        stores the batch when it can."""
        recs = self.work_dir / records.RECORDS
        after = recs.stat().st_size if recs.exists() else 0
        done, result = threading.Event(), []  # type: ignore[var-annotated]  # holds the store's answer, any type
        with self._ahead_lock:
            self._uncommitted = (pending, after)
            self._waiting = (done, result)
        skip = self._failing or not self._thread.is_alive()
        self._poked.set()

        def wait(timeout_s: float = 20.0) -> bool:
            return (done.is_set() if skip else done.wait(timeout_s)) and bool(result and result[0])

        return wait

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._poked.wait(self.interval_s)
            self._poked.clear()
            if self._stop.is_set():
                return
            with self._ahead_lock:
                waiting, self._waiting = self._waiting, None
            ok = False
            try:
                ok = self.sync()
            except Exception as e:  # the thread must outlive any error: the records stay on disk
                self.failures += 1
                self._failing = True
                log.error("shard upload: %s: %s", type(e).__name__, e)
            finally:
                if waiting:
                    waiting[1].append(ok)
                    waiting[0].set()

    def start(self) -> "ShardSync":
        self._thread.start()
        return self

    def fail(self, message: str) -> None:
        """Reports a failed shard (progress only: small enough to always fit) and stops syncing."""
        self._stop.set()
        self._poked.set()
        path = self.work_dir / PROGRESS
        progress = Progress.from_json(path.read_text() if path.exists() else None) or Progress("", self.shard, 1)
        progress.state, progress.message = "failed", message
        text = progress.to_json()
        sink = self.progress if self.progress is not None else self.store
        try:
            sink.put_text(self.name, PROGRESS, text)
        except StoreFailure as e:
            log.error("could not report the failure: %s", e)

    def stop(self, deadline_s: float = 300.0) -> None:
        """Final upload, retried until ``deadline_s``: the client only exits 0 once stored."""
        self._stop.set()
        self._poked.set()
        self._thread.join(timeout=self.interval_s + 5)
        end = time.monotonic() + deadline_s
        delay = 1.0
        while not self.sync():
            if time.monotonic() > end:
                raise TunerError(f"could not store {self.name} in {self.store.uri} for {deadline_s:.0f}s")
            time.sleep(delay)
            delay = min(delay * 2, 15.0)
