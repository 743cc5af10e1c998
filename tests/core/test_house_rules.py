"""House rules that run: ruff's lint (pycodestyle, pyflakes, import order) and mypy (every package;
the TuningJob contract and the pure planner strictly), both configured in pyproject.toml, find
nothing in the product, the bench code, the developer tooling or the tests."""

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


def test_mypy_finds_nothing() -> None:
    # /dev/null: no cache left in the checkout (a cold run takes ~15 s here).
    r = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", "/dev/null"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, f"mypy (configured in pyproject.toml):\n{r.stdout[-4000:]}{r.stderr[-1000:]}"
