"""Tracker and servers as long-running processes: registration, tracker restarts, clean stops."""

from __future__ import annotations

import signal
import socket
import urllib.request

import pytest

from .conftest import Topology, registered, tuner, wait_until

pytestmark = pytest.mark.tvm


def test_servers_reregister_after_the_tracker_restarts(topology: Topology) -> None:
    assert registered(topology.tracker_port, topology.key) == 2
    topology.tracker.stop(signal.SIGKILL)  # the tracker pod dies with its state
    assert registered(topology.tracker_port, topology.key) == 0
    topology.tracker = tuner(["tracker", "--host", "127.0.0.1", "--port", str(topology.tracker_port)],
                             topology.tmp / "tracker2.log")
    # Both servers are back under their key without being restarted by anyone.
    wait_until(lambda: registered(topology.tracker_port, topology.key) == 2, 60, "servers re-registered")
    assert all(s.popen.poll() is None for s in topology.servers)


def test_server_exports_metrics_and_health_and_stops_on_sigterm(topology: Topology) -> None:
    s = topology.servers[0]
    port = int(wait_until(lambda: _metrics_port(s.text()), 20, "metrics port in log"))
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    wait_until(lambda: 'sharetune_rpc_server_registered{key="test",server="s0"} 1.0' in
               urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode(), 20,
               "registered gauge")
    assert "sharetune_rpc_server_restarts_total" in body
    assert urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).status == 200
    rpc_port = int(_rpc_port(s.text()))
    assert s.stop(signal.SIGTERM) == 0
    # The TVM worker that held the RPC port went with it (process group stopped, port free).
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", rpc_port)) != 0
    wait_until(lambda: registered(topology.tracker_port, topology.key) == 1, 20, "tracker forgets it")


def _metrics_port(log: str) -> str | None:
    for line in log.splitlines():
        if "metrics and health on port" in line:
            return line.rsplit(" ", 1)[-1]
    return None


def _rpc_port(log: str) -> str:
    for line in log.splitlines():
        if "listening on port" in line:
            return line.split("listening on port ")[1].split(",")[0]
    raise AssertionError(log)
