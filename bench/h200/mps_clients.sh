#!/usr/bin/env bash
# Samples, once a second, how many processes each MPS server of a local pool serves (the MPS
# server takes at most 48; a pool of several jobs can reach that limit). Runs until killed; start
# it in the background beside a pool run:  bash bench/h200/mps_clients.sh > clients.log &
# The pool's pipe directory appears once the first job starts its daemon; until then a line
# says "clients=" with nothing after it.
set -u
root=${BENCH_ROOT:-/tmp/sharetune-bench}
while :; do
  pipe=$(ls -d "$root"/multi-job/*/runs/.pool/gpu-*/pipe 2>/dev/null | head -1)
  line=""
  if [ -n "$pipe" ]; then
    for pid in $(echo get_server_list | CUDA_MPS_PIPE_DIRECTORY="$pipe" timeout 5 nvidia-cuda-mps-control 2>/dev/null); do
      n=$(echo "get_client_list $pid" | CUDA_MPS_PIPE_DIRECTORY="$pipe" timeout 5 nvidia-cuda-mps-control 2>/dev/null | wc -l)
      line="$line server=$pid clients=$n"
    done
  fi
  echo "$(date +%T)${line:- clients=}"
  sleep 1
done
