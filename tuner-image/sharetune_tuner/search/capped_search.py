"""A task's search strategy held to the task's own trial budget, so one ``tune_tasks`` call can
tune all of a shard's tasks together (client.run_client).

MetaSchedule's task scheduler gives every task of a call the same ``max_trials_per_task``, but a
shard's tasks have budgets of their own (partition.budgets: proportional to cost; a resumed task
owes only what it has not measured). One call per task would give each its budget, but tunes the
tasks one after the other: with real budgets (thousands of trials) a shard spends the whole run
on its first task while the model's other tasks stay untuned, and the GPU idles while a task
searches. In one call the round-robin scheduler interleaves them (every task gets a round before
any gets a second) and measures one task's batch while it searches and builds the next task's.

``CappedSearch`` wraps the stock strategy (evolutionary, replay) and ends the task at its cap:
the last batch is trimmed to what the budget has left. It also drops candidates already measured
for the task in this process (``Measured``, shared by the task's strategies across ``tune_tasks``
calls): a strategy starts each call with an empty measured set and seeds its population with the
database's best schedules, so without it the second call re-measured them. A resumed task (a client
restarted over its records) starts ``Measured`` from those same best schedules of the database
(TVM's evolutionary search leaves that to a TODO): they are the only earlier ones it hands out
again, apart from what random sampling happens to draw twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import tvm_ffi
from tvm.ir.utils import derived_object
from tvm.s_tir import Schedule
from tvm.s_tir import meta_schedule as ms

log = logging.getLogger("sharetune.client")

# Batches in a row the inner strategy may propose that are all already measured before the task
# ends (the search has run out of new schedules).
MAX_EMPTY_BATCHES = 3
# The inner strategy's own limit: never reached, the cap is kept here (its counter advances by the
# candidates measured, and by whole batches of duplicates).
UNBOUNDED = 1 << 30


@dataclass
class Measured:
    """One task's candidates handed out (structural hashes of their modules), and how many the
    strategies proposed again; shared by the task's CappedSearch and its clones. ``from_database``:
    the task has records from before this process, to be added once a strategy reads the database."""

    hashes: set[int] = field(default_factory=set)
    dropped: int = 0
    from_database: bool = False
    seeded: bool = False  # the task's library schedules were handed to a strategy (warm_start.py)


def database_picks(strategy: Any) -> int:
    """How many of the database's best schedules ``strategy`` puts into each population (TVM's
    EvolutionarySearch: ``population_size * init_measured_ratio``); 0 for one that reads none."""
    population, ratio = getattr(strategy, "population_size", 0), getattr(strategy, "init_measured_ratio", 0.0)
    return int(population * ratio)


def best_in_database(context: Any, database: Any, k: int) -> set[int]:
    """Structural hashes of the task's ``k`` best schedules in ``database``, rebuilt the way the
    evolutionary search rebuilds them for its population (the trace without its postprocessing,
    then the task's postprocessors), so they equal the modules it proposes."""
    hashes: set[int] = set()
    for record in database.get_top_k(database.commit_workload(context.mod), k):
        sch = replay(context, record.trace)
        if sch is not None:
            hashes.add(tvm_ffi.structural_hash(sch.mod))
    return hashes


def replay(context: Any, trace: Any) -> Any:
    """``trace`` rebuilt on the task's module the way the evolutionary search rebuilds a measured
    schedule for its population: without its postprocessing, then the task's postprocessors
    (None where one rejects it)."""
    sch = Schedule(context.mod, error_render_level="none")
    trace.apply_to_schedule(sch, remove_postproc=True)
    sch.enter_postproc()
    return sch if all(p.apply(sch) for p in context.space_generator.postprocs) else None


def seed_candidates(context: Any, seeds: list[Any]) -> list[Any]:
    """The library's schedules of a task as measure candidates of its module: each trace replayed
    on the task's own module and its postprocessors applied (a trace that no longer applies, e.g.
    from another TVM version, is skipped)."""
    out = []
    workload = ms.database.Workload(context.mod)
    for e in seeds:
        try:
            sch = replay(context, ms.database.TuningRecord.from_json(e.record, workload).trace)
            if sch is None:
                continue
            out.append(ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)))
        except Exception as err:  # a trace this TVM or this module refuses
            log.debug("library schedule of %s skipped: %s", context.task_name, err)
    return out


def ranked(cost_model: Any, context: Any, candidates: list[Any]) -> list[Any]:
    """``candidates`` best first by ``cost_model`` (as they came where it cannot score them)."""
    if cost_model is None or len(candidates) < 2:
        return candidates
    try:
        scores = [float(x) for x in cost_model.predict(context, candidates)]
    except Exception as err:  # features this TVM cannot extract: the library's order
        log.debug("task %s: transferred schedules not ranked: %s", context.task_name, err)
        return candidates
    order = sorted(range(len(candidates)), key=lambda i: (-scores[i], i))
    return [candidates[i] for i in order]


@derived_object
class CappedSearch(ms.search_strategy.PySearchStrategy):
    """``inner`` for at most ``cap`` measured candidates, none of them twice."""

    def __init__(self, inner: Any, cap: int, measured: Measured | None = None, seeds: list[Any] | None = None,
                 transfer: list[Any] | None = None, transfer_slots: int = 0,
                 on_transfer: Callable[[int], None] | None = None) -> None:
        super().__init__()
        self.inner, self.cap = inner, cap
        self.measured = measured if measured is not None else Measured()
        # Library entries (warm_start.py) measured as the task's first batch, before any search;
        # that batch is not the inner strategy's, so its results are not reported to it.
        self.seeds = list(seeds or [])
        # Other workloads' library entries: replayed on this task, the cost model's best
        # ``transfer_slots`` join that batch (warm_start.TRANSFER_MAX); ``on_transfer`` counts them.
        self.transfer = list(transfer or [])
        self.transfer_slots = transfer_slots
        self.on_transfer = on_transfer
        self.seed_batch = False
        self.proposed = 0  # candidates handed to the scheduler in this call
        self.context: Any = None
        self.cost_model: Any = None

    def _initialize_with_tune_context(self, context: Any) -> None:
        self.context = context
        self.inner._initialize_with_tune_context(context)

    def pre_tuning(self, max_trials: int, num_trials_per_iter: int, design_spaces: Any, database: Any = None,
                   cost_model: Any = None) -> None:
        self.proposed = 0
        self.cost_model = cost_model
        k = database_picks(self.inner)
        if self.measured.from_database and database is not None and k > 0:
            known = best_in_database(self.context, database, k)
            self.measured.hashes |= known
            self.measured.from_database = False
            log.info("task %s: its %d best schedules in the database (measured before this process) are not "
                     "proposed again", self.context.task_name, len(known))
        self.inner.pre_tuning(UNBOUNDED, num_trials_per_iter, design_spaces, database, cost_model)

    def post_tuning(self) -> None:
        self.inner.post_tuning()

    def _hand_out(self, candidates: Any, left: int) -> tuple[list[Any], int]:
        """The candidates not measured for the task yet (nor twice in ``candidates``), at most
        ``left`` (the last batch: trimmed to the budget), recorded as measured; and how many were
        duplicates."""
        fresh: dict[int, Any] = {}  # by hash: also a batch's second copy of one schedule (random sampling)
        dupes = 0
        for c in candidates:
            h = tvm_ffi.structural_hash(c.sch.mod)
            if h in self.measured.hashes or h in fresh:
                dupes += 1
            elif len(fresh) < left:
                fresh[h] = c
        self.measured.hashes.update(fresh)
        self.proposed += len(fresh)
        return list(fresh.values()), dupes

    def _library_batch(self, left: int) -> list[Any]:
        """The task's first batch from the library: its own schedules, then transferred ones."""
        seeds, self.seeds = self.seeds, []
        donors, self.transfer = self.transfer, []
        own, _ = self._hand_out(seed_candidates(self.context, seeds), left)
        moved: list[Any] = []
        slots = min(self.transfer_slots, left - len(own))
        if donors and slots > 0:
            moved, _ = self._hand_out(ranked(self.cost_model, self.context, seed_candidates(self.context, donors)),
                                      slots)
            if self.on_transfer is not None:
                self.on_transfer(len(moved))
        if own or moved:
            log.info("task %s: first measures %d schedules from the tuning library (%d of its own, %d transferred "
                     "from %d of other workloads)", self.context.task_name, len(own) + len(moved), len(own),
                     len(moved), len(donors))
        return own + moved

    def generate_measure_candidates(self) -> list[Any] | None:
        left = self.cap - self.proposed
        if (self.seeds or self.transfer) and left > 0:
            batch = self._library_batch(left)
            if batch:
                self.seed_batch = True
                return batch
        for _ in range(MAX_EMPTY_BATCHES + 1):
            if left <= 0:
                return None
            batch = self.inner.generate_measure_candidates()
            if batch is None:
                return None
            fresh, dupes = self._hand_out(batch, left)
            self.measured.dropped += dupes
            if fresh:
                return fresh
            # Every candidate already measured: tell the inner strategy its batch is done (it
            # counts batches) and ask again.
            self.inner.notify_runner_results(batch, [ms.runner.RunnerResult(run_secs=None, error_msg="duplicate")
                                                     for _ in batch])
        return None

    def notify_runner_results(self, measure_candidates: Any, results: Any) -> None:
        if self.seed_batch:  # the library's batch: not one the inner strategy proposed
            self.seed_batch = False
            return
        self.inner.notify_runner_results(measure_candidates, results)

    def clone(self) -> Any:
        # TuneContext.clone() clones its strategy: the clone keeps the cap, the shared record and
        # the seeds not yet handed out.
        return CappedSearch(self.inner.clone(), self.cap, self.measured, self.seeds, self.transfer,
                            self.transfer_slots, self.on_transfer)
