"""Who may connect to a job's pods: the chart's ``networkPolicy`` values (passed as environment
variables) and the job's NetworkPolicy. Pure: standard library only.

A TVM RPC server runs the modules it is sent and the tracker hands out servers to whoever asks
with the right key, so a job's tracker, servers and builders must be reachable only from that
job's own pods. The policy selects every pod of the job (they all carry ``sharetune.io/job``),
lets in the job's own pods on any port and the scrapers the chart names on the metrics port only.
Egress is left open: clients and the merge reach the model URL and the S3 store.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

ENV = {
    "SHARETUNE_NETWORK_POLICY": "networkPolicy.enabled",
    "SHARETUNE_METRICS_SCRAPERS": "networkPolicy.metricsScrapers",
}
JOB_LABEL = "sharetune.io/job"
# Any pod of any namespace, on the metrics port only: what a Prometheus anywhere in the cluster
# needs. The chart's values narrow it (e.g. to the monitoring namespace).
ANY_POD: tuple[Mapping[str, Any], ...] = ({"namespaceSelector": {}},)


class NetworkConfigError(ValueError):
    """A bad networkPolicy setting: the operator stops at start, naming the variable and value."""


@dataclass(frozen=True)
class NetworkConfig:
    enabled: bool = True
    metrics_scrapers: tuple[Mapping[str, Any], ...] = field(default=ANY_POD)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "NetworkConfig":
        d = cls()
        enabled_raw = env.get("SHARETUNE_NETWORK_POLICY", "").strip().lower()
        if enabled_raw not in ("", "true", "false"):
            raise NetworkConfigError(f"SHARETUNE_NETWORK_POLICY={enabled_raw!r} ({ENV['SHARETUNE_NETWORK_POLICY']}): "
                                     "expected true or false")
        scrapers_raw = env.get("SHARETUNE_METRICS_SCRAPERS", "").strip()
        scrapers = d.metrics_scrapers
        if scrapers_raw:
            try:
                parsed = json.loads(scrapers_raw)
            except ValueError as e:
                raise NetworkConfigError(f"SHARETUNE_METRICS_SCRAPERS ({ENV['SHARETUNE_METRICS_SCRAPERS']}) is not "
                                         f"JSON: {e}") from None
            if not isinstance(parsed, list) or not all(
                    isinstance(p, dict) and p and set(p) <= {"namespaceSelector", "podSelector", "ipBlock"}
                    for p in parsed):
                raise NetworkConfigError(
                    f"SHARETUNE_METRICS_SCRAPERS ({ENV['SHARETUNE_METRICS_SCRAPERS']}): expected a list of "
                    "NetworkPolicy peers, each with namespaceSelector, podSelector or ipBlock; got "
                    f"{scrapers_raw[:200]}")
            scrapers = tuple(parsed)
        return cls(enabled=enabled_raw != "false", metrics_scrapers=scrapers)


def job_policy(name: str, namespace: str, job: str, metrics_port: int, cfg: NetworkConfig,
               metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    """The job's NetworkPolicy (None when the chart turned them off). ``metadata``: the job's
    usual child metadata (labels, owner), completed with ``name``."""
    if not cfg.enabled:
        return None
    own = {"podSelector": {"matchLabels": {JOB_LABEL: job}}}
    ingress: list[dict[str, Any]] = [{"from": [own]}]
    if cfg.metrics_scrapers:
        ingress.append({"from": [dict(p) for p in cfg.metrics_scrapers],
                        "ports": [{"protocol": "TCP", "port": metrics_port}]})
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {**dict(metadata), "name": name, "namespace": namespace},
            "spec": {"podSelector": {"matchLabels": {JOB_LABEL: job}}, "policyTypes": ["Ingress"],
                     "ingress": ingress}}
