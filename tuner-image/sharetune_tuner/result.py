"""A job's result as users deploy it: the best records as a MetaSchedule database, and the model
compiled with them (``sharetune result fetch|compile WHERE -o DIR``).

WHERE is any place a result lives:
  a local-mode work dir      ``runs/tiny-cpu`` (or its ``result/`` dir: the merge's output)
  a TuningJob                ``tj/NAME`` (``-n NAMESPACE``; the current kubeconfig): its
                             ``status.resultLocation``, once the job has Succeeded
  the result ConfigMap       ``configmap://NAMESPACE/NAME`` (what ``status.resultLocation`` says)
  an S3 location             ``s3://BUCKET/PREFIX/.../result`` (or the job's store prefix without
                             ``/result``); AWS credentials as boto3 finds them (env, profile),
                             the endpoint from SHARETUNE_S3_ENDPOINT for S3-compatible servers

DIR after ``fetch``:
  database/     the records the result applies, a MetaSchedule JSONDatabase:
                ``JSONDatabase(work_dir="DIR/database")``; empty when tuning did not beat TVM's
                defaults (the result is then the untuned model)
  records/      every trial of every shard (a JSONDatabase too: for transfer tuning)
  summary.json  the merge's summary
and after ``compile`` also:
  model.so      the model built with database/ exactly as the merge built the model it measured
                (``merge.compile_with``), for the job's target: ``tvm.runtime.load_module``
  params.npz    the weights ``main`` takes after the input, in order (zoo models; empty for ONNX
                files, whose weights are bound into model.so)
  model.json    what to feed it and what it is worth: inputs, target, latencies, speed-up
"""

from __future__ import annotations

import base64
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sharetune.api.spec import (
    API_GROUP,
    API_VERSION,
    PLURAL,
    ModelSpec,
    OnnxSource,
    SpecError,
    TuningJobSpec,
    load_job,
    parse_spec,
)
from sharetune.api.summary import Summary
from sharetune.api.topology import (
    LOCAL_JOB_FILE,
    MODEL_FILE,
    RECORDS_FILE,
    RESULT_OBJECT,
    SUMMARY_FILE,
    WORKLOADS_FILE,
    s3_object_key,
)

from .errors import TunerError

DATABASE, RECORDS = "database", "records"  # DIR's JSONDatabases: what to apply, every trial
LIBRARY, PARAMS, MODEL_JSON = "model.so", "params.npz", "model.json"
_MERGE_DIRS = {DATABASE: "best", RECORDS: "records"}  # ours -> the merge's (merge.py's docstring)
_JOB_PREFIXES = ("tj/", "tuningjob/", "tuningjobs/", "tuningjob.sharetune.io/")
SUCCEEDED = "Succeeded"


class ResultError(TunerError):
    """The result cannot be found or read; the message says where it looked and what to do."""


@dataclass(frozen=True)
class Fetched:
    summary: Summary
    spec: TuningJobSpec | None  # known when WHERE was the TuningJob itself
    namespace: str | None = None


# ---- where: a path, a TuningJob, a ConfigMap, an S3 location -------------------------------------
def _merge_output(path: Path) -> Path | None:
    """The merge's output dir in ``path``: ``path`` itself or a local-mode work dir's ``result/``."""
    for d in (path, path / "result"):
        if (d / SUMMARY_FILE).is_file() and (d / _MERGE_DIRS[DATABASE]).is_dir():
            return d
    return None


def _configmap_result(namespace: str, name: str) -> bytes:
    from .store.backends import ConfigMapStore

    data = ConfigMapStore(namespace, name, result_name=name).get(RESULT_OBJECT)
    if data is None:
        raise ResultError(f"ConfigMap {namespace}/{name} holds no result (no data.tar.gz); the location is the job's "
                          f"status.resultLocation (kubectl get tj JOB -o jsonpath='{{.status.resultLocation}}')")
    return data


def _s3_result(uri: str) -> bytes:
    from .store.backends import S3Store

    bucket, _, key = uri[len("s3://"):].partition("/")
    if not bucket:
        raise ResultError(f"bad S3 location {uri!r}: expected s3://BUCKET/PREFIX/.../{RESULT_OBJECT}")
    key = key.strip("/").removesuffix(".tar.gz")
    # The status's location names the result object; a job's store prefix (without it) works too.
    prefix = key.removesuffix(RESULT_OBJECT).rstrip("/") if key.rsplit("/", 1)[-1] == RESULT_OBJECT else key
    data = S3Store(bucket, prefix).get(RESULT_OBJECT)
    if data is None:
        raise ResultError(f"no result at s3://{bucket}/{s3_object_key(prefix, RESULT_OBJECT)}")
    return data


def _kube_api() -> tuple[Any, Any, str]:
    """(CustomObjectsApi, CoreV1Api, the current context's namespace) from the kubeconfig."""
    import os

    from kubernetes import client, config

    path = os.environ.get("KUBECONFIG")
    try:
        config.load_kube_config(config_file=path)
        _, current = config.list_kube_config_contexts(config_file=path)
    except (config.ConfigException, OSError) as e:
        raise ResultError(f"cannot read the kubeconfig ({path or '~/.kube/config'}): {e}") from None
    return client.CustomObjectsApi(), client.CoreV1Api(), (current.get("context") or {}).get("namespace") or "default"


def _job(name: str, namespace: str | None) -> tuple[str, TuningJobSpec, str, Any]:
    """(result location, spec, namespace, CoreV1Api) of TuningJob ``name``, which must have Succeeded."""
    from kubernetes.client.rest import ApiException

    from sharetune.api.topology import result_location

    custom, core, current = _kube_api()
    ns = namespace or current
    try:
        body = custom.get_namespaced_custom_object(API_GROUP, API_VERSION, ns, PLURAL, name)
    except ApiException as e:
        if e.status == 404:
            raise ResultError(f"no TuningJob {name!r} in namespace {ns!r} (give the namespace with -n)") from None
        raise ResultError(f"cannot read TuningJob {ns}/{name}: {e.status} {e.reason}") from None
    except OSError as e:
        raise ResultError(f"cannot reach the API server for TuningJob {ns}/{name}: {e}") from None
    status = body.get("status") or {}
    phase = status.get("phase") or "Pending"
    if phase != SUCCEEDED:
        why = f": {status['message']}" if status.get("message") else ""
        raise ResultError(f"TuningJob {ns}/{name} is {phase}{why}; its result is there once it has Succeeded")
    try:
        spec = parse_spec(name, dict(body.get("spec") or {}))
    except SpecError as e:
        raise ResultError(f"TuningJob {ns}/{name}: {e}") from None
    return status.get("resultLocation") or result_location(ns, name, spec), spec, ns, core


def fetch(where: str, out: Path, namespace: str | None = None) -> Fetched:
    """Writes ``database/``, ``records/`` and ``summary.json`` of the result at ``where`` into ``out``."""
    spec, ns, core = None, None, None
    if where.startswith(_JOB_PREFIXES):
        where, spec, ns, core = _job(where.split("/", 1)[1], namespace)
    local = Path(where)
    if "://" not in where:
        src = _merge_output(local)
        if src is None:
            raise ResultError(f"{where} holds no result: expected a local-mode work dir (with result/{SUMMARY_FILE}), "
                              "tj/NAME, configmap://NAMESPACE/NAME or s3://BUCKET/PREFIX/result")
        _place(src, out)
        kept = local / LOCAL_JOB_FILE  # local mode's copy of the job: where its model came from
        if spec is None and kept.is_file():
            try:
                spec = load_job(kept)
            except SpecError:
                pass  # a copy that no longer parses: the result still has the summary's model
        read = local / "model" / MODEL_FILE  # local mode's copy of a ConfigMap's model (sharetune.local.model_source)
        if spec is not None and spec.model.onnx is not None and spec.model.onnx.config_map and read.is_file():
            shutil.copyfile(read, out / ONNX_COPY)
    else:
        scheme, _, rest = where.partition("://")
        if scheme == "configmap":
            cm_ns, _, name = rest.partition("/")
            if not cm_ns or not name or "/" in name:
                raise ResultError(f"bad ConfigMap location {where!r}: expected configmap://NAMESPACE/NAME")
            data = _configmap_result(cm_ns, name)
        elif scheme == "s3":
            data = _s3_result(where)
        else:
            raise ResultError(f"unknown result location {where!r}: use a local dir, tj/NAME, "
                              "configmap://NAMESPACE/NAME or s3://BUCKET/PREFIX/result")
        from .store.backends import unpack

        with tempfile.TemporaryDirectory(prefix="sharetune-result-") as tmp:
            unpack(data, Path(tmp))
            if _merge_output(Path(tmp)) is None:
                raise ResultError(f"{where} holds no merge result ({SUMMARY_FILE} and best records)")
            _place(Path(tmp), out)
    summary = Summary.read(out / SUMMARY_FILE)
    if summary is None:
        raise ResultError(f"{where}: its {SUMMARY_FILE} is not a result summary")
    if spec is not None and ns is not None and summary.model and spec.model.onnx is not None \
            and spec.model.onnx.config_map:
        _fetch_model(core, ns, spec.model.onnx, out)
    return Fetched(summary, spec, ns)


def _place(merge_out: Path, out: Path) -> None:
    """Copies the merge's best/ and records/ as ``out``'s database/ and records/, and its summary."""
    out.mkdir(parents=True, exist_ok=True)
    for ours, theirs in _MERGE_DIRS.items():
        shutil.rmtree(out / ours, ignore_errors=True)
        (out / ours).mkdir()
        for f in (WORKLOADS_FILE, RECORDS_FILE):  # an empty database is two empty files
            src = merge_out / theirs / f
            (out / ours / f).write_bytes(src.read_bytes() if src.is_file() else b"")
    shutil.copyfile(merge_out / SUMMARY_FILE, out / SUMMARY_FILE)


# ---- the model the job tuned ---------------------------------------------------------------------
ONNX_COPY = "model.onnx"  # a ConfigMap-sourced ONNX model, fetched next to the result


def _fetch_model(core: Any, ns: str, src: OnnxSource, out: Path) -> None:
    """The job's ONNX model from its ConfigMap (as the operator mounts it in the merge pod)."""
    from kubernetes.client.rest import ApiException

    try:
        cm = core.read_namespaced_config_map(src.config_map, ns)
    except ApiException as e:
        raise ResultError(f"cannot read the model's ConfigMap {ns}/{src.config_map}: {e.status} {e.reason}") from None
    binary, text = cm.binary_data or {}, cm.data or {}
    if src.config_map_key in binary:
        (out / ONNX_COPY).write_bytes(base64.b64decode(binary[src.config_map_key]))
    elif src.config_map_key in text:
        (out / ONNX_COPY).write_bytes(text[src.config_map_key].encode())


def _model_spec(fetched: Fetched, out: Path, model_path: Path | None) -> ModelSpec:
    """The model to compile, at the input shape it was tuned at: ``--model`` first, then the job's
    own spec (tj/NAME, or a local work dir's copy of the job), then the summary's built-in model."""
    from .model.zoo import ZOO

    s = fetched.summary
    shape = tuple(s.input_shape)
    if model_path is not None:
        return ModelSpec(onnx=OnnxSource(path=str(model_path)), input_shape=shape)
    if (out / ONNX_COPY).is_file():
        return ModelSpec(onnx=OnnxSource(path=str(out / ONNX_COPY)), input_shape=shape)
    spec = fetched.spec
    if spec is not None and (spec.model.name or (spec.model.onnx and (spec.model.onnx.url or spec.model.onnx.path))):
        return ModelSpec(name=spec.model.name, onnx=spec.model.onnx, input_shape=shape)
    if s.model in ZOO:
        return ModelSpec(name=s.model, input_shape=shape)
    raise ResultError(f"the result's model {s.model!r} is an ONNX file this result does not carry: "
                      "give it with --model PATH.onnx")


# ---- compile -------------------------------------------------------------------------------------
def compile_result(fetched: Fetched, out: Path, model_path: Path | None = None) -> dict[str, Any]:
    """Builds ``out/model.so`` with ``out/database`` (fetched first) as the merge builds the tuned
    model, saves the weights main() takes after the input, and writes ``out/model.json``."""
    import numpy as np

    from .merge import compile_with
    from .model.loader import load_for_spec, model_errors
    from .targets import make_target

    s = fetched.summary
    model = load_for_spec(_model_spec(fetched, out, model_path))
    target = make_target(s.target, fetched.spec.builder_workers if fetched.spec else None)
    with model_errors(f"TVM cannot compile {model.name}"):
        executable = compile_with(out / DATABASE, model, target)
    executable.export_library(str(out / LIBRARY))
    names = [str(p.name) for p in model.mod["main"].params[1:]]
    if len(set(names)) != len(names):  # npz keys must be unique; the order is what main() takes
        names = [f"p{i}" for i in range(len(names))]
    np.savez(out / PARAMS, **{n: p.numpy() for n, p in zip(names, model.params)})
    info = {
        "library": LIBRARY, "params": PARAMS, "param_names": names, "entry": "main",
        "inputs": [{"name": model.input_name, "shape": list(model.input_shape), "dtype": "float32"}],
        "target": s.target, "tvm_target": str(target), "model": model.name, "job": s.job,
        "database": DATABASE, "records_applied": _lines(out / DATABASE / RECORDS_FILE),
        "delivered": s.delivered, "improved": s.is_improved,
        "latency_untuned_ms": s.latency_untuned_ms, "latency_tuned_ms": s.latency_tuned_ms,
        "speedup": s.speedup,
    }
    (out / MODEL_JSON).write_text(json.dumps(info, indent=2))
    return info


def _lines(path: Path) -> int:
    return sum(1 for ln in path.read_text().splitlines() if ln.strip()) if path.is_file() else 0


def records_in(out: Path) -> tuple[int, int]:
    """(records the result applies, trials in all) of a fetched result."""
    return _lines(out / DATABASE / RECORDS_FILE), _lines(out / RECORDS / RECORDS_FILE)
