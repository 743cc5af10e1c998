"""Default resource requests of the pods the planner makes: the chart's ``defaultRequests`` values
(passed as an environment variable). Pure: standard library only.

A pod without requests is BestEffort: the first evicted under memory pressure, and an evicted
GPU pool daemon takes every co-tenant's servers with it. Each container the planner makes gets
these requests unless the job's spec gives it resources of its own; no limits are added (a
limit below a TVM build's peak would kill it; the spec sets limits where a user wants them).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

ENV = "SHARETUNE_DEFAULT_REQUESTS"  # chart value: defaultRequests
# Per container name (the planner's). Small on purpose: requests reserve, so they must fit the
# smallest node that runs a job; tuner processes that import TVM get more memory than the rest.
DEFAULT_REQUESTS: dict[str, dict[str, str]] = {
    "mps-daemon": {"cpu": "50m", "memory": "64Mi"},
    "mps-dir": {"cpu": "10m", "memory": "64Mi"},  # the daemon pods' init container: seconds, one chown walk
    "tracker": {"cpu": "50m", "memory": "128Mi"},
    "server": {"cpu": "100m", "memory": "512Mi"},
    "client": {"cpu": "100m", "memory": "512Mi"},
    "builder": {"cpu": "100m", "memory": "512Mi"},
    "merge": {"cpu": "100m", "memory": "512Mi"},
    "s3-cleanup": {"cpu": "50m", "memory": "128Mi"},  # lists and deletes a deleted job's S3 objects
}


class RequestsConfigError(ValueError):
    """A bad defaultRequests value: the operator stops at start, naming it."""


def from_env(env: Mapping[str, str]) -> dict[str, dict[str, str]]:
    """The defaults with the chart's values laid over them (per container, per resource)."""
    raw = env.get(ENV, "").strip()
    out = copy.deepcopy(DEFAULT_REQUESTS)
    if not raw:
        return out
    try:
        given = json.loads(raw)
    except ValueError as e:
        raise RequestsConfigError(f"{ENV} (defaultRequests) is not JSON: {e}") from None
    if not isinstance(given, dict) or not all(
            k in DEFAULT_REQUESTS and isinstance(v, dict) and all(isinstance(x, str) for x in v.values())
            for k, v in given.items()):
        raise RequestsConfigError(f"{ENV} (defaultRequests): expected a map of {', '.join(DEFAULT_REQUESTS)} "
                                  f"to {{cpu: ..., memory: ...}}; got {raw[:200]}")
    for name, req in given.items():
        out[name].update(req)
    return out


def pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod spec of a Pod, or of a Deployment's or Job's template; none for other kinds."""
    spec = obj.get("spec") or {}
    if obj.get("kind") == "Pod":
        return [spec]
    tmpl = spec.get("template", {}).get("spec")
    return [tmpl] if tmpl else []


def with_default_requests(objs: list[dict[str, Any]], defaults: Mapping[str, Mapping[str, str]] | None = None
                          ) -> list[dict[str, Any]]:
    """``objs`` with every container that has no requests given its name's defaults (in place)."""
    table = DEFAULT_REQUESTS if defaults is None else defaults
    for obj in objs:
        for pod in pod_specs(obj):
            for c in [*pod.get("initContainers", []), *pod.get("containers", [])]:
                req = table.get(c["name"])
                if req and not (c.get("resources") or {}).get("requests"):
                    c.setdefault("resources", {})["requests"] = dict(req)
    return objs
