"""How many builder workers (and search threads) a client uses when the job does not say.

``os.cpu_count()`` is the host's core count: in a pod with a CPU limit, or with several clients
on one host (local mode), a pool that size oversubscribes the CPU many times over. Measured on
the H200 machine (16 cores, 6 clients, the -r4 cells of bench/results/h200-cells.jsonl): 16 workers per
client failed 68 of 96 trials, 6 per client (2 x cores / clients) failed none in nine runs.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")
# cgroup v1 (nodes whose kubelet and runtime still use it): the container's CPU controller.
CGROUP_V1_CPU_DIRS = (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup/cpu,cpuacct"))


def _cfs_quota(dirs: tuple[Path, ...]) -> tuple[str, str] | None:
    for d in dirs:
        try:
            return (d / "cpu.cfs_quota_us").read_text().strip(), (d / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            continue
    return None


def cgroup_cpu_limit(cpu_max: Path = CGROUP_CPU_MAX,
                     v1_dirs: tuple[Path, ...] = CGROUP_V1_CPU_DIRS) -> float | None:
    """The cgroup CPU limit in cores: v2 ``cpu.max`` = "<quota> <period>" (or "max <period>");
    without it, v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (quota -1: no limit)."""
    try:
        quota, period = cpu_max.read_text().split()[:2]
    except OSError:
        v1 = _cfs_quota(v1_dirs)
        if v1 is None:
            return None
        quota, period = v1
        if quota.startswith("-"):
            return None  # -1: no limit
    except ValueError:
        return None
    if quota == "max":
        return None
    try:
        return int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None


def available_cpus(cpu_max: Path = CGROUP_CPU_MAX, v1_dirs: tuple[Path, ...] = CGROUP_V1_CPU_DIRS) -> int:
    """CPUs this process may use: its affinity mask, capped by its cgroup's CPU limit."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    limit = cgroup_cpu_limit(cpu_max, v1_dirs)
    if limit is not None:
        n = min(n, max(1, math.ceil(limit)))
    return max(1, n)


def default_builder_workers(clients_on_host: int = 1, cpus: int | None = None) -> int:
    """Twice this client's share of the CPUs (a client's own search and its builds alternate, so
    2x keeps the cores busy), never more than the CPUs."""
    cpus = cpus or available_cpus()
    return max(1, min(cpus, math.ceil(2 * cpus / max(1, clients_on_host))))


def cost_model_threads(clients_on_host: int = 1, cpus: int | None = None) -> int:
    """The XGBoost cost model's threads: this client's fair share of the CPUs, never more. Its
    OpenMP threads spin while waiting, so oversubscribing cores costs far more than the threads
    gain: six processes training on 2 cores took 2.7x as long with 2 threads each as with 1
    (47.7 s vs 128.6 s), and on the H200 a pool of three jobs (9 clients, 11 threads each on
    16 cores) spent 12-39 s per shard updating the cost model against 1.6-10 s alone."""
    cpus = cpus or available_cpus()
    return max(1, cpus // max(1, clients_on_host))
