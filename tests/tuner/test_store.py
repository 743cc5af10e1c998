"""The result stores against real servers: S3 (gofakes3 built from source) and ConfigMaps."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from sharetune_tuner.store.backends import ConfigMapStore, OutputTooLarge, S3Store, StoreError, open_store, pack, unpack


def test_s3_roundtrip_and_restart_keeps_data(s3_env, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.json").write_text("[1]\n")
    (src / "sub" / "b.json").write_text("[2]\n")
    store = open_store("s3://bucket-a/runs/ns/job")
    assert isinstance(store, S3Store)
    assert store.get("shard-0") is None
    store.put("shard-0", pack(src))
    # The server restarts (same data dir): objects are still there.
    s3_env.stop()
    s3_env.start()
    unpack(store.get("shard-0"), tmp_path / "dst")
    assert (tmp_path / "dst" / "a.json").read_text() == "[1]\n"
    assert (tmp_path / "dst" / "sub" / "b.json").read_text() == "[2]\n"


def test_store_errors_are_clear() -> None:
    with pytest.raises(StoreError, match="unknown store 'ftp://x'"):
        open_store("ftp://x")
    with pytest.raises(StoreError, match="expected configmap://<namespace>/<job>"):
        open_store("configmap://only-ns")


@pytest.mark.cluster
def test_configmap_store_refuses_to_truncate(cluster, k8s, tmp_path: Path) -> None:
    from kubernetes import client

    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    core = client.CoreV1Api(k8s)
    core.create_namespaced_config_map("default", client.V1ConfigMap(metadata=client.V1ObjectMeta(name="big-shard-0")))
    store = ConfigMapStore("default", "big")
    store.put("shard-0", b"x" * 1000)
    assert store.get("shard-0") == b"x" * 1000
    with pytest.raises(OutputTooLarge, match="more than a ConfigMap holds"):
        store.put("shard-0", os.urandom(900 * 1024))  # base64 pushes it past 1 MiB
    assert store.get("shard-0") == b"x" * 1000  # the stored copy is intact, not truncated
    store.put_text("shard-0", "progress.json", '{"done": 3}')  # Store.put_text: a data key, data kept
    assert core.read_namespaced_config_map("big-shard-0", "default").data["progress.json"] == '{"done": 3}'
    assert store.get("shard-0") == b"x" * 1000


def test_unreachable_api_server_is_a_store_error_and_the_sync_keeps_going(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """An API server that is down (restarting) must look like any failed upload: retried later,
    records kept. Found by the fault suite: the client's transport error killed the sync thread
    and the final upload, and the retried pod redid the trials measured since."""
    import json

    from sharetune.procs import free_port
    from sharetune_tuner.store.records import RECORDS, WORKLOADS
    from sharetune_tuner.store.sync import ShardSync

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{free_port()}",
                                               "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    store = ConfigMapStore("ns", "job")
    with pytest.raises(StoreError, match="cannot write ConfigMap ns/job-shard-0"):
        store.put("shard-0", b"x")
    with pytest.raises(StoreError, match="cannot read ConfigMap ns/job-shard-0"):
        store.get("shard-0")
    work = tmp_path / "shard"
    work.mkdir()
    (work / WORKLOADS).write_text('["h", "ir"]\n')
    (work / RECORDS).write_text('[0, [[], [1.0], "t", []]]\n')
    sync = ShardSync(store, None, 0, work, interval_s=0.1).start()
    sync.poke()
    import time

    time.sleep(1.5)
    assert sync.failures >= 2 and sync._thread.is_alive()  # retried, thread alive
    assert (work / RECORDS).read_text().count("\n") == 1  # the record is still on disk
    sync._stop.set()


def _members(cls: type) -> dict[str, object]:
    """A class's public members, with the annotated attributes (``uri``) as None."""
    out: dict[str, object] = {k: v for k, v in vars(cls).items() if not k.startswith("_")}
    out.update({k: None for k in getattr(cls, "__annotations__", {}) if not k.startswith("_")})
    return out


def test_both_stores_implement_the_store_protocol_in_full(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every member of ``Store`` exists on both stores, each method with the protocol's
    parameters: callers never need to know which store they have."""
    import inspect

    from sharetune_tuner.store.backends import Store

    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")  # only builds the client: no request
    members = _members(Store)
    assert set(members) == {"uri", "put", "get", "put_text"}
    for store in (ConfigMapStore("ns", "job"), S3Store("bucket", "ns/job")):
        for name, proto in members.items():
            assert hasattr(store, name), f"{type(store).__name__} lacks Store.{name}"
            if proto is None:
                assert isinstance(getattr(store, name), str)
                continue
            impl = getattr(type(store), name)
            assert list(inspect.signature(impl).parameters) == list(inspect.signature(proto).parameters), \
                f"{type(store).__name__}.{name}"
            for pname, p in inspect.signature(proto).parameters.items():  # same defaults (extra=None)
                assert inspect.signature(impl).parameters[pname].default == p.default


def test_s3_put_text_lands_next_to_the_object(s3_env) -> None:
    store = open_store("s3://proto/ns/job")
    assert isinstance(store, S3Store)

    def text(name: str, key: str) -> str:
        return store.s3.get_object(Bucket="proto", Key=f"ns/job/{name}/{key}")["Body"].read().decode()

    store.put("shard-0", b"data", extra={"progress.json": '{"done": 1}'})
    assert text("shard-0", "progress.json") == '{"done": 1}'
    store.put_text("shard-0", "progress.json", '{"done": 2}')
    assert text("shard-0", "progress.json") == '{"done": 2}'
    assert store.get("shard-0") == b"data"  # the object itself is left alone
    store.put_text("result", "summary.json", "{}")  # next to an object that does not exist (yet)
    assert text("result", "summary.json") == "{}"
    assert store.get("result") is None


def test_store_errors_exit_codes_and_base() -> None:
    from sharetune.api.exitcodes import PERMANENT, ExitCode
    from sharetune_tuner.store.backends import StoreFailure

    assert OutputTooLarge.exit_code == ExitCode.OUTPUT_TOO_LARGE and OutputTooLarge.exit_code in PERMANENT
    assert StoreError.exit_code == ExitCode.STORE and StoreError.exit_code not in PERMANENT
    assert issubclass(OutputTooLarge, StoreFailure) and issubclass(StoreError, StoreFailure)
    assert not issubclass(OutputTooLarge, StoreError)  # a retry never makes it fit


class _FakeStore:
    """A ``Store`` in memory whose writes raise ``fail`` while it is set."""

    def __init__(self, uri: str = "fake://job") -> None:
        self.uri = uri
        self.objects: dict[str, bytes] = {}
        self.texts: dict[tuple[str, str], str] = {}
        self.fail: Exception | None = None

    def put(self, name: str, data: bytes, extra: dict[str, str] | None = None) -> None:
        if self.fail is not None:
            raise self.fail
        self.objects[name] = data
        for k, v in (extra or {}).items():
            self.texts[(name, k)] = v

    def get(self, name: str) -> bytes | None:
        return self.objects.get(name)

    def put_text(self, name: str, key: str, text: str) -> None:
        if self.fail is not None:
            raise self.fail
        self.texts[(name, key)] = text


def _shard(tmp_path: Path) -> Path:
    from sharetune_tuner.store.records import RECORDS, WORKLOADS

    work = tmp_path / "shard"
    work.mkdir()
    (work / WORKLOADS).write_text('["h", "ir"]\n')
    (work / RECORDS).write_text('[0, [[], [1.0], "t", []]]\n')
    (work / "progress.json").write_text('{"shard": 0, "done": 1}')
    return work


def test_sync_raises_output_too_large_and_counts_a_store_error(tmp_path: Path) -> None:
    """A shard that will never fit fails the client (its exit code); a store that is down is a
    failed upload, retried later."""
    from sharetune_tuner.store.sync import ShardSync

    store: Any = _FakeStore()
    sync = ShardSync(store, None, 0, _shard(tmp_path))  # not started: sync() by hand
    store.fail = StoreError("down")
    assert sync.sync() is False
    assert (sync.failures, sync.uploads) == (1, 0)
    store.fail = OutputTooLarge("more than a ConfigMap holds")
    with pytest.raises(OutputTooLarge):
        sync.sync()
    assert sync.failures == 1
    store.fail = None
    assert sync.sync() is True
    assert (sync.failures, sync.uploads) == (1, 1)
    assert store.texts[("shard-0", "progress.json")] == '{"shard": 0, "done": 1}'


def test_progress_goes_with_the_shard_and_to_the_sink(tmp_path: Path) -> None:
    """Progress travels with every upload, and to the progress sink too when there is one (an S3
    job's shard ConfigMap); a failure is reported to the sink, or to the store without one."""
    import json

    from sharetune_tuner.store.sync import ShardSync

    store: Any = _FakeStore("fake://store")
    sink: Any = _FakeStore("fake://sink")
    work = _shard(tmp_path)
    sync = ShardSync(store, sink, 0, work)
    assert sync.sync()
    assert store.texts[("shard-0", "progress.json")] == sink.texts[("shard-0", "progress.json")]
    assert "shard-0" in store.objects and not sink.objects
    sink.fail = StoreError("sink down")  # the sink failing fails the upload: retried as a whole
    (work / "progress.json").write_text('{"shard": 0, "done": 2}')
    assert sync.sync() is False and sync.failures == 1
    sink.fail = None
    sync.fail("model broke")
    assert json.loads(sink.texts[("shard-0", "progress.json")])["state"] == "failed"
    assert json.loads(store.texts[("shard-0", "progress.json")])["done"] == 2  # the store's last upload

    alone: Any = _FakeStore()
    ShardSync(alone, None, 0, work).fail("model broke")
    # The failure report is the shard's progress as it was, failed, written as the contract's Progress.
    from sharetune.api.progress import Progress

    failed = Progress.from_json(alone.texts[("shard-0", "progress.json")])
    assert failed is not None
    assert (failed.shard, failed.done, failed.state, failed.message) == (0, 2, "failed", "model broke")


def test_s3_cleanup_deletes_every_object_of_the_job_and_nothing_else(s3_env, capsys, monkeypatch) -> None:
    """`sharetune-tuner s3-cleanup` (what a TuningJob's clean-up Job runs): every key under the
    job's prefix and a slash, so job "a" never takes job "ab"'s objects; exit codes on errors."""
    import json

    from sharetune.api.exitcodes import ExitCode
    from sharetune_tuner.cli import main
    from sharetune_tuner.store.backends import s3_client

    from ..helpers import DenyingS3

    b = s3_client()
    keys = ["runs/ns/a/shard-0.tar.gz", "runs/ns/a/shard-0/progress.json", "runs/ns/a/result.tar.gz",
            "runs/ns/ab/shard-0.tar.gz", "runs/ns/a.tar.gz", "runs/other/a/shard-0.tar.gz"]
    for k in keys:
        b.put_object(Bucket="wipe", Key=k, Body=b"x")
    assert main(["s3-cleanup", "--bucket", "wipe", "--prefix", "runs/ns/a"]) == 0
    assert json.loads(capsys.readouterr().out) == {"bucket": "wipe", "prefix": "runs/ns/a/", "deleted": 3}
    left = sorted(o["Key"] for o in b.list_objects_v2(Bucket="wipe")["Contents"])
    assert left == sorted(keys[3:])
    assert main(["s3-cleanup", "--bucket", "wipe", "--prefix", "/runs/ns/a/"]) == 0  # again: nothing left, fine
    assert json.loads(capsys.readouterr().out)["deleted"] == 0
    # Never the whole bucket.
    assert main(["s3-cleanup", "--bucket", "wipe", "--prefix", "/"]) == ExitCode.USAGE
    assert "must be non-empty" in capsys.readouterr().err
    # The store refuses (wrong credentials): the store's exit code and the server's words.
    with DenyingS3() as denied:
        monkeypatch.setenv("SHARETUNE_S3_ENDPOINT", denied.endpoint)
        assert main(["s3-cleanup", "--bucket", "wipe", "--prefix", "runs/ns/ab"]) == ExitCode.STORE
    err = capsys.readouterr().err
    assert "cannot delete s3://wipe/runs/ns/ab/ (0 objects deleted)" in err and "AccessDenied" in err
    assert "test-secret" not in err
