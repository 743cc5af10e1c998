#!/usr/bin/env bash
# The test command's installer (.ci/run = CI), idempotent: system packages the tests use
# (Prometheus), .venv with sharetune, all its extras and the developer tooling (devtools/), and the
# pinned Kubernetes binaries built from source with Go (cached in ~/.cache/sharetune/bin, keyed by
# version). Quiet: one line per step, the details in build/install/setup.log.
set -euo pipefail
cd "$(dirname "$0")/.."
. .ci/install-common.sh

need() { command -v "$1" >/dev/null 2>&1; }
# Debian packages: only what this kind of machine may lack. Go must be >= 1.25 (Kubernetes 1.35):
# Debian's golang is older, so we take the machine's Go (or GOTOOLCHAIN from the module proxy).
missing=()
need git || missing+=(git)
need curl || missing+=(curl)
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
need prometheus || missing+=(prometheus)  # a real Prometheus (and promtool) for the monitoring tests
if ! need go; then
  echo "Go (>= 1.25) is required on the PATH to build the pinned Kubernetes binaries" >&2
  exit 1
fi
need_python

install_begin setup 4
if [ ${#missing[@]} -gt 0 ]; then
  apt_install() {
    DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
  }
  step "apt-get install ${missing[*]}" apt_install
else
  skip "system packages (git, curl, python3-venv, prometheus)" "present"
fi
venv_step
label="installing sharetune[operator,tuner,bench] and devtools"
if stamp_fresh "$STAMP_FULL" pyproject.toml devtools/pyproject.toml; then
  skip "$label" "up to date"
else
  # The product with its extras and the developer tooling (devtools/, sharetune-dev), resolved together.
  full_pip() {
    pip_install --upgrade pip && pip_install -e '.[operator,tuner,bench]' -e ./devtools && touch "$STAMP_FULL"
  }
  step "$label" full_pip
fi
# Also the chart's linters (kube-score, built with Go; checkov, pip into a venv of its own):
# tests/helm/test_linters.py.
step "pinned Kubernetes binaries and linters (built with Go on first use: ~10 min; then cached)" \
  .venv/bin/python -m sharetune_dev.cluster.binaries
