"""Cluster reads: what a job's children show, gathered into a :class:`status.Observed`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..api.spec import TuningJobSpec
from ..api.summary import Summary
from ..api.topology import PROGRESS_FILE, SUMMARY_FILE, ChildNames
from ..driver import shard_clamp
from ..planner import JobRef, daemon_names, published_gpu
from .context import Context
from .status import DaemonView, Observed, ShardView, count_indexes, started

MANAGED = "app.kubernetes.io/managed-by=sharetune"


@dataclass
class Snapshot:
    """The operator's children across the watched namespaces, listed once per status tick:
    three list calls per tick in all, instead of several reads per job (measured with 200 jobs:
    the per-job reads were what kept the API server busy)."""

    configmaps: dict[tuple[str, str], Any] = field(default_factory=dict)
    jobs: dict[tuple[str, str], Any] = field(default_factory=dict)
    daemons: dict[tuple[str, str], Any] = field(default_factory=dict)
    pending_pods: dict[tuple[str, str], Any] = field(default_factory=dict)  # Pending only: cheap when all run
    pools: dict[str, Any] = field(default_factory=dict)  # GPU pool daemons by name (the pool namespace)


def snapshot(ctx: Context, pools: bool = True, pool_pods: list[Any] | None = None) -> Snapshot:
    """One list per kind of child for a whole status tick. ``pools``: whether any job the tick
    sees is in mode pool (else the pool daemons are not looked at); ``pool_pods``: the pool daemons
    as this tick listed them (None: listed here)."""
    core, batch = ctx.core, ctx.batch
    daemons_sel = MANAGED + ",app.kubernetes.io/component=mps-daemon"

    def index(items: list[Any]) -> dict[tuple[str, str], Any]:
        return {(o.metadata.namespace, o.metadata.name): o for o in items}

    if ctx.namespaces:
        cms = [o for ns in ctx.namespaces for o in core.list_namespaced_config_map(ns, label_selector=MANAGED).items]
        jobs = [o for ns in ctx.namespaces for o in batch.list_namespaced_job(ns, label_selector=MANAGED).items]
        pods = [o for ns in ctx.namespaces for o in core.list_namespaced_pod(ns, label_selector=daemons_sel).items]
        pending = [o for ns in ctx.namespaces for o in core.list_namespaced_pod(
            ns, label_selector=MANAGED, field_selector="status.phase=Pending").items]
    else:
        cms = core.list_config_map_for_all_namespaces(label_selector=MANAGED).items
        jobs = batch.list_job_for_all_namespaces(label_selector=MANAGED).items
        pods = core.list_pod_for_all_namespaces(label_selector=daemons_sel).items
        pending = core.list_pod_for_all_namespaces(label_selector=MANAGED, field_selector="status.phase=Pending").items
    # GPU pools (mode pool): one more list, in the operator's namespace, for the GPUs they publish
    if pools and pool_pods is None:
        pool_pods = core.list_namespaced_pod(ctx.sharing.pool_namespace,
                                             label_selector=MANAGED + ",app.kubernetes.io/component=gpu-pool").items
    by_name = {str(o.metadata.name): o for o in pool_pods or []} if pools else {}
    return Snapshot(index(cms), index(jobs), index(pods), index(pending), by_name)


def published(pod: Any) -> str | None:
    """The GPU UUID an MPS daemon pod (a job's or a pool's) published, while it runs."""
    if pod is None:
        return None
    return published_gpu(pod.metadata.annotations, pod.status.phase if pod.status else None,
                         pod.metadata.deletion_timestamp is not None)


def unschedulable(pod: Any) -> str | None:
    """The scheduler's message for a pod it cannot place."""
    for c in (pod.status.conditions or []) if pod.status else []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return str(c.message)
    return None


def secret_problem(pods: list[Any], namespace: str, s: TuningJobSpec) -> str | None:
    """The S3 Secret the pods' env refers to, as the kubelet reports it on the job's pods that
    cannot start (``CreateContainerConfigError``): missing, or a key missing. The operator never
    reads Secrets; the kubelet, which resolves the pods' ``secretKeyRef``, says what it lacks."""
    s3 = s.output.s3
    if s3 is None:
        return None
    for pod in pods:
        for cs in (pod.status.container_statuses or []) if pod.status else []:
            waiting = cs.state.waiting if cs.state else None
            if waiting is None or waiting.reason != "CreateContainerConfigError" or not waiting.message:
                continue
            said = str(waiting.message)
            if f'"{s3.secret_name}" not found' in said:
                return (f"Secret {s3.secret_name} (spec.output.s3.credentialsSecret.name) does not exist in "
                        f"{namespace}; create it: kubectl create secret generic {s3.secret_name} -n {namespace} "
                        f"--from-literal={s3.access_key_id_key}=... --from-literal={s3.secret_access_key_key}=...")
            key = re.search(rf"couldn't find key (\S+) in Secret {re.escape(namespace)}/{re.escape(s3.secret_name)}\b",
                            said)
            if key:
                return f"Secret {s3.secret_name} has no key {key.group(1)}"
    return None


def observe(ctx: Context, job: JobRef, s: TuningJobSpec, snap: Snapshot) -> Observed:
    n = ChildNames(job.name)
    ns = job.namespace
    shards = []
    for i in range(s.shards):
        cm = snap.configmaps.get((ns, n.shard(i)))
        shards.append(ShardView.from_progress(i, (cm.data or {}).get(PROGRESS_FILE) if cm else None))
    cj = snap.jobs.get((ns, n.clients))
    clamp = shard_clamp(s.shards, shards, s.shards_asked)
    job_shards = cj.spec.completions if cj is not None and cj.spec is not None else None
    # clients.shards, or fewer once a client has reported that only the first few have a task:
    # the status and the merge follow the clamp at once, before the Job is scaled down to it.
    count = min(s.shards, job_shards or s.shards, clamp.shards if clamp else s.shards)
    obs = Observed(shards=shards[:count], client_shards=count, clients_job_shards=job_shards, clamp=clamp)
    if cj is not None and cj.status is not None:
        obs.clients_succeeded = count_indexes(cj.status.completed_indexes, count)
        obs.clients_failed_indexes = cj.status.failed_indexes
        for c in cj.status.conditions or []:
            if c.type in ("Complete", "Failed") and c.status == "True":
                obs.clients_finished = True
            if c.type == "Failed" and c.status == "True":
                obs.clients_failed, obs.clients_failed_message = True, f"{c.reason}: {c.message}"
    mj = snap.jobs.get((ns, n.merge))
    if mj is not None:
        obs.merge_exists = True
        for c in (mj.status.conditions or []) if mj.status else []:
            if c.type == "Complete" and c.status == "True":
                obs.merge_succeeded = True
            if c.type == "Failed" and c.status == "True":
                obs.merge_failed, obs.merge_message = True, f"{c.reason}: {c.message}"
    if obs.merge_succeeded:
        cm = snap.configmaps.get((ns, n.result(s)))
        text = (cm.data or {}).get(SUMMARY_FILE) if cm else None
        obs.summary = Summary.from_json(text)
    for g, daemon_name, _ in daemon_names(job.name, s) if s.uses_mps else []:
        pod = snap.daemons.get((ns, daemon_name))
        view = obs.daemons.setdefault(str(g or 0), DaemonView())
        if pod is not None:
            obs.daemon_unschedulable = unschedulable(pod) or obs.daemon_unschedulable
            phase = pod.status.phase if pod.status else None
            ended = phase in ("Failed", "Succeeded") or pod.metadata.deletion_timestamp is not None
            view.state = "failed" if ended else ("running" if phase == "Running" else "pending")
            view.restarts = sum(c.restart_count or 0 for c in (pod.status.container_statuses or []))
    pending = [pod for (pns, _), pod in snap.pending_pods.items()
               if pns == ns and (pod.metadata.labels or {}).get("sharetune.io/job") == job.name]
    for pod in pending:
        why = unschedulable(pod)
        if why:
            obs.unschedulable = f"{pod.metadata.labels.get('app.kubernetes.io/component', 'pod')}: {why}"
            break
    if not started(shards):
        obs.secret_problem = secret_problem(pending, ns, s)
    return obs
