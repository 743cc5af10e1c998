"""A job's use of the tuning library (library.py): what its clients start from and what its merge
adds.

- **warm**: each task's first round measures the library's best schedules of its workload (same
  target, device model and GPU share) before any search, so a task tuned before starts where it
  ended; the evolutionary search then seeds its population from them (they are in the shard's
  database, measured here). A task the library holds too few schedules of fills the rest of that
  round by transfer: other workloads' schedules (same target, device and share) replayed on the
  task's own module, the ones the library-trained cost model ranks best. Every shard's cost
  model is first trained on the library's records of the same target and device (all workloads:
  MetaSchedule's features are per program), so no shard's first search ranks by noise.
- **reuse**: warm, and a task whose workload the library already holds ``trials.perTask`` trials
  of (same target, device and share) is not tuned again: its budget goes to the shard's other
  tasks, and the merge takes the library's best record for it as a candidate, re-measured against
  TVM's default like any record (never slower: a stale or poisoned record is not delivered).

In both modes the merge offers the library's best record of every workload as a candidate where
the job measured nothing faster, and adds the job's measured records to the library.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ..store.library import Backend, Entry, LibraryError, Where, entries, open_library, target_key

log = logging.getLogger("sharetune.library")
T = TypeVar("T")

MODES = ("none", "warm", "reuse")
# Library schedules a task's first round measures (at most; the round's size caps it too).
SEEDS_PER_TASK = 4
# Records the cost model is trained on before the first round, spread over the workloads (spread).
PRETRAIN_MAX = 2048
# Transfer: a task the library holds fewer than SEEDS_PER_TASK schedules of fills its first round
# with other workloads' schedules replayed on its own module (a split whose factors no longer
# divide the loop falls back to TVM's default tiling), the ones the cost model ranks best. The
# fastest TRANSFER_PER_WORKLOAD of each workload are tried, TRANSFER_MAX at most (each costs a
# replay on the client, once per task).
TRANSFER_PER_WORKLOAD = 4
TRANSFER_MAX = 96


@dataclass(frozen=True)
class LibraryUse:
    """Which library a process uses, in which scope and mode, measuring where."""

    uri: str
    scope: str
    mode: str
    where: Where

    def open(self) -> Backend:
        return open_library(self.uri)


@dataclass
class Lookup:
    """The library's entries for one target and device: by workload (this share only, fastest
    first) for seeds and reuse, and all of them (any share) for the cost model."""

    same_share: dict[str, list[Entry]]
    same_device: list[Entry]
    irs: dict[str, str]

    def trials(self, workload: str) -> int:
        return len(self.same_share.get(workload, []))

    def best(self, workload: str, k: int) -> list[Entry]:
        return self.same_share.get(workload, [])[:k]

    def first_rounds_order(self, workloads: Sequence[str]) -> list[int]:
        """The order (indexes into ``workloads``, a shard's tasks heaviest first) their rounds take
        turns in: the tasks the library holds no schedule of first, then those it does. A held
        task's library records already count towards the job's result (the merge offers them), so
        its first round adds little; a task with nothing to start from is still at TVM's default,
        and its first round is where the model's latency falls the most."""
        return sorted(range(len(workloads)), key=lambda i: bool(self.same_share.get(workloads[i])))

    def donors(self, workload: str, per_workload: int = TRANSFER_PER_WORKLOAD,
               limit: int = TRANSFER_MAX) -> list[Entry]:
        """Other workloads' fastest schedules (this target, device and share) to transfer to
        ``workload``: each workload's fastest first, then each one's second, and so on, so a limit
        keeps every workload's best."""
        others = [es[:per_workload] for wl, es in sorted(self.same_share.items()) if wl != workload]
        return [e for _, e in by_rank(others, limit)]


def by_rank(lists: Sequence[Sequence[T]], limit: int) -> list[tuple[int, T]]:
    """At most ``limit`` items of ``lists`` with the index of the list each came from, taken rank by
    rank: every list's first, then every list's second, and so on (so a limit keeps every list's
    first items rather than the first lists whole)."""
    longest = max((len(x) for x in lists), default=0)
    return [(i, x[rank]) for rank in range(longest) for i, x in enumerate(lists) if rank < len(x)][:limit]


def target_json(target: Any) -> Any:
    """A TVM target as plain JSON, the form a tuning record carries it in (``Target.export()`` with
    TVM's containers and a host target turned into Python's)."""
    import tvm

    if isinstance(target, tvm.target.Target):
        return target_json(target.export())
    if hasattr(target, "items"):
        return {str(k): target_json(v) for k, v in target.items()}
    if isinstance(target, (bool, int, float)) or target is None:
        return target
    if isinstance(target, str):
        return str(target)
    if hasattr(target, "__iter__"):
        return [target_json(v) for v in target]
    return str(target)


def lookup(use: LibraryUse, target: Any) -> Lookup:
    """Reads the scope once: entries measured on ``target`` with ``use.where``'s device."""
    found, irs = entries(use.open(), use.scope)
    tkey = target_key(target_json(target))
    same_device = [e for e in found if e.key.target == tkey and e.key.device == use.where.device]
    by_wl: dict[str, list[Entry]] = {}
    for e in same_device:
        if e.key.share == use.where.share:
            by_wl.setdefault(e.key.workload, []).append(e)
    for v in by_wl.values():
        v.sort(key=lambda e: e.secs)
    log.info("library %s scope %s: %d records of this target and device (%d workloads at share %d%%), %d in all",
             use.uri, use.scope, len(same_device), len(by_wl), use.where.share, len(found))
    return Lookup(by_wl, same_device, irs)


def library_lookup(use: LibraryUse | None, target: Any) -> Lookup | None:
    """:func:`lookup`, or None without a library or where it cannot be read: a job whose library is
    away tunes cold (and says so in its log) rather than fail."""
    if use is None or use.mode == "none":
        return None
    try:
        return lookup(use, target)
    except LibraryError as e:
        log.warning("%s: tuning without the library", e)
        return None


def reused_budgets(budget: dict[str, int], workload_of: dict[str, str], found: Lookup,
                   per_task: int) -> tuple[dict[str, int], list[str]]:
    """``reuse``: the tasks (keys of ``budget``) whose workload the library holds ``per_task`` trials
    of get none; their trials go to the other tasks in proportion to their budgets. Returns the
    new budgets and the reused tasks' keys."""
    reused = [k for k, n in budget.items() if n > 0 and found.trials(workload_of[k]) >= per_task]
    freed = sum(budget[k] for k in reused)
    rest = {k: n for k, n in budget.items() if k not in reused and n > 0}
    out = {k: (0 if k in reused else n) for k, n in budget.items()}
    total = sum(rest.values())
    if freed and total:
        shares = {k: freed * n / total for k, n in rest.items()}
        for k, extra in shares.items():
            out[k] += math.floor(extra)
        # what flooring left over, one trial each to the largest budgets
        for k in sorted(rest, key=lambda k: (-rest[k], k))[:freed - sum(math.floor(x) for x in shares.values())]:
            out[k] += 1
    return out, reused


def pretrain(cost_model: Any, target: Any, found: Lookup, limit: int = PRETRAIN_MAX) -> int:
    """Trains ``cost_model`` on the library's records of this target and device, each workload as
    its own group (its IR from the library); returns the records it learnt from."""
    by_wl: dict[str, list[Entry]] = {}
    for e in sorted(found.same_device, key=lambda e: e.secs):
        by_wl.setdefault(e.key.workload, []).append(e)
    groups = [(wl, found.irs[wl], [e.record for e in group]) for wl, group in sorted(by_wl.items())
              if wl in found.irs]
    return learn(cost_model, target, groups, limit, "library")


# A workload's records as the cost model learns them: (its structural hash, its IR as a
# JSONDatabase workload line holds it, the records' bodies ``[trace, run_secs, target, args_info]``).
Group = tuple[str, str, list[list[Any]]]


def spread(groups: list[Group], limit: int) -> list[Group]:
    """At most ``limit`` records of ``groups`` (each group's records fastest first), taken across the
    workloads rank by rank: every workload's fastest, then every second fastest, and so on. Taking
    them group after group instead taught a model from a library larger than the limit the first
    few workloads in full and the others nothing (a real-budget CUDA library holds thousands of
    records of a few dozen workloads)."""
    taken = Counter(i for i, _ in by_rank([bodies for _, _, bodies in groups], limit))
    return [(wl, ir, bodies[:taken[i]]) for i, (wl, ir, bodies) in enumerate(groups) if taken[i]]


def learn(cost_model: Any, target: Any, groups: list[Group], limit: int, source: str) -> int:
    """Trains ``cost_model`` on tuning records measured elsewhere, grouped by workload (``Group``);
    at most ``limit`` records, spread over the workloads. Returns how many it learnt from. A
    workload or trace this TVM cannot load is skipped (and logged at debug). The model trains once,
    after the last group (tvm_private.held_training): handed one workload at a time, XGBoost
    retrained each time its data grew by a fifth (14 trainings for 722 library records)."""
    from ..tvm_private import held_training

    batches = replayed(target, groups, limit, source)
    used = 0
    with held_training(cost_model) as release:
        for i, (wl, ctx, cands, results) in enumerate(batches):
            if i == len(batches) - 1:
                release()
            try:
                cost_model.update(ctx, cands, results)
                used += len(cands)
            except Exception as err:  # features this TVM cannot extract: learnt without them
                log.debug("%s workload %s not learnt: %s", source, wl, err)
    return used


def replayed(target: Any, groups: list[Group], limit: int,
             source: str) -> list[tuple[str, Any, list[Any], list[Any]]]:
    """Each group's records as a cost model's update takes them: (workload, a tune context of its
    module, the traces replayed as measure candidates, their run times); ``limit`` records at most,
    spread over the workloads."""
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms

    out: list[tuple[str, Any, list[Any], list[Any]]] = []
    for wl, ir, bodies in spread(groups, limit):
        try:
            workload = ms.database.Workload.from_json([wl, ir])
            mod = workload.mod
            ctx = ms.TuneContext(mod=mod, target=target, task_name=f"{source}-{wl}")
            cands, results = [], []
            for body in bodies:
                sch = Schedule(mod, error_render_level="none")
                ms.database.TuningRecord.from_json(body, workload).trace.apply_to_schedule(sch, remove_postproc=False)
                cands.append(ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_entry_func(sch.mod,
                                                                                          remove_preproc=True)))
                results.append(ms.runner.RunnerResult(run_secs=[float(s) for s in body[1]], error_msg=None))
        except Exception as err:  # a workload or trace this TVM cannot load: learnt without it
            log.debug("%s workload %s not learnt: %s", source, wl, err)
            continue
        if cands:
            out.append((wl, ctx, cands, results))
    return out
