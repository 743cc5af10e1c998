"""A tuning client: tunes one shard of a model's tasks through the RPC tracker.

Every client extracts the model's tasks and computes the same partition and per-task budgets,
so shards never talk to each other. Records go to the shard's JSONDatabase as they are measured
(append-only), and a restarted client counts what its database already holds and tunes only the
remaining trials of each task: no trial is redone.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sharetune.api.progress import Progress, TaskProgress
from sharetune.api.spec import useful_minimum
from sharetune.api.topology import PROGRESS_FILE

from . import metrics
from .build.builder import PooledBuilder
from .build.cpus import cost_model_threads, default_builder_workers
from .errors import TrackerError, TunerError
from .measure import window as measure_window
from .measure.callbacks import CommitBatch, CostModelUpdate, PhaseExport, ProgressCallback, StoreBatch, WriteAhead
from .model.intrinsics import ensure_registered
from .model.tasks import Task, extract
from .search.capped_search import CappedSearch, Measured
from .search.partition import budgets, partition, to_tune, useful_shards
from .search.peer_records import Fetch, LearnFromPeers, PeerRecords
from .search.warm_start import SEEDS_PER_TASK, LibraryUse, Lookup, library_lookup, pretrain, reused_budgets
from .store import records
from .store.write_ahead import RecordLines, StoreAhead

log = logging.getLogger("sharetune.client")
PROGRESS = PROGRESS_FILE
MEASURE_LOG = "measure-windows.jsonl"  # one line per measurement: co-tenants, window wait


EVOLUTION_ENV = "SHARETUNE_EVOLUTION"


# Stock EvolutionarySearch draws at least 50 random schedules into a population of 512 (~10%).
STOCK_FRESH_PCT = 10


@dataclass(frozen=True)
class Evolution:
    """Evolutionary search sized to the batch (:func:`search_strategy`): ``population_per_candidate``
    x the batch (64..512), ``generations`` of mutation, and at least ``fresh_pct`` % of the initial
    population drawn at random from the design space (TVM's ``init_min_unmeasured``; the rest are the
    task's best measured schedules). A round's CPU grows with all three, and a sharetune host is
    CPU-bound (the GPU measures faster than the clients search), so the default is half stock
    MetaSchedule's ratio (8 per candidate, 512 for 64) at its generations (4): on a whole
    MobileNet-V2 on the GPU it measured 1.6x the trials of 8x4 in one window and a faster model at
    every checkpoint (docs/benchmarks.md, "Search shape"). The random share is stock's: TVM draws
    population-sized passes until it has that many valid schedules, and random CUDA schedules mostly
    fail VerifyGPUCode (ResNet-50's convolutions: ~2.5 valid of 52 draws), so half the population
    (32 of 64) took 9-13 passes, 5-7 s of a client's 12-18-s search round on an H100."""

    population_per_candidate: int = 4
    generations: int = 4
    fresh_pct: int = STOCK_FRESH_PCT

    def __str__(self) -> str:
        shape = f"{self.population_per_candidate}x{self.generations}"
        return shape if self.fresh_pct == STOCK_FRESH_PCT else f"{shape}f{self.fresh_pct}"

    def population(self, batch: int) -> int:
        return max(64, min(512, self.population_per_candidate * batch))

    def fresh(self, population: int) -> int:
        """The random schedules a round's initial population draws at least."""
        return max(1, math.ceil(population * self.fresh_pct / 100))


def parse_evolution(text: str) -> Evolution:
    """``PxG`` or ``PxGfN`` (SHARETUNE_EVOLUTION), e.g. ``4x4`` or ``4x4f50`` (N: the random share
    of the initial population in %, default stock's 10); empty: the defaults. Anything else is a
    usage error naming the variable and the form, not a silent fallback."""
    if not text.strip():
        return Evolution()
    m = re.fullmatch(r"(\d+)x(\d+)(?:f(\d+))?", text.strip().lower())
    ok = m is not None and 1 <= int(m[1]) <= 64 and 1 <= int(m[2]) <= 16 and (m[3] is None or 1 <= int(m[3]) <= 100)
    if m is None or not ok:
        raise TunerError(f"{EVOLUTION_ENV}={text!r} is not PxG[fN]: population per candidate 1-64 x generations "
                         "1-16, optionally the random share of the initial population in % (1-100), "
                         "e.g. 4x4 (the default) or 4x4f50")
    return Evolution(int(m[1]), int(m[2]), STOCK_FRESH_PCT if m[3] is None else int(m[3]))


@dataclass
class ClientConfig:
    job: str
    shard: int
    shards: int
    work_dir: Path  # this shard's database directory
    tracker_host: str
    tracker_port: int
    tracker_key: str
    servers: int  # runner workers: the servers this client may use at once
    total_trials: int
    trials_per_task: int
    trials_per_iter: int = 8
    cost_model: str = "xgb"
    library: LibraryUse | None = None  # spec.library: warm or reuse (search/warm_start.py)
    seed: int = 0
    builder_workers: int | None = None  # None: cpus.default_builder_workers(clients_on_host)
    clients_on_host: int = 1  # clients sharing this host's CPUs (local mode: every job's shards)
    build_service: Path | None = None  # the host's shared builder pool (build/service.py), if any
    population_size: int | None = None  # evolutionary search; None = sized to the batch (evolution)
    # The evolutionary search's shape after a task's first round (SHARETUNE_EVOLUTION, "PxG"):
    # P candidates of population per candidate of the batch, G generations of mutation.
    evolution: Evolution = field(default_factory=lambda: parse_evolution(os.environ.get(EVOLUTION_ENV) or ""))
    # The search of a task's first round while the cost model cannot rank candidates yet
    # (first_round_search): one of COLD_SEARCHES or "evolutionary" (stock throughout).
    cold_search: str = field(default_factory=lambda: os.environ.get("SHARETUNE_COLD_SEARCH", DEFAULT_COLD_SEARCH))
    session_timeout_s: int = 60
    tracker_wait_s: float = 60.0
    # One RPC session per runner worker, kept for the whole shard (runner.SessionRPCRunner), and
    # candidates linked by the builder. Needs `servers` <= this client's share of the servers.
    session_runner: bool = False
    # Starts storing the shard with a measured batch's record lines before they are committed to
    # the local database (write_ahead.py: a killed pod then loses nothing its database held).
    # None: stock AddToDatabase (local mode, no store).
    store_ahead: StoreAhead | None = field(default=None, compare=False, repr=False)
    # Called after each search round, once its progress is written (the sync uploads it right
    # away instead of waiting for its next tick: the job's status follows the rounds).
    on_round: Callable[[], None] | None = field(default=None, compare=False, repr=False)
    process_started_at: float | None = None  # time.time() when the process began (start-up report)
    # Where the job's other shards' records are (search/peer_records.py: the job's store, or the
    # shards' directories in local mode); None: this shard's cost model learns only its own.
    peers: Fetch | None = field(default=None, compare=False, repr=False)


def wait_for_tracker(host: str, port: int, key: str, timeout_s: float) -> int:
    """Blocks until at least one server is registered under ``key``; returns how many."""
    from tvm import rpc

    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            summary = rpc.connect_tracker(host, port).summary()
            n = sum(q.get("free", 0) + q.get("pending", 0) for k, q in summary.get("queue_info", {}).items()
                    if k == key)
            n = max(n, sum(1 for s in summary.get("server_info", []) if s.get("key", "").split(":")[-1] == key))
            if n > 0:
                return n
            last = f"tracker up, no server registered under key {key!r}"
        except Exception as e:  # connection refused, timeouts, ...
            last = f"{type(e).__name__}: {e}"
        time.sleep(0.25)  # servers register within a second or two of the tracker: do not oversleep
    raise TrackerError(f"no RPC server reachable through tracker {host}:{port} key {key!r} "
                       f"after {timeout_s:.0f}s ({last})")


class TrackerWait:
    """``wait_for_tracker`` in a background thread, started before the client's own start-up work
    (extraction, intrinsics) so that the servers' start overlaps it; ``result()`` joins it and
    re-raises its ``TrackerError``. A daemon thread: a client with nothing to do exits at once."""

    def __init__(self, host: str, port: int, key: str, timeout_s: float) -> None:
        self._servers: int | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(host, port, key, timeout_s),
                                        name="tracker-wait", daemon=True)
        self._thread.start()

    def _run(self, host: str, port: int, key: str, timeout_s: float) -> None:
        try:
            self._servers = wait_for_tracker(host, port, key, timeout_s)
        except BaseException as e:  # handed to the main thread by result()
            self._error = e

    def result(self) -> int:
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._servers is not None
        return self._servers


@dataclass(frozen=True)
class ShardPlan:
    tasks: list[Task]  # this shard's tasks, each with trials
    budget: dict[str, int]  # their trials, by TaskInfo.key
    useful_shards: int  # shards with a task to tune: 0..useful_shards-1 (partition.useful_shards)
    tasks_total: int  # the model's tasks
    tasks_to_tune: int  # those the budgets give trials


def plan_shard(tasks: list[Task], cfg: ClientConfig) -> ShardPlan:
    infos = [t.info for t in tasks]
    # Tasks too light for a useful minimum of trials get none: they keep TVM's defaults and go
    # to no shard.
    budget = budgets(infos, cfg.total_trials, cfg.trials_per_task,
                     useful_minimum(cfg.trials_per_task, cfg.trials_per_iter))
    tuned = to_tune(infos, budget)
    bins = partition(tuned, cfg.shards)
    mine = {i.key for i in bins[cfg.shard]}
    return ShardPlan([t for t in tasks if t.info.key in mine], {k: v for k, v in budget.items() if k in mine},
                     useful_shards(bins), len(infos), len(tuned))


# The search of a task's first round while the cost model cannot rank (SHARETUNE_COLD_SEARCH;
# first_round_search); "evolutionary" keeps stock evolutionary search sized to the batch throughout.
#   replay: the batch sampled at random from the design space (ReplayTrace), the default;
#   lite:   evolutionary search with the same number of generations but a population of 2x the batch
#           instead of 8x;
#   short:  the stock population with one generation of mutation instead of four.
COLD_SEARCHES = ("replay", "lite", "short")
SEARCHES = ("evolutionary", *COLD_SEARCHES)
# Measured with bench/h200/search_quality.py (every candidate of a first round timed alone, against
# the evolutionary search's): CUDA (H200, ResNet-18's 6 heaviest tasks, 55 rounds of 16;
# bench/results/h200-search-quality.json): a round's best 0.94x (95% interval 0.84-1.03), expected
# best of 16 from the pooled candidates 0.99x (0.92-1.06), for 0.15x the search CPU; llvm (tiny CNN,
# 48 rounds; cpu-search-quality.json): 0.99x (0.94-1.04) and 0.99x (0.95-1.02) for 0.03x.
DEFAULT_COLD_SEARCH = "replay"
LITE_POPULATION_PER_CANDIDATE = 2
# ReplayTrace gives a batch slot up after this many invalid samples in a row (stock: 100). With 100,
# 13 of 192 slots of ResNet-18's heaviest conv on CUDA stayed empty (lost trials: the budget counts
# slots); 400 filled all 192 for 7% more search CPU (12 seeds).
REPLAY_MAX_FAIL_COUNT = 400


def check_cold_search(choice: str) -> str:
    """``choice`` (SHARETUNE_COLD_SEARCH) if it names a search; otherwise a usage error naming the
    variable and the choices, not a silent fallback."""
    if choice not in SEARCHES:
        raise TunerError(f"SHARETUNE_COLD_SEARCH={choice!r} is not a search: use one of {', '.join(SEARCHES)}")
    return choice


def model_is_cold(cost_model: Any) -> bool:
    """True while the cost model ranks by noise: MetaSchedule's XGB model predicts uniform random
    scores until it holds ``num_warmup_samples`` (100) measurements; the random model always does."""
    warmup = getattr(cost_model, "num_warmup_samples", None)
    if warmup is None:  # the random model (or none): never ranks
        return True
    return int(getattr(cost_model, "data_size", 0)) < int(warmup)


def first_round_search(cfg: ClientConfig, cost_model: Any, done: int) -> str | None:
    """The cold search for a task's first round (None: evolutionary from the start). Evolving a
    population ranked by noise cost each shard 20-25 s of CPU per round on the H200 and proposed no
    faster candidates (DEFAULT_COLD_SEARCH). Only the first round: from the second on, the
    evolutionary search's initial population starts from the task's best measured schedules (TVM's
    ``init_measured_ratio``), which random sampling would ignore, and only first rounds were
    measured. ``done``: the task's trials already measured (a resumed task has its first round)."""
    if cfg.cold_search not in COLD_SEARCHES or done > 0 or not model_is_cold(cost_model):
        return None
    return cfg.cold_search


def search_strategy(cfg: ClientConfig, search: str = "evolutionary") -> Any:
    """Evolutionary search sized to the batch: a round's cost grows with the population, not the
    batch, so the stock population (512) over a small batch makes search dominate a trial.
    Measured on the H200 machine (ResNet-18's heaviest conv, 16 cores): a first round takes 19.6 s
    for 512/64, 12.5 s for 256/8 and 8.1 s for 128/8, i.e. 0.31, 1.57 and 1.01 s of search per
    candidate. The population per candidate is :class:`Evolution`'s (4 by default, 64..512)."""
    from tvm.s_tir import meta_schedule as ms

    if search == "replay":
        return ms.search_strategy.ReplayTrace(max_fail_count=REPLAY_MAX_FAIL_COUNT)
    evo = cfg.evolution
    stock = cfg.population_size or evo.population(cfg.trials_per_iter)
    if search == "short":
        return ms.search_strategy.EvolutionarySearch(population_size=stock, genetic_num_iters=1,
                                                     init_min_unmeasured=min(50, stock // 2))
    if search != "lite":
        return ms.search_strategy.EvolutionarySearch(population_size=stock, genetic_num_iters=evo.generations,
                                                     init_min_unmeasured=evo.fresh(stock))
    population = max(16, LITE_POPULATION_PER_CANDIDATE * cfg.trials_per_iter)
    # The initial sampling gives up (and MetaSchedule ends the task, with no trial) after
    # max_fail_count rounds of `population` draws without one valid schedule. CUDA tasks whose
    # random schedules rarely pass VerifyGPUCode lost every trial with the stock 5 rounds of a
    # small population (on the H200, the -r12 cells: 3 of 6 tasks); as many draws as the stock population
    # gets keeps them, and costs only where valid schedules are that rare.
    fails = 5 * math.ceil(stock / population)
    return ms.search_strategy.EvolutionarySearch(population_size=population, max_fail_count=fails,
                                                 init_min_unmeasured=min(50, population // 2))


def run_client(cfg: ClientConfig, model: Any, target: Any) -> Progress:
    """Tunes this client's shard to completion (or resumes it) and returns the final progress."""
    check_cold_search(cfg.cold_search)
    cfg.work_dir.mkdir(parents=True, exist_ok=True)
    progress_path = cfg.work_dir / PROGRESS
    progress = Progress(cfg.job, cfg.shard, cfg.shards)
    progress.write(progress_path)

    if cfg.process_started_at is not None:
        progress.startup["before_run_client_s"] = round(time.time() - cfg.process_started_at, 2)
    cut = records.repair(cfg.work_dir)
    if cut:
        log.warning("cut %d bytes of a torn last record (client killed mid-write)", cut)
    tracker = TrackerWait(cfg.tracker_host, cfg.tracker_port, cfg.tracker_key, cfg.tracker_wait_s)
    t0 = time.monotonic()
    tasks = extract(model.mod, target)
    progress.startup["extract_s"] = round(time.monotonic() - t0, 2)
    plan = plan_shard(tasks, cfg)
    found = _library_lookup(cfg, target, plan, progress)
    _budget_progress(cfg, plan if found is None else found[1], progress)
    log.info("shard %d/%d: %d of %d tasks, %d trials budgeted, %d already in the database",
             cfg.shard, cfg.shards, len(plan.tasks), len(tasks), progress.budget, progress.resumed)
    todo = [(t, tp) for t, tp in zip(plan.tasks, progress.tasks) if tp.budget - tp.done > 0]
    if cfg.shard >= plan.useful_shards:
        progress.message = (f"nothing to tune: {plan.tasks_to_tune} of the model's {plan.tasks_total} tasks get "
                            f"trials, on shards 0..{plan.useful_shards - 1}")
    if not todo:
        progress.state = "done"
        progress.write(progress_path)
        return progress
    # Reported now, not at the first round: the operator clamps the clients' Job to useful_shards
    # while the other shards are still starting.
    progress.write(progress_path)
    if cfg.on_round is not None:
        cfg.on_round()

    t0 = time.monotonic()
    # MetaSchedule registers every target's tensor intrinsics when the first task is set up;
    # from the cache that is ~0.5 s instead of ~13-20 s of TVMScript parsing (intrinsics.py).
    progress.startup["intrinsics"] = ensure_registered()
    progress.startup["intrinsics_s"] = round(time.monotonic() - t0, 2)
    t0 = time.monotonic()
    tracker.result()
    progress.startup["tracker_wait_s"] = round(time.monotonic() - t0, 2)
    progress.state = "tuning"
    progress.write(progress_path)
    _ShardTuning(cfg, progress, progress_path, todo, target, found[0] if found else None).run()
    progress.state = "done"
    progress.write(progress_path)
    return progress


def _library_lookup(cfg: ClientConfig, target: Any, plan: ShardPlan,
                    progress: Progress) -> tuple[Lookup, ShardPlan] | None:
    """The library's records for this target and device (None: the job uses no library); with
    ``reuse``, the plan without the tasks it already holds ``trials_per_task`` trials of, their
    trials given to the shard's other tasks."""
    use = cfg.library
    found = library_lookup(use, target)
    if use is None or found is None:
        return None
    if use.mode != "reuse":
        return found, plan
    workload_of = {t.info.key: t.info.workload_hash for t in plan.tasks}
    budget, reused = reused_budgets(plan.budget, workload_of, found, cfg.trials_per_task)
    names = {t.info.key: t.info.name for t in plan.tasks}
    progress.tasks_from_library = sorted(names[k] for k in reused)
    if reused:
        log.info("library: %d tasks not tuned again (%s): it holds %d or more trials of each",
                 len(reused), ", ".join(progress.tasks_from_library), cfg.trials_per_task)
    return found, dataclasses.replace(plan, budget=budget)


def _budget_progress(cfg: ClientConfig, plan: Any, progress: Progress) -> None:
    """The shard's tasks into ``progress`` with their budgets and what the database already
    holds (a resumed shard), and every metric series of the shard at its start value."""
    have = records.stats(cfg.work_dir)
    progress.useful_shards, progress.tasks_total = plan.useful_shards, plan.tasks_total
    progress.tasks_to_tune = plan.tasks_to_tune
    for t in plan.tasks:
        w = t.info.workload_hash
        progress.tasks.append(TaskProgress(t.info.name, w, plan.budget[t.info.key],
                                           min(have.trials_by_workload.get(w, 0), plan.budget[t.info.key]),
                                           have.best_by_workload.get(w)))
    progress.budget = sum(tp.budget for tp in progress.tasks)
    progress.done = progress.resumed = sum(tp.done for tp in progress.tasks)
    metrics.SHARD_BUDGET.labels(cfg.job, str(cfg.shard)).set(progress.budget)
    for tp in progress.tasks:  # every series exists from the start: error rates read 0, not "no data"
        for status in metrics.TRIAL_STATUSES:
            metrics.TRIALS.labels(cfg.job, str(cfg.shard), tp.name, status).inc(0)
    metrics.SHARD_DONE.labels(cfg.job, str(cfg.shard)).set(progress.done)
    for use in ("seed", "transfer", "pretrain"):  # 0 for a job without a library: the panel reads 0, not "no data"
        metrics.LIBRARY_RECORDS.labels(cfg.job, str(cfg.shard), use).inc(0)
    metrics.LIBRARY_TASKS_REUSED.labels(cfg.job, str(cfg.shard)).set(len(progress.tasks_from_library))
    metrics.PEER_RECORDS.labels(cfg.job, str(cfg.shard)).inc(0)  # 0 for a single shard, as above


def _builder(cfg: ClientConfig, cores: int) -> Any:
    """The shard's builder: the host's (or the job's) build service when there is one, else a
    pool of this client's own long-lived workers."""
    if cfg.build_service is not None:
        from .build.remote import RemoteBuilder

        return RemoteBuilder(cfg.build_service, fallback_workers=cores, timeout_sec=60.0,
                             export_shared_lib=cfg.session_runner)
    return PooledBuilder(max_workers=cores, timeout_sec=60.0, export_shared_lib=cfg.session_runner)


def _runner(cfg: ClientConfig) -> Any:
    """One runner worker per server: a long-lived session each, or stock's session per candidate."""
    from tvm.s_tir import meta_schedule as ms

    rpc_config = ms.runner.RPCConfig(tracker_host=cfg.tracker_host, tracker_port=cfg.tracker_port,
                                     tracker_key=cfg.tracker_key, session_timeout_sec=cfg.session_timeout_s)
    evaluator = ms.runner.EvaluatorConfig(number=3, repeat=1, min_repeat_ms=20)
    if cfg.session_runner:
        from .measure.runner import SessionRPCRunner

        return SessionRPCRunner(rpc_config, evaluator, max_workers=cfg.servers,
                                candidate_timeout_sec=cfg.session_timeout_s)
    return ms.runner.RPCRunner(rpc_config=rpc_config, evaluator_config=evaluator, max_workers=cfg.servers,
                               f_run_evaluator=measure_window.windowed_run_evaluator)


class _ShardTuning:
    """The tuning of one shard's tasks that still have trials to run (``todo``): one builder,
    runner, database and cost model for all of them, so the cost model keeps learning across the
    shard's tasks."""

    def __init__(self, cfg: ClientConfig, progress: Progress, progress_path: Path,
                 todo: list[tuple[Any, TaskProgress]], target: Any = None, library: Lookup | None = None) -> None:
        from tvm.s_tir import meta_schedule as ms

        self.cfg, self.progress, self.progress_path, self.todo = cfg, progress, progress_path, todo
        self.library = library
        self.cores = cfg.builder_workers or default_builder_workers(cfg.clients_on_host)
        self.builder = _builder(cfg, self.cores)
        # The runner workers (processes started from here, inheriting the environment) note each
        # measurement's co-tenants there; ProgressCallback counts them into the progress report.
        os.environ[measure_window.LOG_ENV] = str(cfg.work_dir / MEASURE_LOG)
        self.windows_log = measure_window.MeasureLog(cfg.work_dir / MEASURE_LOG)
        self.runner = _runner(cfg)
        self.database = ms.database.JSONDatabase(work_dir=str(cfg.work_dir))
        cm_threads = cost_model_threads(cfg.clients_on_host)
        self.cost_model = ms.CostModel.create(cfg.cost_model, num_tuning_cores=cm_threads)
        # SHARETUNE_LIBRARY_PRETRAIN=off: a benchmark's arm that seeds from the library but keeps the
        # cost model cold, to tell the seeds' share of a warm start from the pretraining's.
        if library is not None and os.environ.get("SHARETUNE_LIBRARY_PRETRAIN", "on") != "off":
            t0 = time.monotonic()
            learnt = pretrain(self.cost_model, target, library)
            self.progress.library_records += learnt
            metrics.LIBRARY_RECORDS.labels(cfg.job, str(cfg.shard), "pretrain").inc(learnt)
            self.progress.startup["library_pretrain_s"] = round(time.monotonic() - t0, 2)
            log.info("cost model trained on %d library records before the first round", learnt)
        # The other shards' measurements teach this shard's cost model too (a learned model only).
        self.peers: PeerRecords | None = None
        others = [j for j in range(cfg.shards) if j != cfg.shard]
        if cfg.peers is not None and others and cfg.cost_model == "xgb":
            self.peers = PeerRecords(cfg.peers, others).start()
        log.info("threads: search %d, cost model %d (%d clients on this host); search while the cost model is "
                 "cold: %s", self.cores, cm_threads, cfg.clients_on_host, cfg.cold_search)
        # Per task of todo: the candidates measured (CappedSearch drops them again); a resumed
        # task's also holds the database's best schedules from before this process.
        self.measured = [Measured(from_database=tp.done > 0) for _, tp in todo]
        self.stage: RecordLines | None = None
        self.phases = PhaseExport(cfg.job, cfg.shard)  # the profiler's totals span all the tasks

    def run(self) -> None:
        from tvm.s_tir import meta_schedule as ms

        cfg, todo = self.cfg, self.todo
        with ms.Profiler() as prof, ExitStack() as cleanup:
            if cfg.store_ahead is not None:
                self.stage = RecordLines(cfg.work_dir)
                cleanup.callback(self.stage.close)
            # All of the shard's tasks in one call: round-robin gives every task a round before any
            # gets a second (the whole model improves from the start, not task after task) and
            # measures one task's batch while the next one searches and builds (capped_search.py).
            # First, while the cost model cannot rank, each new task's first round by the cold search.
            cold = [(i, min(cfg.trials_per_iter, tp.budget - tp.done)) for i, (_, tp) in enumerate(todo)
                    if first_round_search(cfg, self.cost_model, tp.done) is not None]
            if cold:
                self.tune(self._turns(cold), cfg.cold_search)
            # Counted again after the cold round: slots it could not fill go to the evolutionary search.
            rest = [(i, tp.budget - tp.done) for i, (_, tp) in enumerate(todo) if tp.budget - tp.done > 0]
            if rest:
                self.tune(self._turns(rest), "evolutionary")
            dropped = sum(m.dropped for m in self.measured)
            if dropped:
                log.info("%d candidates dropped: schedules already measured for their task (earlier in this process, "
                         "before a restart, or in the same batch), not measured twice", dropped)
            self.progress.phases = {k: round(float(v), 3) for k, v in prof.get().items()}
        if self.peers is not None:
            self.peers.stop()
            log.info("cost model learnt from %d records of the job's other shards", self.progress.peer_records)
        log.info("where the time went:\n%s", prof.table())
        b = self.builder
        if hasattr(b, "remote_builds"):  # RemoteBuilder: where this shard's candidates were built
            log.info("candidates built: remote %d, here %d, retried %d, waited %.1f s for a builder",
                     b.remote_builds, b.local_builds, b.retried, b.waited_s)

    def _turns(self, group: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """``group`` in the order its tasks take turns: with a library, the tasks it holds no
        schedule of first (Lookup.first_rounds_order); otherwise as planned, heaviest first."""
        if self.library is None:
            return group
        return [group[k] for k in self.library.first_rounds_order([self.todo[i][1].workload_hash for i, _ in group])]

    def _strategy(self, i: int, tp: TaskProgress, search: str, trials: int) -> Any:
        """The task's search held to ``trials``; a fresh task's first round measures the library's
        schedules first (once per process): its own workload's, then transferred ones to fill the
        round (warm_start.py)."""
        inner = search_strategy(self.cfg, search)
        if self.library is None or tp.done > 0 or self.measured[i].seeded:
            return CappedSearch(inner, trials, self.measured[i])
        self.measured[i].seeded = True
        slots = min(SEEDS_PER_TASK, self.cfg.trials_per_iter)
        seeds = self.library.best(tp.workload_hash, slots)
        self.progress.library_records += len(seeds)
        metrics.LIBRARY_RECORDS.labels(self.cfg.job, str(self.cfg.shard), "seed").inc(len(seeds))
        donors = self.library.donors(tp.workload_hash) if len(seeds) < slots else []
        return CappedSearch(inner, trials, self.measured[i], seeds, donors, slots - len(seeds), self._transferred)

    def _transferred(self, n: int) -> None:
        self.progress.library_records += n
        metrics.LIBRARY_RECORDS.labels(self.cfg.job, str(self.cfg.shard), "transfer").inc(n)

    def tune(self, group: list[tuple[int, int]], search: str) -> None:
        """One ``tune_tasks`` call over ``group`` ((index in todo, trials it gets here)), each
        task held to its own trials (CappedSearch) and interleaved round-robin."""
        from tvm.s_tir import meta_schedule as ms

        cfg = self.cfg
        ctxs: list[Any] = []
        tps: list[TaskProgress] = []
        weights: list[float] = []
        for i, trials in group:
            task, tp = self.todo[i]
            log.info("task %s: %d trials by %s search", task.info.name, trials, search)
            strategy = self._strategy(i, tp, search, trials)
            c, w = ms.relax_integration.extracted_tasks_to_tune_contexts(
                [task.extracted], work_dir=str(cfg.work_dir / "logs"), strategy=strategy, num_threads=self.cores,
                seed=cfg.seed * 1000 + cfg.shard * 100 + i + tp.done)
            ctxs += c
            weights += w
            tps += [tp] * len(c)  # none when TVM skips an already-scheduled task
        if not ctxs:
            return
        # Every task's cap is its CappedSearch's; the scheduler's own limits only must not bind.
        most = max(trials for _, trials in group)
        ms.tune_tasks(tasks=ctxs, task_weights=weights, work_dir=str(cfg.work_dir / "logs"),
                      max_trials_global=sum(trials for _, trials in group), max_trials_per_task=most,
                      num_trials_per_iter=min(cfg.trials_per_iter, most),
                      builder=self.builder, runner=self.runner, database=self.database, cost_model=self.cost_model,
                      measure_callbacks=self.callbacks(ctxs, tps), task_scheduler="round-robin")

    def callbacks(self, ctxs: list[Any], tps: list[TaskProgress]) -> list[Any]:
        """What runs after each measured batch: records stored (ahead of the cost model's training
        when the store uploads them, write_ahead.py), artifacts removed, the cost model updated,
        the progress reported."""
        from tvm.s_tir import meta_schedule as ms

        cfg = self.cfg
        if self.stage is not None and cfg.store_ahead is not None:
            ahead = WriteAhead(self.database, self.stage, ctxs, cfg.store_ahead, cfg.job, str(cfg.shard))
            out = [StoreBatch(ahead), ms.measure_callback.RemoveBuildArtifact(), CostModelUpdate(self.progress),
                   CommitBatch(ahead)]
        else:
            out = [ms.measure_callback.AddToDatabase(), ms.measure_callback.RemoveBuildArtifact(),
                   CostModelUpdate(self.progress)]
        if self.peers is not None:
            out.append(LearnFromPeers(self.peers, self.cost_model, ctxs[0].target, self._learnt_from_peers))
        out.append(ProgressCallback(cfg, self.progress, tps, self.progress_path, self.phases, self.windows_log))
        return out

    def _learnt_from_peers(self, n: int) -> None:
        self.progress.peer_records += n
        metrics.PEER_RECORDS.labels(self.cfg.job, str(self.cfg.shard)).inc(n)
