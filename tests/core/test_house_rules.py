"""House rules that run: ruff's lint (pycodestyle, pyflakes, import order; configured in
pyproject.toml) finds nothing in the product, the bench code, the developer tooling or the tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("operator", "tuner-image", "devtools", "bench", "tests")


def test_ruff_finds_nothing() -> None:
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", *CHECKED],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    fix = "fix them, or run `.venv/bin/ruff check --fix`"
    assert r.returncode == 0, f"ruff check ({fix}):\n{r.stdout[-4000:]}{r.stderr[-1000:]}"
