"""One status tick of GPU sharing, as decisions (docs/gpu-pools.md): which waiting pool-mode jobs
get which GPU (the ``status.gpuPlacement`` to write before any of their servers is created), who
waits where in the queue and why, which pool daemons must run, and which idle ones go.

Pure: the inputs are the API objects as the operator lists them (dicts), the output is what to
do; the controller applies it. Nothing is remembered between ticks: the ledger is rebuilt from
the TuningJobs' status every time, so an operator restart cannot double-book a GPU.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .admission import (
    Gpu,
    GpuId,
    JobKey,
    Ledger,
    Placement,
    Request,
    gpus_of_node,
    placement_of,
    placement_status,
    request_of,
)
from .api.spec import SpecError, TuningJobSpec, spec_of
from .api.topology import pool_pod_name
from .sharing import POOL, SharingConfig

WAITING = "WaitingForGpuShare"  # the Pending reason of a job the ledger has no room for yet
FINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class PoolPod:
    """A pool daemon pod as listed: its GPU, whether it runs, and since when it has had no job
    (the operator's ``sharetune.io/idle-since`` annotation on it)."""

    name: str
    gpu: GpuId
    state: str  # "running" | "pending" | "failed" (ended, or being deleted)
    idle_since: str | None = None
    restarts: int = 0  # in-place restarts of its container (the kubelet's)
    restarts_answered: int = 0  # those whose servers were already rolled (the operator's annotation on it)


@dataclass
class TickPlan:
    admit: dict[JobKey, dict[str, Any]] = field(default_factory=dict)  # status.gpuPlacement to write
    waiting: dict[JobKey, tuple[int, str]] = field(default_factory=dict)  # queue position, message
    never: dict[JobKey, str] = field(default_factory=dict)  # cannot fit on this cluster: why
    # pool pods to create (absent, or replacing a failed one)
    create_pools: dict[str, GpuId] = field(default_factory=dict)
    replace_pools: list[str] = field(default_factory=list)  # failed pool pods to delete first
    mark_idle: list[str] = field(default_factory=list)  # pool pods that have just lost their last job
    mark_busy: list[str] = field(default_factory=list)  # idle-marked pool pods that have a job again
    delete_pools: list[str] = field(default_factory=list)  # idle for longer than poolIdleSeconds
    # Pools whose MPS server went away (replaced, or restarted in place): the servers attached to
    # them (label sharetune.io/gpu-pool) hold dead CUDA contexts and are rolled; the value is the
    # restart count to record as answered on the pool pod.
    roll_servers: dict[str, int] = field(default_factory=dict)
    allocated: dict[GpuId, int] = field(default_factory=dict)  # share per GPU after this tick (metrics)
    # Every placed live job -> the other jobs on any of its GPUs now (status.coTenants).
    co_tenants: dict[JobKey, set[JobKey]] = field(default_factory=dict)


def _ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def _rfc3339(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def pool_job(body: Mapping[str, Any], config: SharingConfig) -> TuningJobSpec | None:
    """The job's spec when it takes part in the ledger: a live (not deleted, not finished) cuda
    job in mode pool with a spec the parser accepts (a bad one fails elsewhere)."""
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    if meta.get("deletionTimestamp") or status.get("phase") in FINAL:
        return None
    try:
        spec = spec_of(body)
    except SpecError:
        return None
    return spec if config.mode_of(spec) == POOL else None


def waiting_message(position: int, queued: int, share: int, gpus: int) -> str:
    each = f" on each of {gpus} GPUs" if gpus > 1 else ""
    return (f"waiting for a GPU share of {share}%{each}: position {position} of {queued} in the queue "
            f"(first come first served); it starts as soon as running jobs release enough of a GPU")


def device_plugin_message(spec: TuningJobSpec, resource: str) -> str:
    """What a devicePlugin-mode job's status says about its share (docs/gpu-pools.md)."""
    return (f"mode devicePlugin: each of the {spec.total_servers} servers requests one {resource}; the device "
            f"plugin splits each GPU equally between its replicas, and servers.threadPercentage "
            f"{spec.servers.thread_percentage}% can only lower a server's split, never raise it")


def plan_tick(bodies: Iterable[Mapping[str, Any]], nodes: Iterable[Mapping[str, Any]],
              held_elsewhere: Mapping[str, int], pools: Iterable[PoolPod], config: SharingConfig,
              now: dt.datetime) -> TickPlan:
    """``bodies``: every TuningJob the operator watches; ``nodes``: the GPU nodes (name,
    allocatable, labels); ``held_elsewhere``: per node, GPUs held by pods that are not pool
    daemons; ``pools``: the pool daemon pods in the operator's namespace."""
    pools = list(pools)
    placed: dict[JobKey, Placement] = {}
    requests: dict[JobKey, Request] = {}
    specs: dict[JobKey, TuningJobSpec] = {}
    for body in bodies:
        spec = pool_job(body, config)
        if spec is None:
            continue
        meta = body["metadata"]
        key = (str(meta["namespace"]), str(meta["name"]))
        specs[key] = spec
        p = placement_of(body.get("status"))
        if p is not None:
            placed[key] = p
        else:
            requests[key] = request_of(key[0], key[1], str(meta.get("creationTimestamp") or ""), spec)
    in_use_by_node: dict[str, set[int]] = {}
    for p in placed.values():
        for d in p.devices:
            in_use_by_node.setdefault(d.node, set()).add(d.index)
    gpus: list[Gpu] = []
    for n in nodes:
        meta = n.get("metadata") or {}
        name = str(meta.get("name"))
        gpus += gpus_of_node(name, (n.get("status") or {}).get("allocatable") or {}, meta.get("labels") or {},
                             held_elsewhere.get(name, 0), in_use_by_node.get(name, ()))
    ledger = Ledger.rebuild(gpus, placed, config.policy)
    out = ledger.admit(requests.values())
    plan = TickPlan(never=dict(out.unplaceable))
    stamp = _rfc3339(now)
    for key, p in out.placed.items():
        plan.admit[key] = placement_status(p, specs[key].sharing.pinned_memory, stamp)
    for i, key in enumerate(out.queue):
        r = requests[key]
        plan.waiting[key] = (i + 1, waiting_message(i + 1, len(out.queue), r.share, r.gpus))
    _plan_pools(plan, ledger.in_use(), pools, config, now)
    plan.allocated = {g.id: ledger.allocated(g.id) for g in gpus}
    for key, p in ledger.placements.items():
        plan.co_tenants[key] = {k for d in p.devices for k in ledger.tenants(d)} - {key}
    return plan


def _plan_pools(plan: TickPlan, in_use: set[GpuId], pools: list[PoolPod], config: SharingConfig,
                now: dt.datetime) -> None:
    """Pools into ``plan``: one per GPU with a job; a failed one replaced (its servers rolled onto
    the new pod); idle ones marked, then deleted after ``config.pool_idle_s``."""
    by_gpu = {p.gpu: p for p in pools}
    for gpu in sorted(in_use):
        pod = by_gpu.get(gpu)
        if pod is None:
            plan.create_pools[pool_pod_name(gpu.node, gpu.index)] = gpu
        elif pod.state == "failed":
            plan.replace_pools.append(pod.name)
            plan.create_pools[pod.name] = gpu
            plan.roll_servers[pod.name] = 0  # a new pod counts its restarts from 0
        else:
            if pod.restarts > pod.restarts_answered:
                plan.roll_servers[pod.name] = pod.restarts
            if pod.idle_since:
                plan.mark_busy.append(pod.name)
    for pod in pools:
        if pod.gpu in in_use:
            continue
        if pod.idle_since is None:
            plan.mark_idle.append(pod.name)
        elif (now - _ts(pod.idle_since)).total_seconds() >= config.pool_idle_s:
            plan.delete_pools.append(pod.name)


def co_tenant_status(previous: Mapping[str, Any] | None, now_tenants: set[JobKey], stamp: str
                     ) -> dict[str, Any] | None:
    """``status.coTenants`` after this tick, or None when unchanged: per job that shared a GPU
    with this one, ``since`` (first seen) and ``until`` (once it left; absent while it is there).
    Co-tenant kernels disturb measurements: these spans say which stretch of a job's tuning ran
    beside whom."""
    prev = {k: dict(v) for k, v in (previous or {}).items()}
    out = {k: dict(v) for k, v in prev.items()}
    names = {f"{ns}/{name}" for ns, name in now_tenants}
    for n in names:
        if n not in out or out[n].get("until"):
            out[n] = {"since": out.get(n, {}).get("since") or stamp}
    for n, span in out.items():
        if n not in names and not span.get("until"):
            span["until"] = stamp
    return out if out != prev else None
