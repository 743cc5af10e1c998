"""What the job's other shards have measured so far, for this shard's cost model.

Each shard tunes its own tasks with its own XGB cost model, which ranks candidates at random until
it holds MetaSchedule's 100 warm-up measurements: with six shards, each would learn from a sixth of
the job's measurements and stay cold six times as long. MetaSchedule's features describe the
program, not the task, so every shard's records teach every shard's model (as the library's do,
warm_start.py). The other shards' records are where they already are: the shard objects each
client uploads to the job's store (store/sync.py; pods) or the shards' directories (local mode).

A thread fetches them every ``interval_s`` and keeps what is new; the tuning thread learns it after
its next measured batch (:class:`LearnFromPeers`: the cost model is not thread-safe), at most
``limit`` records in all, so the training data of a long run does not grow by the job's size.
Peers measure on the job's own servers, so their device and GPU share are this shard's.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from sharetune.api.topology import shard_object

from ..store import records
from ..store.backends import Store, StoreError, read_packed
from .warm_start import Group, learn, spread

log = logging.getLogger("sharetune.peers")

PEER_INTERVAL_S = 20.0
PEER_MAX = 1024  # records learnt from the other shards, at most (spread over the workloads)

# A shard's database files ({records.WORKLOADS: ..., records.RECORDS: ...}), None while it has none.
Fetch = Callable[[int], "dict[str, bytes] | None"]


def store_fetch(store: Store) -> Fetch:
    """Shards as the job's store holds them (what each client uploads)."""
    def fetch(i: int) -> dict[str, bytes] | None:
        data = store.get(shard_object(i))
        return read_packed(data) if data else None
    return fetch


def dir_fetch(dirs: dict[int, Path]) -> Fetch:
    """Shards in directories of this machine (local mode), read as a consistent snapshot."""
    return lambda i: records.snapshot(dirs[i]) if i in dirs and dirs[i].exists() else None


def new_groups(files: dict[str, bytes], seen: int) -> tuple[list[Group], int]:
    """The measured records after the first ``seen`` record lines of a shard's database, grouped
    by workload (fastest first), and how many record lines it now holds."""
    workloads = records.parse_lines(files.get(records.WORKLOADS, b""))
    lines = records.parse_lines(files.get(records.RECORDS, b""))
    by_wl: dict[str, list[tuple[float, list[Any]]]] = {}
    irs: dict[str, str] = {}
    for m in records.measured(workloads, lines[seen:]):
        irs[m.workload] = m.ir
        by_wl.setdefault(m.workload, []).append((m.secs, m.body))
    groups = [(wl, irs[wl], [b for _, b in sorted(v, key=lambda x: x[0])]) for wl, v in sorted(by_wl.items())]
    return groups, max(seen, len(lines))


class PeerRecords:
    """Fetches the other shards' new records in the background; :meth:`take` hands them over."""

    def __init__(self, fetch: Fetch, peers: list[int], interval_s: float = PEER_INTERVAL_S,
                 limit: int = PEER_MAX) -> None:
        self.fetch, self.interval_s, self.limit = fetch, interval_s, limit
        self.seen = {i: 0 for i in peers}
        self.fetched = 0
        self._pending: list[Group] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="peer-records", daemon=True)

    def poll(self) -> int:
        """One pass over the peers; returns the records it added to what :meth:`take` returns."""
        added = 0
        for i in self.seen:
            if self.fetched + added >= self.limit:
                break
            try:
                files = self.fetch(i)
            except (StoreError, OSError, ValueError) as e:  # a peer's object away or torn: next time
                log.debug("shard %d's records not read: %s", i, e)
                continue
            if not files:
                continue
            groups, self.seen[i] = new_groups(files, self.seen[i])
            kept = spread(groups, self.limit - self.fetched - added)
            n = sum(len(b) for _, _, b in kept)
            if n:
                with self._lock:
                    self._pending += kept
                added += n
        self.fetched += added
        return added

    def take(self) -> list[Group]:
        with self._lock:
            out, self._pending = self._pending, []
        return out

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s) and self.fetched < self.limit:
            try:
                self.poll()
            except Exception as e:  # never let a peer's bad object stop the shard
                log.warning("reading the other shards' records failed: %s", e)

    def start(self) -> "PeerRecords":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()


@derived_object
class LearnFromPeers(ms.measure_callback.PyMeasureCallback):
    """After a measured batch (in the tuning thread), the cost model learns what the other shards
    measured since the last time; ``on_learnt(n)`` counts it."""

    def __init__(self, peers: PeerRecords, cost_model: Any, target: Any, on_learnt: Callable[[int], None]) -> None:
        super().__init__()
        self.peers, self.cost_model, self.target, self.on_learnt = peers, cost_model, target, on_learnt

    def apply(self, task_scheduler: Any, task_id: int, measure_candidates: Any, builder_results: Any,
              runner_results: Any) -> None:
        self.learn_pending()

    def learn_pending(self) -> int:
        groups = self.peers.take()
        n = learn(self.cost_model, self.target, groups, self.peers.limit, "peer") if groups else 0
        if n:
            self.on_learnt(n)
        return n
