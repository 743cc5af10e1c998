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


def _k_heaviest(mod, target):  # type: ignore[no-untyped-def]
    return heaviest(_extract(mod, target), int(os.environ["BENCH_TASKS"]))


client.extract = _k_heaviest

if __name__ == "__main__":
    from sharetune_tuner.cli import main

    sys.exit(main(sys.argv[1:]))
