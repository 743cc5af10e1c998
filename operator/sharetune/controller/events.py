"""Events and phase changes on a TuningJob: the status conditions, a core/v1 Event, the metrics."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import kopf
from kubernetes import client

from ..api.spec import API_GROUP, API_VERSION, KIND
from . import metrics
from .status import FAILED, FINAL, RUNNING, SUCCEEDED, condition, now

log = logging.getLogger("sharetune.operator")


def post(api: client.ApiClient, body: Any, type_: str, reason: str, message: str) -> None:
    """A core/v1 Event on the TuningJob. Posted directly rather than through kopf's log-to-event
    bridge, which would also post every handler's chatter (or nothing, at a higher level)."""
    meta = body["metadata"]
    ts = dt.datetime.now(dt.timezone.utc)
    try:
        client.CoreV1Api(api).create_namespaced_event(meta["namespace"], client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{meta['name']}-", namespace=meta["namespace"]),
            involved_object=client.V1ObjectReference(api_version=f"{API_GROUP}/{API_VERSION}", kind=KIND,
                                                     name=meta["name"], namespace=meta["namespace"], uid=meta["uid"]),
            type=type_, reason=reason, message=message[:1024], first_timestamp=ts, last_timestamp=ts, count=1,
            source=client.V1EventSource(component="sharetune-operator"), reporting_component="sharetune-operator"))
    except client.ApiException as e:  # an event is best effort: never fail a reconcile for it
        log.warning("could not post event %s: %s", reason, e.reason)


def set_phase(api: client.ApiClient, body: Any, patch: kopf.Patch, phase: str, reason: str, message: str,
              generation: int | None, status: dict[str, Any]) -> None:
    """Moves the job to ``phase``: conditions, message, completion time, a metric and an Event."""
    conds = list(status.get("conditions") or [])
    conds = condition(conds, "Ready", "True" if phase == SUCCEEDED else "False", reason, message, generation)
    conds = condition(conds, "Failed", "True" if phase == FAILED else "False",
                      reason if phase == FAILED else "NotFailed",
                      message if phase == FAILED else "", generation)
    conds = condition(conds, "Tuning", "True" if phase == RUNNING else "False", reason, message, generation)
    patch.status["phase"] = phase
    patch.status["message"] = message
    patch.status["conditions"] = conds
    patch.status["observedGeneration"] = generation
    if phase in FINAL:
        patch.status["completionTime"] = now()
    metrics.TRANSITIONS.labels(phase).inc()
    post(api, body, "Warning" if phase == FAILED else "Normal", reason or phase, f"{phase}: {message}")
