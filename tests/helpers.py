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
