"""More shards than tasks to tune: the operator sizes the clients' Indexed Job to what the budget
can give a task, scales it down to the shards that have one once a client reports the model's
tasks, says both, and the job still merges every record. The test acts as the pods (as
test_operator.py's real run does): it runs the pods' own tuner commands locally and reports their
exits like a kubelet."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client

from sharetune.api.topology import PROGRESS_FILE
from sharetune.controller.kube import read_or_none as maybe

from ..tuner.conftest import free_port, tuner
from .conftest import create_job, finish_pod, get_job, running_pods, tuning_job, wait_for
from .test_operator import as_local

pytestmark = [pytest.mark.cluster]

INDEX = "batch.kubernetes.io/job-completion-index"


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def test_more_shards_than_tasks_are_clamped(k8s, cluster, operator, ns, tmp_path: Path) -> None:
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    # tiny_cnn (8 tasks), 9 trials of at most 1 per task, 12 shards asked: the budget can give 9
    # tasks a trial, so the Job starts with 9 shards; the model has 8, so it is scaled down to 8.
    create_job(k8s, ns, tuning_job("clamp", trials={"total": 9, "perTask": 1, "perIteration": 1},
                                   clients={"shards": 12, "builderWorkers": 1}))
    batch = client.BatchV1Api(k8s)
    j = wait_for("clients Job", lambda: maybe(batch.read_namespaced_job, "clamp-clients", ns))
    assert j.spec.completions == j.spec.parallelism == 9
    sized = wait_for("BudgetBoundsShards", lambda: next((c for c in get_job(k8s, ns, "clamp").get("status", {}).get(
        "conditions", []) if c["type"] == "ShardsClamped"), None))
    assert sized["reason"] == "BudgetBoundsShards" and sized["message"].startswith(
        "clients.shards 12 > 9: a budget of 9 trials gives 1 or more to each task it tunes")
    job_file = tmp_path / "job.yaml"
    job_file.write_text(client.CoreV1Api(k8s).read_namespaced_config_map("clamp-spec", ns).data["job.yaml"])
    args = j.spec.template.spec.containers[0].args
    port = free_port()
    procs = [tuner(["tracker", "--host", "127.0.0.1", "--port", str(port)], tmp_path / "tracker.log")]
    try:
        # Shard 8 started before the clamp: it finds nothing to do and exits 0 without waiting
        # for a server; shards 0-7 tune (waiting for the server as pods do).
        clients = {i: tuner([*as_local(args, job=str(job_file), work_dir=str(tmp_path / f"w{i}"),
                                       tracker=f"127.0.0.1:{port}", metrics_port="-1"),
                             "--shard", str(i), "--sync-interval", "2"], tmp_path / f"client{i}.log")
                   for i in (8, *range(8))}
        procs += clients.values()
        # A server that finds no tracker retries only after 5 s: start it once the tracker listens.
        wait_for("tracker listening", lambda: listening(port), timeout_s=60)
        base = free_port()
        key = args[args.index("--key") + 1]  # the job's tracker key, as the planner gave its clients
        procs.append(tuner(["server", "--tracker", f"127.0.0.1:{port}", "--key", key, "--host", "127.0.0.1",
                            "--port", str(base), "--port-end", str(base + 1)], tmp_path / "server.log"))
        st = wait_for("ShardsClamped", lambda: (s := get_job(k8s, ns, "clamp").get("status", {})).get("clientShards")
                      and s, timeout_s=120, every=1)
        st = wait_for("clamped to 8", lambda: (s := get_job(k8s, ns, "clamp").get("status", {})).get(
            "clientShards") == 8 and s, timeout_s=120, every=1)
        clamped = next(c for c in st["conditions"] if c["type"] == "ShardsClamped")
        assert clamped["status"] == "True" and clamped["reason"] == "MoreShardsThanTasks"
        assert clamped["message"] == "clients.shards 12 > 8 tasks to tune: clamped to 8 shards"
        j = batch.read_namespaced_job("clamp-clients", ns)
        assert j.spec.completions == j.spec.parallelism == 8
        wait_for("index 8 pod gone", lambda: sorted(int(p.metadata.annotations[INDEX]) for p in running_pods(
            k8s, ns, "job-name=clamp-clients")) == list(range(8)), timeout_s=60)
        for c in clients.values():
            assert c.popen.wait(timeout=300) == 0, c.text()[-2000:]
        progress = json.loads((tmp_path / "w8" / PROGRESS_FILE).read_text())
        assert progress["state"] == "done" and progress["budget"] == 0 and progress["useful_shards"] == 8
        for p in running_pods(k8s, ns, "job-name=clamp-clients"):
            finish_pod(k8s, ns, p.metadata.name, 0)
        merge_pod = wait_for("merge pod", lambda: running_pods(k8s, ns, "job-name=clamp-merge"), timeout_s=60)[0]
        merge_args = as_local(merge_pod.spec.containers[0].args, job=str(job_file), out=str(tmp_path / "out"),
                              metrics_port="-1")
        assert merge_args[merge_args.index("--shards") + 1] == "8"
        r = subprocess.run([sys.executable, "-m", "sharetune_tuner.cli", *merge_args], capture_output=True,
                           text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        finish_pod(k8s, ns, merge_pod.metadata.name, 0)
        st = wait_for("Succeeded", lambda: (s := get_job(k8s, ns, "clamp")["status"]).get("phase") == "Succeeded"
                      and s, timeout_s=60)
        # Every trial the budget owed is measured and merged: the clamp lost nothing.
        assert st["trialsCompleted"] == 8 and [s["index"] for s in st["shards"]] == list(range(8))
        assert json.loads((tmp_path / "out" / "summary.json").read_text())["records"] == 8
        events = client.CoreV1Api(k8s).list_namespaced_event(ns, field_selector="involvedObject.name=clamp").items
        said = sorted(e.message for e in events if e.reason == "ShardsClamped")
        assert said == sorted([sized["message"], clamped["message"]])  # each once
    finally:
        for p in reversed(procs):
            p.stop(signal.SIGTERM)
