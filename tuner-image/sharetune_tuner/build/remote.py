"""A client's builder that sends its candidates to build services (build/service.py): the host's
one (local mode, a Unix socket) or the job's builder pods (``host:port``: a headless Service, whose
name resolves to every ready builder; or a comma-separated list of them). What no builder can
take, the client builds itself.

Per batch: the name is resolved again (builders added by the autoscaler join at the next batch),
the batch is split into one chunk per connected builder, and the chunks go out at once. A chunk
whose builder dies (connection lost, or no answer within its builds' bound) goes to the next free
builder, and when none is left the client builds it itself: a dead builder costs a retry, never a
trial. A candidate is reported failed only for the build's own error or timeout.

When no builder answers at all, the first batch waits up to ``connect_wait_s`` (30 s: the
builder pods start beside the clients) and later batches try once; then the client builds the
batch itself, and tries the builders again at the next batch. A builder that refuses the key is
not waited for.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder

from ..tvm_private import serialize_params
from .builder import PooledBuilder
from .protocol import ARTIFACT_DIR_ENV, Item, Result, WireResult, authkey, connect, parse_address

log = logging.getLogger("sharetune.build")

CONNECT_WAIT_S = 30.0  # the first batch waits this long for a builder to answer, then builds locally
CONNECT_TIMEOUT_S = 3.0  # one connection attempt

Endpoint = tuple[str, str | tuple[str, int]]  # (address family, address)


def _name(ep: Endpoint) -> str:
    return f"{ep[1][0]}:{ep[1][1]}" if isinstance(ep[1], tuple) else ep[1]


def _write_artifact(name: str, data: bytes) -> str:
    """A built candidate's bytes as this client's own file, one directory per candidate (what
    MetaSchedule's RemoveBuildArtifact removes after measuring it)."""
    d = tempfile.mkdtemp(prefix="sharetune-build-", dir=os.environ.get(ARTIFACT_DIR_ENV) or None)
    path = os.path.join(d, os.path.basename(name))
    Path(path).write_bytes(data)
    return path


@derived_object
class RemoteBuilder(PyBuilder):
    def __init__(self, address: str | Path, fallback_workers: int, timeout_sec: float = 60.0,
                 export_shared_lib: bool = False, connect_wait_s: float = CONNECT_WAIT_S) -> None:
        super().__init__()
        self.address = str(address)
        self.targets = [parse_address(a.strip()) for a in self.address.split(",")]
        self.fallback_workers = fallback_workers
        self.timeout_sec = timeout_sec
        self.export = export_shared_lib
        self.connect_wait_s = connect_wait_s
        self.conns: dict[Endpoint, Connection] = {}
        self.fallback: PooledBuilder | None = None  # started the first time a candidate is built here
        self.remote_builds = 0  # candidates built by a service
        self.local_builds = 0  # candidates built by this client
        self.retried = 0  # candidates sent again after their builder was lost
        self.waited_s = 0.0  # time spent waiting for a builder to answer
        self._batches = 0
        self._local_mode_logged = False
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="build-remote")

    # ---- builders ----------------------------------------------------------------------------
    def _endpoints(self) -> list[Endpoint]:
        out: list[Endpoint] = []
        for target, family in self.targets:
            if isinstance(target, str):  # AF_UNIX: a socket path
                out.append((family, target))
                continue
            host, port = target
            try:
                infos = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)
            except OSError:
                continue  # no ready builder behind the name (yet)
            out += [(family, (str(i[4][0]), port)) for i in infos]
        return list(dict.fromkeys(out))

    def _connect_all(self) -> bool:
        """Connects to every builder not yet connected; False when one refused our key."""
        todo = [ep for ep in self._endpoints() if ep not in self.conns]
        if not todo:
            return True
        key = authkey()
        futures = {ep: self._pool.submit(connect, ep[1], ep[0], key, CONNECT_TIMEOUT_S) for ep in todo}
        refused = False
        for ep, f in futures.items():
            try:
                self.conns[ep] = f.result()
                log.info("build service %s connected", _name(ep))
            except AuthenticationError as e:
                refused = True
                log.warning("build service %s refused this client's key (%s)", _name(ep), e)
            except (OSError, EOFError) as e:
                log.debug("build service %s: no answer (%s)", _name(ep), e)
        return not refused

    def _ready(self) -> bool:
        """At least one builder connected, waiting up to ``connect_wait_s`` on the first batch."""
        t0 = time.monotonic()
        deadline = t0 + (self.connect_wait_s if self._batches == 0 else 0.0)
        try:
            while True:
                answered = self._connect_all()
                if self.conns or not answered or time.monotonic() >= deadline:
                    return bool(self.conns)
                time.sleep(0.5)
        finally:
            self.waited_s += time.monotonic() - t0

    def _drop(self, ep: Endpoint) -> None:
        conn = self.conns.pop(ep, None)
        if conn is not None:
            try:
                conn.close()
            except OSError:
                pass

    def _roundtrip(self, conn: Connection, items: list[Item]) -> list[WireResult]:
        conn.send((self.export, items))
        # Each build is bounded by the service's timeout; a chunk queued behind the other clients'
        # chunks waits longer, but never longer than all of its builds one after another.
        bound = self.timeout_sec * (len(items) + 1)
        if not conn.poll(bound):
            raise TimeoutError(f"no answer in {bound:.0f} s")
        results: list[WireResult] = conn.recv()
        if len(results) != len(items):
            raise RuntimeError(f"answered {len(results)} results for {len(items)} candidates")
        return results

    def _remote(self, items: list[Item], results: list[Result | None]) -> None:
        """Builds what the connected builders can, filling ``results``; what no builder could
        build stays None."""
        n, live = len(items), list(self.conns)
        size = -(-n // len(live))
        chunks: deque[list[int]] = deque(list(range(i, min(i + size, n))) for i in range(0, n, size))
        free = set(live)
        busy: dict[Future[list[WireResult]], tuple[Endpoint, list[int]]] = {}  # future -> (builder, chunk)
        while chunks or busy:
            while chunks and free:
                ep, chunk = free.pop(), chunks.popleft()
                f: Future[list[WireResult]] = self._pool.submit(self._roundtrip, self.conns[ep],
                                                                [items[i] for i in chunk])
                busy[f] = (ep, chunk)
            if not busy:
                return  # no builder left: the rest is built here
            done, _ = wait(busy, return_when=FIRST_COMPLETED)
            for f in done:
                ep, chunk = busy.pop(f)
                try:
                    wire = f.result()
                except Exception as e:  # lost, hung or garbled: its chunk goes elsewhere
                    log.warning("build service %s lost (%s: %s): its %d candidates go to %s",
                                _name(ep), type(e).__name__,
                                e, len(chunk), "another builder" if len(self.conns) > 1 else "this client")
                    self._drop(ep)
                    self.retried += len(chunk)
                    chunks.appendleft(chunk)
                    continue
                free.add(ep)
                for i, (artifact, error) in zip(chunk, wire):
                    results[i] = (_write_artifact(*artifact), None) if artifact is not None else (None, error)
                self.remote_builds += len(chunk)

    def build(self, build_inputs: list[Any]) -> list[Any]:
        if not build_inputs:  # a task whose design space is used up (a reshape) gets an empty round
            return []
        items = [(b.mod, b.target, serialize_params(b.params)) for b in build_inputs]
        results: list[Result | None] = [None] * len(items)
        if self._ready():
            self._remote(items, results)
            self._local_mode_logged = False
        self._batches += 1
        todo = [i for i, r in enumerate(results) if r is None]
        if todo:
            if not self._local_mode_logged:
                log.warning("no build service at %s took the batch: "
                            "building %d candidates in this client with %d workers "
                            "(the builders are tried again at the next batch)", self.address, len(todo),
                            self.fallback_workers)
                self._local_mode_logged = True
            if self.fallback is None:
                self.fallback = PooledBuilder(self.fallback_workers, self.timeout_sec, export_shared_lib=self.export)
            for i, r in zip(todo, self.fallback.build([build_inputs[i] for i in todo])):
                results[i] = (r.artifact_path, r.error_msg)
            self.local_builds += len(todo)
        return [BuilderResult(path, err) for path, err in results]  # type: ignore[misc]  # TVM's FFI class, untyped

    def shutdown(self) -> None:
        for ep in list(self.conns):
            self._drop(ep)
        self._pool.shutdown(wait=False)
        if self.fallback is not None:
            self.fallback.shutdown()
