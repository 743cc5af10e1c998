"""spec.servers.servingPercentage: the tuning share picked from the measured table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sharetune.api import serving
from sharetune.api.spec import SpecError, parse_spec
from sharetune.planner import JobRef, plan

MATRIX = Path(__file__).parents[2] / "bench" / "results" / "h200-quality-matrix.json"


def _spec(servers: dict) -> dict:
    return {"model": {"name": "resnet18"}, "target": "cuda", "servers": servers}


@pytest.mark.parametrize("serving_pct, tuning_pct", [(10, 10), (25, 25), (50, 25), (75, 25), (100, 100)])
def test_serving_share_picks_the_measured_tuning_share(serving_pct: int, tuning_pct: int) -> None:
    s = parse_spec("j", _spec({"servingPercentage": serving_pct}))
    assert s.servers.serving_percentage == serving_pct
    assert s.servers.thread_percentage == tuning_pct


@pytest.mark.parametrize("serving_pct, nearest", [(1, 10), (17, 10), (18, 25), (37, 25), (38, 50), (62, 50),
                                                  (63, 75), (87, 75), (88, 100)])
def test_between_measured_shares_the_nearest_one_counts(serving_pct: int, nearest: int) -> None:
    assert serving.tuning_pct_for(serving_pct) == serving.TUNING_PCT_BY_SERVING_PCT[nearest]


def test_explicit_thread_percentage_wins() -> None:
    s = parse_spec("j", _spec({"servingPercentage": 10, "threadPercentage": 60}))
    assert (s.servers.thread_percentage, s.servers.serving_percentage) == (60, 10)


def test_without_serving_share_the_default_stays_100() -> None:
    s = parse_spec("j", _spec({}))
    assert (s.servers.thread_percentage, s.servers.serving_percentage) == (100, None)


@pytest.mark.parametrize("value, message", [
    (0, "spec.servers.servingPercentage: 0 is outside [1, 100]"),
    (101, "spec.servers.servingPercentage: 101 is outside [1, 100]"),
    ("50", "spec.servers.servingPercentage: expected int, got str"),
    (True, "spec.servers.servingPercentage: expected int, got boolean"),
])
def test_bad_serving_share_names_the_field(value: object, message: str) -> None:
    with pytest.raises(SpecError) as e:
        parse_spec("j", _spec({"servingPercentage": value}))
    assert message in str(e.value)


def test_servers_run_at_the_picked_share() -> None:
    spec = parse_spec("j", _spec({"servingPercentage": 10, "replicas": 2}))
    objs = plan(JobRef("j", "ns", "uid"), spec)
    servers = next(o for o in objs if o["metadata"]["name"] == "j-servers")
    env = {e["name"]: e.get("value") for c in servers["spec"]["template"]["spec"]["containers"] for e in c["env"]}
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "10"


def test_table_is_the_measured_recommendation() -> None:
    rec = json.loads(MATRIX.read_text())["recommended"]
    assert {int(k): v for k, v in rec["tuning_pct_by_serving_pct"].items()} == serving.TUNING_PCT_BY_SERVING_PCT
    assert rec["recommended_tuning_pct"] == serving.DEFAULT_TUNING_PCT
    assert rec["worst_case_slowdown"] == serving.DEFAULT_WORST_CASE_SLOWDOWN
    assert serving.SOURCE in (serving.__doc__ or "")


def test_table_module_is_pure() -> None:
    import subprocess
    import sys

    code = ("import sys, sharetune.api.serving; "
            "bad = [m for m in ('tvm', 'kopf', 'kubernetes') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
