"""Deleting a job's objects from its S3 bucket (``spec.output.s3.cleanupOnDelete``), from the
operator's side: the delete handler only starts and watches a Job.

The deletion itself runs in the job's own namespace as the Job of
:func:`sharetune.planner.plan_s3_cleanup`, with the job's credentials as env from its Secret (the
kubelet resolves them) and from the job's network position: the operator neither reads the
Secret nor calls the job's endpoint. While the Job runs, the TuningJob keeps its finalizer; it
goes when the Job has succeeded, and also when the Job failed, passed its deadline or could not
be created, then with a Warning Event naming what was left in the bucket and how to remove it.
A deletion is never held longer than the Job's deadline and a little more.
"""

from __future__ import annotations

import logging
from typing import Any

import kopf
from kubernetes import client

from ..api.spec import SpecError, spec_of
from ..api.topology import ChildNames, s3_job_prefix
from ..planner import JOB_UID_ANNOTATION, S3_CLEANUP_DEADLINE_S, JobRef, plan_s3_cleanup
from . import events, kube, metrics
from .context import Context

log = logging.getLogger("sharetune.operator")

POLL_S = 3.0  # how often the delete handler looks at the Job again
# Past this the deletion goes on whatever the Job shows (a Job the controller never started, one
# of an earlier TuningJob of the same name that is still there, ...): its deadline plus slack.
GIVE_UP_S = S3_CLEANUP_DEADLINE_S + 120
WAITING = "waiting for the S3 clean-up Job"  # the TemporaryError's message (see QuietWaiting)


class QuietWaiting(logging.Filter):
    """kopf logs every TemporaryError at ERROR and, at our posting level, posts it as an Event:
    waiting for the clean-up Job is normal, so those records stay in the log at INFO and never
    become Events on the TuningJob. Installed on kopf's object logger at start-up."""

    def filter(self, record: logging.LogRecord) -> bool:
        if WAITING in record.getMessage():
            record.levelno, record.levelname = logging.INFO, "INFO"
            setattr(record, "k8s_skip", True)  # kopf's own flag: not posted
        return True


QUIET_WAITING = QuietWaiting()  # one instance: adding it again (an operator restarted in-process) is a no-op


def clean_up(ctx: Context, body: Any, job: JobRef, finalizers: list[str], waited_s: float) -> None:
    """One look at the job's clean-up Job: creates it if absent, returns once it has finished
    (succeeded: the objects are gone; failed: a Warning says what is left), raises
    kopf.TemporaryError to be called again while it runs. ``waited_s``: since the first call."""
    try:
        s = spec_of(body)
    except SpecError as e:  # nothing was tuned, so probably nothing written: say so, never block
        events.post(ctx.api, body, "Warning", "S3CleanupFailed",
                    f"cannot clean up the job's S3 objects: its spec does not parse ({e}); check the bucket by hand")
        return
    s3 = s.output.s3
    assert s3 is not None  # the handler runs only for jobs with cleanupOnDelete
    where = f"s3://{s3.bucket}/{s3_job_prefix(s3.prefix, job.namespace, job.name)}/"
    try:
        why = _look(ctx, job, s, finalizers, waited_s)
    except client.ApiException as e:
        if not kube.is_rejection(e) and waited_s < GIVE_UP_S:
            raise  # the API server is down or busy: kopf retries
        # Refused (a quota, a namespace being deleted, a policy), or still failing at the end.
        why = f"Job {ChildNames(job.name).s3_cleanup}: {e.status} {kube.reason(e)}"
    if why is None:
        events.post(ctx.api, body, "Normal", "S3CleanedUp",
                    f"deleted the job's objects under {where} (Job {ChildNames(job.name).s3_cleanup})")
    else:
        _left_behind(ctx, body, s3, where, why)


def _look(ctx: Context, job: JobRef, s: Any, finalizers: list[str], waited_s: float) -> str | None:
    """None once the Job has succeeded, why not once it has failed or the wait is over; raises
    kopf.TemporaryError while there is something to wait for."""
    name = ChildNames(job.name).s3_cleanup
    cj = kube.read_or_none(ctx.batch.read_namespaced_job, name, job.namespace)
    if cj is not None and (cj.metadata.annotations or {}).get(JOB_UID_ANNOTATION) != job.uid:
        # An earlier TuningJob's of the same name: ours starts once it is gone (its owner's
        # garbage collection, or its TTL).
        if waited_s >= GIVE_UP_S:
            return f"Job {name} of an earlier TuningJob of this name was still there after {GIVE_UP_S} s"
        raise kopf.TemporaryError(f"{WAITING}: {name} of an earlier job of this name is still there", delay=POLL_S)
    if cj is None:
        if waited_s >= GIVE_UP_S:
            return f"Job {name} did not start within {GIVE_UP_S} s"
        # Foreground deletion removes owned dependents first, and this one would go before it ran.
        if kube.create(ctx.api, plan_s3_cleanup(job, s, ctx.image, ctx.requests,
                                                owned="foregroundDeletion" not in finalizers)):
            metrics.CHILDREN.labels("Job").inc()
            log.info("%s/%s: S3 clean-up Job %s created", job.namespace, job.name, name)
        raise kopf.TemporaryError(f"{WAITING} {name}", delay=POLL_S)
    finished = _finished(cj)
    if finished == "Complete":
        return None
    if finished == "Failed":
        return _failure(ctx, cj)
    if waited_s >= GIVE_UP_S:
        return f"Job {name} did not finish within {GIVE_UP_S} s"
    raise kopf.TemporaryError(f"{WAITING} {name}", delay=POLL_S)


def _finished(cj: Any) -> str | None:
    for c in (cj.status.conditions or []) if cj.status else []:
        if c.type in ("Complete", "Failed") and c.status == "True":
            return str(c.type)
    return None


def _failure(ctx: Context, cj: Any) -> str:
    """The Job's failure: its condition and, where the kubelet kept it, the last pod's last words
    (the container's termination message: its log's tail on an error)."""
    why = next((f"{c.reason}: {c.message}" for c in cj.status.conditions or []
                if c.type == "Failed" and c.status == "True"), "failed")
    pods = ctx.core.list_namespaced_pod(cj.metadata.namespace,
                                        label_selector=f"batch.kubernetes.io/job-name={cj.metadata.name}").items
    words = ""
    for pod in sorted(pods, key=lambda p: str(p.metadata.creation_timestamp or "")):
        for cs in (pod.status.container_statuses or []) if pod.status else []:
            term = cs.state.terminated if cs.state else None
            if term is not None and term.message:
                words = term.message.strip().splitlines()[-1]
    return f"Job {cj.metadata.name} {why}" + (f" ({words[:300]})" if words else "")


def _left_behind(ctx: Context, body: Any, s3: Any, where: str, why: str) -> None:
    metrics.ERRORS.labels("delete", "S3CleanupFailed").inc()
    endpoint = f" --endpoint-url {s3.endpoint}" if s3.endpoint else ""
    events.post(ctx.api, body, "Warning", "S3CleanupFailed",
                f"the job's objects under {where} were left in the bucket: {why}. Fix the cause (the endpoint, "
                f"the bucket, the keys in Secret {s3.secret_name}) and delete them yourself: "
                f"aws s3 rm --recursive {where}{endpoint}")
