"""Where a job's shard records, progress and results live: ConfigMaps or an S3-compatible bucket.

URIs: ``configmap://<namespace>/<job>`` or ``s3://<bucket>/<prefix...>`` (credentials from the
environment: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, endpoint from SHARETUNE_S3_ENDPOINT).

Objects: ``shard-<i>`` (a shard's database as tar.gz) and ``result`` (merged records, best records
and summary), each with small text files next to it (``progress.json``, ``summary.json``). In
ConfigMaps they are gzip'd binaryData and the text files its data keys; in S3 objects
``<prefix>/<name>.tar.gz`` and ``<prefix>/<name>/<key>``. Anything that would pass the API
server's 1 MiB object limit raises :class:`OutputTooLarge` instead of being truncated.

Both stores implement :class:`Store` in full: callers never ask which one they have.
"""

from __future__ import annotations

import base64
import io
import os
import tarfile
import time
from pathlib import Path
from typing import Any, Protocol

from sharetune.api.exitcodes import ExitCode
from sharetune.api.topology import object_configmap, s3_extra_key, s3_object_key

from ..errors import TunerError

CONFIGMAP_LIMIT = 1024 * 1024
_CM_HEADROOM = 16 * 1024  # metadata, keys and progress JSON share the object with the payload


class StoreFailure(TunerError):
    """The store did not take or give an object: one of the two below."""


class OutputTooLarge(StoreFailure):
    """Permanent: the object will never fit (a ConfigMap's 1 MiB); no retry helps."""

    exit_code = ExitCode.OUTPUT_TOO_LARGE


class StoreError(StoreFailure):
    """The store cannot be reached or refuses (down, restarting, denied); a later try may work."""

    exit_code = ExitCode.STORE


class Store(Protocol):
    """Where a job's objects live (``open_store``). Each object is a blob plus small text files
    next to it; the writes raise :class:`OutputTooLarge` or :class:`StoreError`."""

    uri: str

    def put(self, name: str, data: bytes, extra: dict[str, str] | None = None) -> None:
        """Stores ``data`` as object ``name``, and each ``extra`` text file next to it."""
        ...

    def get(self, name: str) -> bytes | None:
        """Object ``name``'s data, None if there is none."""
        ...

    def put_text(self, name: str, key: str, text: str) -> None:
        """Stores one text file next to object ``name`` (which may not exist), leaving its data."""
        ...


def pack(directory: Path, names: list[str] | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for p in sorted(directory.rglob("*")):
            rel = p.relative_to(directory)
            if p.is_file() and (names is None or str(rel) in names or rel.parts[0] in names):
                tar.add(p, arcname=str(rel))
    return buf.getvalue()


def pack_bytes(files: dict[str, bytes]) -> bytes:
    """A tar.gz of in-memory files (a snapshot taken without touching the files themselves)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def read_packed(data: bytes) -> dict[str, bytes]:
    """The regular files of a :func:`pack_bytes` tar.gz, in memory (nothing written)."""
    out: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for m in tar.getmembers():
            f = tar.extractfile(m) if m.isfile() else None
            if f is not None:
                out[m.name] = f.read()
    return out


def unpack(data: bytes, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(directory, filter="data")  # refuses absolute paths and ../ escapes
            return
        # Python without extraction filters (Debian bookworm's 3.11.2, the images' Python): the
        # same refusal by hand, regular files and directories only.
        top = directory.resolve()
        for m in tar.getmembers():
            dest = (top / m.name).resolve()
            if m.name.startswith("/") or not (dest == top or top in dest.parents) or not (m.isfile() or m.isdir()):
                raise StoreError(f"refusing to unpack {m.name!r}")
        tar.extractall(directory)


def _kube_core() -> Any:
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))  # read now, not at import
    return client.CoreV1Api()


try:  # what the Kubernetes client raises when the API server cannot be reached at all
    from urllib3.exceptions import HTTPError as _HTTPError
except ImportError:  # pragma: no cover (urllib3 comes with the kubernetes client)
    _HTTPError = OSError  # type: ignore[misc,assignment]  # a stand-in class when urllib3 is absent
_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (_HTTPError, OSError)


class ConfigMapStore:
    """Objects live in ConfigMaps the operator created (the pods may only patch those)."""

    def __init__(self, namespace: str, job: str, result_name: str | None = None) -> None:
        self.namespace, self.job = namespace, job
        self.result_name = result_name or f"{job}-result"
        self.uri = f"configmap://{namespace}/{job}"
        self._core = None

    @property
    def core(self) -> Any:
        if self._core is None:
            self._core = _kube_core()
        return self._core

    def configmap(self, name: str) -> str:
        return object_configmap(self.job, name, self.result_name)

    def put(self, name: str, data: bytes, extra: dict[str, str] | None = None) -> None:
        encoded = base64.b64encode(data).decode()
        if len(encoded) + sum(len(v) for v in (extra or {}).values()) > CONFIGMAP_LIMIT - _CM_HEADROOM:
            raise OutputTooLarge(f"{name} is {len(data)} bytes compressed: more than a ConfigMap holds (1 MiB); "
                                 "use spec.output.s3 for this job")
        body = {"binaryData": {"data.tar.gz": encoded}, "data": extra or {}}
        self._patch(self.configmap(name), body)

    def _patch(self, cm: str, body: dict[str, Any]) -> None:
        from kubernetes.client.rest import ApiException

        try:
            self.core.patch_namespaced_config_map(cm, self.namespace, body)
        except ApiException as e:
            if e.status == 422 and "Too long" in (e.body or ""):
                raise OutputTooLarge(f"ConfigMap {cm} would pass the 1 MiB limit: {e.reason}") from None
            raise StoreError(f"cannot write ConfigMap {self.namespace}/{cm}: {e.status} {e.reason}") from None
        except _TRANSPORT_ERRORS as e:  # API server unreachable (restarting): the caller retries
            raise StoreError(f"cannot write ConfigMap {self.namespace}/{cm}: {type(e).__name__}") from None

    def put_text(self, name: str, key: str, text: str) -> None:
        self._patch(self.configmap(name), {"data": {key: text}})

    def get(self, name: str) -> bytes | None:
        from kubernetes.client.rest import ApiException

        try:
            cm = self.core.read_namespaced_config_map(self.configmap(name), self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise StoreError(f"cannot read ConfigMap {self.namespace}/{self.configmap(name)}: {e.status}") from None
        except _TRANSPORT_ERRORS as e:
            raise StoreError(f"cannot read ConfigMap {self.namespace}/{self.configmap(name)}: "
                             f"{type(e).__name__}") from None
        blob = (cm.binary_data or {}).get("data.tar.gz")
        return base64.b64decode(blob) if blob else None


def s3_client(env_prefix: str = "") -> Any:
    """An S3 client from the environment: credentials and region as boto3 reads them
    (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION), the endpoint from
    SHARETUNE_S3_ENDPOINT (an S3-compatible store; unset: AWS). ``env_prefix``: the same variables
    with this prefix come first (the tuning library's own bucket: ``SHARETUNE_LIBRARY_``)."""
    import boto3
    from botocore.config import Config

    def env(name: str) -> str | None:
        return os.environ.get(env_prefix + name) or os.environ.get(name) or None

    endpoint = (os.environ.get(env_prefix + "S3_ENDPOINT") if env_prefix else None) or \
        os.environ.get("SHARETUNE_S3_ENDPOINT") or None
    # Retries with backoff: an S3 server that is away for a minute must not lose records.
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=env("AWS_ACCESS_KEY_ID"),
                        aws_secret_access_key=env("AWS_SECRET_ACCESS_KEY"), region_name=env("AWS_DEFAULT_REGION"),
                        config=Config(retries={"max_attempts": 10, "mode": "standard"},
                                      connect_timeout=5, read_timeout=30))


def delete_s3_prefix(bucket: str, job_prefix: str) -> tuple[str, int]:
    """Deletes every object of ``bucket`` under ``<job_prefix>/`` (a job's objects; the slash keeps
    job "a" from taking the objects of job "ab"): (the prefix deleted, how many objects). A bucket
    that does not exist holds nothing to delete."""
    from botocore.exceptions import BotoCoreError, ClientError

    job_prefix = job_prefix.strip("/")
    if not bucket or not job_prefix:
        # An empty prefix would be the whole bucket: never what a job's clean-up means.
        raise TunerError(f"--bucket {bucket!r} --prefix {job_prefix!r}: both must be non-empty")
    prefix = job_prefix + "/"
    s3 = s3_client()
    deleted = 0
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                s3.delete_object(Bucket=bucket, Key=obj["Key"])
                deleted += 1
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") == "NoSuchBucket":
            return prefix, deleted
        raise StoreError(f"cannot delete s3://{bucket}/{prefix} ({deleted} objects deleted): {e}") from None
    except BotoCoreError as e:
        raise StoreError(f"cannot delete s3://{bucket}/{prefix} ({deleted} objects deleted): {e}") from None
    return prefix, deleted


class S3Store:
    def __init__(self, bucket: str, prefix: str) -> None:
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}"
        self.s3 = s3_client()

    def key(self, name: str) -> str:
        return s3_object_key(self.prefix, name)

    def text_key(self, name: str, key: str) -> str:
        """Where a text file next to object ``name`` lives: ``<prefix>/<name>/<key>``."""
        return s3_extra_key(self.prefix, name, key)

    def _put(self, key: str, body: bytes) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.s3.put_object(Bucket=self.bucket, Key=key, Body=body)
        except (BotoCoreError, ClientError) as e:
            raise StoreError(f"cannot write s3://{self.bucket}/{key}: {e}") from None

    def put(self, name: str, data: bytes, extra: dict[str, str] | None = None) -> None:
        self._put(self.key(name), data)
        for k, v in (extra or {}).items():
            self._put(self.text_key(name, k), v.encode())

    def put_text(self, name: str, key: str, text: str) -> None:
        self._put(self.text_key(name, key), text.encode())

    def get(self, name: str) -> bytes | None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return self.s3.get_object(Bucket=self.bucket, Key=self.key(name))["Body"].read()
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise StoreError(f"cannot read s3://{self.bucket}/{self.key(name)}: {e}") from None
        except BotoCoreError as e:
            raise StoreError(f"cannot read s3://{self.bucket}/{self.key(name)}: {e}") from None


def open_store(uri: str, result_name: str | None = None) -> Store:
    scheme, _, rest = uri.partition("://")
    if scheme == "configmap":
        ns, _, job = rest.partition("/")
        if not ns or not job:
            raise StoreError(f"bad store URI {uri!r}: expected configmap://<namespace>/<job>")
        return ConfigMapStore(ns, job, result_name)
    if scheme == "s3":
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise StoreError(f"bad store URI {uri!r}: expected s3://<bucket>/<prefix>")
        return S3Store(bucket, prefix)
    raise StoreError(f"unknown store {uri!r}: use configmap://ns/job or s3://bucket/prefix")
