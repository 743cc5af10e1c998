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


def test_every_silenced_check_says_why() -> None:
    """A ``# type: ignore[code]`` or ``# noqa: CODE`` is followed by its reason (``# why`` or ``(why)``)."""
    import re

    silenced = re.compile(r"#\s*(type:\s*ignore(\[[^\]]*\])?|noqa(:\s*[A-Z0-9, ]+)?)(?P<rest>.*)$")
    bare = []
    for top in CHECKED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if ".venv" in path.parts or "site-packages" in path.parts or path == Path(__file__).resolve():
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                m = silenced.search(line)
                if m and not re.match(r"\s*(#\s*\S|\(\S)", m.group("rest")):  # "# reason" or "(reason)"
                    bare.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bare, "say why after the marker (`# type: ignore[code]  # reason`):\n" + "\n".join(bare[:40])


def test_code_speaks_of_the_product_not_its_history() -> None:
    """Comments, docstrings and strings state what the code or benchmark does: no tracker numbers,
    work sessions, machine-time accounting or dated rounds of work (benchmark cell ids such as ``-r3``
    are fine)."""
    import re

    # Built from pieces so that this file does not match its own pattern.
    history = re.compile("|".join(("iss" + r"ue [0-9]+", "sess" + r"ion [0-9]+", "dev" + r"ice (time|minutes)",
                                   "rou" + r"nd r[0-9]")), re.IGNORECASE)
    hits = []
    for top in CHECKED:
        for path in sorted(p for ext in ("*.py", "*.sh") for p in (ROOT / top).rglob(ext)):
            rel = path.relative_to(ROOT)
            if {".venv", "site-packages", "__pycache__"} & set(rel.parts) or rel.parts[:2] == ("bench", "results"):
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if history.search(line):
                    hits.append(f"{rel}:{n}: {line.strip()}")
    assert not hits, "say what the code does, not when or why it came to be:\n" + "\n".join(hits[:40])


def test_no_function_of_the_product_is_over_60_lines() -> None:
    """Small functions, one job each: the operator and the tuner runtime (benchmarks and tests are
    not the product)."""
    import ast

    long = []
    for top in ("operator/sharetune", "tuner-image/sharetune_tuner"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = (node.end_lineno or node.lineno) - node.lineno + 1
                    if n > 60:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name} ({n} lines)")
    assert not long, "split these:\n" + "\n".join(long)
