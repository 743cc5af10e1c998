"""A job's result summary on the wire (sharetune.api.summary): what the merge writes is what the
operator, local mode and ``sharetune result`` read, across versions; text that is not a summary
reads as None. What a real merge writes round-trips in tests/tuner/test_never_worse.py."""

from __future__ import annotations

import json
from pathlib import Path

from sharetune.api.summary import VERSION, Summary, TaskSummary


def full() -> Summary:
    return Summary(job="tj", model="resnet18", input_shape=[1, 3, 224, 224], target="cuda", shards=2, records=96,
                   failed_trials=1, workloads=8, best_records=5, candidate_records=7, improved=True, delivered="tuned",
                   latency_untuned_ms=3.5, latency_tuned_ms=1.4, speedup=2.5, latency_records_ms=1.4,
                   speedup_of_records=2.5, max_relative_error=1e-6,
                   tasks=[TaskSummary("conv2d", "h1", 2, 1e8, 64, 60, 12.5, 30.0, 12.9, "tuned")],
                   tasks_left_at_default=["reshape"], tasks_default_won=[], merge_s=20.0,
                   latency_ms_by_serving_pct={"50": 1.9, "100": None}, serving_report={"reason": None},
                   measurement={"windows": True}, tuning_s=300.0, trials_per_s=0.32)


def test_every_field_round_trips_through_a_file_and_the_version_is_written(tmp_path: Path) -> None:
    s = full()
    assert json.loads(s.to_json())["version"] == VERSION
    s.write(tmp_path / "summary.json")
    assert Summary.read(tmp_path / "summary.json") == s and s.is_improved


def test_an_older_merges_summary_reads_and_its_speedup_says_whether_it_improved() -> None:
    old = Summary.from_json(json.dumps({"job": "tj", "records": "4", "speedup": 0.9, "future_field": 1,
                                        "tasks": [{"name": "t", "budget": 4}]}))
    assert old is not None and old.records == 4 and old.improved is None and not old.is_improved
    assert old.version == 0 and old.tasks == [TaskSummary("t", budget=4)]
    assert Summary.from_dict({"speedup": 3.2}).is_improved


def test_text_that_is_not_a_summary_reads_as_none() -> None:
    for text in (None, "", "{", "[1, 2]", b"\xff"):
        assert Summary.from_json(text) is None
