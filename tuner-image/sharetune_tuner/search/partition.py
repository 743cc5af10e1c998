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


def to_tune(tasks: list[TaskInfo], budget: dict[str, int]) -> list[TaskInfo]:
    """The tasks the budgets give trials. Only these are partitioned: a task left at TVM's default
    needs no client. They are the heaviest (``budgets``), so LPT places them exactly where it did
    when every task was partitioned: the lighter ones only ever came after them."""
    return [t for t in tasks if budget.get(t.key, 0) > 0]


def useful_shards(bins: list[list[TaskInfo]]) -> int:
    """How many shards have a task: with LPT these are exactly shards 0..n-1 (an empty shard's
    load, 0, is never above another's, and ties go to the lowest index), so a clients' Indexed Job
    scaled down to n (an elastic Indexed Job drops the highest indexes) keeps every task. At least
    1: a model with nothing to tune still has one client, whose empty shard the merge reads."""
    return max(1, sum(1 for b in bins if b))


def _fill(tasks: list[TaskInfo], total: int, per_task: int) -> dict[str, int]:
    """``total`` split over ``tasks`` (heaviest first) in proportion to cost, capped at
    ``per_task``; what the caps refuse stays unspent."""
    out = {t.key: 0 for t in tasks}
    remaining = total
    while remaining > 0:
        open_tasks = [t for t in tasks if out[t.key] < per_task]
        if not open_tasks:
            break
        weight = sum(t.cost for t in open_tasks)
        given = 0
        for t in open_tasks:
            add = min(int(remaining * t.cost / weight), per_task - out[t.key])
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


def budgets(tasks: list[TaskInfo], total: int, per_task: int, minimum: int = 1) -> dict[str, int]:
    """Trials per task (by ``TaskInfo.key``). Deterministic, so every client computes the same
    budgets and a restarted client knows exactly how many trials each of its tasks still owes.

    Trials go where the latency is: the ``total`` is split in proportion to cost (FLOPs x calls)
    over the k heaviest tasks, k the largest number for which every one of them gets at least
    ``minimum`` (``useful_minimum``); the lighter tasks get nothing and are left at TVM's default
    schedules, instead of 1-5 trials each that would rarely beat them. When ``per_task`` caps
    every chosen task, the rest goes the same way to the next-heaviest tasks; a last remainder
    smaller than ``minimum`` goes to the heaviest task still untuned. So the total is spent
    whenever the caps allow (sum = min(total, per_task x tasks)), budgets never increase from a
    heavier task to a lighter one, and at most one task gets fewer than ``minimum`` trials."""
    rest = order(tasks)
    out = {t.key: 0 for t in rest}
    floor = max(1, min(minimum, per_task))
    remaining = min(total, per_task * len(rest))
    while remaining > 0 and rest:
        if remaining < floor:
            out[rest[0].key] = remaining
            break
        k = min(len(rest), remaining // floor)
        alloc = _fill(rest[:k], remaining, per_task)
        while k > 1 and min(alloc.values()) < floor:
            k -= 1
            alloc = _fill(rest[:k], remaining, per_task)
        out.update(alloc)
        remaining -= sum(alloc.values())
        rest = rest[k:]
    return out


def left_at_default(budget: dict[str, int]) -> list[str]:
    """Keys of the tasks the budgets give no trial (they keep TVM's default schedules)."""
    return [k for k, v in budget.items() if v == 0]
