"""The host's shared build service, for real: a `sharetune-tuner build-service` process building
the candidates of real MetaSchedule tuning (a small matmul on the CPU) for clients in this test,
counted by its own /metrics; a wrong key and a dead service leave the client building itself,
with every trial still measured."""

from __future__ import annotations

import logging
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("tvm")

import tvm  # noqa: E402
from tvm import te  # noqa: E402
from tvm.s_tir import meta_schedule as ms  # noqa: E402
from tvm.s_tir.meta_schedule.testing import te_workload  # noqa: E402

from sharetune_tuner.build_protocol import AUTHKEY_ENV  # noqa: E402
from sharetune_tuner.remote_builder import RemoteBuilder  # noqa: E402

from .conftest import Spawned, free_port, tuner, wait_until  # noqa: E402

pytestmark = pytest.mark.tvm
BUDGET, PER_ITER = 8, 4
KEY = "test-build-key"


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[Path, int, Spawned]]:
    sock = Path(os.environ.get("TMPDIR", "/tmp")) / f"st-build-test-{os.getpid()}.sock"  # short: AF_UNIX
    port = free_port()
    svc = tuner(["build-service", "--socket", str(sock), "--workers", "2", "--metrics-port", str(port)],
                tmp_path / "build-service.log", env={AUTHKEY_ENV: KEY})
    try:
        wait_until(lambda: "workers warm" in svc.text(), 60, "build service warm")
        yield sock, port, svc
    finally:
        assert svc.stop() == 0, svc.text()  # SIGTERM = a clean stop
        assert not sock.exists()  # and the socket is removed


def builds_counted(port: int, status: str = "ok") -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(f'sharetune_builds_total{{status="{status}"}}'):
            return float(line.split()[-1])
    return 0.0


def tune(work_dir: Path, builder: ms.builder.Builder) -> list[ms.database.TuningRecord]:
    mod = tvm.IRModule({"main": te.create_prim_func(te_workload.matmul(64, 64, 64))})
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    database = ms.database.MemoryDatabase()
    ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                         search_strategy=ms.search_strategy.EvolutionarySearch(population_size=16,
                                                                               init_min_unmeasured=8),
                         task_name="matmul", num_threads=2, rand_state=1)
    ms.tune_tasks(tasks=[ctx], task_weights=[1.0], work_dir=str(work_dir), max_trials_global=BUDGET,
                  max_trials_per_task=BUDGET, num_trials_per_iter=PER_ITER, builder=builder,
                  runner=ms.runner.LocalRunner(), database=database, cost_model=ms.CostModel.create("random"),
                  measure_callbacks=[ms.measure_callback.AddToDatabase(), ms.measure_callback.RemoveBuildArtifact()],
                  task_scheduler="round-robin")
    return list(database.get_all_tuning_records())


def measured(recs: list[ms.database.TuningRecord]) -> int:
    return sum(1 for r in recs if r.run_secs and all(float(s) < 1e9 for s in r.run_secs))


def test_the_service_builds_every_candidate_of_a_client(service, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    sock, port, svc = service
    monkeypatch.setenv(AUTHKEY_ENV, KEY)
    builder = RemoteBuilder(sock, fallback_workers=1)
    recs = tune(tmp_path / "a", builder)
    assert builder.fallback is None  # the service built them, not the client
    assert measured(recs) == len(recs) == BUDGET
    assert builds_counted(port) == BUDGET
    # A second client on the same service (the next shard): the service keeps serving.
    recs = tune(tmp_path / "b", RemoteBuilder(sock, fallback_workers=1))
    assert measured(recs) == BUDGET
    assert builds_counted(port) == 2 * BUDGET
    builder.shutdown()


def test_a_wrong_key_is_refused_and_the_client_builds_itself(service, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    sock, port, svc = service
    monkeypatch.setenv(AUTHKEY_ENV, "not-the-key")
    builder = RemoteBuilder(sock, fallback_workers=1)
    with caplog.at_level(logging.WARNING, "sharetune.build"):
        recs = tune(tmp_path / "a", builder)
    assert builder.fallback is not None and "unusable" in caplog.text
    assert measured(recs) == BUDGET  # no trial lost
    assert builds_counted(port) == 0
    assert svc.popen.poll() is None  # a refused peer does not stop the service
    builder.shutdown()


def test_a_client_whose_service_dies_finishes_its_trials_itself(service, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    sock, port, svc = service
    monkeypatch.setenv(AUTHKEY_ENV, KEY)
    builder = RemoteBuilder(sock, fallback_workers=1)
    assert measured(tune(tmp_path / "a", builder)) == BUDGET
    assert builder.conn is not None and builder.fallback is None  # connected, through the service
    svc.stop()  # the service dies between two batches of the client
    recs = tune(tmp_path / "b", builder)
    assert builder.fallback is not None
    assert measured(recs) == BUDGET  # the client built them all itself
    builder.shutdown()
