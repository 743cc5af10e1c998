"""`sharetune operator`: runs the kopf operator with metrics and a liveness endpoint."""

from __future__ import annotations

import argparse
import asyncio
import logging


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("operator", help="run the TuningJob operator (kopf)")
    p.add_argument("--namespace", action="append", default=[], help="watch these namespaces (default: all)")
    p.add_argument("--metrics-port", type=int, default=8080, help="/metrics (prometheus)")
    p.add_argument("--liveness-port", type=int, default=8081, help="/healthz (kopf liveness)")
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=run)


def run(a: argparse.Namespace) -> int:
    import kopf
    from prometheus_client import start_http_server

    from . import handlers  # registers the handlers

    logging.basicConfig(level=logging.DEBUG if a.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if a.metrics_port >= 0:
        start_http_server(a.metrics_port)
    settings = kopf.OperatorSettings()
    # Namespaced (the chart's default, a Role only): serve the named namespaces as they are. With
    # scanning on, kopf first lists namespaces cluster-wide, is refused, and retries for ~40 s
    # before it falls back to exactly this, on every operator start (seen on the real node).
    settings.scanning.disabled = bool(a.namespace) and not any(c in n for n in a.namespace for c in "*?!,")
    asyncio.run(kopf.operator(
        clusterwide=not a.namespace, namespaces=a.namespace, settings=settings,
        memo=kopf.Memo({handlers.NAMESPACES_KEY: tuple(a.namespace)}),
        liveness_endpoint=f"http://0.0.0.0:{a.liveness_port}/healthz" if a.liveness_port >= 0 else None,
        standalone=True))
    return 0
