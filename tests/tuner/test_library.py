"""The tuning library: records keyed by where they were measured, many jobs adding at once, and
a JSONDatabase stock TVM reads coming out of it."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("tvm")

from tvm.s_tir import meta_schedule as ms

from sharetune_tuner.store import library
from sharetune_tuner.store.library import LibraryError, Where
from sharetune_tuner.store.records import read_lines

from .test_records import TARGET, workload, write_shard

pytestmark = pytest.mark.tvm


def _target_key(db: Path, **change: object) -> str:
    """The key of the target the records of ``db`` carry (as TVM wrote it), with ``change``."""
    return library.target_key({**read_lines(db / "database_tuning_record.json")[0][1][2], **change})


def test_a_record_is_reused_only_where_it_was_measured(tmp_path: Path) -> None:
    a = tmp_path / "a"
    write_shard(a, [(16, 5e-6), (16, 3e-6), (32, 9e-6), (32, 1e10)])  # 1e10: a failed run
    lib = library.open_library(str(tmp_path / "lib"))
    library.add(lib, "team-a", "uid-a", library.contribution(a, "team-a/a", Where("H100", 50)))
    # The same records said to come from a whole GPU, and from another device.
    library.add(lib, "team-a", "uid-b", library.contribution(a, "team-a/b", Where("H100", 100)))
    library.add(lib, "team-a", "uid-c", library.contribution(a, "team-a/c", Where("L4", 50)))
    found, irs = library.entries(lib, "team-a")
    key = _target_key(a)
    got = library.matching(found, key, Where("H100", 50))
    # Only the 50%-share H100 records; the failed run never went in; the trace measured twice
    # (the same schedule of matmul 16) is one entry with its faster time.
    assert sorted((e.key.workload, e.secs, e.job) for e in got) == sorted(
        [(got[0].key.workload, 3e-6, "team-a/a"), (got[-1].key.workload, 9e-6, "team-a/a")])
    assert {e.key.share for e in got} == {50} and {e.key.device for e in got} == {"H100"}
    assert len(library.matching(found, key, Where("H100", 100))) == 2
    assert library.matching(found, key, Where("A100", 50)) == []
    assert library.matching(found, _target_key(a, **{"num-cores": 2}), Where("H100", 50)) == []  # another target
    assert len(library.matching(found, key, Where("H100", 50), top_k=1)) == 2  # one per workload
    assert set(irs) == {e.key.workload for e in found}
    assert library.entries(lib, "team-b") == ([], {})  # another scope sees none of it


@pytest.mark.parametrize("backend", ["dir", "s3"])
def test_twenty_jobs_adding_at_once_lose_nothing(backend: str, tmp_path: Path, request) -> None:
    """Each job writes its own object: no lock, no conditional write, no lost record."""
    uri = str(tmp_path / "lib") if backend == "dir" else "s3://library/shared"
    if backend == "s3":
        request.getfixturevalue("s3_env")
    db = tmp_path / "db"
    write_shard(db, [(16, 4e-6), (32, 8e-6), (64, 2e-5)])
    start = threading.Barrier(20)

    def one_job(i: int) -> str:
        obj = library.contribution(db, f"ns/job-{i}", Where(f"gpu-{i}", 50))
        start.wait()  # every merge writes at the same moment
        return library.add(library.open_library(uri), "ns", f"uid-{i}", obj)

    with ThreadPoolExecutor(20) as pool:
        names = list(pool.map(one_job, range(20)))
    assert len(set(names)) == 20
    found, _ = library.entries(library.open_library(uri), "ns")
    assert len(found) == 20 * 3 and {e.job for e in found} == {f"ns/job-{i}" for i in range(20)}


def test_export_is_a_database_stock_tvm_reads(tmp_path: Path) -> None:
    a = tmp_path / "a"
    write_shard(a, [(16, 5e-6), (16, 3e-6), (32, 9e-6)])
    lib = library.open_library(str(tmp_path / "lib"))
    library.add(lib, "ns", "uid-a", library.contribution(a, "ns/a", Where("cpu")))
    found, irs = library.entries(lib, "ns")
    out = tmp_path / "export"
    assert library.export(library.matching(found, _target_key(a), Where("cpu"), top_k=1), irs, out) == 2
    db = ms.database.JSONDatabase(work_dir=str(out))
    got = {n: float(db.query_tuning_record(workload(n), TARGET, "main").run_secs[0]) for n in (16, 32)}
    assert got == pytest.approx({16: 3e-6, 32: 9e-6})
    # ... and a stock database goes back in as it came out.
    lib2 = library.open_library(str(tmp_path / "lib2"))
    library.add(lib2, "ns", "uid-x", library.contribution(out, "ns/x", Where("cpu")))
    assert sorted(e.secs for e in library.entries(lib2, "ns")[0]) == pytest.approx([3e-6, 9e-6])


def test_a_library_uri_it_cannot_use_names_the_fix() -> None:
    with pytest.raises(LibraryError, match="s3://BUCKET/PREFIX or a directory"):
        library.open_library("gs://bucket/x")
    with pytest.raises(LibraryError, match="no bucket"):
        library.open_library("s3:///x")


def test_the_cli_round_trip_with_stock_tvms_database(tmp_path: Path) -> None:
    """`sharetune library import` takes a database stock TVM wrote, `ls` shows it, `export` gives
    back one TVM reads, with the best record of each workload."""
    import json
    import subprocess
    import sys

    def sharetune(*args: str) -> str:
        r = subprocess.run([sys.executable, "-m", "sharetune.cli", "library", *args], capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout

    db, lib = tmp_path / "db", str(tmp_path / "lib")
    write_shard(db, [(16, 5e-6), (16, 3e-6), (32, 9e-6)])
    added = json.loads(sharetune("import", lib, str(db), "--device", "Xeon 8480", "--job", "resnet-night"))
    assert added["records"] == 2 and added["workloads"] == 2  # the schedule measured twice: once, fastest
    (row,) = [json.loads(x) for x in sharetune("ls", lib, "--json").splitlines()]
    assert (row["device"], row["share"], row["workloads"], row["records"], row["jobs"]) == ("Xeon 8480", 100, 2, 2, 1)
    assert row["target"]["kind"] == "llvm"
    out = tmp_path / "export"
    assert json.loads(sharetune("export", lib, str(out), "--device", "Xeon 8480", "--target", "llvm"))["records"] == 2
    got = ms.database.JSONDatabase(work_dir=str(out))
    assert float(got.query_tuning_record(workload(16), TARGET, "main").run_secs[0]) == pytest.approx(3e-6)
    # Exporting over a database would lose its records: refused.
    r = subprocess.run([sys.executable, "-m", "sharetune.cli", "library", "export", lib, str(out), "--device",
                        "Xeon 8480"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "already holds a database" in r.stderr
    assert len(read_lines(out / "database_tuning_record.json")) == 2
    # Another device's records are not there to export: the error names the fix.
    r = subprocess.run([sys.executable, "-m", "sharetune.cli", "library", "export", lib, str(tmp_path / "x"),
                        "--device", "H100"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "matches 0 targets" in r.stderr and "sharetune library ls" in r.stderr
    # A second database under a name already used would replace the first one's records: refused.
    other = tmp_path / "db2"
    write_shard(other, [(64, 7e-6)])
    r = subprocess.run([sys.executable, "-m", "sharetune.cli", "library", "import", lib, str(other), "--device",
                        "Xeon 8480", "--job", "resnet-night"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "resnet-night" in r.stderr and "--replace" in r.stderr
    # Unnamed, each database keeps its own records, and importing one again adds nothing twice.
    for _ in range(2):
        sharetune("import", lib, str(other), "--device", "Xeon 8480")
    (row,) = [json.loads(x) for x in sharetune("ls", lib, "--json").splitlines()]
    assert (row["workloads"], row["records"], row["jobs"]) == (3, 3, 2)
