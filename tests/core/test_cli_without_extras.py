"""The `sharetune` command where only part of sharetune is installed (the quickstart installs the
`tuner` extra only: no kopf, no developer tooling): every command is still listed, and one that
cannot run says in one line what to install instead of argparse's `invalid choice`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from sharetune.cli import build_parser
from sharetune.smoke import result_worth

ROOT = Path(__file__).resolve().parents[2]


def _bare_sharetune(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`sharetune ARGS` in an interpreter that sees sharetune's sources and PyYAML (its one import
    at parse time) and nothing else: no kopf, no TVM, no rich, no installed distribution's metadata
    (so no sharetune-dev entry points). A real venv of the same would cost a pip install of TVM."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    if not (site / "yaml").exists():
        (site / "yaml").symlink_to(Path(yaml.__file__).parent)
    path = os.pathsep.join([str(ROOT / "operator"), str(ROOT / "tuner-image"), str(site)])
    code = f"import sys; sys.path[:0] = {path.split(os.pathsep)!r}; from sharetune.cli import main; sys.exit(main())"
    # -I -S: no site-packages, no PYTHONPATH, no user site.
    return subprocess.run([sys.executable, "-I", "-S", "-c", code, *args], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)


def test_every_command_is_listed_and_the_missing_ones_say_what_to_install(tmp_path: Path) -> None:
    full = build_parser()._subparsers._group_actions[0].choices
    r = _bare_sharetune(tmp_path, "--help")
    assert r.returncode == 0, r.stderr
    listed = r.stdout.split("{", 1)[1].split("}", 1)[0].split(",")
    assert set(listed) == set(full) >= {"operator", "smoke-test", "run", "cluster"}, r.stdout

    r = _bare_sharetune(tmp_path, "cluster", "up", "--dir", "x")
    assert r.returncode == 2 and "invalid choice" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [
        "sharetune cluster: it comes with the developer tooling (sharetune-dev), which is not installed; install it "
        "with: pip install -e ./devtools in a sharetune checkout (or: bash .ci/setup.sh)"]

    r = _bare_sharetune(tmp_path, "operator", "--namespace", "x")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "sharetune operator: Python module 'kopf' is missing; install it with: pip install 'sharetune[operator]'"]


def test_the_smoke_test_never_calls_an_unimproved_result_faster() -> None:
    not_improved = "not faster than untuned: tuning did not beat TVM's default schedules at this budget"
    status = {"bestSpeedup": 1.0, "improved": False,
              "conditions": [{"type": "Improved", "status": "False", "message": not_improved}]}
    assert result_worth(status) == not_improved
    assert result_worth({"bestSpeedup": 1.0}) == "not faster than untuned"  # an operator without the condition
    assert result_worth({"bestSpeedup": 2.5, "improved": True}) == "2.5x faster than untuned"
