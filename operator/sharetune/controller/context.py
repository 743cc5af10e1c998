"""What every reconcile needs, made once at start-up and passed in (never module globals): the
API client, the namespaces the operator watches and the tuner image it plans pods with."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, config

from .. import requests as pod_requests
from ..library_policy import LibraryConfig
from ..netpolicy import NetworkConfig
from ..planner import DEFAULT_IMAGE
from ..sharing import SharingConfig
from .metrics import JobPhases

MEMO_KEY = "sharetune"
# The chart's mpsDaemonPriorityClass, resolved to a name ("" = none): the MPS daemons' priority.
DAEMON_PRIORITY_ENV = "SHARETUNE_MPS_DAEMON_PRIORITY_CLASS"
# The chart's allowedImages, comma-separated ("" = any image): the repositories spec.image may name.
ALLOWED_IMAGES_ENV = "SHARETUNE_ALLOWED_IMAGES"


def allowed_images(env: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(a.strip() for a in env.get(ALLOWED_IMAGES_ENV, "").split(",") if a.strip())


def load_api() -> client.ApiClient:
    """In-cluster credentials, else $KUBECONFIG read now (the kubernetes client reads
    $KUBECONFIG at import time, which breaks in-process tests)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    return client.ApiClient(client.Configuration.get_default_copy())


@dataclass(frozen=True)
class Context:
    api: client.ApiClient
    namespaces: tuple[str, ...] = ()  # empty = cluster-wide
    image: str = DEFAULT_IMAGE
    status_interval_s: float = 3.0
    phases: JobPhases = field(default_factory=JobPhases)
    sharing: SharingConfig = field(default_factory=SharingConfig)  # the chart's gpuSharing values
    network: NetworkConfig = field(default_factory=NetworkConfig)  # the chart's networkPolicy values
    requests: Mapping[str, Mapping[str, str]] = field(  # the chart's defaultRequests values
        default_factory=lambda: pod_requests.from_env({}))
    daemon_priority_class: str | None = None  # the MPS daemons' PriorityClass (None: none)
    allowed_images: tuple[str, ...] = ()  # repositories spec.image may name (empty: any)
    library: LibraryConfig = field(default_factory=LibraryConfig)  # the chart's library values

    @classmethod
    def from_env(cls, namespaces: tuple[str, ...] = ()) -> "Context":
        return cls(api=load_api(), namespaces=tuple(namespaces),
                   image=os.environ.get("SHARETUNE_TUNER_IMAGE", DEFAULT_IMAGE),
                   status_interval_s=float(os.environ.get("SHARETUNE_STATUS_INTERVAL", "3")),
                   # A bad setting stops the operator at start, naming the variable and chart value.
                   sharing=SharingConfig.from_env(), network=NetworkConfig.from_env(os.environ),
                   requests=pod_requests.from_env(os.environ),
                   daemon_priority_class=os.environ.get(DAEMON_PRIORITY_ENV, "").strip() or None,
                   allowed_images=allowed_images(os.environ), library=LibraryConfig.from_env(os.environ))

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def batch(self) -> client.BatchV1Api:
        return client.BatchV1Api(self.api)

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)

    @property
    def policy(self) -> client.PolicyV1Api:
        return client.PolicyV1Api(self.api)


def of(memo: Any) -> Context:
    """The context the start-up handler put in kopf's memo (every object's memo copies it)."""
    ctx = memo.get(MEMO_KEY)
    if not isinstance(ctx, Context):
        raise RuntimeError("the operator's context is missing: the start-up handler has not run")
    return ctx
