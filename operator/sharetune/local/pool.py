"""Several TuningJobs at once on this machine (``sharetune run A.yaml B.yaml --local``): the local
form of GPU pools (docs/gpu-pools.md). The cuda jobs share each GPU through *one* MPS control
daemon per GPU (two daemons on one GPU would time-slice it, not share it), and the operator's own
share ledger (``sharetune.admission``) decides who runs when: a job starts once its
``gpuSharing.share`` fits beside the jobs already on a GPU, first come first served in command-line
order, and a finished job gives its share back at once. CPU jobs have no share and start at once.

Each job is an ordinary :class:`LocalRun` (its own tracker, servers, clients, merge) pointed at
the pool's daemon instead of one of its own. Which jobs shared a GPU with which, and when, goes
into each job's summary (``co_tenants``): co-tenant kernels disturb measurements.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from sharetune.admission import Gpu, GpuId, JobKey, Ledger, Placement, Policy, Request, request_of
from sharetune.api import commands
from sharetune.api.spec import TuningJobSpec
from sharetune.api.summary import Summary
from sharetune.api.topology import MPS_READY_FILE, gpu_groups
from sharetune.procs import ProcessGroup

from .run import LocalRun, _wait_until

NODE = "local"  # the ledger's node name for this machine's GPUs


def pooled(spec: TuningJobSpec) -> bool:
    """Jobs the local pool admits: cuda under MPS. (Without MPS each server owns a GPU, which a
    shared GPU cannot give: such a job runs as `sharetune run` alone would.)"""
    return spec.target == "cuda" and spec.uses_mps


@dataclass
class LocalJob:
    path: Path
    spec: TuningJobSpec
    order: int  # command-line position: first come first served
    workdir: Path
    state: str = "queued"  # queued | running | done | failed
    placement: Placement | None = None
    run: LocalRun | None = None
    summary: Summary | None = None
    error: str | None = None
    started: float | None = None
    finished: float | None = None
    co_tenants: dict[str, list[float]] = field(default_factory=dict)  # job -> [first, last] seen beside it
    thread: threading.Thread | None = None

    @property
    def key(self) -> JobKey:
        return ("local", self.spec.name)

    def request(self) -> Request:
        return request_of("local", self.spec.name, f"{self.order:06d}", self.spec)


class LocalPool:
    """The GPUs of this machine as one ledger and one MPS daemon per GPU in use."""

    def __init__(self, root: Path, gpus: int, policy: Policy | None = None) -> None:
        self.root = root
        self.ledger = Ledger([Gpu(GpuId(NODE, i)) for i in range(gpus)], policy or Policy())
        self.daemons: dict[int, ProcessGroup] = {}

    def gpu_dir(self, index: int) -> Path:
        return self.root / f"gpu-{index}"

    def admit(self, waiting: list[LocalJob]) -> tuple[list[LocalJob], dict[str, str]]:
        """(jobs admitted now, booked; job -> why it can never run here)."""
        by_key = {j.key: j for j in waiting}
        out = self.ledger.admit([j.request() for j in waiting])
        admitted = []
        for key, p in out.placed.items():
            by_key[key].placement = p
            admitted.append(by_key[key])
        return sorted(admitted, key=lambda j: j.order), {k[1]: why for k, why in out.unplaceable.items()}

    def release(self, job: LocalJob) -> None:
        self.ledger.release(job.key)

    def ensure_daemon(self, index: int) -> Path:
        """The GPU's MPS control daemon (started on first use, kept until the pool stops)."""
        d = self.gpu_dir(index)
        daemon = self.daemons.get(index)
        if daemon is not None and daemon.poll() is None:
            return d
        (d / "pipe").mkdir(parents=True, exist_ok=True)
        (d / "log").mkdir(parents=True, exist_ok=True)
        (d / "pipe" / MPS_READY_FILE).unlink(missing_ok=True)
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(index), "CUDA_MPS_PIPE_DIRECTORY": str(d / "pipe"),
               "CUDA_MPS_LOG_DIRECTORY": str(d / "log"), "PYTHONUNBUFFERED": "1"}
        daemon = ProcessGroup(f"pool-gpu{index}", [sys.executable, "-m", "sharetune_tuner.cli",
                                                   *commands.pool_daemon(str(d / "pipe"), str(d / "log"))],
                              self.root / f"pool-gpu{index}.log", env)
        self.daemons[index] = daemon  # listed before it starts: a stop that lands meanwhile finds it
        daemon.start()
        _wait_until(lambda: (d / "pipe" / MPS_READY_FILE).exists() or daemon.poll() is not None, 15.0)
        if daemon.poll() is not None:
            raise RuntimeError(f"the MPS daemon of GPU {index} exited with {daemon.poll()}:\n{daemon.tail()}")
        return d

    def mps_dirs(self, job: LocalJob) -> dict[int | None, Path]:
        """The job's GPU groups -> the pool directory of the GPU each was placed on."""
        assert job.placement is not None
        return {g: self.ensure_daemon(job.placement.devices[g or 0].index) for g in gpu_groups(job.spec)}

    def stop(self) -> None:
        for d in self.daemons.values():
            d.stop()


def note_co_tenants(jobs: list[LocalJob], now: float) -> None:
    """Which running jobs share a GPU right now (CPU jobs: the machine), kept as time spans."""
    running = [j for j in jobs if j.state == "running"]
    for a in running:
        for b in running:
            if a is b:
                continue
            share_gpu = a.placement is not None and b.placement is not None and \
                bool(set(a.placement.devices) & set(b.placement.devices))
            if share_gpu or (a.placement is None and b.placement is None):
                span = a.co_tenants.setdefault(b.spec.name, [now, now])
                span[1] = now


def host_clients(jobs: list[LocalJob], starting: list[LocalJob]) -> int:
    """Clients on this host once ``starting`` runs beside the jobs already running: every local
    job's clients share the host's CPUs, whatever GPU they tune for."""
    return sum(j.spec.shards for j in jobs if j.state == "running" or j in starting)


def run_job(job: LocalJob, pool: LocalPool) -> None:
    """One job to the end, in its own thread: services, clients, merge."""
    try:
        assert job.run is not None
        job.run.start_services()
        job.run.run_clients()
        if job.run.stopping:
            raise RuntimeError("stopped")
        job.summary = job.run.merge()
        job.state = "done"
    except Exception as e:  # the job fails, the others go on
        job.error, job.state = str(e), "failed"
    finally:
        if job.run is not None:
            job.run.stop_all()
        job.finished = time.time()
        if job.placement is not None:
            pool.release(job)


def start(job: LocalJob, pool: LocalPool, clients_on_host: int | None = None) -> None:
    """``clients_on_host``: the clients of every job running on the host once this one starts."""
    mps = pool.mps_dirs(job) if job.placement is not None else None
    job.run = LocalRun(job.spec, job.path.resolve(), job.workdir.resolve(), shared_mps=mps,
                       host_clients=clients_on_host)
    job.state, job.started = "running", time.time()
    job.thread = threading.Thread(target=run_job, args=(job, pool), name=f"job-{job.spec.name}", daemon=True)
    job.thread.start()
