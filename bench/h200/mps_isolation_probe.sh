#!/usr/bin/env bash
# The GPU-side facts the pod security of a job's MPS daemon and servers rests on, probed on a GPU
# machine as root (no Kubernetes: the container's limits reproduced with setpriv):
#   1. a control daemon running as root with the daemon container's capabilities only (bounding
#      set CHOWN, DAC_OVERRIDE, FOWNER; no SETUID/SETGID; no_new_privs) serving a client of uid
#      1000 / gid 1000 (the tuner pods' runAsUser/runAsGroup);
#   2. the same daemon run as uid 1000 itself (no root at all);
#   3. a client pinned with CUDA_VISIBLE_DEVICES=<the GPU's UUID> (what servers get instead of
#      "all"), and one pinned to a UUID that is not there;
#   4. a client whose pipe directory has no daemon: does CUDA run outside MPS without a word?
# Each case prints one line "case <n> <name>: <outcome>" and writes $OUT/mps-isolation-probe.txt.
set -u
out=${OUT:-/tmp}/mps-isolation-probe.txt
work=$(mktemp -d /tmp/mps-probe.XXXX)
chmod 0755 "$work"
cat > "$work/probe.cu" <<'EOF'
#include <cstdio>
#include <cuda_runtime.h>
__global__ void add1(int *x) { x[threadIdx.x] += 1; }
int main() {
  int n = -1; cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) { printf("devices=error(%s)\n", cudaGetErrorString(e)); return 2; }
  cudaDeviceProp p; cudaGetDeviceProperties(&p, 0);
  int *d; e = cudaMalloc(&d, 32 * sizeof(int));
  if (e != cudaSuccess) { printf("devices=%d malloc=error(%s)\n", n, cudaGetErrorString(e)); return 3; }
  cudaMemset(d, 0, 32 * sizeof(int)); add1<<<1, 32>>>(d); int h[32];
  e = cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
  printf("devices=%d sms=%d kernel=%s result=%d\n", n, p.multiProcessorCount,
         e == cudaSuccess ? "ok" : cudaGetErrorString(e), h[5]);
  return e == cudaSuccess && h[5] == 1 ? 0 : 4;
}
EOF
nvcc -o "$work/probe" "$work/probe.cu" 2>&1 | tail -3
chmod 0755 "$work/probe"
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -1)
echo "gpu $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1) uuid $uuid" | tee "$out"

as_tuner() {  # a process as the tuner pods run: uid/gid 1000, no capabilities, no_new_privs
  setpriv --reuid=1000 --regid=1000 --clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs -- "$@"
}
as_daemon() {  # root, only the daemon container's capabilities
  setpriv --inh-caps=-all --bounding-set=-all,+chown,+dac_override,+fowner --no-new-privs -- "$@"
}
server_users() { ps -C nvidia-cuda-mps-server -o user= 2>/dev/null | sort -u | tr '\n' ' '; }

run_case() {  # <n> <name> <daemon runner or "none"> <client env...>
  local n=$1 name=$2 runner=$3; shift 3
  local pipe=$work/pipe-$n log=$work/log-$n
  mkdir -p "$pipe" "$log"; chmod 0777 "$pipe" "$log"
  if [ "$runner" != none ]; then
    CUDA_MPS_PIPE_DIRECTORY=$pipe CUDA_MPS_LOG_DIRECTORY=$log $runner nvidia-cuda-mps-control -d
    sleep 1
  fi
  local res rc
  res=$(env CUDA_MPS_PIPE_DIRECTORY=$pipe CUDA_MPS_LOG_DIRECTORY=$log "$@" timeout 30 \
        setpriv --reuid=1000 --regid=1000 --clear-groups --inh-caps=-all --bounding-set=-all --no-new-privs \
        -- "$work/probe" 2>&1); rc=$?
  local servers; servers=$(server_users)
  local list=""
  [ "$runner" != none ] && list=$(echo get_server_list | CUDA_MPS_PIPE_DIRECTORY=$pipe $runner nvidia-cuda-mps-control 2>&1 | tr '\n' ' ')
  echo "case $n $name: rc=$rc $res | mps servers as: ${servers:-none} | server list: ${list:-n/a}" | tee -a "$out"
  tail -n 3 "$log/control.log" 2>/dev/null | sed "s/^/  case $n control.log: /" | tee -a "$out"
  if [ "$runner" != none ]; then
    echo quit | CUDA_MPS_PIPE_DIRECTORY=$pipe $runner nvidia-cuda-mps-control >/dev/null 2>&1
    sleep 2
  fi
}

run_case 1 "root daemon without SETUID/SETGID, client uid 1000" as_daemon
run_case 2 "daemon as uid 1000, client uid 1000" as_tuner
run_case 3 "daemon as uid 1000, client pinned to the GPU's UUID" as_tuner CUDA_VISIBLE_DEVICES="$uuid"
run_case 4 "daemon as uid 1000, client pinned to an absent UUID" as_tuner \
  CUDA_VISIBLE_DEVICES=GPU-00000000-0000-0000-0000-000000000000
run_case 5 "pipe directory without a daemon" none
echo "wrote $out"
rm -rf "$work"
