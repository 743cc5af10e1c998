#!/bin/bash
# CPU A/B: a shard's tasks tuned one after the other (the client before ea3c37c) vs
# together (round-robin, capped_search.py), whole ResNet-18 on llvm, the real-budget harness's
# sharetune arm with a budget no arm exhausts (20,000, no per-task cap), equal windows back to
# back on this machine, then each arm's whole-model latency at checkpoints (real_budget.py
# evaluate). Appends one line per seed to bench/results/cpu-task-order.jsonl.
#   bash bench/task_order.sh SEED [old-first|new-first]     (~15 min on 2 cores)
# The client before is a git worktree of OLD_COMMIT, kept for the next seed: `git worktree remove
# --force /tmp/sharetune-task-order/old-tree` when done.
set -euo pipefail
SEED=${1:-0}; ORDER=${2:-old-first}; WINDOW=${WINDOW:-300}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OLD_COMMIT=${OLD_COMMIT:-d51d136}  # the last commit with tasks one after the other
PY=$ROOT/.venv/bin/python
WORK=${TASK_ORDER_WORK:-/tmp/sharetune-task-order}/s$SEED
OLD_TREE=${TASK_ORDER_WORK:-/tmp/sharetune-task-order}/old-tree
rm -rf "$WORK"; mkdir -p "$WORK"
[ -d "$OLD_TREE" ] || git -C "$ROOT" worktree add -f "$OLD_TREE" "$OLD_COMMIT" -q
ARGS=(--network resnet18 --arm sharetune --seed "$SEED" --target llvm --window-s "$WINDOW"
      --clients 2 --servers 2 --pct 100 --per-iter 8 --per-task 20000)
sides=(old new); [ "$ORDER" = new-first ] && sides=(new old)
for side in "${sides[@]}"; do
  tree=$ROOT; [ "$side" = old ] && tree=$OLD_TREE
  echo "[$(date +%T)] seed $SEED: tune ($side)"
  (cd "$tree/bench/h200" && BENCH_RUN_ROOT=$WORK/$side PYTHONPATH=$tree/operator:$tree/tuner-image \
     "$PY" real_budget.py tune "${ARGS[@]}") > "$WORK/$side-tune.log" 2>&1
done
for side in old new; do  # evaluated by today's harness, so both sides compile and measure alike
  echo "[$(date +%T)] seed $SEED: evaluate ($side)"
  (cd "$ROOT/bench/h200" && BENCH_RUN_ROOT=$WORK/$side PYTHONPATH=$ROOT/operator:$ROOT/tuner-image \
     "$PY" real_budget.py evaluate --network resnet18 --seed "$SEED" --target llvm \
     --checkpoints 60,120,180,240,300 --compile-timeout-s 1500 --measure-timeout-s 900) > "$WORK/$side-eval.log" 2>&1
done
"$PY" - "$WORK" "$SEED" "$ORDER" "$ROOT/bench/results/cpu-task-order.jsonl" "$OLD_COMMIT" <<'PY'
import json, sys
work, seed, order, out, old_commit = sys.argv[1:]
row = {"seed": int(seed), "order": order, "old_commit": old_commit, "network": "resnet18", "target": "llvm"}
for side in ("old", "new"):
    arm = [json.loads(l) for l in open(f"{work}/{side}/results/h200-real-budget-arms.jsonl")][-1]
    ev = [json.loads(l) for l in open(f"{work}/{side}/results/h200-real-budget-eval.jsonl")][-1]
    curve = ev["arms"]["sharetune"]["curve"]
    row[side] = {"trials": arm["trials"], "trials_per_s": arm["trials_per_s"], "untuned_ms": ev["untuned_ms"],
                 "curve": [[p["t"], p["best_records"], p["median_ms"]] for p in curve],
                 "final_ms": curve[-1]["median_ms"], "tasks_with_records": curve[-1]["best_records"]}
row["final_latency_new_over_old"] = round(row["new"]["final_ms"] / row["old"]["final_ms"], 4)
row["trials_new_over_old"] = round(row["new"]["trials"] / row["old"]["trials"], 3)
with open(out, "a") as f:
    f.write(json.dumps(row) + "\n")
print(json.dumps({k: v for k, v in row.items() if k not in ("old", "new")}),
      {s: (row[s]["trials"], row[s]["tasks_with_records"], row[s]["final_ms"]) for s in ("old", "new")})
PY
