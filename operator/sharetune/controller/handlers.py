"""The kopf reconciler: a thin shell over the pure planner (``sharetune.planner``) and status
logic (``status.py``).

- create/resume: parse the spec (a bad one -> Failed/InvalidSpec, no crash loop), create every
  planned child (idempotent), set Pending;
- spec.servers.replicas changes: scale the servers live;
- a timer every few seconds: read shard progress (the shards' ConfigMaps), the clients' Indexed
  Job, the merge Job and the daemon pod; start the merge when every shard is done; move the phase
  and conditions, emit an Event on every transition; TTL after finish.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes import client, config

from ..planner import (DEFAULT_IMAGE, JobRef, daemon_names, names, plan, plan_merge, result_location, servers_scale,
                       shard_object)
from ..api.spec import API_GROUP, API_VERSION, SpecError, TuningJobSpec, parse_spec
from . import kube, metrics
from .status import (FAILED, FINAL, MERGING, PENDING, RUNNING, SUCCEEDED, DaemonView, Observed, ShardView, condition,
                     mps_recovery, next_phase, now, progress_fields, started)

PLURAL = "tuningjobs"
log = logging.getLogger("sharetune.operator")
_api: client.ApiClient | None = None
TIMER_S = float(os.environ.get("SHARETUNE_STATUS_INTERVAL", "3"))


def api() -> client.ApiClient:
    global _api
    if _api is None:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
        _api = client.ApiClient(client.Configuration.get_default_copy())
    return _api


def image() -> str:
    return os.environ.get("SHARETUNE_TUNER_IMAGE", DEFAULT_IMAGE)


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """Credentials from the same loader the handlers use (in-cluster, else $KUBECONFIG read now:
    the kubernetes client reads $KUBECONFIG at import time, which breaks in-process tests)."""
    api()
    cfg = client.Configuration.get_default_copy()
    # In-cluster the client keeps "bearer <token>" under "BearerToken" (and refreshes it through
    # get_api_key_with_prefix); kubeconfig tokens come as "Bearer <token>" under "authorization".
    token = (cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix("authorization") or "")
    if token.lower().startswith("bearer "):
        token = token[len("bearer "):]
    return kopf.ConnectionInfo(
        server=cfg.host, ca_path=cfg.ssl_ca_cert, insecure=not cfg.verify_ssl,
        certificate_path=cfg.cert_file, private_key_path=cfg.key_file,
        scheme="Bearer" if token.strip() else None, token=token.strip() or None)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="sharetune.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="sharetune.io", key="last-handled-configuration")
    settings.persistence.finalizer = "sharetune.io/cleanup"
    settings.posting.level = logging.WARNING  # kopf's own chatter stays in logs, our Events are explicit
    settings.watching.server_timeout = 300
    settings.queueing.worker_limit = 32
    # Handlers are sync and spend their time waiting on the API server: more threads than the
    # asyncio default (min(32, cpus + 4) = 6 on 2 cores) lets a burst of jobs proceed together.
    settings.execution.max_workers = 24
    api()


def _spec_or_fail(name: str, spec: dict[str, Any], body: Any, patch: kopf.Patch, generation: int | None
                  ) -> TuningJobSpec | None:
    try:
        return parse_spec(name, dict(spec))
    except SpecError as e:
        metrics.ERRORS.labels("create", "InvalidSpec").inc()
        _set_phase(body, patch, FAILED, "InvalidSpec", str(e), generation, {})
        return None


def _set_phase(body: Any, patch: kopf.Patch, phase: str, reason: str, message: str, generation: int | None,
               status: dict[str, Any]) -> None:
    conds = list(status.get("conditions") or [])
    conds = condition(conds, "Ready", "True" if phase == SUCCEEDED else "False", reason, message, generation)
    conds = condition(conds, "Failed", "True" if phase == FAILED else "False", reason if phase == FAILED else "NotFailed",
                      message if phase == FAILED else "", generation)
    conds = condition(conds, "Tuning", "True" if phase == RUNNING else "False", reason, message, generation)
    patch.status["phase"] = phase
    patch.status["message"] = message
    patch.status["conditions"] = conds
    patch.status["observedGeneration"] = generation
    if phase in FINAL:
        patch.status["completionTime"] = now()
    metrics.TRANSITIONS.labels(phase).inc()
    event(body, "Warning" if phase == FAILED else "Normal", reason or phase, f"{phase}: {message}")


def event(body: Any, type_: str, reason: str, message: str) -> None:
    """A core/v1 Event on the TuningJob. Posted directly rather than through kopf's log-to-event
    bridge, which would also post every handler's chatter (or nothing, at a higher level)."""
    meta = body["metadata"]
    ts = dt.datetime.now(dt.timezone.utc)
    try:
        client.CoreV1Api(api()).create_namespaced_event(meta["namespace"], client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{meta['name']}-", namespace=meta["namespace"]),
            involved_object=client.V1ObjectReference(api_version=f"{API_GROUP}/{API_VERSION}", kind="TuningJob",
                                                     name=meta["name"], namespace=meta["namespace"], uid=meta["uid"]),
            type=type_, reason=reason, message=message[:1024], first_timestamp=ts, last_timestamp=ts, count=1,
            source=client.V1EventSource(component="sharetune-operator"), reporting_component="sharetune-operator"))
    except client.ApiException as e:  # an event is best effort: never fail a reconcile for it
        log.warning("could not post event %s: %s", reason, e.reason)


@kopf.on.create(API_GROUP, API_VERSION, PLURAL)
@kopf.on.resume(API_GROUP, API_VERSION, PLURAL)
def ensure_children(body: Any, name: str, namespace: str, uid: str, spec: Any, status: Any, meta: Any,
                    patch: kopf.Patch, **_: Any) -> None:
    t0 = time.monotonic()
    if status.get("phase") in FINAL:
        return
    s = _spec_or_fail(name, spec, body, patch, meta.get("generation"))
    if s is None:
        return
    job = JobRef(name, namespace, uid)
    created = 0
    try:
        objs = plan(job, s, image())
    except Exception as e:  # a spec the parser let through but the planner cannot use: fail, don't loop
        log.exception("planning %s/%s", namespace, name)
        metrics.ERRORS.labels("create", "PlanError").inc()
        _set_phase(body, patch, FAILED, "InvalidSpec", f"cannot plan this job: {type(e).__name__}: {e}",
                   meta.get("generation"), dict(status))
        return
    for obj in objs:
        try:
            if kube.create(api(), obj):
                created += 1
                metrics.CHILDREN.labels(obj["kind"]).inc()
        except (client.ApiException, ValueError, TypeError) as e:
            if isinstance(e, client.ApiException) and not kube.is_rejection(e):
                raise  # the API server is down or busy: kopf retries
            # The API server (or the client's own model validation, a ValueError) refuses a child
            # built from this spec (a malformed affinity, image or resources, a quota): retrying
            # cannot help, so the job fails with the refusal's words.
            why = kube.reason(e) if isinstance(e, client.ApiException) else " ".join(str(e).split())[:500]
            metrics.ERRORS.labels("create", "ChildRejected").inc()
            _set_phase(body, patch, FAILED, "ChildRejected", f"{obj['kind']} {obj['metadata']['name']} rejected: {why}",
                       meta.get("generation"), dict(status))
            return
    if not status.get("phase"):
        patch.status["startTime"] = now()
        patch.status["resultLocation"] = result_location(job, s)
        _set_phase(body, patch, PENDING, "Created", f"created {created} child objects", meta.get("generation"),
                   dict(status))
    metrics.RECONCILE.labels("create").observe(time.monotonic() - t0)


@kopf.on.field(API_GROUP, API_VERSION, PLURAL, field="spec.servers.replicas")
def scale(name: str, namespace: str, new: Any, old: Any, body: Any, status: Any, **_: Any) -> None:
    if old is None or new is None or status.get("phase") in FINAL:
        return
    try:
        s = parse_spec(name, dict(body.get("spec") or {}))
    except SpecError:
        return
    for deployment, replicas in servers_scale(name, s, int(new)):
        kube.scale_servers(api(), namespace, deployment, replicas)
    event(body, "Normal", "Scaled", f"servers scaled from {old} to {new}" + (f" per GPU ({s.gpus} GPUs)" if s.gpus > 1 else ""))


@dataclass
class Snapshot:
    """The operator's children across the watched namespaces, listed once per status tick:
    three list calls per tick in all, instead of several reads per job (measured with 200 jobs:
    the per-job reads were what kept the API server busy)."""

    configmaps: dict[tuple[str, str], Any]
    jobs: dict[tuple[str, str], Any]
    daemons: dict[tuple[str, str], Any]
    pending_pods: dict[tuple[str, str], Any] = field(default_factory=dict)  # Pending only: cheap when all run


def snapshot() -> Snapshot:
    core, batch = client.CoreV1Api(api()), client.BatchV1Api(api())
    sel = "app.kubernetes.io/managed-by=sharetune"

    def index(items: list[Any]) -> dict[tuple[str, str], Any]:
        return {(o.metadata.namespace, o.metadata.name): o for o in items}

    if NAMESPACES:
        cms = [o for ns in NAMESPACES for o in core.list_namespaced_config_map(ns, label_selector=sel).items]
        jobs = [o for ns in NAMESPACES for o in batch.list_namespaced_job(ns, label_selector=sel).items]
        pods = [o for ns in NAMESPACES for o in core.list_namespaced_pod(
            ns, label_selector=sel + ",app.kubernetes.io/component=mps-daemon").items]
        pending = [o for ns in NAMESPACES for o in core.list_namespaced_pod(
            ns, label_selector=sel, field_selector="status.phase=Pending").items]
    else:
        cms = core.list_config_map_for_all_namespaces(label_selector=sel).items
        jobs = batch.list_job_for_all_namespaces(label_selector=sel).items
        pods = core.list_pod_for_all_namespaces(label_selector=sel + ",app.kubernetes.io/component=mps-daemon").items
        pending = core.list_pod_for_all_namespaces(label_selector=sel, field_selector="status.phase=Pending").items
    return Snapshot(index(cms), index(jobs), index(pods), index(pending))


def _unschedulable(pod: Any) -> str | None:
    """The scheduler's message for a pod it cannot place."""
    for c in (pod.status.conditions or []) if pod.status else []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return c.message
    return None


def _secret_problem(namespace: str, s: TuningJobSpec) -> str | None:
    """The S3 Secret the pods' env refers to: missing (or a key missing) means pods that never
    start (CreateContainerConfigError), so the job says so while it waits for it."""
    s3 = s.output.s3
    if s3 is None:
        return None
    sec = kube.read_or_none(client.CoreV1Api(api()).read_namespaced_secret, s3.secret_name, namespace)
    if sec is None:
        return f"Secret {s3.secret_name} (output.s3.credentialsSecret) does not exist in {namespace}"
    missing = [k for k in (s3.access_key_id_key, s3.secret_access_key_key) if k not in (sec.data or {})]
    if missing:
        return f"Secret {s3.secret_name} has no key(s) {', '.join(missing)}"
    return None


def observe(job: JobRef, s: TuningJobSpec, snap: Snapshot) -> Observed:
    n = names(job.name)
    ns = job.namespace
    shards = []
    for i in range(s.shards):
        cm = snap.configmaps.get((ns, shard_object(job.name, i)))
        shards.append(ShardView.from_progress(i, (cm.data or {}).get("progress.json") if cm else None))
    obs = Observed(shards=shards)
    cj = snap.jobs.get((ns, n["clients"]))
    if cj is not None and cj.status is not None:
        obs.clients_succeeded = cj.status.succeeded or 0
        obs.clients_failed_indexes = cj.status.failed_indexes
        for c in cj.status.conditions or []:
            if c.type == "Failed" and c.status == "True":
                obs.clients_failed, obs.clients_failed_message = True, f"{c.reason}: {c.message}"
    mj = snap.jobs.get((ns, n["merge"]))
    if mj is not None:
        obs.merge_exists = True
        for c in (mj.status.conditions or []) if mj.status else []:
            if c.type == "Complete" and c.status == "True":
                obs.merge_succeeded = True
            if c.type == "Failed" and c.status == "True":
                obs.merge_failed, obs.merge_message = True, f"{c.reason}: {c.message}"
    if obs.merge_succeeded:
        cm = snap.configmaps.get((ns, s.output.config_map or n["result"]))
        text = (cm.data or {}).get("summary.json") if cm else None
        obs.summary = json.loads(text) if text else None
    for g, daemon_name, _ in daemon_names(job.name, s) if s.uses_mps else []:
        pod = snap.daemons.get((ns, daemon_name))
        view = obs.daemons.setdefault(str(g or 0), DaemonView())
        if pod is not None:
            obs.daemon_unschedulable = _unschedulable(pod) or obs.daemon_unschedulable
            phase = pod.status.phase if pod.status else None
            ended = phase in ("Failed", "Succeeded") or pod.metadata.deletion_timestamp is not None
            view.state = "failed" if ended else ("running" if phase == "Running" else "pending")
            view.restarts = sum(c.restart_count or 0 for c in (pod.status.container_statuses or []))
    for (pns, _), pod in snap.pending_pods.items():
        if pns == ns and (pod.metadata.labels or {}).get("sharetune.io/job") == job.name:
            why = _unschedulable(pod)
            if why:
                obs.unschedulable = f"{pod.metadata.labels.get('app.kubernetes.io/component', 'pod')}: {why}"
                break
    if s.output.s3 is not None and not started(shards):
        obs.secret_problem = _secret_problem(ns, s)
    return obs


def recover_mps_daemon(body: dict[str, Any], job: JobRef, s: TuningJobSpec, obs: Observed, patch: kopf.Patch) -> None:
    """Per GPU group: a dead daemon is replaced, and its servers restarted against the new one."""
    status = body.get("status") or {}
    seen_by_gpu = dict(status.get("mpsDaemonRestartsByGpu") or {})
    recovered = 0
    for g, daemon_name, servers_name in daemon_names(job.name, s):
        key = str(g or 0)
        view = obs.daemons.get(key, DaemonView())
        recreate, restart_servers = mps_recovery(view, status.get("phase"), int(seen_by_gpu.get(key, 0)))
        if recreate:
            if view.state == "failed":
                kube.read_or_none(client.CoreV1Api(api()).delete_namespaced_pod, daemon_name, job.namespace)
            daemon = next(o for o in plan(job, s, image()) if o["kind"] == "Pod" and o["metadata"]["name"] == daemon_name)
            if not kube.create(api(), daemon):
                continue  # the old pod is still being deleted: try again next tick
            metrics.CHILDREN.labels("Pod").inc()
        if restart_servers:
            kube.restart_deployment(api(), job.namespace, servers_name)
            # Restarts of the current daemon pod already answered (a new pod starts from 0).
            seen_by_gpu[key] = 0 if recreate else view.restarts
            recovered += 1
            event(body, "Warning", "MpsDaemonRestarted",
                  f"MPS control daemon {daemon_name} " + ("replaced" if recreate else "restarted in place")
                  + f"; tuning servers {servers_name} restarted against it")
    if recovered:
        patch.status["mpsDaemonRestartsByGpu"] = seen_by_gpu
        patch.status["mpsRecoveries"] = int(status.get("mpsRecoveries", 0)) + recovered


# Status is refreshed by one operator-wide loop rather than a kopf timer per job: kopf puts a
# finalizer on every object that has timers, and a TuningJob should carry one only when it asked
# for external cleanup. One list per tick also scales better than a timer per job.
NAMESPACES: list[str] = []  # empty = cluster-wide (set by `sharetune operator --namespace`)


@kopf.on.startup()
async def start_status_loop(memo: kopf.Memo, **_: Any) -> None:
    import asyncio

    async def loop() -> None:
        while True:
            await asyncio.sleep(TIMER_S)
            try:
                await asyncio.to_thread(reconcile_all)
            except Exception as e:  # never let the loop die: log, count, go on
                metrics.ERRORS.labels("status", type(e).__name__).inc()
                log.exception("status loop: %s", e)

    memo["status_loop"] = asyncio.get_running_loop().create_task(loop())


@kopf.on.cleanup()
async def stop_status_loop(memo: kopf.Memo, **_: Any) -> None:
    task = memo.get("status_loop")
    if task is not None:
        task.cancel()


def reconcile_all() -> None:
    objs = client.CustomObjectsApi(api())
    if NAMESPACES:
        items = [j for ns in NAMESPACES
                 for j in objs.list_namespaced_custom_object(API_GROUP, API_VERSION, ns, PLURAL)["items"]]
    else:
        items = objs.list_cluster_custom_object(API_GROUP, API_VERSION, PLURAL)["items"]
    active = [b for b in items if not b["metadata"].get("deletionTimestamp")
              and (b.get("status") or {}).get("phase") not in FINAL]
    snap = snapshot() if active else Snapshot({}, {}, {})
    for body in items:
        if body["metadata"].get("deletionTimestamp"):
            continue
        patch = kopf.Patch()
        try:
            reconcile_status(body, patch, snap)
        except client.ApiException as e:
            metrics.ERRORS.labels("status", str(e.status)).inc()
            log.warning("status of %s/%s: %s", body["metadata"]["namespace"], body["metadata"]["name"], e.reason)
            continue
        if patch:
            try:
                objs.patch_namespaced_custom_object_status(API_GROUP, API_VERSION, body["metadata"]["namespace"],
                                                           PLURAL, body["metadata"]["name"], dict(patch))
            except client.ApiException as e:
                if e.status != 404:  # deleted meanwhile
                    raise


def reconcile_status(body: dict[str, Any], patch: kopf.Patch, snap: Snapshot) -> None:
    t0 = time.monotonic()
    meta, spec, status = body["metadata"], body.get("spec") or {}, body.get("status") or {}
    name, namespace = meta["name"], meta["namespace"]
    phase = status.get("phase")
    if phase in FINAL:
        _maybe_expire(name, namespace, spec, status)
        return
    if phase is None:
        return  # the create handler has not run yet
    try:
        s = parse_spec(name, dict(spec))
    except SpecError:
        return
    job = JobRef(name, namespace, meta["uid"])
    obs = observe(job, s, snap)
    if s.uses_mps:
        recover_mps_daemon(body, job, s, obs, patch)
    if obs.clients_succeeded >= s.shards and not obs.merge_exists and not obs.clients_failed:
        if kube.create(api(), plan_merge(job, s, image())):
            metrics.CHILDREN.labels("Job").inc()
    new_phase, reason, message = next_phase(phase, obs, s.shards)
    for k, v in progress_fields(obs, status.get("startTime")).items():
        if status.get(k) != v:
            patch.status[k] = v
    if obs.summary is not None and new_phase == SUCCEEDED:
        patch.status["bestSpeedup"] = obs.summary.get("speedup")
        patch.status["untunedLatencyMs"] = obs.summary.get("latency_untuned_ms")
        patch.status["tunedLatencyMs"] = obs.summary.get("latency_tuned_ms")
        patch.status["trialsCompleted"] = obs.summary.get("records")
        patch.status["progressPercent"] = 100
    last = _last_reason(status)
    # While Pending the reason and its message are news (GPU busy, Secret missing or lacking a key,
    # and back to Starting once fixed); Created -> Starting is not.
    changed = reason != last or message != status.get("message")
    if new_phase != phase or (new_phase == PENDING and changed and (last, reason) != ("Created", "Starting")):
        _set_phase(body, patch, new_phase, reason, message, meta.get("generation"), dict(status))
    metrics.RECONCILE.labels("status").observe(time.monotonic() - t0)


def _last_reason(status: Any) -> str | None:
    for c in status.get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("reason")
    return None


def _maybe_expire(name: str, namespace: str, spec: Any, status: Any) -> None:
    ttl = spec.get("ttlSecondsAfterFinished")
    done = status.get("completionTime")
    if ttl is None or not done:
        return
    finished = dt.datetime.fromisoformat(done.replace("Z", "+00:00"))
    if (dt.datetime.now(dt.timezone.utc) - finished).total_seconds() >= ttl:
        client.CustomObjectsApi(api()).delete_namespaced_custom_object(API_GROUP, API_VERSION, namespace, PLURAL, name)


@kopf.on.event(API_GROUP, API_VERSION, PLURAL)
def count_phases(event: Any, **_: Any) -> None:
    """Keeps the jobs-by-phase gauge from the watch stream itself (no extra API calls)."""
    _phases[event["object"]["metadata"]["uid"]] = (event["object"].get("status") or {}).get("phase", "Pending")
    if event["type"] == "DELETED":
        _phases.pop(event["object"]["metadata"]["uid"], None)
    counts: dict[str, int] = {p: 0 for p in (PENDING, RUNNING, MERGING, SUCCEEDED, FAILED)}
    for p in _phases.values():
        counts[p] = counts.get(p, 0) + 1
    for p, n in counts.items():
        metrics.JOBS.labels(p).set(n)


_phases: dict[str, str] = {}


def _cleanup_requested(spec: Any, **_: Any) -> bool:
    return bool(((spec.get("output") or {}).get("s3") or {}).get("cleanupOnDelete"))


@kopf.on.delete(API_GROUP, API_VERSION, PLURAL, when=_cleanup_requested)
def cleanup_s3(name: str, namespace: str, spec: Any, body: Any, **_: Any) -> None:
    """Only jobs that asked for it get a finalizer (kopf adds one for matching delete handlers):
    their objects in the bucket go with them. Children go by garbage collection either way."""
    import base64

    import boto3

    s3 = parse_spec(name, dict(spec)).output.s3
    assert s3 is not None
    secret = client.CoreV1Api(api()).read_namespaced_secret(s3.secret_name, namespace)
    data = secret.data or {}
    bucket = boto3.client("s3", endpoint_url=s3.endpoint or None, region_name=s3.region,
                          aws_access_key_id=base64.b64decode(data[s3.access_key_id_key]).decode(),
                          aws_secret_access_key=base64.b64decode(data[s3.secret_access_key_key]).decode())
    prefix = (f"{s3.prefix}/" if s3.prefix else "") + f"{namespace}/{name}"
    deleted = 0
    for page in bucket.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            bucket.delete_object(Bucket=s3.bucket, Key=obj["Key"])
            deleted += 1
    log.info("deleted %d objects under s3://%s/%s", deleted, s3.bucket, prefix)
