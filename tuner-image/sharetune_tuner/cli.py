"""`sharetune-tuner`: the processes a TuningJob's pods run (and local mode spawns).

  mps-daemon   CUDA MPS control daemon with default limits, health-checked, `quit` on stop
  mps-dir      give a daemon's host directory to the daemon's non-root user (init container)
  tracker      TVM RPC tracker
  server       TVM RPC server under a key, with MPS thread-percentage / pinned-memory limits
  client       tunes one shard of the model's tasks (resumable)
  build-service  one builder pool for the clients of a host (local mode) or a job (builder pods)
  merge        merges shard databases, compiles, checks, measures, writes the summary
  s3-cleanup   deletes a deleted job's objects from its bucket (spec.output.s3.cleanupOnDelete)
  result       fetches a job's result, or compiles its model with it (what `sharetune result` runs)

Each but ``result`` serves /metrics and /healthz on --metrics-port (0 = any free port, -1 = off; the
MPS daemon also /livez: see sharetune_tuner.measure.mps) and stops cleanly on SIGTERM. User errors print
one line and exit with a distinct code (see errors.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sharetune import result_args
from sharetune.api.spec import SpecError, TuningJobSpec, load_job

from .errors import TunerError
from .store import library_cli

PROCESS_STARTED_AT = time.time()  # ~ the process's start: the client reports its start-up from here

log = logging.getLogger("sharetune.tuner")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--metrics-port", type=int, default=int(os.environ.get("SHARETUNE_METRICS_PORT", "-1")),
                   help="port for /metrics and /healthz (0 = any free port, -1 = off)")
    p.add_argument("-v", "--verbose", action="store_true")


def _tracker_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tracker", default=os.environ.get("TVM_TRACKER_HOST", "127.0.0.1") + ":" +
                   os.environ.get("TVM_TRACKER_PORT", "9190"), help="tracker host:port")
    p.add_argument("--key", default=os.environ.get("TVM_TRACKER_KEY", "sharetune"), help="tracker key")


# How many ports a server tries from --port when --port-end is not given: as many as TVM's own
# defaults (9091 up to 9199), wherever --port starts them.
SERVER_PORTS = 9199 - 9091


def server_ports(port: int, port_end: int | None) -> tuple[int, int]:
    """The ports [first, end) a server tries to listen on, from its --port and --port-end."""
    end = min(port + SERVER_PORTS, 65536) if port_end is None else port_end
    if not 0 < port < end <= 65536:
        raise TunerError(f"--port {port} --port-end {end}: the ports to try, [port, port-end), must be a "
                         "non-empty range within 1..65535")
    return port, end


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise TunerError(f"--tracker must be host:port, got {addr!r}")
    return host, int(port)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sharetune-tuner", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    _add_gpu_and_rpc_commands(sub)
    _add_tuning_commands(sub)
    result_args.add_arguments(sub.add_parser("result", help=result_args.HELP))  # `sharetune result`'s own
    library_cli.add_arguments(sub.add_parser("library", help=library_cli.HELP))  # `sharetune library`'s own
    return p


def _add_gpu_and_rpc_commands(sub: Any) -> None:
    """The long-running services: the MPS daemon (and its host directory), tracker and servers."""
    m = sub.add_parser("mps-daemon", help="run the CUDA MPS control daemon")
    m.add_argument("--pipe-dir", type=Path, default=Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/mps-pipe")))
    m.add_argument("--log-dir", type=Path, default=Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/tmp/mps-log")))
    m.add_argument("--thread-percentage", type=int, default=None, help="default active thread percentage")
    m.add_argument("--pinned-memory-limit", default=None, help="default pinned device memory limit, e.g. 8G")
    m.add_argument("--control-binary", default="nvidia-cuda-mps-control")
    m.add_argument("--client-group", type=int, default=None,
                   help="GID of the MPS clients (servers, merge): the group that may add tenant files to the pipe "
                   "directory's measurement windows (default: this process's group)")
    m.add_argument("--gpu-check", action=argparse.BooleanOptionalAction, default=True,
                   help="require a GPU through NVML before starting (off only for a stand-in control binary in tests)")
    m.add_argument("--publish-gpu", action="store_true",
                   help="in a pod: write the held GPU's UUID (NVML) as an annotation on this pod (POD_NAME, "
                   "POD_NAMESPACE), for the operator to give exactly that GPU to the daemon's clients")
    _common(m)

    h = sub.add_parser("mps-dir", help="give an MPS daemon's host directory to the daemon's (non-root) user "
                       "(a daemon pod's init container, as root)")
    h.add_argument("dir", type=Path, help="the directory (pipe/ and log/ are made in it)")
    h.add_argument("--owner", required=True, help="UID:GID the daemon and its clients run as, e.g. 1000:1000")
    h.add_argument("-v", "--verbose", action="store_true")

    t = sub.add_parser("tracker", help="run the TVM RPC tracker")
    t.add_argument("--host", default="0.0.0.0")
    t.add_argument("--port", type=int, default=9190)
    _common(t)

    s = sub.add_parser("server", help="run a TVM RPC tuning server registered at the tracker")
    _tracker_args(s)
    s.add_argument("--host", default="0.0.0.0")
    s.add_argument("--port", type=int, default=9091, help="first port to try")
    s.add_argument("--port-end", type=int, default=None,
                   help=f"end of the ports to try, exclusive (default: --port + {SERVER_PORTS})")
    s.add_argument("--thread-percentage", type=int, default=None, help="CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    s.add_argument("--pinned-memory-limit", default=None, help="CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for GPU 0, e.g. 4G")
    s.add_argument("--require-mps", action="store_true",
                   help="the job asked for MPS: wait for the daemon in $CUDA_MPS_PIPE_DIRECTORY, never run without it")
    s.add_argument("--mps-wait-s", type=float, default=120.0, help="with --require-mps: how long to wait for it")
    s.add_argument("--advertise-addr", default=os.environ.get("POD_IP"), help="address the tracker hands out")
    s.add_argument("--name", default=os.environ.get("HOSTNAME", "server"))
    _common(s)


def _library_args(p: Any) -> None:
    """The tuning library a client starts from and a merge adds to (search/warm_start.py)."""
    p.add_argument("--library", default=None, metavar="URI",
                   help="the tuning library: a directory or s3://bucket/prefix (credentials as "
                   "SHARETUNE_LIBRARY_AWS_ACCESS_KEY_ID etc., else the store's)")
    p.add_argument("--library-scope", default="default", help="the library's scope (a cluster's jobs: their namespace)")
    p.add_argument("--library-mode", default="warm", choices=["none", "warm", "reuse"])


def _library_use(a: argparse.Namespace, spec: Any, ask_name: Callable[[], str] | None = None) -> Any:
    """The job's library use (None: none): measuring on this job's device at its servers' share."""
    if not a.library or a.library_mode == "none":
        return None
    from .search.warm_start import LibraryUse
    from .store.library import Where
    from .targets import device_model

    share = spec.servers.thread_percentage if spec.uses_mps else 100
    return LibraryUse(a.library, a.library_scope, a.library_mode, Where(device_model(spec.target, ask_name), share))


def _add_tuning_commands(sub: Any) -> None:
    """A shard's client, the build service, the merge and the S3 clean-up."""
    c = sub.add_parser("client", help="tune one shard of the model's tasks")
    c.add_argument("--job", type=Path, required=True, help="TuningJob YAML (what local mode and pods read)")
    c.add_argument("--shard", type=int, default=int(os.environ.get("JOB_COMPLETION_INDEX", "0")))
    c.add_argument("--shards", type=int, default=None, help="default: spec.clients.shards")
    c.add_argument("--work-dir", type=Path, required=True, help="this shard's record directory")
    c.add_argument("--servers", type=int, default=None, help="runner workers (default: spec.servers.replicas)")
    c.add_argument("--tracker-wait", type=float, default=120.0, help="seconds to wait for a server")
    c.add_argument("--store", default=None, help="configmap://ns/job or s3://bucket/prefix: restore from and "
                   "upload the shard's records there (what pods do)")
    c.add_argument("--progress", default=None, help="configmap://ns/job for progress when --store is s3")
    c.add_argument("--sync-interval", type=float, default=10.0)
    c.add_argument("--peer-dir", type=Path, action="append", default=[],
                   help="every shard's record directory, in shard order (local mode): the cost model learns "
                   "the other shards' records too (pods read them from --store)")
    c.add_argument("--clients-on-host", type=int, default=1,
                   help="clients sharing this host's CPUs: sizes the default builder pool (local mode: all shards)")
    c.add_argument("--build-service", default=None, metavar="ADDR",
                   help="the build service: a Unix socket path (local mode) or host:port (the job's builder "
                   "pods); default: build in this client")
    c.add_argument("--session-runner", action="store_true",
                   help="keep one RPC session per runner worker (needs --servers <= this client's share)")
    c.add_argument("--arch-from-servers", action="store_true",
                   help="target cuda, no GPU seen here (a pod): ask the job's servers for the GPU's arch")
    _library_args(c)
    _tracker_args(c)
    _common(c)

    b = sub.add_parser("build-service", help="a builder pool for the tuning clients of a host or a job")
    b.add_argument("--listen", "--socket", dest="listen", required=True, metavar="ADDR",
                   help="a Unix socket path (local mode) or host:port (a builder pod) to listen on")
    b.add_argument("--workers", type=int, default=None, help="builder processes (default: this host's CPUs)")
    b.add_argument("--timeout", type=float, default=60.0, help="seconds one build may take")
    _common(b)

    g = sub.add_parser("merge", help="merge shard records, compile, check and measure the tuned model")
    g.add_argument("--job", type=Path, required=True)
    g.add_argument("--shard-dir", type=Path, action="append", default=[], help="repeat per shard")
    g.add_argument("--store", default=None, help="read shards from / write the result to this store")
    g.add_argument("--shards", type=int, default=None, help="with --store: how many shards")
    g.add_argument("--result-configmap", default=None, help="result ConfigMap name (default <job>-result)")
    g.add_argument("--progress", default=None, help="configmap://ns/job: also put summary.json in the result "
                   "ConfigMap (when --store is s3)")
    g.add_argument("--out", type=Path, required=True, help="output directory (records + summary.json)")
    _library_args(g)
    g.add_argument("--library-job", default=None, metavar="ID",
                   help="the job's id in the library (a TuningJob's uid; default: the job's name)")
    _common(g)

    d = sub.add_parser("s3-cleanup", help="delete a job's objects from its S3 bucket (credentials and endpoint "
                       "from the environment, as the store's)")
    d.add_argument("--bucket", required=True)
    d.add_argument("--prefix", required=True, help="the job's prefix, [<prefix>/]<namespace>/<job>: every key "
                   "under <prefix>/ is deleted")
    _common(d)


def _status_server(port: int, health: Any = None, live: Any = None) -> Any:
    if port < 0:
        return None
    from .service import StatusServer

    srv = StatusServer(port, health, live=live).start()
    log.info("metrics and health on port %d", srv.port)
    return srv


def _serve(metrics_port: int, health: Any, loop: Any, live: Any = None) -> int:
    """A long-running command: SIGTERM/SIGINT set the stop event ``loop`` polls, and /metrics +
    /healthz (+ /livez) are served for as long as it runs."""
    from .service import stop_on_signals

    stop = stop_on_signals()
    srv = _status_server(metrics_port, health, live)
    try:
        return int(loop(stop))
    finally:
        if srv:
            srv.stop()


def _load_spec(path: Path) -> TuningJobSpec:
    try:
        return load_job(path)
    except (SpecError, OSError) as e:
        raise TunerError(f"{path}: {e}") from None


def run(a: argparse.Namespace) -> int:
    from .service import setup_logging

    command = _COMMANDS.get(a.cmd)
    if command is None:
        raise AssertionError(a.cmd)
    if a.cmd not in ("result", "library"):  # a user's command, which prints its own lines: no process log
        setup_logging(a.verbose)
    return command(a)


def _library(a: argparse.Namespace) -> int:
    return library_cli.run(a)


def _result(a: argparse.Namespace) -> int:
    from .result_cli import run as result

    return result(a)


def _tracker(a: argparse.Namespace) -> int:
    from .measure.rpc import run_tracker

    return _serve(a.metrics_port, None, lambda stop: run_tracker(a.host, a.port, stop))


def _server(a: argparse.Namespace) -> int:
    host, port = _split(a.tracker)
    first, end = server_ports(a.port, a.port_end)
    from .measure.rpc import ServerConfig, TuningServer

    server = TuningServer(ServerConfig(host, port, a.key, host=a.host, port=first, port_end=end,
                                       thread_percentage=a.thread_percentage,
                                       pinned_memory_limit=a.pinned_memory_limit,
                                       custom_addr=a.advertise_addr, name=a.name,
                                       require_mps=a.require_mps, mps_wait_s=a.mps_wait_s))
    return _serve(a.metrics_port, server.health, server.serve)


def _mps_dir(a: argparse.Namespace) -> int:
    from .measure.mps import hand_over

    try:
        uid, gid = (int(x) for x in a.owner.split(":"))
    except ValueError:
        raise TunerError(f"--owner {a.owner!r} is not UID:GID: give two numbers, e.g. 1000:1000") from None
    n = hand_over(a.dir, uid, gid)
    print(f"{a.dir}: owned by {uid}:{gid} ({n} entries changed)", flush=True)
    return 0


def _mps_daemon(a: argparse.Namespace) -> int:
    from .measure.mps import MpsDaemon

    d = MpsDaemon(a.pipe_dir, a.log_dir, a.thread_percentage, a.pinned_memory_limit, a.control_binary,
                  require_gpu=a.gpu_check, client_group=a.client_group)
    if not a.publish_gpu:
        return _serve(a.metrics_port, d.health, d.run, live=d.live)
    from .measure.gpu_identity import held_gpu_uuid, own_pod, publish_until_done

    pod, namespace = own_pod()  # usage errors before anything starts
    uuid = held_gpu_uuid()

    def publish_and_run(stop: Any) -> int:
        publish_until_done(uuid, pod, namespace, stop)
        return int(d.run(stop))

    return _serve(a.metrics_port, d.health, publish_and_run, live=d.live)


def _build_service(a: argparse.Namespace) -> int:
    from .build.cpus import available_cpus
    from .build.protocol import AddressError
    from .build.service import BuildService

    try:
        svc = BuildService(a.listen, a.workers or available_cpus(), a.timeout)
    except (AddressError, RuntimeError) as e:  # a bad address, no key
        raise TunerError(str(e)) from None
    return _serve(a.metrics_port, None, svc.serve)


def _s3_cleanup(a: argparse.Namespace) -> int:
    from .store.backends import delete_s3_prefix

    prefix, deleted = delete_s3_prefix(a.bucket, a.prefix)
    print(json.dumps({"bucket": a.bucket, "prefix": prefix, "deleted": deleted}))
    return 0


def _client(a: argparse.Namespace) -> int:
    from .client import ClientConfig, run_client
    from .model import loader as model_mod
    from .targets import make_target, servers_cuda_arch, servers_gpu_name

    spec = _load_spec(a.job)
    shards = a.shards or spec.shards
    if not 0 <= a.shard < shards:
        raise TunerError(f"--shard {a.shard} is outside [0, {shards})")
    host, port = _split(a.tracker)
    if a.build_service:
        from .build.protocol import AddressError, parse_address

        try:
            parse_address(a.build_service)
        except AddressError as e:
            raise TunerError(f"--build-service: {e}") from None
    srv = _status_server(a.metrics_port)
    try:
        sync = _shard_sync(a) if a.store else None
        try:
            # Model and target are loaded once the shard can report: a bad model (corrupt ONNX,
            # unreachable URL) then reaches the job's status as this shard's failure message.
            model = model_mod.load_for_spec(spec.model)
            # A pod's client sees no GPU: a cuda job's arch is then its servers' GPU's. A local
            # client that finds none fails at once: the servers run on this machine too.
            ask = (lambda: servers_cuda_arch(host, port, a.key, a.tracker_wait)) if a.arch_from_servers else None
            target = make_target(spec.target, spec.builder_workers, ask_servers=ask)
            ask_name = ((lambda: servers_gpu_name(host, port, a.key, a.tracker_wait)) if a.arch_from_servers
                        else None)
            cfg = ClientConfig(job=spec.name, shard=a.shard, shards=shards, work_dir=a.work_dir,
                               tracker_host=host, tracker_port=port,
                               tracker_key=a.key, servers=a.servers or spec.servers.replicas,
                               total_trials=spec.trials.total, trials_per_task=spec.trials.per_task,
                               trials_per_iter=spec.trials.per_iteration, cost_model=spec.cost_model,
                               seed=spec.seed, builder_workers=spec.builder_workers,
                               clients_on_host=a.clients_on_host, build_service=a.build_service,
                               tracker_wait_s=a.tracker_wait, session_runner=a.session_runner,
                               process_started_at=PROCESS_STARTED_AT, library=_library_use(a, spec, ask_name))
            if sync is not None:
                cfg.on_round = sync.poke
                cfg.store_ahead = sync.write_ahead
            cfg.peers = _peers(a, sync)
            progress = run_client(cfg, model, target)
            if sync is not None:
                sync.stop()
        except TunerError as e:
            if sync is not None:
                sync.fail(str(e))  # the operator shows this as the shard's (and job's) reason
            raise
        print(json.dumps({"shard": a.shard, "done": progress.done, "budget": progress.budget,
                          "resumed": progress.resumed, "errors": progress.errors}))
        return 0
    finally:
        if srv:
            srv.stop()


def _peers(a: argparse.Namespace, sync: Any) -> Any:
    """Where the job's other shards' records are: the job's store (pods), else the shards'
    directories (``--peer-dir``, local mode); None: neither."""
    from .search.peer_records import dir_fetch, store_fetch

    if os.environ.get("SHARETUNE_PEER_RECORDS", "on") == "off":  # a benchmark's arm without it
        return None
    if sync is not None:
        return store_fetch(sync.store)
    if a.peer_dir:
        return dir_fetch(dict(enumerate(a.peer_dir)))
    return None


def _shard_sync(a: argparse.Namespace) -> Any:
    """The shard's records restored from the job's store (a restarted client resumes from them),
    then kept in sync with it; the client's log goes into the shard's folder, to travel with its
    records."""
    from sharetune.api.topology import CLIENT_LOG

    from .store.backends import open_store
    from .store.sync import ShardSync

    a.work_dir.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(a.work_dir / CLIENT_LOG)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.getLogger().addHandler(handler)
    store = open_store(a.store)
    sink = open_store(a.progress) if a.progress else None
    sync = ShardSync(store, sink, a.shard, a.work_dir, a.sync_interval)
    restored = sync.restore()
    if restored:
        log.info("restored %d records of shard %d from %s", restored, a.shard, store.uri)
    sync.start()
    return sync


def _merge(a: argparse.Namespace) -> int:
    from sharetune.api.topology import CLIENT_LOG, RESULT_OBJECT, SUMMARY_FILE, shard_object

    from .merge import merge_and_report

    spec = _load_spec(a.job)
    shard_dirs = list(a.shard_dir)
    store = None
    from .store.backends import open_store, pack, unpack

    if a.store:
        store = open_store(a.store, a.result_configmap)
        for i in range(a.shards or spec.shards):
            data = store.get(shard_object(i))
            if data is None:
                raise TunerError(f"shard {i} has no records in {store.uri}")
            unpack(data, a.out / "shards" / shard_object(i))
            shard_dirs.append(a.out / "shards" / shard_object(i))
    if not shard_dirs:
        raise TunerError("give --shard-dir per shard, or --store")
    (a.out / "logs").mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(a.out / "logs" / "merge.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    logging.getLogger().addHandler(handler)
    for i, d in enumerate(shard_dirs):  # the clients' logs travel with their records
        if (d / CLIENT_LOG).exists():
            shutil.copyfile(d / CLIENT_LOG, a.out / "logs" / f"{shard_object(i)}.log")
    summary = merge_and_report(spec, shard_dirs, a.out, _library_use(a, spec), a.library_job)
    if store is not None:
        store.put(RESULT_OBJECT, pack(a.out, ["records", "best", SUMMARY_FILE, "logs"]),
                  extra={SUMMARY_FILE: summary.to_json()})
    if a.progress:
        sink = open_store(a.progress, a.result_configmap)
        sink.put_text(RESULT_OBJECT, SUMMARY_FILE, summary.to_json())
    print(json.dumps({"records": summary.records, "speedup": summary.speedup,
                      "latency_untuned_ms": summary.latency_untuned_ms, "latency_tuned_ms": summary.latency_tuned_ms}))
    return 0


# Each subcommand's body, by its name (build_parser's subparsers).
_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "tracker": _tracker, "server": _server, "mps-dir": _mps_dir, "mps-daemon": _mps_daemon,
    "build-service": _build_service, "client": _client, "merge": _merge, "s3-cleanup": _s3_cleanup,
    "result": _result, "library": _library,
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return run(args)
    except TunerError as e:
        print(f"sharetune-tuner {args.cmd}: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
