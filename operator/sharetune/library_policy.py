"""The operator's side of the tuning library (docs/library.md): the chart's settings (the mode of a
job that names a library but no mode, and the scopes shared across namespaces) and what a job's
clients and merge get from ``spec.library``: the library's URI, its volume or S3 credentials, the
scope and the mode. Pure: no Kubernetes API calls."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .api import commands
from .api.spec import DEFAULT_LIBRARY_MODE, LIBRARY_MODES, LibrarySpec, TuningJobSpec, library_mode, library_scope
from .api.topology import s3_env

DEFAULT_MODE_ENV = "SHARETUNE_LIBRARY_DEFAULT_MODE"  # the chart's library.defaultMode
SHARED_SCOPES_ENV = "SHARETUNE_LIBRARY_SHARED_SCOPES"  # the chart's library.sharedScopes, comma-separated
LIBRARY_MOUNT = "/var/lib/sharetune/library"  # where a spec.library.pvc is mounted in the pods
# The library's own S3 variables (the tuner's library.LIBRARY_ENV_PREFIX): a job may keep its outputs
# in one bucket and read the library from another, with other keys.
ENV_PREFIX = "SHARETUNE_LIBRARY_"


@dataclass(frozen=True)
class LibraryConfig:
    default_mode: str = DEFAULT_LIBRARY_MODE
    shared_scopes: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LibraryConfig:
        mode = env.get(DEFAULT_MODE_ENV, "").strip() or DEFAULT_LIBRARY_MODE
        if mode not in LIBRARY_MODES:
            raise ValueError(f"{DEFAULT_MODE_ENV}={mode!r} (the chart's library.defaultMode) is not one of "
                             f"{', '.join(LIBRARY_MODES)}")
        scopes = tuple(s.strip() for s in env.get(SHARED_SCOPES_ENV, "").split(",") if s.strip())
        return cls(default_mode=mode, shared_scopes=scopes)


@dataclass(frozen=True)
class LibraryParts:
    """What a client or merge pod gets: arguments, volumes, mounts and env."""

    args: list[str] = field(default_factory=list)
    volumes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    env: list[dict[str, Any]] = field(default_factory=list)


def _uri(lib: LibrarySpec) -> str | None:
    if lib.pvc:
        return f"{LIBRARY_MOUNT}/{lib.pvc_path}".rstrip("/")
    if lib.s3 is not None:
        return f"s3://{lib.s3.bucket}/{lib.s3.prefix}".rstrip("/")
    return None


def library_parts(spec: TuningJobSpec, namespace: str, config: LibraryConfig | None) -> LibraryParts:
    """The pods' share of ``spec.library`` (nothing without one, or in mode none). The scope is the
    job's namespace unless the chart shares the one it names (SpecError otherwise)."""
    config = config or LibraryConfig()
    lib = spec.library
    mode = library_mode(lib, config.default_mode)
    uri = _uri(lib)
    if mode == "none" or uri is None:
        return LibraryParts()
    args = commands.library(uri, library_scope(lib, namespace, config.shared_scopes), mode)
    if lib.pvc:
        return LibraryParts(args, [{"name": "library", "persistentVolumeClaim": {"claimName": lib.pvc}}],
                            [{"name": "library", "mountPath": LIBRARY_MOUNT}])
    return LibraryParts(args, env=s3_env(lib.s3, ENV_PREFIX))
