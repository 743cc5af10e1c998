"""A shard's progress on the wire (sharetune.api.progress): what a client writes is what the
operator and local mode read, across versions; unreadable text is a shard still starting, never an
error in a status tick. What a real client writes round-trips in tests/tuner/test_local_e2e.py."""

from __future__ import annotations

import json

from sharetune.api.progress import VERSION, Progress, TaskProgress
from sharetune.controller.status import ShardView


def full() -> Progress:
    return Progress("tj", 1, 3, state="tuning", budget=96, done=40, resumed=8, errors=1,
                    tasks=[TaskProgress("conv2d", "h1", 64, 30, 2.5e-5), TaskProgress("dense", "h2", 32, 10, None)],
                    message="m", useful_shards=3, tasks_total=8, tasks_to_tune=6, phases={"search": 1.5},
                    co_tenants={"ns/other": 4}, measured_alone=30, measured_beside_others=10, window_wait_s=0.5,
                    unfenced=2, startup={"extract_s": 1.0})


def test_every_field_round_trips_and_the_version_is_written() -> None:
    p = full()
    assert json.loads(p.to_json())["version"] == VERSION
    assert Progress.from_json(p.to_json()) == p
    assert p.best_s == 2.5e-5


def test_an_older_writer_reads_with_defaults_and_a_newer_ones_extra_fields_are_ignored() -> None:
    old = {"job": "tj", "shard": 0, "shards": 2, "state": "tuning", "done": "5", "budget": 16,
           "tasks": [{"name": "t", "workload_hash": "h", "budget": 16, "done": 5}]}
    p = Progress.from_json(json.dumps(old))
    assert p is not None
    assert (p.version, p.done, p.useful_shards, p.co_tenants, p.tasks[0].best_s) == (0, 5, None, {}, None)
    newer = {**json.loads(full().to_json()), "version": VERSION + 1, "gpu_seconds": 12.0}
    q = Progress.from_json(json.dumps(newer))
    assert q is not None and q.version == VERSION + 1 and q.done == 40 and not hasattr(q, "gpu_seconds")


def test_unreadable_text_is_no_progress_and_the_operator_sees_a_starting_shard() -> None:
    for text in (None, "", "{not json", "[1, 2]", '"done"', '{"tasks": 5, "done": "many"}'):
        assert Progress.from_json(text) is None, text
        view = ShardView.from_progress(2, text)
        assert (view.index, view.state, view.done, view.budget) == (2, "starting", 0, 0)
    view = ShardView.from_progress(1, full().to_json())
    assert (view.state, view.done, view.budget, view.best_s, view.resumed, view.tasks_to_tune) == \
        ("tuning", 40, 96, 2.5e-5, 8, 6)
    assert view.co_tenants == {"ns/other": 4} and view.measured_beside_others == 10
