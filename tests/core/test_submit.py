"""`sharetune run` on a cluster, the parts that need no API server: what it prints for a finished
job, and the flags that belong to the other shell (the submission and following themselves run
against the real control plane in tests/operator/test_operator.py's real tuning run)."""

from __future__ import annotations

import pytest

from sharetune.cli import main
from sharetune.submit import Submitted, summary_lines

JOB = Submitted("team-a", "tiny")


def test_a_succeeded_job_says_trials_latency_worth_and_where_the_result_is() -> None:
    status = {"phase": "Succeeded", "trialsCompleted": 96, "trialsPerSecond": 1.5, "untunedLatencyMs": 2.0,
              "tunedLatencyMs": 1.0, "bestSpeedup": 2.0, "improved": True,
              "resultLocation": "configmap://team-a/tiny-result",
              "fetchCommand": "sharetune result fetch tj/tiny -n team-a -o DIR"}
    assert summary_lines(JOB, status, 61.2) == [
        "tuningjob team-a/tiny succeeded in 61 s: 96 trials at 1.5 trials/s",
        "  latency 2.0 ms untuned -> 1.0 ms tuned: 2.0x faster than untuned",
        "  result: configmap://team-a/tiny-result",
        "  fetch:  sharetune result fetch tj/tiny -n team-a -o DIR"]


def test_a_failed_job_gives_its_reason_and_where_to_look() -> None:
    lines = summary_lines(JOB, {"phase": "Failed", "message": "shard 0 failed 3 times: model error"}, 12)
    assert lines == ["tuningjob team-a/tiny failed after 12 s: shard 0 failed 3 times: model error",
                     "  kubectl describe tj tiny -n team-a   (conditions and events)"]


@pytest.mark.parametrize("args, words", [
    (["--local", "--detach"], "--detach and --namespace are for a cluster"),
    (["--workdir", "runs/x"], "--workdir and --json are for --local"),
])
def test_flags_of_the_other_shell_are_refused_in_one_line(args: list[str], words: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "examples/tiny-cpu.yaml", *args]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1
