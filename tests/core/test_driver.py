"""The rules both orchestrators apply to a job's shards (sharetune/driver.py): one clamp, one
restart-or-fail rule, whatever carries the shard's report."""

from __future__ import annotations

from sharetune.api.exitcodes import ExitCode
from sharetune.api.progress import Progress
from sharetune.controller.status import ShardView
from sharetune.driver import Verdict, client_exit, shard_clamp


def test_the_clamp_reads_a_client_progress_and_the_operator_view_alike() -> None:
    reported = Progress("tj", 0, 12, useful_shards=8, tasks_total=15, tasks_to_tune=8)
    starting = Progress("tj", 1, 12)
    local = shard_clamp(12, [reported, starting])
    operator = shard_clamp(12, [ShardView.from_progress(0, reported.to_json()), ShardView(1)])
    assert local == operator and local is not None
    assert (local.shards, local.message) == (8, "clients.shards 12 > 8 tasks to tune: clamped to 8 shards (the "
                                                 "budget gives trials to 8 of the model's 15 tasks; the rest keep "
                                                 "TVM's defaults)")
    # none reported yet, or every shard has a task: no clamp; the budget's own sizing is named
    assert shard_clamp(12, [starting]) is None and shard_clamp(8, [reported]) is None
    assert shard_clamp(10, [reported], asked=64).message.startswith("clients.shards 64 > 8 tasks")  # type: ignore[union-attr]  # clamped above


def test_a_client_exit_is_done_retried_or_final() -> None:
    assert client_exit(0, 1, 4) is Verdict.DONE
    assert client_exit(1, 1, 4) is Verdict.RESTART and client_exit(-9, 3, 4) is Verdict.RESTART  # crash, kill
    assert client_exit(1, 4, 4) is Verdict.GIVE_UP  # attempts used up
    assert client_exit(ExitCode.MODEL, 1, 4) is Verdict.FAIL  # a user error: a retry cannot fix it
    # no GPU here: final on this machine, retried on a cluster (the next pod may land elsewhere)
    assert client_exit(ExitCode.TARGET, 1, 4, one_machine=True) is Verdict.FAIL
    assert client_exit(ExitCode.TARGET, 1, 4) is Verdict.RESTART
