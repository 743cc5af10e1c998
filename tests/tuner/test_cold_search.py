"""While MetaSchedule's cost model cannot rank candidates, the client can sample the batch at random
instead of evolving a population by noise (client.cold_search_applies, SHARETUNE_COLD_SEARCH; by
default replay on CUDA, evolutionary elsewhere). Real cost models, real search strategies; the
quality side (candidates as fast) is measured on the H200 (bench/h200/search_quality.py,
docs/benchmarks.md)."""

from __future__ import annotations

from pathlib import Path

from tvm.s_tir import meta_schedule as ms

import pytest

from sharetune_tuner.client import ClientConfig, cold_search_applies, resolve_cold_search, search_strategy
from sharetune_tuner.errors import TunerError


def _cfg(**kw: object) -> ClientConfig:
    return ClientConfig(job="j", shard=0, shards=1, work_dir=Path("/nonexistent"), tracker_host="h", tracker_port=1,
                        tracker_key="k", servers=1, total_trials=64, trials_per_task=16, **kw)  # type: ignore[arg-type]


def test_the_default_follows_the_target(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("SHARETUNE_COLD_SEARCH", raising=False)
    assert _cfg().cold_search == "auto"
    # Measured on CUDA only (bench/results/h200-search-quality.json): CPU targets keep stock search.
    assert resolve_cold_search("auto", "cuda") == "replay"
    assert resolve_cold_search("auto", "llvm") == "evolutionary"
    assert resolve_cold_search("evolutionary", "cuda") == "evolutionary"
    assert resolve_cold_search("lite", "llvm") == "lite"
    auto_llvm = _cfg(cold_search=resolve_cold_search("auto", "llvm"))
    assert not cold_search_applies(auto_llvm, ms.CostModel.create("random"), 16)
    monkeypatch.setenv("SHARETUNE_COLD_SEARCH", "replay")
    assert cold_search_applies(_cfg(), ms.CostModel.create("random"), 16)


def test_an_unknown_search_names_the_variable_and_the_choices() -> None:
    with pytest.raises(TunerError, match=r"SHARETUNE_COLD_SEARCH='replya'.*auto, evolutionary, replay, lite, short"):
        resolve_cold_search("replya", "cuda")


def test_a_cold_xgb_model_gets_random_sampling_until_it_can_rank() -> None:
    xgb = ms.CostModel.create("xgb", num_tuning_cores=1)
    assert xgb.num_warmup_samples == 100 and xgb.data_size == 0  # TVM's threshold: random scores below it
    replay = _cfg(cold_search="replay")
    assert cold_search_applies(replay, xgb, 16)
    assert cold_search_applies(replay, xgb, 100)
    # A task whose later rounds will be ranked by a trained model keeps the evolutionary search.
    assert not cold_search_applies(replay, xgb, 101)
    xgb.data_size = 90  # measurements of the shard's earlier tasks count
    assert not cold_search_applies(replay, xgb, 16)
    assert cold_search_applies(replay, ms.CostModel.create("random"), 10_000)
    assert not cold_search_applies(_cfg(cold_search="evolutionary"), ms.CostModel.create("random"), 16)


def test_the_strategies() -> None:
    replay = search_strategy(_cfg(cold_search="replay"), cold=True)
    assert isinstance(replay, ms.search_strategy.ReplayTrace)
    assert replay.max_fail_count == 400  # stock 100 left ~7% of the heaviest CUDA conv's slots empty
    evo = search_strategy(_cfg(trials_per_iter=16))
    assert isinstance(evo, ms.search_strategy.EvolutionarySearch) and evo.population_size == 128


def test_lite_keeps_evolution_with_a_population_sized_to_the_batch() -> None:
    lite = _cfg(cold_search="lite", trials_per_iter=16)
    assert cold_search_applies(lite, ms.CostModel.create("xgb", num_tuning_cores=1), 16)
    cold = search_strategy(lite, cold=True)
    assert isinstance(cold, ms.search_strategy.EvolutionarySearch)
    # 2 per candidate instead of 8: the same generations over a quarter of the population
    assert cold.population_size == 32 and cold.init_min_unmeasured == 16
    assert cold.max_fail_count == 20  # as many draws before giving up as the stock 128 x 5
    assert cold.genetic_num_iters == search_strategy(lite).genetic_num_iters
    assert search_strategy(lite, cold=False).population_size == 128  # once the model ranks: stock sizing


def test_short_keeps_the_population_with_one_generation_while_cold() -> None:
    short = _cfg(cold_search="short", trials_per_iter=16)
    cold = search_strategy(short, cold=True)
    assert (cold.population_size, cold.genetic_num_iters) == (128, 1)
    assert search_strategy(short, cold=False).genetic_num_iters == 4  # once the model ranks: stock
