"""An RPC runner that keeps one RPC session per runner worker instead of one per candidate.

Stock ``RPCRunner`` opens a fresh session for every candidate: a tracker round trip, a process
forked by the server for the session, a CUDA context created in it, the artifact linked on the
server's CPU (``.tar`` -> ``g++ -shared``), then torn down again. On the H200 machine that set-up
cost, not the kernel, dominated a trial (bench/results/h200-profile.json). Here each runner
worker (a process of the runner's pool) opens one session when it first needs it and measures
every later candidate in it; artifacts are shared libraries already linked by the builder
(``builder.export_shared``), uploaded under a unique name (a reused name would make the server's
``dlopen`` hand back the previous candidate's library). A failing candidate (bad kernel, CUDA
error that may poison the context) drops the session, and the next candidate opens a new one.

A worker holds its server for as long as the client runs, so the clients sharing a tracker must
not ask for more sessions than there are servers: local mode gives each client ``N // M``
workers (and uses the stock per-candidate sessions when there are fewer servers than clients).
"""

from __future__ import annotations

import functools
import itertools
import os
from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, RPCConfig, RunnerInput
from tvm.s_tir.meta_schedule.runner.utils import run_evaluator_common
from tvm.support.popen_pool import PopenPoolExecutor

from ..tvm_private import RPCRunnerClass, RPCRunnerFuture
from . import window as measure_window

# Per runner-worker process state (each pool worker is its own process).
_SESSION: dict[str, Any] = {"sess": None, "dev": None, "args": {}, "opened": 0, "window": None}
_COUNTER = itertools.count()


def _drop_session() -> None:
    _SESSION["args"] = {}
    _SESSION["dev"] = None
    _SESSION["window"] = None
    _SESSION["sess"] = None  # the last reference: the connection closes, the server ends the session


def _session(rpc_config: RPCConfig, device_type: str) -> tuple[Any, Any]:
    if _SESSION["sess"] is None:
        from tvm import rpc

        tracker = rpc.connect_tracker(rpc_config.tracker_host, rpc_config.tracker_port)
        # session_timeout=0: the server keeps the session as long as we hold it; each
        # candidate still has its own timeout through the runner future.
        sess = tracker.request(rpc_config.tracker_key, priority=rpc_config.session_priority,
                               session_timeout=0)
        _SESSION["sess"], _SESSION["dev"] = sess, sess.device(device_type, 0)
        _SESSION["window"] = measure_window.remote_functions(sess)  # the GPU's windows (pools)
        _SESSION["opened"] += 1
    return _SESSION["sess"], _SESSION["dev"]


def _args(sess: Any, dev: Any, args_info: tuple[Any, ...], alloc_repeat: int) -> list[Any]:
    """Inputs are random-filled once per argument signature and reused (a task's candidates
    all share one signature); kernels only read inputs and overwrite outputs."""
    key = (repr(args_info), alloc_repeat)
    cached = _SESSION["args"].get(key)
    if cached is None:
        from tvm.s_tir.meta_schedule.runner.utils import alloc_argument_common
        from tvm.s_tir.meta_schedule.utils import get_global_func_on_rpc_session

        fill = get_global_func_on_rpc_session(sess, "tvm.contrib.random.random_fill_for_measure", "")
        _SESSION["args"] = {}  # one signature at a time: free the previous task's buffers
        cached = alloc_argument_common(fill, dev, list(args_info), alloc_repeat)
        _SESSION["args"][key] = cached
    return cached


def _measure(rpc_config: RPCConfig, evaluator_config: EvaluatorConfig, alloc_repeat: int,
             artifact_path: str, device_type: str, args_info: tuple[Any, ...]) -> list[float]:
    sess, dev = _session(rpc_config, device_type)
    remote = f"st{os.getpid()}_{next(_COUNTER)}_{os.path.basename(artifact_path)}"
    try:
        sess.upload(artifact_path, remote)
        mod = sess.load_module(remote)
        args = _args(sess, dev, args_info, alloc_repeat)
        costs = measure_window.run_in_window(
            _SESSION["window"], functools.partial(run_evaluator_common, mod, dev, evaluator_config, args))
        del mod
        sess.remove(remote)
        return costs
    except BaseException:
        _drop_session()
        raise


@derived_object
class SessionRPCRunner(RPCRunnerClass):
    """``RPCRunner`` with one long-lived session per worker (see the module docstring)."""

    def __init__(self, rpc_config: RPCConfig, evaluator_config: EvaluatorConfig, max_workers: int,
                 candidate_timeout_sec: float = 60.0) -> None:
        super().__init__(rpc_config=rpc_config, evaluator_config=evaluator_config, max_workers=max_workers)
        self.candidate_timeout_sec = candidate_timeout_sec
        # Sessions never time out on the server, so a hung candidate is bounded here: the pool
        # kills the worker (and with it the session) after the timeout.
        self.pool.shutdown()  # type: ignore[has-type]  # set by RPCRunner's __init__ (TVM, untyped)
        self.pool = PopenPoolExecutor(max_workers=max_workers, timeout=candidate_timeout_sec)

    def run(self, runner_inputs: list[RunnerInput]) -> list[Any]:
        return [RPCRunnerFuture(
            future=self.pool.submit(_measure, self.rpc_config, self.evaluator_config, self.alloc_repeat,
                                    str(r.artifact_path), str(r.device_type),
                                    tuple(a.as_json() for a in r.args_info)),
            timeout_sec=self.candidate_timeout_sec) for r in runner_inputs]
