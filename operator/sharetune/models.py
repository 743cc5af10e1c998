"""What sharetune knows of a job's model without loading it: the built-in models' names, the check
of a ``spec.model.name``, and the download of a ``spec.model.onnx.url`` into a cache. The standard
library and the contract only (no ONNX, no TVM): local mode prepares the model with it before any
tuner process starts, and the tuner's model loader (``sharetune_tuner.model.loader``) uses the same."""

from __future__ import annotations

import difflib
import hashlib
import urllib.error
import urllib.request
from pathlib import Path

from .api.errors import ModelError
from .api.spec import BUILTIN_MODELS  # the names of the tuner's zoo (sharetune_tuner/model/zoo.py builds them)

__all__ = ["BUILTIN_MODELS", "MODEL_CACHE_ENV", "check_builtin", "fetch_url"]

# Where a URL's model is cached (local mode: the run's work dir, so all its processes share one
# download); unset: ~/.cache/sharetune/models.
MODEL_CACHE_ENV = "SHARETUNE_MODEL_CACHE"
_URL_TIMEOUT_S = 60
_MAX_MODEL_BYTES = 2 << 30


def check_builtin(name: str) -> None:
    """A ``spec.model.name`` that is not a built-in model: the one-line error lists them."""
    if name not in BUILTIN_MODELS:
        near = difflib.get_close_matches(name, sorted(BUILTIN_MODELS), n=1, cutoff=0.5)
        raise ModelError(f"spec.model.name: unknown built-in model {name!r}; choose one of "
                         f"{', '.join(sorted(BUILTIN_MODELS))}" + (f" (did you mean {near[0]}?)" if near else "")
                         + ", or set spec.model.onnx for your own model")


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
