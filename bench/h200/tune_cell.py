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
import sys
import time
from pathlib import Path
from typing import Any

from common import (RUN_ROOT, Group, Sampler, append_cell, free_port, gpu_name, load_cells, log,
                    mps_control, tuner_env)

CELLS = "h200-cells.jsonl"


def _records(db: Path) -> list[Any]:
    from sharetune_tuner.records import RECORDS, read_lines

    return read_lines(db / RECORDS)


def _best_us(dbs: list[Path]) -> dict[str, float]:
    """Best measured latency (us) per task (workload hash) over the cell's databases: the search
    quality a cell reached, compared between arms that differ only in search."""
    from sharetune_tuner.records import RECORDS, WORKLOADS, read_lines

    best: dict[str, float] = {}
    for db in dbs:
        hashes = [str(w[0]) for w in read_lines(db / WORKLOADS)]
        for idx, body in read_lines(db / RECORDS):
            secs = [float(x) for x in (body[1] or [])]
            if secs and sum(secs) / len(secs) < 1e9 and idx < len(hashes):
                us = sum(secs) / len(secs) * 1e6
                best[hashes[idx]] = round(min(us, best.get(hashes[idx], us)), 3)
    return best


def _failed(recs: list[Any]) -> int:
    n = 0
    for _, body in recs:
        secs = [float(x) for x in (body[1] or [])]
        if not secs or sum(secs) / len(secs) >= 1e9:
            n += 1
    return n


def run_baseline(a: argparse.Namespace, wd: Path) -> dict[str, Any]:
    from sharetune_tuner.client import wait_for_tracker

    env = tuner_env()
    g = Group(wd / "logs")
    port = free_port()
    key = "baseline"
    db = wd / "db"
    sampler = Sampler([db]).start()
    t0 = time.time()
    try:
        g.start("tracker", [sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                            "--port", str(port), "--port-end", str(port + 1), "--silent"], env)
        time.sleep(1.0)
        g.start("server", [sys.executable, "-m", "tvm.exec.rpc_server", "--tracker", f"127.0.0.1:{port}",
                           "--key", key, "--host", "127.0.0.1", "--port", "9300", "--port-end", "9330",
                           "--silent"], env)
        wait_for_tracker("127.0.0.1", port, key, 60.0)
        client = g.start("client", [sys.executable, str(Path(__file__).with_name("baseline_client.py")),
                                    "--work-dir", str(wd), "--model", a.model, "--target", a.target,
                                    "--tasks", str(a.tasks), "--trials", str(a.trials),
                                    "--tracker", f"127.0.0.1:{port}", "--key", key, "--seed", str(a.seed)], env)
        rc = client.wait(a.timeout)
        t1 = time.time()
        if rc != 0:
            raise RuntimeError(f"baseline client exited {rc}:\n{g.tail('client')}")
    finally:
        g.stop()
        sampler.stop()
    info = json.loads((wd / "client.json").read_text())
    return {"t0": t0, "t1": t1, "db_dirs": [str(db)], "sampler": sampler, "phases": [info["phases"]],
            "tasks": info["tasks"]}


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
    from sharetune.procs import ProcessGroup
    from sharetune_tuner.cpus import default_builder_workers
    from sharetune_tuner.local import LocalRun

    # --builder-workers N: every client its own pool of N (rounds up to r5: N = 2 x cores / clients);
    # default: the clients share one build service of the host's cores (local mode's default).
    shared = a.builder_workers is None and a.clients > 1
    workers = a.builder_workers or (os.cpu_count() or 1 if shared else
                                    default_builder_workers(a.clients, os.cpu_count()))
    mps = a.pct < 100 or a.servers > 1
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
    total: {a.tasks * a.trials}
    perTask: {a.trials}
    perIteration: {a.per_iter}
  servers:
    replicas: {a.servers}
    threadPercentage: {a.pct}
  clients:
    shards: {a.clients}
{"" if shared else f"    builderWorkers: {workers}"}
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

    lr = BenchRun(spec, job, wd)
    dbs = [lr.shard_dir(i) for i in range(a.clients)]
    sampler = Sampler(dbs).start()
    t0 = time.time()
    mps_check = None
    try:
        lr.start_services()
        lr.run_clients()
        t1 = time.time()
        if mps:
            mps_check = _mps_servers(wd)
    finally:
        lr.stop_all()
        sampler.stop()
    phases, tasks, startup = [], [], []
    for d in dbs:
        pr = json.loads((d / "progress.json").read_text())
        phases.append(pr.get("phases", {}))
        startup.append(pr.get("startup", {}))
        tasks += [{"name": t["name"], "workload_hash": t["workload_hash"], "budget": t["budget"]}
                  for t in pr.get("tasks", [])]
    return {"t0": t0, "t1": t1, "db_dirs": [str(d) for d in dbs], "sampler": sampler, "phases": phases,
            "builder": ("build service: one PooledBuilder for all clients" if shared else "PooledBuilder")
                       + "(build_without_intrinsics, export .so)",
            "shared_builder": shared, "runner": "SessionRPCRunner",
            "tasks": tasks, "mps": mps, "mps_server_list": mps_check, "builder_workers": workers,
            "client_startup": startup,
            "pop_per_cand": a.pop_per_cand or 8,
            "client_restarts": sum(p.restarts for p in lr.procs if p.name.startswith("client"))}


def main() -> int:
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
    ap.add_argument("--pop-per-cand", type=int, default=None, help="sharetune: population per candidate")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=520.0)
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--round", default=None,
                    help="measurement round (one machine, one session): ratios compare cells of one round")
    a = ap.parse_args()
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
        "tasks": a.tasks, "trials_per_task": a.trials, "budget": a.tasks * a.trials,
        "clients": a.clients if a.mode == "sharetune" else 1,
        "servers": a.servers if a.mode == "sharetune" else 1,
        "thread_pct": a.pct if a.mode == "sharetune" else 100,
        "per_iter": a.per_iter if a.mode == "sharetune" else 64, "seed": a.seed, "round": a.round,
        "started_at": t0, "wall_s": round(t1 - t0, 2),
        "first_record_s": round(first - t0, 2), "last_record_s": round(last - t0, 2),
        "records": len(recs), "failed": _failed(recs),
        "best_us": _best_us([Path(d) for d in r["db_dirs"]]),
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
