#!/usr/bin/env bash
# Build-pool scaling on the H200: the headline topology (ResNet-18, 6 heaviest tasks, 6 clients, 6 servers
# at 50% under MPS) with its builds in the clients vs in build services over TCP pinned to cores of
# their own (as builder pods on CPU nodes would be). Resumable: tune_cell.py skips cells already in
# h200-cells.jsonl. Arms of one round run back to back on one machine.
#   bash bench/h200/builder_scaling.sh r12 [CELL...]     (default: every cell, in the plan's order)
set -uo pipefail
round=${1:?round}; shift
common=(--mode sharetune --model resnet18 --tasks 6 --trials 24 --per-iter 12 --clients 6 --servers 6 --pct 50
        --round "$round")
cell() {  # id, args...
  local id=$1; shift
  python3 bench/h200/tune_cell.py --id "bp-$id-$round" "${common[@]}" "$@" || echo "cell $id failed: rc=$?"
}
plan=(inclient-c8 pods2-c8b8 pods1-c8b4 pods3-c4b12 pods2-c8b8-rep inclient-c8-rep)
[ $# -gt 0 ] && plan=("$@")
# BUDGET_S: the seconds this call may use; a cell (~2-3 min) starts only if it fits.
budget=${BUDGET_S:-100000}
for c in "${plan[@]}"; do
  if [ $((SECONDS + ${CELL_S:-170})) -gt "$budget" ]; then echo "budget: $c not started"; continue; fi
  case $c in
    inclient-c8|inclient-c8-rep) cell "$c" --cores 0-7 --builder-workers 3 ;;     # 2 x 8 cores / 6 clients
    pods2-c8b8|pods2-c8b8-rep)   cell "$c" --cores 0-7 --builder-pods 2 --builder-cores 8-15 ;;
    pods1-c8b4)                  cell "$c" --cores 0-7 --builder-pods 1 --builder-cores 8-11 ;;
    pods3-c4b12)                 cell "$c" --cores 0-3 --builder-pods 3 --builder-cores 4-15 ;;
    inclient-c16)                cell "$c" --builder-workers 6 ;;                  # the whole machine, r4 style
    # cold search: the headline cell (16 trials per task, one round per shard) with stock-sized
    # evolutionary search vs the lite population while the cost model is cold; seeds 0 and 1
    evo-s[0-9]|lite-s[0-9]|short-s[0-9])
      search=${c%-s*}; seed=${c#*-s}; [ "$search" = evo ] && search=evolutionary
      BENCH_COLD_SEARCH=$search python3 bench/h200/tune_cell.py --id "search-$c-$round" --mode sharetune \
        --model resnet18 --tasks 6 --trials 16 --per-iter 16 --clients 6 --servers 6 --pct 50 --seed "$seed" \
        --round "$round" || echo "cell $c failed: rc=$?" ;;
    *) echo "unknown cell $c" ;;
  esac
done
