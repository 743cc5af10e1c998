"""Task extraction: a model's tunable TIR workloads, with the facts the partitioner needs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .partition import TaskInfo


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
    with target, tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential(seq)(mod)


def extract(mod: Any, target: Any) -> list[Task]:
    """Tasks of an unfused model module (``LoadedModel.mod``)."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.analysis import estimate_tir_flops

    out = []
    for t in ms.relax_integration.extract_tasks(fuse_like_compile_relax(mod, target), target):
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
