"""The client trains its cost model after every measured batch except the shard's very last one
(nothing searches after it): real MetaSchedule tuning of a small matmul on the CPU, counting the
cost model's updates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("tvm")

import numpy as np
import tvm
from tvm import te
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.testing import te_workload

from sharetune_tuner.build.builder import build_without_intrinsics
from sharetune_tuner.client import TaskProgress
from sharetune_tuner.measure.callbacks import CostModelUpdate
from sharetune_tuner.model.intrinsics import ensure_registered

pytestmark = pytest.mark.tvm
BUDGET, PER_ITER = 8, 4  # two measured batches


@derived_object
class CountingModel(ms.cost_model.PyCostModel):
    """Random scores (the search still works); counts how many batches it was trained on."""

    def __init__(self) -> None:
        super().__init__()
        self.updates: list[int] = []
        self.rng = np.random.default_rng(0)

    def load(self, path: str) -> None:
        pass

    def save(self, path: str) -> None:
        pass

    def update(self, context: Any, candidates: Any, results: Any) -> None:
        self.updates.append(len(candidates))

    def predict(self, context: Any, candidates: Any) -> np.ndarray:
        return self.rng.random(len(candidates))


@derived_object
class CountDone(ms.measure_callback.PyMeasureCallback):
    """What the progress callback does for this test: the batch counts as done after the update."""

    def __init__(self, task: TaskProgress) -> None:
        super().__init__()
        self.task = task

    def apply(self, task_scheduler: Any, task_id: int, measure_candidates: Any, builder_results: Any,
              runner_results: Any) -> None:
        self.task.done += len(measure_candidates)


def tune(work_dir: Path, shard_budget: int) -> list[int]:
    # As the client builds: tensor intrinsics from the cache, a builder that does not parse them
    # in every fresh worker (stock's default_build does, ~30 s a batch on two cores).
    ensure_registered()
    mod = tvm.IRModule({"main": te.create_prim_func(te_workload.matmul(64, 64, 64))})
    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    task = TaskProgress("matmul", "h", BUDGET, 0, None)
    shard = TaskProgress("shard", "-", shard_budget, 0, None)  # the client passes its Progress
    model = CountingModel()
    ctx = ms.TuneContext(mod=mod, target=target, space_generator="post-order-apply",
                         search_strategy=ms.search_strategy.EvolutionarySearch(population_size=16,
                                                                               init_min_unmeasured=8),
                         task_name="matmul", num_threads=2, rand_state=1)
    ms.tune_tasks(tasks=[ctx], task_weights=[1.0], work_dir=str(work_dir), max_trials_global=BUDGET,
                  max_trials_per_task=BUDGET, num_trials_per_iter=PER_ITER,
                  builder=ms.builder.LocalBuilder(max_workers=2, f_build=build_without_intrinsics),
                  runner=ms.runner.LocalRunner(),
                  database=ms.database.MemoryDatabase(), cost_model=model,
                  measure_callbacks=[ms.measure_callback.AddToDatabase(),
                                     CostModelUpdate(shard), CountDone(task), CountDone(shard)],
                  task_scheduler="round-robin")
    assert task.done == BUDGET
    return model.updates


# Counted: the update calls. Each call gets only the batch's candidates that built and ran
# (UpdateCostModel prunes failed ones): on a loaded machine a LocalRunner timeout made one [0].
def test_the_shards_last_batch_does_not_train_the_cost_model(tmp_path: Path) -> None:
    assert len(tune(tmp_path / "last", shard_budget=BUDGET)) == 1


def test_batches_before_the_shards_last_still_train_it(tmp_path: Path) -> None:
    # the shard has more trials to measure after this task's: its last batch trains the model too
    assert len(tune(tmp_path / "middle", shard_budget=2 * BUDGET)) == 2
