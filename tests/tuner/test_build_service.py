"""Build services, for real: `sharetune-tuner build-service` processes building the candidates of
real MetaSchedule tuning (a small matmul on the CPU) for clients in this test, counted by their
own /metrics. Local mode's Unix socket and a cluster's TCP builders run the same code: artifacts
come back as bytes; a wrong key is refused (and the client builds itself); a builder killed
mid-batch costs a retry on another builder, never a trial; with no builder answering the client
builds itself after a bounded wait."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytest.importorskip("tvm")

import tvm
from tvm import te
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.testing import te_workload

from sharetune_tuner.build import remote as remote_builder
from sharetune_tuner.build.protocol import ARTIFACT_DIR_ENV, AUTHKEY_ENV
from sharetune_tuner.build.remote import RemoteBuilder

from .conftest import Spawned, free_port, tuner, wait_until

pytestmark = pytest.mark.tvm
BUDGET, PER_ITER = 8, 4
KEY = "test-build-key"


def start_service(listen: str, log: Path, port: int) -> Spawned:
    svc = tuner(["build-service", "--listen", listen, "--workers", "2", "--metrics-port", str(port)], log,
                env={AUTHKEY_ENV: KEY})
    wait_until(lambda: "workers warm" in svc.text(), 60, "build service warm")
    return svc


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[Path, int, Spawned]]:
    sock = Path(os.environ.get("TMPDIR", "/tmp")) / f"st-build-test-{os.getpid()}.sock"  # short: AF_UNIX
    port = free_port()
    svc = start_service(str(sock), tmp_path / "build-service.log", port)
    try:
        yield sock, port, svc
    finally:
        assert svc.stop() == 0, svc.text()  # SIGTERM = a clean stop
        assert not sock.exists()  # and the socket is removed


@pytest.fixture
def builders(tmp_path: Path) -> Iterator[Callable[[int], list[tuple[str, int, Spawned]]]]:
    """Starts TCP build services on this host: a job's builder pods, reached at host:port."""
    out: list[tuple[str, int, Spawned]] = []

    def start(n: int) -> list[tuple[str, int, Spawned]]:
        for i in range(n):
            addr, port = f"127.0.0.1:{free_port()}", free_port()
            out.append((addr, port, start_service(addr, tmp_path / f"builder-{i}.log", port)))
        return out

    try:
        yield start
    finally:
        for _, _, svc in out:
            svc.stop()


def sample(port: int, line_prefix: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(line_prefix + " "):
            return float(line.split()[-1])
    return 0.0


def builds_counted(port: int, status: str = "ok") -> float:
    return sample(port, f'sharetune_builds_total{{status="{status}"}}')


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
    assert builder.fallback is None and builder.remote_builds == BUDGET  # the service built them, not the client
    assert measured(recs) == len(recs) == BUDGET
    assert builds_counted(port) == BUDGET
    # A second client on the same service (the next shard): the service keeps serving.
    recs = tune(tmp_path / "b", RemoteBuilder(sock, fallback_workers=1))
    assert measured(recs) == BUDGET
    assert builds_counted(port) == 2 * BUDGET
    builder.shutdown()


def test_over_tcp_a_wrong_key_is_refused_and_the_right_one_gets_the_artifacts_bytes(
        builders, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    [(addr, port, svc)] = builders(1)
    # What the builder pod's TCP readiness probe does every 2 s: connect, close. Not a refusal.
    host, _, p = addr.rpartition(":")
    socket.create_connection((host, int(p)), timeout=5).close()
    monkeypatch.setenv(AUTHKEY_ENV, "not-the-key")
    wrong = RemoteBuilder(addr, fallback_workers=1)
    with caplog.at_level(logging.WARNING, "sharetune.build"):
        recs = tune(tmp_path / "a", wrong)
    assert wrong.waited_s < wrong.connect_wait_s / 2  # a refusal is not waited for (CONNECT_WAIT_S = 30 s)
    assert "refused this client's key" in caplog.text and wrong.local_builds == BUDGET
    assert measured(recs) == BUDGET  # no trial lost
    assert builds_counted(port) == 0
    wait_until(lambda: "refused a connection from 127.0.0.1:" in svc.text(), 10, "the service's refusal line")
    refusals = [ln for ln in svc.text().splitlines() if "refused a connection" in ln]
    assert all("AuthenticationError" in ln for ln in refusals), refusals  # the wrong key's, not the probe's
    assert svc.popen.poll() is None  # a refused peer does not stop the service
    wrong.shutdown()
    # The job's key: the service builds every candidate, and the client writes each artifact's
    # bytes to a file of its own (this client's artifact directory, not the service's /tmp).
    monkeypatch.setenv(AUTHKEY_ENV, KEY)
    monkeypatch.setenv(ARTIFACT_DIR_ENV, str(tmp_path / "mine"))
    (tmp_path / "mine").mkdir()
    right = RemoteBuilder(addr, fallback_workers=1)
    written: list[str] = []
    real_write = remote_builder._write_artifact
    monkeypatch.setattr(remote_builder, "_write_artifact", lambda n, d: written.append(real_write(n, d)) or written[-1])
    recs = tune(tmp_path / "b", right)
    assert right.remote_builds == BUDGET and right.fallback is None and measured(recs) == BUDGET
    assert builds_counted(port) == BUDGET
    assert len(written) == BUDGET and all(w.startswith(str(tmp_path / "mine")) for w in written)
    right.shutdown()


def test_a_builder_killed_mid_batch_costs_a_retry_never_a_trial(builders, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    (addr0, port0, svc0), (addr1, port1, svc1) = builders(2)
    monkeypatch.setenv(AUTHKEY_ENV, KEY)
    builder = RemoteBuilder(f"{addr0},{addr1}", fallback_workers=1)
    killed = threading.Event()

    def kill_when_building() -> None:  # SIGKILL builder 0's process group while it builds a chunk
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if sample(port0, "sharetune_builds_in_flight") > 0:
                    svc0.proc.kill(signal.SIGKILL)
                    killed.set()
                    return
            except OSError:
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=kill_when_building, daemon=True)
    watcher.start()
    recs = tune(tmp_path / "a", builder)
    watcher.join(5)
    assert killed.is_set()
    assert measured(recs) == len(recs) == BUDGET  # every candidate built and measured: no build error
    assert builder.retried >= 1  # the killed builder's chunk went again ...
    assert builder.local_builds == 0 and builds_counted(port1) >= builder.retried  # ... to the other builder
    builder.shutdown()


def test_an_empty_round_builds_to_nothing(service, monkeypatch: pytest.MonkeyPatch) -> None:
    # MetaSchedule sends one when a task's design space is used up (whole-model runs: a reshape);
    # it crashed the client (chunk size 0) at every restart.
    sock, _, _ = service
    monkeypatch.setenv(AUTHKEY_ENV, KEY)
    builder = RemoteBuilder(sock, fallback_workers=1)
    assert builder.build([]) == [] and builder.remote_builds == builder.local_builds == 0
    builder.shutdown()


def test_with_no_builder_answering_the_client_builds_itself_after_a_bounded_wait(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(AUTHKEY_ENV, KEY)
    builder = RemoteBuilder(f"127.0.0.1:{free_port()}", fallback_workers=1, connect_wait_s=2.0)
    recs = tune(tmp_path / "a", builder)
    assert measured(recs) == BUDGET and builder.local_builds == BUDGET
    assert 2.0 <= builder.waited_s < 2.0 + 10  # the first batch waited, bounded; the later ones tried once
    builder.shutdown()


def test_a_client_whose_service_dies_finishes_its_trials_itself(service, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    sock, port, svc = service
    monkeypatch.setenv(AUTHKEY_ENV, KEY)
    builder = RemoteBuilder(sock, fallback_workers=1)
    assert measured(tune(tmp_path / "a", builder)) == BUDGET
    assert builder.conns and builder.fallback is None  # connected, through the service
    svc.stop()  # the service dies between two batches of the client
    recs = tune(tmp_path / "b", builder)
    assert builder.fallback is not None and builder.local_builds == BUDGET
    assert measured(recs) == BUDGET  # the client built them all itself
    builder.shutdown()
