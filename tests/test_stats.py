"""The A/B statistics shared by `kzbuild ab` and `kzbuild roll`."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kzbuild.measure.stats import interleaved_order, median_effect


def test_blocks_hold_every_variant_once_in_a_seeded_order():
    order = interleaved_order(["full", "-a", "-b", "upstream"], blocks=5, seed=7)
    assert len(order) == 5 and all(
        sorted(block) == sorted(["full", "-a", "-b", "upstream"]) for block in order
    )
    assert order == interleaved_order(["full", "-a", "-b", "upstream"], blocks=5, seed=7)
    assert len({tuple(block) for block in order}) > 1  # shuffled per block, not one order repeated


def test_a_real_effect_is_detected_and_its_interval_holds_the_truth():
    rng = random.Random(1)
    a = [100 * rng.uniform(0.97, 1.03) for _ in range(15)]
    b = [110 * rng.uniform(0.97, 1.03) for _ in range(15)]
    effect = median_effect(a, b, seed=3)
    assert effect.detectable and effect.low_pct < 10 < effect.high_pct
    assert 5 < effect.delta_pct < 15
    assert effect.contradicts(-5) and not effect.contradicts(+5)


def test_noise_alone_is_no_detectable_effect_when_the_interval_excludes_the_minimum():
    rng = random.Random(2)
    a = [100 * rng.uniform(0.9, 1.1) for _ in range(9)]
    b = [100 * rng.uniform(0.9, 1.1) for _ in range(9)]
    effect = median_effect(a, b, seed=4, min_effect_pct=15)
    assert not effect.detectable
    assert "no detectable effect" in effect.describe()
    assert "too wide" in median_effect(a, b, seed=4).describe()  # +-10% noise cannot exclude +-2%
    assert not effect.contradicts(10) and not effect.contradicts(-10)


@pytest.mark.parametrize("bad", [[], [0.0], [-1.0], [math.nan], [math.inf]])
def test_bad_samples_are_refused(bad):
    with pytest.raises(ValueError):
        median_effect(bad, [1.0])


@given(
    st.lists(st.floats(0.1, 1e6), min_size=1, max_size=20),
    st.lists(st.floats(0.1, 1e6), min_size=1, max_size=20),
    st.integers(0, 2**32),
)
def test_the_interval_is_ordered_and_within_what_the_samples_allow(a, b, seed):
    effect = median_effect(a, b, seed=seed, resamples=200)
    floor = (min(b) - max(a)) / max(a) * 100
    ceiling = (max(b) - min(a)) / min(a) * 100
    assert floor - 1e-6 <= effect.low_pct <= effect.high_pct <= ceiling + 1e-6
    assert floor - 1e-6 <= effect.delta_pct <= ceiling + 1e-6
