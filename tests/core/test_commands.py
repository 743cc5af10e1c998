"""The command lines both topologies build (sharetune.api.commands) are ones the tuner accepts,
and the operator's pods and local mode start the same commands for the same job."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sharetune.api.spec import parse_spec
from sharetune.planner import JobRef, pins_gpu, plan, plan_clients, plan_merge
from sharetune_tuner.cli import SERVER_PORTS, build_parser, server_ports
from sharetune_tuner.errors import TunerError

JOB = JobRef("tj", "ns1", "uid-1")
SPECS: dict[str, dict[str, Any]] = {
    "cpu": {"model": {"name": "tiny_cnn"}, "clients": {"shards": 3}},
    "cuda-mps": {"model": {"name": "resnet18"}, "target": "cuda",
                 "servers": {"replicas": 4, "threadPercentage": 25, "pinnedMemoryLimit": "2G"}},
    "cuda-2gpu": {"model": {"name": "resnet18"}, "target": "cuda", "gpuSharing": {"gpus": 2}},
    "cuda-no-mps": {"model": {"name": "resnet18"}, "target": "cuda", "gpuSharing": {"gpus": 2, "mps": False}},
    "s3": {"model": {"name": "tiny_cnn"}, "output": {"s3": {"bucket": "b", "credentialsSecret": {"name": "c"}},
                                                     "configMap": None}},
}


def _pod_args(o: dict[str, Any]) -> list[list[str]]:
    pod = o["spec"]["template"]["spec"] if "template" in o["spec"] else o["spec"]
    return [c["args"] for c in pod["containers"]]


def _parse(args: list[str]) -> Any:
    try:
        return build_parser().parse_args(args)
    except SystemExit:  # argparse's way of refusing a command line
        pytest.fail(f"the tuner refuses {args}")


def _applied(s: Any) -> list[dict[str, Any]]:
    """What the operator applies over a job's life: where a daemon holds the GPU, the clients
    come once it has named that GPU."""
    clients = [plan_clients(JOB, s)] if pins_gpu(s, None) else []
    return [*plan(JOB, s), *clients, plan_merge(JOB, s)]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_pod_command_parses_with_the_tuner_cli(name: str) -> None:
    s = parse_spec("tj", SPECS[name])
    seen = set()
    for o in _applied(s):
        if o["kind"] in ("Pod", "Deployment", "Job"):
            for args in _pod_args(o):
                a = _parse(args)
                seen.add(a.cmd)
                assert a.metrics_port == 9400
    assert seen >= {"tracker", "server", "client", "merge"}
    assert ("mps-daemon" in seen) == s.uses_mps


@pytest.mark.parametrize("name", sorted(SPECS))
def test_local_mode_starts_the_same_commands(name: str, tmp_path: Path) -> None:
    import sharetune.local.run as local

    s = parse_spec("tj", SPECS[name])
    run = local.LocalRun(s, tmp_path / "job.yaml", tmp_path / "run")
    spawned: list[tuple[str, list[str]]] = []
    run._spawn = lambda n, args, env=None: spawned.append((n, args))
    wait, local._wait_until = local._wait_until, lambda ready, limit_s, poll_s=0.05: True
    try:
        run.start_services()
    finally:
        local._wait_until = wait
        run.stop_all()
    local_cmds = {n: _parse(a) for n, a in spawned}
    local_cmds["client"] = _parse(run.client_args(0))
    pods = {}
    for o in _applied(s):
        if o["kind"] in ("Pod", "Deployment", "Job"):
            for args in _pod_args(o):
                pods.setdefault(args[0], _parse(args))
    # The same subcommands, with the same MPS limits and the same view of the job's servers.
    assert {a.cmd for a in local_cmds.values()} - {"build-service"} == set(pods) - {"merge"}
    for n, a in local_cmds.items():
        if a.cmd in ("server", "mps-daemon"):
            p = pods[a.cmd]
            assert (a.thread_percentage, a.pinned_memory_limit) == (p.thread_percentage, p.pinned_memory_limit), n
    servers_local = sum(1 for a in local_cmds.values() if a.cmd == "server")
    assert servers_local == s.total_servers
    assert int(pods["client"].servers) == s.total_servers


def test_a_server_given_only_its_port_tries_ports_from_there() -> None:
    """`server --port P` alone tries as many ports from P as the defaults do from 9091 (the end
    once stayed 9199 wherever P was: an empty range and a traceback above it); a range that is
    empty is a one-line usage error."""
    assert server_ports(*_ports("server")) == (9091, 9199)
    assert server_ports(*_ports("server", "--port", "9400")) == (9400, 9400 + SERVER_PORTS)
    assert server_ports(*_ports("server", "--port", "9400", "--port-end", "9401")) == (9400, 9401)
    assert server_ports(*_ports("server", "--port", "65500")) == (65500, 65536)
    with pytest.raises(TunerError, match=r"^--port 9400 --port-end 9300: the ports to try, \[port, port-end\), "
                                         "must be a non-empty range within 1..65535$"):
        server_ports(*_ports("server", "--port", "9400", "--port-end", "9300"))


def _ports(*args: str) -> tuple[int, int | None]:
    a = _parse(list(args))
    return a.port, a.port_end


def test_every_tuner_subcommand_has_a_body() -> None:
    import argparse

    from sharetune_tuner import cli

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(cli._COMMANDS)


@pytest.mark.parametrize("argv", [
    ["fetch", "tj/resnet", "-n", "team-a", "-o", "DIR"],
    ["fetch", "s3://bucket/runs/ns1/job/result", "--out", "out"],
    ["compile", "runs/job", "-o", "out", "--model", "model.onnx"],
    ["compile", "configmap://ns1/job", "-o", "out", "--namespace", "ns1"],
])
def test_sharetune_result_runs_the_tuners_result_with_the_same_arguments(argv: list[str]) -> None:
    """`sharetune result` parses its arguments itself (its help and usage errors are its own), then
    hands the tuner's `result` the command line that parses to the same values."""
    import argparse

    from sharetune import result_cli

    p = argparse.ArgumentParser(prog="sharetune")
    result_cli.add_parser(p.add_subparsers(dest="cmd"))
    ours = vars(p.parse_args(["result", *argv]))
    theirs = vars(_parse(result_cli.tuner_args(argparse.Namespace(**ours))))
    assert theirs.pop("cmd") == ours.pop("cmd") == "result"
    ours.pop("func")
    assert theirs == ours
