"""Loads a model (built-in zoo name, ONNX path or URL) into a Relax module ready for tuning."""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sharetune.api.spec import ModelSpec
from sharetune.api.topology import MODEL_DIR, MODEL_DIR_ENV, MODEL_FILE

from .errors import ModelError
from .zoo import ZOO

INPUT_NAME = "input"
_URL_TIMEOUT_S = 60
_MAX_MODEL_BYTES = 2 << 30


@dataclass
class LoadedModel:
    name: str
    input_shape: tuple[int, ...]
    input_name: str
    mod: Any  # tvm.IRModule, decomposed for inference but not fused (what compile_relax takes)
    params: list[Any]  # the weights, in the order main() takes them after the input

    def sample_input(self, seed: int = 0) -> np.ndarray:
        return np.random.default_rng(seed).standard_normal(self.input_shape).astype(np.float32)


def fetch_url(url: str, cache_dir: Path) -> Path:
    """Downloads ``url`` once into ``cache_dir`` (keyed by URL) and returns the local path."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    dest = cache_dir / (hashlib.sha256(url.encode()).hexdigest()[:16] + ".onnx")
    if dest.exists():
        return dest
    try:
        with urllib.request.urlopen(url, timeout=_URL_TIMEOUT_S) as r:
            data = r.read(_MAX_MODEL_BYTES + 1)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise ModelError(f"cannot download model from {url}: {e}") from None
    if len(data) > _MAX_MODEL_BYTES:
        raise ModelError(f"model at {url} is larger than {_MAX_MODEL_BYTES >> 20} MiB")
    tmp = dest.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(dest)
    return dest


def _onnx_from_file(path: Path) -> Any:
    import onnx

    if not path.exists():
        raise ModelError(f"model file {path} does not exist")
    try:
        m = onnx.load(str(path))
        onnx.checker.check_model(m)
    except Exception as e:  # onnx raises DecodeError, ValidationError, ... for bad files
        raise ModelError(f"{path} is not a valid ONNX model: {type(e).__name__}: {e}") from None
    return m


def _input_shape(model: Any, override: tuple[int, ...] | None) -> tuple[str, tuple[int, ...]]:
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    if len(inputs) != 1:
        raise ModelError(f"sharetune tunes single-input models; this one has {len(inputs)} inputs")
    inp = inputs[0]
    if override is not None:
        return inp.name, tuple(override)
    dims = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    if not dims or any(d <= 0 for d in dims):
        raise ModelError(f"input {inp.name!r} has a dynamic shape {dims}; set spec.model.inputShape")
    return inp.name, tuple(dims)


def load(name: str | None = None, onnx_path: str | Path | None = None, url: str | None = None,
         input_shape: tuple[int, ...] | None = None, cache_dir: Path | None = None) -> LoadedModel:
    """Exactly one of ``name`` (zoo), ``onnx_path`` or ``url``."""
    if sum(x is not None for x in (name, onnx_path, url)) != 1:
        raise ModelError("give exactly one of a built-in model name, an ONNX path or a URL")
    if name is not None:
        if name not in ZOO:
            raise ModelError(f"unknown built-in model {name!r}; choose one of {', '.join(sorted(ZOO))}")
        entry = ZOO[name]
        shape = tuple(input_shape or entry.default_shape)
        try:
            proto = entry.build(list(shape))
        except Exception as e:
            raise ModelError(f"cannot build {name} for input shape {list(shape)}: {e}") from None
        label, input_name = name, INPUT_NAME
    else:
        path = Path(onnx_path) if onnx_path is not None else fetch_url(
            str(url), cache_dir or Path.home() / ".cache" / "sharetune" / "models")
        proto = _onnx_from_file(path)
        input_name, shape = _input_shape(proto, input_shape)
        label = path.stem if onnx_path is not None else str(url).rsplit("/", 1)[-1]
    return _to_relax(label, proto, input_name, shape)


def _to_relax(label: str, proto: Any, input_name: str, shape: tuple[int, ...]) -> LoadedModel:
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    try:
        mod = from_onnx(proto, {input_name: list(shape)}, keep_params_in_input=True)
    except Exception as e:
        raise ModelError(f"TVM cannot import {label}: {type(e).__name__}: {e}") from None
    mod, params = relax.frontend.detach_params(mod)
    # Batch-norm & co. decomposed, bindings canonicalised. Not fused here: compile_relax fuses
    # itself, and fusing an already fused module yields other PrimFuncs whose records never match
    # (measured: every conv missed its record, tuned == untuned). tasks.extract fuses a copy.
    mod = relax.transform.DecomposeOpsForInference()(mod)
    mod = relax.transform.CanonicalizeBindings()(mod)
    return LoadedModel(label, tuple(shape), input_name, mod, list(params.get("main", [])))


def load_for_spec(spec: ModelSpec, cache_dir: Path | None = None) -> LoadedModel:
    """The model a job's ``spec.model`` names."""
    if spec.name is not None:
        return load(name=spec.name, input_shape=spec.input_shape)
    src = spec.onnx
    assert src is not None  # the spec parser: exactly one of name or onnx
    if src.url:
        return load(url=src.url, input_shape=spec.input_shape, cache_dir=cache_dir)
    if src.path:
        return load(onnx_path=src.path, input_shape=spec.input_shape)
    # A ConfigMap or PVC source: the operator mounts it at SHARETUNE_MODEL_DIR in the client and
    # merge pods (the ConfigMap's key as model.onnx, the PVC as a whole).
    root = Path(os.environ.get(MODEL_DIR_ENV, MODEL_DIR))
    if src.config_map:
        path, where = root / MODEL_FILE, f"ConfigMap {src.config_map} key {src.config_map_key}"
    else:
        path, where = root / str(src.pvc_path or "").lstrip("/"), f"PVC {src.pvc} path {src.pvc_path}"
    if not path.is_file():
        raise ModelError(f"no model file at {path} ({where}); outside a pod, use spec.model.onnx.path")
    return load(onnx_path=path, input_shape=spec.input_shape)
