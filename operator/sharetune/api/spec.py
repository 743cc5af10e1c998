"""The TuningJob spec (sharetune.io/v1alpha1) as typed, validated Python objects.

One parser for the operator (which reads the CR) and local mode (which reads the same YAML), so
both agree on defaults and on what is an error. Pure: no kopf, no kubernetes, no TVM.
"""

from __future__ import annotations

import copy
import difflib
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .serving import tuning_pct_for

API_GROUP = "sharetune.io"
API_VERSION = "v1alpha1"
KIND = "TuningJob"
PLURAL = "tuningjobs"  # the CRD's resource name (crds/tuningjobs.sharetune.io.yaml)
TARGETS = ("llvm", "cuda")
COST_MODELS = ("xgb", "random")
# The tuner image's built-in models (sharetune_tuner.model.zoo.ZOO; tests/tuner pins that they agree).
BUILTIN_MODELS = ("resnet18", "resnet34", "resnet50", "mobilenet_v2", "transformer_encoder", "tiny_cnn")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
# How a cuda job's servers get their GPU (docs/gpu-pools.md): a share of a GPU under the operator's
# per-GPU MPS daemon ("pool"), whole GPUs with a daemon of the job's own ("exclusive"), or replicas
# of the NVIDIA device plugin's MPS sharing ("devicePlugin").
MODES = ("pool", "exclusive", "devicePlugin")
DEFAULT_DEVICE_PLUGIN_RESOURCE = "nvidia.com/gpu.shared"
_RESOURCE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?([KMGT]i?|[kmgt])?$")
# An image reference as the kubelet takes it ([registry[:port]/]path[:tag][@digest]): no spaces, no
# leading '-' (a value like "x --privileged" would reach the container runtime's arguments).
IMAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$"
_IMAGE = re.compile(IMAGE_PATTERN)

# The fields each section of a TuningJob accepts: the CRD's schema, in the one place the parser
# reads them from (tests/core/test_spec.py checks every section against the CRD), so that local
# mode rejects a misspelt field as the API server's strict field validation does. Sections not
# listed (resources, nodeSelector, affinity, tolerations: Kubernetes' own types) are not checked here.
FIELDS: dict[str, frozenset[str]] = {k: frozenset(v.split()) for k, v in {
    "": "apiVersion kind metadata spec status",
    "spec": "model target trials gpuSharing servers clients builders costModel seed image imagePullPolicy "
            "nodeSelector tolerations affinity output library ttlSecondsAfterFinished",
    "spec.model": "name onnx inputShape",
    "spec.model.onnx": "path url configMap pvc",
    "spec.model.onnx.configMap": "name key",
    "spec.model.onnx.pvc": "claimName path",
    "spec.trials": "total perTask perIteration",
    "spec.gpuSharing": "mps gpus mode share pinnedMemory devicePlugin",
    "spec.gpuSharing.devicePlugin": "resourceName",
    "spec.servers": "replicas threadPercentage servingPercentage pinnedMemoryLimit resources",
    "spec.clients": "shards builderWorkers backoffLimitPerIndex resources",
    "spec.output": "configMap s3",
    "spec.output.configMap": "name",
    "spec.output.s3": "endpoint region bucket prefix credentialsSecret cleanupOnDelete",
    "spec.output.s3.credentialsSecret": "name accessKeyIdKey secretAccessKeyKey",
    "spec.library": "mode scope path pvc s3",
    "spec.library.pvc": "claimName path",
    "spec.library.s3": "endpoint region bucket prefix credentialsSecret",
    "spec.library.s3.credentialsSecret": "name accessKeyIdKey secretAccessKeyKey",
    "spec.builders": "replicas workers resources nodeSelector tolerations autoscale",
    "spec.builders.autoscale": "minReplicas maxReplicas targetCPUUtilizationPercentage",
}.items()}


def image_repository(image: str) -> str:
    """An image reference without its digest and tag: ``reg:5000/team/tuner:1@sha256:..`` ->
    ``reg:5000/team/tuner`` (a ':' after the last '/' starts the tag; one before it is a port)."""
    ref = image.split("@", 1)[0]
    head, _, last = ref.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]


def check_image_allowed(image: str | None, allowed: tuple[str, ...]) -> None:
    """``spec.image`` against the chart's ``allowedImages`` (repositories, or prefixes of them
    ending at a '/'): a job may run only images from those. No list, or no ``spec.image`` (the
    chart's tuner image): nothing to check."""
    if image is None or not allowed:
        return
    repo = image_repository(image)
    if any(repo == a.rstrip("/") or repo.startswith(a.rstrip("/") + "/") for a in allowed):
        return
    raise SpecError(f"spec.image: {image!r} is not from an allowed repository ({', '.join(allowed)}: the chart's "
                    "allowedImages); use an image from one of them, or leave spec.image out for the operator's image")


class SpecError(ValueError):
    """A TuningJob spec that cannot run; the message names the field and what is wrong."""


@dataclass(frozen=True)
class OnnxSource:
    path: str | None = None
    url: str | None = None
    config_map: str | None = None  # name of a ConfigMap whose binaryData key holds the model
    config_map_key: str = "model.onnx"
    pvc: str | None = None
    pvc_path: str | None = None


@dataclass(frozen=True)
class ModelSpec:
    name: str | None = None  # a built-in zoo model
    onnx: OnnxSource | None = None
    input_shape: tuple[int, ...] | None = None


def useful_minimum(per_task: int, per_iteration: int) -> int:
    """The fewest trials worth spending on a task: two search rounds, and at least 8 (capped at
    ``per_task``). A task's first round is mostly random candidates (the cost model has seen none
    of its measurements); the second is the first one a trained cost model picks. Fewer trials
    than that rarely beat TVM's default schedule (DLight on GPUs): ResNet-18 with 96 trials over
    22 tasks (1-5 each) ended 0.83x of untuned on an H200."""
    return max(1, min(per_task, max(2 * per_iteration, 8)))


@dataclass(frozen=True)
class TrialBudget:
    total: int = 64
    per_task: int = 16
    per_iteration: int = 8  # candidates built and measured per search round

    @property
    def useful_minimum(self) -> int:
        """The fewest trials worth spending on a task (:func:`useful_minimum`)."""
        return useful_minimum(self.per_task, self.per_iteration)

    @property
    def max_tuned_tasks(self) -> int:
        """At most this many tasks get trials, whatever the model: each gets the useful minimum
        but at most one, which takes the remainder (partition.budgets). So the most shards that
        can have a task (one client per shard)."""
        return max(1, -(-self.total // self.useful_minimum))


@dataclass(frozen=True)
class ServerSpec:
    replicas: int = 2
    thread_percentage: int = 100
    pinned_memory_limit: str | None = None  # e.g. "4G": CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4G
    # the share the tuned model will be served at; without an explicit threadPercentage it picks
    # the tuning share (api.serving's measured table)
    serving_percentage: int | None = None


@dataclass(frozen=True)
class GpuSharing:
    """What a cuda job asks of each of its GPUs (spec.gpuSharing beyond mps/gpus)."""

    mode: str | None = None  # None: the operator's default (the chart's gpuSharing.defaultMode)
    # Percent of one GPU's SMs booked for the job on each of its GPUs; the job's servers together
    # (servers.replicas x servers.threadPercentage) fit inside it.
    share: int = 100
    share_explicit: bool = False
    pinned_memory: str | None = None  # device memory budget per GPU; None = not booked
    device_plugin_resource: str | None = None  # None: the operator's default (nvidia.com/gpu.shared)

    @property
    def pinned_memory_mib(self) -> int:
        return quantity_mib(self.pinned_memory) if self.pinned_memory else 0


def quantity_mib(q: str) -> int:
    """A size as MPS reads it (``4G``, ``512M``, ``8Gi``: binary units either way) in MiB, rounded
    down; what the admission ledger adds up."""
    m = _QUANTITY.match(q)
    if m is None:
        raise SpecError(f"{q!r} is not a size like 4G or 512M")
    number = float(q[:len(q) - len(m.group(2) or "")])
    scale = {"": 1 / 2**20, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[(m.group(2) or "")[:1].upper()]
    return int(number * scale)


@dataclass(frozen=True)
class S3Output:
    bucket: str
    secret_name: str
    endpoint: str | None = None
    region: str = "us-east-1"
    prefix: str = ""
    access_key_id_key: str = "AWS_ACCESS_KEY_ID"
    secret_access_key_key: str = "AWS_SECRET_ACCESS_KEY"
    cleanup_on_delete: bool = False


@dataclass(frozen=True)
class OutputSpec:
    config_map: str | None = None  # result ConfigMap name; None = <job>-result
    s3: S3Output | None = None


# spec.library.mode (docs/library.md): none, warm (seed each task's search and the cost model from
# the library) or reuse (warm, and a task the library already covers is not tuned again).
LIBRARY_MODES = ("none", "warm", "reuse")
DEFAULT_LIBRARY_MODE = "warm"  # a job that names a library and no mode (the chart's library.defaultMode)
LOCAL_LIBRARY_SCOPE = "local"  # local mode's scope unless spec.library.scope names one


@dataclass(frozen=True)
class LibrarySpec:
    """``spec.library``: where the tuning library is (one of a local directory, a PVC, S3), its
    scope (None: the job's namespace) and how the job uses it (None: the operator's default)."""

    mode: str | None = None
    scope: str | None = None
    path: str | None = None  # local mode: a directory on this machine
    pvc: str | None = None  # cluster: a claim in the job's namespace ...
    pvc_path: str = ""  # ... and the folder in it
    s3: S3Output | None = None  # cluster: a bucket; credentials from a Secret of the job's namespace

    @property
    def configured(self) -> bool:
        return bool(self.path or self.pvc or self.s3)


@dataclass(frozen=True)
class TuningJobSpec:
    name: str
    model: ModelSpec
    target: str = "llvm"
    trials: TrialBudget = field(default_factory=TrialBudget)
    servers: ServerSpec = field(default_factory=ServerSpec)
    shards: int = 2  # client shards: clients.shards, or fewer when the budget cannot give more a task
    mps: bool = False
    gpus: int = 1  # GPUs the job's servers spread over: one MPS daemon and servers.replicas servers each
    cost_model: str = "xgb"
    seed: int = 0
    builder_workers: int | None = None  # per client; None = sharetune_tuner.build.cpus.default_builder_workers
    backoff_limit_per_index: int = 3
    output: OutputSpec = field(default_factory=OutputSpec)
    library: LibrarySpec = field(default_factory=LibrarySpec)
    builders: BuildersSpec | None = None  # spec.builders: the job's build pool on CPU nodes; None = clients build
    sharing: GpuSharing = field(default_factory=GpuSharing)
    image_pull_policy: str = "IfNotPresent"
    ttl_seconds_after_finished: int | None = None  # None: the finished job is kept until deleted
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def shards_asked(self) -> int:
        """clients.shards as written (``shards`` is sized to the budget)."""
        return int((self.raw.get("clients") or {}).get("shards") or self.shards)

    def shards_sizing(self) -> str | None:
        """Why the job runs fewer shards than clients.shards asks (None: it runs them all)."""
        if self.shards >= self.shards_asked:
            return None
        t = self.trials
        return (f"clients.shards {self.shards_asked} > {self.shards}: a budget of {t.total} trials gives "
                f"{t.useful_minimum} or more to each task it tunes but one (two rounds of trials.perIteration "
                f"{t.per_iteration}), so at most {t.max_tuned_tasks} tasks get trials: {self.shards} client shards")

    @property
    def gpu_count(self) -> int:
        """GPUs the servers use: ``gpus`` for a GPU target, none on the CPU."""
        return self.gpus if self.target == "cuda" else 1

    @property
    def total_servers(self) -> int:
        """Servers the clients share through the tracker: ``servers.replicas`` per GPU."""
        return self.servers.replicas * self.gpu_count

    @property
    def uses_mps(self) -> bool:
        # MPS only means something on a GPU target.
        return self.mps and self.target == "cuda"


def _get(d: dict[str, Any], key: str, typ: type | tuple[type, ...], default: Any, where: str) -> Any:
    if key not in d or d[key] is None:
        return default
    v = d[key]
    # bool is an int in Python; a YAML `true` must not pass for a count.
    if isinstance(v, bool) and typ is not bool and (typ is int or (isinstance(typ, tuple) and bool not in typ)):
        raise SpecError(f"{where}.{key}: expected {getattr(typ, '__name__', typ)}, got boolean {v!r}")
    if not isinstance(v, typ):
        name = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
        raise SpecError(f"{where}.{key}: expected {name}, got {type(v).__name__} {v!r}")
    return v


def _int_in(d: dict[str, Any], key: str, default: int, lo: int, hi: int, where: str) -> int:
    v = _get(d, key, int, default, where)
    if not lo <= v <= hi:
        raise SpecError(f"{where}.{key}: {v} is outside [{lo}, {hi}]")
    return int(v)


def ttl_of(spec: dict[str, Any]) -> int | None:
    """spec.ttlSecondsAfterFinished (None: kept until deleted). Apart from parse_spec because a job
    that failed on another field of its spec still expires as asked. Raises SpecError."""
    if spec.get("ttlSecondsAfterFinished") is None:
        return None
    return _int_in(spec, "ttlSecondsAfterFinished", 0, 0, 31536000, "spec")


def _dict(d: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    out: dict[str, Any] = _get(d, key, dict, {}, where)
    return out


def check_fields(d: Any, where: str) -> None:
    """Rejects the first field that ``FIELDS[where]`` (and the sections under it) does not know,
    suggesting the nearest known one."""
    allowed = FIELDS.get(where)
    if allowed is None or not isinstance(d, dict):
        return
    for k, v in d.items():
        path = f"{where}.{k}" if where else str(k)
        if k not in allowed:
            near = difflib.get_close_matches(str(k), sorted(allowed), n=1)
            hint = (f"did you mean {path.rsplit('.', 1)[0] + '.' if where else ''}{near[0]}?" if near
                    else f"the fields of {where or 'a TuningJob'} are {', '.join(sorted(allowed))}")
            raise SpecError(f"{path}: unknown field; {hint}")
        check_fields(v, path)


def check_runs_on_cluster(s: TuningJobSpec) -> None:
    """The operator's refusal of what only local mode can run."""
    if s.library.path:
        raise SpecError("spec.library.path is local-only (a directory on the machine that runs `sharetune run "
                        "--local`); on a cluster use spec.library.pvc (a claim in the job's namespace) or "
                        "spec.library.s3")
    if s.model.onnx is not None and s.model.onnx.path:
        raise SpecError("spec.model.onnx.path is local-only (a file on the machine that runs `sharetune run "
                        "--local`); on a cluster use spec.model.onnx.configMap (kubectl create configmap NAME "
                        "--from-file=model.onnx=FILE), spec.model.onnx.url or spec.model.onnx.pvc")


def check_runs_locally(s: TuningJobSpec) -> None:
    """Local mode's refusal of what only the cluster can run."""
    if s.library.pvc:
        raise SpecError("spec.library.pvc is cluster-only (a volume mounted into the job's pods); in local mode "
                        "use spec.library.path (a directory here) or spec.library.s3")
    if s.model.onnx is not None and s.model.onnx.pvc:
        raise SpecError("spec.model.onnx.pvc is cluster-only (a volume mounted into the job's pods); in local "
                        "mode use spec.model.onnx.path (a file here), spec.model.onnx.url or "
                        "spec.model.onnx.configMap")


# ---- spec.builders: the job's build pool (docs/build-pool.md) -------------------------------------
@dataclass(frozen=True)
class BuildersAutoscale:
    """A HorizontalPodAutoscaler on the builders' CPU utilisation (of their CPU request)."""

    min_replicas: int = 1
    max_replicas: int = 1
    target_cpu_percent: int = 80


@dataclass(frozen=True)
class BuildersSpec:
    """Builder pods (a Deployment behind a headless Service) that build the clients' candidates."""

    replicas: int = 2
    workers: int | None = None  # builder processes per pod; None = the pod's CPUs (its CPU limit)
    resources: dict[str, Any] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[Any] = field(default_factory=list)
    autoscale: BuildersAutoscale | None = None


def parse_builders(spec: dict[str, Any]) -> BuildersSpec | None:
    if spec.get("builders") is None:
        return None
    where = "spec.builders"
    b = _dict(spec, "builders", "spec")
    check_fields(b, where)
    resources = _dict(b, "resources", where)
    a = _get(b, "autoscale", dict, None, where)
    autoscale = None
    if a is not None:
        if "maxReplicas" not in a:
            raise SpecError(f"{where}.autoscale.maxReplicas is required (the most builder pods to scale to)")
        autoscale = BuildersAutoscale(
            min_replicas=_int_in(a, "minReplicas", 1, 1, 256, f"{where}.autoscale"),
            max_replicas=_int_in(a, "maxReplicas", 1, 1, 256, f"{where}.autoscale"),
            target_cpu_percent=_int_in(a, "targetCPUUtilizationPercentage", 80, 1, 100, f"{where}.autoscale"))
        if autoscale.min_replicas > autoscale.max_replicas:
            raise SpecError(f"{where}.autoscale: minReplicas {autoscale.min_replicas} is above maxReplicas "
                            f"{autoscale.max_replicas}")
        if not (resources.get("requests") or {}).get("cpu"):
            raise SpecError(f"{where}.autoscale needs {where}.resources.requests.cpu: the autoscaler's CPU "
                            "utilisation is a share of the pods' CPU request")
    workers = _get(b, "workers", int, None, where)
    if workers is not None:
        workers = _int_in(b, "workers", 1, 1, 512, where)
    return BuildersSpec(replicas=_int_in(b, "replicas", 2, 1, 256, where), workers=workers, resources=resources,
                        node_selector=_dict(b, "nodeSelector", where),
                        tolerations=_get(b, "tolerations", list, [], where), autoscale=autoscale)


def parse_spec(name: str, spec: dict[str, Any]) -> TuningJobSpec:
    if not isinstance(spec, dict):
        raise SpecError(f"spec: expected a mapping, got {type(spec).__name__}")
    check_fields(spec, "spec")
    m = _dict(spec, "model", "spec")
    model_name, onnx_d = _model_choice(m)
    pull = _get(spec, "imagePullPolicy", str, "IfNotPresent", "spec")
    if pull not in PULL_POLICIES:
        raise SpecError(f"spec.imagePullPolicy: {pull!r} is not one of {', '.join(PULL_POLICIES)}")
    model = ModelSpec(name=model_name, onnx=_onnx_source(onnx_d), input_shape=_input_shape(m))
    image = _get(spec, "image", str, None, "spec")
    if image is not None and (len(image) > 512 or not _IMAGE.match(image)):
        raise SpecError(f"spec.image: {image[:80]!r} is not an image reference: use [registry/]path[:tag][@digest] "
                        "without spaces, e.g. registry.example/team/sharetune-tuner:0.1.0")
    target = _get(spec, "target", str, "llvm", "spec")
    if target not in TARGETS:
        raise SpecError(f"spec.target: {target!r} is not one of {', '.join(TARGETS)}")
    t = _dict(spec, "trials", "spec")
    trials = TrialBudget(
        total=_int_in(t, "total", 64, 1, 10_000_000, "spec.trials"),
        per_task=_int_in(t, "perTask", 16, 1, 1_000_000, "spec.trials"),
        per_iteration=_int_in(t, "perIteration", 8, 1, 4096, "spec.trials"),
    )
    s = _dict(spec, "servers", "spec")
    c = _dict(spec, "clients", "spec")
    g = _dict(spec, "gpuSharing", "spec")
    sharing, servers = parse_sharing(g, s, _servers(s))
    cost = _get(spec, "costModel", str, "xgb", "spec")
    if cost not in COST_MODELS:
        raise SpecError(f"spec.costModel: {cost!r} is not one of {', '.join(COST_MODELS)}")
    workers = _get(c, "builderWorkers", int, None, "spec.clients")
    if workers is not None and not 1 <= workers <= 512:
        raise SpecError(f"spec.clients.builderWorkers: {workers} is outside [1, 512]")
    return TuningJobSpec(
        name=name, model=model, target=target, trials=trials, servers=servers,
        shards=min(_int_in(c, "shards", 2, 1, 1024, "spec.clients"), trials.max_tuned_tasks),
        mps=bool(_get(g, "mps", bool, True, "spec.gpuSharing")),
        gpus=_int_in(g, "gpus", 1, 1, 16, "spec.gpuSharing"),
        cost_model=cost, seed=_int_in(spec, "seed", 0, 0, 2**31 - 1, "spec"),
        builder_workers=workers,
        backoff_limit_per_index=_int_in(c, "backoffLimitPerIndex", 3, 0, 100, "spec.clients"),
        output=_output(_dict(spec, "output", "spec")), library=_library(_dict(spec, "library", "spec")),
        builders=parse_builders(spec), sharing=sharing,
        image_pull_policy=pull, ttl_seconds_after_finished=ttl_of(spec),
        raw=spec,
    )


def _model_choice(m: dict[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
    """``spec.model``: a built-in name or an ``onnx`` source, exactly one."""
    onnx_d = _get(m, "onnx", dict, None, "spec.model")
    model_name = _get(m, "name", str, None, "spec.model")
    if (model_name is None) == (onnx_d is None):
        raise SpecError("spec.model: set exactly one of `name` (built-in model) or `onnx` (a user model)")
    if model_name is not None and model_name not in BUILTIN_MODELS:
        near = difflib.get_close_matches(model_name, sorted(BUILTIN_MODELS), n=1, cutoff=0.5)
        raise SpecError(f"spec.model.name: unknown built-in model {model_name!r}; choose one of "
                        f"{', '.join(sorted(BUILTIN_MODELS))}" + (f" (did you mean {near[0]}?)" if near else "")
                        + ", or set spec.model.onnx for your own model")
    return model_name, onnx_d


def _onnx_source(onnx_d: dict[str, Any] | None) -> OnnxSource | None:
    """``spec.model.onnx``: exactly one of path, url, configMap, pvc."""
    if onnx_d is None:
        return None
    cm = _get(onnx_d, "configMap", dict, None, "spec.model.onnx")
    pvc = _get(onnx_d, "pvc", dict, None, "spec.model.onnx")
    src = OnnxSource(
        path=_get(onnx_d, "path", str, None, "spec.model.onnx"),
        url=_get(onnx_d, "url", str, None, "spec.model.onnx"),
        config_map=cm and _get(cm, "name", str, None, "spec.model.onnx.configMap"),
        config_map_key=(cm and _get(cm, "key", str, None, "spec.model.onnx.configMap")) or "model.onnx",
        pvc=pvc and _get(pvc, "claimName", str, None, "spec.model.onnx.pvc"),
        pvc_path=pvc and _get(pvc, "path", str, None, "spec.model.onnx.pvc"),
    )
    if len([x for x in (src.path, src.url, src.config_map, src.pvc) if x]) != 1:
        raise SpecError("spec.model.onnx: set exactly one of path, url, configMap, pvc")
    return src


def _input_shape(m: dict[str, Any]) -> tuple[int, ...] | None:
    shape = _get(m, "inputShape", list, None, "spec.model")
    if shape is None:
        return None
    if not shape or not all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 65536 for x in shape):
        raise SpecError(f"spec.model.inputShape: expected a list of positive integers, got {shape!r}")
    return tuple(shape)


def _servers(s: dict[str, Any]) -> ServerSpec:
    """``spec.servers`` before the sharing mode adjusts it (:func:`parse_sharing`)."""
    pinned = _get(s, "pinnedMemoryLimit", str, None, "spec.servers")
    if pinned is not None and not _QUANTITY.match(pinned):
        raise SpecError(f"spec.servers.pinnedMemoryLimit: {pinned!r} is not a size like 4G or 512M")
    serving = _get(s, "servingPercentage", int, None, "spec.servers")
    if serving is not None:
        serving = _int_in(s, "servingPercentage", 100, 1, 100, "spec.servers")
    if s.get("threadPercentage") is None and serving is not None:
        thread_pct = tuning_pct_for(serving)
    else:
        thread_pct = _int_in(s, "threadPercentage", 100, 1, 100, "spec.servers")
    return ServerSpec(replicas=_int_in(s, "replicas", 2, 1, 64, "spec.servers"), thread_percentage=thread_pct,
                      pinned_memory_limit=pinned, serving_percentage=serving)


def _s3(s3d: dict[str, Any], where: str) -> S3Output:
    """An S3 location (``spec.output.s3``, ``spec.library.s3``): bucket and a Secret's keys."""
    cred = _get(s3d, "credentialsSecret", dict, None, where)
    bucket = _get(s3d, "bucket", str, None, where)
    if not bucket or not cred or not _get(cred, "name", str, None, f"{where}.credentialsSecret"):
        raise SpecError(f"{where}: bucket and credentialsSecret.name are required")
    return S3Output(bucket=bucket, secret_name=cred["name"],
                    endpoint=_get(s3d, "endpoint", str, None, where),
                    region=_get(s3d, "region", str, "us-east-1", where),
                    prefix=_get(s3d, "prefix", str, "", where).strip("/"),
                    access_key_id_key=_get(cred, "accessKeyIdKey", str, "AWS_ACCESS_KEY_ID", where),
                    secret_access_key_key=_get(cred, "secretAccessKeyKey", str, "AWS_SECRET_ACCESS_KEY", where),
                    cleanup_on_delete=bool(_get(s3d, "cleanupOnDelete", bool, False, where)))


_SCOPE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _library(d: dict[str, Any]) -> LibrarySpec:
    """``spec.library``: at most one of path, pvc, s3; mode and scope checked here, the scope
    against what the operator allows in :func:`library_scope`."""
    where = "spec.library"
    mode = _get(d, "mode", str, None, where)
    if mode is not None and mode not in LIBRARY_MODES:
        raise SpecError(f"{where}.mode: {mode!r} is not one of {', '.join(LIBRARY_MODES)}")
    scope = _get(d, "scope", str, None, where)
    if scope is not None and not _SCOPE.match(scope):
        raise SpecError(f"{where}.scope: {scope!r} is not a name like a namespace's (lower case, digits, '-')")
    pvc = _get(d, "pvc", dict, None, where)
    s3d = _get(d, "s3", dict, None, where)
    lib = LibrarySpec(mode=mode, scope=scope, path=_get(d, "path", str, None, where),
                      pvc=pvc and _get(pvc, "claimName", str, None, f"{where}.pvc"),
                      pvc_path=((pvc and _get(pvc, "path", str, "", f"{where}.pvc")) or "").strip("/"),
                      s3=_s3(s3d, f"{where}.s3") if s3d is not None else None)
    if pvc is not None and not lib.pvc:
        raise SpecError(f"{where}.pvc: claimName is required")
    if len([x for x in (lib.path, lib.pvc, lib.s3) if x]) > 1:
        raise SpecError(f"{where}: set at most one of path, pvc, s3")
    if mode not in (None, "none") and not lib.configured:
        raise SpecError(f"{where}.mode {mode}: name the library with {where}.path (local mode), {where}.pvc or "
                        f"{where}.s3")
    return lib


def library_scope(lib: LibrarySpec, namespace: str, shared: tuple[str, ...]) -> str:
    """The scope a job reads and adds to: its namespace unless ``spec.library.scope`` names one of
    the operator's shared scopes (the chart's ``library.sharedScopes``)."""
    if lib.scope is None or lib.scope == namespace:
        return namespace
    if lib.scope in shared:
        return lib.scope
    allowed = f"the shared ones are {', '.join(shared)}" if shared else "the chart shares none (library.sharedScopes)"
    raise SpecError(f"spec.library.scope: {lib.scope!r} is another namespace's scope, and {allowed}; leave the "
                    f"scope out for this namespace's ({namespace})")


def library_mode(lib: LibrarySpec, default: str) -> str:
    """The mode a job uses: its own, else the operator's default where it names a library; none
    without one."""
    if not lib.configured:
        return "none"
    return lib.mode or default


def _output(o: dict[str, Any]) -> OutputSpec:
    """``spec.output``: the job's ConfigMap (the default) or S3, at most one."""
    s3d = _get(o, "s3", dict, None, "spec.output")
    s3 = _s3(s3d, "spec.output.s3") if s3d is not None else None
    cmd = _get(o, "configMap", dict, None, "spec.output")
    if s3 is not None and cmd is not None:
        raise SpecError("spec.output: set at most one of configMap or s3")
    return OutputSpec(config_map=cmd and _get(cmd, "name", str, None, "spec.output.configMap"), s3=s3)


def _pinned_budget(pinned: str | None, servers: ServerSpec) -> tuple[str | None, ServerSpec]:
    """spec.gpuSharing.pinnedMemory against the servers' pinnedMemoryLimit: a budget without a
    limit is split evenly between the servers; a limit without a budget books their sum."""
    replicas = servers.replicas
    if pinned is None:
        if servers.pinned_memory_limit is None:
            return None, servers
        return f"{replicas * quantity_mib(servers.pinned_memory_limit)}M", servers
    budget = quantity_mib(pinned)
    if servers.pinned_memory_limit is None:
        if budget // replicas < 1:
            raise SpecError(f"spec.gpuSharing.pinnedMemory: {pinned} is less than 1M per server for {replicas} servers")
        return pinned, ServerSpec(replicas, servers.thread_percentage, f"{budget // replicas}M",
                                  servers.serving_percentage)
    if replicas * quantity_mib(servers.pinned_memory_limit) > budget:
        raise SpecError(f"spec.servers.pinnedMemoryLimit: {replicas} servers x {servers.pinned_memory_limit} is "
                        f"more than spec.gpuSharing.pinnedMemory {pinned}; lower pinnedMemoryLimit (or leave it out: "
                        "pinnedMemory / replicas) or raise pinnedMemory")
    return pinned, servers


def parse_sharing(g: dict[str, Any], s: dict[str, Any], servers: ServerSpec) -> tuple[GpuSharing, ServerSpec]:
    """spec.gpuSharing's mode, share and pinned-memory budget, checked against the servers they
    must hold (docs/gpu-pools.md). Returns the servers too: without an explicit threadPercentage
    (or pinnedMemoryLimit) a share (or budget) is split evenly between them."""
    where = "spec.gpuSharing"
    mps = _get(g, "mps", bool, True, where)
    mode = _get(g, "mode", str, None, where)
    if mode is not None and mode not in MODES:
        raise SpecError(f"{where}.mode: {mode!r} is not one of {', '.join(MODES)}")
    if not mps and mode in ("pool", "devicePlugin"):
        raise SpecError(f"{where}.mode: {mode} shares GPUs through MPS, but {where}.mps is false; set mode: "
                        "exclusive (each server owns a GPU) or drop mps: false")
    dp = _get(g, "devicePlugin", dict, None, where)
    resource = dp and _get(dp, "resourceName", str, None, f"{where}.devicePlugin")
    if resource is not None and not _RESOURCE_NAME.match(resource):
        raise SpecError(f"{where}.devicePlugin.resourceName: {resource!r} is not an extended resource name "
                        "like nvidia.com/gpu.shared")
    if dp is not None and mode in ("pool", "exclusive"):
        raise SpecError(f"{where}.devicePlugin: only used in mode devicePlugin (this job's mode is {mode}); "
                        "drop it or set mode: devicePlugin")
    pinned = _get(g, "pinnedMemory", str, None, where)
    if pinned is not None and not _QUANTITY.match(pinned):
        raise SpecError(f"{where}.pinnedMemory: {pinned!r} is not a size like 16G or 512M")
    has_share = g.get("share") is not None
    share = _int_in(g, "share", 100, 1, 100, where) if has_share else None
    if mode == "devicePlugin" and (has_share or pinned is not None):
        field_ = "share" if has_share else "pinnedMemory"
        raise SpecError(f"{where}.{field_}: not used in mode devicePlugin: the device plugin splits each GPU "
                        "equally between its replicas (servers.threadPercentage and servers.pinnedMemoryLimit "
                        f"can only lower a server's split); drop {field_} or use mode: pool")
    if mode == "exclusive" and has_share and share != 100:
        raise SpecError(f"{where}.share: mode exclusive books whole GPUs (100); drop share or use mode: pool")
    replicas = servers.replicas
    if share is not None:
        if share < replicas:
            raise SpecError(f"{where}.share: {share}% cannot give each of {replicas} servers (servers.replicas) "
                            f"1%; raise share to at least {replicas} or lower servers.replicas")
        if s.get("threadPercentage") is None and s.get("servingPercentage") is None:
            servers = ServerSpec(replicas, share // replicas, servers.pinned_memory_limit, servers.serving_percentage)
        if replicas * servers.thread_percentage > share:
            derived = (f" (the tuning share for servers.servingPercentage {servers.serving_percentage})"
                       if s.get("threadPercentage") is None else "")
            raise SpecError(f"spec.servers.threadPercentage{derived}: "
                            f"{replicas} servers x {servers.thread_percentage}% = "
                            f"{replicas * servers.thread_percentage}% does not fit in {where}.share {share}%; set "
                            f"threadPercentage <= {share // replicas}"
                            + ("" if derived else " (or leave it out: share / replicas)") + " or raise share")
    else:
        # No share asked for: book what the servers can take together (a whole GPU by default).
        share = min(100, replicas * servers.thread_percentage)
    pinned, servers = _pinned_budget(pinned, servers)
    return GpuSharing(mode=mode, share=share, share_explicit=has_share, pinned_memory=pinned,
                      device_plugin_resource=resource), servers


def manifest_doc(source: str | Path) -> dict[str, Any]:
    """A TuningJob manifest (path or YAML text) as a mapping, unchecked beyond that."""
    text = _manifest_text(source)
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SpecError(f"not valid YAML: {e}") from None
    if not isinstance(doc, dict):
        raise SpecError("a TuningJob manifest must be a YAML mapping")
    return doc


def load_job(source: str | Path | dict[str, Any]) -> TuningJobSpec:
    """Reads a TuningJob manifest (path, YAML text or parsed dict) into a spec."""
    doc = source if isinstance(source, dict) else manifest_doc(source)
    if not isinstance(doc, dict):
        raise SpecError("a TuningJob manifest must be a YAML mapping")
    check_fields({k: v for k, v in doc.items() if k != "spec"}, "")
    if doc.get("kind") != KIND or doc.get("apiVersion") != f"{API_GROUP}/{API_VERSION}":
        raise SpecError(f"expected apiVersion {API_GROUP}/{API_VERSION}, kind {KIND}; "
                        f"got {doc.get('apiVersion')}, {doc.get('kind')}")
    name = (doc.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        raise SpecError("metadata.name is required")
    return parse_spec(name, doc.get("spec") or {})


def _manifest_text(source: str | Path) -> str:
    """The manifest's text: a ``Path`` is always a file to read; a ``str`` is one when such a file
    exists, else the YAML itself. A file that cannot be read is a ``SpecError`` saying why (the
    caller names the file), not "must be a YAML mapping" or a decoding traceback."""
    if isinstance(source, str) and ("\n" in source or not Path(source).exists()):
        return source
    try:
        return Path(source).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError("no such file") from None
    except IsADirectoryError:
        raise SpecError("is a directory, not a TuningJob manifest") from None
    except UnicodeDecodeError as e:
        raise SpecError(f"not a YAML text file: byte {e.object[e.start]:#04x} at offset {e.start} is not UTF-8") \
            from None
    except OSError as e:
        raise SpecError(f"cannot read it: {e.strerror or e}") from None


# Parsed specs of live objects, by (uid, generation): the API server bumps metadata.generation on
# every change of spec (not of status), so a job's spec is parsed once per change, however many
# handlers and ticks read it. A bad spec is remembered too: its error is raised again, unparsed.
# kopf runs sync handlers in a thread pool, so the cache is locked (an unlocked move_to_end can
# meet another thread's eviction of the same key).
_PARSED: OrderedDict[tuple[str, int], TuningJobSpec | SpecError] = OrderedDict()
_PARSED_LOCK = threading.Lock()
PARSED_CACHE_SIZE = 1024


def spec_of(body: Mapping[str, Any]) -> TuningJobSpec:
    """The TuningJob ``body``'s parsed spec (parse_spec), once per (uid, generation); an object
    without both (a file, a test's dict) is parsed every time. Raises SpecError."""
    meta = body.get("metadata") or {}
    uid, gen = meta.get("uid"), meta.get("generation")
    if not uid or gen is None:
        return parse_spec(str(meta.get("name")), dict(body.get("spec") or {}))
    key = (str(uid), int(gen))
    with _PARSED_LOCK:
        got = _PARSED.get(key)
        if got is not None:
            _PARSED.move_to_end(key)
    if got is None:  # parsed outside the lock: two threads may both parse a new key, harmlessly
        try:
            got = parse_spec(str(meta.get("name")), copy.deepcopy(dict(body.get("spec") or {})))
        except SpecError as e:
            got = e
        with _PARSED_LOCK:
            _PARSED[key] = got
            while len(_PARSED) > PARSED_CACHE_SIZE:
                _PARSED.popitem(last=False)
    if isinstance(got, SpecError):
        raise SpecError(str(got))
    return got
