"""TVM's private names that sharetune builds on, in one place, each pinned by
``tests/tuner/test_tvm_private.py`` (its module, signature and behaviour): a TVM upgrade that
moves or changes one fails there, not in a tuning run.

- ``build_candidate``: ``local_builder._worker_func(f_build, f_export, mod, target, params)``,
  the body of one LocalBuilder build; our builder pools call it in their own long-lived workers
  (builder.PooledBuilder, the build service) instead of a fresh pool per batch.
- ``serialize_params``: ``local_builder._serialize_params``, how LocalBuilder ships a
  candidate's params to its workers; the same bytes go to ours, local or remote.
- ``RPCRunnerClass``: ``RPCRunner._cls``, the Python class behind the runner TVM registers
  (``derived_object``); our session runner subclasses it and is registered the same way.
- ``RPCRunnerFuture``: RPCRunner's future of one measurement (a ``concurrent.futures.Future``
  and a timeout), returned by our session runner so MetaSchedule's task scheduler polls it as it
  polls stock's.
- ``held_training``: XGBModel's ``adaptive_training`` and ``last_train_size``, the threshold its
  ``update`` retrains at (data grown by a fifth since the last training). Learning records measured
  elsewhere (warm_start.learn) hands ``update`` one workload at a time; held, the model trains once,
  on all of them, at the last.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tvm.s_tir.meta_schedule.builder.local_builder import _serialize_params as serialize_params
from tvm.s_tir.meta_schedule.builder.local_builder import _worker_func as build_candidate
from tvm.s_tir.meta_schedule.runner import RPCRunner
from tvm.s_tir.meta_schedule.runner.rpc_runner import RPCRunnerFuture

RPCRunnerClass: type = RPCRunner._cls  # type: ignore[attr-defined]  # set by derived_object (TVM, untyped)

# No update reaches a threshold this large (last_train_size / 5 more records than it).
_NEVER = 1 << 60


@contextmanager
def held_training(cost_model: Any) -> Iterator[Any]:
    """While held, ``cost_model.update`` adds records without retraining; the context yields a
    ``release()`` to call before the last update, which then trains (or not) exactly as stock would
    on all the records added since the last training. A model without the threshold (the random
    model) is left as it is."""
    if not hasattr(cost_model, "last_train_size") or not hasattr(cost_model, "adaptive_training"):
        yield lambda: None
        return
    before = (cost_model.adaptive_training, cost_model.last_train_size)
    released = False

    def release() -> None:
        nonlocal released
        if not released:
            cost_model.adaptive_training, cost_model.last_train_size = before
            released = True

    cost_model.adaptive_training, cost_model.last_train_size = True, _NEVER
    try:
        yield release
    finally:
        release()


__all__ = ["RPCRunnerClass", "RPCRunnerFuture", "build_candidate", "held_training", "serialize_params"]
