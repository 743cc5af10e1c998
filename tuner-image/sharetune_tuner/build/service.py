"""A builder pool that tuning clients send their candidates to: the host's cores (local mode) or
the job's builder pods on CPU nodes (a cluster, ``spec.builders``).

Why: on the H200 machine (6 clients x 6 builder workers on 16 cores, the -r4 cells) a shard's builds
took 15-27 s depending on its task, so the fastest shards were done ~10 s before the slowest,
whose 6 workers then had the machine to themselves at ~25% CPU for the last ~15 s of a 58 s run
(``bench/results/h200-cells.jsonl``, util_trace). A fixed per-client pool cannot take over the
cores the finished clients no longer use; one pool fed by every client, first come first served,
can. It also starts its workers (``import tvm``, ~1.5 s of CPU each) once instead of once per
client, and before the first batch needs them. In a cluster, builds are pure CPU work (TVM
lowering + codegen): they belong on CPU nodes, not on the GPU node's few cores.

The service: ``sharetune-tuner build-service --listen ADDR`` listens on a Unix socket (local
mode) or ``host:port`` (a builder pod), ``multiprocessing.connection`` authenticated with the
job's key both ways (build/protocol.py). Each handshake runs in the connection's own thread,
bounded: a peer with a wrong key is refused (one log line naming it, its connection closed) and
a silent one cannot hold up the others. A client keeps one connection and sends one chunk of
candidates at a time; each comes back as the artifact's bytes (the client writes its own file:
builder pods and clients share no filesystem). A candidate goes there pickled (IRModule and
Target pickle through their JSON form, as for TVM's own popen workers). A client that loses a
builder sends that chunk to another, or builds it itself (``remote.RemoteBuilder``): no
trial is lost to a dead builder. This module imports TVM only in the service process.
"""

from __future__ import annotations

import logging
import os
import resource
import shutil
import socket
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener
from pathlib import Path

from .. import metrics
from .protocol import Item, WireResult, accept_handshake, authkey, keepalive, parse_address

log = logging.getLogger("sharetune.build")


def _warm_up() -> int:
    """Runs once in each worker at start: the imports a build needs, paid before the first batch."""
    from tvm.driver import build  # noqa: F401  # imported for its import time only
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock  # noqa: F401  # likewise

    time.sleep(0.2)  # hold the worker so every pool thread gets (and starts) its own
    return os.getpid()


def _take(path: str) -> tuple[str, bytes]:
    """A built artifact as (file name, bytes); its directory (one per build) is removed."""
    data = Path(path).read_bytes()
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)
    return os.path.basename(path), data


class BuildService:
    def __init__(self, address: str, workers: int, timeout_s: float = 60.0, max_uses: int = 64) -> None:
        from tvm.support.popen_pool import PopenPoolExecutor

        self.address, self.family = parse_address(address)
        self.workers = workers
        self.timeout_s = timeout_s
        self.key = authkey()  # read once, before listening: a service without a key does not start
        self.pool = PopenPoolExecutor(max_workers=workers, timeout=timeout_s, maximum_process_uses=max_uses)

    def warm(self) -> None:
        futures = [self.pool.submit(_warm_up) for _ in range(self.workers)]
        pids = {f.result() for f in futures}
        log.info("build service: %d workers warm", len(pids))

    def build(self, export: bool, items: list[Item]) -> list[WireResult]:
        from .builder import build_batch, export_shared

        metrics.BUILDS_IN_FLIGHT.inc(len(items))
        try:
            built = build_batch(self.pool, export_shared if export else None, items, self.timeout_s, "build service")
        finally:
            metrics.BUILDS_IN_FLIGHT.dec(len(items))
        out: list[WireResult] = []
        for path, error, status in built:
            metrics.BUILDS.labels(status).inc()
            out.append((_take(path), None) if path is not None else (None, error))
        return out

    @staticmethod
    def counts() -> dict[str, int]:
        """Builds so far by status, as /metrics reports them."""
        from prometheus_client import REGISTRY

        return {s: int(REGISTRY.get_sample_value("sharetune_builds_total", {"status": s}) or 0)
                for s in ("ok", "error", "timeout")}

    def _handle(self, conn: Connection, peer: str) -> None:
        with conn:
            try:
                accept_handshake(conn, self.key)
            except (EOFError, ConnectionError) as e:
                # Closed before answering the challenge: the pod's TCP readiness probe does that
                # every periodSeconds (a warning each time would bury the real refusals).
                log.debug("build service: %s closed the connection before the handshake (%s)", peer, type(e).__name__)
                return
            except (AuthenticationError, OSError) as e:
                # Nothing of the peer's was unpickled: the handshake comes first.
                log.warning("build service: refused a connection from %s (%s: %s): not the job's key",
                            peer, type(e).__name__, e or "no answer in time")
                return
            log.info("build service: client %s connected", peer)
            while True:
                try:
                    export, items = conn.recv()
                except (EOFError, OSError):
                    log.info("build service: client %s gone", peer)
                    return
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
            peer = listener.last_accepted if self.family == "AF_INET" else "local"
            if self.family == "AF_INET":
                s = socket.socket(fileno=conn.fileno())
                keepalive(s)  # a client pod that vanished frees its thread
                s.detach()
            name = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
            threading.Thread(target=self._handle, args=(conn, name), daemon=True, name="build-conn").start()

    def serve(self, stop: threading.Event) -> int:
        if self.family == "AF_UNIX":
            path = Path(str(self.address))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
        # No authkey here: each connection's thread runs the handshake (accept_handshake).
        listener = Listener(self.address, family=self.family, backlog=64)
        # Accept while the workers start: a client's first batch just queues behind the warm-up.
        threading.Thread(target=self._accept, args=(listener,), daemon=True, name="build-accept").start()
        log.info("build service on %s, %d workers", self.address, self.workers)
        try:
            self.warm()
            stop.wait()
        finally:
            listener.close()
            if self.family == "AF_UNIX":
                Path(str(self.address)).unlink(missing_ok=True)
            self.pool.shutdown()  # joins the workers: their CPU time is now this process's children's
            n = self.counts()
            ru = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu_s = ru.ru_utime + ru.ru_stime  # workers incl. start-up, PCH creation, the g++ link
            log.info("build service stopped: %d builds (ok %d, error %d, timeout %d), %.1f CPU-s in its workers "
                     "(%.2f per build)", sum(n.values()), n["ok"], n["error"], n["timeout"], cpu_s,
                     cpu_s / max(1, sum(n.values())))
        return 0
