"""What a client and the host's build service (build_service.py) agree on, without TVM: the
environment that carries the run's key and artifact directory, and the shape of a batch.
Local mode imports this to start the service; builder.py to place its artifacts."""

from __future__ import annotations

import os
from typing import Any

AUTHKEY_ENV = "SHARETUNE_BUILD_AUTHKEY"
ARTIFACT_DIR_ENV = "SHARETUNE_BUILD_DIR"  # where built candidates go (builder.export_shared); unset: /tmp

# One candidate as it travels: (IRModule, Target, serialized params or None).
Item = tuple[Any, Any, Any]
# One result: (artifact path, None) or (None, error message).
Result = tuple[str | None, str | None]


def authkey() -> bytes:
    key = os.environ.get(AUTHKEY_ENV)
    if not key:
        raise RuntimeError(f"{AUTHKEY_ENV} is not set: the build service and its clients share it")
    return key.encode()
