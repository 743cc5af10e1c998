"""`sharetune-tuner client`, restricted to the model's K heaviest tasks (env BENCH_TASKS).

The benchmark tunes the same task subset in both arms; everything else (partition, budgets,
builder, runner, search, cost model) is the unmodified sharetune client.
"""

from __future__ import annotations

import os
import sys

import sharetune_tuner.client as client
from common import heaviest

_extract = client.extract


def _k_heaviest(mod, target):
    return heaviest(_extract(mod, target), int(os.environ["BENCH_TASKS"]))


client.extract = _k_heaviest

# Sweep knob (BENCH_POP_PER_CAND): the evolutionary population per candidate of a batch, with
# the default generations: the client's own SHARETUNE_EVOLUTION. Unset = the client's default.
if os.environ.get("BENCH_POP_PER_CAND"):
    os.environ["SHARETUNE_EVOLUTION"] = f"{int(os.environ['BENCH_POP_PER_CAND'])}x{client.Evolution().generations}"

# Sweep knob (BENCH_COLD_SEARCH=replay|lite|short|evolutionary): the client's search while its cost model is
# cold, in a task's first round (client.first_round_search); unset = the client's default (replay).
if os.environ.get("BENCH_COLD_SEARCH"):
    os.environ["SHARETUNE_COLD_SEARCH"] = os.environ["BENCH_COLD_SEARCH"]

if __name__ == "__main__":
    from sharetune_tuner.cli import main

    sys.exit(main(sys.argv[1:]))
