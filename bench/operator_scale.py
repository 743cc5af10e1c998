"""Operator scale: 200 TuningJobs applied at once on the local control plane.

Measures, per job, the time from its creation to the moment all its children exist (the clients'
Indexed Job is created last), the time until every job is there, and the operator's peak RSS.
The operator runs as its own process (`sharetune operator`), as in a cluster.

    .venv/bin/python bench/operator_scale.py [--jobs 200]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "operator-scale.json"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=200)
    a = ap.parse_args()
    from kubernetes import client, config

    from sharetune.procs import ProcessGroup, free_port
    from sharetune_dev.cluster.harness import FakeNode, LocalCluster

    nodes = [FakeNode(f"kwok-cpu-{i}", gpus=0, pods=250) for i in range(4)]
    cluster = LocalCluster(nodes=nodes).start()
    op = None
    try:
        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        ext = client.ApiextensionsV1Api(api)
        ext.create_custom_resource_definition(
            yaml.safe_load((ROOT / "crds" / "tuningjobs.sharetune.io.yaml").read_text()))
        time.sleep(2)
        env = {**cluster.env(), "SHARETUNE_STATUS_INTERVAL": "3"}
        metrics_port = free_port()
        op = ProcessGroup("operator", [sys.executable, "-m", "sharetune.cli", "operator", "--metrics-port",
                                       str(metrics_port), "--liveness-port", "-1"],
                          cluster.workdir / "operator.log", env=env).start()
        time.sleep(5)
        objs, batch = client.CustomObjectsApi(api), client.BatchV1Api(api)
        created: dict[str, float] = {}
        seen: dict[str, float] = {}

        def create(i: int) -> None:
            body = {"apiVersion": "sharetune.io/v1alpha1", "kind": "TuningJob", "metadata": {"name": f"j{i:03d}"},
                    "spec": {"model": {"name": "tiny_cnn"}, "servers": {"replicas": 1}, "clients": {"shards": 1}}}
            created[body["metadata"]["name"]] = time.monotonic()
            objs.create_namespaced_custom_object("sharetune.io", "v1alpha1", "default", "tuningjobs", body)

        t0 = time.monotonic()
        threads = [threading.Thread(target=create, args=(i,)) for i in range(a.jobs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        applied_s = time.monotonic() - t0
        deadline = time.monotonic() + 300
        while len(seen) < a.jobs and time.monotonic() < deadline:
            for j in batch.list_namespaced_job("default", label_selector="app.kubernetes.io/component=client").items:
                job = j.metadata.labels["sharetune.io/job"]
                seen.setdefault(job, time.monotonic())
            time.sleep(0.2)
        per_job = sorted(seen[j] - created[j] for j in seen)
        import urllib.request

        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        buckets = []  # (upper bound, cumulative count) of the create handler's duration
        for line in text.splitlines():
            if line.startswith('sharetune_operator_reconcile_seconds_bucket{handler="create"'):
                le = line.split('le="')[1].split('"')[0]
                buckets.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
        total = buckets[-1][1] if buckets else 0

        def quantile(q: float) -> float | None:
            return next((b for b, c in buckets if total and c >= q * total), None)
        rss_kib = 0
        for line in Path(f"/proc/{op.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                rss_kib = int(line.split()[1])
        result = {
            "jobs": a.jobs, "jobs_with_all_children": len(seen), "apply_s": round(applied_s, 2),
            "p50_s": round(statistics.median(per_job), 3),
            "p95_s": round(per_job[int(0.95 * (len(per_job) - 1))], 3),
            "all_s": round(max(seen.values()) - t0, 2), "rss_mib": round(rss_kib / 1024, 1),
            "reconcile_p50_s_le": quantile(0.5), "reconcile_p95_s_le": quantile(0.95),
            "machine_cpus": os.cpu_count(),
            "note": "children per job: spec/shard/result ConfigMaps, ServiceAccount+Role+RoleBinding, tracker "
                    "Deployment+Service, servers Deployment, clients Indexed Job (created last, timed here). "
                    "p50_s/p95_s: job created -> all its children exist (includes queueing behind the other "
                    "199 jobs); reconcile_*_le: the create handler's own duration per job (histogram bucket "
                    "upper bound); rss_mib: the operator process's peak (VmHWM)",
        }
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
    finally:
        if op is not None:
            op.stop()
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
