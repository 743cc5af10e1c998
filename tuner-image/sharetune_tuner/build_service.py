"""One builder pool for all the tuning clients of a host (local mode).

Why: on the H200 machine (round r4: 6 clients x 6 builder workers on 16 cores) a shard's builds
took 15-27 s depending on its task, so the fastest shards were done ~10 s before the slowest,
whose 6 workers then had the machine to themselves at ~25% CPU for the last ~15 s of a 58 s run
(``bench/results/h200-cells.jsonl``, util_trace). A fixed per-client pool cannot take over the
cores the finished clients no longer use; one pool of the host's CPUs fed by every client, first
come first served, can. It also starts its workers (``import tvm``, ~1.5 s of CPU each) once per
host instead of once per client, and before the first batch needs them.

The service: ``sharetune-tuner build-service --socket PATH`` listens on a Unix socket
(``multiprocessing.connection``, authenticated with ``SHARETUNE_BUILD_AUTHKEY``); each client
keeps one connection and sends one batch at a time. A candidate goes there pickled (IRModule and
Target pickle through their JSON form, as for TVM's own popen workers) and its artifact comes
back as a path on this host. A client that loses the service builds its batches itself
(``remote_builder.RemoteBuilder`` falls back to a ``PooledBuilder``): no trial is lost to a
dead service. This module imports TVM only in the service process (local mode imports it for the
key's name).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

from . import metrics
from .build_protocol import Item, Result, authkey

log = logging.getLogger("sharetune.build")


def _warm_up() -> int:
    """Runs once in each worker at start: the imports a build needs, paid before the first batch."""
    from tvm.driver import build  # noqa: F401
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock  # noqa: F401

    time.sleep(0.2)  # hold the worker so every pool thread gets (and starts) its own
    return os.getpid()


class BuildService:
    def __init__(self, socket_path: Path, workers: int, timeout_s: float = 60.0, max_uses: int = 64) -> None:
        from tvm.support.popen_pool import PopenPoolExecutor

        self.socket_path = socket_path
        self.workers = workers
        self.timeout_s = timeout_s
        self.pool = PopenPoolExecutor(max_workers=workers, timeout=timeout_s, maximum_process_uses=max_uses)

    def warm(self) -> None:
        futures = [self.pool.submit(_warm_up) for _ in range(self.workers)]
        pids = {f.result() for f in futures}
        log.info("build service: %d workers warm", len(pids))

    def build(self, export: bool, items: list[Item]) -> list[Result]:
        from .builder import build_batch, export_shared

        metrics.BUILDS_IN_FLIGHT.inc(len(items))
        try:
            built = build_batch(self.pool, export_shared if export else None, items, self.timeout_s, "build service")
        finally:
            metrics.BUILDS_IN_FLIGHT.dec(len(items))
        for _, _, status in built:
            metrics.BUILDS.labels(status).inc()
        return [(path, error) for path, error, _ in built]

    @staticmethod
    def counts() -> dict[str, int]:
        """Builds so far by status, as /metrics reports them."""
        from prometheus_client import REGISTRY

        return {s: int(REGISTRY.get_sample_value("sharetune_builds_total", {"status": s}) or 0)
                for s in ("ok", "error", "timeout")}

    def _handle(self, conn: Connection) -> None:
        with conn:
            while True:
                try:
                    export, items = conn.recv()
                except (EOFError, OSError):
                    return  # the client is gone
                try:
                    conn.send(self.build(export, items))
                except (OSError, ValueError):
                    return

    def _accept(self, listener: Listener) -> None:
        while True:
            try:
                conn = listener.accept()
            except OSError:
                return  # closed on stop
            except Exception as e:  # a peer with the wrong key: refuse it, keep serving
                log.warning("build service: refused a connection: %s", e)
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True, name="build-conn").start()

    def serve(self, stop: threading.Event) -> int:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        listener = Listener(str(self.socket_path), family="AF_UNIX", authkey=authkey())
        # Accept while the workers start: a client's first batch just queues behind the warm-up.
        threading.Thread(target=self._accept, args=(listener,), daemon=True, name="build-accept").start()
        log.info("build service on %s, %d workers", self.socket_path, self.workers)
        try:
            self.warm()
            stop.wait()
        finally:
            listener.close()
            self.socket_path.unlink(missing_ok=True)
            self.pool.shutdown()
            n = self.counts()
            log.info("build service stopped: %d builds (ok %d, error %d, timeout %d)",
                     sum(n.values()), n["ok"], n["error"], n["timeout"])
        return 0
