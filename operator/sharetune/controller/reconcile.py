"""What the operator does for a TuningJob, as plain functions of a :class:`Context` (the kopf
registration in ``handlers.py`` only calls these):

- ``ensure_children``: parse the spec (a bad one -> Failed/InvalidSpec, no crash loop), create
  every planned child (idempotent), set Pending;
- ``scale``: ``spec.servers.replicas`` changed: scale the servers live;
- ``reconcile_all``: every few seconds, one snapshot of the children; per job: read shard progress,
  the clients' Indexed Job, the merge Job and the daemon pods; start the merge when every shard is
  done; move the phase and conditions (an Event on every transition); TTL after finish.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Mapping
from typing import Any, cast

import kopf
from kubernetes import client

from ..admission import placement_of
from ..api.spec import (
    API_GROUP,
    API_VERSION,
    PLURAL,
    SpecError,
    TuningJobSpec,
    check_image_allowed,
    check_runs_on_cluster,
    library_scope,
    spec_of,
    ttl_of,
)
from ..api.topology import ChildNames, gpu_groups, pool_pod_name
from ..gpushare import WAITING, device_plugin_message
from ..planner import (
    JobRef,
    daemon_names,
    pin_servers_patch,
    pins_gpu,
    pins_gpu_in,
    plan,
    plan_clients,
    plan_merge,
    result_location,
    servers_scale,
)
from ..sharing import DEVICE_PLUGIN, EXCLUSIVE, POOL, Sharing
from . import events, gpupool, kube, metrics
from .context import Context
from .observe import Snapshot, observe, published, snapshot
from .status import (
    FAILED,
    FINAL,
    PENDING,
    SUCCEEDED,
    DaemonView,
    Observed,
    condition,
    improved_condition,
    mps_recovery,
    next_phase,
    now,
    progress_fields,
    result_fields,
)

log = logging.getLogger("sharetune.operator")


def _spec_or_fail(ctx: Context, name: str, spec: Any, body: Any, patch: kopf.Patch, generation: int | None
                  ) -> TuningJobSpec | None:
    try:
        s = spec_of(body)
        check_runs_on_cluster(s)  # spec.model.onnx.path: a file on a laptop, not in a pod
        check_image_allowed(s.raw.get("image"), ctx.allowed_images)
        library_scope(s.library, body["metadata"]["namespace"], ctx.library.shared_scopes)  # another team's: refused
        return s
    except SpecError as e:
        metrics.ERRORS.labels("create", "InvalidSpec").inc()
        events.set_phase(ctx.api, body, patch, FAILED, "InvalidSpec", str(e), generation, {})
        return None


def _sharing(ctx: Context, s: TuningJobSpec, status: Any) -> tuple[Sharing | None, bool]:
    """(the planner's sharing input, whether the job must wait): a pool-mode job is planned only
    once the ledger has placed it (``status.gpuPlacement``, written by the GPU tick)."""
    mode = ctx.sharing.mode_of(s)
    if mode == POOL:
        placement = placement_of(status)
        if placement is None:
            return None, True
        return ctx.sharing.sharing_of(s, placement), False
    return ctx.sharing.sharing_of(s), False


def ensure_children(ctx: Context, body: Any, name: str, namespace: str, uid: str, spec: Any, status: Any, meta: Any,
                    patch: kopf.Patch) -> None:
    if status.get("phase") in FINAL:
        return
    s = _spec_or_fail(ctx, name, spec, body, patch, meta.get("generation"))
    if s is None:
        return
    job = JobRef(name, namespace, uid)
    _say_mode(ctx, body, s, status, patch)
    sharing, wait = _sharing(ctx, s, status)
    if wait:  # the GPU tick books a share, then creates the children (gpupool.py)
        if not status.get("phase"):
            patch.status["startTime"] = now()
            patch.status["resultLocation"] = result_location(job, s)
            events.set_phase(ctx.api, body, patch, PENDING, WAITING,
                             f"waiting for a GPU share of {s.sharing.share}% (mode pool): the operator books one "
                             f"on its next tick", meta.get("generation"), dict(status))
        return
    create_children(ctx, body, job, s, sharing, dict(status), meta.get("generation"), patch)


def _say_mode(ctx: Context, body: Any, s: TuningJobSpec, status: Any, patch: kopf.Patch) -> None:
    """``status.gpuSharingMode``; in mode devicePlugin also ``status.gpu`` and one Event saying what
    the plugin's equal split means for the job's thread percentage."""
    mode = ctx.sharing.mode_of(s)
    if mode is None or status.get("gpuSharingMode") == mode:
        return
    patch.status["gpuSharingMode"] = mode
    if mode == DEVICE_PLUGIN:
        resource = s.sharing.device_plugin_resource or ctx.sharing.device_plugin_resource
        patch.status["gpu"] = f"{s.total_servers} x {resource}"
        events.post(ctx.api, body, "Normal", "DevicePluginShare", device_plugin_message(s, resource))


def create_children(ctx: Context, body: Any, job: JobRef, s: TuningJobSpec, sharing: Sharing | None,
                    status: dict[str, Any], generation: int | None, patch: kopf.Patch) -> None:
    """Every planned child, idempotently (409 = already there); Pending/Created on the first run."""
    t0 = time.monotonic()
    created = 0
    try:
        objs = plan(job, s, ctx.image, sharing, ctx.network, ctx.requests, ctx.daemon_priority_class, ctx.library)
    except Exception as e:  # a spec the parser let through but the planner cannot use: fail, don't loop
        log.exception("planning %s/%s", job.namespace, job.name)
        metrics.ERRORS.labels("create", "PlanError").inc()
        events.set_phase(ctx.api, body, patch, FAILED, "InvalidSpec", f"cannot plan this job: {type(e).__name__}: {e}",
                         generation, status)
        return
    for obj in objs:
        try:
            if kube.create(ctx.api, obj):
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
            events.set_phase(ctx.api, body, patch, FAILED, "ChildRejected",
                             f"{obj['kind']} {obj['metadata']['name']} rejected: {why}", generation, status)
            return
    if not status.get("phase"):
        patch.status["startTime"] = now()
        patch.status["resultLocation"] = result_location(job, s)
        events.set_phase(ctx.api, body, patch, PENDING, "Created", f"created {created} child objects",
                         generation, status)
        sized = s.shards_sizing()
        if sized is not None:
            _say_shards(ctx, body, patch, generation, s.shards, "BudgetBoundsShards", sized)
    metrics.RECONCILE.labels("create").observe(time.monotonic() - t0)


def scale(ctx: Context, name: str, namespace: str, new: Any, old: Any, body: Any, status: Any) -> None:
    if old is None or new is None or status.get("phase") in FINAL:
        return
    try:
        s = spec_of(body)
    except SpecError:
        return
    pinned = dict(status.get("serversGpuByGroup") or {})
    waiting = pins_gpu_in(s, status.get("gpuSharingMode"))
    for (g, _, _), (deployment, replicas) in zip(daemon_names(name, s), servers_scale(name, s, int(new))):
        if waiting and not pinned.get(_group_key(g)):
            continue  # no GPU yet: pin_servers starts them at the replicas the spec then has
        kube.scale_deployment(ctx.api, namespace, deployment, replicas)
    events.post(ctx.api, body, "Normal", "Scaled",
                f"servers scaled from {old} to {new}" + (f" per GPU ({s.gpus} GPUs)" if s.gpus > 1 else ""))


def _group_key(g: int | None) -> str:
    """A GPU group's key in the status maps (a single-GPU job's one group is "0")."""
    return str(g or 0)


def recover_mps_daemon(ctx: Context, body: dict[str, Any], job: JobRef, s: TuningJobSpec, obs: Observed,
                       patch: kopf.Patch) -> set[str]:
    """Per GPU group: a dead daemon is replaced, and its servers restarted against the new one.
    A replaced daemon's pod may be given another GPU: its servers stop (0 replicas) and lose their
    pin until the new pod publishes its GPU (:func:`pin_servers`). Returns the replaced groups."""
    status = body.get("status") or {}
    seen_by_gpu = dict(status.get("mpsDaemonRestartsByGpu") or {})
    recovered = 0
    replaced: set[str] = set()
    for g, daemon_name, servers_name in daemon_names(job.name, s):
        key = _group_key(g)
        view = obs.daemons.get(key, DaemonView())
        recreate, restart_servers = mps_recovery(view, status.get("phase"), int(seen_by_gpu.get(key, 0)))
        if recreate:
            if view.state == "failed":
                kube.read_or_none(ctx.core.delete_namespaced_pod, daemon_name, job.namespace)
            daemon = next(o for o in plan(job, s, ctx.image, requests=ctx.requests,
                                          daemon_priority_class=ctx.daemon_priority_class)
                          if o["kind"] == "Pod" and o["metadata"]["name"] == daemon_name)
            if not kube.create(ctx.api, daemon):
                continue  # the old pod is still being deleted: try again next tick
            metrics.CHILDREN.labels("Pod").inc()
        if restart_servers and recreate:
            kube.scale_deployment(ctx.api, job.namespace, servers_name, 0)
            replaced.add(key)
        elif restart_servers:
            kube.restart_deployment(ctx.api, job.namespace, servers_name)
        if restart_servers:
            # Restarts of the current daemon pod already answered (a new pod starts from 0).
            seen_by_gpu[key] = 0 if recreate else view.restarts
            recovered += 1
            events.post(ctx.api, body, "Warning", "MpsDaemonRestarted",
                        f"MPS control daemon {daemon_name} " + ("replaced" if recreate else "restarted in place")
                        + f"; tuning servers {servers_name} restarted against it")
    if recovered:
        patch.status["mpsDaemonRestartsByGpu"] = seen_by_gpu
        patch.status["mpsRecoveries"] = int(status.get("mpsRecoveries", 0)) + recovered
    if replaced:
        patch.status["serversGpuByGroup"] = {k: None for k in replaced}  # a merge patch: the keys go
    return replaced


def pin_servers(ctx: Context, body: dict[str, Any], job: JobRef, s: TuningJobSpec, sharing: Sharing | None,
                snap: Snapshot, patch: kopf.Patch, skip: set[str]) -> None:
    """Servers see exactly their daemon's GPU. Each GPU group's servers Deployment was created at 0
    replicas seeing no GPU; once the daemon (the job's, or the GPU pool's) has published the UUID of
    the GPU the device plugin gave it, the Deployment gets that UUID in ``NVIDIA_VISIBLE_DEVICES``
    and its replicas, in one patch. A daemon that publishes another GPU (a replaced pod) rolls them
    onto it. ``skip``: groups whose daemon was replaced in this tick (the snapshot still shows the
    old pod)."""
    if not pins_gpu(s, sharing):
        return
    status = body.get("status") or {}
    pinned = {k: v for k, v in (status.get("serversGpuByGroup") or {}).items() if k not in skip}
    pins: dict[str, str | None] = dict(patch.status.get("serversGpuByGroup") or {})
    for g, daemon_name, servers_name in daemon_names(job.name, s):
        key = _group_key(g)
        if key in skip:
            continue
        if sharing is not None and sharing.mode == POOL:
            assert sharing.placement is not None
            dev = sharing.placement.devices[g or 0]
            daemon_name = pool_pod_name(dev.node, dev.index)
            uuid = published(snap.pools.get(daemon_name))
        else:
            uuid = published(snap.daemons.get((job.namespace, daemon_name)))
        if uuid is None or pinned.get(key) == uuid:
            continue
        if kube.read_or_none(ctx.apps.patch_namespaced_deployment, servers_name, job.namespace,
                             pin_servers_patch(uuid, s.servers.replicas)) is None:
            continue  # not there (yet): the next tick
        pins[key] = uuid
        events.post(ctx.api, body, "Normal", "ServersPinned",
                    f"tuning servers {servers_name} see GPU {uuid}, the one MPS daemon {daemon_name} holds")
    if pins:
        patch.status["serversGpuByGroup"] = pins


def first_group_gpu(s: TuningJobSpec, status: Mapping[str, Any], patch: kopf.Patch | None = None) -> str | None:
    """The GPU the first GPU group's daemon published (its servers are pinned to it), this tick's
    pin over the stored one when ``patch`` has it (a replaced daemon's key is None: not pinned)."""
    now = (patch.status.get("serversGpuByGroup") or {}) if patch is not None else {}
    pins = {**(status.get("serversGpuByGroup") or {}), **now}
    uuid = pins.get(_group_key(gpu_groups(s)[0]))
    return str(uuid) if uuid else None


def start_clients(ctx: Context, job: JobRef, s: TuningJobSpec, sharing: Sharing | None, obs: Observed,
                  status: dict[str, Any], patch: kopf.Patch) -> None:
    """A job whose GPU is a daemon's gets its clients' Job once the first GPU group is pinned
    (:func:`planner.plan_clients` says why). Every tick until the Job exists, so a refused create
    is tried again."""
    if not pins_gpu(s, sharing) or obs.clients_job_shards is not None or obs.merge_exists:
        return
    clients = plan_clients(job, s, ctx.image, ctx.requests, ctx.library)
    if first_group_gpu(s, status, patch) and kube.create(ctx.api, clients):
        metrics.CHILDREN.labels("Job").inc()


def reconcile_all(ctx: Context) -> None:
    """One status tick over every job the operator watches."""
    objs = ctx.custom
    if ctx.namespaces:
        # The client types a custom object as `object`: it is the API server's JSON, a dict.
        items = [j for ns in ctx.namespaces
                 for j in cast(dict[str, Any], objs.list_namespaced_custom_object(API_GROUP, API_VERSION, ns,
                                                                                  PLURAL))["items"]]
    else:
        items = cast(dict[str, Any], objs.list_cluster_custom_object(API_GROUP, API_VERSION, PLURAL))["items"]
    active = [b for b in items if not b["metadata"].get("deletionTimestamp")
              and (b.get("status") or {}).get("phase") not in FINAL]
    # The pool daemons, listed once for the whole tick: idle pools are released by the share tick
    # after their last job is gone, and the jobs' snapshot reads the GPUs they publish.
    pool_pods = gpupool.list_pools(ctx)
    if gpupool.needed(ctx, active) or pool_pods:
        _gpu_tick(ctx, items, pool_pods)
    # a job placed on a GPU pool this tick has its placement before it says its mode
    in_pools = any((st := b.get("status") or {}).get("gpuSharingMode") == POOL or st.get("gpuPlacement")
                   for b in active)
    snap = snapshot(ctx, pools=in_pools, pool_pods=pool_pods) if active else Snapshot()
    for body in items:
        if body["metadata"].get("deletionTimestamp"):
            continue
        patch = kopf.Patch()
        try:
            reconcile_status(ctx, body, patch, snap)
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


def _gpu_tick(ctx: Context, items: list[dict[str, Any]], pool_pods: list[Any]) -> None:
    """Books GPU shares (gpupool.tick), then creates the children of the jobs it admitted."""
    try:
        result = gpupool.tick(ctx, items, pool_pods)
    except client.ApiException as e:  # e.g. no RBAC to list nodes: the other jobs' status goes on
        metrics.ERRORS.labels("gpu-pool", str(e.status)).inc()
        log.warning("GPU share tick: %s %s", e.status, kube.reason(e))
        return
    for body in items:
        meta = body["metadata"]
        placement = result.admitted.get((meta["namespace"], meta["name"]))
        if placement is None:
            continue
        body.setdefault("status", {})["gpuPlacement"] = placement  # this tick's later steps see it
        s = spec_of(body)
        patch = kopf.Patch()
        create_children(ctx, body, JobRef(meta["name"], meta["namespace"], meta["uid"]), s,
                        ctx.sharing.sharing_of(s, placement_of(body["status"])), dict(body["status"]),
                        meta.get("generation"), patch)
        if patch:
            ctx.custom.patch_namespaced_custom_object_status(API_GROUP, API_VERSION, meta["namespace"], PLURAL,
                                                             meta["name"], dict(patch))


def _release_gpu_share(ctx: Context, body: dict[str, Any], job: JobRef, s: TuningJobSpec) -> None:
    """A pool-mode job that finished gives its share back at once: the ledger drops it on the
    next tick (it is final), and its servers leave the GPU now (scaled to 0, not deleted: the
    job's deletion removes them with the other children)."""
    for _, _, servers in daemon_names(job.name, s):
        try:
            kube.scale_deployment(ctx.api, job.namespace, servers, 0)
        except client.ApiException as e:
            if e.status != 404:
                log.warning("%s/%s: cannot scale %s to 0: %s", job.namespace, job.name, servers, kube.reason(e))
    placement = (body.get("status") or {}).get("gpuPlacement") or {}
    events.post(ctx.api, body, "Normal", "GpuShareReleased",
                f"released its share of GPU {gpupool.gpu_label(placement)}")


def reconcile_status(ctx: Context, body: dict[str, Any], patch: kopf.Patch, snap: Snapshot) -> None:
    t0 = time.monotonic()
    meta, status = body["metadata"], body.get("status") or {}
    name, namespace = meta["name"], meta["namespace"]
    phase = status.get("phase")
    if phase in FINAL:
        _maybe_expire(ctx, body, status)
        return
    if phase is None:
        return  # the create handler has not run yet
    try:
        s = spec_of(body)
    except SpecError:
        return
    sharing, wait = _sharing(ctx, s, status)
    if wait:
        return  # the GPU tick keeps its queue position
    job = JobRef(name, namespace, meta["uid"])
    obs = observe(ctx, job, s, snap)
    replaced: set[str] = set()
    if s.uses_mps and (sharing is None or sharing.mode == EXCLUSIVE):  # pools recover in the GPU tick
        replaced = recover_mps_daemon(ctx, body, job, s, obs, patch)
    pin_servers(ctx, body, job, s, sharing, snap, patch, replaced)
    start_clients(ctx, job, s, sharing, obs, status, patch)
    if obs.clamp is not None:
        clamp_clients(ctx, job, obs)
    if obs.clients_succeeded >= obs.client_shards and not obs.merge_exists and not obs.clients_failed:
        if kube.create(ctx.api, plan_merge(job, s, ctx.image, shards=obs.client_shards, sharing=sharing,
                                               requests=ctx.requests, gpu=first_group_gpu(s, status),
                                               library=ctx.library)):
            metrics.CHILDREN.labels("Job").inc()
            if s.builders is not None:
                _release_builders(ctx, job)
    new_phase, reason, message = next_phase(phase, obs, obs.client_shards)
    for k, v in progress_fields(obs, status.get("startTime")).items():
        if status.get(k) != v:
            patch.status[k] = v
    if obs.summary is not None and new_phase == SUCCEEDED:
        for k, v in result_fields(obs.summary, job.namespace, job.name).items():
            patch.status[k] = v
        patch.status["progressPercent"] = 100
    last = _last_reason(status)
    # While Pending the reason and its message are news (GPU busy, Secret missing or lacking a key,
    # and back to Starting once fixed); Created -> Starting is not.
    changed = reason != last or message != status.get("message")
    if new_phase != phase or (new_phase == PENDING and changed and (last, reason) != ("Created", "Starting")):
        events.set_phase(ctx.api, body, patch, new_phase, reason, message, meta.get("generation"), dict(status))
        if new_phase in FINAL and sharing is not None and sharing.mode == POOL:
            _release_gpu_share(ctx, body, job, s)
        if obs.summary is not None and new_phase == SUCCEEDED:
            patch.status["conditions"] = improved_condition(patch.status["conditions"], obs.summary,
                                                            meta.get("generation"))
    if obs.clamp is not None:
        _say_shards(ctx, body, patch, meta.get("generation"), obs.clamp.shards, "MoreShardsThanTasks",
                    obs.clamp.message)
    metrics.RECONCILE.labels("status").observe(time.monotonic() - t0)


def _release_builders(ctx: Context, job: JobRef) -> None:
    """Every shard is done: the build pool has nothing left to build, so its pods give their CPUs
    back (scaled to 0, not deleted: a HorizontalPodAutoscaler leaves a Deployment at 0 alone, and
    the job's deletion removes it with the other children)."""
    try:
        kube.scale_deployment(ctx.api, job.namespace, ChildNames(job.name).builders, 0)
    except client.ApiException as e:
        if e.status != 404:
            log.warning("%s/%s: cannot scale the builders to 0: %s", job.namespace, job.name, kube.reason(e))


def clamp_clients(ctx: Context, job: JobRef, obs: Observed) -> None:
    """Scales the clients' Indexed Job down to the shards that have a task to tune (an elastic
    Indexed Job: completions and parallelism change together; the highest indexes go, and the
    partition leaves only those empty). Idempotent: only while the Job has more."""
    assert obs.clamp is not None
    k = obs.clamp.shards
    if obs.clients_job_shards is not None and obs.clients_job_shards > k and not obs.clients_finished:
        try:
            ctx.batch.patch_namespaced_job(ChildNames(job.name).clients, job.namespace,
                                           {"spec": {"completions": k, "parallelism": k}})
        except client.ApiException as e:
            if not kube.is_rejection(e):
                raise  # the API server is down or busy: next tick
            # Refused (RBAC without patch on jobs, an API server before elastic Indexed Jobs): the
            # clients of the empty shards then run, find nothing to do and exit 0; the status
            # and the merge follow the clamp all the same.
            metrics.ERRORS.labels("status", "ClampRejected").inc()
            log.warning("%s/%s: cannot scale %s down to %d: %s", job.namespace, job.name,
                        ChildNames(job.name).clients, k, kube.reason(e))
            return
        log.info("%s/%s: %s", job.namespace, job.name, obs.clamp.message)


def _say_shards(ctx: Context, body: Any, patch: kopf.Patch, generation: int | None, shards: int, reason: str,
                why: str) -> None:
    """Fewer client shards than ``clients.shards`` asked, in the status (``clientShards``, a
    ``ShardsClamped`` condition with ``reason``) and one Event; said once per reason. Two reasons:
    ``BudgetBoundsShards`` (sized at creation: the budget cannot give more shards a task) and
    ``MoreShardsThanTasks`` (clamped at run time: the model has fewer tasks than shards)."""
    conds = patch.status["conditions"] if "conditions" in patch.status else \
        list((body.get("status") or {}).get("conditions") or [])
    if any(c.get("type") == "ShardsClamped" and c.get("reason") == reason for c in conds):
        return
    patch.status["clientShards"] = shards
    patch.status["conditions"] = condition(conds, "ShardsClamped", "True", reason, why, generation)
    events.post(ctx.api, body, "Normal", "ShardsClamped", why)


def _last_reason(status: Any) -> str | None:
    for c in status.get("conditions") or []:
        if c.get("type") == "Ready":
            return c.get("reason")
    return None


def _maybe_expire(ctx: Context, body: dict[str, Any], status: Any) -> None:
    try:
        ttl = spec_of(body).ttl_seconds_after_finished
    except SpecError:  # failed on another field: the ttl alone decides (an invalid one keeps the job)
        try:
            ttl = ttl_of(dict(body.get("spec") or {}))
        except SpecError:
            ttl = None
    done = status.get("completionTime")
    if ttl is None or not done:
        return
    finished = dt.datetime.fromisoformat(done.replace("Z", "+00:00"))
    if (dt.datetime.now(dt.timezone.utc) - finished).total_seconds() >= ttl:
        meta = body["metadata"]
        ctx.custom.delete_namespaced_custom_object(API_GROUP, API_VERSION, meta["namespace"], PLURAL, meta["name"])
