"""Default builder pool size: the CPUs a client may really use, shared with the other clients on
its host (pure: cgroup files are written by the test)."""

from __future__ import annotations

import os
from pathlib import Path

from sharetune_tuner.build.cpus import available_cpus, cgroup_cpu_limit, default_builder_workers


def test_cgroup_cpu_max_is_read_as_cores(tmp_path: Path) -> None:
    f = tmp_path / "cpu.max"
    f.write_text("max 100000\n")
    assert cgroup_cpu_limit(f) is None  # no limit
    f.write_text("250000 100000\n")
    assert cgroup_cpu_limit(f) == 2.5
    f.write_text("garbage")
    assert cgroup_cpu_limit(f) is None
    assert cgroup_cpu_limit(tmp_path / "missing", v1_dirs=(tmp_path / "no-v1",)) is None


def test_cgroup_v1_cfs_quota_is_read_when_there_is_no_cpu_max(tmp_path: Path) -> None:
    # A node on cgroup v1 (runc mounts the container's own cpu controller): no cpu.max there.
    v1 = tmp_path / "cpu"
    v1.mkdir()
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    (v1 / "cpu.cfs_quota_us").write_text("50000\n")  # limits.cpu: 500m
    missing = tmp_path / "cpu.max"
    assert cgroup_cpu_limit(missing, v1_dirs=(tmp_path / "absent", v1)) == 0.5
    assert available_cpus(missing, v1_dirs=(v1,)) == 1
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")  # no limit
    assert cgroup_cpu_limit(missing, v1_dirs=(v1,)) is None
    assert available_cpus(missing, v1_dirs=(v1,)) == len(os.sched_getaffinity(0))


def test_a_pods_cpu_limit_caps_the_cpus(tmp_path: Path) -> None:
    f = tmp_path / "cpu.max"
    f.write_text("150000 100000\n")  # 1.5 CPUs: two workers' worth
    assert available_cpus(f) == min(2, len(os.sched_getaffinity(0)))
    f.write_text("max 100000\n")
    assert available_cpus(f) == len(os.sched_getaffinity(0))


def test_clients_on_one_host_share_its_cores() -> None:
    assert default_builder_workers(6, cpus=16) == 6  # the H200 bench's measured-good pool (not 16)
    assert default_builder_workers(1, cpus=16) == 16
    assert default_builder_workers(2, cpus=2) == 2
    assert default_builder_workers(64, cpus=16) == 1
