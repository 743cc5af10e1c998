"""The tuning library: measured records that outlive the job that measured them.

A record is only worth reusing where it was measured: the library keys each one by the workload
(TVM's structural hash of the task's IRModule, the JSON database's own key), the target (its JSON,
the arch included), the device model (the GPU's name, or the CPU's) and the GPU share it was
measured under (MPS active-thread %; 100 for a whole GPU or a CPU). A lookup returns records of
one (target, device, share) only.

Layout, one library per URI (a directory on a PVC, or ``s3://bucket/prefix``), scoped by a name
(a namespace by default)::

    <scope>/jobs/<job-uid>.json   one object per job that added to it: its measured records and
                                  the IR of their workloads

Each job writes its own object, never another's, so any number of jobs can add at once without
a lock or a conditional write and none loses a record; readers take the union and deduplicate
(per key and schedule, the fastest measurement wins). Only measured records go in: failed runs
(MetaSchedule's 1e10) do not. The library holds workload IR and schedule traces, no weights.

Pure JSON: no TVM here. ``export`` writes a JSONDatabase stock TVM reads; ``contribution`` reads one.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sharetune.api.topology import RECORDS_FILE, WORKLOADS_FILE

from ..errors import TunerError
from .records import mean_secs, measured, read_lines

VERSION = 1
FULL_SHARE = 100
# The library's own S3 credentials and endpoint (SHARETUNE_LIBRARY_AWS_ACCESS_KEY_ID, ...,
# SHARETUNE_LIBRARY_S3_ENDPOINT), each falling back to the job output store's variable.
LIBRARY_ENV_PREFIX = "SHARETUNE_LIBRARY_"


class LibraryError(TunerError):
    """A library that cannot be read or written: the message names the URI and the fix."""


@dataclass(frozen=True)
class Where:
    """Where records were measured: the device's model and the GPU share (MPS active-thread %)."""

    device: str
    share: int = FULL_SHARE


@dataclass(frozen=True)
class Key:
    workload: str  # structural hash
    target: str  # canonical target JSON
    device: str
    share: int


def target_key(target: Any) -> str:
    """A record's target as one canonical string: the same target always gives the same key."""
    return json.dumps(target, sort_keys=True, separators=(",", ":"))


# ---- where the objects live -----------------------------------------------------------------------
class Backend(Protocol):
    uri: str

    def put(self, name: str, data: bytes) -> None: ...

    def get(self, name: str) -> bytes: ...

    def names(self, prefix: str) -> list[str]: ...


class DirBackend:
    """A directory (a PVC's mount): each object a file, written whole (temp file + rename)."""

    def __init__(self, root: Path) -> None:
        self.root, self.uri = root, str(root)

    def put(self, name: str, data: bytes) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # readers see the old object or the new one, never half of one

    def get(self, name: str) -> bytes:
        return (self.root / name).read_bytes()

    def names(self, prefix: str) -> list[str]:
        base = self.root / prefix
        if not base.is_dir():
            return []
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*.json") if not p.name.startswith(".tmp-"))


class S3Backend:
    """An S3 bucket under a prefix; credentials and endpoint as the job outputs' store reads them."""

    def __init__(self, bucket: str, prefix: str) -> None:
        from .backends import s3_client

        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}"
        self.s3 = s3_client(LIBRARY_ENV_PREFIX)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _call(self, what: str, fn: Any, **kw: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return fn(Bucket=self.bucket, **kw)
        except (BotoCoreError, ClientError) as e:
            raise LibraryError(f"library {self.uri}: cannot {what}: {e}") from None

    def put(self, name: str, data: bytes) -> None:
        self._call(f"write {name}", self.s3.put_object, Key=self._key(name), Body=data)

    def get(self, name: str) -> bytes:
        return bytes(self._call(f"read {name}", self.s3.get_object, Key=self._key(name))["Body"].read())

    def names(self, prefix: str) -> list[str]:
        pages = self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self._key(prefix))
        try:
            keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
        except Exception as e:  # botocore's errors, raised while paging
            raise LibraryError(f"library {self.uri}: cannot list {prefix}: {e}") from None
        cut = len(self.prefix) + 1 if self.prefix else 0
        return sorted(k[cut:] for k in keys if k.endswith(".json"))


def open_library(uri: str) -> Backend:
    """``s3://bucket/prefix`` or a directory path."""
    if uri.startswith("s3://"):
        bucket, _, prefix = uri[5:].partition("/")
        if not bucket:
            raise LibraryError(f"library {uri!r}: no bucket; use s3://BUCKET/PREFIX or a directory")
        return S3Backend(bucket, prefix)
    if "://" in uri:
        raise LibraryError(f"library {uri!r}: use s3://BUCKET/PREFIX or a directory path")
    return DirBackend(Path(uri))


# ---- what a job adds --------------------------------------------------------------------------------
def contribution(db_dir: Path, job: str, where: Where) -> dict[str, Any]:
    """A JSONDatabase directory's measured records as a library object: deduplicated (per workload,
    target and schedule the fastest measurement), failed runs left out."""
    workloads = read_lines(db_dir / WORKLOADS_FILE)
    best: dict[tuple[str, str, str], tuple[float, list[Any]]] = {}
    for m in measured(workloads, read_lines(db_dir / RECORDS_FILE)):
        k = (m.workload, target_key(m.body[2]), json.dumps(m.body[0], sort_keys=True))
        if k not in best or m.secs < best[k][0]:
            best[k] = (m.secs, m.body)
    used = {k[0] for k in best}
    return {"version": VERSION, "job": job, "device": where.device, "share": where.share,
            "workloads": {str(h): ir for h, ir in workloads if str(h) in used},
            "records": [[k[0], body] for k, (_, body) in sorted(best.items())]}


def object_name(lib: Backend, scope: str, job_uid: str) -> str:
    """Where a job's contribution lives in the library: one object per job."""
    if not job_uid or "/" in job_uid or not scope or ".." in scope:
        raise LibraryError(f"library {lib.uri}: scope {scope!r} and job {job_uid!r} must be plain names")
    return f"{scope}/jobs/{job_uid}.json"


def add(lib: Backend, scope: str, job_uid: str, obj: dict[str, Any]) -> str:
    """Writes a job's contribution as its own object; returns its name. Adding again (a merge that
    ran twice) replaces that job's object, never another's."""
    name = object_name(lib, scope, job_uid)
    lib.put(name, json.dumps(obj, separators=(",", ":")).encode())
    return name


# ---- what a job reads -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    key: Key
    secs: float
    record: list[Any]  # the tuning record's body: [trace, run_secs, target, args_info]
    job: str


def _objects(lib: Backend, scope: str) -> Iterator[dict[str, Any]]:
    for name in lib.names(f"{scope}/jobs/"):
        try:
            obj = json.loads(lib.get(name))
        except (ValueError, OSError) as e:
            raise LibraryError(f"library {lib.uri}: {name} is not a library object ({e})") from None
        if obj.get("version") != VERSION:
            continue  # written by another version of the format: not read, never rewritten
        yield obj


def entries(lib: Backend, scope: str) -> tuple[list[Entry], dict[str, str]]:
    """Every record of the scope, deduplicated across jobs, and the IR of their workloads."""
    best: dict[tuple[Key, str], Entry] = {}
    irs: dict[str, str] = {}
    for obj in _objects(lib, scope):
        irs.update(obj["workloads"])
        for wl, body in obj["records"]:
            secs = mean_secs(body[1])
            if secs is None:
                continue
            e = Entry(Key(wl, target_key(body[2]), obj["device"], int(obj["share"])), secs, body, obj["job"])
            k = (e.key, json.dumps(body[0], sort_keys=True))
            if k not in best or secs < best[k].secs:
                best[k] = e
    return sorted(best.values(), key=lambda e: (e.key.workload, e.secs)), irs


def matching(found: Iterable[Entry], target: str, where: Where, workloads: set[str] | None = None,
             top_k: int | None = None) -> list[Entry]:
    """The entries measured on ``target`` with ``where``'s device and share (another target, device
    or share is never reused), fastest first per workload, at most ``top_k`` each."""
    out: list[Entry] = []
    per: dict[str, int] = {}
    for e in sorted(found, key=lambda e: (e.key.workload, e.secs)):
        if (e.key.target, e.key.device, e.key.share) != (target, where.device, where.share):
            continue
        if workloads is not None and e.key.workload not in workloads:
            continue
        if top_k is not None and per.get(e.key.workload, 0) >= top_k:
            continue
        per[e.key.workload] = per.get(e.key.workload, 0) + 1
        out.append(e)
    return out


def export(chosen: list[Entry], irs: dict[str, str], out_dir: Path) -> int:
    """Writes ``chosen`` as a JSONDatabase directory (what stock TVM's ``JSONDatabase`` reads);
    returns the records written. A directory that already holds a database is refused: writing
    over it would lose that database's records."""
    held = [f for f in (WORKLOADS_FILE, RECORDS_FILE) if (out_dir / f).exists()]
    if held:
        raise LibraryError(f"{out_dir} already holds a database ({held[0]}): export writes a new one, so give a "
                           "directory without one (import adds a database to the library)")
    out_dir.mkdir(parents=True, exist_ok=True)
    order = sorted({e.key.workload for e in chosen})
    missing = [w for w in order if w not in irs]
    if missing:
        raise LibraryError(f"the library holds records of workloads without their IR: {', '.join(missing[:3])}")
    index = {w: i for i, w in enumerate(order)}
    (out_dir / WORKLOADS_FILE).write_text("".join(json.dumps([w, irs[w]]) + "\n" for w in order))
    (out_dir / RECORDS_FILE).write_text("".join(json.dumps([index[e.key.workload], e.record]) + "\n" for e in chosen))
    return len(chosen)
