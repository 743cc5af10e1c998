"""Task extraction: a model's tunable TIR workloads, with the facts the partitioner needs."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from ..errors import ModelError
from ..search.partition import TaskInfo
from .loader import PASS_ATTR, model_errors


@dataclass
class Task:
    info: TaskInfo
    extracted: Any  # tvm.s_tir.meta_schedule.ExtractedTask

    @property
    def workload(self) -> Any:
        return self.extracted.dispatched[0]


def fuse_like_compile_relax(mod: Any, target: Any) -> Any:
    """The exact fusion ``compile_relax`` applies before it looks records up, so the tasks we
    tune have the structural hashes the compiler will ask the database for."""
    import tvm
    from tvm import relax
    from tvm.relax import pipeline as rp

    try:
        dispatch = list(rp.library_dispatch_passes(target))
    except (ValueError, AttributeError):
        dispatch = []
    seq = [*dispatch, relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
           relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR()]
    running = _running_passes_class()()
    try:
        with target, tvm.transform.PassContext(opt_level=3, instruments=[running]):
            return tvm.transform.Sequential(seq)(mod)
    except Exception as e:  # tell model_errors which pass it escaped from
        if running.innermost():
            setattr(e, PASS_ATTR, running.innermost())
        raise


@functools.cache
def _running_passes_class() -> Any:
    """A pass instrument class (made on first use: tvm is imported lazily)."""
    import tvm

    @tvm.instrument.pass_instrument
    class RunningPasses:
        """The passes entered and not yet left: after a failure, the one that failed."""

        def __init__(self) -> None:
            self.stack: list[str] = []

        def run_before_pass(self, mod: Any, info: Any) -> None:
            self.stack.append(str(info.name))

        def run_after_pass(self, mod: Any, info: Any) -> None:
            if self.stack:
                self.stack.pop()

        def innermost(self) -> str | None:
            names = [n for n in self.stack if n.lower() != "sequential"]
            return names[-1] if names else None

    return RunningPasses


def extract(mod: Any, target: Any) -> list[Task]:
    """Tasks of an unfused model module (``LoadedModel.mod``). A model TVM cannot lower (a pass
    or an operator's legalisation fails) raises :class:`ModelError` naming the pass or operator:
    the same failure every time, not a fault to retry."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.analysis import estimate_tir_flops

    with model_errors("cannot extract tuning tasks"):
        extracted = list(ms.relax_integration.extract_tasks(fuse_like_compile_relax(mod, target), target))
    if not extracted:
        raise ModelError("the model has no tunable tasks (no operator TVM lowers to a kernel)")
    out = []
    for t in extracted:
        wl = t.dispatched[0]
        try:
            flops = float(estimate_tir_flops(wl))
        except Exception:  # some data-movement kernels have no FLOP estimate
            flops = 0.0
        # The same hash JSONDatabase writes for the workload: links records back to tasks.
        info = TaskInfo(name=str(t.task_name), workload_hash=str(tvm_ffi.structural_hash(wl)),
                        flops=flops, weight=int(t.weight))
        out.append(Task(info, t))
    return out
