"""Each TVM private name sharetune builds on (sharetune_tuner/tvm_private.py) still exists and
behaves as our builders and runner use it: a TVM upgrade that moves or changes one fails here."""

from __future__ import annotations

import concurrent.futures
import inspect
from pathlib import Path

import numpy as np
import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms

from sharetune_tuner.tvm_private import (
    RPCRunnerClass,
    RPCRunnerFuture,
    build_candidate,
    held_training,
    serialize_params,
)

from .test_records import TARGET, workload


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


def _matmul_records(n: int, splits: list[int]) -> tuple[ms.TuneContext, list[ms.MeasureCandidate], list]:
    mod = workload(n)
    cands, results = [], []
    for k, f in enumerate(splits):
        sch = tvm.s_tir.Schedule(mod)
        i, _, _ = sch.get_loops(sch.get_sblock("C"))
        sch.split(i, factors=[None, f])
        cands.append(ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_prim_func(mod["main"])))
        results.append(ms.runner.RunnerResult(run_secs=[1e-6 * (k + 1)], error_msg=None))
    return ms.TuneContext(mod=mod, target=TARGET, task_name=f"mm{n}"), cands, results


def test_held_training_trains_once_on_every_group_and_stock_retrains_per_group() -> None:
    groups = [_matmul_records(n, [1, 2, 4, 8]) for n in (16, 32, 64)]
    trainings: dict[str, int] = {}
    for arm in ("stock", "held"):
        model = ms.CostModel.create("xgb", num_tuning_cores=1)
        train = model._train

        def counted(*args, arm=arm, train=train, **kwargs):  # a spy on XGBModel's private retrain
            trainings[arm] = trainings.get(arm, 0) + 1
            return train(*args, **kwargs)

        model._train = counted
        if arm == "stock":
            for g in groups:
                model.update(*g)
        else:
            with held_training(model) as release:
                for k, g in enumerate(groups):
                    if k == len(groups) - 1:
                        release()
                    model.update(*g)
        assert model.data_size == 12 and model.booster is not None
        assert model.last_train_size == 12 and model.adaptive_training
    # stock: 4, 8 (>= 4 + 4/5), 12 (>= 8 + 8/5) records: three trainings; held: one
    assert trainings == {"stock": 3, "held": 1}
