# Sourced by .ci/install-quick and .ci/setup.sh (never run alone): quiet, idempotent install steps.
# Each step prints one line ("[1/2] creating .venv ... 2 s"); everything the tools say goes to
# $INSTALL_LOG, whose path and tail are shown when a step fails.

INSTALL_STEP=0

install_begin() {  # install_begin LOGNAME STEPS: a fresh log under build/install/ (git-ignored)
  mkdir -p build/install
  INSTALL_LOG="$PWD/build/install/$1.log"
  INSTALL_STEPS=$2
  : >"$INSTALL_LOG"
}

install_fail() {  # install_fail RC: the log's path and tail, then exit RC
  echo "  details: $INSTALL_LOG (last 25 lines):" >&2
  tail -n 25 "$INSTALL_LOG" | sed 's/^/  | /' >&2
  exit "$1"
}

# step LABEL CMD...: runs CMD with its output in the log. CMD may be a shell function: functions
# chain their commands with && (set -e does not apply inside a command tested by ||).
step() {
  local label=$1 t0=$SECONDS rc=0
  shift
  INSTALL_STEP=$((INSTALL_STEP + 1))
  printf '[%d/%d] %s ... ' "$INSTALL_STEP" "$INSTALL_STEPS" "$label"
  printf '\n== %s [%d/%d] %s: %s\n' "$(date -Is)" "$INSTALL_STEP" "$INSTALL_STEPS" "$label" "$*" >>"$INSTALL_LOG"
  "$@" >>"$INSTALL_LOG" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "failed (exit $rc after $((SECONDS - t0)) s)"
    install_fail "$rc"
  fi
  echo "$((SECONDS - t0)) s"
}

skip() {  # skip LABEL WHY: a step with nothing to do
  INSTALL_STEP=$((INSTALL_STEP + 1))
  printf '[%d/%d] %s ... %s\n' "$INSTALL_STEP" "$INSTALL_STEPS" "$1" "$2"
}

need_python() {
  python3 -c 'import sys; assert sys.version_info >= (3, 11), sys.version' 2>/dev/null || {
    echo "Python >= 3.11 is required as python3 (found: $(python3 --version 2>&1))" >&2
    exit 1
  }
}

venv_step() {
  if [ -x .venv/bin/python ]; then
    skip "creating .venv" "exists"
  else
    step "creating .venv" python3 -m venv .venv
  fi
}

# The stamps say what .venv holds; the full install (setup.sh) includes the quick one. A newer
# pyproject.toml makes them stale.
STAMP_QUICK=.venv/.sharetune-quick-installed
STAMP_FULL=.venv/.sharetune-installed

stamp_fresh() {  # stamp_fresh STAMP PYPROJECT...
  local stamp=$1 p
  shift
  [ -f "$stamp" ] || return 1
  for p in "$@"; do [ "$p" -nt "$stamp" ] && return 1; done
  return 0
}

pip_install() {  # pip_install ARGS...: pip's own chatter (progress, version nag) off, the rest logged
  .venv/bin/python -m pip install --disable-pip-version-check --progress-bar off "$@"
}
