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
"""

from __future__ import annotations

from tvm.s_tir.meta_schedule.builder.local_builder import _serialize_params as serialize_params
from tvm.s_tir.meta_schedule.builder.local_builder import _worker_func as build_candidate
from tvm.s_tir.meta_schedule.runner import RPCRunner
from tvm.s_tir.meta_schedule.runner.rpc_runner import RPCRunnerFuture

RPCRunnerClass: type = RPCRunner._cls  # type: ignore[attr-defined]  # set by derived_object (TVM, untyped)

__all__ = ["RPCRunnerClass", "RPCRunnerFuture", "build_candidate", "serialize_params"]
