"""GPU pools in the controller (mode pool, docs/gpu-pools.md). Each status tick reads what the
ledger needs from the cluster (the GPU nodes, the GPUs other pods hold, the pool daemon pods),
asks :func:`sharetune.gpushare.plan_tick` what to do, and does it:

- an admitted job gets its ``status.gpuPlacement`` written *before* any of its children exist
  (the booking is the status: an operator killed right after it resumes with the same booking,
  one killed right before it decides again from scratch; nothing is remembered in between);
- a waiting job gets its queue position (reason ``WaitingForGpuShare``, one Event when it starts
  waiting, not one per position);
- pool daemons are created where a job was placed, each after its PodDisruptionBudget (an
  eviction would take every co-tenant with it), replaced when they failed (the servers attached
  to them are rolled: their CUDA contexts died with the MPS server), marked idle when their last
  job left and deleted, with their budget, after ``poolIdleSeconds``.

The children of a job admitted here are created by the caller (``reconcile.create_children``).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from kubernetes import client

from ..admission import GPU_COUNT_RESOURCE, GpuId, JobKey
from ..api.spec import API_GROUP, API_VERSION, PLURAL
from ..api.topology import GPU_INDEX_LABEL, POOL_LABEL, POOL_NODE_ANNOTATION
from ..gpushare import WAITING, PoolPod, TickPlan, co_tenant_status, plan_tick, pool_job
from ..planner import plan_pool, plan_pool_budget, plan_pool_identity
from . import events, kube, metrics
from .context import Context
from .status import PENDING, now

log = logging.getLogger("sharetune.operator")

POOL_SELECTOR = "app.kubernetes.io/managed-by=sharetune,app.kubernetes.io/component=gpu-pool"
IDLE_ANNOTATION = "sharetune.io/idle-since"  # when a pool lost its last job (gpushare.PoolPod)
ANSWERED_ANNOTATION = "sharetune.io/restarts-answered"  # pool restarts whose servers were rolled
UNPLACEABLE = "GpuShareUnplaceable"


@dataclass
class TickResult:
    admitted: dict[JobKey, dict[str, Any]] = field(default_factory=dict)  # the gpuPlacement written


def gpu_label(placement: Mapping[str, Any]) -> str:
    """``status.gpu`` of an admitted job: where its share is (the GPU column of ``kubectl get tj``)."""
    devices = placement.get("devices") or [{"node": placement.get("node"), "gpu": placement.get("gpu")}]
    return ", ".join(f"{d['node']}/{d['gpu']}" for d in devices) + f" @{placement.get('share')}%"


def _pool_pod(pod: Any) -> PoolPod | None:
    meta = pod.metadata
    node = (meta.annotations or {}).get(POOL_NODE_ANNOTATION)
    index = (meta.labels or {}).get(GPU_INDEX_LABEL)
    if not node or index is None or not index.isdigit():
        return None  # not one of ours as planned: leave it alone
    phase = pod.status.phase if pod.status else None
    ended = phase in ("Failed", "Succeeded") or meta.deletion_timestamp is not None
    answered = (meta.annotations or {}).get(ANSWERED_ANNOTATION, "0")
    return PoolPod(name=meta.name, gpu=GpuId(node, int(index)),
                   state="failed" if ended else ("running" if phase == "Running" else "pending"),
                   idle_since=(meta.annotations or {}).get(IDLE_ANNOTATION),
                   restarts=sum(c.restart_count or 0 for c in (pod.status.container_statuses or []) if pod.status),
                   restarts_answered=int(answered) if answered.isdigit() else 0)


def _gpus_held(pod: Any) -> int:
    n = 0
    for c in pod.spec.containers or []:
        limits = (c.resources.limits if c.resources else None) or {}
        try:
            n += int(str(limits.get(GPU_COUNT_RESOURCE, 0)))
        except ValueError:
            pass
    return n


def list_pools(ctx: Context) -> list[Any]:
    """The GPU pool daemon pods (the operator's namespace): listed once per status tick, for the
    share tick and the jobs' snapshot alike."""
    return list(ctx.core.list_namespaced_pod(ctx.sharing.pool_namespace, label_selector=POOL_SELECTOR).items)


def _cluster_view(ctx: Context, pool_pods: list[Any]) -> tuple[list[dict[str, Any]], dict[str, int], list[PoolPod]]:
    """(GPU nodes as API dicts, GPUs held per node by pods other than pool daemons, pool pods)."""
    core = ctx.core
    nodes = [ctx.api.sanitize_for_serialization(n) for n in core.list_node().items]
    nodes = [n for n in nodes if str(((n.get("status") or {}).get("allocatable") or {}).get(GPU_COUNT_RESOURCE, "0"))
             not in ("0", "")]
    held: dict[str, int] = {}
    live = "status.phase!=Succeeded,status.phase!=Failed"
    for p in core.list_pod_for_all_namespaces(field_selector=live).items:
        labels = p.metadata.labels or {}
        if not p.spec.node_name or labels.get("app.kubernetes.io/component") == "gpu-pool":
            continue  # unscheduled pods hold nothing yet; pool daemons are the ledger's own GPUs
        k = _gpus_held(p)
        if k:
            held[p.spec.node_name] = held.get(p.spec.node_name, 0) + k
    pools = [pp for p in pool_pods if (pp := _pool_pod(p)) is not None]
    return nodes, held, pools


def needed(ctx: Context, items: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a tick has anything to do: a live pool-mode job (cheap: the spec only)."""
    return any(pool_job(b, ctx.sharing) is not None for b in items)


def tick(ctx: Context, items: list[dict[str, Any]], pool_pods: list[Any] | None = None) -> TickResult:
    """``pool_pods``: :func:`list_pools` of this tick (None: listed here)."""
    nodes, held, pools = _cluster_view(ctx, list_pools(ctx) if pool_pods is None else pool_pods)
    t = dt.datetime.now(dt.timezone.utc)
    decided = plan_tick(items, nodes, held, pools, ctx.sharing, t)
    out = TickResult()
    by_key = {(b["metadata"]["namespace"], b["metadata"]["name"]): b for b in items}
    for key, placement in decided.admit.items():
        body = by_key[key]
        if _patch_status(ctx, key, {"gpuPlacement": placement, "gpu": gpu_label(placement), "queuePosition": None}):
            out.admitted[key] = placement
            created = (body["metadata"].get("creationTimestamp") or "").replace("Z", "+00:00")
            if created:
                metrics.GPU_WAIT.observe(max(0.0, (t - dt.datetime.fromisoformat(created)).total_seconds()))
            events.post(ctx.api, body, "Normal", "GpuShareAdmitted",
                        f"admitted on GPU {gpu_label(placement)}: its servers start now")
    for key, (position, message) in decided.waiting.items():
        _say_waiting(ctx, by_key[key], WAITING, message, position)
    for key, why in decided.never.items():
        _say_waiting(ctx, by_key[key], UNPLACEABLE, f"no GPU of this cluster can take this job: {why}", None)
    stamp = now()
    for key, tenants in decided.co_tenants.items():
        tenant_body = by_key.get(key)
        if tenant_body is None:
            continue
        spans = co_tenant_status((tenant_body.get("status") or {}).get("coTenants"), tenants, stamp)
        if spans is not None:
            _patch_status(ctx, key, {"coTenants": spans})
    _apply_pools(ctx, decided)
    for gpu, share in decided.allocated.items():
        metrics.GPU_SHARE.labels(gpu.node, str(gpu.index)).set(share)
    metrics.GPU_QUEUE.set(len(decided.waiting))
    return out


def _patch_status(ctx: Context, key: JobKey, fields: dict[str, Any]) -> bool:
    try:
        ctx.custom.patch_namespaced_custom_object_status(API_GROUP, API_VERSION, key[0], PLURAL, key[1],
                                                         {"status": fields})
        return True
    except client.ApiException as e:
        if e.status == 404:
            return False  # deleted meanwhile: its share was never booked
        raise


def _say_waiting(ctx: Context, body: dict[str, Any], reason: str, message: str, position: int | None) -> None:
    status = body.get("status") or {}
    if status.get("phase") not in (None, PENDING):
        return
    label = f"queued #{position}" if position is not None else "unplaceable"
    last = next((c.get("reason") for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    if last != reason:  # starts waiting: the phase's conditions and one Event
        patch = kopf.Patch()
        events.set_phase(ctx.api, body, patch, PENDING, reason, message, body["metadata"].get("generation"),
                         dict(status))
        fields = {**dict(patch.status), "queuePosition": position, "gpu": label}
        if not status.get("startTime"):
            fields["startTime"] = now()
        _patch_status(ctx, key, fields)
    elif status.get("queuePosition") != position or status.get("message") != message:
        _patch_status(ctx, key, {"queuePosition": position, "message": message, "gpu": label})


def _apply_pools(ctx: Context, decided: TickPlan) -> None:
    core, ns = ctx.core, ctx.sharing.pool_namespace
    for name in decided.replace_pools:
        kube.read_or_none(core.delete_namespaced_pod, name, ns)
    for name, gpu in decided.create_pools.items():
        _create_budget(ctx, name, gpu)  # first: no pool daemon runs unguarded
        for obj in plan_pool_identity(gpu.node, gpu.index, ns):  # 409s once made: kept across pools
            try:
                kube.create(ctx.api, obj)
            except client.ApiException as e:
                if not kube.is_rejection(e):
                    raise
                metrics.ERRORS.labels("gpu-pool", "IdentityRejected").inc()
                log.warning("GPU pool %s: %s rejected, its servers wait for a GPU it cannot publish: %s", name,
                            obj["kind"], kube.reason(e))
        pod = plan_pool(gpu.node, gpu.index, ns, ctx.image, tuple(dict(t) for t in ctx.sharing.pool_tolerations),
                        ctx.requests, ctx.daemon_priority_class)
        try:
            if kube.create(ctx.api, pod):
                metrics.CHILDREN.labels("Pod").inc()
                log.info("GPU pool %s created for %s", name, gpu)
        except client.ApiException as e:
            if not kube.is_rejection(e):
                raise
            metrics.ERRORS.labels("gpu-pool", "PoolRejected").inc()
            log.warning("GPU pool %s for %s rejected: %s", name, gpu, kube.reason(e))
    for name, restarts in decided.roll_servers.items():
        _roll_servers(ctx, name)
        _annotate(ctx, name, {ANSWERED_ANNOTATION: str(restarts)})
    for name in decided.mark_idle:
        _annotate(ctx, name, {IDLE_ANNOTATION: now()})
    for name in decided.mark_busy:
        _annotate(ctx, name, {IDLE_ANNOTATION: None})
    for name in decided.delete_pools:
        log.info("GPU pool %s released: no job for %.0f s", name, ctx.sharing.pool_idle_s)
        kube.read_or_none(core.delete_namespaced_pod, name, ns)
        # After the pod: a budget left behind (an operator stopped in between) guards nothing
        # until this GPU's pool comes back, and then guards it again.
        kube.read_or_none(ctx.policy.delete_namespaced_pod_disruption_budget, name, ns)


def _create_budget(ctx: Context, name: str, gpu: GpuId) -> None:
    """The pool's PodDisruptionBudget (409 = already there: kept across a pool's replacement). A
    refusal is logged and the pool is created all the same: a pool without its budget can be
    drained, a job without its pool cannot run."""
    try:
        kube.create(ctx.api, plan_pool_budget(gpu.node, gpu.index, ctx.sharing.pool_namespace))
    except client.ApiException as e:
        if not kube.is_rejection(e):
            raise
        metrics.ERRORS.labels("gpu-pool", "BudgetRejected").inc()
        log.warning("GPU pool %s: PodDisruptionBudget rejected, the pool can be evicted: %s", name, kube.reason(e))


def _annotate(ctx: Context, pod: str, annotations: dict[str, str | None]) -> None:
    kube.read_or_none(ctx.core.patch_namespaced_pod, pod, ctx.sharing.pool_namespace,
                      {"metadata": {"annotations": annotations}})


def _roll_servers(ctx: Context, pool: str) -> None:
    """Every servers Deployment attached to ``pool`` (its label), whatever the job's namespace."""
    apps = ctx.apps
    sel = f"{POOL_LABEL}={pool}"
    if ctx.namespaces:
        deps = [d for ns in ctx.namespaces for d in apps.list_namespaced_deployment(ns, label_selector=sel).items]
    else:
        deps = apps.list_deployment_for_all_namespaces(label_selector=sel).items
    for d in deps:
        kube.restart_deployment(ctx.api, str(d.metadata.namespace), str(d.metadata.name))
        log.info("GPU pool %s was replaced or restarted: servers %s/%s rolled", pool, d.metadata.namespace,
                 d.metadata.name)
