"""Every object sharetune puts on a cluster, as YAML a linter can read: the rendered chart and the
planner's objects of every mode, one multi-document file per mode; and the findings of kube-score
and checkov on them.

    .venv/bin/python -m sharetune_dev.manifests DIR          # writes DIR/<mode>.yaml
    .venv/bin/python -m sharetune_dev.manifests DIR --lint   # ... and prints every finding

or run the linters by hand (both pinned and cached by ``python -m sharetune_dev.cluster.binaries``;
docs/security.md, "Accepted findings"; tests/helm/test_linters.py checks them against its list):

    ~/.cache/sharetune/bin/kube-score-1.20.0/kube-score score DIR/pool.yaml --kubernetes-version v1.35 -o ci
    ~/.cache/sharetune/bin/checkov-3.3.30/checkov -f DIR/pool.yaml --framework kubernetes --skip-download --compact

The planner's objects are made with the chart's defaults (its tuner image, the daemons'
PriorityClass, the default requests and NetworkPolicy), for a job ``tj`` in namespace ``team-a``
and the operator in ``sharetune-system``, as the operator would apply them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "sharetune"
RELEASE, RELEASE_NAMESPACE = "sharetune", "sharetune-system"
JOB_NAMESPACE = "team-a"
# The chart's default mpsDaemonPriorityClass (create: true, name: ""): templates/_helpers.tpl.
DAEMON_PRIORITY_CLASS = f"sharetune-operator-{RELEASE_NAMESPACE}-mps-daemon"
S3_OUTPUT = {"s3": {"bucket": "results", "prefix": "runs/", "endpoint": "https://s3.example:9000",
                    "credentialsSecret": {"name": "s3-creds"}, "cleanupOnDelete": True}}


def _job(name: str) -> Any:
    from sharetune.planner import JobRef

    return JobRef(name, JOB_NAMESPACE, f"00000000-0000-4000-8000-{zlib.crc32(name.encode()):012d}")


def _spec(name: str, body: dict[str, Any]) -> Any:
    from sharetune.api.spec import parse_spec

    return parse_spec(name, body)


# What a daemon publishes on a real node: the UUID of the GPU the device plugin gave it.
PUBLISHED_GPU = "GPU-8e6a3f8c-0000-4000-8000-00000000c0de"


def _job_objects(name: str, body: dict[str, Any], sharing: Any = None) -> list[dict[str, Any]]:
    """A job's objects as the operator applies them: plan(), the clients once a daemon has named
    its GPU where the job's GPU is a daemon's, then the merge Job."""
    from sharetune.planner import pins_gpu, plan, plan_clients, plan_merge

    job, spec = _job(name), _spec(name, body)
    pinned = pins_gpu(spec, sharing)
    return [*plan(job, spec, sharing=sharing, daemon_priority_class=DAEMON_PRIORITY_CLASS),
            *([plan_clients(job, spec)] if pinned else []),
            plan_merge(job, spec, sharing=sharing, gpu=PUBLISHED_GPU if pinned else None)]


def chart() -> list[dict[str, Any]]:
    """``helm template`` with the chart's default values (the ``helm test`` hook included)."""
    from sharetune_dev.cluster import binaries

    helm = binaries.ensure(["helm"])["helm"]
    out = subprocess.run([str(helm), "template", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE],
                         check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def exclusive() -> list[dict[str, Any]]:
    """Mode exclusive: a job with its own MPS daemon, and one without MPS (each server a GPU)."""
    return [*_job_objects("tj", {"model": {"name": "resnet18"}, "target": "cuda",
                                 "gpuSharing": {"mode": "exclusive"}}),
            *_job_objects("tj-nomps", {"model": {"name": "resnet18"}, "target": "cuda",
                                       "gpuSharing": {"mode": "exclusive", "mps": False}})]


def pool() -> list[dict[str, Any]]:
    """Mode pool: the operator's daemon of one GPU, its identity and PodDisruptionBudget, a job placed
    there."""
    from sharetune.admission import GpuId, Placement
    from sharetune.planner import plan_pool, plan_pool_budget, plan_pool_identity
    from sharetune.sharing import Sharing

    placed = Sharing("pool", Placement((GpuId("gpu-node-0", 0),), 50, 8192), pool_namespace=RELEASE_NAMESPACE)
    return [plan_pool("gpu-node-0", 0, RELEASE_NAMESPACE, daemon_priority_class=DAEMON_PRIORITY_CLASS),
            plan_pool_budget("gpu-node-0", 0, RELEASE_NAMESPACE),
            *plan_pool_identity("gpu-node-0", 0, RELEASE_NAMESPACE),
            *_job_objects("tj", {"model": {"name": "resnet18"}, "target": "cuda",
                                 "gpuSharing": {"mode": "pool", "share": 50, "pinnedMemory": "8G"}}, placed)]


def device_plugin() -> list[dict[str, Any]]:
    """Mode devicePlugin: each server (and the merge) requests a replica of the plugin's resource."""
    from sharetune.sharing import SharingConfig

    body = {"model": {"name": "resnet18"}, "target": "cuda", "gpuSharing": {"mode": "devicePlugin"}}
    return _job_objects("tj", body, SharingConfig().sharing_of(_spec("tj", body)))


def cpu() -> list[dict[str, Any]]:
    """A CPU job: no GPU, no daemon."""
    return _job_objects("tj", {"model": {"name": "tiny_cnn"}, "target": "llvm"})


def cpu_builders() -> list[dict[str, Any]]:
    """A CPU job with spec.builders: the build key Secret, builders, their Service and autoscaler."""
    return _job_objects("tj", {"model": {"name": "tiny_cnn"}, "target": "llvm",
                               "builders": {"replicas": 2, "resources": {"requests": {"cpu": "2", "memory": "2Gi"}},
                                            "autoscale": {"minReplicas": 2, "maxReplicas": 4}}})


def s3() -> list[dict[str, Any]]:
    """S3 output: the job's objects (credentials from a Secret) and its S3 clean-up Job."""
    from sharetune.planner import plan_s3_cleanup

    body = {"model": {"name": "tiny_cnn"}, "target": "llvm", "output": S3_OUTPUT}
    return [*_job_objects("tj", body), plan_s3_cleanup(_job("tj"), _spec("tj", body))]


MODES: dict[str, Callable[[], list[dict[str, Any]]]] = {
    "chart": chart, "exclusive": exclusive, "pool": pool, "device-plugin": device_plugin,
    "cpu": cpu, "cpu-builders": cpu_builders, "s3": s3,
}


def write(out_dir: Path, modes: list[str] | None = None) -> dict[str, Path]:
    """Writes ``out_dir/<mode>.yaml`` for each mode (all by default); returns mode -> path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for mode in modes or list(MODES):
        path = out_dir / f"{mode}.yaml"
        path.write_text(yaml.safe_dump_all(MODES[mode](), sort_keys=False))
        paths[mode] = path
    return paths


# ---- the linters ----------------------------------------------------------------------------------
KUBERNETES_VERSION = "v1.35"  # kube-score's API deprecation checks: the version the project targets


@dataclass(frozen=True, order=True)
class Finding:
    """One failed check on one object: ``where`` is ``<mode>:<Kind>/<name>``; ``check`` is the
    tool's check id (kube-score: ``<id>: <summary>``, as one id covers several findings, e.g. a
    missing CPU limit and a missing CPU request); ``detail`` (a container, a key) only informs."""
    tool: str
    check: str
    where: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.tool} {self.check} @ {self.where}" + (f" ({self.detail})" if self.detail else "")


def kube_score(mode: str, path: Path) -> list[Finding]:
    """kube-score's warnings and critical findings on one file (its objects judged together:
    a NetworkPolicy or Service of the same file counts)."""
    from sharetune_dev.cluster import binaries

    r = subprocess.run([str(binaries.path_of("kube-score")), "score", str(path), "--output-format", "json",
                        "--kubernetes-version", KUBERNETES_VERSION], capture_output=True, text=True, timeout=120)
    if r.returncode not in (0, 1) or not r.stdout.strip():  # 1: findings
        raise RuntimeError(f"kube-score failed on {path} (exit {r.returncode}): {r.stderr[-2000:]}")
    out = []
    for obj in json.loads(r.stdout):
        where = f"{mode}:{obj['type_meta']['kind']}/{obj['object_meta']['name']}"
        for c in obj["checks"]:
            if c["skipped"] or c["grade"] >= 10:  # 10: OK; 5: warning; 1: critical
                continue
            for comment in c["comments"] or [{"summary": c["check"]["name"], "path": ""}]:
                out.append(Finding("kube-score", f"{c['check']['id']}: {comment['summary']}", where,
                                   comment.get("path") or ""))
    return sorted(set(out))


def checkov(paths: dict[str, Path]) -> list[Finding]:
    """checkov's failed checks (framework kubernetes, offline) on every file, in one run."""
    from sharetune_dev.cluster import binaries

    mode_of = {p.resolve(): m for m, p in paths.items()}
    r = subprocess.run([str(binaries.path_of("checkov")), "--framework", "kubernetes", "--skip-download",
                        "--quiet", "--compact", "-o", "json", "-f", *map(str, paths.values())],
                       capture_output=True, text=True, timeout=300)
    if r.returncode not in (0, 1) or not r.stdout.strip():  # 1: findings
        raise RuntimeError(f"checkov failed (exit {r.returncode}): {r.stderr[-2000:]}")
    reports = json.loads(r.stdout)
    out = []
    for report in reports if isinstance(reports, list) else [reports]:
        if report.get("summary", {}).get("parsing_errors"):
            raise RuntimeError(f"checkov could not parse a file: {report['summary']}")
        for f in report.get("results", {}).get("failed_checks", []):
            # resource: "<Kind>.<namespace>.<name>[.<labels>]" (a controller's pod template: "Pod.")
            kind, _, rest = f["resource"].partition(".")
            name = rest.split(".", 1)[1].split(".", 1)[0] if "." in rest else rest
            keys = ",".join(f["check_result"].get("evaluated_keys") or [])
            out.append(Finding("checkov", f["check_id"], f"{mode_of[Path(f['file_abs_path']).resolve()]}:{kind}/{name}",
                               keys))
    return sorted(set(out))


def lint(paths: dict[str, Path]) -> list[Finding]:
    return sorted([*(f for m, p in paths.items() for f in kube_score(m, p)), *checkov(paths)])


def print_findings(findings: Iterable[Finding]) -> None:
    for f in findings:
        print(f)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sharetune_dev.manifests", description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path, help="output directory (one <mode>.yaml per mode)")
    p.add_argument("--mode", action="append", choices=list(MODES), help="only these modes (repeatable)")
    p.add_argument("--lint", action="store_true", help="run kube-score and checkov on them, print every finding")
    a = p.parse_args(argv)
    paths = write(a.dir, a.mode)
    for mode, path in paths.items():
        print(f"{mode:14s} {path}")
    if a.lint:
        print_findings(lint(paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
