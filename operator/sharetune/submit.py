"""`sharetune run FILE` without `--local`: the TuningJob goes to the current cluster (kubeconfig)
and is followed there with the live table and the summary that local mode prints; `--detach`
returns once it is created. Only the kubernetes client and rich; no TVM on the submitting machine."""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .api.exitcodes import ExitCode
from .api.spec import API_GROUP, API_VERSION, PLURAL, SpecError, load_job, manifest_doc
from .smoke import custom_objects_api, result_worth

POLL_S = 2.0
DONE = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Submitted:
    namespace: str
    name: str

    @property
    def ref(self) -> str:
        return f"tuningjob {self.namespace}/{self.name}"


class Refused(Exception):
    """The API server refused to create a job: one line naming the fix, and the exit code."""

    def __init__(self, message: str, code: ExitCode) -> None:
        super().__init__(message)
        self.code = code


def default_namespace() -> str:
    """The current kubeconfig context's namespace, as kubectl uses it; else ``default``."""
    from kubernetes import config

    try:
        _, active = config.list_kube_config_contexts(config_file=os.environ.get("KUBECONFIG"))
    except (config.ConfigException, OSError, TypeError):
        return "default"
    return str((active or {}).get("context", {}).get("namespace") or "default")


def _refusal(e: Any, sub: Submitted) -> Refused:
    """What an API refusal means for the user: the job as written (a name taken, a value the API
    server rejects) is a usage error; a cluster without sharetune, rights or an answer is not."""
    if e.status == 409:
        return Refused(f"{sub.ref} already exists: delete it (kubectl delete tj {sub.name} -n {sub.namespace}) "
                       "or give this one another metadata.name", ExitCode.USAGE)
    if e.status == 404:
        return Refused(f"the cluster has no TuningJob API ({API_GROUP}/{API_VERSION}) or no namespace "
                       f"{sub.namespace!r}: install sharetune there (docs/install.md), or run it here with --local",
                       ExitCode.UNEXPECTED)
    if e.status in (401, 403):
        return Refused(f"the cluster refused to create {sub.ref} ({e.status} {e.reason}): check your kubeconfig's "
                       "rights", ExitCode.UNEXPECTED)
    if e.status == 422:
        import json

        try:
            detail = json.loads(e.body).get("message")
        except (TypeError, ValueError):
            detail = e.body
        return Refused(f"the API server rejected {sub.ref}: {detail}", ExitCode.USAGE)
    return Refused(f"creating {sub.ref} failed: {e.status} {e.reason}", ExitCode.UNEXPECTED)


def submit(api: Any, path: Path, namespace: str | None) -> Submitted:
    """Validates the manifest as local mode would, then creates it. Raises SpecError for a bad
    manifest and Refused for a refusal."""
    from kubernetes.client import ApiException

    doc = manifest_doc(path)
    load_job(doc)  # the same checks and messages as --local, before the cluster sees it
    meta = dict(doc.get("metadata") or {})
    ns = namespace or meta.get("namespace") or default_namespace()
    sub = Submitted(ns, str(meta["name"]))
    body = {**doc, "metadata": {**meta, "namespace": ns}}
    try:
        api.create_namespaced_custom_object(API_GROUP, API_VERSION, ns, PLURAL, body)
    except ApiException as e:
        raise _refusal(e, sub) from None
    return sub


def summary_lines(sub: Submitted, status: dict[str, Any], elapsed_s: float) -> list[str]:
    """The finished job as local mode's summary words it: trials, rate, latency, what it is worth,
    where the result is and how to fetch it."""
    phase = status.get("phase")
    if phase != "Succeeded":
        return [f"{sub.ref} failed after {elapsed_s:.0f} s: {status.get('message') or 'no reason given'}",
                f"  kubectl describe tj {sub.name} -n {sub.namespace}   (conditions and events)"]
    lines = [f"{sub.ref} succeeded in {elapsed_s:.0f} s: {status.get('trialsCompleted')} trials"
             + (f" at {status['trialsPerSecond']} trials/s" if status.get("trialsPerSecond") else "")]
    if status.get("tunedLatencyMs") is not None:
        lines.append(f"  latency {status.get('untunedLatencyMs')} ms untuned -> {status['tunedLatencyMs']} ms tuned: "
                     f"{result_worth(status)}")
    else:
        lines.append(f"  {result_worth(status)}")
    if status.get("resultLocation"):
        lines.append(f"  result: {status['resultLocation']}")
    lines.append("  fetch:  "
                 f"{status.get('fetchCommand') or f'sharetune result fetch tj/{sub.name} -n {sub.namespace} -o DIR'}")
    return lines


def follow(api: Any, subs: list[Submitted], console: Any, poll_s: float = POLL_S) -> int:
    """Polls each job's status until all are done, with one progress bar each; prints each
    phase change with its message and, at the end, each job's summary. 0 when all succeeded."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    t0 = time.monotonic()
    last_phase: dict[Submitted, str | None] = {s: None for s in subs}
    final: dict[Submitted, tuple[dict[str, Any], float]] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[rate]}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        tasks = {s: bar.add_task(f"{s.name} Pending", total=None, rate="") for s in subs}
        while len(final) < len(subs):
            for s in subs:
                if s in final:
                    continue
                obj = api.get_namespaced_custom_object(API_GROUP, API_VERSION, s.namespace, PLURAL, s.name)
                st = obj.get("status") or {}
                phase = st.get("phase") or "Pending"
                if phase != last_phase[s]:
                    last_phase[s] = phase
                    msg = st.get("message")
                    bar.console.print(f"{s.name}: {phase}" + (f" - {msg}" if msg else ""), soft_wrap=True)
                rate = f"{st['trialsPerSecond']} trials/s" if st.get("trialsPerSecond") else ""
                bar.update(tasks[s], description=f"{s.name} {phase}", completed=st.get("trialsCompleted") or 0,
                           total=st.get("trialsTotal") or None, rate=rate)
                if phase in DONE:
                    final[s] = (st, time.monotonic() - t0)
            if len(final) < len(subs):
                time.sleep(poll_s)
    for s in subs:
        st, elapsed = final[s]
        for line in summary_lines(s, st, elapsed):
            console.print(line, soft_wrap=True)
    return 0 if all(st.get("phase") == "Succeeded" for st, _ in final.values()) else 1


def run(a: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    try:
        api = custom_objects_api()
    except Exception as e:  # no kubeconfig, a broken one: one line, then the local alternative
        console.print(f"error: no cluster to submit to ({type(e).__name__}: {e}); set KUBECONFIG, "
                      "or run the job on this machine with --local", soft_wrap=True, markup=False)
        return int(ExitCode.USAGE)
    subs: list[Submitted] = []
    for path in a.job:
        try:
            subs.append(submit(api, path, a.namespace))
        except SpecError as e:
            console.print(f"error: {path}: {e}", soft_wrap=True, markup=False)
            return int(ExitCode.USAGE)
        except Refused as e:
            console.print(f"error: {path}: {e}", soft_wrap=True, markup=False)
            return int(e.code)
        console.print(f"{subs[-1].ref} created", markup=False)
    if a.detach:
        for s in subs:
            console.print(f"  follow it: kubectl get tj {s.name} -n {s.namespace} -w", markup=False)
        return 0
    try:
        return follow(api, subs, console)
    except KeyboardInterrupt:
        for s in subs:
            console.print(f"interrupted: {s.ref} keeps running on the cluster "
                          f"(kubectl delete tj {s.name} -n {s.namespace} stops it)", markup=False)
        return 130
