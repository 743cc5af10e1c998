"""Tracker and servers as long-running processes: registration, tracker restarts, clean stops."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
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


def test_a_server_given_only_its_port_tries_the_ports_after_it(tmp_path) -> None:
    """`server --port P` without --port-end starts (it once tried the empty [P, 9199) and died with a
    traceback), moving past a port that is taken; when every port of its range is taken, it says so
    in one line."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "sharetune_tuner.cli", "server", "--tracker", "127.0.0.1:9",
                            "--host", "127.0.0.1", "--port", str(port), "--port-end", str(port + 1)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.splitlines()[-1] == (
            f"sharetune-tuner server: error: cannot listen on any port in [{port}, {port + 1}) on 127.0.0.1: each "
            "is taken; choose free ones with --port and --port-end"), r.stderr
        s = tuner(["server", "--tracker", "127.0.0.1:9", "--host", "127.0.0.1", "--port", str(port)],
                  tmp_path / "server.log")
        try:
            wait_until(lambda: "listening on port" in s.text() or s.popen.poll() is not None, 30, "server listening")
            assert port < int(_rpc_port(s.text())) < port + 20, s.text()
        finally:
            s.stop()


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


def test_a_server_that_must_use_mps_waits_for_the_daemon_and_never_runs_without_it(tmp_path, monkeypatch) -> None:
    import threading
    import time

    from sharetune_tuner.errors import MpsError
    from sharetune_tuner.measure.mps import READY
    from sharetune_tuner.measure.rpc import ServerConfig, TuningServer

    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    cfg = ServerConfig("127.0.0.1", 1, "k", require_mps=True, mps_wait_s=0.6)
    with pytest.raises(MpsError, match="CUDA_MPS_PIPE_DIRECTORY is not set"):
        TuningServer(cfg).serve(threading.Event())
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    server = TuningServer(cfg)
    assert server.health() == (True, "waiting for the MPS daemon")
    t0 = time.monotonic()
    with pytest.raises(MpsError, match=f"no MPS daemon became ready in {tmp_path}"):
        server.serve(threading.Event())
    assert time.monotonic() - t0 < 5 and server.server is None  # no RPC worker (no CUDA) was started
    # The daemon comes up a moment later: the server goes on (here, until asked to stop).
    stop = threading.Event()
    threading.Timer(0.3, lambda: (tmp_path / READY).touch()).start()
    threading.Timer(1.0, stop.set).start()
    slow = TuningServer(ServerConfig("127.0.0.1", 1, "k", host="127.0.0.1", port=0, port_end=0,
                                     require_mps=True, mps_wait_s=10))
    # Past the wait is TVM's part and the tracker's: not needed here.
    slow._start = lambda: None
    slow.is_registered = lambda: False
    assert slow.serve(stop, poll_s=0.1) == 0 and not slow.waiting_for_mps


def test_a_client_without_a_gpu_asks_the_servers_for_the_arch_and_names_the_fix(topology: Topology,
                                                                                monkeypatch) -> None:
    """A cluster's client sees no GPU: the cuda arch is its servers' GPU's. These servers run on a
    CPU machine, so the answer is that they see none, named with the fix; the arch read from a GPU
    is checked on the GPU machine (bench/h200)."""
    from sharetune_tuner.errors import TargetError
    from sharetune_tuner.targets import ARCH_ENV, arch_of, cuda_arch, make_target, servers_cuda_arch

    monkeypatch.delenv(ARCH_ENV, raising=False)
    asked: list[str] = []

    def ask() -> str:
        asked.append("servers")
        return servers_cuda_arch("127.0.0.1", topology.tracker_port, topology.key, 30)

    with pytest.raises(TargetError, match=f"servers see no GPU.*{ARCH_ENV}=sm_XY"):
        make_target("cuda", ask_servers=ask)
    assert asked == ["servers"]  # NVML found no GPU here, so the servers were asked
    assert all(s.popen.poll() is None for s in topology.servers)  # the question cost no server its life
    monkeypatch.setenv(ARCH_ENV, "sm_80")
    assert cuda_arch(ask) == "sm_80" and asked == ["servers"]  # the override wins, nobody asked
    assert (arch_of(9, 0), arch_of(8, 6), arch_of(10, 0)) == ("sm_90a", "sm_86", "sm_100")
