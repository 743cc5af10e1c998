#!/usr/bin/env bash
# One device call of the multi-job benchmark, resumable across machines: restores the result
# records of earlier calls (bench/results/h200-multi-job-runs.tar.gz, carried), runs the stages
# given as arguments (each "tune:solo:JOB", "tune:pool" or "evaluate"), then leaves the records
# of every run so far in $OUT/h200-multi-job-runs.tar.gz for the next call.
set -u
source .device/tvm-b/install.sh >/dev/null 2>&1
export PYTHONPATH=$NOTORCH_PYTHONPATH:$PWD/operator:$PWD/tuner-image:$PWD/bench/h200
python3 -m sharetune_tuner.model.intrinsics >/dev/null 2>&1
root=${BENCH_ROOT:-/tmp/sharetune-bench}
seed=${SEED:-0}  # a second run of the comparison: SEED=1
mkdir -p "$root"
[ -f bench/results/h200-multi-job-runs.tar.gz ] && tar xzf bench/results/h200-multi-job-runs.tar.gz -C "$root"
for stage in "$@"; do
  IFS=: read -r what arm job <<<"$stage"
  left=$((585 - SECONDS))
  if [ "$what" = tune ]; then
    python3 bench/h200/multi_job.py tune --arm "$arm" ${job:+--job "$job"} --seed "$seed" --timeout-s $((left - 20)) 2>&1 | tail -3
  else
    python3 bench/h200/multi_job.py evaluate --seed "$seed" 2>&1 | tail -5
  fi
done
(cd "$root" && tar czf "$OUT/h200-multi-job-runs.tar.gz" \
  $(ls -d multi-job/*/runs/*/result/records multi-job/*/runs/*/result/best multi-job/*/runs/*/result/summary.json multi-job/*/runs/*/shards/*/progress.json 2>/dev/null))
ls -la "$OUT"
