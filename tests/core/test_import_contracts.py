"""The floors of the house (devtools/importlinter.ini), checked with import-linter: the contract
imports nothing else of either package, the tuner never imports the operator's controller or
planner, the product never imports the tuner, nothing shipped imports the developer tooling, and
no module imports itself in a cycle."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(lint), str(ROOT / "devtools" / "importlinter.ini"), "--no-cache"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert "BROKEN" not in r.stdout and "Contracts: 7 kept, 0 broken." in r.stdout, r.stdout[-3000:]


def test_the_pure_core_imports_without_kopf_kubernetes_or_tvm() -> None:
    """What import-linter cannot see: nothing the contract or the planner imports at run time
    pulls the heavy packages in (a fresh interpreter, so earlier tests' imports do not count)."""
    code = ("import sys, sharetune.api.spec, sharetune.api.topology, sharetune.api.commands, sharetune.planner, "
            "sharetune.admission, sharetune.sharing, sharetune.gpushare, sharetune.driver, "
            "sharetune.controller.status, sharetune_tuner.cli; "
            "heavy = sorted({'kopf', 'kubernetes', 'tvm', 'tvm_ffi', 'boto3'} & set(sys.modules)); "
            "print(heavy); sys.exit(1 if heavy else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
