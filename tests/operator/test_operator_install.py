"""The operator image's own install (``pip install /src[operator]`` in operator/Dockerfile, from
the same files the Dockerfile copies) runs every module of the operator: a module that imports
what only the tuner's extra has could not work in a real operator pod while the dev install
(everything) hides it. No developer tooling is installed with it, and no S3 client: a job's S3
clean-up runs in a Job of its own (sharetune.planner.plan_s3_cleanup)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What operator/Dockerfile copies into /src before `pip install "/src[operator]"`.
COPIED = ("pyproject.toml", "README.md", "operator", "tuner-image")

IMPORT_ALL = """
import importlib, pkgutil, sys
import sharetune
mods = [m.name for m in pkgutil.walk_packages(sharetune.__path__, "sharetune.")]
for m in mods:
    importlib.import_module(m)
assert "sharetune.controller.cleanup" in mods, mods
import importlib.util as u
assert u.find_spec("sharetune_dev") is None, "developer tooling installed with the operator"
assert u.find_spec("tvm") is None, "TVM installed with the operator"
assert u.find_spec("boto3") is None, "an S3 client installed with the operator"
print(len(mods), "modules")
"""


def test_operator_install_imports_every_operator_module(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in COPIED:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(p, src / name)
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"{src}[operator]"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = subprocess.run([str(py), "-c", IMPORT_ALL], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    r = subprocess.run([str(env_dir / "bin" / "sharetune"), "operator", "--help"], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and "--namespace" in r.stdout, r.stdout + r.stderr
    assert sys.executable != str(py)
