"""A task's first round, while MetaSchedule's cost model cannot rank candidates, samples the batch
at random instead of evolving a population by noise (client.first_round_search,
SHARETUNE_COLD_SEARCH, default replay); later rounds evolve from the measured schedules. Real cost
models, real search strategies, and a real client tuning a real task (llvm) for the round split;
the quality side (candidates as fast) is measured on the H200 and this CPU
(bench/h200/search_quality.py, docs/benchmarks.md round q1)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from tvm.s_tir import meta_schedule as ms

from sharetune_tuner.client import ClientConfig, check_cold_search, first_round_search, model_is_cold, search_strategy
from sharetune_tuner.errors import TunerError
from sharetune_tuner.store import records

from .conftest import Topology, example_job, tuner


def _cfg(**kw: object) -> ClientConfig:
    return ClientConfig(job="j", shard=0, shards=1, work_dir=Path("/nonexistent"), tracker_host="h", tracker_port=1,
                        tracker_key="k", servers=1, total_trials=64, trials_per_task=16, **kw)


def test_replay_by_default_and_the_variable_chooses(monkeypatch) -> None:
    monkeypatch.delenv("SHARETUNE_COLD_SEARCH", raising=False)
    assert _cfg().cold_search == "replay"
    assert first_round_search(_cfg(), ms.CostModel.create("random"), 0) == "replay"
    monkeypatch.setenv("SHARETUNE_COLD_SEARCH", "evolutionary")
    assert first_round_search(_cfg(), ms.CostModel.create("random"), 0) is None


def test_an_unknown_search_names_the_variable_and_the_choices() -> None:
    assert check_cold_search("lite") == "lite"
    with pytest.raises(TunerError, match=r"SHARETUNE_COLD_SEARCH='replya'.*evolutionary, replay, lite, short"):
        check_cold_search("replya")


def test_only_a_first_round_ranked_by_noise_is_sampled_at_random() -> None:
    xgb = ms.CostModel.create("xgb", num_tuning_cores=1)
    assert xgb.num_warmup_samples == 100 and xgb.data_size == 0  # TVM's threshold: random scores below it
    replay = _cfg(cold_search="replay")
    assert model_is_cold(xgb) and first_round_search(replay, xgb, 0) == "replay"
    # A task with measurements (a resumed one) evolves from them.
    assert first_round_search(replay, xgb, 16) is None
    xgb.data_size = 100  # the shard's earlier tasks trained it: it ranks now
    assert not model_is_cold(xgb) and first_round_search(replay, xgb, 0) is None
    xgb.data_size = 99
    assert first_round_search(replay, xgb, 0) == "replay"
    assert model_is_cold(ms.CostModel.create("random"))


@pytest.mark.tvm
def test_a_task_tunes_one_random_round_then_evolves(topology: Topology, tmp_path: Path) -> None:
    """A real client (the CLI) on real tasks (llvm, real RPC servers): each task's first round of 4
    by random sampling (all tasks' first rounds first), its other 4 trials by the evolutionary
    search; every trial recorded."""
    job = example_job(tmp_path, trials={"total": 16, "perTask": 8, "perIteration": 4},
                      clients={"shards": 1, "builderWorkers": 1})
    work = tmp_path / "shard-0"
    client = tuner(["client", "--job", str(job), "--shard", "0", "--work-dir", str(work),
                    "--tracker", topology.tracker_addr, "--key", topology.key], tmp_path / "client.log",
                   env={"SHARETUNE_COLD_SEARCH": "replay"})
    assert client.popen.wait(timeout=300) == 0, client.text()[-3000:]
    log = client.text()
    tasks = re.findall(r"task (\S+): (\d+) trials by (\w+) search", log)
    assert [(n, s) for _, n, s in tasks] == [("4", "replay")] * 2 + [("4", "evolutionary")] * 2, log[-3000:]
    assert records.stats(work).total == 16
    progress = json.loads((work / "progress.json").read_text())
    assert "EvoSearch/SampleInitPopulation" in progress["phases"]  # the later rounds evolved


def test_the_strategies() -> None:
    replay = search_strategy(_cfg(), "replay")
    assert isinstance(replay, ms.search_strategy.ReplayTrace)
    assert replay.max_fail_count == 400  # stock 100 left ~7% of the heaviest CUDA conv's slots empty
    evo = search_strategy(_cfg(trials_per_iter=16))
    assert isinstance(evo, ms.search_strategy.EvolutionarySearch) and evo.population_size == 64  # 4 per candidate


def test_lite_keeps_evolution_with_a_population_sized_to_the_batch() -> None:
    lite = _cfg(cold_search="lite", trials_per_iter=16)
    assert first_round_search(lite, ms.CostModel.create("xgb", num_tuning_cores=1), 0) == "lite"
    cold = search_strategy(lite, "lite")
    assert isinstance(cold, ms.search_strategy.EvolutionarySearch)
    # 2 per candidate instead of 4: the same generations over half the population
    assert cold.population_size == 32 and cold.init_min_unmeasured == 16
    assert cold.max_fail_count == 10  # as many draws before giving up as the evolutionary 64 x 5
    assert cold.genetic_num_iters == search_strategy(lite).genetic_num_iters
    assert search_strategy(lite).population_size == 64  # later rounds: the evolutionary sizing


def test_short_keeps_the_population_with_one_generation_while_cold() -> None:
    short = _cfg(cold_search="short", trials_per_iter=16)
    cold = search_strategy(short, "short")
    assert (cold.population_size, cold.genetic_num_iters) == (64, 1)
    assert search_strategy(short).genetic_num_iters == 4  # later rounds: the evolutionary generations


def test_the_evolution_after_the_first_round_takes_its_shape_from_the_variable(monkeypatch) -> None:
    monkeypatch.delenv("SHARETUNE_EVOLUTION", raising=False)
    assert str(_cfg().evolution) == "4x4"  # half stock's population ratio, its generations
    monkeypatch.setenv("SHARETUNE_EVOLUTION", "4x2")
    evo = search_strategy(_cfg(trials_per_iter=16))
    # at least stock's share (~10%) of the population drawn at random: 7 of 64, not half of it
    assert (evo.population_size, evo.genetic_num_iters, evo.init_min_unmeasured) == (64, 2, 7)
    monkeypatch.setenv("SHARETUNE_EVOLUTION", "4x4f50")
    evo = search_strategy(_cfg(trials_per_iter=16))
    assert (evo.population_size, evo.genetic_num_iters, evo.init_min_unmeasured) == (64, 4, 32)
    assert str(_cfg().evolution) == "4x4f50"
    for bad in ("4", "4x4f0", "4x4f", "4x4f101"):
        monkeypatch.setenv("SHARETUNE_EVOLUTION", bad)
        with pytest.raises(TunerError, match=rf"SHARETUNE_EVOLUTION='{bad}' is not PxG\[fN\]: .* e\.g\. 4x4"):
            _cfg()
