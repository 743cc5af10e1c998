"""Deterministic, balanced partition of tuning tasks over client shards, and per-task budgets.

Every client extracts the same tasks from the same model and calls :func:`partition` itself, so
the shards agree without talking to each other. Pure Python: no TVM needed to test it.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass


@dataclass(frozen=True)
class TaskInfo:
    name: str
    workload_hash: str  # structural hash of the task's TIR: stable across processes
    flops: float  # of one call
    weight: int  # how many times the model calls it

    @property
    def cost(self) -> float:
        # Tuning effort follows the work the task does in the model; tiny tasks still cost a trial.
        return max(self.flops, 1.0) * self.weight

    @property
    def key(self) -> str:
        return f"{self.workload_hash}:{self.name}"


def order(tasks: list[TaskInfo]) -> list[TaskInfo]:
    """Canonical order: heaviest first, ties broken by content, never by extraction order."""
    return sorted(tasks, key=lambda t: (-t.cost, t.key))


def partition(tasks: list[TaskInfo], shards: int) -> list[list[TaskInfo]]:
    """Greedy longest-processing-time assignment: each task, heaviest first, goes to the shard
    with the least cost so far (ties: lowest index). Within 4/3 of optimal makespan."""
    if shards < 1:
        raise ValueError("shards must be >= 1")
    bins: list[list[TaskInfo]] = [[] for _ in range(shards)]
    heap = [(0.0, i) for i in range(shards)]
    for t in order(tasks):
        load, i = heapq.heappop(heap)
        bins[i].append(t)
        heapq.heappush(heap, (load + t.cost, i))
    return bins


def shard_of(tasks: list[TaskInfo], shards: int, index: int) -> list[TaskInfo]:
    if not 0 <= index < shards:
        raise ValueError(f"shard index {index} is outside [0, {shards})")
    return partition(tasks, shards)[index]


def budgets(tasks: list[TaskInfo], total: int, per_task: int) -> dict[str, int]:
    """Trials per task (by ``TaskInfo.key``): the job's ``total`` split in proportion to cost,
    at least one trial each where the total allows, capped at ``per_task``. Deterministic, so a
    restarted client knows exactly how many trials each of its tasks still owes."""
    ordered = order(tasks)
    if not ordered:
        return {}
    out = {t.key: 0 for t in ordered}
    remaining = total
    # Everyone gets one trial first (heaviest first if the total is smaller than the task count).
    for t in ordered:
        if remaining == 0:
            break
        out[t.key] = 1
        remaining -= 1
    # Then water-fill the rest in proportion to cost, respecting the cap.
    while remaining > 0:
        open_tasks = [t for t in ordered if out[t.key] < per_task]
        if not open_tasks:
            break
        weight = sum(t.cost for t in open_tasks)
        given = 0
        for t in open_tasks:
            share = int(remaining * t.cost / weight)
            add = min(share, per_task - out[t.key])
            out[t.key] += add
            given += add
        if given == 0:  # shares all rounded to zero: hand out single trials, heaviest first
            for t in open_tasks:
                if remaining - given == 0:
                    break
                out[t.key] += 1
                given += 1
        remaining -= given
    return out
