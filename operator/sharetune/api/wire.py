"""How the wire formats (:mod:`.progress`, :mod:`.summary`) reach and leave a file: written
whole or not at all, and read as one JSON object or nothing."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` through a sibling temporary file: a reader (local mode, the operator,
    a ConfigMap sync) never sees half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def parse_object(text: str | bytes | None, from_dict: Callable[[dict[str, Any]], T]) -> T | None:
    """``from_dict`` of the JSON object in ``text``; None when the text is empty, not JSON, not an
    object, or an object ``from_dict`` cannot read (a wrong type where a number belongs)."""
    if not text:
        return None
    try:
        d = json.loads(text)
        return from_dict(d) if isinstance(d, dict) else None
    except (ValueError, TypeError, KeyError):
        return None
