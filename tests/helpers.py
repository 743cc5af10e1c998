"""Small helpers shared by the test packages."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(what: str, fn: Callable[[], Any], timeout_s: float = 60.0, every: float = 0.3) -> Any:
    """Polls ``fn`` until it returns something truthy; fails with ``what`` and the last value."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


class DenyingS3:
    """An S3 endpoint on loopback that refuses every request as S3 does wrong credentials (403
    AccessDenied), for the paths where a store must fail; a context manager."""

    BODY = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
            b"<Message>Access Denied</Message></Error>")

    def __init__(self) -> None:
        import http.server
        import threading

        body = self.BODY

        class Handler(http.server.BaseHTTPRequestHandler):
            def _deny(self) -> None:
                self.send_response(403)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _deny

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="denying-s3", daemon=True)

    def __enter__(self) -> "DenyingS3":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
