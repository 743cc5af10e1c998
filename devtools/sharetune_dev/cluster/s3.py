"""A local S3-compatible server (gofakes3 built from source) for tests and the quickstart."""

from __future__ import annotations

import shutil
import socket
import tempfile
import time
from pathlib import Path

from sharetune.procs import ProcessGroup, free_port

from . import binaries


class LocalS3:
    def __init__(self, data_dir: Path | None = None, port: int | None = None) -> None:
        self._own_dir = data_dir is None  # a temporary one: removed by close()
        self.data_dir = Path(data_dir or tempfile.mkdtemp(prefix="sharetune-s3-"))
        self.port = port or free_port()
        self.proc: ProcessGroup | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 20.0) -> "LocalS3":
        binaries.ensure(["s3-server"])
        self.proc = ProcessGroup("s3-server", [str(binaries.path_of("s3-server")), "-addr", f"127.0.0.1:{self.port}",
                                               "-dir", str(self.data_dir / "data")], self.data_dir / "s3.log").start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            if not self.proc.alive():
                raise RuntimeError(f"s3 server exited:\n{self.proc.tail()}")
            time.sleep(0.1)
        raise RuntimeError("s3 server did not listen in time")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None

    def close(self) -> None:
        """Stops the server for good (``stop`` keeps the data for a restart) and removes the
        data directory it made itself."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
