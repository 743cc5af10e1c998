"""Which MPS share to tune at for a given serving share (``spec.servers.servingPercentage``).

A model is tuned on servers that see ``threadPercentage`` of the GPU's SMs and later served by a
process that sees ``servingPercentage`` of them. When a job names only its serving share, the
tuning servers use the share below, measured on the H200 (pure table: no TVM, no kopf).

Source: bench/results/h200-quality-matrix.json, key "recommended" (written by
bench/h200/summarize.py): ResNet-18, its 6 heaviest tasks x 16 trials, tuned at P_t in
{10, 25, 50, 75, 100} (12 runs) and served at P_s in {10, 25, 50, 75, 100} under one MPS daemon on
one H200. Each run's latency is divided by its own latency at P_s=100 (the "shape": how its
schedules tolerate a smaller share; the absolute level differs more between seeds than between
tuning shares), geometric mean per P_t; for each P_s the P_t with the smallest slowdown (within
0.5%, the one nearest P_s). At P_s=100 the normalisation makes every P_t equal: tune at 100.
"""

from __future__ import annotations

# serving share P_s -> tuning share P_t (h200-quality-matrix.json recommended.tuning_pct_by_serving_pct)
TUNING_PCT_BY_SERVING_PCT: dict[int, int] = {10: 10, 25: 25, 50: 25, 75: 25, 100: 100}
# the one share with the smallest worst-case slowdown over every measured P_s, and that slowdown
# (recommended.recommended_tuning_pct / worst_case_slowdown)
DEFAULT_TUNING_PCT = 25
DEFAULT_WORST_CASE_SLOWDOWN = 1.0063
SOURCE = "bench/results/h200-quality-matrix.json"


def tuning_pct_for(serving_pct: int) -> int:
    """The tuning share for a serving share in [1, 100]: the entry of the nearest measured serving
    share (between two, the one closer; no integer is equally far from two of them)."""
    if not 1 <= serving_pct <= 100:
        raise ValueError(f"serving percentage {serving_pct} is outside [1, 100]")
    nearest = min(TUNING_PCT_BY_SERVING_PCT, key=lambda p: (abs(p - serving_pct), p))
    return TUNING_PCT_BY_SERVING_PCT[nearest]
