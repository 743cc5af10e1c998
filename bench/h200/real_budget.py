"""The headline at real budgets: whole networks, equal wall-clock windows, three arms.

Each arm tunes every task of the whole model with a budget it cannot exhaust (20,000 trials) and
stops itself at the end of its window (one device command), keeping every record measured so far:

  stock        stock MetaSchedule as shipped: ``baseline_client.py`` in one process (LocalBuilder,
               RPCRunner with one worker, one RPC server on the whole GPU, evolutionary search,
               64 candidates per batch, gradient task scheduler); only the budget, the seed and
               the RPC session timeout (30 s) are set
  stock-tuned  the same as a knowledgeable user would set it up: a tracker with N RPC servers on
               the GPU (no MPS), RPCRunner(max_workers=N), LocalBuilder(max_workers=cores), the
               round-robin task scheduler, the rest stock (N = 4, see STOCK_TUNED_SERVERS;
               round-robin: see STOCK_TUNED_SCHEDULER)
  sharetune    the local-mode topology as ``tune_cell.py --mode sharetune`` runs it (6 clients,
               6 servers at 50% under MPS, 16 candidates per round, one build service), over the
               whole model

  python bench/h200/real_budget.py tune --network resnet50 --arm stock --seed 0 [--window-s 540]
  source bench/h200/nvrtc_env.sh && python bench/h200/real_budget.py compile --network resnet50 --seed 0
  python bench/h200/real_budget.py evaluate --network resnet50 --seed 0 [--checkpoints 60,120,...]
  python bench/h200/real_budget.py summarize [--out FILE.json] [--plot FILE.png]

``tune`` appends the arm's result (knobs, trials and trials/s in the window, CPU/GPU utilisation,
the time each record appeared) to ``h200-real-budget-arms.jsonl`` (common.append_cell: also to
$OUT) and packs its record databases into ``$OUT/<arm id>.tar.gz``. ``evaluate`` compiles the
whole model with each arm's best records as they stood at each checkpoint (the databases cut at
the record-time trace), plus the untuned model, measures them all in one process on the GPU and
appends the curves to ``h200-real-budget-eval.jsonl``; ``compile`` does its compiling on a machine
without a GPU (nvrtc_env.sh) into a pack that ``evaluate`` then only measures. ``summarize`` (no
GPU) computes the ratios per network and baseline and writes ``bench/results/h200-real-budget.json``
and the plot.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

from common import RESULTS, ROOT, RUN_ROOT, append_cell, gpu_name, load_cells, log, tuner_env

HERE = Path(__file__).resolve().parent
ARMS_FILE = "h200-real-budget-arms.jsonl"
EVAL_FILE = "h200-real-budget-eval.jsonl"
SUMMARY_JSON = RESULTS / "h200-real-budget.json"
PLOT_PNG = ROOT / "docs" / "h200-real-budget.png"
NETWORKS = ("resnet50", "mobilenet_v2", "resnet18", "tiny_cnn")  # the last two: smoke tests
ARMS = ("stock", "stock-tuned", "sharetune")
BASELINES = ("stock", "stock-tuned")
TOTAL = 20000  # TLCBench's ResNet-50 budget: no arm exhausts it in a 9-minute window
# stock-tuned: N servers and RPCRunner(max_workers=N). A stock measurement opens a fresh RPC
# session per candidate (0.67 s of RPC against ~0.1 s of kernel timing on the H200, profile_trial),
# so one worker measures a 64-candidate batch in ~50 s while 16 cores build it in ~10-20 s: 4
# workers bring the runner's share below the builder's; more add GPU time-slicing between
# unshared contexts (no MPS) to the measurements for little gain.
STOCK_TUNED_SERVERS = 4
# stock-tuned: the gradient scheduler (stock's default) commits no record before its warm-up pass
# over every task ends, longer than the window for a whole network (measured.py); round-robin
# joins a batch as soon as it is measured (TVM's TouchTask), which a user tuning within a time
# budget would choose.
STOCK_TUNED_SCHEDULER = "round-robin"
# Both stock arms: LocalBuilder's timeout. TVM's 30 s counts a fresh worker's start (stock starts a
# new pool of `cores` processes for every batch, each importing TVM and making its first NVRTC
# compile cold); on the GPU machine MobileNet-V2's stock arms lost 8 of 75, 23 of 140 and 15 of 139
# builds to it, candidates that rebuilt alone compile in ~0.6 s. With 120 s a re-run on a fresh
# machine lost none of 206 (h200-stock-builder-diag.jsonl); it only matters where a build would
# otherwise be thrown away.
STOCK_BUILDER_TIMEOUT_S = 120.0
# sharetune: the headline topology (rounds r4-r7). No per-task cap below the budget, as for the
# stock arms: a client tunes its shard's tasks together (round-robin, capped_search.py), every task
# a round before any gets a second, with budgets in proportion to each task's cost
# (partition.budgets). An arm that finishes early says so (``exhausted``).
ST_CLIENTS, ST_SERVERS, ST_PCT, ST_PER_ITER, ST_PER_TASK = 6, 6, 50, 16, TOTAL
DEFAULT_CHECKPOINTS = "30,60,120,180,240,300,360,420,480,540"
TTQ_TOLERANCE = 0.02  # "reached" a latency: within 2% of it (timing noise between two models)
UNTUNED = "untuned.so"


def arm_id(network: str, seed: int, arm: str) -> str:
    return f"rb-{network}-s{seed}-{arm}"


# A sharetune arm run with a search other than the client's default (``sharetune-e4x4``) or without
# the shards' cost models learning each other's records (``sharetune-nopeers``,
# search/peer_records.py) is a variant, kept beside the shipped arm (never in its place). Variants
# are evaluated with the arms of their (network, seed) and reported as rows; the ratios and goals
# are the shipped arm's.
VARIANT_PREFIX = "sharetune-"


def arm_name(arm: str, evolution: str, default_evolution: str, peers: bool = True, per_iter: int = ST_PER_ITER) -> str:
    """The arm as recorded: ``sharetune`` with a non-default evolution, without peers or with
    another round size is a variant."""
    if arm != "sharetune":
        return arm
    parts = [f"e{evolution}"] if evolution and evolution != default_evolution else []
    parts += [] if peers else ["nopeers"]
    parts += [] if per_iter == ST_PER_ITER else [f"b{per_iter}"]
    return "-".join(["sharetune", *parts])


def eval_id(network: str, seed: int) -> str:
    return f"rbeval-{network}-s{seed}"


def machine_id() -> str:
    """This machine (and this boot of it): arms of one comparison must share it."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}"


def out_dir() -> Path:
    """Where the arm's tar goes: $OUT on the device (comes back), else $BENCH_RUN_ROOT/out."""
    d = Path(os.environ["OUT"]) if os.environ.get("OUT") else RUN_ROOT / "out"
    d.mkdir(parents=True, exist_ok=True)
    return d


# ---- tune -------------------------------------------------------------------------------------
def _cell_args(a: argparse.Namespace, wd_id: str) -> argparse.Namespace:
    """tune_cell's own arguments for this arm (its parser: every attribute it reads is there)."""
    import tune_cell

    common = ["--id", wd_id, "--model", a.network, "--target", a.target, "--seed", str(a.seed),
              "--total", str(a.total), "--window-s", str(a.window_s), "--timeout", str(a.window_s + 60)]
    if a.arm == "sharetune":
        # every task (st_client keeps the K heaviest: K above any model's count); --trials is the
        # per-task cap, the whole budget by default (ST_PER_TASK)
        return tune_cell.parser().parse_args(
            [*common, "--mode", "sharetune", "--tasks", "1000000", "--trials", str(a.per_task),
             "--clients", str(a.clients), "--servers", str(a.servers), "--pct", str(a.pct),
             "--per-iter", str(a.per_iter)])
    # stock MetaSchedule: all tasks (--tasks 0), no per-task cap below the global budget
    return tune_cell.parser().parse_args([*common, "--mode", "baseline", "--tasks", "0", "--trials", str(a.total)])


def _search(a: argparse.Namespace) -> Any:
    """The sharetune arm's evolutionary search (client.Evolution) as its clients will read it (a
    bad value stops the arm here, with the client's own message)."""
    from sharetune_tuner.client import parse_evolution  # TVM's import time only where it is used

    return parse_evolution(getattr(a, "evolution", "") or "")


def _evolution(a: argparse.Namespace) -> str:
    """The sharetune arm's evolutionary search as PxG[fN] (SHARETUNE_EVOLUTION)."""
    return str(_search(a))


def knobs(a: argparse.Namespace, cores: int) -> dict[str, Any]:
    base = {"total_trials": a.total, "target": a.target, "seed": a.seed, "window_s": a.window_s}
    if a.arm == "stock":
        return {**base, "processes": "one tuning process", "servers": 1, "rpc_runner_max_workers": 1,
                "builder": "LocalBuilder() (stock: max_workers = cores, pool restarted per batch)",
                "search": "EvolutionarySearch stock (population 512)", "candidates_per_batch": 64,
                "task_scheduler": "gradient", "max_trials_per_task": a.total, "mps": False,
                "rpc_session_timeout_s": 30, "cost_model": "xgb", "builder_timeout_s": a.builder_timeout_s}
    if a.arm == "stock-tuned":
        return {**base, "processes": "one tuning process", "servers": a.servers, "rpc_runner_max_workers": a.servers,
                "builder": f"LocalBuilder(max_workers={a.builder_workers or cores})",
                "search": "EvolutionarySearch stock (population 512)", "candidates_per_batch": 64,
                "task_scheduler": STOCK_TUNED_SCHEDULER, "max_trials_per_task": a.total, "mps": False,
                "rpc_session_timeout_s": 30, "cost_model": "xgb", "builder_timeout_s": a.builder_timeout_s}
    evo = _search(a)
    return {**base, "clients": a.clients, "servers": a.servers, "thread_pct": a.pct, "mps": a.target == "cuda",
            "per_iteration": a.per_iter, "per_task": a.per_task,
            "builder": "one build service for all clients (PooledBuilder, host's cores)",
            "runner": "SessionRPCRunner",
            "search": ("client default: a shard's tasks round-robin in one tune_tasks call; each task's first round "
                       "by random sampling (replay) while the cost model is cold, then evolutionary"),
            # the initial population's random share (Evolution.fresh_pct); cells without it drew half at random
            "evolution": str(evo), "evolution_random_pct": evo.fresh_pct,
            "peer_records": "off" if getattr(a, "no_peers", False) else "on",
            "cost_model": "xgb"}


_STAMP = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)"
_SENT = re.compile(_STAMP + r".*Sending (\d+) sample\(s\) to builder", re.M)
_ERRORS = re.compile(_STAMP + r".*Build errors: (\d+) sample\(s\)", re.M)
_REASON = re.compile(r"^build error: .*\| (.*)$", re.M)
TVM_BUILDER_TIMEOUT_S = 30.0


def build_errors(client_log: str, timeout_s: float = TVM_BUILDER_TIMEOUT_S) -> dict[str, Any]:
    """A stock arm's builds from its client log: candidates sent to the builder, how many failed
    and why (baseline_client.py's ``build error:`` lines), and how many of them were lost to the
    builder's timeout: the reason says so, or (logs without reasons) their batch took at least
    ``timeout_s`` from sending to the error count, which a batch of candidates that compile in
    about a second each only does by waiting for a killed worker."""
    stamp = lambda x: dt.datetime.strptime(x, "%Y-%m-%d %H:%M:%S").timestamp()  # noqa: E731  # a one-line helper
    # (position in the log, time, count): a batch's error count follows its own send line, often
    # in the same second as the next batch's send
    sent = [(m.start(), stamp(m[1]), int(m[2])) for m in _SENT.finditer(client_log)]
    errors = [(m.start(), stamp(m[1]), int(m[2])) for m in _ERRORS.finditer(client_log)]
    reasons: dict[str, int] = {}
    for r in _REASON.findall(client_log):
        key = re.sub(r"[0-9]+(\.[0-9]+)?", "N", r.strip())[:120]
        reasons[key] = reasons.get(key, 0) + 1
    if reasons:
        timed_out = sum(n for r, n in reasons.items() if "Timeout" in r)
    else:
        timed_out = 0
        for pos, t1, n in errors:
            t0 = max(((p, t) for p, t, _ in sent if p < pos), default=None)
            if t0 is not None and t1 - t0[1] >= timeout_s:
                timed_out += n
    return {"builds_sent": sum(n for _, _, n in sent), "build_errors": sum(n for _, _, n in errors),
            "build_timeouts": timed_out,
            "build_error_reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1])[:5])}


def lost_builds(cell: dict[str, Any]) -> str | None:
    """Why a baseline arm is not a fair baseline (None: it is): it lost builds to its builder's
    timeout (build_errors), which the candidates do not need (STOCK_BUILDER_TIMEOUT_S)."""
    if cell.get("arm") == "sharetune" or not cell.get("build_timeouts"):
        return None
    timeout = (cell.get("knobs") or {}).get("builder_timeout_s") or TVM_BUILDER_TIMEOUT_S
    return (f"lost {cell['build_timeouts']} of {cell.get('builds_sent')} builds to LocalBuilder's "
            f"{timeout:.0f}-s timeout")


def machine_state() -> dict[str, Any]:
    """What else is on the machine when an arm starts: its load, and processes an earlier arm may
    have left (an MPS control daemon, tuning or building processes). An arm that starts beside
    them does not get the machine the others got; ``tune`` says so before it starts."""
    import psutil

    me = os.getpid()
    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info.get("cmdline") or [])
        if p.info["pid"] != me and ("nvidia-cuda-mps" in cmd or "sharetune_tuner" in cmd or "st_client.py" in cmd
                                    or "baseline_client.py" in cmd or "tvm.exec.popen_worker" in cmd):
            left.append(cmd[:160])
    return {"load1": round(os.getloadavg()[0], 2), "left_over": left[:20], "left_over_count": len(left)}


def _pack(wd: Path, db_dirs: list[str], cell: dict[str, Any], dest: Path) -> int:
    """The arm's record databases (+ its cell and the logs' tails) as a small tar.gz."""
    with tarfile.open(dest, "w:gz") as t:
        for rel in db_dirs:
            for name in ("database_workload.json", "database_tuning_record.json"):
                p = wd / rel / name
                if p.exists():
                    t.add(p, arcname=f"{rel}/{name}")
        cj = wd / "arm.json"
        cj.write_text(json.dumps(cell))
        t.add(cj, arcname="arm.json")
        for p in sorted((wd / "logs").glob("*.log")) if (wd / "logs").is_dir() else []:
            tail = wd / "logs" / f"{p.stem}.tail"
            tail.write_text("\n".join(p.read_text(errors="replace").splitlines()[-200:]) + "\n")
            t.add(tail, arcname=f"logs/{tail.name}")
    return dest.stat().st_size


def tune(a: argparse.Namespace) -> int:
    import tune_cell
    from sharetune_tuner.client import Evolution

    name = arm_name(a.arm, _evolution(a) if a.evolution else "", str(Evolution()), peers=not a.no_peers,
                    per_iter=a.per_iter)
    aid = arm_id(a.network, a.seed, name)
    if aid in load_cells(ARMS_FILE) and not a.force:
        log(f"{aid}: already done, skipped")
        return 0
    others = [c for arm in ARMS if (c := load_cells(ARMS_FILE).get(arm_id(a.network, a.seed, arm)))]
    if any(c.get("machine") != machine_id() for c in others):
        log(f"warning: {', '.join(c['id'] for c in others)} ran on another machine "
            f"({others[0].get('machine')}, this one "
            f"is {machine_id()}): the arms of one comparison must share one; rerun them here with --force")
    cores = len(os.sched_getaffinity(0))
    if a.arm != "stock":
        a.servers = a.servers or (STOCK_TUNED_SERVERS if a.arm == "stock-tuned" else ST_SERVERS)
    # Machine preparation, outside the window: the tensor-intrinsics cache the tuner image has built
    # in (sweep.py does the same before its first cell); ~1 s once it exists.
    subprocess.run([sys.executable, "-m", "sharetune_tuner.model.intrinsics"], env=tuner_env(), check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    wd = RUN_ROOT / "runs" / aid
    if wd.exists():
        shutil.rmtree(wd)
    wd.mkdir(parents=True)
    before = machine_state()
    if before["left_over_count"]:
        log(f"warning: {before['left_over_count']} processes of an earlier run are still here (load "
            f"{before['load1']}): {before['left_over'][:3]}")
    ca = _cell_args(a, aid)
    log(f"{aid}: {a.arm} {a.network}, whole model, {a.total} trials, window {a.window_s:.0f} s")
    profiler = _profile_later(aid, a.profile_at_s, a.profile_s, a.profile_native) if a.profile_s else None
    try:
        if a.arm == "sharetune":
            if a.evolution:  # read by each client (ClientConfig.evolution), checked before the window
                os.environ["SHARETUNE_EVOLUTION"] = _evolution(a)
            if a.no_peers:  # each shard's cost model learns only its own records (the clients read it)
                os.environ["SHARETUNE_PEER_RECORDS"] = "off"
            r = tune_cell.run_sharetune(ca, wd)
        elif a.arm == "stock-tuned":
            r = tune_cell.run_baseline(ca, wd, servers=a.servers, runner_workers=a.servers,
                                       builder_workers=a.builder_workers or cores, scheduler=STOCK_TUNED_SCHEDULER,
                                       builder_timeout_s=a.builder_timeout_s)
        else:
            r = tune_cell.run_baseline(ca, wd, builder_timeout_s=a.builder_timeout_s)
    except Exception as e:
        # what there is (records, the logs' tails) comes back for a look; no arm is recorded
        dbs = [str(p.parent.relative_to(wd)) for p in wd.rglob("database_tuning_record.json")]
        _pack(wd, dbs, {"id": aid, "error": f"{type(e).__name__}: {e}"[-3000:]}, out_dir() / f"{aid}-failed.tar.gz")
        log(f"{aid} FAILED ({type(e).__name__}); records and logs in {out_dir() / f'{aid}-failed.tar.gz'}")
        raise
    t0, t1, sampler = r["t0"], r["t1"], r["sampler"]
    rel = [str(Path(d).relative_to(wd)) for d in r["db_dirs"]]
    times = {str(Path(k).relative_to(wd)): [round(x - t0, 2) for x in v] for k, v in sampler.record_times().items()}
    span = min(a.window_s, t1 - t0)
    committed = sum(1 for ts in times.values() for x in ts if x <= a.window_s)
    # The stock arms count candidates as they are measured (measured.py: stock commits a batch
    # only when it joins it); sharetune's records, committed as each batch is measured.
    measured = [round(x - t0, 2) for x in r["measured_times"]] if "measured_times" in r else None
    in_window = sum(1 for x in measured if x <= a.window_s) if measured is not None else committed
    written = sum(len(tune_cell._records(wd / d)) for d in rel)
    failed = sum(tune_cell._failed(tune_cell._records(wd / d)) for d in rel)
    client_log = wd / "logs" / "client.log"
    builds = (build_errors(client_log.read_text(errors="replace"), a.builder_timeout_s)
              if a.arm != "sharetune" and client_log.is_file() else {})
    first = min((ts[0] for ts in times.values() if ts), default=None)
    cell = {
        "id": aid, "network": a.network, "arm": name, "seed": a.seed, "target": a.target, "gpu": gpu_name(),
        "machine": machine_id(), "cores": cores, "knobs": knobs(a, cores), "window_s": a.window_s,
        "started_at": round(t0, 2), "wall_s": round(t1 - t0, 2),
        # stopped by the window (the budget was not exhausted), or finished before it
        "stopped_at_window": bool(r.get("stopped_at_window")), "exhausted": not r.get("stopped_at_window"),
        "trials": in_window, "records_in_window": committed, "records_written": written, "failed": failed,
        **builds, "machine_before": before,
        "trials_counted": "candidates measured (runner)" if measured is not None else "records committed",
        "trials_per_s": round(in_window / span, 4) if span > 0 else None,
        "first_record_s": first,
        "tasks": len(r.get("tasks") or []),
        **sampler.summary(t0, t0 + span),
        "db_dirs": rel,
        # record i of db_dirs[d] was first seen at started_at + record_times[d][i] (0.5 s resolution)
        "record_times": times,
        **({"measured_times": measured} if measured is not None else {}),
        "util_trace": [[round(s["t"] - t0, 1), s["cpu"], s.get("gpu")] for s in sampler.samples[::10]],
        "tar": f"{aid}.tar.gz",
        **({"mps_server_list": r.get("mps_server_list"), "client_restarts": r.get("client_restarts"),
            "client_startup": r.get("client_startup")} if a.arm == "sharetune" else {}),
    }
    if profiler is not None:
        profiler.join(timeout=a.profile_s + 30)
        cell["profiles"] = sorted(p.name for p in out_dir().glob(f"{aid}-pyspy-*.txt"))
        cell["profile"] = {"at_s": a.profile_at_s, "for_s": a.profile_s, "native": a.profile_native}
    size = _pack(wd, rel, cell, out_dir() / cell["tar"])
    shutil.copy2(out_dir() / cell["tar"], wd / cell["tar"])  # a warm machine's evaluate finds it here too
    cell["tar_bytes"] = size
    append_cell(ARMS_FILE, cell)
    log(f"{aid}: {in_window} trials in {span:.0f} s = {cell['trials_per_s']} trials/s, {committed} records committed "
        f"({'stopped at the window' if cell['stopped_at_window'] else 'FINISHED EARLY: budget exhausted'}); "
        f"cpu {cell['cpu_util_mean']}%, gpu {cell['gpu_util_mean']}%; tar {size / 1e6:.1f} MB")
    return 0


def _profile_later(aid: str, at_s: float, for_s: float, native: bool = False) -> threading.Thread:
    """py-spy (sampling without stopping the process, ``--nonblocking``: Python frames only) on
    one client and on the build service (or the stock client) from ``at_s`` into the window for
    ``for_s`` seconds: collapsed stacks in ``$OUT/<arm id>-pyspy-<role>.txt``, where the CPU of a
    trial goes. py-spy comes from the device carry (.device/py-spy, a pip wheel). ``native``: C++
    frames too (TVM's passes, NVRTC), at 20 Hz; py-spy then pauses the process for each sample
    (native unwinding cannot run beside it), so the profiled processes lose a little time."""
    from common import process_role

    def run() -> None:
        import psutil

        time.sleep(at_s)
        exe = shutil.which("py-spy") or next(
            (str(x) for x in [Path(sys.executable).parent / "py-spy"] if x.exists()), None)
        if exe is None:
            log("profile: py-spy not installed (pip install .device/py-spy/*.whl): skipped")
            return
        chosen: dict[str, int] = {}
        roles: dict[int, str] = {}
        for p in psutil.Process().children(recursive=True):
            try:
                roles[p.pid] = process_role(p.cmdline(), roles.get(p.ppid()))
            except psutil.Error:
                continue
            if roles[p.pid] in ("client", "build") and roles.get(p.ppid()) != roles[p.pid]:
                chosen.setdefault(roles[p.pid], p.pid)
        procs = [subprocess.Popen([exe, "record", "--pid", str(pid), "--duration", str(int(for_s)),
                                   *(["--rate", "20", "--native"] if native else ["--rate", "50", "--nonblocking"]),
                                   "--subprocesses", "--format", "raw",
                                   "--output", str(out_dir() / f"{aid}-pyspy-{role}.txt")],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
                 for role, pid in chosen.items()]
        for pr in procs:
            pr.wait()
        log(f"profile: {', '.join(chosen)} for {for_s:.0f} s from {at_s:.0f} s into the window")

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


# ---- evaluate ---------------------------------------------------------------------------------
def _find_tar(cell: dict[str, Any], given: list[str]) -> Path | None:
    names = [Path(g) for g in given if Path(g).name == cell["tar"]]
    for p in [*names, RESULTS / cell["tar"], RUN_ROOT / "out" / cell["tar"],
              RUN_ROOT / "runs" / cell["id"] / cell["tar"]]:
        if p.is_file():
            return p
    return None


def _read_db(d: Path) -> tuple[list[str], list[tuple[int, float]]]:
    """(workload hash per workload line, (workload index, mean seconds or inf) per record line)."""
    from sharetune_tuner.store.records import RECORDS, WORKLOADS, read_lines

    hashes = [str(w[0]) for w in read_lines(d / WORKLOADS)]
    recs = []
    for idx, body in read_lines(d / RECORDS):
        secs = [float(x) for x in (body[1] or [])]
        m = sum(secs) / len(secs) if secs else math.inf
        recs.append((idx, m if m < 1e9 else math.inf))
    return hashes, recs


def best_choice(dbs: list[tuple[list[str], list[tuple[int, float]]]], counts: list[int]) -> tuple:
    """Which record is each workload's best among the first ``counts[i]`` records of db i (the
    databases as they stood at a checkpoint): a signature, equal for checkpoints whose compiled
    models are the same."""
    best: dict[str, tuple[float, int, int]] = {}
    for di, ((hashes, recs), n) in enumerate(zip(dbs, counts)):
        for ri, (widx, secs) in enumerate(recs[:n]):
            if secs == math.inf or not 0 <= widx < len(hashes):
                continue
            h = hashes[widx]
            if h not in best or secs < best[h][0]:
                best[h] = (secs, di, ri)
    return tuple(sorted((h, di, ri) for h, (_, di, ri) in best.items()))


def _cut_copy(src: Path, n: int, dst: Path) -> None:
    """``src``'s database as it stood after its first ``n`` records, reduced to the best of them
    per workload (the merge keeps only those anyway; a whole-model database of thousands of
    records would take the merge far longer to load). Every workload line is kept."""
    from sharetune_tuner.store.records import RECORDS, WORKLOADS

    dst.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src / WORKLOADS, dst / WORKLOADS)
    _, recs = _read_db(src)
    lines = (src / RECORDS).read_bytes().splitlines(keepends=True)
    best: dict[int, tuple[float, int]] = {}
    for i, (widx, secs) in enumerate(recs[:n]):
        if secs != math.inf and (widx not in best or secs < best[widx][0]):
            best[widx] = (secs, i)
    (dst / RECORDS).write_bytes(b"".join(lines[i] for _, i in sorted(best.values(), key=lambda v: v[1])))


def compile_at(dirs: list[Path], counts: list[int], network: str, target: str, out: Path) -> None:
    """(A subprocess) the whole model compiled with the best of the first counts[i] records of
    each database: evaluate.py's compile_model (merge, compile_relax, export) on cut copies."""
    from evaluate import compile_model

    cut = [out / "cut" / f"db-{i}" for i in range(len(dirs))]
    for d, n, c in zip(dirs, counts, cut):
        _cut_copy(d, n, c)
    t = time.time()
    counts_out = compile_model([c for c, n in zip(cut, counts) if n > 0], network, target, out)
    (out / "compiled.json").write_text(json.dumps({"merge": counts_out, "compile_s": round(time.time() - t, 1)}))
    shutil.rmtree(out / "cut", ignore_errors=True)


def _run_parallel(jobs: list[tuple[str, list[str]]], env: dict[str, str], parallel: int,
                  timeout_s: float, log_dir: Path) -> dict[str, str]:
    """Runs ``(name, argv)`` subprocesses ``parallel`` at a time, each in its own process group,
    output to ``log_dir/<name>.log``; returns {name: error} of the failed ones (and of those the
    deadline stopped or never started)."""
    from sharetune.procs import ProcessGroup

    log_dir.mkdir(parents=True, exist_ok=True)
    pending, running, failed = list(jobs), {}, {}
    deadline = time.time() + timeout_s
    while pending or running:
        while pending and len(running) < parallel:
            name, argv = pending.pop(0)
            running[name] = ProcessGroup(name, argv, log_dir / f"{name.replace('/', '_')}.log", env).start()
        time.sleep(0.2)
        for name, p in list(running.items()):
            rc = p.poll()
            if rc is not None:
                if rc != 0:
                    failed[name] = f"exit {rc}: {p.tail(15)}"[-2000:]
                del running[name]
        if time.time() > deadline:
            for name, p in running.items():
                p.stop(grace_s=2.0)
                failed[name] = "stopped: --compile-timeout-s"
            failed.update({name: "not started: --compile-timeout-s" for name, _ in pending})
            break
    return failed


def models_pack(network: str, seed: int) -> Path:
    """Where ``compile`` leaves one (network, seed)'s compiled models for ``evaluate`` to carry."""
    return RESULTS / f"rbmodels-{network}-s{seed}.tar.xz"


def _arms_of(network: str, seed: int) -> dict[str, dict[str, Any]]:
    """The arms of one (network, seed), shipped ones and variants, by arm name."""
    cells = load_cells(ARMS_FILE)
    out = {arm: cells[arm_id(network, seed, arm)] for arm in ARMS if arm_id(network, seed, arm) in cells}
    variants = arm_id(network, seed, VARIANT_PREFIX)
    out.update({c["arm"]: c for k, c in sorted(cells.items()) if k.startswith(variants)})
    return out


def _sources(arms: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Each arm's result, fingerprinted: a pack compiled from other results is stale."""
    return {arm: hashlib.sha256(json.dumps(cell, sort_keys=True).encode()).hexdigest()[:16]
            for arm, cell in sorted(arms.items())}


def _nvrtc_version() -> str | None:
    try:
        from cuda.bindings import nvrtc

        _, major, minor = nvrtc.nvrtcVersion()
        return f"{major}.{minor}"
    except Exception:  # no cuda-bindings: an llvm run
        return None


def compile_models(a: argparse.Namespace, arms: dict[str, dict[str, Any]], root: Path) -> dict[str, Any]:
    """Phase 1 of ``evaluate``, no GPU needed: the whole model compiled with each arm's best
    records as they stood at each checkpoint, plus the untuned model, under ``root``; returns the
    plan (``root/plan.json``: each arm's checkpoints and the model each uses, paths relative to
    ``root`` so the plan can be packed and measured on another machine)."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    t_start = time.time()
    checkpoints = sorted({float(x) for x in a.checkpoints.split(",") if x.strip()})
    jobs: list[tuple[str, list[str]]] = []
    plan: dict[str, list[dict[str, Any]]] = {}
    for arm, cell in arms.items():
        tar = _find_tar(cell, a.tars)
        if tar is None:
            log(f"{cell['id']}: no {cell['tar']} (bench/results/, --tars, or this machine's run dir): skipped")
            continue
        src = root / arm / "records"
        src.mkdir(parents=True)
        with tarfile.open(tar) as t:
            t.extractall(src)
        dirs = [src / d for d in cell["db_dirs"]]
        dbs = [_read_db(d) for d in dirs]
        window = float(cell["window_s"])
        points, models = [], {}
        for t_c in [c for c in checkpoints if c < window] + [window]:
            counts = [min(len(dbs[i][1]), sum(1 for x in cell["record_times"].get(d, []) if x <= t_c))
                      for i, d in enumerate(cell["db_dirs"])]
            sig = best_choice(dbs, counts)
            if not sig:
                points.append({"t": t_c, "records": sum(counts), "best_records": 0, "model": "untuned"})
                continue
            if sig not in models:
                models[sig] = f"{arm}/t{int(t_c)}/model.so"
                jobs.append((f"{arm}@{t_c:g}", [sys.executable, __file__, "_compile", "--network", a.network,
                                                "--target", a.target, "--out", str(root / arm / f"t{int(t_c)}"),
                                                "--dirs", ",".join(map(str, dirs)),
                                                "--counts", ",".join(map(str, counts))]))
            points.append({"t": t_c, "records": sum(counts), "best_records": len(sig), "model": models[sig]})
        plan[arm] = points
    jobs.insert(0, ("untuned", [sys.executable, str(HERE / "evaluate.py"), "--stage", "untuned",
                                "--arg", str(root / UNTUNED), "--model", a.network, "--target", a.target]))
    parallel = a.jobs or max(1, min(8, (os.cpu_count() or 2) // 2))
    log(f"{eval_id(a.network, a.seed)}: compiling {len(jobs)} models ({parallel} at a time) for {', '.join(plan)}")
    failed = _run_parallel(jobs, tuner_env(), parallel, a.compile_timeout_s, root / "logs")
    for name, err in failed.items():
        log(f"compile {name} failed:\n{err}")
    for arm in plan:
        shutil.rmtree(root / arm / "records", ignore_errors=True)
    out = {"network": a.network, "seed": a.seed, "target": a.target, "arms": plan, "sources": _sources(arms),
           "runs": {arm: arms[arm]["id"] for arm in plan}, "checkpoints": checkpoints, "failed": failed,
           "models_compiled": len(jobs) - len(failed), "compile_wall_s": round(time.time() - t_start, 1),
           "compiled_on": machine_id(), "nvrtc": _nvrtc_version()}
    (root / "plan.json").write_text(json.dumps(out, indent=1))
    return out


def measure_plan(a: argparse.Namespace, root: Path, plan: dict[str, Any]) -> dict[str, Any]:
    """Phase 2 of ``evaluate``, on the GPU: every compiled model of ``plan`` measured in one
    process on the whole GPU (no MPS daemon: evaluate.py's measurement), the untuned one first
    (the reference of rel_err_vs_first: every tuned model must compute the same output); returns
    the eval cell with each arm's latency curve."""
    t_start = time.time()
    untuned = str(root / UNTUNED)
    paths = [untuned] + sorted({str(root / p["model"]) for pts in plan["arms"].values() for p in pts
                                if p["model"] != "untuned" and (root / p["model"]).exists()})
    r = subprocess.run([sys.executable, str(HERE / "evaluate.py"), "--stage", "models", "--arg", ",".join(paths),
                        "--model", a.network, "--target", a.target, "--repeat", str(a.repeat)],
                       env=tuner_env(), capture_output=True, text=True, timeout=a.measure_timeout_s)
    if r.returncode != 0:
        raise SystemExit(f"measuring failed ({r.returncode}):\n{r.stderr[-3000:]}")
    meas = json.loads(r.stdout.strip().splitlines()[-1])
    base = meas.get(untuned, {})
    failed = plan.get("failed", {})
    out_arms: dict[str, Any] = {}
    for arm, points in plan["arms"].items():
        curve = []
        for p in points:
            m = base if p["model"] == "untuned" else meas.get(
                str(root / p["model"]), {"error": failed.get(f"{arm}@{p['t']:g}", "not compiled")})
            curve.append({"t": p["t"], "records": p["records"], "best_records": p["best_records"],
                          "median_ms": m.get("median_ms"), "min_ms": m.get("min_ms"),
                          "rel_err": m.get("rel_err_vs_first"), **({"error": m["error"]} if "error" in m else {})})
        out_arms[arm] = {"run": plan["runs"][arm], "curve": curve,
                         "final_ms": curve[-1]["median_ms"] if curve else None}
    return {"id": eval_id(a.network, a.seed), "network": a.network, "seed": a.seed, "target": a.target,
            "gpu": gpu_name(), "machine": machine_id(), "untuned_ms": base.get("median_ms"),
            "untuned_min_ms": base.get("min_ms"), "arms": out_arms, "checkpoints": plan["checkpoints"],
            "models_compiled": plan["models_compiled"], "compile_wall_s": plan["compile_wall_s"],
            "compiled_on": plan["compiled_on"], "nvrtc": plan.get("nvrtc"),
            "measure_wall_s": round(time.time() - t_start, 1)}


def compile_only(a: argparse.Namespace) -> int:
    """``compile``: phase 1 on this machine (a CPU one will do: NVRTC needs no GPU), packed for
    ``evaluate`` on the GPU machine, so an evaluation's time on the GPU machine is its measuring only."""
    arms = _arms_of(a.network, a.seed)
    if not arms:
        log(f"compile: no arm of {a.network} seed {a.seed} in {ARMS_FILE}")
        return 1
    root = RUN_ROOT / "rb-eval" / eval_id(a.network, a.seed)
    plan = compile_models(a, arms, root)
    pack = Path(a.pack) if a.pack else models_pack(a.network, a.seed)
    with tarfile.open(pack, "w:xz") as t:  # a model's .so is mostly padding: ~3 MB -> ~0.1 MB
        t.add(root / "plan.json", "plan.json")
        t.add(root / UNTUNED, UNTUNED)
        for model in sorted({p["model"] for pts in plan["arms"].values() for p in pts if p["model"] != "untuned"}):
            if (root / model).exists():
                t.add(root / model, model)
    log(f"{pack}: {plan['models_compiled']} models, {pack.stat().st_size / 1e6:.1f} MB "
        f"({len(plan['failed'])} failed); carry it to the GPU machine for `evaluate`")
    return 0 if not plan["failed"] else 1


def evaluate(a: argparse.Namespace) -> int:
    eid = eval_id(a.network, a.seed)
    arms = _arms_of(a.network, a.seed)
    if not arms:
        log(f"evaluate: no arm of {a.network} seed {a.seed} in {ARMS_FILE}")
        return 1
    prev = load_cells(EVAL_FILE).get(eid)
    if prev and set(prev.get("arms", {})) >= set(arms) and not a.force:
        log(f"{eid}: already evaluated ({', '.join(prev['arms'])}), skipped")
        return 0
    root = RUN_ROOT / "rb-eval" / eid
    pack = Path(a.pack) if a.pack else models_pack(a.network, a.seed)
    if pack.is_file():
        # Compiled elsewhere (``compile``): only the measuring takes this machine's time.
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)
        with tarfile.open(pack) as t:
            t.extractall(root)
        plan = json.loads((root / "plan.json").read_text())
        if plan.get("sources") != _sources(arms):
            log(f"{pack}: compiled from other arm results than {ARMS_FILE} now holds for {eid} (an arm added or "
                f"run again): run `compile` again, or remove the pack to compile here")
            return 1
        log(f"{eid}: {plan['models_compiled']} models compiled on {plan['compiled_on']} ({pack.name})")
    else:
        plan = compile_models(a, arms, root)
    cell = measure_plan(a, root, plan)
    append_cell(EVAL_FILE, cell)
    for arm, v in cell["arms"].items():
        log(f"{eid} {arm}: " + ", ".join(f"{p['t']:g}s {p['median_ms']}" for p in v["curve"]))
    log(f"{eid}: untuned {cell['untuned_ms']} ms; measured in {cell['measure_wall_s']} s")
    return 0


# ---- metrics (pure; tests/core/test_real_budget.py) -----------------------------------------
def step_curve(curve: list[dict[str, Any]], untuned_ms: float) -> list[tuple[float, float]]:
    """(t, end-to-end ms) from t = 0 (the untuned model: no record yet); checkpoints whose model
    failed to build or run are left out (the previous value holds)."""
    out = [(0.0, untuned_ms)]
    for p in curve:
        if p.get("median_ms") is not None:
            out.append((float(p["t"]), float(p["median_ms"])))
    return out


def time_to_reach(curve: list[tuple[float, float]], target_ms: float, tol: float = TTQ_TOLERANCE) -> float | None:
    """The first checkpoint time at which the curve is within ``tol`` of ``target_ms`` (or
    below); None when it never gets there. Checkpoint resolution: the true time lies between the
    previous checkpoint and this one."""
    for t, ms in curve:
        if ms <= target_ms * (1 + tol):
            return t
    return None


def late_trials_per_s(cell: dict[str, Any]) -> float | None:
    """Trials per second in the window's second half: the rate once every arm has started up. A
    short window weighs each arm's start-up (stock: extracting, then a population-512 search on a
    cold model before its first build) into ``trials_per_s``; at budgets of hours the late rate is
    what a user gets. Counted as ``trials`` is: candidates measured for the stock arms, committed
    records for sharetune."""
    times = cell.get("measured_times")
    if times is None:
        times = [t for ts in (cell.get("record_times") or {}).values() for t in ts]
    w = float(cell["window_s"])
    late = sum(1 for t in times if w / 2 < t <= w)
    return round(late / (w / 2), 4) if w > 0 else None


def compare(base: dict[str, Any], st: dict[str, Any], tol: float = TTQ_TOLERANCE) -> dict[str, Any]:
    """One (network, seed) comparison of sharetune against one baseline arm. Each side:
    {"trials_per_s", "late_trials_per_s" (optional), "curve": [(t, ms), ...] from step_curve,
    "window_s"}."""
    b_final, s_final = base["curve"][-1][1], st["curve"][-1][1]
    t_b = time_to_reach(base["curve"], b_final, tol)  # when the baseline reached its final latency
    t_s = time_to_reach(st["curve"], b_final, tol)  # when sharetune reached it
    out: dict[str, Any] = {
        "throughput_ratio": (round(st["trials_per_s"] / base["trials_per_s"], 3)
                             if st.get("trials_per_s") and base.get("trials_per_s") else None),
        "late_throughput_ratio": (round(st["late_trials_per_s"] / base["late_trials_per_s"], 3)
                                  if st.get("late_trials_per_s") and base.get("late_trials_per_s") else None),
        "latency_ratio": round(s_final / b_final, 4),
        "baseline_final_ms": b_final, "sharetune_final_ms": s_final,
        "baseline_time_to_final_s": t_b, "sharetune_time_to_baseline_final_s": t_s,
        "time_to_quality_ratio": None,
    }
    if t_b is None or t_b == 0:
        out["time_to_quality_note"] = "the baseline never improved on the untuned model"
    elif t_s is None:
        # sharetune did not reach it within its window W: the ratio is below t_b / W
        out["time_to_quality_note"] = "sharetune did not reach the baseline's final latency in its window"
        out["time_to_quality_ratio_below"] = round(t_b / float(st["window_s"]), 3)
    elif t_s == 0:
        out["time_to_quality_note"] = "the untuned model was already as fast as the baseline's final one"
    else:
        out["time_to_quality_ratio"] = round(t_b / t_s, 3)
    return out


def gmean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None and x > 0]
    return round(statistics.geometric_mean(xs), 3) if xs else None


# metric -> which value is the worst run (the lower throughput / speed-up, the higher latency ratio)
WORST = {"throughput_ratio": min, "late_throughput_ratio": min, "time_to_quality_ratio": min, "latency_ratio": max}


def aggregate(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    """Geometric mean over seeds of each ratio, with the worst run beside it."""
    out: dict[str, Any] = {"seeds": [r["seed"] for r in per_seed]}
    for k, worst in WORST.items():
        vals = [r[k] for r in per_seed if r.get(k) is not None]
        out[k] = {"geomean": gmean(vals), "worst": worst(vals) if vals else None,
                  "runs_with_value": f"{len(vals)}/{len(per_seed)}"}
    return out


def _aggregated(vs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per baseline: the per-seed rows, their geometric means and worst runs. A baseline that lost
    builds to its own timeout is reported, never aggregated (nor judged)."""
    return {b: {"per_seed": rows, **aggregate([r for r in rows if "not_a_fair_baseline" not in r]),
                "left_out": [r["seed"] for r in rows if "not_a_fair_baseline" in r]}
            for b, rows in vs.items() if rows}


# The ratios a pair of arms gives without an evaluation: the arms' own trial counts and timestamps.
RATE_RATIOS = ("throughput_ratio", "late_throughput_ratio")


def rate_pairs(arm_cells: dict[str, dict[str, Any]]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Per network and baseline, the trial-rate ratios (RATE_RATIOS) of every seed that ran both
    arms, evaluated or not: a pair the device had no time left to evaluate still counts towards
    them (summarize_cells marks each row ``evaluated``)."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for st in arm_cells.values():
        if st.get("arm") != "sharetune" or "network" not in st:
            continue
        for b in BASELINES:
            base = arm_cells.get(arm_id(st["network"], st["seed"], b))
            if base is None:
                continue
            row: dict[str, Any] = {"seed": st["seed"]}
            for k, rate in (("throughput_ratio", lambda c: c.get("trials_per_s")),
                            ("late_throughput_ratio", late_trials_per_s)):
                s_rate, b_rate = rate(st), rate(base)
                row[k] = round(s_rate / b_rate, 3) if s_rate and b_rate else None
            row.update(window_s=st["window_s"], same_machine=base.get("machine") == st.get("machine"),
                       equal_windows=base["window_s"] == st["window_s"])
            lost = lost_builds(base)
            if lost:
                row["not_a_fair_baseline"] = lost
            out.setdefault(st["network"], {}).setdefault(b, []).append(row)
    for by_base in out.values():
        for rows in by_base.values():
            rows.sort(key=lambda r: r["seed"])
    return out


def summarize_cells(arm_cells: dict[str, dict[str, Any]], eval_cells: dict[str, dict[str, Any]],
                    tol: float = TTQ_TOLERANCE) -> dict[str, Any]:
    """The results table: per network and baseline, the ratios per seed, their geometric means
    and worst runs; per arm, the speed-up over untuned."""
    networks: dict[str, Any] = {}
    for ev in sorted(eval_cells.values(), key=lambda c: (c.get("network", ""), c.get("seed", 0))):
        if "arms" not in ev or ev.get("untuned_ms") is None:
            continue
        net, seed = ev["network"], ev["seed"]
        sides: dict[str, dict[str, Any]] = {}
        for arm, v in ev["arms"].items():
            cell = arm_cells.get(v["run"])
            if cell is None:
                continue
            curve = step_curve(v["curve"], ev["untuned_ms"])
            sides[arm] = {"trials_per_s": cell.get("trials_per_s"), "late_trials_per_s": late_trials_per_s(cell),
                          "curve": curve, "window_s": cell["window_s"],
                          "machine": cell.get("machine"), "trials": cell.get("trials"),
                          "stopped_at_window": cell.get("stopped_at_window"),
                          "cpu_util_mean": cell.get("cpu_util_mean"), "gpu_util_mean": cell.get("gpu_util_mean"),
                          "cpu_core_s_by_role": cell.get("cpu_core_s_by_role"),
                          "unfair": lost_builds(cell),
                          "builds": {k: cell[k] for k in ("builds_sent", "build_errors", "build_timeouts")
                                     if k in cell}}
        n = networks.setdefault(net, {"runs": [], "vs": {b: [] for b in BASELINES}, "speedup": {}})
        run = {"seed": seed, "untuned_ms": ev["untuned_ms"], "gpu": ev.get("gpu"), "eval_machine": ev.get("machine"),
               "arms": {}}
        for arm, s in sides.items():
            final = s["curve"][-1][1]
            sp = round(ev["untuned_ms"] / final, 3) if final else None
            run["arms"][arm] = {"trials": s["trials"], "trials_per_s": s["trials_per_s"],
                                "late_trials_per_s": s["late_trials_per_s"], "final_ms": final,
                                "speedup_vs_untuned": sp, "cpu_util_mean": s["cpu_util_mean"],
                                "gpu_util_mean": s["gpu_util_mean"], "stopped_at_window": s["stopped_at_window"],
                                "machine": s["machine"], "curve": s["curve"],
                                **({"builds": s["builds"]} if s["builds"] else {}),
                                **({"not_a_fair_baseline": s["unfair"]} if s["unfair"] else {}),
                                **({"cpu_core_s_by_role": s["cpu_core_s_by_role"]} if s["cpu_core_s_by_role"] else {})}
            n["speedup"].setdefault(arm, []).append(sp)
        n["runs"].append(run)
        for st in [x for x in sides if x == "sharetune" or x.startswith(VARIANT_PREFIX)]:
            into = n["vs"] if st == "sharetune" else n.setdefault("variants", {}).setdefault(
                st, {b: [] for b in BASELINES})
            for b in BASELINES:
                if b in sides:
                    c = compare(sides[b], sides[st], tol)
                    c["seed"] = seed
                    c["same_machine"] = sides[b]["machine"] == sides[st]["machine"]
                    c["equal_windows"] = sides[b]["window_s"] == sides[st]["window_s"]
                    if sides[b]["unfair"]:
                        c["not_a_fair_baseline"] = sides[b]["unfair"]
                    into[b].append(c)
    pairs = rate_pairs(arm_cells)
    for net, n in networks.items():
        evaluated = {b: {r["seed"] for r in rows} for b, rows in n["vs"].items()}
        n["vs"] = _aggregated(n["vs"])
        # the trial rates over every pair of arms, evaluated or not (rate_pairs)
        for b, rows in pairs.get(net, {}).items():
            if b in n["vs"]:
                for r in rows:
                    r["evaluated"] = r["seed"] in evaluated.get(b, set())
                fair = [r for r in rows if "not_a_fair_baseline" not in r]
                agg = aggregate(fair)
                for k in RATE_RATIOS:
                    n["vs"][b][k] = {**agg[k], "seeds": [r["seed"] for r in fair if r.get(k) is not None]}
                n["vs"][b]["rates_per_seed"] = rows
        # variants: the same ratios for a search other than the shipped one, never judged as goals
        n["variants"] = {v: {"vs": _aggregated(rows)} for v, rows in n.get("variants", {}).items()}
        n["speedup_vs_untuned"] = {arm: {"geomean": gmean(v), "worst": min((x for x in v if x), default=None),
                                         "per_seed": v} for arm, v in n.pop("speedup").items()}
    return networks


# The goals of the real-budget comparison: (name, baseline or None for sharetune alone, metric,
# comparison, bound). Judged on the geometric mean over seeds, for every network of HEADLINE.
HEADLINE = ("resnet50", "mobilenet_v2")
GOALS: tuple[tuple[str, str | None, str, str, float], ...] = (
    ("throughput_vs_stock", "stock", "throughput_ratio", ">=", 6.0),
    # the same bound on the rate after start-up (late_trials_per_s): what budgets of hours get
    ("late_throughput_vs_stock", "stock", "late_throughput_ratio", ">=", 6.0),
    ("time_to_quality_vs_stock", "stock", "time_to_quality_ratio", ">=", 5.0),
    ("final_latency_vs_stock", "stock", "latency_ratio", "<=", 0.95),
    ("throughput_vs_stock_tuned", "stock-tuned", "throughput_ratio", ">=", 2.0),
    ("late_throughput_vs_stock_tuned", "stock-tuned", "late_throughput_ratio", ">=", 2.0),
    ("time_to_quality_vs_stock_tuned", "stock-tuned", "time_to_quality_ratio", ">=", 2.0),
    ("tuned_vs_untuned", None, "speedup_vs_untuned", ">=", 1.3),
)


def goals(networks: dict[str, Any], headline: tuple[str, ...] = HEADLINE) -> dict[str, Any]:
    """Each goal judged per network (True/False; None where the value could not be measured,
    e.g. a time-to-quality ratio against a baseline that never improved) and over the headline
    networks (None unless every one of them was judged)."""
    by_network: dict[str, dict[str, bool | None]] = {}
    values: dict[str, dict[str, Any]] = {}
    for net, n in networks.items():
        for name, base, metric, op, bound in GOALS:
            agg = (n.get("speedup_vs_untuned", {}).get("sharetune") if base is None
                   else n.get("vs", {}).get(base, {}).get(metric))
            v = agg.get("geomean") if agg else None
            ok = None if v is None else (v >= bound if op == ">=" else v <= bound)
            by_network.setdefault(net, {})[name] = ok
            values.setdefault(net, {})[name] = {"geomean": v, "worst": agg.get("worst") if agg else None,
                                                "goal": f"{op} {bound}"}
    met: dict[str, bool | None] = {}
    for name, *_ in GOALS:
        judged = [by_network.get(net, {}).get(name) for net in headline]
        met[name] = None if any(j is None for j in judged) else all(judged)
    return {"goals_met": met, "goals_met_by_network": by_network, "goal_values": values}


def summarize(a: argparse.Namespace) -> int:
    arms = load_cells(ARMS_FILE)
    evs = load_cells(EVAL_FILE)
    networks = summarize_cells(arms, evs, a.tolerance)
    doc = {
        "how_measured": {
            "arms": {"stock": "stock MetaSchedule as shipped: one process, LocalBuilder(), RPCRunner(max_workers=1), "
                              "one RPC server, evolutionary search, 64 per batch, gradient scheduler",
                     "stock-tuned": f"the same with a tracker and N={STOCK_TUNED_SERVERS} RPC servers on the GPU "
                                    "(no MPS), RPCRunner(max_workers=N), LocalBuilder(max_workers=cores), "
                                    f"{STOCK_TUNED_SCHEDULER} scheduler",
                     "sharetune": f"local-mode topology: {ST_CLIENTS} clients, {ST_SERVERS} servers at {ST_PCT}% "
                                  f"under MPS, {ST_PER_ITER} per round, a shard's tasks round-robin, no per-task cap "
                                  "below the budget (budgets in proportion to cost)"},
            "builder_timeout": f"stock arms: LocalBuilder's timeout as each arm's knobs say (builder_timeout_s; "
                               f"absent: TVM's {TVM_BUILDER_TIMEOUT_S:.0f} s); an arm that lost builds to it is "
                               "not a fair baseline: its comparison is kept per seed (not_a_fair_baseline) and left "
                               "out of the geometric means and goals_met",
            "budget": f"{TOTAL} trials, whole model, not exhausted within the window (each arm says "
                      "stopped_at_window)",
            "window": "each arm one device command; wall time from the first process started (start-up included)",
            "throughput_ratio": "trials/s of sharetune / of the baseline; trials within the window: the stock arms' "
                                "candidates measured (counted as the runner measures them, committed or not), "
                                "sharetune's records committed",
            "late_throughput_ratio": "the same in the window's second half (late_trials_per_s); both trial-rate "
                                     "ratios over every seed that ran both arms, evaluated or not "
                                     "(rates_per_seed), the others over the evaluated seeds",
            "latency_ratio": "sharetune's end-to-end latency at the window's end / the baseline's "
                             "(compile_relax with the best record per task, relax VM, median of 10 rounds >= 100 ms, "
                             "whole GPU, no MPS, all models of one (network, seed) measured in one process)",
            "time_to_quality_ratio": "time the baseline needed to reach its final latency "
                                     f"(within {a.tolerance:.0%}) / "
                                     "time sharetune needed to reach it; times are checkpoints (the curve is "
                                     "measured at them); None with time_to_quality_ratio_below when sharetune "
                                     "never reached it",
            "speedup_vs_untuned": "untuned latency / the arm's final latency",
            "geomean": "over seeds, with the worst run beside it",
            "goals_met": "each goal on the geometric mean over seeds; null where it could not be judged (a network "
                         f"of {', '.join(HEADLINE)} not run, or a ratio without a value)",
        },
        **goals(networks),
        "networks": networks,
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    log(f"wrote {out}")
    if a.plot:
        plot(networks, Path(a.plot))
        log(f"wrote {a.plot}")
    for net, n in networks.items():
        for b, v in n["vs"].items():
            log(f"{net} vs {b}: throughput {v['throughput_ratio']}, ttq {v['time_to_quality_ratio']}, "
                f"latency {v['latency_ratio']}")
    return 0


def plot(networks: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(net, r) for net, n in networks.items() for r in n["runs"]]
    if not runs:
        return
    fig, axes = plt.subplots(1, len(runs), figsize=(5.2 * len(runs), 4), squeeze=False)
    colors = {"stock": "tab:gray", "stock-tuned": "tab:blue", "sharetune": "tab:orange"}
    for ax, (net, r) in zip(axes[0], runs):
        for arm, v in r["arms"].items():
            xs, ys = zip(*v["curve"])
            ax.step(xs, ys, where="post", marker="o", ms=3, color=colors.get(arm),
                    label=f"{arm}: {v['trials_per_s']} trials/s, {v['speedup_vs_untuned']}x")
        ax.axhline(r["untuned_ms"], ls=":", color="k", lw=1, label=f"untuned {r['untuned_ms']} ms")
        gpu = (r.get("gpu") or "").split(",")[0].replace("NVIDIA ", "")
        ax.set_title(f"{net}, seed {r['seed']}" + (f" ({gpu})" if gpu else ""))
        ax.set_xlabel("wall time of the arm (s)")
        ax.set_ylabel("end-to-end latency (ms)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


# ---- CLI --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tune", help="one arm, one window")
    t.add_argument("--network", choices=NETWORKS, required=True)
    t.add_argument("--arm", choices=ARMS, required=True)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--window-s", type=float, default=540.0)
    t.add_argument("--target", default="cuda")
    t.add_argument("--total", type=int, default=TOTAL, help="trial budget (all arms)")
    t.add_argument("--servers", type=int, default=None,
                   help=f"stock-tuned: servers = runner workers ({STOCK_TUNED_SERVERS}); "
                        f"sharetune: servers ({ST_SERVERS})")
    t.add_argument("--builder-workers", type=int, default=None, help="stock-tuned: LocalBuilder workers (cores)")
    t.add_argument("--builder-timeout-s", type=float, default=STOCK_BUILDER_TIMEOUT_S,
                   help="stock arms: LocalBuilder timeout_sec (TVM's default: 30)")
    t.add_argument("--clients", type=int, default=ST_CLIENTS, help="sharetune")
    t.add_argument("--pct", type=int, default=ST_PCT, help="sharetune: MPS thread percentage per server")
    t.add_argument("--evolution", default="", help="sharetune: the clients' evolutionary search as PxG "
                   "(population per candidate x generations; SHARETUNE_EVOLUTION; default: the client's, 4x4)")
    t.add_argument("--per-iter", type=int, default=ST_PER_ITER, help="sharetune: candidates per round")
    t.add_argument("--per-task", type=int, default=ST_PER_TASK, help="sharetune: trials per task at most")
    t.add_argument("--no-peers", action="store_true", help="sharetune: each shard's cost model learns only its own "
                   "records (SHARETUNE_PEER_RECORDS=off; the variant sharetune-nopeers)")
    t.add_argument("--force", action="store_true")
    t.add_argument("--profile-s", type=float, default=0.0, help="py-spy one client and the build service for "
                                                                 "this long (0: no profile)")
    t.add_argument("--profile-at-s", type=float, default=90.0, help="when the profile starts, into the window")
    t.add_argument("--profile-native", action="store_true", help="C++ frames too (py-spy --native; pauses the "
                                                                  "profiled processes for each sample)")
    e = sub.add_parser("evaluate", help="latency curves of every arm of one (network, seed), on the GPU")
    c = sub.add_parser("compile", help="evaluate's compiling only, on any machine (CUDA: NVRTC, no GPU), "
                                       "packed for evaluate on the GPU machine")
    for p in (e, c):  # what the models are compiled from
        p.add_argument("--network", choices=NETWORKS, required=True)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--target", default="cuda")
        p.add_argument("--checkpoints", default=DEFAULT_CHECKPOINTS, help="seconds into each arm's window")
        p.add_argument("--tars", nargs="*", default=[], help="the arms' tar.gz (default: bench/results/<arm "
                                                             "id>.tar.gz, or this machine's run dirs)")
        p.add_argument("--jobs", type=int, default=None, help="compiles at a time (default: cores / 2, at most 8)")
        p.add_argument("--compile-timeout-s", type=float, default=330.0, help="all compiles together")
    e.add_argument("--pack", default=None, help="models compiled by `compile` (default: bench/results/"
                                                "rbmodels-<network>-s<seed>.tar.xz if there; else compiled here first)")
    e.add_argument("--repeat", type=int, default=10)
    e.add_argument("--measure-timeout-s", type=float, default=200.0)
    e.add_argument("--force", action="store_true")
    c.add_argument("--pack", default=None, help="where to write it (default: bench/results/"
                                                "rbmodels-<network>-s<seed>.tar.xz)")
    s = sub.add_parser("summarize", help="ratios, geometric means, plot (no GPU)")
    s.add_argument("--out", default=str(SUMMARY_JSON))
    s.add_argument("--plot", default=str(PLOT_PNG), help="'' = none")
    s.add_argument("--tolerance", type=float, default=TTQ_TOLERANCE)
    i = sub.add_parser("_compile", help=argparse.SUPPRESS)
    i.add_argument("--network", required=True)
    i.add_argument("--target", required=True)
    i.add_argument("--out", type=Path, required=True)
    i.add_argument("--dirs", required=True)
    i.add_argument("--counts", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "tune":
        os.environ.update(tuner_env())
        return tune(a)
    if a.cmd == "evaluate":
        return evaluate(a)
    if a.cmd == "compile":
        return compile_only(a)
    if a.cmd == "summarize":
        return summarize(a)
    compile_at([Path(d) for d in a.dirs.split(",")], [int(n) for n in a.counts.split(",")], a.network, a.target,
               a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
