"""Local mode's side of ``spec.model``: the manifest a cluster runs, run here unchanged.

Before any process starts, the model is made ready once: a built-in name checked against the zoo,
a ``path`` checked to exist, a ``url`` downloaded into the run's work dir (its clients and merge
then read that cache), a ``configMap`` read through the current kubeconfig and written where the
pods would see it mounted. ``pvc`` is cluster-only and refused. Every failure is one line naming
the field and the fix.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import yaml

from sharetune.api.errors import ModelError
from sharetune.api.spec import SpecError, TuningJobSpec, check_runs_locally
from sharetune.api.topology import MODEL_DIR_ENV, MODEL_FILE
from sharetune.models import MODEL_CACHE_ENV, check_builtin, fetch_url


def prepare_local_model(spec: TuningJobSpec, job_path: Path, workdir: Path) -> dict[str, str]:
    """Makes the job's model ready for local mode; returns the environment that points the run's
    processes at it."""
    try:
        check_runs_locally(spec)
    except SpecError as e:
        raise ModelError(str(e)) from None
    m = spec.model
    if m.name is not None:
        check_builtin(m.name)
        return {}
    src = m.onnx
    assert src is not None  # the spec parser: exactly one of name or onnx
    if src.path:
        if not Path(src.path).is_file():
            raise ModelError(f"spec.model.onnx.path: no file {src.path} (relative paths are from the directory "
                             "`sharetune run` is started in)")
        return {}
    cache = workdir / "model"
    if src.url:
        fetch_url(src.url, cache)
        return {MODEL_CACHE_ENV: str(cache)}
    assert src.config_map
    data = read_config_map_model(src.config_map, src.config_map_key, _namespace_of(job_path))
    cache.mkdir(parents=True, exist_ok=True)
    (cache / MODEL_FILE).write_bytes(data)  # where a pod sees the ConfigMap's key mounted
    return {MODEL_DIR_ENV: str(cache)}


def read_config_map_model(name: str, key: str, namespace: str | None) -> bytes:
    """The model a ConfigMap holds (binaryData, or data for a text key), read with the current
    kubeconfig; ``namespace`` None = the kubeconfig context's (else ``default``)."""
    where = "spec.model.onnx.configMap"
    try:
        import urllib3
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
    except ImportError:
        raise ModelError(f"{where}: local mode reads the ConfigMap with the kubernetes Python client, which is not "
                         "installed (pip install kubernetes); or use spec.model.onnx.path with the file") from None
    try:
        # KUBECONFIG as it is now (the client reads it once, at import).
        kubeconfig = os.environ.get("KUBECONFIG") or None
        api = config.new_client_from_config(config_file=kubeconfig)
        if namespace is None:
            _, ctx = config.list_kube_config_contexts(config_file=kubeconfig)
            namespace = (ctx or {}).get("context", {}).get("namespace") or "default"
        cm = client.CoreV1Api(api).read_namespaced_config_map(name, namespace, _request_timeout=30)
    except (ConfigException, OSError, urllib3.exceptions.HTTPError) as e:
        raise ModelError(f"{where}: cannot reach a cluster through the current kubeconfig ({e}); "
                         "set KUBECONFIG, or use spec.model.onnx.path with the file") from None
    except client.ApiException as e:
        raise ModelError(f"{where}: cannot read ConfigMap {name} in namespace {namespace}: {e.status} {e.reason}; "
                         f"create it: kubectl create configmap {name} -n {namespace} --from-file={key}=FILE") from None
    binary, text = cm.binary_data or {}, cm.data or {}
    if key in binary:
        return base64.b64decode(binary[key])
    if key in text:
        return str(text[key]).encode()
    raise ModelError(f"{where}.key: ConfigMap {name} in namespace {namespace} has no key {key}; its keys: "
                     f"{', '.join(sorted({*(cm.binary_data or {}), *(cm.data or {})})) or 'none'}")


def _namespace_of(job_path: Path) -> str | None:
    try:
        doc = yaml.safe_load(job_path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return ((doc or {}).get("metadata") or {}).get("namespace") if isinstance(doc, dict) else None
