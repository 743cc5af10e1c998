"""Generates deploy/sharetune.yaml (namespace, CRD, RBAC, operator Deployment) from the Helm
chart, for users without Helm. tests/helm checks that the committed file has not drifted.

    .venv/bin/python deploy/generate.py            # rewrite deploy/sharetune.yaml
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "deploy" / "sharetune.yaml"
NAMESPACE = "sharetune-system"


def render() -> str:
    from sharetune_dev.cluster import binaries  # the developer tooling: pip install -e ./devtools

    helm = binaries.ensure(["helm"])["helm"]
    body = subprocess.run([str(helm), "template", "sharetune", str(ROOT / "helm" / "sharetune"),
                           "--namespace", NAMESPACE, "--skip-tests"], check=True, capture_output=True, text=True).stdout
    header = ("# Generated from helm/sharetune by deploy/generate.py: do not edit by hand.\n"
              "# kubectl apply -f deploy/sharetune.yaml\n"
              f"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NAMESPACE}\n"
              # Pod Security, stated: the GPU pool daemons need hostIPC and root (docs/security.md),
              # which only the privileged level admits; the audit log shows what baseline would refuse.
              "  labels:\n    pod-security.kubernetes.io/enforce: privileged\n"
              "    pod-security.kubernetes.io/audit: baseline\n")
    return header + body


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}")
