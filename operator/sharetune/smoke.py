"""`sharetune smoke-test`: apply a tiny CPU TuningJob and wait until it Succeeded (the chart's
`helm test` hook runs this in the cluster)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, cast

from .api.spec import API_GROUP, API_VERSION, PLURAL

TINY = {"model": {"name": "tiny_cnn", "inputShape": [1, 3, 32, 32]}, "target": "llvm",
        "trials": {"total": 8, "perTask": 2, "perIteration": 2}, "servers": {"replicas": 1},
        "clients": {"shards": 1, "builderWorkers": 1}, "ttlSecondsAfterFinished": 600}


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("smoke-test", help="apply a tiny CPU TuningJob and wait for it to succeed")
    p.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", "default"))
    p.add_argument("--name", default="sharetune-smoke")
    p.add_argument("--timeout", type=float, default=900)
    p.set_defaults(func=run)


def result_worth(status: dict[str, Any]) -> str:
    """What the result is worth, as the operator worded it in the job's Improved condition (a
    speed-up, or that tuning did not beat the defaults): never "1.0x faster"."""
    for c in status.get("conditions") or []:
        if c.get("type") == "Improved" and c.get("message"):
            return str(c["message"])
    if status.get("improved") is False or float(status.get("bestSpeedup") or 0) <= 1:
        return "not faster than untuned"
    return f"{status.get('bestSpeedup')}x faster than untuned"


def custom_objects_api() -> Any:
    """The TuningJob API of the cluster this runs in, else of the current kubeconfig (KUBECONFIG
    read now, not at import)."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    return client.CustomObjectsApi()


def run(a: argparse.Namespace) -> int:
    from kubernetes import client

    api = custom_objects_api()
    body = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "TuningJob", "metadata": {"name": a.name},
            "spec": TINY}
    try:
        api.delete_namespaced_custom_object(API_GROUP, API_VERSION, a.namespace, PLURAL, a.name)
        time.sleep(2)
    except client.ApiException as e:
        if e.status != 404:
            raise
    api.create_namespaced_custom_object(API_GROUP, API_VERSION, a.namespace, PLURAL, body)
    deadline = time.monotonic() + a.timeout
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        obj = cast(dict[str, Any], api.get_namespaced_custom_object(API_GROUP, API_VERSION, a.namespace, PLURAL,
                                                                    a.name))
        status = obj.get("status") or {}
        if status.get("phase") == "Succeeded":
            print(f"{a.name} succeeded: {status.get('trialsCompleted')} trials, {result_worth(status)}")
            return 0
        if status.get("phase") == "Failed":
            print(f"{a.name} failed: {status.get('message')}", file=sys.stderr)
            return 1
        time.sleep(5)
    print(f"{a.name} did not finish in {a.timeout:.0f}s (phase {status.get('phase')})", file=sys.stderr)
    return 1
