"""kube-score and checkov on everything sharetune puts on a cluster: the rendered chart and the
planner's objects of every mode (``python -m sharetune_dev.manifests DIR``, one file per mode).

Every finding must be in ACCEPTED, with its reason, and every entry of ACCEPTED must still occur:
a new finding fails the test, and so does a fixed one whose entry was left behind. The list is
docs/security.md's "Accepted findings" table. Both tools are pinned and cached by
``python -m sharetune_dev.cluster.binaries`` (.ci/setup.sh); no cluster needed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

import pytest
import yaml

from sharetune_dev.manifests import Finding, lint, write

ROOT = Path(__file__).parents[2]
INSTALL = ".venv/bin/python -m sharetune_dev.cluster.binaries kube-score checkov  (bash .ci/setup.sh runs it)"


@dataclass(frozen=True)
class Accepted:
    """Findings of ``tool``'s ``check`` on the objects ``where`` matches (``<mode>:<Kind>/<name>``
    globs; checkov names a controller's pod template ``Pod/<controller>``), for ``reason``. Each
    glob must match at least one finding."""
    tool: str
    check: str
    where: tuple[str, ...]
    reason: str


# Objects, by role (modes: sharetune_dev.manifests.MODES).
OPERATOR = ("chart:Deployment/sharetune-operator",)
SMOKE = ("chart:Pod/sharetune-smoke-test",)  # the `helm test` hook
DAEMONS = ("exclusive:Pod/tj-mps", "pool:Pod/pool-gpu-node-0-gpu0")  # a job's own MPS daemon; a GPU pool's
JOB_PODS = ("*:Deployment/tj*-tracker", "*:Deployment/tj*-servers", "cpu-builders:Deployment/tj-builders",
            "*:Job/tj*-clients", "*:Job/tj*-merge", "s3:Job/tj-s3-cleanup")
EVERY_POD = (*OPERATOR, *SMOKE, *DAEMONS, *JOB_PODS)
API_CALLERS = (*OPERATOR, *SMOKE, *DAEMONS, "*:Job/tj*-clients", "*:Job/tj*-merge")
MPS_CLIENTS = ("exclusive:Deployment/tj-servers", "exclusive:Job/tj-merge", "pool:Deployment/tj-servers",
               "pool:Job/tj-merge")
ONE_REPLICA = (*OPERATOR, "*:Deployment/tj*-tracker")
SCALED = ("*:Deployment/tj*-servers", "cpu-builders:Deployment/tj-builders")
NO_POLICY = ("chart:*/sharetune-operator", *SMOKE, "pool:Pod/pool-gpu-node-0-gpu0")

KS, CK = "kube-score", "checkov"
R_LIMITS = ("no CPU or memory limits on purpose (operator/sharetune/requests.py): a limit below a TVM build's or "
            "a measurement's peak kills or throttles it and skews the timings; every container has requests "
            "(defaultRequests; never BestEffort) and a job's spec sets limits where its owner wants them")
R_PULL = ("IfNotPresent: images are pinned tags, and nodes without a registry (the tests', air-gapped GPU nodes) "
          "run pre-loaded localhost/ images that Always cannot pull; image.pullPolicy and spec.imagePullPolicy "
          "set Always where wanted")
R_UID = ("UID/GID 1000 is the tuner image's user, and one UID for every MPS client of a GPU (MPS serves one UID "
         "at a time; the daemon hands its pipe directory to group 1000); non-root, no escalation, every "
         "capability dropped, read-only root")
R_ROOT = ("the daemon pods' init container (mps-dir) hands the host directory the kubelet created as root to "
          "UID/GID 1000, which the daemon then runs as: root for seconds, not privileged, no escalation, only "
          "CHOWN, DAC_OVERRIDE, FOWNER added, the chart's image and a fixed command")
ACCEPTED: tuple[Accepted, ...] = (
    Accepted(KS, "container-resources: CPU limit is not set", (*DAEMONS, *JOB_PODS), R_LIMITS),
    Accepted(KS, "container-resources: Memory limit is not set", (*DAEMONS, *JOB_PODS), R_LIMITS),
    Accepted(CK, "CKV_K8S_11", (*DAEMONS, *JOB_PODS), R_LIMITS),
    Accepted(CK, "CKV_K8S_13", (*DAEMONS, *JOB_PODS), R_LIMITS),
    Accepted(KS, "container-ephemeral-storage-request-and-limit: Ephemeral Storage limit is not set",
             (*OPERATOR, *DAEMONS, *JOB_PODS),
             "no limit on purpose: the pods' scratch (/tmp, TVM build artefacts) is an emptyDir that a limit "
             "would turn into an eviction mid-run (the smoke test's is set)"),
    Accepted(KS, "container-ephemeral-storage-request-and-limit: Ephemeral Storage request is not set",
             (*OPERATOR, *DAEMONS, *JOB_PODS),
             "not yet: defaultRequests (jobs) and resources (the operator) hold cpu and memory only; adding "
             "ephemeral-storage changes the chart's defaultRequests contract"),
    Accepted(KS, "container-image-pull-policy: ImagePullPolicy is not set to Always", EVERY_POD, R_PULL),
    Accepted(CK, "CKV_K8S_15", EVERY_POD, R_PULL),
    Accepted(CK, "CKV_K8S_43", EVERY_POD,
             "images by the chart's tag (image.tag, tunerImage) or the job's spec.image, not a digest; tunerImage "
             "and spec.image take repo@sha256:... where a cluster requires digests"),
    Accepted(KS, "container-security-context-user-group-id: The container is running with a low user ID",
             (*OPERATOR, *SMOKE, *JOB_PODS), R_UID),
    Accepted(KS, "container-security-context-user-group-id: The container running with a low group ID",
             (*OPERATOR, *SMOKE, *JOB_PODS), R_UID),
    Accepted(CK, "CKV_K8S_40", (*OPERATOR, *SMOKE, *JOB_PODS), R_UID),
    Accepted(KS, "container-security-context-user-group-id: The container is running with a low user ID", DAEMONS,
             R_ROOT),
    Accepted(KS, "container-security-context-user-group-id: The container running with a low group ID", DAEMONS,
             R_ROOT),
    Accepted(CK, "CKV_K8S_40", DAEMONS, R_ROOT),
    Accepted(CK, "CKV_K8S_25", DAEMONS, R_ROOT),
    Accepted(CK, "CKV_K8S_18", (*DAEMONS, *MPS_CLIENTS),
             "MPS: clients and the MPS server exchange memory handles through the host IPC namespace's /dev/shm "
             "(modes exclusive and pool; devicePlugin and CPU jobs do without)"),
    Accepted(KS, "pod-networkpolicy: The pod does not have a matching egress NetworkPolicy", ("exclusive:Pod/tj-mps",
             *JOB_PODS),
             "the job's NetworkPolicy restricts ingress only: its pods reach the API server, S3, model URLs and "
             "the tracker, whose addresses differ per cluster"),
    Accepted(KS, "pod-networkpolicy: The pod does not have a matching NetworkPolicy", NO_POLICY,
             "the chart creates no NetworkPolicy in its own namespace: the operator serves only metrics and "
             "healthz, a pool daemon only metrics and health (MPS goes through the host pipe directory); "
             "policies for the release namespace are the cluster admin's"),
    Accepted(CK, "CKV2_K8S_6", NO_POLICY, "as kube-score's pod-networkpolicy on the same pods"),
    Accepted(KS, "deployment-replicas: Deployment few replicas", ONE_REPLICA,
             "one on purpose: kopf runs standalone (two operators would both act); the tracker is the job's "
             "in-memory registry of servers (a second would split them)"),
    Accepted(KS, "deployment-strategy: Deployment update strategy", ONE_REPLICA,
             "Recreate on purpose: never two operators, or two trackers of one job, at once"),
    Accepted(KS, "deployment-has-poddisruptionbudget: No matching PodDisruptionBudget was found", SCALED,
             "batch work that survives losing a pod (a server is replaced, its measurement retried; records are "
             "written ahead): a budget would block node drains for a whole run. The shared pool daemon has one"),
    Accepted(KS, "deployment-has-host-podantiaffinity: Deployment does not have a host podAntiAffinity set", SCALED,
             "servers share a GPU on purpose (MPS: on their daemon's node by required pod affinity); builders' "
             "spread is the scheduler's, not an availability concern for a batch job"),
    Accepted(CK, "CKV_K8S_9", ("*:Deployment/tj*-servers",),
             "no Service sends a server traffic: it registers with the job's tracker when it is ready, and the "
             "tracker hands it out; liveness is probed"),
    Accepted(CK, "CKV_K8S_9", SMOKE, "the `helm test` pod runs once to completion: no probes"),
    Accepted(CK, "CKV_K8S_8", SMOKE, "the `helm test` pod runs once to completion: no probes"),
    Accepted(CK, "CKV_K8S_38", API_CALLERS,
             "they call the API: the operator; the smoke test creates a TuningJob; MPS daemons write their GPU's UUID "
             "on their own pod, clients and merge update their own ConfigMaps (each a Role naming exactly those). "
             "Every other pod has automountServiceAccountToken: false"),
    Accepted(CK, "CKV_K8S_35", ("s3:Job/tj-clients", "s3:Job/tj-merge", "s3:Job/tj-s3-cleanup"),
             "S3 credentials as env from the job's Secret (secretKeyRef: the kubelet resolves it, the operator "
             "never reads it; the S3 client reads AWS_* variables); never inline"),
)


def _need(name: str) -> Path:
    from sharetune_dev.cluster import binaries

    path = binaries.path_of(name)
    if not path.exists():
        msg = f"{name} {binaries.binary(name).version} is not installed: {INSTALL}"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


@pytest.fixture(scope="session")
def manifests(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write(tmp_path_factory.mktemp("manifests"))


@pytest.fixture(scope="session")
def findings(manifests: dict[str, Path]) -> list[Finding]:
    """Both tools, once per session: kube-score file by file, checkov on all files at once."""
    _need("kube-score")
    _need("checkov")
    return lint(manifests)


def _matches(a: Accepted, f: Finding, glob: str | None = None) -> bool:
    return (a.tool, a.check) == (f.tool, f.check) and any(fnmatchcase(f.where, g)
                                                          for g in ([glob] if glob else a.where))


def test_the_dump_has_every_mode_and_object(manifests: dict[str, Path]) -> None:
    """What the linters see: every mode, with the objects that make it that mode."""
    def objs(mode: str) -> set[str]:
        return {f"{d['kind']}/{d['metadata']['name']}" for d in yaml.safe_load_all(manifests[mode].read_text()) if d}

    assert set(manifests) == {"chart", "exclusive", "pool", "device-plugin", "cpu", "cpu-builders", "s3"}
    assert {"Deployment/sharetune-operator", "Pod/sharetune-smoke-test",
            "CustomResourceDefinition/tuningjobs.sharetune.io",
            "PriorityClass/sharetune-operator-sharetune-system-mps-daemon"} <= objs("chart")
    assert {"Pod/tj-mps", "Deployment/tj-servers", "Deployment/tj-nomps-servers", "Job/tj-merge"} <= objs("exclusive")
    assert {"Pod/pool-gpu-node-0-gpu0", "PodDisruptionBudget/pool-gpu-node-0-gpu0", "Deployment/tj-servers",
            "NetworkPolicy/tj-network", "Job/tj-clients", "Job/tj-merge"} <= objs("pool")
    assert not {o for o in objs("device-plugin") | objs("cpu") if o.startswith("Pod/")}
    assert {"Secret/tj-build-key", "Deployment/tj-builders", "Service/tj-builders",
            "HorizontalPodAutoscaler/tj-builders"} <= objs("cpu-builders")
    assert "Job/tj-s3-cleanup" in objs("s3")


def test_no_finding_outside_the_accepted_list(findings: list[Finding]) -> None:
    new = [f for f in findings if not any(_matches(a, f) for a in ACCEPTED)]
    assert not new, ("findings not in ACCEPTED: fix them, or accept them with a reason here and in "
                     "docs/security.md:\n" + "\n".join(map(str, new)))


def test_every_accepted_finding_still_occurs(findings: list[Finding]) -> None:
    gone = [f"{a.tool} {a.check} @ {g}" for a in ACCEPTED for g in a.where
            if not any(_matches(a, f, g) for f in findings)]
    assert not gone, "accepted findings that no longer occur: remove them from ACCEPTED and docs/security.md:\n" + \
        "\n".join(gone)


def test_the_docs_list_every_accepted_check() -> None:
    text = (ROOT / "docs" / "security.md").read_text()
    m = re.search(r"^## Accepted findings\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, "docs/security.md has no '## Accepted findings' section"
    missing = sorted({a.check.split(":")[0] for a in ACCEPTED} - set(re.findall(r"`([\w-]+)`", m.group(1))))
    assert not missing, f"docs/security.md's Accepted findings table lacks {missing}"
