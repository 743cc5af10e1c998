"""The baseline: stock TVM MetaSchedule as a user runs it, in one process for the whole model.

The model's K heaviest tasks (the same tasks the sharetune run tunes), ``ms.tune_tasks`` with its
defaults: LocalBuilder on all cores (a fresh pool per batch), RPCRunner with one worker through
the tracker to one RPC server on the whole GPU (no MPS), the xgb cost model, the stock
evolutionary search (population 512), the gradient task scheduler, 64 candidates per batch.
Only the budget (K x T trials, at most T per task), the seed and the RPC session timeout (30 s
instead of 10 s, so that no trial is lost to a slow session start) are set.

``real_budget.py`` also runs it over the whole model (``--tasks 0``) with a global budget
(``--total``), and as a knowledgeable user would set it up (``--runner-workers N`` with N servers
under the key, ``--builder-workers`` = cores, ``--scheduler round-robin``); left out, those are
stock. ``--count-measured``: RPCRunner's stock evaluator plus a line per measured candidate in
$BENCH_MEASURED_LOG (measured.py).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work-dir", type=Path, required=True)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--target", default="cuda")
    ap.add_argument("--tasks", type=int, required=True, help="the K heaviest tasks; 0 = all of the model's")
    ap.add_argument("--trials", type=int, required=True, help="per task")
    ap.add_argument("--total", type=int, default=None, help="max_trials_global (default: tasks x trials)")
    ap.add_argument("--runner-workers", type=int, default=None, help="RPCRunner max_workers (default: stock, 1)")
    ap.add_argument("--builder-workers", type=int, default=None, help="LocalBuilder max_workers (default: stock)")
    ap.add_argument("--builder-timeout-s", type=float, default=None,
                    help="LocalBuilder timeout_sec (default: stock, 30)")
    ap.add_argument("--scheduler", choices=("gradient", "round-robin"), default="gradient",
                    help="tune_tasks' task_scheduler (default: stock, gradient)")
    ap.add_argument("--count-measured", action="store_true", help="note each measured candidate (measured.py)")
    ap.add_argument("--tracker", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    t_start = time.time()
    from tvm.s_tir import meta_schedule as ms

    from common import heaviest
    from measured import counted_run_evaluator
    from sharetune_tuner.model.loader import load
    from sharetune_tuner.model.tasks import extract
    from sharetune_tuner.targets import make_target

    model = load(name=a.model)
    target = make_target(a.target)
    tasks = extract(model.mod, target)
    tasks = heaviest(tasks, a.tasks) if a.tasks > 0 else tasks
    t_extracted = time.time()
    task_list = [{"name": t.info.name, "workload_hash": t.info.workload_hash, "flops": t.info.flops,
                  "weight": t.info.weight} for t in tasks]
    # now, not only at the end: a run stopped at the end of its window never writes client.json
    (a.work_dir / "tasks.json").write_text(json.dumps(task_list))
    host, port = a.tracker.rsplit(":", 1)
    (a.work_dir / "db").mkdir(parents=True, exist_ok=True)
    ctxs, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
        [t.extracted for t in tasks], work_dir=str(a.work_dir / "logs"), seed=a.seed)
    runner = ms.runner.RPCRunner(rpc_config=ms.runner.RPCConfig(
        tracker_host=host, tracker_port=int(port), tracker_key=a.key, session_timeout_sec=30),
        **({"max_workers": a.runner_workers} if a.runner_workers else {}),
        **({"f_run_evaluator": counted_run_evaluator} if a.count_measured else {}))
    _log_build_errors(ms.builder.LocalBuilder)
    builder = ms.builder.LocalBuilder(**({"max_workers": a.builder_workers} if a.builder_workers else {}),
                                      **({"timeout_sec": a.builder_timeout_s} if a.builder_timeout_s else {}))
    with ms.Profiler() as prof:
        ms.tune_tasks(tasks=ctxs, task_weights=weights, work_dir=str(a.work_dir / "logs"),
                      max_trials_global=a.total or a.tasks * a.trials, max_trials_per_task=a.trials,
                      builder=builder, runner=runner,
                      database=ms.database.JSONDatabase(work_dir=str(a.work_dir / "db")), cost_model="xgb",
                      task_scheduler=a.scheduler)
        phases = {k: round(float(v), 3) for k, v in prof.get().items()}
    (a.work_dir / "client.json").write_text(json.dumps({
        "started_at": t_start, "extracted_at": t_extracted, "done_at": time.time(), "phases": phases,
        "tasks": task_list}))
    return 0


def _log_build_errors(cls: type) -> None:
    """Each failed build's reason on stderr (the client log): stock logs only their count, and a
    baseline that loses builds to its own timeouts is not a fair one (the count alone cannot tell
    a timeout from a candidate that does not compile). ``cls``: TVM's derived LocalBuilder, whose
    FFI methods call the Python class it wraps (``_cls``) at call time."""
    cls = getattr(cls, "_cls", cls)
    inner = cls.build

    def build(self, inputs):
        results = inner(self, inputs)
        for r in results:
            if r.error_msg:
                lines = [x for x in str(r.error_msg).strip().splitlines() if x.strip()]
                print(f"build error: {lines[0][:160]} | {lines[-1][:240]}", file=sys.stderr, flush=True)
        return results

    cls.build = build


if __name__ == "__main__":
    raise SystemExit(main())
