"""Statistics for A/B measurements on a device whose speed drifts (heat, clocks, background).

Shared by `kzbuild ab` (what each patch buys) and `kzbuild roll` (the pin against a candidate):
- run order: interleaved blocks, each running every variant once in a seeded random order, so
  that drift spreads over all variants instead of landing on whichever ran last;
- effect: the relative difference of medians, B against A, with a percentile bootstrap interval;
  an interval that excludes 0 is an effect, one within +-the minimum effect of interest is "no
  detectable effect", and any other is too wide to decide (:class:`kzbuild.model.effect.Verdict`).
"""

from __future__ import annotations

import math
import random
import secrets
import statistics
from collections.abc import Sequence
from typing import TypeVar

from kzbuild.model.effect import CONFIDENCE, MIN_EFFECT_PCT, Effect

SEEDS = 2**32  # a seed is below this


def fresh_seed(given: int | None = None) -> int:
    """``given``, else a new random seed (recorded with what it drew, so a run can be replayed)."""
    return given if given is not None else secrets.randbelow(SEEDS)


Variant = TypeVar("Variant")

RESAMPLES = 2000


def interleaved_order(variants: Sequence[Variant], blocks: int, seed: int) -> list[list[Variant]]:
    """``blocks`` blocks, each holding every variant once, each shuffled with one seeded
    generator."""
    if blocks < 1:
        raise ValueError("blocks must be at least 1")
    rng = random.Random(seed)
    order = []
    for _ in range(blocks):
        block = list(variants)
        rng.shuffle(block)
        order.append(block)
    return order


def median_effect(
    a: Sequence[float],
    b: Sequence[float],
    *,
    seed: int = 0,
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
    min_effect_pct: float = MIN_EFFECT_PCT,
) -> Effect:
    """Relative difference of medians (B - A) / A in percent, with a percentile bootstrap interval.

    Samples must be finite and positive (throughputs); each side needs at least one."""
    for name, values in (("A", a), ("B", b)):
        if not values:
            raise ValueError(f"no samples for {name}")
        if not all(math.isfinite(v) and v > 0 for v in values):
            raise ValueError(f"samples for {name} must be finite and above zero")
    rng = random.Random(seed)
    point = _relative(statistics.median(a), statistics.median(b))
    deltas = sorted(
        _relative(
            statistics.median(rng.choices(a, k=len(a))), statistics.median(rng.choices(b, k=len(b)))
        )
        for _ in range(resamples)
    )
    tail = (1 - confidence) / 2
    low = deltas[int(tail * (resamples - 1))]
    high = deltas[int(math.ceil((1 - tail) * (resamples - 1)))]
    return Effect(point, low, high, len(a), len(b), confidence, min_effect_pct)


def _relative(median_a: float, median_b: float) -> float:
    return (median_b - median_a) / median_a * 100.0
