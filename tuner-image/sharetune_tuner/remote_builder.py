"""A client's builder that sends its batches to the host's build service (build_service.py), and
builds them itself from the first batch the service cannot take."""

from __future__ import annotations

import logging
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder
from tvm.s_tir.meta_schedule.builder.local_builder import _serialize_params

from .build_protocol import Item, Result, authkey
from .builder import PooledBuilder

log = logging.getLogger("sharetune.build")


@derived_object
class RemoteBuilder(PyBuilder):
    """A client's builder that sends its batches to the host's build service."""

    def __init__(self, socket_path: Path, fallback_workers: int, timeout_sec: float = 60.0,
                 export_shared_lib: bool = False) -> None:
        super().__init__()
        self.socket_path = socket_path
        self.fallback_workers = fallback_workers
        self.timeout_sec = timeout_sec
        self.export = export_shared_lib
        self.conn: Connection | None = None
        self.fallback: PooledBuilder | None = None

    def _remote(self, items: list[Item]) -> list[Result]:
        if self.conn is None:
            self.conn = Client(str(self.socket_path), family="AF_UNIX", authkey=authkey())
        self.conn.send((self.export, items))
        # Each build is bounded by the service's timeout; a batch queued behind the other clients'
        # batches waits longer, but never longer than all of its builds one after another.
        if not self.conn.poll(self.timeout_sec * (len(items) + 1)):
            raise TimeoutError(f"no answer from the build service in {self.timeout_sec * (len(items) + 1)} s")
        results: list[Result] = self.conn.recv()
        if len(results) != len(items):
            raise RuntimeError(f"build service answered {len(results)} results for {len(items)} candidates")
        return results

    def build(self, build_inputs: list[Any]) -> list[Any]:
        if self.fallback is None:
            items = [(b.mod, b.target, _serialize_params(b.params)) for b in build_inputs]
            try:
                return [BuilderResult(path, err) for path, err in self._remote(items)]
            except Exception as e:  # refused, gone, timed out: build here from now on
                log.warning("build service %s unusable (%s: %s): building in this client with %d workers",
                            self.socket_path, type(e).__name__, e, self.fallback_workers)
                self._close()
                self.fallback = PooledBuilder(self.fallback_workers, self.timeout_sec,
                                              export_shared_lib=self.export)
        return self.fallback.build(build_inputs)

    def _close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except OSError:
                pass
            self.conn = None

    def shutdown(self) -> None:
        self._close()
        if self.fallback is not None:
            self.fallback.shutdown()
