"""Fixtures that start real tuner processes (tracker, servers) and stop them by process group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sharetune.procs import ProcessGroup, free_port  # noqa: F401 (free_port: re-exported for the tests)

from ..helpers import wait_for

EXAMPLE = Path(__file__).parents[2] / "examples" / "tiny-cpu.yaml"


def example_job(tmp_path: Path, **spec_over: object) -> Path:
    """The quickstart's TuningJob with top-level ``spec`` fields replaced, written to tmp_path."""
    import yaml

    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"].update(spec_over)
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


@dataclass
class Spawned:
    """A tuner process (a ``ProcessGroup``) whose ``stop`` sends a chosen signal to its group and
    returns the leader's own exit status (tests assert a clean SIGTERM exit)."""

    proc: ProcessGroup

    @property
    def popen(self) -> subprocess.Popen[bytes]:
        assert self.proc.popen is not None
        return self.proc.popen

    @property
    def log(self) -> Path:
        return self.proc.log

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        if self.proc.alive():
            self.proc.kill(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill(signal.SIGKILL)
        rc = self.popen.returncode  # read before stop(): it reaps without recording the status
        self.proc.stop()  # what is left of the group (an orphaned worker)
        return rc

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def tuner(args: list[str], log: Path, env: dict[str, str] | None = None) -> Spawned:
    """``sharetune-tuner ARGS`` in a process group of its own; ``env`` is added to this process's."""
    return Spawned(ProcessGroup(args[0], [sys.executable, "-m", "sharetune_tuner.cli", *args], log,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}).start())


def registered(port: int, key: str) -> int:
    from sharetune_tuner.measure.rpc import registered_servers, tracker_summary

    s = tracker_summary("127.0.0.1", port)
    return len(registered_servers(s, key)) if s else 0


def wait_until(fn, timeout: float = 60, what: str = "condition"):
    return wait_for(what, fn, timeout, every=0.5)


@dataclass
class Topology:
    tracker_port: int
    key: str
    tracker: Spawned
    servers: list[Spawned]
    tmp: Path

    @property
    def tracker_addr(self) -> str:
        return f"127.0.0.1:{self.tracker_port}"


@pytest.fixture()
def topology(tmp_path: Path) -> Iterator[Topology]:
    """A tracker and two servers, as local mode starts them."""
    port = free_port()
    key = "test"
    tr = tuner(["tracker", "--host", "127.0.0.1", "--port", str(port)], tmp_path / "tracker.log")
    wait_until(lambda: registered(port, key) == 0 and _tcp_open(port), 30, "tracker")
    servers = []
    for i in range(2):
        base = free_port()
        servers.append(tuner(["server", "--tracker", f"127.0.0.1:{port}", "--key", key, "--host", "127.0.0.1",
                              "--port", str(base), "--port-end", str(base + 1), "--name", f"s{i}",
                              "--metrics-port", "0"], tmp_path / f"server{i}.log"))
    wait_until(lambda: registered(port, key) == 2, 60, "2 servers registered")
    topo = Topology(port, key, tr, servers, tmp_path)
    try:
        yield topo
    finally:
        for s in [*topo.servers, topo.tracker]:
            s.stop()


def _tcp_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture()
def s3_env(s3, monkeypatch):
    """The real S3 server, with the environment the tuner's S3 store reads (endpoint, keys)."""
    monkeypatch.setenv("SHARETUNE_S3_ENDPOINT", s3.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return s3
