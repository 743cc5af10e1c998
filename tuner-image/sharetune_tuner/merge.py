"""Merge the shards' records, keep only what beats TVM's defaults, check and measure the model.

A tuning result is never slower than the model it was given. Per task, the best tuned record is
measured here, on the merge's own device, against TVM's default schedule for that task (what
``compile_relax`` applies without a record: DLight's rules on GPUs, the PrimFunc as it is on
CPUs) and kept only where it is faster beyond timing noise. Then the whole model: if the model
built with the kept records is not faster than the untuned one, the delivered result is the
untuned model (``best/`` holds no record) and the summary says ``improved: false``.

Output directory:
  records/      every trial of every shard (nothing dropped: the source of truth)
  best/         what deployments apply: the best record of each task that beat its default, or
                nothing when the tuned model was not faster than the untuned one
  summary.json  per task: trials, best latency, default vs tuned and the winner; end-to-end
                latency untuned vs delivered, ``improved``, the tasks left at their defaults
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sharetune.api.spec import TuningJobSpec, useful_minimum
from sharetune.api.summary import UNTUNED, Summary, TaskSummary
from sharetune.api.topology import SUMMARY_FILE

from .errors import TunerError
from .measure import window as measure_window
from .model.loader import LoadedModel, load_for_spec, model_errors
from .model.tasks import extract
from .search.partition import budgets
from .search.warm_start import LibraryUse, Lookup, library_lookup
from .store import library, records
from .targets import device_for, make_target

log = logging.getLogger("sharetune.merge")

# A tuned schedule (a task's, or the whole model's) must be this much faster than TVM's default
# to replace it: timing noise between two measurements of one kernel stays below it (repeated
# rounds, alternating, medians).
NOISE = 0.03
TUNED, DEFAULT, NO_RECORDS = "tuned", "default", "untuned-no-records"


def compile_with(db_dir: Path | None, model: LoadedModel, target: Any) -> Any:
    """Compiles with the records in ``db_dir``; None = no records (TVM's default schedules,
    DLight on GPUs): the 'untuned' model the tuned one is compared against."""
    from tvm.s_tir import meta_schedule as ms

    db = ms.database.JSONDatabase(work_dir=str(db_dir)) if db_dir else ms.database.MemoryDatabase()
    # Inside the target's scope, as builder.build_without_intrinsics: TVM's NVRTC callback reads the
    # arch from Target.current() and, without one, from GPU 0, so a machine without the GPU (a
    # result compiled elsewhere, SHARETUNE_CUDA_ARCH) could not compile for it.
    with target:
        return ms.relax_integration.compile_relax(db, model.mod, target, None)


def _vm(executable: Any, dev: Any) -> Any:
    from tvm import relax

    return relax.VirtualMachine(executable, dev)


def _args(model: LoadedModel, x: np.ndarray, dev: Any) -> list[Any]:
    import tvm

    return [tvm.runtime.tensor(x, dev), *[tvm.runtime.tensor(p.numpy(), dev) for p in model.params]]


def run_once(executable: Any, model: LoadedModel, x: np.ndarray, dev: Any) -> np.ndarray:
    out = _vm(executable, dev)["main"](*_args(model, x, dev))
    if isinstance(out, (list, tuple)) or not hasattr(out, "numpy"):
        out = out[0]
    return out.numpy()


def faster(candidate_s: float, baseline_s: float) -> bool:
    """The candidate beats the baseline beyond timing noise (a tie keeps the baseline)."""
    return candidate_s < baseline_s * (1 - NOISE)


def compare(timers: list[Callable[[], float]], rounds: int = 5) -> list[float]:
    """Median seconds of each timer over ``rounds`` rounds that take turns (a, b, a, b, ...), so a
    slow spell of a shared machine hits every candidate alike."""
    times: list[list[float]] = [[] for _ in timers]
    for _ in range(rounds):
        for t, fn in zip(times, timers):
            t.append(fn())
    return [float(np.median(t)) for t in times]


def model_timer(executable: Any, model: LoadedModel, x: np.ndarray, dev: Any,
                min_repeat_ms: int = 200) -> Callable[[], float]:
    """One timed round (at least ``min_repeat_ms`` long) of the whole model per call."""
    vm = _vm(executable, dev)
    args = _args(model, x, dev)
    vm["main"](*args)  # warm-up (CUDA: module load, NVRTC)
    ev = vm.time_evaluator("main", dev, number=1, repeat=1, min_repeat_ms=min_repeat_ms)
    return lambda: float(ev(*args).mean)


def default_schedule(mod: Any, target: Any) -> Any:
    """A task's IRModule with the schedule ``compile_relax`` gives it when no record matches:
    DLight's default rules on GPU targets; nothing on CPUs (the PrimFunc is lowered as it is)."""
    import tvm
    from tvm.relax import pipeline as rp

    if not rp.BackendDispatcher.is_gpu_target(target):
        return mod
    from tvm.s_tir import dlight as dl

    # A copy: DLight schedules the module's PrimFuncs in place where it can (copy-on-write of a
    # uniquely held function), and the record's own workload must stay unscheduled for its trace
    # (seen on the H200: every trace then failed with "Cannot find a block with the name: pad_temp").
    mod = tvm.ir.load_json(tvm.ir.save_json(mod))
    with target, tvm.transform.PassContext(opt_level=3):
        return dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                       dl.gpu.GeneralReduction(), dl.gpu.Fallback())(mod)


def tuned_schedule(record: Any) -> Any:
    """The record's workload with its trace replayed (what ``MetaScheduleApplyDatabase`` puts in)."""
    from tvm.s_tir import Schedule

    sch = Schedule(record.workload.mod)
    record.trace.apply_to_schedule(sch, remove_postproc=False)
    return sch.mod


def kernel_timer(mod: Any, target: Any, dev: Any, min_repeat_ms: int = 40) -> Callable[[], float]:
    """Builds one task's IRModule as MetaSchedule's builder does and returns a timer of it on
    random arguments (integer arguments zero: they may be indices)."""
    import tvm
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    lib = tvm.tirx.build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)
    rng = np.random.default_rng(0)
    args = []
    for info in ms.arg_info.ArgInfo.from_entry_func(mod, remove_preproc=True):
        shape, dtype = [int(d) for d in info.shape], str(info.dtype)
        a = rng.uniform(-1, 1, shape) if "float" in dtype else np.zeros(shape)
        args.append(tvm.runtime.tensor(a.astype(dtype), dev))
    ev = lib.time_evaluator(lib.entry_name, dev, number=1, repeat=1, min_repeat_ms=min_repeat_ms)
    ev(*args)  # warm-up
    return lambda: float(ev(*args).mean)


def judge_tasks(candidates: list[Any], target: Any, dev: Any,
                alone: measure_window.AloneMeasurements | None = None) -> dict[str, dict[str, Any]]:
    """Per workload (structural hash) of each candidate record: ``default_us``, ``tuned_us`` and
    the ``winner``, both measured here the same way (on a shared GPU inside an exclusive window:
    ``alone``). A record that does not build or run here loses; a default that does not build on
    its own (the model's build is the judge then) loses."""
    window = alone.window if alone is not None else contextlib.nullcontext
    import tvm_ffi

    from .model.intrinsics import ensure_registered

    if candidates:
        ensure_registered()  # traces that use tensor intrinsics (tensor cores, VNNI) name them
    out: dict[str, dict[str, Any]] = {}
    for rec in candidates:
        h = str(tvm_ffi.structural_hash(rec.workload.mod))
        timers: dict[str, Callable[[], float]] = {}
        for what in ("tuned", "default"):  # the trace first, on the untouched workload
            try:
                mod = default_schedule(rec.workload.mod, target) if what == "default" else tuned_schedule(rec)
                timers[what] = kernel_timer(mod, target, dev)
            except Exception as e:  # a schedule this device or TVM's build refuses
                log.warning("task %s: the %s schedule does not build or run here: %s", h, what, e)
        v: dict[str, Any] = {"default_us": None, "tuned_us": None, "winner": DEFAULT, "record": rec}
        if len(timers) == 2:
            with window():
                d_s, t_s = compare([timers["default"], timers["tuned"]])
            v.update(default_us=round(d_s * 1e6, 3), tuned_us=round(t_s * 1e6, 3),
                     winner=TUNED if faster(t_s, d_s) else DEFAULT)
        elif "tuned" in timers:
            with window():
                t_s = compare([timers["tuned"]])[0]
            v.update(tuned_us=round(t_s * 1e6, 3), winner=TUNED)
        out[h] = v
    return out


def write_db(db_dir: Path, recs: list[Any]) -> None:
    """``db_dir`` as a JSONDatabase holding exactly ``recs`` (none: an empty one)."""
    from tvm.s_tir import meta_schedule as ms

    from sharetune.api.topology import RECORDS_FILE, WORKLOADS_FILE

    db_dir.mkdir(parents=True, exist_ok=True)
    for f in (WORKLOADS_FILE, RECORDS_FILE):
        (db_dir / f).unlink(missing_ok=True)
        (db_dir / f).touch()
    db = ms.database.JSONDatabase(work_dir=str(db_dir))
    for rec in recs:
        db.commit_tuning_record(ms.database.TuningRecord(rec.trace, db.commit_workload(rec.workload.mod),
                                                         rec.run_secs, rec.target, rec.args_info))


def outputs_match(reference: np.ndarray, tuned: np.ndarray) -> tuple[bool, float]:
    """Tuned schedules only reorder float arithmetic: equal up to accumulated rounding."""
    scale = float(np.max(np.abs(reference))) or 1.0
    err = float(np.max(np.abs(reference - tuned))) / scale
    return err < 1e-3, err


def deliver(winners: int, untuned_s: float, tuned_s: float | None) -> bool:
    """Whether the tuned model is the result: some task kept a tuned record and the model built
    with them is faster than the untuned one beyond noise. Otherwise the untuned model is."""
    return winners > 0 and tuned_s is not None and faster(tuned_s, untuned_s)


def _task_summaries(spec: TuningJobSpec, extracted: list[Any], stats: records.RecordStats,
                    verdicts: dict[str, dict[str, Any]]) -> list[TaskSummary]:
    """Every task of the model (``extracted`` by the merge, once), heaviest first: its budget, trials and best record
    (``stats`` of the merged records), and what the merge found against TVM's default schedule
    (``verdicts`` by workload)."""
    budget = budgets([t.info for t in extracted], spec.trials.total, spec.trials.per_task,
                     useful_minimum(spec.trials.per_task, spec.trials.per_iteration))
    tasks: list[TaskSummary] = []
    for t in extracted:
        h = t.info.workload_hash
        v = verdicts.get(h)
        tasks.append(TaskSummary(
            t.info.name, h, t.info.weight, t.info.flops, budget[t.info.key], stats.trials_by_workload.get(h, 0),
            round(stats.best_by_workload[h] * 1e6, 3) if h in stats.best_by_workload else None,
            v["default_us"] if v else None, v["tuned_us"] if v else None, v["winner"] if v else NO_RECORDS))
    tasks.sort(key=lambda t: -(t.flops * t.weight))
    return tasks


def _serving(spec: TuningJobSpec, model: Any, delivered: Any, x: Any, out: Path,
             alone: measure_window.AloneMeasurements) -> dict[str, Any]:
    """The delivered model at each MPS serving share, each measurement alone on the GPU."""
    from .measure.serving import measure_one
    from .measure.serving import report as serving_report

    def measure_alone(lib: Path, inputs: Path, pct: int) -> dict[str, Any]:
        with alone.window():
            return measure_one(lib, inputs, pct)

    return serving_report(spec.target, spec.uses_mps, delivered, [x, *[p.numpy() for p in model.params]],
                          out / "serving", measure=measure_alone)


def _untuned_and_tuned(model: Any, target: Any, dev: Any, x: Any, best: Path | None,
                       alone: measure_window.AloneMeasurements) -> tuple[Any, Any, float, float | None, float]:
    """The untuned model and, with ``best`` records, the tuned one (its output checked against the
    untuned one's), timed back to back alone on the GPU: (untuned, tuned, their latencies in
    seconds, the tuned output's relative error)."""
    with model_errors(f"TVM cannot compile {model.name}"):  # the model's problem, not the records'
        untuned = compile_with(None, model, target)
        ref = run_once(untuned, model, x, dev)
    if best is None:
        timer = model_timer(untuned, model, x, dev)
        with alone.window():
            return untuned, None, compare([timer])[0], None, 0.0
    tuned = compile_with(best, model, target)
    ok, err = outputs_match(ref, run_once(tuned, model, x, dev))
    if not ok:
        raise TunerError(f"the tuned model's output differs from the untuned one (relative error {err:.2e})")
    timers = [model_timer(untuned, model, x, dev), model_timer(tuned, model, x, dev)]
    with alone.window():
        lat_untuned, lat_tuned = compare(timers)
    return untuned, tuned, lat_untuned, lat_tuned, err


def with_library(candidates: list[Any], found: Lookup | None,
                 model_workloads: set[str]) -> tuple[list[Any], set[str]]:
    """The job's best record per workload, where the library's best (same target, device, share)
    was measured faster, or the job has none, replaced by the library's: returns the candidates
    and the workloads whose candidate came from the library."""
    if found is None:
        return candidates, set()
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    by_wl = {str(tvm_ffi.structural_hash(r.workload.mod)): r for r in candidates}
    from_library: set[str] = set()
    for wl in sorted(model_workloads):
        best = found.best(wl, 1)
        if not best or wl not in found.irs:
            continue
        mine = by_wl.get(wl)
        if mine is not None and (records.mean_secs([float(s) for s in mine.run_secs]) or 1e10) <= best[0].secs:
            continue
        workload = ms.database.Workload.from_json([wl, found.irs[wl]])
        by_wl[wl] = ms.database.TuningRecord.from_json(best[0].record, workload)
        from_library.add(wl)
    return list(by_wl.values()), from_library


def add_to_library(use: LibraryUse, job_id: str, records_dir: Path) -> int:
    """The job's measured records into the library (its own object: library.add); returns how many."""
    obj = library.contribution(records_dir, job_id, use.where)
    try:
        library.add(use.open(), use.scope, job_id.replace("/", "-"), obj)
    except library.LibraryError as e:  # the job's result stands; the library misses this job
        log.warning("%s; the job's records are in its result (sharetune library import adds them later)", e)
        return 0
    log.info("added %d records to the tuning library %s (scope %s)", len(obj["records"]), use.uri, use.scope)
    return len(obj["records"])


def _serve_and_write(summary: Summary, spec: TuningJobSpec, model: Any, delivered: Any, x: Any, out: Path,
                     alone: measure_window.AloneMeasurements) -> None:
    """The delivered model's serving report into ``summary``, then ``summary`` into ``out``."""
    from .measure.serving import KEY as SERVING_KEY

    serving = _serving(spec, model, delivered, x, out, alone)
    summary.latency_ms_by_serving_pct = serving[SERVING_KEY]
    summary.serving_report = serving["serving_report"]
    summary.measurement = alone.summary()
    summary.write(out / SUMMARY_FILE)


def _candidates(best_dir: Path, use: LibraryUse | None, target: Any, workloads: set[str],
                shard_dirs: list[Path]) -> tuple[list[Any], set[str]]:
    """The best record per workload the merge judges: the shards' (``best_dir``), with the
    library's where faster or missing (:func:`with_library`)."""
    from tvm.s_tir import meta_schedule as ms

    candidates, from_library = with_library(ms.database.JSONDatabase(work_dir=str(best_dir)).get_all_tuning_records(),
                                            library_lookup(use, target), workloads)
    if not candidates:
        raise TunerError(f"no tuning records in {', '.join(map(str, shard_dirs))} nor in the tuning library")
    return candidates, from_library


def merge_and_report(spec: TuningJobSpec, shard_dirs: list[Path], out: Path, use: LibraryUse | None = None,
                     job_id: str | None = None) -> Summary:

    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    counts = records.merge(shard_dirs, out / "records", out / "best")
    if counts["records_in"] == 0 and use is None:
        raise TunerError(f"no tuning records in {', '.join(map(str, shard_dirs))}")
    model = load_for_spec(spec.model)
    target = make_target(spec.target, spec.builder_workers)
    dev = device_for(spec.target)
    x = model.sample_input(seed=spec.seed)
    extracted = extract(model.mod, target)
    workload_names = {t.info.workload_hash: t.info.name for t in extracted}
    candidates, from_library = _candidates(out / "best", use, target, set(workload_names), shard_dirs)

    # Per task: the best record against TVM's default schedule; best/ keeps the winners only.
    # On a shared GPU every measurement below runs alone: co-tenants hold theirs back meanwhile.
    alone = measure_window.AloneMeasurements(measure_window.tenant(spec.name))
    verdicts = judge_tasks(candidates, target, dev, alone)
    kept = [v["record"] for v in verdicts.values() if v["winner"] == TUNED]
    write_db(out / "best", kept)

    untuned, tuned, lat_untuned, lat_tuned, err = _untuned_and_tuned(model, target, dev, x,
                                                                       out / "best" if kept else None, alone)
    improved = deliver(len(kept), lat_untuned, lat_tuned)
    if not improved:
        write_db(out / "best", [])  # the result is the untuned model: nothing to apply
    delivered = tuned if improved else untuned
    lat_delivered = lat_tuned if improved and lat_tuned is not None else lat_untuned

    stats = records.stats(out / "records")
    tasks = _task_summaries(spec, extracted, stats, verdicts)
    summary = Summary(
        job=spec.name, model=model.name, input_shape=list(model.input_shape), target=spec.target,
        shards=len(shard_dirs), records=counts["records_out"], failed_trials=stats.failed,
        workloads=counts["workloads"], best_records=len(kept) if improved else 0,
        candidate_records=counts["best_records"],
        improved=improved, delivered=TUNED if improved else UNTUNED,
        latency_untuned_ms=round(lat_untuned * 1e3, 4), latency_tuned_ms=round(lat_delivered * 1e3, 4),
        speedup=round(lat_untuned / lat_delivered, 3) if improved else 1.0,
        latency_records_ms=round(lat_tuned * 1e3, 4) if lat_tuned is not None else None,
        speedup_of_records=round(lat_untuned / lat_tuned, 3) if lat_tuned is not None else None,
        max_relative_error=err, tasks=tasks,
        tasks_left_at_default=[t.name for t in tasks if t.budget == 0],
        tasks_default_won=[t.name for t in tasks if t.winner == DEFAULT],
        tasks_from_library=sorted(workload_names[w] for w in from_library
                                  if improved and verdicts[w]["winner"] == TUNED),
        merge_s=round(time.monotonic() - t0, 2))
    if use is not None and counts["records_in"]:
        summary.library_records_added = add_to_library(use, job_id or spec.name, out / "records")
    _serve_and_write(summary, spec, model, delivered, x, out, alone)
    log.info("merged %d records; %d of %d tuned tasks beat their defaults; untuned %.3f ms, tuned records %s ms: "
             "delivered the %s model (%.2fx)", summary.records, len(kept), len(verdicts),
             summary.latency_untuned_ms, summary.latency_records_ms, summary.delivered, summary.speedup)
    return summary
