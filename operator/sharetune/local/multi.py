"""`sharetune run A.yaml B.yaml ... --local`: several jobs at once through one local GPU pool
(pool.py), one progress row per job, one summary table at the end."""

from __future__ import annotations

import json
import signal
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sharetune.gpus import gpu_count
from sharetune.procs import stop_untracked_children

from .interrupts import interrupted, raise_stopped
from .pool import LocalJob, LocalPool, host_clients, note_co_tenants, pooled, start


def load(paths: list[Path], root: Path) -> list[LocalJob]:
    """The jobs, checked up front: a bad spec or two jobs of one name stop the run before anything starts."""
    from sharetune.api.spec import SpecError, load_job

    jobs: list[LocalJob] = []
    for i, path in enumerate(paths):
        try:
            spec = load_job(path)
        except (SpecError, OSError) as e:
            raise SystemExit(f"{path}: {e}") from None
        if any(j.spec.name == spec.name for j in jobs):
            raise SystemExit(f"{path}: metadata.name {spec.name!r} is used by another job of this run: "
                             f"names must differ (each job's folder is {root}/<name>)")
        jobs.append(LocalJob(path, spec, i, root / spec.name))
    return jobs


def job_summary(job: LocalJob) -> dict[str, Any]:
    s = asdict(job.summary) if job.summary else {}
    wall = (job.finished or time.time()) - (job.started or time.time())
    s.update(job=job.spec.name, state=job.state, error=job.error, wall_s=round(wall, 1),
             gpu=None if job.placement is None else [f"{d.node}/{d.index}" for d in job.placement.devices],
             share=None if job.placement is None else job.placement.share,
             co_tenants={k: round(v[1] - v[0], 1) for k, v in job.co_tenants.items()})
    if job.summary and wall > 0:
        s["trials_per_s"] = round(job.summary.records / wall, 3)
    return s


def _columns() -> list[Any]:
    return [TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
            TimeElapsedColumn()]


def run_many(paths: list[Path], workdir: Path | None, json_out: Path | None, console: Console) -> int:
    root = (workdir or Path("runs")).resolve()
    try:
        jobs = load(paths, root)
    except SystemExit as e:
        console.print(f"[red]error:[/red] {escape(str(e))}", soft_wrap=True)  # one line, even in a pipe
        return 2
    gpus = gpu_count() if any(pooled(j.spec) for j in jobs) else 0  # what the local ledger shares
    pool = LocalPool(root / ".pool", gpus)
    signal.signal(signal.SIGTERM, raise_stopped)
    console.print(f"{len(jobs)} jobs" + (f", {gpus} GPU(s) shared through one MPS daemon each" if gpus else "")
                  + f"  (folders: {root}/<job>)")
    t0 = time.time()
    try:
        with Progress(*_columns(), console=console, transient=False) as bar:
            rows = {j.spec.name: bar.add_task(f"[bold]{j.spec.name}", total=None, info="queued") for j in jobs}
            # CPU jobs, and cuda jobs on a machine without a GPU, have no share to wait for
            free = [j for j in jobs if not pooled(j.spec) or not gpus]
            clients = host_clients(jobs, free)
            for j in free:
                start(j, pool, clients)
            said: dict[str, str] = {}
            while any(j.state in ("queued", "running") for j in jobs):
                waiting = [j for j in jobs if j.state == "queued"]
                if waiting:
                    admitted, never = pool.admit(waiting)
                    clients = host_clients(jobs, admitted)
                    for j in admitted:
                        start(j, pool, clients)
                    for j in waiting:
                        if j.spec.name in never:
                            j.state, j.error = "failed", f"cannot run on this machine: {never[j.spec.name]}"
                note_co_tenants(jobs, time.time())
                for j in jobs:
                    _show(bar, rows[j.spec.name], j, [q for q in jobs if q.state == "queued"])
                    _say(bar, j, said)
                time.sleep(0.5)
            for j in jobs:
                _show(bar, rows[j.spec.name], j, [])
                _say(bar, j, said)
    except KeyboardInterrupt as e:
        why, code = interrupted(e)
        console.print("[red]interrupted:[/red] " + escape(f"{why}; stopping the runs (their records stay in "
                                                          f"{root}/<job>: the same command resumes)"), soft_wrap=True)
        for j in jobs:
            if j.run is not None:
                j.run.stop_all()
        return code
    finally:
        for j in jobs:
            if j.thread is not None:
                j.thread.join(timeout=60)
        pool.stop()
        stop_untracked_children(set())  # every run has stopped: any child left started unrecorded
    summaries = [job_summary(j) for j in jobs]
    _print(console, summaries, time.time() - t0)
    if json_out:
        json_out.write_text(json.dumps({"jobs": summaries, "wall_s": round(time.time() - t0, 1)}, indent=2))
    return 0 if all(j.state == "done" for j in jobs) else 1


def _say(bar: Progress, job: LocalJob, said: dict[str, str]) -> None:
    """One line per state change (queued, started, done, failed): readable without a terminal."""
    if said.get(job.spec.name) != job.state:
        said[job.spec.name] = job.state
        bar.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {escape(_transition(job))}")


def _transition(job: LocalJob) -> str:
    where = "" if job.placement is None else \
        f" on GPU {','.join(str(d.index) for d in job.placement.devices)} @{job.placement.share}%"
    if job.state == "queued":
        return f"{job.spec.name}: waiting for a GPU share of {job.spec.sharing.share}%"
    if job.state == "running":
        return f"{job.spec.name}: started{where}"
    took = (job.finished or time.time()) - (job.started or time.time())
    return (f"{job.spec.name}: {job.state} after {took:.0f}s"
            + (f": {job.error.splitlines()[0][:200]}" if job.error else ""))


def _show(bar: Progress, row: Any, job: LocalJob, queued: list[LocalJob]) -> None:
    if job.state == "queued":
        pos = [q.spec.name for q in sorted(queued, key=lambda q: q.order)].index(job.spec.name) + 1
        bar.update(row, info=f"waiting for a GPU share of {job.spec.sharing.share}% (#{pos} in the queue)")
        return
    shards = job.run.progress() if job.run is not None else []
    done, budget = sum(s.get("done", 0) for s in shards), sum(s.get("budget", 0) for s in shards)
    where = "" if job.placement is None else \
        f" on GPU {','.join(str(d.index) for d in job.placement.devices)} @{job.placement.share}%"
    info = {"running": f"tuning{where}", "done": "[green]done[/green]",
            "failed": f"[red]failed[/red]: {escape((job.error or '').splitlines()[0][:80]) if job.error else ''}"}
    bar.update(row, completed=done, total=budget or None, info=info.get(job.state, job.state))


def _print(console: Console, summaries: list[dict[str, Any]], wall_s: float) -> None:
    t = Table(title=f"{len(summaries)} jobs in {wall_s:.0f}s")
    for col in ("job", "state", "GPU", "trials", "trials/s", "speed-up", "shared with"):
        t.add_column(col, justify="left" if col in ("job", "state", "GPU", "shared with") else "right")
    for s in summaries:
        gpu = "-" if not s.get("gpu") else f"{', '.join(s['gpu'])} @{s['share']}%"
        with_ = ", ".join(f"{k} ({v:.0f}s)" for k, v in s["co_tenants"].items()) or "-"
        t.add_row(s["job"], s["state"] if s["state"] == "done" else f"[red]{s['state']}[/red]", gpu,
                  str(s.get("records", "-")), str(s.get("trials_per_s", "-")),
                  f"{s['speedup']:.2f}x" if s.get("speedup") else "-", with_)
    console.print(t)
    for s in summaries:
        if s.get("error"):
            console.print(f"[red]{s['job']}[/red]: {escape(s['error'])}")
