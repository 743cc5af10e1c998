"""`sharetune run JOB.yaml --local` (parsed by sharetune.run_cli): run a TuningJob as local processes,
with live progress."""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sharetune.api.summary import Summary
from sharetune.procs import stop_untracked_children

from .interrupts import interrupted, raise_stopped


def _rate(shards: list[dict[str, Any]], t0: float) -> float:
    fresh = sum(s.get("done", 0) - s.get("resumed", 0) for s in shards)
    return fresh / max(time.time() - t0, 1e-9)


def run(a: argparse.Namespace) -> int:
    from sharetune.api.errors import TunerError
    from sharetune.api.exitcodes import ExitCode
    from sharetune.api.spec import SpecError, load_job

    from .run import LocalRun, RunFailed

    console = Console()
    if len(a.job) > 1:
        from .multi import run_many

        return run_many(a.job, a.workdir, a.json, console)
    a.job = a.job[0]
    try:
        spec = load_job(a.job)
    except (SpecError, OSError) as e:
        console.print(f"[red]error:[/red] {escape(f'{a.job}: {e}')}", soft_wrap=True)  # one line, even in a pipe
        return int(ExitCode.USAGE)
    workdir = a.workdir or Path("runs") / spec.name
    # `timeout`, `kill` and a pod's stop send SIGTERM: stop the run's process groups as Ctrl-C
    # does (each runs in its own session, so nothing else would stop them).
    signal.signal(signal.SIGTERM, raise_stopped)
    lr = LocalRun(spec, a.job.resolve(), workdir.resolve())
    console.print(f"[bold]{spec.name}[/bold]: {spec.model.name or 'onnx model'} on {spec.target}, "
                  f"{spec.shards} clients x {spec.servers.replicas} servers"
                  + (f" x {spec.gpus} GPUs" if spec.gpu_count > 1 else "")
                  + (f" under MPS at {spec.servers.thread_percentage}%" if spec.uses_mps else "")
                  + f", {spec.trials.total} trials  (logs: {workdir}/logs)")
    t0 = time.time()
    try:
        lr.check_target()
        lr.start_services()
        _tune_with_progress_bar(lr, spec.shards, console, t0)
        tune_s = time.time() - t0
        console.print(f"tuning done in {tune_s:.0f}s; merging and measuring ...")
        summary = lr.merge()
    except KeyboardInterrupt as e:
        why, code = interrupted(e)
        console.print("[red]interrupted:[/red] " + escape(f"{why}; stopping the run (its records stay in {workdir}: "
                                                          "the same command resumes)"), soft_wrap=True)
        return code
    except RuntimeError as e:  # a TunerError (model, target) or a process of the run that failed
        console.print(f"[red]failed:[/red] {escape(str(e))}", soft_wrap=True)
        return int(e.exit_code if isinstance(e, (TunerError, RunFailed)) else ExitCode.UNEXPECTED)
    finally:
        lr.stop_all()
        # A child whose start a Ctrl-C cut short inside Popen ran unrecorded: this process is
        # about to exit, and every child it has left is the run's.
        stop_untracked_children(set())
    summary.tuning_s = round(tune_s, 1)
    summary.trials_per_s = round(summary.records / tune_s, 3)
    _print_summary(console, summary, workdir)
    if a.json:
        a.json.write_text(summary.to_json())
    return 0


def _tune_with_progress_bar(lr: Any, shards: int, console: Console, t0: float) -> None:
    """The run's clients to their end, with a bar for all shards (trials/s) and one per shard
    (state, best task, errors)."""
    cols = [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"), TimeElapsedColumn()]
    with Progress(*cols, console=console, transient=False) as bar:
        total = bar.add_task("[bold]all shards", total=None, info="")
        rows = {i: bar.add_task(f"shard {i}", total=None, info="starting") for i in range(shards)}

        def tick(progress: list[dict[str, Any]]) -> None:
            done = sum(s.get("done", 0) for s in progress)
            budget = sum(s.get("budget", 0) for s in progress)
            bar.update(total, completed=done, total=budget or None, info=f"{_rate(progress, t0):.2f} trials/s")
            for s in progress:
                best = [t["best_s"] for t in s.get("tasks", []) if t.get("best_s")]
                info = s.get("state", "")
                if best:
                    info += f", best task {min(best) * 1e6:.1f} us"
                if s.get("errors"):
                    info += f", {s['errors']} errors"
                bar.update(rows[s["shard"]], completed=s.get("done", 0), total=s.get("budget") or None, info=info)
        lr.run_clients(on_tick=tick)


def _print_summary(console: Console, s: Summary, workdir: Path) -> None:
    t = Table(title=f"{s.job}: tasks (best of {s.records} trials, each against TVM's default schedule)")
    for col in ("task", "weight", "MFLOP", "trials", "best us", "default us", "tuned us", "kept"):
        t.add_column(col, justify="right" if col != "task" else "left")

    def us_ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    def us(v: Any) -> str:
        return "-" if v is None else f"{v:.1f}"

    for task in s.tasks:
        kept = {"tuned": "[green]tuned[/green]", "default": "[yellow]default[/yellow]"}.get(
            task.winner, "not tuned" if task.budget == 0 else "no records")
        t.add_row(task.name, str(task.weight), f"{task.flops / 1e6:.1f}", str(task.trials),
                  us(task.best_latency_us), us(task.default_us), us(task.tuned_us), kept)
    console.print(t)
    rate = f"{s.records} trials in {s.tuning_s}s ({s.trials_per_s} trials/s)"
    untuned = us_ms(s.latency_untuned_ms)
    if s.is_improved:
        console.print(f"end-to-end latency: untuned {untuned} ms -> tuned "
                      f"{us_ms(s.latency_tuned_ms)} ms ([bold green]{s.speedup or 0:.2f}x[/bold green]); {rate}")
    else:
        records = s.latency_records_ms
        measured = ("no tuned record beat its task's default" if records is None else
                    f"the tuned records measured {records:.3f} ms ({s.speedup_of_records}x)")
        console.print(f"end-to-end latency: untuned {untuned} ms; {measured}.\n"
                      "[bold yellow]tuning did not beat TVM's defaults at this budget: the result keeps the default "
                      "schedules; try a larger trials.total[/bold yellow]; " + rate)
    left = s.tasks_left_at_default
    if left:
        console.print(f"left at TVM's defaults by the budget ({len(left)} light tasks): {', '.join(left)}")
    won = s.tasks_default_won
    if won:
        console.print(f"TVM's default schedule beat the best tuned record ({len(won)}): {', '.join(won)}")
    by_pct = s.latency_ms_by_serving_pct
    if by_pct:
        console.print("tuned latency by MPS serving share: " + ", ".join(
            f"{k}% {'-' if v is None else f'{v:.3f} ms'}" for k, v in by_pct.items()))
    console.print(f"records: {workdir}/result/records (all), {workdir}/result/best (what the result applies); "
                  f"summary: {workdir}/result/summary.json")
