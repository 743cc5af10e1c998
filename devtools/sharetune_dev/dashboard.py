"""The Grafana dashboard, as code (grafana-foundation-sdk), and the PromQL behind every panel.

    python -m sharetune_dev.dashboard > helm/sharetune/files/dashboard.json

The chart ships the JSON in a ConfigMap labelled for Grafana's dashboard sidecar; a test renders
it again to catch drift, and another runs every panel's query against a real Prometheus that
scraped a real tuning run. Developer tooling (grafana-foundation-sdk is a dev-only dependency):
the product ships only the generated JSON.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str
    queries: tuple[tuple[str, str], ...]  # (PromQL, legend)
    gpu_only: bool = False  # NVML/MPS series exist only where a GPU does
    kind: str = "timeseries"


PANELS: tuple[Panel, ...] = (
    Panel("Tuning throughput per job", "ops", (
        ('sum by (tuning_job) (rate(sharetune_trials_total[1m]))', "{{tuning_job}}"),)),
    Panel("Tuning throughput per shard", "ops", (
        ('sum by (tuning_job, shard) (rate(sharetune_trials_total[1m]))', "{{tuning_job}} shard {{shard}}"),)),
    Panel("Progress", "percentunit", (
        ('sum by (tuning_job) (sharetune_shard_trials_done) / sum by (tuning_job) (sharetune_shard_trials_budget)',
         "{{tuning_job}}"),), kind="stat"),
    Panel("Best latency per task", "s", (
        ('min by (tuning_job, task) (sharetune_best_latency_seconds)', "{{tuning_job}} {{task}}"),)),
    Panel("Build and run error rate", "percentunit", (
        ('sum by (tuning_job, status) (rate(sharetune_trials_total{status=~"build_error|run_error"}[5m]))'
         ' / ignoring(status) group_left sum by (tuning_job) (rate(sharetune_trials_total[5m]))',
         "{{tuning_job}} {{status}}"),)),
    Panel("Time per tuning phase", "s", (
        ('sum by (tuning_job, phase) (rate(sharetune_phase_seconds_total[1m]))', "{{tuning_job}} {{phase}}"),)),
    # The tuning library and the job's other shards (docs/library.md): 0 for jobs without them.
    Panel("Records learnt from the library and other shards, tasks reused", "short", (
        ('sum by (tuning_job, use) (sharetune_library_records_total)', "{{tuning_job}} {{use}}"),
        ('sum by (tuning_job) (sharetune_peer_records_total)', "{{tuning_job}} other shards"),
        ('sum by (tuning_job) (sharetune_library_tasks_reused)', "{{tuning_job}} tasks reused"))),
    Panel("RPC servers registered", "short", (
        ('sum by (key) (sharetune_rpc_servers_registered)', "{{key}}"),)),
    Panel("GPU utilisation per server", "percent", (
        ('max by (server, gpu) (sharetune_gpu_utilization_percent)', "{{server}} gpu{{gpu}}"),), gpu_only=True),
    Panel("GPU memory per server", "bytes", (
        ('max by (server, gpu) (sharetune_gpu_memory_used_bytes)', "{{server}} gpu{{gpu}}"),), gpu_only=True),
    Panel("MPS thread percentage per server", "percent", (
        ('max by (server) (sharetune_mps_thread_percentage)', "{{server}}"),), gpu_only=True),
    Panel("Jobs by phase", "short", (
        ('sum by (phase) (sharetune_operator_jobs)', "{{phase}}"),), kind="stat"),
    # GPU pools (docs/gpu-pools.md): the operator's share ledger. Booked shares exist only where
    # pool-mode jobs run; the queue and the wait are always exported.
    Panel("GPU share booked per GPU (pools)", "percent", (
        ('max by (node, gpu) (sharetune_gpu_allocated_share_percent)', "{{node}}/{{gpu}}"),), gpu_only=True),
    Panel("Jobs waiting for a GPU share, and their wait", "short", (
        ('max(sharetune_gpu_queue_length)', "queued"),
        ('histogram_quantile(0.9, sum by (le) (rate(sharetune_gpu_wait_seconds_bucket[15m])))', "p90 wait (s)"))),
)


def build() -> dict[str, Any]:
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.builders import prometheus, stat, timeseries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import DataSourceRef

    ds = DataSourceRef(type_val="prometheus", uid="${datasource}")
    d = (db.Dashboard("sharetune: GPU-shared tuning").uid("sharetune-tuning").tags(["sharetune", "tvm"])
         .refresh("10s").time("now-1h", "now").timezone("browser")
         .with_variable(db.DatasourceVariable("datasource").label("Prometheus").type("prometheus")))
    for p in PANELS:
        b = (stat.Panel() if p.kind == "stat" else timeseries.Panel()).title(p.title).unit(p.unit).datasource(ds)
        b = b.height(8).span(12 if p.kind == "timeseries" else 6)
        for i, (expr, legend) in enumerate(p.queries):
            b = b.with_target(prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(65 + i)))
        d = d.with_panel(b)
    return json.loads(json.dumps(d.build(), cls=JSONEncoder))


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
