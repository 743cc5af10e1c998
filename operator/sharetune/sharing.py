"""How the operator shares GPUs between jobs: its configuration (the chart's ``gpuSharing``
values, passed as environment variables) and the per-job input of the planner. Pure: standard
library, the contract and the ledger's types (docs/gpu-pools.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .admission import Placement, Policy
from .api.spec import DEFAULT_DEVICE_PLUGIN_RESOURCE, MODES, TuningJobSpec

POOL, EXCLUSIVE, DEVICE_PLUGIN = MODES

# Environment variable -> chart value it comes from (helm/sharetune/templates/deployment.yaml).
ENV = {
    "SHARETUNE_GPU_SHARING_MODE": "gpuSharing.defaultMode",
    "SHARETUNE_GPU_OVERCOMMIT": "gpuSharing.overcommit",
    "SHARETUNE_GPU_BACKFILL": "gpuSharing.backfill",
    "SHARETUNE_GPU_POOL_IDLE_SECONDS": "gpuSharing.poolIdleSeconds",
    "SHARETUNE_GPU_CROSS_NAMESPACE": "gpuSharing.crossNamespace",
    "SHARETUNE_GPU_DEVICE_PLUGIN_RESOURCE": "gpuSharing.devicePlugin.resourceName",
    "SHARETUNE_GPU_POOL_NAMESPACE": "the release namespace",
    "SHARETUNE_GPU_POOL_TOLERATIONS": "gpuSharing.poolTolerations",
}


class ConfigError(ValueError):
    """A sharing setting the operator cannot run with; names the variable and the chart value."""


@dataclass(frozen=True)
class SharingConfig:
    default_mode: str = POOL
    overcommit: float = 1.0  # the shares on a GPU may sum to 100 x this (1.0: never past 100 %)
    backfill: bool = False  # let a later job that fits pass one that waits (may delay the head)
    pool_idle_s: float = 300.0  # a pool daemon with no job this long is released
    cross_namespace: bool = False  # jobs of different namespaces on one GPU (one MPS server)
    device_plugin_resource: str = DEFAULT_DEVICE_PLUGIN_RESOURCE
    pool_namespace: str = "sharetune-system"  # where the pool daemons run: the operator's own
    pool_tolerations: tuple[Mapping[str, Any], ...] = field(default=())

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "SharingConfig":
        env = os.environ if env is None else env
        d = cls()

        def get(var: str) -> str | None:
            v = env.get(var)
            return v.strip() if v is not None and v.strip() else None

        def bad(var: str, value: str, want: str) -> ConfigError:
            return ConfigError(f"{var}={value!r} ({ENV[var]}): expected {want}")

        def boolean(var: str, default: bool) -> bool:
            v = get(var)
            if v is None:
                return default
            if v.lower() not in ("true", "false", "1", "0"):
                raise bad(var, v, "true or false")
            return v.lower() in ("true", "1")

        def number(var: str, default: float, lo: float) -> float:
            v = get(var)
            if v is None:
                return default
            try:
                x = float(v)
            except ValueError:
                raise bad(var, v, f"a number >= {lo:g}") from None
            if x < lo:
                raise bad(var, v, f"a number >= {lo:g}")
            return x

        mode = get("SHARETUNE_GPU_SHARING_MODE") or d.default_mode
        if mode not in MODES:
            raise bad("SHARETUNE_GPU_SHARING_MODE", mode, " or ".join(MODES))
        tol_text = get("SHARETUNE_GPU_POOL_TOLERATIONS")
        try:
            tolerations = json.loads(tol_text) if tol_text else []
        except ValueError:
            tolerations = None
        if not isinstance(tolerations, list) or not all(isinstance(t, dict) for t in tolerations):
            raise bad("SHARETUNE_GPU_POOL_TOLERATIONS", tol_text or "", "a JSON list of tolerations")
        return cls(default_mode=mode,
                   overcommit=number("SHARETUNE_GPU_OVERCOMMIT", d.overcommit, 1.0),
                   backfill=boolean("SHARETUNE_GPU_BACKFILL", d.backfill),
                   pool_idle_s=number("SHARETUNE_GPU_POOL_IDLE_SECONDS", d.pool_idle_s, 0.0),
                   cross_namespace=boolean("SHARETUNE_GPU_CROSS_NAMESPACE", d.cross_namespace),
                   device_plugin_resource=get("SHARETUNE_GPU_DEVICE_PLUGIN_RESOURCE") or d.device_plugin_resource,
                   pool_namespace=get("SHARETUNE_GPU_POOL_NAMESPACE") or d.pool_namespace,
                   pool_tolerations=tuple(tolerations))

    @property
    def policy(self) -> Policy:
        return Policy(overcommit=self.overcommit, backfill=self.backfill, cross_namespace=self.cross_namespace)

    def mode_of(self, spec: TuningJobSpec) -> str | None:
        """The mode a job runs in: None for a CPU job; exclusive without MPS (each server owns a
        GPU); else the job's own mode, else the chart's default."""
        if spec.target != "cuda":
            return None
        if not spec.mps:
            return EXCLUSIVE
        return spec.sharing.mode or self.default_mode

    def sharing_of(self, spec: TuningJobSpec, placement: Placement | None = None) -> "Sharing | None":
        mode = self.mode_of(spec)
        if mode is None:
            return None
        return Sharing(mode, placement, spec.sharing.device_plugin_resource or self.device_plugin_resource,
                       self.pool_namespace)


@dataclass(frozen=True)
class Sharing:
    """The planner's input for a cuda job: its mode and, in mode pool, the GPUs its share is
    booked on (``placement.devices``, one per GPU group)."""

    mode: str
    placement: Placement | None = None
    resource_name: str = DEFAULT_DEVICE_PLUGIN_RESOURCE
    pool_namespace: str = "sharetune-system"  # the pool daemons' (the release's): keys their host directories

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.mode == POOL and self.placement is None:
            raise ValueError("mode pool needs the job's placement: plan its servers only once it is admitted")
