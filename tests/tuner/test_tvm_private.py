"""Each TVM private name sharetune builds on (sharetune_tuner/tvm_private.py) still exists and
behaves as our builders and runner use it: a TVM upgrade that moves or changes one fails here."""

from __future__ import annotations

import concurrent.futures
import inspect
from pathlib import Path

import numpy as np
import tvm
from tvm import te

from sharetune_tuner.tvm_private import RPCRunnerClass, RPCRunnerFuture, build_candidate, serialize_params


def _add_one() -> tvm.IRModule:
    a = te.placeholder((8,), "float32", name="a")
    b = te.compute((8,), lambda i: a[i] + 1.0, name="b")
    return tvm.IRModule({"main": te.create_prim_func([a, b])})


def test_build_candidate_builds_and_exports_one_module(tmp_path: Path) -> None:
    names = list(inspect.signature(build_candidate).parameters)
    assert names == ["_f_build", "_f_export", "mod", "target", "params"]
    out = tmp_path / "cand.so"
    path = build_candidate(None, lambda m: (m.export_library(str(out)), str(out))[1], _add_one(),
                           tvm.target.Target("llvm"), None)
    assert path == str(out) and out.stat().st_size > 0
    f = tvm.runtime.load_module(path)["main"]
    a = tvm.runtime.tensor(np.arange(8, dtype="float32"))
    b = tvm.runtime.tensor(np.zeros(8, dtype="float32"))
    f(a, b)
    assert (b.numpy() == np.arange(8, dtype="float32") + 1).all()


def test_serialize_params_ships_none_as_none_and_tensors_as_bytes() -> None:
    assert serialize_params(None) is None
    packed = serialize_params({"w": tvm.runtime.tensor(np.ones(4, dtype="float32"))})
    assert isinstance(packed, (bytes, bytearray)) and len(packed) > 16


def test_rpc_runner_future_reports_times_and_errors_as_runner_results() -> None:
    done: concurrent.futures.Future[list[float]] = concurrent.futures.Future()
    done.set_result([1e-3, 2e-3])
    fut = RPCRunnerFuture(future=done, timeout_sec=5.0)
    assert fut.done() and [float(x) for x in fut.result().run_secs] == [1e-3, 2e-3]
    failed: concurrent.futures.Future[list[float]] = concurrent.futures.Future()
    failed.set_exception(TimeoutError())
    assert "Timeout" in RPCRunnerFuture(future=failed, timeout_sec=5.0).result().error_msg


def test_the_rpc_runner_class_is_subclassable_with_its_config() -> None:
    names = list(inspect.signature(RPCRunnerClass.__init__).parameters)
    assert names[:4] == ["self", "rpc_config", "evaluator_config", "cooldown_sec"]
    assert hasattr(RPCRunnerClass, "run")
