"""Local mode: the TuningJob topology as plain processes on this machine.

tracker + N servers (+ the MPS daemon for cuda jobs with MPS) + M clients, one per shard, then
the merge — the same commands the operator's pods run. Clients that fail are restarted, like an
Indexed Job's per-index retries, and resume from their records.
"""

from __future__ import annotations

import copy
import os
import secrets
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sharetune.api import commands
from sharetune.api.exitcodes import ExitCode, passed_on
from sharetune.api.gpuenv import NO_MULTICAST
from sharetune.api.progress import Progress
from sharetune.api.spec import (
    API_GROUP,
    API_VERSION,
    DEFAULT_LIBRARY_MODE,
    KIND,
    LOCAL_LIBRARY_SCOPE,
    TuningJobSpec,
    library_mode,
)
from sharetune.api.summary import Summary
from sharetune.api.topology import (
    BUILD_AUTHKEY_ENV,
    BUILD_DIR_ENV,
    LOCAL_JOB_FILE,
    MPS_READY_FILE,
    PROGRESS_FILE,
    SUMMARY_FILE,
    TENANT_ENV,
    gpu_groups,
    in_group,
)
from sharetune.driver import Verdict, client_exit, shard_clamp
from sharetune.gpus import cuda_arch
from sharetune.procs import ProcessGroup, free_port

from .model_source import prepare_local_model


def _wait_until(ready: Any, limit_s: float, poll_s: float = 0.05) -> bool:
    """Polls ``ready()`` until it is true or ``limit_s`` has passed (then the caller goes on as it
    did with a fixed sleep of that length)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if ready():
            return True
        time.sleep(poll_s)
    return False


def _listening(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


class RunFailed(RuntimeError):
    """A process of the run failed. ``exit_code``: what `sharetune run` exits with, the process's
    own where it is a user error (sharetune.api.exitcodes), so a script can tell them apart."""

    def __init__(self, message: str, rc: int | None) -> None:
        super().__init__(message)
        self.exit_code = passed_on(rc)


def keep_job(spec: TuningJobSpec, workdir: Path) -> Path:
    """The job as it runs, into the work dir (LOCAL_JOB_FILE), its ``spec.model.onnx.path`` made
    absolute (relative paths are from the directory the run started in): the result of a run
    whose model is a file can then be compiled from the work dir alone."""
    body = copy.deepcopy(spec.raw)
    onnx = (body.get("model") or {}).get("onnx") or {}
    if isinstance(onnx, dict) and isinstance(onnx.get("path"), str):
        onnx["path"] = str(Path(onnx["path"]).resolve())
    lib = body.get("library") or {}
    if isinstance(lib, dict) and isinstance(lib.get("path"), str):
        lib["path"] = str(Path(lib["path"]).expanduser().resolve())
    out = workdir / LOCAL_JOB_FILE
    out.write_text(yaml.safe_dump({"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND,
                                   "metadata": {"name": spec.name}, "spec": body}, sort_keys=False))
    return out


@dataclass
class LocalRun:
    spec: TuningJobSpec
    job_path: Path
    workdir: Path
    max_client_restarts: int = 3
    procs: list[ProcessGroup] = field(default_factory=list)
    metrics_ports: dict[str, int] = field(default_factory=dict)  # process name -> its /metrics port
    key: str = "sharetune"
    stopping: bool = False
    # Set once a client reports that only shards 0..n-1 have a task to tune (fewer than
    # clients.shards): the other clients are stopped, never restarted, and the merge reads n shards.
    clamped_to: int | None = None
    model_env: dict[str, str] = field(default_factory=dict)  # where the processes find the model
    # GPU group -> a local GPU pool's directory (pool.py): the MPS daemon there is shared
    # with other jobs and is not this run's to start or stop.
    shared_mps: dict[int | None, Path] | None = None
    # Clients of every job running on this host now (a local pool's jobs share its CPUs); None:
    # this job's own shards. Sizes each client's threads to its share of the cores (cpus.py).
    host_clients: int | None = None

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.tracker_port = free_port()
        self.build_authkey = secrets.token_hex(16)
        self.run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)  # the run's name in a library
        self.build_socket: Path | None = None
        # The run's own temporary directory (made by start_services, removed by stop_all): the
        # build service's socket, short enough for AF_UNIX (107 bytes), and the built candidates
        # (a run stopped mid-batch left them in /tmp, one directory each).
        self.scratch = Path(tempfile.gettempdir()) / f"sharetune-local-{secrets.token_hex(6)}"

    def shares_builder(self) -> bool:
        """One build service for all clients (build/service.py) unless the job sizes each client's
        own pool (clients.builderWorkers) or there is only one client."""
        return self.spec.shards > 1 and self.spec.builder_workers is None

    # ---- processes ---------------------------------------------------------------------------
    def _base_env(self) -> dict[str, str]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **NO_MULTICAST, BUILD_AUTHKEY_ENV: self.build_authkey,
               BUILD_DIR_ENV: str(self.scratch / "artifacts"), **self.model_env,
               TENANT_ENV: self.spec.name}  # this job on a shared GPU's tenant list (measure/window.py)
        if self.spec.uses_mps:  # the first GPU's daemon: the merge measures there
            env.update(self.mps_env(self.gpu_groups()[0]))
        return env

    def cpu_env(self) -> dict[str, str]:
        """Clients and the build service: CPU work only (search, NVRTC; the target's arch comes
        from NVML). Kept out of MPS: every process that touches CUDA under a daemon is an MPS
        client, and one GPU's MPS server takes at most 48 (measured on the H200: three jobs'
        builder workers filled it, and every later session and merge got
        cudaErrorDevicesUnavailable). The builder no longer touches CUDA (builder.py); should
        something else, it gets a plain context instead of an MPS slot."""
        return {k: v for k, v in self._base_env().items() if not k.startswith("CUDA_MPS_")}

    # ---- GPUs: one MPS daemon and servers.replicas servers per GPU ------------------------------
    def gpu_groups(self) -> list[int | None]:
        """GPU indices to spread the servers over; ``None`` = one GPU, plain names and paths."""
        return gpu_groups(self.spec)

    def mps_dir(self, g: int | None) -> Path:
        if self.shared_mps is not None:
            return self.shared_mps[g]
        return self.workdir / ("mps" if g is None else f"mps-{g}")

    def mps_env(self, g: int | None) -> dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.mps_dir(g) / "pipe"),
                "CUDA_MPS_LOG_DIRECTORY": str(self.mps_dir(g) / "log")}

    def server_env(self, g: int | None) -> dict[str, str]:
        env = self._base_env()
        if self.spec.uses_mps:
            env.update(self.mps_env(g))  # the GPU is the daemon's: device 0 of its MPS server
        elif g is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(g)  # no MPS: the server owns its GPU
        return env

    def daemon_env(self, g: int | None) -> dict[str, str]:
        env = {**self._base_env(), **self.mps_env(g)}
        if g is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(g)
        return env

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> ProcessGroup:
        port = free_port()
        p = ProcessGroup(name, [sys.executable, "-m", "sharetune_tuner.cli", *args, "--metrics-port", str(port)],
                         self.workdir / "logs" / f"{name}.log", env or self._base_env())
        # Listed before it starts: a Ctrl-C that lands while it starts still finds it (stop_all).
        self.procs.append(p)
        self.metrics_ports[name] = port
        return p.start()

    def shard_dir(self, i: int) -> Path:
        return self.workdir / "shards" / f"shard-{i}"

    def check_target(self) -> None:
        """A cuda job's servers measure on this machine's GPUs: without one, say so now (a
        TargetError) rather than start the run for each client to find it out."""
        if self.spec.target == "cuda":
            cuda_arch()

    def start_services(self) -> None:
        # The model first, once (a URL downloaded, a ConfigMap read): a bad one stops the run here.
        self.model_env = prepare_local_model(self.spec, self.job_path, self.workdir)
        keep_job(self.spec, self.workdir)
        groups = self.gpu_groups()
        (self.scratch / "artifacts").mkdir(parents=True, exist_ok=True)
        if self.shares_builder():
            # First: its workers start (import tvm) while the daemon and servers come up.
            self.build_socket = self.scratch / "sock"
            self._spawn("build-service", commands.build_service(str(self.build_socket)), self.cpu_env())
        if self.spec.uses_mps and self.shared_mps is None:
            for g in groups:
                self._spawn(in_group("mps-daemon", g), commands.mps_daemon(
                    self.spec, str(self.mps_dir(g) / "pipe"), str(self.mps_dir(g) / "log")), self.daemon_env(g))
            # Servers started before the daemon answers would run without MPS.
            daemons = [p for p in self.procs if p.name.startswith("mps-daemon")]
            _wait_until(lambda: all((self.mps_dir(g) / "pipe" / MPS_READY_FILE).exists() for g in groups)
                        or any(d.poll() is not None for d in daemons), 15.0)
            for d in daemons:  # no silent fallback to servers without MPS
                if d.poll() is not None:
                    raise RunFailed(f"{d.name} exited with {d.poll()}:\n{d.tail()}", d.poll())
        self._spawn("tracker", commands.tracker(self.tracker_port, host="127.0.0.1"))
        # A server that finds no tracker retries only after 5 s: start them once it listens.
        _wait_until(lambda: _listening("127.0.0.1", self.tracker_port), 5.0)
        for g in groups:
            for j in range(self.spec.servers.replicas):
                name = in_group("server", g) + f"-{j}"
                port = free_port()
                self._spawn(name,
                            commands.server(self.spec, f"127.0.0.1:{self.tracker_port}", self.key, port, port + 19,
                                            host="127.0.0.1", name=name, require_mps=self.spec.uses_mps),
                            self.server_env(g))

    def client_args(self, i: int) -> list[str]:
        # With at least one server per client, each client keeps sessions open on its share of
        # the servers (runner.SessionRPCRunner); otherwise clients take turns, a session per trial.
        replicas, shards = self.spec.total_servers, self.spec.shards
        session = replicas >= shards
        return commands.client(str(self.job_path), str(self.shard_dir(i)), f"127.0.0.1:{self.tracker_port}", self.key,
                               replicas // shards if session else replicas, shard=i, shards=shards,
                               clients_on_host=self.host_clients or shards, session_runner=session,
                               build_service=str(self.build_socket) if self.build_socket else None,
                               library_args=self.library_args(),
                               peer_dirs=[str(self.shard_dir(j)) for j in range(shards)] if shards > 1 else None)

    def library_args(self) -> list[str]:
        """spec.library in local mode: a directory here (or S3, credentials from this environment),
        the scope ``local`` unless the job names one."""
        lib = self.spec.library
        uri = str(Path(lib.path).expanduser().resolve()) if lib.path else (
            f"s3://{lib.s3.bucket}/{lib.s3.prefix}" if lib.s3 else None)
        return commands.library(uri, lib.scope or LOCAL_LIBRARY_SCOPE, library_mode(lib, DEFAULT_LIBRARY_MODE))

    def start_client(self, i: int) -> ProcessGroup:
        return self._spawn(f"client-{i}", self.client_args(i), self.cpu_env())

    def stop_all(self) -> None:
        self.stopping = True  # run_clients (maybe in another thread) returns instead of restarting
        for p in reversed(self.procs):
            p.stop()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def metrics_targets(self) -> list[str]:
        return [f"127.0.0.1:{self.metrics_ports[p.name]}" for p in self.procs
                if p.alive() and p.name in self.metrics_ports]

    # ---- progress ----------------------------------------------------------------------------
    @property
    def client_shards(self) -> int:
        return self.clamped_to or self.spec.shards

    def progress(self) -> list[dict[str, Any]]:
        """Each shard's progress as its client wrote it; a shard without a readable one is starting,
        one the clamp removed is "clamped"."""
        return [asdict(p) for p in self._shards()]

    def _shards(self) -> list[Progress]:
        out: list[Progress] = []
        for i in range(self.spec.shards):
            p = None
            if i < self.client_shards:
                try:
                    p = Progress.from_json((self.shard_dir(i) / PROGRESS_FILE).read_text())
                except FileNotFoundError:
                    pass
            else:
                p = Progress(self.spec.name, i, self.spec.shards, state="clamped")
            out.append(p or Progress(self.spec.name, i, self.spec.shards))
        return out

    def run_clients(self, on_tick: Any = None, poll_s: float = 0.25) -> None:
        """Runs every shard's client to its end, as the operator's status loop runs the clients'
        Job: the rules (clamp, restart or fail) are ``sharetune.driver``'s."""
        for i in range(self.spec.shards):  # a previous run's progress (in a reused workdir) is not this run's clamp
            (self.shard_dir(i) / PROGRESS_FILE).unlink(missing_ok=True)
        clients = {i: self.start_client(i) for i in range(self.spec.shards)}
        running = set(clients)
        while running and not self.stopping:
            time.sleep(poll_s)
            shards = self._shards()
            if self._clamp(shards, clients, running):
                shards = self._shards()  # the stopped shards now read "clamped"
            if on_tick:
                on_tick([asdict(p) for p in shards])
            for i in sorted(running):
                if self.stopping:
                    return
                rc = clients[i].poll()
                if rc is None:
                    continue
                verdict = client_exit(rc, clients[i].restarts + 1, self.max_client_restarts + 1, one_machine=True)
                if verdict is Verdict.DONE:
                    running.discard(i)
                elif verdict is Verdict.RESTART:
                    restarted = self.start_client(i)  # resumes from its records
                    restarted.restarts = clients[i].restarts + 1
                    clients[i] = restarted
                elif verdict is Verdict.FAIL:  # a bad spec, model or output, no GPU: a restart cannot fix it
                    raise RunFailed(f"client {i} failed ({ExitCode(rc).name.lower()} error, not retried):\n"
                                    f"{clients[i].tail(5)}", rc)
                else:
                    raise RunFailed(f"client {i} failed {clients[i].restarts + 1} times; last log:\n"
                                    f"{clients[i].tail()}", rc)
        if on_tick:
            on_tick(self.progress())

    def _clamp(self, shards: list[Progress], clients: dict[int, ProcessGroup], running: set[int]) -> bool:
        """What the operator does with the clients' Job: once a client has reported how many shards
        have a task, the clients of the others stop; they hold no task, so no record is lost.
        Whether it clamped now."""
        if self.clamped_to is not None:
            return False
        clamp = shard_clamp(self.spec.shards, shards, self.spec.shards_asked)
        if clamp is None:
            return False
        self.clamped_to = clamp.shards
        for i in sorted(running):
            if i >= clamp.shards:
                clients[i].stop()
                running.discard(i)
        print(clamp.message, flush=True)
        return True

    def merge(self) -> Summary:
        out = self.workdir / "result"
        p = self._spawn("merge", commands.merge(str(self.job_path), str(out),
                                                shard_dirs=[str(self.shard_dir(i)) for i in range(self.client_shards)],
                                                library_args=self.library_args(),
                                                library_job=f"{self.spec.name}-{self.run_id}"))
        rc = p.wait()
        if rc != 0:
            raise RunFailed(f"merge failed (exit {rc}):\n{p.tail()}", rc)
        summary = Summary.read(out / SUMMARY_FILE)
        if summary is None:
            raise RunFailed(f"the merge wrote no readable {out / SUMMARY_FILE}", rc)
        return summary
