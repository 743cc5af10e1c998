"""Every dashboard panel's PromQL returns data from a real Prometheus (Debian's package) that
scrapes a real local tuning run (tracker, servers, clients) and the operator."""

from __future__ import annotations

import json
import shutil
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from sharetune.procs import ProcessGroup
from sharetune_dev.dashboard import PANELS

from ..helpers import wait_for
from ..tuner.conftest import EXAMPLE, free_port

pytestmark = [pytest.mark.cluster, pytest.mark.tvm]


def query(port: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    body = json.loads(urllib.request.urlopen(url, timeout=5).read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def test_every_panel_query_returns_data(tmp_path: Path, operator, k8s) -> None:
    from kubernetes import client
    from prometheus_client import start_http_server

    from sharetune.api.spec import load_job
    from sharetune.local.run import LocalRun

    prometheus = shutil.which("prometheus")
    assert prometheus, "Debian's prometheus package is installed by .ci/setup.sh"
    # The operator runs in this process (fixture): serve its registry, and give it a job to count.
    op_port = free_port()
    start_http_server(op_port, addr="127.0.0.1")
    client.CustomObjectsApi(k8s).create_namespaced_custom_object("sharetune.io", "v1alpha1", "default", "tuningjobs", {
        "apiVersion": "sharetune.io/v1alpha1", "kind": "TuningJob", "metadata": {"name": "counted"},
        "spec": {"model": {"name": "tiny_cnn"}}})

    run = LocalRun(load_job(EXAMPLE), EXAMPLE, tmp_path / "run")
    run.start_services()
    worker = threading.Thread(target=run.run_clients, daemon=True)
    prom = None
    try:
        worker.start()
        # Both clients running (a process is listed before it starts: wait for its metrics target).
        wait_for("clients started", lambda: sum(t in run.metrics_targets() for t in (
            f"127.0.0.1:{run.metrics_ports.get(f'client-{i}')}" for i in range(2))) == 2, 60)
        targets = [*run.metrics_targets(), f"127.0.0.1:{op_port}"]
        prom_port = free_port()
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "sharetune", "static_configs": [{"targets": targets}]}]}))
        prom = ProcessGroup("prometheus", [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                                           f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                           f"--web.listen-address=127.0.0.1:{prom_port}"],
                            tmp_path / "prometheus.log").start()
        cpu_panels = [p for p in PANELS if not p.gpu_only]
        missing: list[str] = []

        def all_answer() -> bool:
            missing.clear()
            for p in cpu_panels:
                for expr, _ in p.queries:
                    try:
                        if not query(prom_port, expr):
                            missing.append(p.title)
                    except OSError:
                        missing.append(p.title)
            return not missing

        # While the clients tune (their series vanish when they exit, as in a cluster).
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not all_answer():
            assert worker.is_alive(), f"tuning ended before every panel had data; missing: {missing}"
            time.sleep(2)
        assert not missing, f"panels without data: {missing}"
        # GPU panels (NVML, MPS) have data only where a GPU exists: on this CPU machine their
        # series must simply be absent, not broken queries.
        for p in PANELS:
            if p.gpu_only:
                for expr, _ in p.queries:
                    assert query(prom_port, expr) == []
        throughput = query(prom_port, PANELS[0].queries[0][0])
        assert any(r["metric"].get("tuning_job") == "tiny-cpu" for r in throughput)
    finally:
        if prom is not None:
            prom.stop(grace_s=20)
        run.stop_all()
        worker.join(timeout=30)
        client.CustomObjectsApi(k8s).delete_namespaced_custom_object("sharetune.io", "v1alpha1", "default",
                                                                      "tuningjobs", "counted")
