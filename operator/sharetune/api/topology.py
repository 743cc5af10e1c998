"""Names and places a TuningJob's parts agree on: child objects, GPU groups, ports, the shard's
files, the output store's objects and its S3 key layout.

The operator's planner, its status reads, the tuner pods and local mode all derive these from
here, so a name is written once. Pure: standard library and the spec only.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from .spec import S3Output, TuningJobSpec

# ---- ports and paths inside the pods -----------------------------------------------------------
TRACKER_PORT = 9190
SERVER_PORT = 9091
METRICS_PORT = 9400
JOB_MANIFEST = "/etc/sharetune/job.yaml"  # the spec ConfigMap, mounted read-only
POD_WORK_DIR = "/work"  # an emptyDir: the client's shard database, the merge's output
MODEL_DIR = "/model"  # an ONNX model from a ConfigMap or PVC, mounted read-only
MODEL_DIR_ENV = "SHARETUNE_MODEL_DIR"
MODEL_FILE = "model.onnx"  # a ConfigMap-sourced model's file name in MODEL_DIR
MPS_HOST_ROOT = "/run/sharetune/mps"  # per-job pipe/log directories on the GPU node, <root>/<job UID>
MPS_POOL_ROOT = "/run/sharetune/pools"  # per-GPU pool pipe/log directories, <root>/<release namespace>/gpu-<index>
BUILD_PORT = 9192  # the builder pods' build service (spec.builders; docs/build-pool.md)
BUILD_KEY_DIR = "/etc/sharetune/build-key"  # the job's build key Secret, mounted read-only
BUILD_KEY_FILE = "authkey"  # its key and file name
BUILD_AUTHKEY_FILE_ENV = "SHARETUNE_BUILD_AUTHKEY_FILE"  # tells the tuner where the key file is
BUILD_AUTHKEY_ENV = "SHARETUNE_BUILD_AUTHKEY"  # or the key itself (local mode: set by the run)
BUILD_DIR_ENV = "SHARETUNE_BUILD_DIR"  # where built candidates go (builder.export_shared); unset: /tmp
MPS_READY_FILE = "sharetune-ready"  # in an MPS pipe directory: its daemon answers and has its defaults

# ---- a shard's files (the client's work dir; what the store keeps of a shard) ------------------
WORKLOADS_FILE = "database_workload.json"  # MetaSchedule JSONDatabase: one line per workload
RECORDS_FILE = "database_tuning_record.json"  # one line per trial
PROGRESS_FILE = "progress.json"  # the client's progress; the operator reads it into the status
# The job as a shared GPU's tenant list names it ("<namespace>/<name>"; the name in local mode):
# set on a pool job's servers and merge, read by the tuner's measurement windows.
TENANT_ENV = "SHARETUNE_TENANT"
CLIENT_LOG = "client.log"  # the client's own log, stored with its records (pod logs outlive the pod)
SUMMARY_FILE = "summary.json"  # the merge's result summary
# A local-mode work dir's copy of the job as it ran (its ONNX path made absolute): what
# `sharetune result compile WORKDIR` reads the model from, as it reads a TuningJob's spec.
LOCAL_JOB_FILE = "job.yaml"

# ---- objects in the output store (ConfigMaps or S3) --------------------------------------------
RESULT_OBJECT = "result"


def shard_object(i: int) -> str:
    """The store object (and ConfigMap suffix) of shard ``i``."""
    return f"shard-{i}"


def object_configmap(job: str, obj: str, result_configmap: str | None = None) -> str:
    """The ConfigMap that holds store object ``obj`` of ``job``: ``<job>-shard-<i>`` for shards,
    the result ConfigMap (``spec.output.configMap.name`` or ``<job>-result``) for the result."""
    if obj == RESULT_OBJECT:
        return result_configmap or f"{job}-{RESULT_OBJECT}"
    return f"{job}-{obj}"


def s3_job_prefix(prefix: str, namespace: str, job: str) -> str:
    """Where a job's objects live in its bucket: ``[<prefix>/]<namespace>/<job>``."""
    return f"{prefix.strip('/')}/{namespace}/{job}" if prefix.strip("/") else f"{namespace}/{job}"


def s3_object_key(job_prefix: str, obj: str) -> str:
    """The key of store object ``obj`` (a tar.gz) under a job's prefix."""
    return f"{job_prefix}/{obj}.tar.gz" if job_prefix else f"{obj}.tar.gz"


def s3_extra_key(job_prefix: str, obj: str, key: str) -> str:
    """A small text object stored beside ``obj`` (its progress or summary JSON)."""
    return f"{job_prefix}/{obj}/{key}" if job_prefix else f"{obj}/{key}"


def store_uri(namespace: str, job: str, spec: TuningJobSpec) -> str:
    """The store the job's clients and merge read and write."""
    s3 = spec.output.s3
    if s3 is not None:
        return f"s3://{s3.bucket}/{s3_job_prefix(s3.prefix, namespace, job)}"
    return configmap_uri(namespace, job)


def configmap_uri(namespace: str, job: str) -> str:
    return f"configmap://{namespace}/{job}"


def result_location(namespace: str, job: str, spec: TuningJobSpec) -> str:
    if spec.output.s3 is not None:
        return f"{store_uri(namespace, job, spec)}/{RESULT_OBJECT}"
    return configmap_uri(namespace, object_configmap(job, RESULT_OBJECT, spec.output.config_map))


# ---- child objects -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChildNames:
    """The names of a job's child objects (deterministic: re-creating them is idempotent)."""

    job: str

    @property
    def spec(self) -> str:
        return f"{self.job}-spec"

    @property
    def service_account(self) -> str:
        return f"{self.job}-tuner"

    @property
    def mps(self) -> str:
        return f"{self.job}-mps"

    @property
    def tracker(self) -> str:
        return f"{self.job}-tracker"

    @property
    def servers(self) -> str:
        return f"{self.job}-servers"

    @property
    def clients(self) -> str:
        return f"{self.job}-clients"

    @property
    def merge(self) -> str:
        return f"{self.job}-merge"

    @property
    def network_policy(self) -> str:
        """Who may connect to the job's pods (sharetune.netpolicy)."""
        return f"{self.job}-network"

    @property
    def builders(self) -> str:
        """The builders' Deployment, headless Service and HorizontalPodAutoscaler (spec.builders)."""
        return f"{self.job}-builders"

    @property
    def build_key(self) -> str:
        """The Secret with the job's build key (clients and builders authenticate with it)."""
        return f"{self.job}-build-key"

    @property
    def s3_cleanup(self) -> str:
        """The Job that deletes the job's S3 objects when the TuningJob is deleted
        (``spec.output.s3.cleanupOnDelete``). Job names are at most 48 characters (the CRD), so
        this one stays within the 63 of a label value (the Job's pods carry it)."""
        return f"{self.job}-s3-cleanup"

    def result(self, spec: TuningJobSpec) -> str:
        return object_configmap(self.job, RESULT_OBJECT, spec.output.config_map)

    def shard(self, i: int) -> str:
        """The per-shard ConfigMap: progress (always) and, for ConfigMap output, the records."""
        return object_configmap(self.job, shard_object(i))


# ---- GPU groups ----------------------------------------------------------------------------------
GPU_INDEX_LABEL = "sharetune.io/gpu-index"


def gpu_groups(spec: TuningJobSpec) -> list[int | None]:
    """One group per GPU of a job that spans several (``spec.gpu_count`` > 1): with MPS, its own
    daemon and ``servers.replicas`` servers under it; without MPS, ``servers.replicas`` servers
    that each own a GPU. ``None`` = the single-GPU (or CPU) layout, whose objects and processes
    keep their plain names."""
    if spec.gpu_count > 1:
        return list(range(spec.gpu_count))
    return [None]


def in_group(name: str, g: int | None) -> str:
    """A name within GPU group ``g``: ``<name>-<g>``; the plain name outside groups."""
    return name if g is None else f"{name}-{g}"


# ---- GPU pools (mode pool; docs/gpu-pools.md) -----------------------------------------------------
POOL_LABEL = "sharetune.io/gpu-pool"  # on a pool daemon pod and on the servers attached to it: its name
POOL_NODE_ANNOTATION = "sharetune.io/node"  # a pool daemon's node (node names may exceed a label value)


def pool_pod_name(node: str, index: int) -> str:
    """The pool daemon pod of GPU ``index`` on ``node``: deterministic (creating it twice is a
    409), a DNS label and a label value (<= 63 characters) whatever the node's name."""
    base = re.sub(r"[^a-z0-9-]+", "-", node.lower()).strip("-") or "node"
    if len(base) > 40 or base != node:
        base = f"{base[:31].strip('-')}-{hashlib.sha256(node.encode()).hexdigest()[:8]}"
    return f"pool-{base}-gpu{index}"


def pool_host_dir(namespace: str, index: int) -> str:
    """The pipe/log directory of GPU ``index``'s pool on its node (a hostPath), under the pool's
    (the release's) namespace: two releases on one node never share a daemon's pipe."""
    return f"{MPS_POOL_ROOT}/{namespace}/gpu-{index}"


def s3_env(s3: S3Output | None, prefix: str = "") -> list[dict[str, Any]]:
    """A pod's env for an S3 location (the tuner's ``store.s3_client`` reads it): the keys from the
    location's Secret, its region and endpoint. ``prefix``: another bucket's own variables beside the
    job output store's (the tuning library's ``SHARETUNE_LIBRARY_``), its endpoint ``<prefix>S3_ENDPOINT``."""
    if s3 is None:
        return []
    env: list[dict[str, Any]] = [
        {"name": prefix + "AWS_ACCESS_KEY_ID",
         "valueFrom": {"secretKeyRef": {"name": s3.secret_name, "key": s3.access_key_id_key}}},
        {"name": prefix + "AWS_SECRET_ACCESS_KEY",
         "valueFrom": {"secretKeyRef": {"name": s3.secret_name, "key": s3.secret_access_key_key}}},
        {"name": prefix + "AWS_DEFAULT_REGION", "value": s3.region},
    ]
    if s3.endpoint:
        env.append({"name": (prefix + "S3_ENDPOINT") if prefix else "SHARETUNE_S3_ENDPOINT", "value": s3.endpoint})
    return env
