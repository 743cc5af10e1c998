"""Phase and condition logic of the operator (pure)."""

from __future__ import annotations

import json

from sharetune.api.summary import Summary
from sharetune.controller.status import (
    FAILED,
    MERGING,
    PENDING,
    RUNNING,
    SUCCEEDED,
    Observed,
    ShardView,
    condition,
    next_phase,
    progress_fields,
)


def shard(i: int, state: str, done: int = 0, budget: int = 4, message: str = "") -> ShardView:
    return ShardView.from_progress(i, json.dumps({"state": state, "done": done, "budget": budget, "message": message,
                                                  "tasks": [{"best_s": 1e-4}]}))


def test_phases_follow_the_observed_children() -> None:
    assert next_phase(None, Observed([shard(0, "starting")]), 1)[0] == PENDING
    assert next_phase(PENDING, Observed([shard(0, "tuning", 1)]), 1)[:2] == (RUNNING, "Tuning")
    assert next_phase(RUNNING, Observed([shard(0, "done", 4)], clients_succeeded=1), 1)[:2] == (MERGING, "ShardsDone")
    ok = Observed([shard(0, "done", 4)], clients_succeeded=1, merge_exists=True, merge_succeeded=True,
                  summary=Summary.from_dict({"records": 4, "speedup": 3.2}))
    assert next_phase(MERGING, ok, 1) == (SUCCEEDED, "Merged", "4 trials merged; 3.2x faster than untuned")
    lost = Observed([shard(0, "done", 4)], clients_succeeded=1, merge_exists=True, merge_succeeded=True)
    assert next_phase(MERGING, lost, 1)[:2] == (FAILED, "ResultMissing")
    assert next_phase(SUCCEEDED, Observed([shard(0, "failed")], clients_failed=True), 1)[0] == SUCCEEDED  # final


def test_failed_shard_reason_carries_the_shards_message() -> None:
    obs = Observed([shard(0, "done", 4), shard(1, "failed", 2, message="shard-1 is 2000000 bytes compressed: "
                                                                     "more than a ConfigMap holds (1 MiB)")],
                   clients_failed=True, clients_failed_indexes="1", clients_failed_message="FailedIndexes: ...")
    phase, reason, message = next_phase(RUNNING, obs, 2)
    assert (phase, reason) == (FAILED, "OutputTooLarge")
    assert "shard 1: shard-1 is 2000000 bytes compressed" in message
    gpu = Observed([shard(0, "starting")],
                   daemon_unschedulable="0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")
    assert next_phase(PENDING, gpu, 1)[1] == "GpuUnavailable"


def test_conditions_move_transition_time_only_on_change() -> None:
    c1 = condition([], "Ready", "False", "Tuning", "m", 1)
    c2 = condition(c1, "Ready", "False", "Tuning", "m2", 2)
    assert c2[0]["lastTransitionTime"] == c1[0]["lastTransitionTime"] and c2[0]["observedGeneration"] == 2
    c3 = condition([{**c2[0], "lastTransitionTime": "2020-01-01T00:00:00Z"}], "Ready", "True", "Merged", "", 2)
    assert c3[0]["lastTransitionTime"] != "2020-01-01T00:00:00Z" and c3[0]["status"] == "True"


def test_progress_fields() -> None:
    f = progress_fields(Observed([shard(0, "tuning", 2, 4), shard(1, "done", 4, 4)]), None)
    assert (f["trialsCompleted"], f["trialsTotal"], f["progressPercent"]) == (6, 8, 75)
    assert f["shards"][0] == {"index": 0, "state": "tuning", "done": 2, "budget": 4, "bestLatencyUs": 100.0}


def test_mps_recovery_replaces_a_dead_daemon_and_restarts_its_servers() -> None:
    from sharetune.controller.status import DaemonView, mps_recovery

    assert mps_recovery(DaemonView("running"), "Running", 0) == (False, False)
    assert mps_recovery(DaemonView("pending"), "Pending", 0) == (False, False)  # e.g. waiting for a GPU
    assert mps_recovery(DaemonView("failed"), "Running", 0) == (True, True)
    assert mps_recovery(DaemonView("absent"), "Pending", 0) == (True, True)  # deleted by someone
    # An in-place restart by the kubelet: the pod stays, the servers' contexts are dead.
    assert mps_recovery(DaemonView("running", restarts=1), "Running", 0) == (False, True)
    assert mps_recovery(DaemonView("running", restarts=1), "Running", 1) == (False, False)  # already answered
    # Once merging or done, a dead daemon changes nothing.
    for phase in ("Merging", "Succeeded", "Failed"):
        assert mps_recovery(DaemonView("failed"), phase, 0) == (False, False)


def test_pending_says_why_pods_cannot_start() -> None:
    secret = Observed(shards=[ShardView(0)],
                      secret_problem="Secret s3 (output.s3.credentialsSecret) does not exist in ns")
    assert next_phase(PENDING, secret, 1)[:2] == (PENDING, "SecretMissing")
    gpu = Observed(shards=[ShardView(0)],
                   unschedulable="server: 0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")
    assert next_phase(PENDING, gpu, 1)[:2] == (PENDING, "GpuUnavailable")
    cpu = Observed(shards=[ShardView(0)],
                   unschedulable="client: 0/2 nodes are available: 2 node(s) didn't match selector")
    phase, reason, message = next_phase(PENDING, cpu, 1)
    assert (phase, reason) == (PENDING, "Unschedulable") and "didn't match" in message
    # Once a shard tunes, a retried pod waiting for a node does not send the job back to Pending.
    tuning = Observed(shards=[ShardView(0, state="tuning")], unschedulable=cpu.unschedulable)
    assert next_phase(RUNNING, tuning, 1)[:2] == (RUNNING, "Tuning")


def test_a_result_not_faster_than_untuned_says_so() -> None:
    from sharetune.controller.status import improved_condition, result_fields

    done = dict(clients_succeeded=1, merge_exists=True, merge_succeeded=True)
    slower = Summary.from_dict({"records": 96, "speedup": 1.0, "improved": False, "speedup_of_records": 0.83,
              "latency_untuned_ms": 3.48, "latency_tuned_ms": 3.48, "tasks_left_at_default": ["reshape"],
              "tasks_default_won": ["fused_conv2d_add_relu"]})
    phase, reason, message = next_phase(MERGING, Observed([shard(0, "done", 4)], summary=slower, **done), 1)
    assert (phase, reason) == (SUCCEEDED, "Merged")
    assert "not faster than untuned" in message and "0.83x" in message and "try a larger trials.total" in message
    assert "x faster" not in message
    f = result_fields(slower)
    assert f["improved"] is False and f["bestSpeedup"] == 1.0 and f["recordsSpeedup"] == 0.83
    assert f["tunedLatencyMs"] == f["untunedLatencyMs"] == 3.48  # the delivered model is the untuned one
    assert f["tasksLeftAtDefault"] == ["reshape"] and f["tasksDefaultWon"] == ["fused_conv2d_add_relu"]
    c = improved_condition([], slower, 3)
    assert (c[0]["type"], c[0]["status"], c[0]["reason"]) == ("Improved", "False", "NotFasterThanUntuned")

    faster = Summary.from_dict({"records": 96, "speedup": 2.5, "improved": True, "speedup_of_records": 2.5,
                                "tasks_left_at_default": []})
    assert next_phase(MERGING, Observed([shard(0, "done", 4)], summary=faster, **done), 1)[2] == \
        "96 trials merged; 2.5x faster than untuned"
    c = improved_condition(c, faster, 4)
    assert len(c) == 1 and (c[0]["status"], c[0]["reason"]) == ("True", "FasterThanUntuned")
    assert result_fields(faster)["improved"] is True and result_fields(faster)["tasksLeftAtDefault"] == []
    # A summary from a merge before the never-slower rule: its speed-up decides.
    assert result_fields(Summary.from_dict({"records": 4, "speedup": 0.9}))["improved"] is False
    assert "recordsSpeedup" not in result_fields(Summary.from_dict({"records": 4, "speedup": 3.2}))


def test_a_shards_measurement_windows_reach_its_status() -> None:
    """The client's per-shard window counts (progress.json) become the shard's status entry; a CPU
    shard (no windows) shows none of the keys."""
    gpu = ShardView.from_progress(1, json.dumps({
        "state": "tuning", "done": 12, "budget": 32, "tasks": [],
        "co_tenants": {"team-b/bert": 9, "team-a/vit": 2}, "measured_alone": 3, "measured_beside_others": 9}))
    assert gpu.as_status() == {"index": 1, "state": "tuning", "done": 12, "budget": 32, "measuredAlone": 3,
                               "measuredBesideOthers": 9, "coTenants": {"team-b/bert": 9, "team-a/vit": 2}}
    assert set(shard(0, "tuning", 1).as_status()) == {"index", "state", "done", "budget", "bestLatencyUs"}
