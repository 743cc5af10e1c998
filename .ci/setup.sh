#!/usr/bin/env bash
# Installs everything sharetune needs, idempotently: the Python environment (.venv) and the pinned
# Kubernetes binaries built from source (cached in ~/.cache/sharetune/bin, keyed by version).
set -euo pipefail
cd "$(dirname "$0")/.."

need() { command -v "$1" >/dev/null 2>&1; }
# Debian packages: only what this kind of machine may lack. Go must be >= 1.25 (Kubernetes 1.35):
# Debian's golang is older, so we take the machine's Go (or GOTOOLCHAIN from the module proxy).
missing=()
need git || missing+=(git)
need curl || missing+=(curl)
python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
need prometheus || missing+=(prometheus)  # a real Prometheus (and promtool) for the monitoring tests
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
if ! need go; then
  echo "[setup] Go is required (>= 1.25) to build the pinned Kubernetes binaries" >&2
  exit 1
fi
python3 -c 'import sys; assert sys.version_info >= (3, 11), sys.version' || { echo "Python >= 3.11 required" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  python3 -m venv .venv
fi
stamp=.venv/.sharetune-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ devtools/pyproject.toml -nt "$stamp" ]; then
  # The product with its extras and the developer tooling (devtools/, sharetune-dev), resolved together.
  echo "[setup] pip install -e .[operator,tuner,bench] -e ./devtools"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[operator,tuner,bench]' -e ./devtools
  touch "$stamp"
fi
echo "[setup] pinned binaries (built from source on first use, then cached)"
.venv/bin/python -m sharetune_dev.cluster.binaries
