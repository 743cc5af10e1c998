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


def extract(mod: Any, target: Any) -> list[Task]:
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.analysis import estimate_tir_flops

    out = []
    for t in ms.relax_integration.extract_tasks(mod, target):
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
