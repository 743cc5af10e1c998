"""Prometheus metrics of the tuner processes (one registry per process, scraped at /metrics).

The TuningJob's name is the ``tuning_job`` label: Prometheus owns ``job`` (the scrape job)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

TRIALS = Counter("sharetune_trials", "Measured tuning trials by outcome",
                 ["tuning_job", "shard", "task", "status"])
PHASE_SECONDS = Counter("sharetune_phase_seconds", "Wall seconds spent per tuning phase",
                        ["tuning_job", "shard", "phase"])
BEST_LATENCY = Gauge("sharetune_best_latency_seconds", "Best measured latency of a task so far",
                     ["tuning_job", "shard", "task"])
SHARD_DONE = Gauge("sharetune_shard_trials_done", "Trials done by this shard (resumed ones included)",
                   ["tuning_job", "shard"])
SHARD_BUDGET = Gauge("sharetune_shard_trials_budget", "Trials this shard owes in total", ["tuning_job", "shard"])
SERVERS_REGISTERED = Gauge("sharetune_rpc_servers_registered", "RPC servers registered at the tracker",
                           ["key"])
SERVER_REGISTERED = Gauge("sharetune_rpc_server_registered", "1 while this server is registered",
                          ["key", "server"])
SERVER_RESTARTS = Counter("sharetune_rpc_server_restarts", "Times this server re-registered", ["key", "server"])
THREAD_PERCENTAGE = Gauge("sharetune_mps_thread_percentage", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE applied",
                          ["key", "server"])
GPU_UTIL = Gauge("sharetune_gpu_utilization_percent", "GPU utilisation (NVML)", ["gpu", "server"])
GPU_MEM = Gauge("sharetune_gpu_memory_used_bytes", "GPU memory in use (NVML)", ["gpu", "server"])
BUILDS = Counter("sharetune_builds", "Candidate builds done by the host's build service, by outcome", ["status"])
BUILDS_IN_FLIGHT = Gauge("sharetune_builds_in_flight", "Candidates queued or building in the build service")
WRITE_AHEAD_SECONDS = Histogram("sharetune_write_ahead_seconds",
                                "Time a measured batch waited to be stored before its commit, by outcome",
                                ["tuning_job", "shard", "outcome"],
                                buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30))
# The tuning library (search/warm_start.py): records a shard started from (use: "seed", measured first in
# its tasks' first rounds; "transfer", other workloads' schedules measured there; "pretrain", learnt by
# its cost model), and tasks it did not tune again.
LIBRARY_RECORDS = Counter("sharetune_library_records", "Tuning-library records a shard started from, by use",
                          ["tuning_job", "shard", "use"])
LIBRARY_TASKS_REUSED = Gauge("sharetune_library_tasks_reused", "Tasks not tuned again: the tuning library holds them",
                             ["tuning_job", "shard"])
PEER_RECORDS = Counter("sharetune_peer_records", "Records of the job's other shards a shard's cost model learnt from",
                       ["tuning_job", "shard"])
MPS_UP = Gauge("sharetune_mps_daemon_up", "1 while the MPS control daemon answers", ["pipe_dir"])

TRIAL_STATUSES = ("ok", "build_error", "run_error")
