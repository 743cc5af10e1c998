"""The TVM RPC tracker and tuning servers as well-behaved long-running processes.

TVM runs each in a ``PopenWorker`` child that holds the port; we keep the child's handle and
terminate it on stop. A server watches its registration and starts a fresh TVM server when the
tracker forgot it (tracker restarted) or its worker died: TVM's own server gives up ~60 s after
losing the tracker.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from .. import metrics
from ..errors import TunerError
from . import mps
from . import window as measure_window

log = logging.getLogger("sharetune.rpc")


def tracker_summary(host: str, port: int) -> dict[str, Any] | None:
    from tvm import rpc

    try:
        return rpc.connect_tracker(host, port).summary()
    except Exception:
        return None


def registered_servers(summary: dict[str, Any], key: str) -> list[dict[str, Any]]:
    return [s for s in summary.get("server_info", []) if str(s.get("key", "")).split(":")[-1] == key]


def run_tracker(host: str, port: int, stop: threading.Event, poll_s: float = 2.0) -> int:
    from tvm.rpc.tracker import Tracker

    tracker = Tracker(host=host, port=port, port_end=port + 1, silent=True)
    log.info("tracker listening on %s:%d", host, tracker.port)
    try:
        while not stop.wait(poll_s):
            if not tracker.proc.is_alive():
                log.error("tracker worker died")
                return 1
            summary = tracker_summary("127.0.0.1", tracker.port) or {}
            keys: dict[str, int] = {}
            for s in summary.get("server_info", []):
                k = str(s.get("key", "")).split(":")[-1]
                keys[k] = keys.get(k, 0) + 1
            for k, n in keys.items():
                metrics.SERVERS_REGISTERED.labels(k).set(n)
    finally:
        tracker.terminate()
    return 0


@dataclass
class ServerConfig:
    tracker_host: str
    tracker_port: int
    key: str
    host: str = "0.0.0.0"
    port: int = 9091
    port_end: int = 9199
    thread_percentage: int | None = None
    pinned_memory_limit: str | None = None  # "4G" -> CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=4G"
    custom_addr: str | None = None  # the address the tracker hands to clients (pod IP)
    name: str = "server"
    reregister_after_s: float = 10.0
    # The job asked for MPS: wait for the daemon's pipe before any CUDA, never run outside it.
    require_mps: bool = False
    mps_wait_s: float = 120.0


def apply_mps_limits(cfg: ServerConfig) -> None:
    """MPS reads these at CUDA initialisation, which happens in the forked session process, so
    setting them in our environment before TVM starts its worker is enough."""
    if cfg.thread_percentage is not None:
        os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(cfg.thread_percentage)
        metrics.THREAD_PERCENTAGE.labels(cfg.key, cfg.name).set(cfg.thread_percentage)
    if cfg.pinned_memory_limit:
        os.environ["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={cfg.pinned_memory_limit}"


class GpuSampler:
    """GPU utilisation/memory via NVML (no CUDA context: safe before TVM forks sessions)."""

    def __init__(self, server: str) -> None:
        self.server = server
        self.handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:
            self.nvml = None  # CPU-only machine: nothing to export

    def sample(self) -> None:
        if self.nvml is None:
            return
        for i, h in enumerate(self.handles):
            try:
                util = self.nvml.nvmlDeviceGetUtilizationRates(h)
                mem = self.nvml.nvmlDeviceGetMemoryInfo(h)
            except Exception:
                continue
            metrics.GPU_UTIL.labels(str(i), self.server).set(util.gpu)
            metrics.GPU_MEM.labels(str(i), self.server).set(mem.used)


class TuningServer:
    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.server: Any = None
        # The GPU's measurement windows (measure/window.py): present when the MPS daemon made them.
        self.windows = measure_window.Windows.of()
        self.tenant = measure_window.tenant(cfg.key)
        self.registered = False
        self.restarts = 0
        self.gpu = GpuSampler(cfg.name)
        self.waiting_for_mps = cfg.require_mps

    def _start(self) -> None:
        from tvm.rpc.server import Server

        init = None if self.windows is None else \
            functools.partial(measure_window.serve_remote, str(self.windows.dir), self.tenant)
        self.server = Server(host=self.cfg.host, port=self.cfg.port, port_end=self.cfg.port_end,
                             tracker_addr=(self.cfg.tracker_host, self.cfg.tracker_port),
                             key=self.cfg.key, custom_addr=self.cfg.custom_addr, silent=True,
                             server_init_callback=init)
        log.info("server %s listening on port %d, key %s", self.cfg.name, self.server.port, self.cfg.key)

    def _stop_tvm(self) -> None:
        if self.server is not None:
            self.server.terminate()
            self.server = None

    def is_registered(self) -> bool:
        summary = tracker_summary(self.cfg.tracker_host, self.cfg.tracker_port)
        if summary is None or self.server is None:
            return False
        # The tracker records (advertised address or, without one, the peer's IP, port).
        for s in registered_servers(summary, self.cfg.key):
            host, port = (list(s.get("addr") or []) + [None, None])[:2]
            if port == self.server.port and (self.cfg.custom_addr is None or host == self.cfg.custom_addr):
                return True
        return False

    def health(self) -> tuple[bool, str]:
        if self.waiting_for_mps:
            return True, "waiting for the MPS daemon"
        if self.server is None or not self.server.proc.is_alive():
            return False, "rpc worker not running"
        return True, "registered" if self.registered else "running, not registered yet"

    def serve(self, stop: threading.Event, poll_s: float = 2.0) -> int:
        if self.cfg.require_mps:
            mps.wait_for_daemon(self.cfg.mps_wait_s, stop)
            self.waiting_for_mps = False
            if stop.is_set():
                return 0
        apply_mps_limits(self.cfg)
        if self.windows is not None:  # on the GPU's tenant list while this process lives
            self.windows.join(self.tenant)
        try:
            self._start()
        except ValueError as e:  # TVM's "cannot bind to any port in [a, b)" (with its worker's traceback)
            if "cannot bind" not in str(e):
                raise
            raise TunerError(f"cannot listen on any port in [{self.cfg.port}, {self.cfg.port_end}) on "
                             f"{self.cfg.host}: each is taken; choose free ones with --port and --port-end") from None
        lost_since: float | None = None
        try:
            while not stop.wait(poll_s):
                self.gpu.sample()
                self.registered = self.is_registered()
                metrics.SERVER_REGISTERED.labels(self.cfg.key, self.cfg.name).set(int(self.registered))
                alive = self.server is not None and self.server.proc.is_alive()
                if self.registered and alive:
                    lost_since = None
                    continue
                # Not registered while a session runs is normal (the tracker hides busy servers)
                # for a while; only a long absence, or a dead worker, means start afresh.
                lost_since = lost_since or time.monotonic()
                if not alive or time.monotonic() - lost_since > self.cfg.reregister_after_s:
                    log.warning("server %s %s: starting a fresh RPC server", self.cfg.name,
                                "worker died" if not alive else "not registered at the tracker")
                    self._stop_tvm()
                    self._start()
                    self.restarts += 1
                    metrics.SERVER_RESTARTS.labels(self.cfg.key, self.cfg.name).inc()
                    lost_since = None
        finally:
            self._stop_tvm()
        return 0
