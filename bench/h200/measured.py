"""Counts the candidates stock MetaSchedule measures, as they are measured (real-budget baselines).

Stock MetaSchedule commits a batch's records only when its task scheduler joins the batch, and
the gradient scheduler (its default) joins none until it has sent every task one batch: for
ResNet-50's 34 tasks on the H200 (a search of population 512 plus a build of 64, ~40 s a task)
that is ~20 minutes, so a 9-minute window can end with candidates measured and no record. Their
count is the stock arm's trials; ``counted_run_evaluator`` is RPCRunner's stock evaluator plus
one line (the time) per candidate in ``$BENCH_MEASURED_LOG``. Instrumentation only: it measures
exactly as stock does, and the append costs ~0.1 ms next to a ~0.7 s measurement.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

ENV = "BENCH_MEASURED_LOG"


def counted_run_evaluator(session: Any, rt_mod: Any, device: Any, evaluator_config: Any,
                          repeated_args: Any) -> list[float]:
    """``f_run_evaluator`` of RPCRunner (it runs in the runner's worker processes)."""
    from tvm.s_tir.meta_schedule.runner.rpc_runner import default_run_evaluator

    costs = default_run_evaluator(session, rt_mod, device, evaluator_config, repeated_args)
    path = os.environ.get(ENV)
    if path:
        # O_APPEND: lines from several runner workers never interleave
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{time.time():.3f}\n".encode())
        finally:
            os.close(fd)
    return costs


def read_times(path: Path) -> list[float]:
    """The times (time.time()) of the candidates measured, in order."""
    if not path.exists():
        return []
    return sorted(float(x) for x in path.read_text().split())
