"""Local mode on a multi-GPU host: which processes it starts, with which GPU environment (the
processes themselves need GPUs: bench/multi_gpu.py runs them on a lent multi-GPU machine)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sharetune.api.spec import parse_spec
from sharetune.local.run import LocalRun


def planned(spec: dict[str, Any], tmp_path: Path) -> tuple[LocalRun, list[tuple[str, list[str], dict[str, str]]]]:
    run = LocalRun(parse_spec("j", spec), tmp_path / "job.yaml", tmp_path / "run")
    calls: list[tuple[str, list[str], dict[str, str]]] = []
    run._spawn = lambda name, args, env=None: calls.append((name, args, env or run._base_env()))
    import sharetune.local.run as local

    # Nothing really starts: the servers' readiness waits (MPS daemon, tracker) pass at once.
    wait, local._wait_until = local._wait_until, lambda ready, limit_s, poll_s=0.05: True
    try:
        run.start_services()
    finally:
        local._wait_until = wait
        run.stop_all()  # nothing runs; removes the run's temporary directory (socket, artifacts)
    return run, calls


def test_two_gpus_get_a_daemon_each_and_their_own_servers(tmp_path: Path) -> None:
    run, calls = planned({"model": {"name": "tiny_cnn"}, "target": "cuda", "gpuSharing": {"gpus": 2},
                          "servers": {"replicas": 3, "threadPercentage": 30}, "clients": {"shards": 2}}, tmp_path)
    names = [c[0] for c in calls]
    assert names == ["build-service", "mps-daemon-0", "mps-daemon-1", "tracker", "server-0-0", "server-0-1",
                     "server-0-2", "server-1-0", "server-1-1", "server-1-2"]
    env = {c[0]: c[2] for c in calls}
    for g in (0, 1):
        daemon = env[f"mps-daemon-{g}"]
        assert daemon["CUDA_VISIBLE_DEVICES"] == str(g)  # the daemon's MPS server runs on GPU g
        for j in range(3):
            srv = env[f"server-{g}-{j}"]
            assert srv["CUDA_MPS_PIPE_DIRECTORY"] == daemon["CUDA_MPS_PIPE_DIRECTORY"]  # under GPU g's daemon
            # Not pinned: an MPS client sees its daemon's GPU as device 0.
            assert srv.get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")
            assert srv["NCCL_NVLS_ENABLE"] == "0" and srv["NVSHMEM_DISABLE_NVLS"] == "1"
    assert env["mps-daemon-0"]["CUDA_MPS_PIPE_DIRECTORY"] != env["mps-daemon-1"]["CUDA_MPS_PIPE_DIRECTORY"]
    # Both clients share all six servers through the one tracker key, a session per server.
    args = run.client_args(0)
    assert args[args.index("--servers") + 1] == "3" and args[args.index("--key") + 1] == run.key


def test_two_gpus_without_mps_pin_each_server_to_its_gpu(tmp_path: Path) -> None:
    _, calls = planned({"model": {"name": "tiny_cnn"}, "target": "cuda", "gpuSharing": {"gpus": 2, "mps": False},
                        "servers": {"replicas": 1}}, tmp_path)
    env = {c[0]: c[2] for c in calls}
    assert [n for n in env] == ["build-service", "tracker", "server-0-0", "server-1-0"]
    assert env["server-0-0"]["CUDA_VISIBLE_DEVICES"] == "0" and env["server-1-0"]["CUDA_VISIBLE_DEVICES"] == "1"


def test_cpu_and_single_gpu_layouts_are_unchanged(tmp_path: Path) -> None:
    _, calls = planned({"model": {"name": "tiny_cnn"}, "servers": {"replicas": 2}, "gpuSharing": {"gpus": 4}}, tmp_path)
    assert [c[0] for c in calls] == ["build-service", "tracker", "server-0", "server-1"]
    _, calls = planned({"model": {"name": "tiny_cnn"}, "target": "cuda", "servers": {"replicas": 2}}, tmp_path / "g")
    assert [c[0] for c in calls] == ["build-service", "mps-daemon", "tracker", "server-0", "server-1"]


def test_clients_share_one_build_service_unless_the_job_sizes_their_pools(tmp_path: Path) -> None:
    run, calls = planned({"model": {"name": "tiny_cnn"}, "clients": {"shards": 3}}, tmp_path / "a")
    assert [c[0] for c in calls].count("build-service") == 1
    service = calls[0][1]
    for i in range(3):  # every client is pointed at that one socket, with the run's key in its env
        args = run.client_args(i)
        assert args[args.index("--build-service") + 1] == service[service.index("--listen") + 1]
    assert run._base_env()["SHARETUNE_BUILD_AUTHKEY"] == run.build_authkey
    assert len(run.build_socket.as_posix()) < 100  # AF_UNIX paths are limited to 107 bytes
    # Built candidates go under the run's own directory, which stop_all (in planned()) removed.
    assert Path(run._base_env()["SHARETUNE_BUILD_DIR"]).parent == run.build_socket.parent == run.scratch
    assert not run.scratch.exists()
    for k, spec in enumerate(({"model": {"name": "tiny_cnn"}, "clients": {"shards": 3, "builderWorkers": 4}},
                 {"model": {"name": "tiny_cnn"}, "clients": {"shards": 1}})):
        run, calls = planned(spec, tmp_path / f"b{k}")
        assert "build-service" not in [c[0] for c in calls]
        assert "--build-service" not in run.client_args(0)
