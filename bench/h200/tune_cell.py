"""One tuning cell: the baseline or one sharetune (M, N, P) configuration, appended to
``h200-cells.jsonl``. Run dirs (records, logs) stay under $BENCH_RUN_ROOT/runs/<id> for the
evaluation cell.

  python bench/h200/tune_cell.py --id base-r18 --mode baseline --tasks 8 --trials 16
  python bench/h200/tune_cell.py --id st-r18-m4n4p25 --mode sharetune --clients 4 --servers 4 --pct 25
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import (
    RUN_ROOT,
    Group,
    Sampler,
    append_cell,
    free_port,
    gpu_name,
    load_cells,
    log,
    mps_control,
    parse_cpus,
    tuner_env,
)

CELLS = "h200-cells.jsonl"


def _records(db: Path) -> list[Any]:
    from sharetune_tuner.store.records import RECORDS, read_lines

    return read_lines(db / RECORDS)


def _all_us(dbs: list[Path]) -> dict[str, list[float]]:
    """Every valid measured latency (us) per task (workload hash), sorted: the distribution of the
    candidates a search proposed. Best-of-16 alone varies 50-87 us (geometric mean over tasks)
    between runs of one arm (H200 r12-r14), too noisy to compare searches; the whole distribution
    is 16x the samples."""
    from sharetune_tuner.store.records import RECORDS, WORKLOADS, read_lines

    found: dict[str, list[float]] = {}
    for db in dbs:
        hashes = [str(w[0]) for w in read_lines(db / WORKLOADS)]
        for idx, body in read_lines(db / RECORDS):
            secs = [float(x) for x in (body[1] or [])]
            if secs and sum(secs) / len(secs) < 1e9 and idx < len(hashes):
                found.setdefault(hashes[idx], []).append(round(sum(secs) / len(secs) * 1e6, 3))
    return {k: sorted(v) for k, v in found.items()}


def _best_us(dbs: list[Path]) -> dict[str, float]:
    """Best measured latency (us) per task (workload hash) over the cell's databases: the search
    quality a cell reached, compared between arms that differ only in search."""
    return {k: v[0] for k, v in _all_us(dbs).items()}


def _failed(recs: list[Any]) -> int:
    n = 0
    for _, body in recs:
        secs = [float(x) for x in (body[1] or [])]
        if not secs or sum(secs) / len(secs) >= 1e9:
            n += 1
    return n


def run_baseline(a: argparse.Namespace, wd: Path, servers: int = 1, runner_workers: int | None = None,
                 builder_workers: int | None = None, scheduler: str | None = None,
                 builder_timeout_s: float | None = None) -> dict[str, Any]:
    """Stock MetaSchedule (baseline_client.py) through a tracker and ``servers`` RPC servers on the
    whole GPU (no MPS). ``runner_workers`` / ``builder_workers``: RPCRunner / LocalBuilder
    max_workers (None: stock); ``scheduler``: tune_tasks' task scheduler (None: stock);
    ``builder_timeout_s``: LocalBuilder's timeout (None: stock, 30 s). With
    ``a.window_s`` the client is stopped (its process group) at the window's end, keeping every
    record written so far, and each measured candidate is counted as it is measured
    (``measured_times``: measured.py); ``a.total``: the global budget."""
    from measured import ENV as MEASURED_ENV
    from measured import read_times
    from sharetune_tuner.client import wait_for_tracker

    env = tuner_env()
    g = Group(wd / "logs")
    port = free_port()
    key = "baseline"
    db = wd / "db"
    window_s = getattr(a, "window_s", None)
    total = getattr(a, "total", None)
    measured_log = wd / "measured.log"
    if window_s:
        env[MEASURED_ENV] = str(measured_log)
    sampler = Sampler([db], roles=bool(getattr(a, "window_s", None))).start()
    t0 = time.time()
    stopped_at_window = False
    try:
        g.start("tracker", [sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                            "--port", str(port), "--port-end", str(port + 1), "--silent"], env)
        time.sleep(1.0)
        for j in range(servers):  # one server: the argv of every earlier baseline cell
            name, lo = ("server", 9300) if servers == 1 else (f"server-{j}", 9300 + 40 * j)
            g.start(name, [sys.executable, "-m", "tvm.exec.rpc_server", "--tracker", f"127.0.0.1:{port}",
                           "--key", key, "--host", "127.0.0.1", "--port", str(lo), "--port-end", str(lo + 30),
                           "--silent"], env)
        wait_for_tracker("127.0.0.1", port, key, 60.0)
        extra = [*(["--total", str(total)] if total else []),
                 *(["--runner-workers", str(runner_workers)] if runner_workers else []),
                 *(["--builder-workers", str(builder_workers)] if builder_workers else []),
                 *(["--builder-timeout-s", str(builder_timeout_s)] if builder_timeout_s else []),
                 *(["--scheduler", scheduler] if scheduler else []),
                 *(["--count-measured"] if window_s else [])]
        client = g.start("client", [sys.executable, str(Path(__file__).with_name("baseline_client.py")),
                                    "--work-dir", str(wd), "--model", a.model, "--target", a.target,
                                    "--tasks", str(a.tasks), "--trials", str(a.trials),
                                    "--tracker", f"127.0.0.1:{port}", "--key", key, "--seed", str(a.seed), *extra],
                         env)
        if window_s:
            try:
                rc = client.wait(max(0.0, t0 + window_s - time.time()))
            except subprocess.TimeoutExpired:
                rc, stopped_at_window = 0, True
        else:
            rc = client.wait(a.timeout)
        t1 = time.time()
        if rc != 0:
            raise RuntimeError(f"baseline client exited {rc}:\n{g.tail('client')}")
    finally:
        g.stop()
        sampler.stop()
    if stopped_at_window:
        info = {"phases": None, "tasks": json.loads((wd / "tasks.json").read_text())
                if (wd / "tasks.json").exists() else []}
    else:
        info = json.loads((wd / "client.json").read_text())
    return {"t0": t0, "t1": t1, "db_dirs": [str(db)], "sampler": sampler, "phases": [info["phases"]],
            "tasks": info["tasks"],
            **({"stopped_at_window": stopped_at_window, "measured_times": read_times(measured_log)}
               if window_s else {})}


def _mps_servers(wd: Path) -> str:
    """Proof that the servers ran as MPS clients: the control daemon's server list and the
    clients of each MPS server."""

    def ctl(cmd: str) -> str:
        return mps_control(cmd, wd / "mps" / "pipe", wd / "mps" / "log", 10.0)

    servers = ctl("get_server_list")
    out = [f"servers: {servers}"]
    for pid in servers.split():
        if pid.isdigit():
            out.append(f"clients of {pid}: {ctl(f'get_client_list {pid}')}")
    return "; ".join(out)


def run_sharetune(a: argparse.Namespace, wd: Path) -> dict[str, Any]:
    os.environ.update(tuner_env({"BENCH_TASKS": str(a.tasks)}))
    if a.pop_per_cand:
        os.environ["BENCH_POP_PER_CAND"] = str(a.pop_per_cand)
    from sharetune.api.spec import load_job
    from sharetune.local.run import LocalRun
    from sharetune.procs import ProcessGroup
    from sharetune_tuner.build.cpus import default_builder_workers

    # --cores: the tuning topology (tracker, servers, clients, their own builds) pinned to these CPUs,
    # as on a GPU node with that many cores; children inherit this process's affinity.
    topo_cpus = parse_cpus(a.cores) if a.cores else sorted(os.sched_getaffinity(0))
    # --builder-pods K --builder-cores LIST: K build services over TCP, each pinned to its own slice
    # of LIST (disjoint from --cores), as builder pods on CPU nodes would be; the clients send every
    # candidate there (remote_builder.RemoteBuilder).
    pod_cpus = _split_cpus(parse_cpus(a.builder_cores), a.builder_pods) if a.builder_pods else []
    # --builder-workers N: every client its own pool of N (rounds up to r5: N = 2 x cores / clients);
    # default: the clients share one build service of the host's cores (local mode's default).
    shared = a.builder_workers is None and a.clients > 1 and not pod_cpus
    workers = a.builder_workers or (len(topo_cpus) if shared else
                                    default_builder_workers(a.clients, len(topo_cpus)))
    mps = a.target == "cuda" and (a.pct < 100 or a.servers > 1)  # MPS only means something on a GPU
    window_s = getattr(a, "window_s", None)
    total = getattr(a, "total", None) or a.tasks * a.trials
    job = wd / "job.yaml"
    job.write_text(f"""apiVersion: sharetune.io/v1alpha1
kind: TuningJob
metadata:
  name: {a.id}
spec:
  model:
    name: {a.model}
  target: {a.target}
  trials:
    total: {total}
    perTask: {a.trials}
    perIteration: {a.per_iter}
  servers:
    replicas: {a.servers}
    threadPercentage: {a.pct}
  clients:
    shards: {a.clients}
{"" if shared or pod_cpus else f"    builderWorkers: {workers}"}
  gpuSharing:
    mps: {str(mps).lower()}
  costModel: xgb
  seed: {a.seed}
""")
    spec = load_job(job)

    class BenchRun(LocalRun):
        def start_client(self, i: int) -> ProcessGroup:  # no metrics port: not in metrics_ports
            p = ProcessGroup(f"client-{i}", [sys.executable, str(Path(__file__).with_name("st_client.py")),
                                             *self.client_args(i), "--metrics-port", "-1"],
                             self.workdir / "logs" / f"client-{i}.log", self._base_env()).start()
            self.procs.append(p)
            return p

        def shares_builder(self) -> bool:
            return shared

    lr = BenchRun(spec, job, wd)
    dbs = [lr.shard_dir(i) for i in range(a.clients)]
    groups = {"topology": topo_cpus, **({"builders": [c for cs in pod_cpus for c in cs]} if pod_cpus else {})}
    sampler = Sampler(dbs, core_groups=groups, roles=bool(getattr(a, "window_s", None))).start()
    pods = Group(wd / "logs")
    t0 = time.time()
    mps_check = None
    try:
        addrs = []
        for k, cpus in enumerate(pod_cpus):
            port = free_port()
            os.sched_setaffinity(0, cpus)  # the pod's process (and its workers) inherit these CPUs
            pods.start(f"builder-{k}", [sys.executable, "-m", "sharetune_tuner.cli", "build-service", "--listen",
                                        f"127.0.0.1:{port}", "--workers", str(len(cpus)), "--metrics-port", "-1"],
                       lr._base_env())
            addrs.append(f"127.0.0.1:{port}")
        os.sched_setaffinity(0, topo_cpus)
        lr.start_services()
        if addrs:
            lr.build_socket = ",".join(addrs)  # client_args passes it on
        finished = _run_clients(lr, t0 + window_s if window_s else None)
        t1 = time.time()
        if mps:
            mps_check = _mps_servers(wd)
    finally:
        lr.stop_all()
        pods.stop()
        sampler.stop()
    phases, tasks, startup = [], [], []
    dbs = dbs[: lr.client_shards]  # a model with fewer tasks than clients: the rest were stopped unstarted
    for d in dbs:
        pr = json.loads((d / "progress.json").read_text())
        phases.append(pr.get("phases", {}))
        startup.append(pr.get("startup", {}))
        tasks += [{"name": t["name"], "workload_hash": t["workload_hash"], "budget": t["budget"]}
                  for t in pr.get("tasks", [])]
    return {"t0": t0, "t1": t1, "db_dirs": [str(d) for d in dbs], "sampler": sampler, "phases": phases,
            "builder": (f"{len(pod_cpus)} build services over TCP (RemoteBuilder)" if pod_cpus else
                        "build service: one PooledBuilder for all clients" if shared else
                        "PooledBuilder in each client")
                       + " (build_without_intrinsics, export .so)",
            "cores": topo_cpus, "builder_pods": len(pod_cpus), "builder_pod_cpus": pod_cpus,
            "builder_logs": {p.name: _build_counts(wd / "logs" / f"{p.name}.log")
                             for p in lr.procs if p.name.startswith("client")} if pod_cpus else None,
            "shared_builder": shared, "runner": "SessionRPCRunner",
            "tasks": tasks, "mps": mps, "mps_server_list": mps_check, "builder_workers": workers,
            "client_startup": startup,
            "pop_per_cand": a.pop_per_cand or 8,
            "client_restarts": sum(p.restarts for p in lr.procs if p.name.startswith("client")),
            **({"stopped_at_window": not finished} if window_s else {})}


def _run_clients(lr: Any, deadline: float | None) -> bool:
    """``lr.run_clients()``; with a ``deadline`` (time.time()) in a thread, returning at the
    deadline if the clients are still tuning (the caller's ``stop_all`` then stops them, each by
    its process group: every record written so far stays). True when the clients finished."""
    if deadline is None:
        lr.run_clients()
        return True
    import threading

    err: list[BaseException] = []

    def run() -> None:
        try:
            lr.run_clients()
        except BaseException as e:  # re-raised below, as run_clients would have raised it
            err.append(e)

    th = threading.Thread(target=run, name="run-clients", daemon=True)
    th.start()
    th.join(max(0.0, deadline - time.time()))
    if err:
        raise err[0]
    if not th.is_alive():
        return True
    # The window is over: no restart from here on, and every client's group gets SIGTERM at once,
    # so that stop_all (one process after the other, 10 s grace each) only waits for them.
    lr.stopping = True
    for p in list(lr.procs):
        if p.name.startswith("client"):
            p.kill(signal.SIGTERM)
    return False


def _split_cpus(cpus: list[int], k: int) -> list[list[int]]:
    """``cpus`` in ``k`` contiguous, disjoint slices (sizes differ by at most one)."""
    if k > len(cpus):
        raise SystemExit(f"--builder-pods {k} > {len(cpus)} --builder-cores")
    q, r = divmod(len(cpus), k)
    out, i = [], 0
    for j in range(k):
        n = q + (1 if j < r else 0)
        out.append(cpus[i:i + n])
        i += n
    return out


def _build_counts(log_path: Path) -> str | None:
    """The client's last line about where its candidates were built (remote_builder logs it)."""
    try:
        lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if "candidates built:" in ln]
    except OSError:
        return None
    return lines[-1][-200:] if lines else None


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--id", required=True)
    ap.add_argument("--mode", choices=["baseline", "sharetune"], required=True)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--target", default="cuda")
    ap.add_argument("--tasks", type=int, default=6)
    ap.add_argument("--trials", type=int, default=16, help="per task")
    ap.add_argument("--per-iter", type=int, default=8, help="sharetune candidates per search round")
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--servers", type=int, default=1)
    ap.add_argument("--pct", type=int, default=100)
    ap.add_argument("--builder-workers", type=int, default=None)
    ap.add_argument("--cores", default=None, help="CPUs of the tuning topology, e.g. 0-7 (default: all)")
    ap.add_argument("--builder-pods", type=int, default=0, help="build services over TCP on --builder-cores")
    ap.add_argument("--builder-cores", default=None, help="CPUs of the build services, e.g. 8-15")
    ap.add_argument("--pop-per-cand", type=int, default=None, help="sharetune: population per candidate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=520.0)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--round", default=None,
                    help="measurement round (one machine, one session): ratios compare cells of one round")
    ap.add_argument("--total", type=int, default=None, help="global trial budget (default: tasks x trials)")
    ap.add_argument("--window-s", type=float, default=None,
                    help="stop the run this many seconds after its start, keeping its records (default: none)")
    return ap


def main() -> int:
    a = parser().parse_args()
    if a.id in load_cells(CELLS) and not a.force:
        log(f"{a.id}: already done, skipped")
        return 0
    wd = RUN_ROOT / "runs" / a.id
    if wd.exists():
        import shutil

        shutil.rmtree(wd)
    wd.mkdir(parents=True)
    log(f"{a.id}: {a.mode} {a.model} {a.tasks} tasks x {a.trials} trials"
        + (f", M={a.clients} N={a.servers} P={a.pct}" if a.mode == "sharetune" else ""))
    r = run_baseline(a, wd) if a.mode == "baseline" else run_sharetune(a, wd)
    t0, t1, sampler = r.pop("t0"), r.pop("t1"), r.pop("sampler")
    recs = [x for d in r["db_dirs"] for x in _records(Path(d))]
    times = sampler.record_times()
    first = min((ts[0] for ts in times.values() if ts), default=t1)
    last = max((ts[-1] for ts in times.values() if ts), default=t1)
    cell = {
        "id": a.id, "mode": a.mode, "model": a.model, "target": a.target, "gpu": gpu_name(),
        "tasks": a.tasks, "trials_per_task": a.trials, "budget": a.total or a.tasks * a.trials,
        "clients": a.clients if a.mode == "sharetune" else 1,
        "servers": a.servers if a.mode == "sharetune" else 1,
        "thread_pct": a.pct if a.mode == "sharetune" else 100,
        "per_iter": a.per_iter if a.mode == "sharetune" else 64, "seed": a.seed, "round": a.round,
        "started_at": t0, "wall_s": round(t1 - t0, 2),
        "first_record_s": round(first - t0, 2), "last_record_s": round(last - t0, 2),
        "records": len(recs), "failed": _failed(recs),
        "best_us": _best_us([Path(d) for d in r["db_dirs"]]),
        "all_us": _all_us([Path(d) for d in r["db_dirs"]]),
        # r11 ran with replay as the client's default; the default is evolutionary since
        "search": os.environ.get("BENCH_COLD_SEARCH") or "client default",
        "trials_per_s": round(len(recs) / (t1 - t0), 4),
        "trials_per_s_tuning_span": round(len(recs) / max(last - first, 1e-9), 4),
        **sampler.summary(t0, t1),
        # record i of db d was first seen at t0 + record_times[d][i]
        "record_times": {d: [round(x - t0, 2) for x in ts] for d, ts in times.items()},
        "util_trace": [[round(s["t"] - t0, 1), s["cpu"], s.get("gpu")] for s in sampler.samples[::2]],
        **r,
    }
    append_cell(CELLS, cell)
    log(f"{a.id}: {cell['records']} trials ({cell['failed']} failed) in {cell['wall_s']} s = "
        f"{cell['trials_per_s']} trials/s; cpu {cell['cpu_util_mean']}%, gpu {cell['gpu_util_mean']}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
