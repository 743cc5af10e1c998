"""The kopf registration: a thin shell. Each handler takes what kopf hands it and calls the
plain functions of ``reconcile.py`` (cluster reads in ``observe.py``, Events and phases in
``events.py``, the S3 clean-up Job in ``cleanup.py``) with the operator's :class:`Context`, which the
start-up handler builds once and keeps in kopf's memo: nothing here is a mutable global.

Run by ``sharetune operator`` (``main.py``, which passes the watched namespaces in the memo) or
directly: ``kopf run -m sharetune.controller.handlers``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from ..api.spec import API_GROUP, API_VERSION, PLURAL
from ..planner import JobRef
from . import cleanup, metrics, reconcile
from .context import MEMO_KEY, Context, load_api, of

NAMESPACES_KEY = "namespaces"  # memo key main.py sets: the namespaces to watch (none = cluster-wide)
log = logging.getLogger("sharetune.operator")


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """Credentials from the same loader the reconcilers use (in-cluster, else $KUBECONFIG)."""
    cfg = load_api().configuration
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
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
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
    # Waiting for a job's S3 clean-up Job is a TemporaryError per look: logged, not an Event.
    logging.getLogger("kopf.objects").addFilter(cleanup.QUIET_WAITING)
    # Start-up handlers run before any object is watched, so every object's memo copies this.
    memo[MEMO_KEY] = Context.from_env(tuple(memo.get(NAMESPACES_KEY) or ()))


@kopf.on.create(API_GROUP, API_VERSION, PLURAL)
@kopf.on.resume(API_GROUP, API_VERSION, PLURAL)  # type: ignore[arg-type]  # namespaced: kopf passes namespace as a str
def ensure_children(body: Any, name: str, namespace: str, uid: str, spec: Any, status: Any, meta: Any,
                    patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    reconcile.ensure_children(of(memo), body, name, namespace, uid, spec, status, meta, patch)


@kopf.on.field(API_GROUP, API_VERSION, PLURAL, field="spec.servers.replicas")  # type: ignore[arg-type]  # namespaced: kopf passes namespace as a str
def scale(name: str, namespace: str, new: Any, old: Any, body: Any, status: Any, memo: kopf.Memo, **_: Any) -> None:
    reconcile.scale(of(memo), name, namespace, new, old, body, status)


# Status is refreshed by one operator-wide loop rather than a kopf timer per job: kopf puts a
# finalizer on every object that has timers, and a TuningJob should carry one only when it asked
# for external cleanup. One list per tick also scales better than a timer per job.
@kopf.on.startup()
async def start_status_loop(memo: kopf.Memo, **_: Any) -> None:
    ctx = of(memo)

    async def loop() -> None:
        while True:
            await asyncio.sleep(ctx.status_interval_s)
            try:
                await asyncio.to_thread(reconcile.reconcile_all, ctx)
            except Exception as e:  # never let the loop die: log, count, go on
                metrics.ERRORS.labels("status", type(e).__name__).inc()
                log.exception("status loop: %s", e)

    memo["status_loop"] = asyncio.get_running_loop().create_task(loop())


@kopf.on.cleanup()
async def stop_status_loop(memo: kopf.Memo, **_: Any) -> None:
    task = memo.get("status_loop")
    if task is not None:
        task.cancel()


@kopf.on.event(API_GROUP, API_VERSION, PLURAL)
def count_phases(event: Any, memo: kopf.Memo, **_: Any) -> None:
    obj = event["object"]
    of(memo).phases.observe(obj["metadata"]["uid"], (obj.get("status") or {}).get("phase"),
                            deleted=event["type"] == "DELETED")


def _cleanup_requested(spec: Any, **_: Any) -> bool:
    return bool(((spec.get("output") or {}).get("s3") or {}).get("cleanupOnDelete"))


@kopf.on.delete(API_GROUP, API_VERSION, PLURAL, when=_cleanup_requested)  # type: ignore[arg-type]  # namespaced: kopf passes namespace as a str
def cleanup_s3(body: Any, name: str, namespace: str, uid: str, meta: Any, runtime: Any, memo: kopf.Memo,
               **_: Any) -> None:
    """Only jobs that asked for it get a finalizer (kopf adds one for matching delete handlers):
    a Job in their namespace deletes their objects from the bucket, and the finalizer goes when
    it has finished (or failed: then with a Warning). Children go by garbage collection."""
    cleanup.clean_up(of(memo), body, JobRef(name, namespace, uid), list(meta.get("finalizers") or []),
                     runtime.total_seconds())
