"""Shared helpers of the H200 benchmark cells: processes, results files, samplers, task choice.

Every cell appends one JSON object (with an ``id``) to a JSON-lines file; a cell whose id is
already there is skipped, so a sweep resumes across device calls. Results are kept in two places
on the device: ``bench/results/`` of the copied checkout (carried from the developer's machine,
so earlier calls' results come along) and ``$BENCH_RUN_ROOT/results`` (survives between calls
while the machine stays warm); reads take the union, and ``export_results`` copies the merged
files to ``$OUT`` so they come back.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# the product's process-group helper; free_port is the cells'
from sharetune.procs import ProcessGroup, free_port, stop_all  # noqa: E402,F401  # re-exported to the cells

RESULTS = ROOT / "bench" / "results"
RUN_ROOT = Path(os.environ.get("BENCH_RUN_ROOT", "/tmp/sharetune-bench"))
DEVICE_RESULTS = RUN_ROOT / "results"


# ---- results ----------------------------------------------------------------------------------
def _read_jsonl(p: Path) -> list[dict[str, Any]]:
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def load_cells(name: str) -> dict[str, dict[str, Any]]:
    cells: dict[str, dict[str, Any]] = {}
    for p in (RESULTS / name, DEVICE_RESULTS / name):
        for c in _read_jsonl(p):
            cells[c["id"]] = c
    return cells


def append_cell(name: str, cell: dict[str, Any]) -> None:
    DEVICE_RESULTS.mkdir(parents=True, exist_ok=True)
    line = json.dumps(cell) + "\n"
    with open(DEVICE_RESULTS / name, "a") as f:
        f.write(line)
    export_results()


def export_results() -> None:
    """Merged results files to $OUT (what comes back from the device)."""
    out = os.environ.get("OUT")
    if not out or not DEVICE_RESULTS.exists():
        return
    for p in DEVICE_RESULTS.glob("*.jsonl"):
        cells = load_cells(p.name)
        (Path(out) / p.name).write_text("".join(json.dumps(c) + "\n" for c in cells.values()))


# ---- processes --------------------------------------------------------------------------------
def tuner_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every tuner process: torch hidden (NOTORCH_PYTHONPATH first), the repo's
    packages importable, unbuffered output."""
    env = dict(os.environ)
    paths = [p for p in (os.environ.get("NOTORCH_PYTHONPATH", ""), str(ROOT / "operator"),
                         str(ROOT / "tuner-image"), str(ROOT / "bench" / "h200")) if p]
    env["PYTHONPATH"] = ":".join(paths + [p for p in env.get("PYTHONPATH", "").split(":")
                                          if p and p not in ":".join(paths)])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class Group:
    """The processes of one cell, each a ``sharetune.procs.ProcessGroup`` (its own process group,
    so TVM's popen workers stop with it) logging to ``<log_dir>/<name>.log``; ``stop`` stops them
    in reverse start order."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: list[ProcessGroup] = []

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> ProcessGroup:
        p = ProcessGroup(name, argv, self.log_dir / f"{name}.log", env, ROOT).start()
        self.procs.append(p)
        return p

    def tail(self, name: str, n: int = 30) -> str:
        return next((p.tail(n) for p in self.procs if p.name == name), "")

    def stop(self, grace_s: float = 8.0) -> None:
        stop_all(self.procs, grace_s)
        self.procs = []


# ---- earlier runs -----------------------------------------------------------------------------
PRIOR_RUNS_ENV = "BENCH_PRIOR_RUNS"


def add_prior_runs_arg(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--prior-runs", metavar="TAR", default=os.environ.get(PRIOR_RUNS_ENV) or None,
                    help="a sweep's h200-runs.tar.gz (record databases of earlier runs) to restore on a "
                         f"fresh machine (default: ${PRIOR_RUNS_ENV}; none: start without earlier runs). "
                         "Not in git: see bench/h200/README.md for getting it back from history")


def restore_runs(tar: str | None) -> None:
    """Earlier runs' record databases (``runs/<id>/...`` of a sweep's ``h200-runs.tar.gz``) into
    ``$BENCH_RUN_ROOT``, on a fresh machine only; without ``tar`` the machine starts without them
    (evaluations and serving reports of those runs then have nothing to read)."""
    if not tar or (RUN_ROOT / "runs").exists():
        return
    if not Path(tar).is_file():
        raise SystemExit(f"--prior-runs / ${PRIOR_RUNS_ENV}: {tar}: no such file")
    RUN_ROOT.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar) as t:
        t.extractall(RUN_ROOT)


# ---- MPS --------------------------------------------------------------------------------------
MPS_PIPE = RUN_ROOT / "mps-pipe"
MPS_LOG = RUN_ROOT / "mps-log"


def mps_env() -> dict[str, str]:
    return {"CUDA_MPS_PIPE_DIRECTORY": str(MPS_PIPE), "CUDA_MPS_LOG_DIRECTORY": str(MPS_LOG)}


def mps_control(cmd: str, pipe: Path = MPS_PIPE, log_dir: Path = MPS_LOG, timeout_s: float = 30.0) -> str:
    """One command to the MPS control daemon of ``pipe`` (the product's ``MpsDaemon.control``):
    its answer, or why there was none."""
    from sharetune_tuner.measure.mps import MpsDaemon

    return MpsDaemon(pipe, log_dir).control(cmd, timeout_s)[1]


def mps_start(default_pct: int | None = None) -> None:
    MPS_PIPE.mkdir(parents=True, exist_ok=True)
    MPS_LOG.mkdir(parents=True, exist_ok=True)
    if (MPS_PIPE / "control").exists():
        mps_stop()
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env={**os.environ, **mps_env()}, check=True)
    time.sleep(1.0)
    if default_pct is not None:
        mps_control(f"set_default_active_thread_percentage {default_pct}")


def mps_stop() -> None:
    if not (MPS_PIPE / "control").exists():
        return
    try:
        mps_control("quit")
    except Exception:
        pass
    time.sleep(1.0)


# ---- sampling ---------------------------------------------------------------------------------
# The role of a process of a tuning run, by the head of its command line (program, module, sub-
# command; never its arguments, which name trackers and servers); a process none names (a pool
# worker) takes its parent's role. TVM's popen workers do what their parent sends them: the build
# service's build ("build"); a stock client's build and run its candidates ("client-popen-workers").
ROLE_MARKERS: tuple[tuple[str, str], ...] = (
    ("nvidia-cuda-mps", "mps"), ("build-service", "build"), ("rpc_tracker", "tracker"), ("rpc_server", "server"),
    ("cli server", "server"), ("cli tracker", "tracker"), ("client", "client"))


def process_role(argv: list[str], parent_role: str | None) -> str:
    head = " ".join(a.rsplit("/", 1)[-1] for a in argv[:4]).replace("sharetune_tuner.", "")
    if "popen_worker" in head:
        if parent_role is None or parent_role == "build" or parent_role.endswith("-popen-workers"):
            return parent_role or "other"
        return f"{parent_role}-popen-workers"
    for marker, role in ROLE_MARKERS:
        if marker in head:
            return role
    return parent_role or "other"


class CpuByRole:
    """Core-seconds of CPU each role of a run used (user + system of every descendant of this
    process, read each ``sample()``): where a trial's CPU goes. A process that lives less than one
    sampling period is missed, so the sum is a lower bound."""

    def __init__(self) -> None:
        self.last: dict[int, tuple[str, float]] = {}  # pid -> (role, cpu seconds at its last sample)

    def sample(self) -> None:
        import psutil

        roles: dict[int, str] = {}
        try:
            procs = psutil.Process().children(recursive=True)
        except psutil.Error:
            return
        for p in procs:  # parents come before their children in psutil's walk
            try:
                argv = p.cmdline()
                t = p.cpu_times()
                ppid = p.ppid()
            except psutil.Error:
                continue
            roles[p.pid] = process_role(argv, roles.get(ppid))
            self.last[p.pid] = (roles[p.pid], t.user + t.system)

    def core_seconds(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for role, s in self.last.values():
            out[role] = out.get(role, 0.0) + s
        return {k: round(v, 1) for k, v in sorted(out.items())}


class Sampler:
    """CPU (psutil, whole machine) and GPU (NVML) utilisation, plus the record counts of the
    databases being written, every ``period_s``: the time line of a tuning run; with ``roles``,
    the CPU each role of the run used (CpuByRole, every ``roles_every`` samples)."""

    def __init__(self, db_dirs: list[Path] | None = None, period_s: float = 0.5,
                 core_groups: dict[str, list[int]] | None = None, roles: bool = False,
                 roles_every: int = 2) -> None:
        self.db_dirs = db_dirs or []
        self.roles = CpuByRole() if roles else None
        self.roles_every = roles_every
        # name -> CPUs: the mean busy % of each group too (the tuning cores vs the builders' cores)
        self.core_groups = core_groups or {}
        self.period_s = period_s
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._counts = {str(d): 0 for d in self.db_dirs}
        self._offsets = {str(d): 0 for d in self.db_dirs}

    def _count(self, d: Path) -> int:
        p = d / "database_tuning_record.json"
        key = str(d)
        try:
            with open(p, "rb") as f:
                f.seek(self._offsets[key])
                chunk = f.read()
        except FileNotFoundError:
            return self._counts[key]
        last_nl = chunk.rfind(b"\n")
        if last_nl >= 0:
            self._counts[key] += chunk[: last_nl + 1].count(b"\n")
            self._offsets[key] += last_nl + 1
        return self._counts[key]

    def _loop(self) -> None:
        import psutil

        try:
            import pynvml

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:
            pynvml, h = None, None
        psutil.cpu_percent(interval=None)
        while not self._stop.wait(self.period_s):
            s: dict[str, Any] = {"t": time.time(), "cpu": psutil.cpu_percent(interval=None)}
            if self.core_groups:
                per = psutil.cpu_percent(interval=None, percpu=True)
                s["cpu_groups"] = {k: round(sum(per[c] for c in cs) / len(cs), 1)
                                   for k, cs in self.core_groups.items() if cs and max(cs) < len(per)}
            if h is not None:
                try:
                    s["gpu"] = pynvml.nvmlDeviceGetUtilizationRates(h).gpu
                    s["gpu_mem_mb"] = pynvml.nvmlDeviceGetMemoryInfo(h).used // (1 << 20)
                except Exception:
                    pass
            s["records"] = {k: self._count(Path(k)) for k in self._counts}
            if self.roles is not None and len(self.samples) % self.roles_every == 0:
                self.roles.sample()
            self.samples.append(s)

    def start(self) -> "Sampler":
        self._t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._t.join(timeout=5)

    def summary(self, t0: float, t1: float) -> dict[str, Any]:
        xs = [s for s in self.samples if t0 <= s["t"] <= t1]
        cpu = [s["cpu"] for s in xs]
        gpu = [s["gpu"] for s in xs if "gpu" in s]
        groups = {k: [s["cpu_groups"][k] for s in xs if k in s.get("cpu_groups", {})] for k in self.core_groups}
        return {"samples": len(xs), "period_s": self.period_s,
                **({"cpu_util_by_cores": {k: round(sum(v) / len(v), 1) for k, v in groups.items() if v}}
                   if groups else {}),
                **({"cpu_core_s_by_role": self.roles.core_seconds()} if self.roles is not None else {}),
                "cpu_util_mean": round(sum(cpu) / len(cpu), 1) if cpu else None,
                "gpu_util_mean": round(sum(gpu) / len(gpu), 1) if gpu else None,
                "gpu_mem_max_mb": max((s.get("gpu_mem_mb", 0) for s in xs), default=None)}

    def record_times(self) -> dict[str, list[float]]:
        """Per database: the time each record line was first seen (resolution ``period_s``)."""
        out: dict[str, list[float]] = {}
        for k in self._counts:
            times: list[float] = []
            for s in self.samples:
                n = s["records"].get(k, 0)
                while len(times) < n:
                    times.append(s["t"])
            out[k] = times
        return out


def parse_cpus(text: str) -> list[int]:
    """A CPU list as taskset writes it ("0-7", "8-11,14") as sorted CPU numbers."""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return sorted(out)


# ---- tasks ------------------------------------------------------------------------------------
def heaviest(tasks: list[Any], k: int) -> list[Any]:
    """The ``k`` tasks with the most work in the model (FLOPs x calls): the same order the
    partitioner uses."""
    from sharetune_tuner.search.partition import order

    keep = {t.key for t in order([t.info for t in tasks])[:k]}
    return [t for t in tasks if t.info.key in keep]


def gpu_name() -> str:
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        return r.stdout.strip()
    except Exception as e:
        return f"unknown ({e})"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def copy_tree_small(src: Path, dst: Path) -> None:
    if src.exists():
        shutil.copytree(src, dst, dirs_exist_ok=True)
