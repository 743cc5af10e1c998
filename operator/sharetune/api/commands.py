"""The ``sharetune-tuner`` command lines of a job's processes: what the operator's pods run and
what local mode spawns, built in one place so both topologies start the same commands.

Each function returns the arguments after the program name. Flags are the tuner CLI's
(``sharetune_tuner/cli.py``); a test parses every line built here with that parser.
"""

from __future__ import annotations

from .spec import TuningJobSpec


def _opt(flag: str, value: object | None) -> list[str]:
    return [] if value is None else [flag, str(value)]


def mps_limits(spec: TuningJobSpec) -> list[str]:
    """A GPU server's (and the daemon's default) MPS limits: only under MPS do they mean anything."""
    if not spec.uses_mps:
        return []
    return ["--thread-percentage", str(spec.servers.thread_percentage),
            *_opt("--pinned-memory-limit", spec.servers.pinned_memory_limit)]


def mps_daemon(spec: TuningJobSpec, pipe_dir: str, log_dir: str, metrics_port: int | None = None,
               client_group: int | None = None, publish_gpu: bool = False) -> list[str]:
    """The job's MPS control daemon. No default thread percentage: a client's
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE can only lower the daemon's default, so a default at the
    tuning share capped every later process there (the merge's serving report measured every
    share above it at the tuning share). Each server sets its own share in its environment.
    ``client_group``: the GID its clients run as (in pods; local mode: the daemon's own).
    ``publish_gpu``: in a pod, the held GPU's UUID goes on the pod (sharetune_tuner.measure.gpu_identity)."""
    return ["mps-daemon", "--pipe-dir", pipe_dir, "--log-dir", log_dir,
            *_opt("--pinned-memory-limit", spec.servers.pinned_memory_limit if spec.uses_mps else None),
            *_opt("--client-group", client_group), *(["--publish-gpu"] if publish_gpu else []),
            *_opt("--metrics-port", metrics_port)]


def mps_dir(path: str, uid: int, gid: int) -> list[str]:
    """A daemon pod's init container: the host directory handed to the daemon's non-root user."""
    return ["mps-dir", path, "--owner", f"{uid}:{gid}"]


def pool_daemon(pipe_dir: str, log_dir: str, metrics_port: int | None = None,
                client_group: int | None = None, publish_gpu: bool = False) -> list[str]:
    """A GPU pool's MPS control daemon (mode pool, docs/gpu-pools.md): shared by every job on its
    GPU, so no default limits of its own; each job's servers set theirs in their environment.
    ``publish_gpu``: as :func:`mps_daemon`'s."""
    return ["mps-daemon", "--pipe-dir", pipe_dir, "--log-dir", log_dir, *_opt("--client-group", client_group),
            *(["--publish-gpu"] if publish_gpu else []), *_opt("--metrics-port", metrics_port)]


def tracker(port: int, host: str | None = None, metrics_port: int | None = None) -> list[str]:
    return ["tracker", *_opt("--host", host), "--port", str(port), *_opt("--metrics-port", metrics_port)]


def server(spec: TuningJobSpec, tracker_addr: str, key: str, port: int, port_end: int, *, host: str | None = None,
           name: str | None = None, metrics_port: int | None = None, require_mps: bool = False) -> list[str]:
    """``require_mps``: the server's pipe directory is a daemon sharetune runs (a job's, a pool's,
    local mode's): it waits for it and never measures outside MPS."""
    return ["server", "--tracker", tracker_addr, "--key", key, *_opt("--host", host), "--port", str(port),
            "--port-end", str(port_end), *_opt("--name", name), *mps_limits(spec),
            *(["--require-mps"] if require_mps else []), *_opt("--metrics-port", metrics_port)]


def library(uri: str | None, scope: str, mode: str) -> list[str]:
    """The tuning library a client starts from and a merge adds to; nothing without one."""
    if not uri or mode == "none":
        return []
    return ["--library", uri, "--library-scope", scope, "--library-mode", mode]


def client(job_manifest: str, work_dir: str, tracker_addr: str, key: str, servers: int, *,
           shard: int | None = None, shards: int | None = None, store: str | None = None,
           progress: str | None = None, clients_on_host: int | None = None, session_runner: bool = False,
           build_service: str | None = None, metrics_port: int | None = None,
           arch_from_servers: bool = False, library_args: list[str] | None = None,
           peer_dirs: list[str] | None = None) -> list[str]:
    """A shard's client. In a pod ``shard`` is left out: the Indexed Job's completion index is it.
    ``arch_from_servers``: a client that sees no GPU (a pod) asks the job's servers for the cuda arch.
    ``peer_dirs``: every shard's directory, in shard order (local mode; pods read the store)."""
    return ["client", "--job", job_manifest, *_opt("--shard", shard), *_opt("--shards", shards),
            "--work-dir", work_dir, "--tracker", tracker_addr, "--key", key, "--servers", str(servers),
            *(["--session-runner"] if session_runner else []), *(["--arch-from-servers"] if arch_from_servers else []),
            *_opt("--clients-on-host", clients_on_host),
            *_opt("--build-service", build_service), *_opt("--store", store), *_opt("--progress", progress),
            *_opt("--metrics-port", metrics_port), *(library_args or []),
            *[a for d in peer_dirs or [] for a in ("--peer-dir", d)]]


def build_service(listen: str, metrics_port: int | None = None, workers: int | None = None) -> list[str]:
    """A build service on a Unix socket path (local mode) or host:port (a builder pod); its clients
    get the address as ``client(build_service=...)``."""
    return ["build-service", "--listen", listen, *_opt("--workers", workers), *_opt("--metrics-port", metrics_port)]


def merge(job_manifest: str, out: str, *, store: str | None = None, shards: int | None = None,
          shard_dirs: list[str] | None = None, result_configmap: str | None = None, progress: str | None = None,
          metrics_port: int | None = None, library_args: list[str] | None = None,
          library_job: str | None = None) -> list[str]:
    """The merge: shards from ``store`` (pods) or from ``shard_dirs`` (local mode)."""
    return ["merge", "--job", job_manifest, *_opt("--store", store), *_opt("--shards", shards),
            *[a for d in shard_dirs or [] for a in ("--shard-dir", d)], "--out", out,
            *_opt("--result-configmap", result_configmap), *_opt("--progress", progress),
            *_opt("--metrics-port", metrics_port), *(library_args or []),
            *(_opt("--library-job", library_job) if library_args else [])]


def result(action: str, where: str, out: str, *, namespace: str | None = None,
           model: str | None = None) -> list[str]:
    """A job's result fetched (``action`` "fetch") or its model compiled ("compile") into ``out``:
    what `sharetune result` runs, its arguments passed on."""
    return ["result", action, where, "--out", out, *_opt("--namespace", namespace), *_opt("--model", model)]


def s3_cleanup(bucket: str, job_prefix: str) -> list[str]:
    """Deletes a job's objects from its bucket: every key under ``<job_prefix>/`` (the tuner adds
    the slash, so job "a" never takes the objects of job "ab")."""
    return ["s3-cleanup", "--bucket", bucket, "--prefix", job_prefix]
