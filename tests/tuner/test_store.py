"""The result stores against real servers: S3 (gofakes3 built from source) and ConfigMaps."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sharetune_tuner.store import ConfigMapStore, OutputTooLarge, S3Store, StoreError, open_store, pack, unpack


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
def test_configmap_store_refuses_to_truncate(cluster, k8s, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
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


def test_unreachable_api_server_is_a_store_error_and_the_sync_keeps_going(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """An API server that is down (restarting) must look like any failed upload: retried later,
    records kept. Found by the fault suite: the client's transport error killed the sync thread
    and the final upload, and the retried pod redid the trials measured since."""
    import json

    from sharetune.procs import free_port
    from sharetune_tuner.records import RECORDS, WORKLOADS
    from sharetune_tuner.sync import ShardSync

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
