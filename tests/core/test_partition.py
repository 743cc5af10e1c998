"""Partition and budgets: deterministic whatever the extraction order, balanced, within caps."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sharetune_tuner.partition import TaskInfo, budgets, order, partition, shard_of


def tasks_from(costs: list[tuple[float, int]]) -> list[TaskInfo]:
    return [TaskInfo(f"t{i}", f"{i * 7919:020d}", flops, w) for i, (flops, w) in enumerate(costs)]


task_lists = st.lists(st.tuples(st.floats(0, 1e10, allow_nan=False), st.integers(1, 8)), min_size=1, max_size=40)


@given(task_lists, st.integers(1, 12), st.randoms())
@settings(max_examples=200, deadline=None)
def test_partition_is_deterministic_and_complete(costs, shards, rnd) -> None:  # type: ignore[no-untyped-def]
    tasks = tasks_from(costs)
    shuffled = tasks[:]
    rnd.shuffle(shuffled)
    a, b = partition(tasks, shards), partition(shuffled, shards)
    assert a == b  # every client computes the same shards from its own extraction
    flat = [t.key for shard in a for t in shard]
    assert sorted(flat) == sorted(t.key for t in tasks) and len(set(flat)) == len(flat)
    assert [t for i in range(shards) for t in shard_of(tasks, shards, i)] == [t for s in a for t in s]


@given(task_lists, st.integers(1, 12))
@settings(max_examples=200, deadline=None)
def test_partition_is_balanced_within_list_scheduling_bound(costs, shards) -> None:  # type: ignore[no-untyped-def]
    tasks = tasks_from(costs)
    loads = [sum(t.cost for t in s) for s in partition(tasks, shards)]
    total, biggest = sum(t.cost for t in tasks), max(t.cost for t in tasks)
    # The heaviest shard's last task went to the then-lightest shard: load <= average + that task.
    assert max(loads) <= (total / shards + biggest * (shards - 1) / shards) * (1 + 1e-9)


@given(st.lists(st.tuples(st.integers(1, 10**6), st.integers(1, 3)), min_size=1, max_size=7), st.integers(2, 3))
@settings(max_examples=150, deadline=None)
def test_partition_is_within_four_thirds_of_optimal(costs, shards) -> None:  # type: ignore[no-untyped-def]
    import itertools

    tasks = tasks_from([(float(f), w) for f, w in costs])
    loads = [sum(t.cost for t in s) for s in partition(tasks, shards)]
    best = min(max(sum(t.cost for t, b in zip(tasks, assign) if b == i) for i in range(shards))
               for assign in itertools.product(range(shards), repeat=len(tasks)))  # brute-force optimum
    assert max(loads) <= 4 / 3 * best * (1 + 1e-9)


def test_resnet_like_costs_balance_well() -> None:
    rng = random.Random(0)
    tasks = tasks_from([(rng.uniform(1e7, 3e8), rng.randint(1, 3)) for _ in range(22)])
    loads = [sum(t.cost for t in s) for s in partition(tasks, 4)]
    assert max(loads) / min(loads) < 1.3


@given(task_lists, st.integers(1, 5000), st.integers(1, 200))
@settings(max_examples=300, deadline=None)
def test_budgets_respect_total_and_cap(costs, total, cap) -> None:  # type: ignore[no-untyped-def]
    tasks = tasks_from(costs)
    b = budgets(tasks, total, cap)
    assert set(b) == {t.key for t in tasks}
    assert all(0 <= v <= cap for v in b.values())
    assert sum(b.values()) == min(total, cap * len(tasks))
    if total >= len(tasks):
        assert all(v >= 1 for v in b.values())  # no task is left untuned when the total allows


def test_budgets_follow_cost() -> None:
    tasks = tasks_from([(1e9, 1), (1e6, 1), (0.0, 1)])
    b = budgets(tasks, 60, 100)
    heavy, light, empty = (b[t.key] for t in tasks)
    assert heavy > light >= empty >= 1 and sum(b.values()) == 60


def test_order_and_shard_index_errors() -> None:
    tasks = tasks_from([(5, 1), (5, 1)])
    assert [t.name for t in order(tasks)] == ["t0", "t1"]  # equal cost: by content, stable
    with pytest.raises(ValueError):
        shard_of(tasks, 2, 2)
    with pytest.raises(ValueError):
        partition(tasks, 0)
