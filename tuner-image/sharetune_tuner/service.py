"""What every tuner process shares: /metrics + /healthz (+ /livez) on a port, and SIGTERM = clean stop."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

log = logging.getLogger("sharetune")


class StatusServer:
    """Serves ``/metrics`` (Prometheus text format), ``/healthz`` (200 when healthy) and
    ``/livez`` (200 while ``live`` says so; without one, while this process answers at all): a
    process whose readiness and liveness must differ (the MPS daemon) gives both."""

    def __init__(self, port: int, healthy: Callable[[], tuple[bool, str]] | None = None,
                 host: str = "0.0.0.0", live: Callable[[], tuple[bool, str]] | None = None) -> None:
        check = healthy or (lambda: (True, "ok"))
        live_check = live or (lambda: (True, "ok"))

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server naming)
                if self.path.startswith("/metrics"):
                    body, ctype, code = generate_latest(REGISTRY), CONTENT_TYPE_LATEST, 200
                elif self.path.startswith("/healthz") or self.path.startswith("/livez"):
                    ok, why = (check if self.path.startswith("/healthz") else live_check)()
                    body, ctype, code = why.encode() + b"\n", "text/plain", 200 if ok else 503
                else:
                    body, ctype, code = b"not found\n", "text/plain", 404
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # scrapes every few seconds: keep logs quiet
                pass

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="status-http", daemon=True)

    def start(self) -> "StatusServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT: long-running loops poll it and wind down cleanly."""
    stop = threading.Event()

    def handler(signum: int, _frame: Any) -> None:
        log.info("received %s: stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return stop


def setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
