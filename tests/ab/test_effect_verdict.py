"""What an A/B interval may claim (issue 30): an effect, "no detectable effect" only when the
interval excludes the plan's minimum effect of interest, else "too wide to decide"; the plan's
min_effect_pct / max_width_pct / max_seconds; when ab adds blocks. Seeded synthetic samples."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kzbuild.errors import ConfigError
from kzbuild.measure.ab import check_expectations, more_blocks
from kzbuild.measure.plans import load_plan
from kzbuild.measure.stats import median_effect
from kzbuild.model.ab import PatchEffect
from kzbuild.model.effect import MIN_EFFECT_PCT, Effect, EffectVerdict
from kzbuild.model.patch import Expectation

PLAN = """\
model:
  path: models/q.gguf
  sha256: null
runs:
  - name: prefill
    options: {{p: 32, n: 0}}
ab:
{ab}
"""


def samples(seed: int, centre: float, noise: float, n: int) -> list[float]:
    rng = random.Random(seed)
    return [centre * (1 + rng.gauss(0, noise)) for _ in range(n)]


def test_the_issue_s_noise_is_too_wide_to_decide_not_no_effect():
    # the same binary ranged from 8,148 to 54,543 t/s: a spread no effect can be read from
    rng = random.Random(30)
    a, b = (
        [rng.uniform(8148, 54543) for _ in range(5)],
        [rng.uniform(8148, 54543) for _ in range(5)],
    )
    effect = median_effect(a, b, seed=1)
    assert not effect.detectable and effect.width_pct > 50
    assert effect.verdict is EffectVerdict.UNDECIDED
    assert "no detectable effect" not in effect.describe() and "too wide" in effect.describe()


def test_a_narrow_null_interval_is_no_detectable_effect_and_names_the_minimum():
    effect = median_effect(samples(1, 100, 0.005, 30), samples(2, 100, 0.005, 30), seed=3)
    assert -MIN_EFFECT_PCT < effect.low_pct <= effect.high_pct < MIN_EFFECT_PCT
    assert effect.verdict is EffectVerdict.NONE
    assert (
        effect.describe().startswith("no detectable effect")
        and f"+-{MIN_EFFECT_PCT:g}%" in effect.describe()
    )
    # the same samples, asked about an effect of 0.1%: the interval no longer excludes it
    strict = median_effect(
        samples(1, 100, 0.005, 30), samples(2, 100, 0.005, 30), seed=3, min_effect_pct=0.1
    )
    assert strict.verdict is EffectVerdict.UNDECIDED


def test_an_interval_that_excludes_zero_is_an_effect():
    effect = median_effect(samples(4, 100, 0.03, 12), samples(5, 120, 0.03, 12), seed=6)
    assert effect.verdict is EffectVerdict.EFFECT and effect.describe().startswith("+")


@given(low=st.floats(-50, 50), width=st.floats(0, 100), minimum=st.floats(0.01, 20))
def test_the_verdict_follows_the_interval(low: float, width: float, minimum: float):
    effect = Effect(low + width / 2, low, low + width, 5, 5, min_effect_pct=minimum)
    if low > 0 or low + width < 0:
        assert effect.verdict is EffectVerdict.EFFECT
    elif -minimum < low and low + width < minimum:
        assert effect.verdict is EffectVerdict.NONE
    else:
        assert effect.verdict is EffectVerdict.UNDECIDED and "too wide" in effect.describe()


def patch_effect(effect: Effect) -> PatchEffect:
    return PatchEffect(
        variant="minus:p.patch",
        patch="p.patch",
        test="pp32",
        config="",
        full_median=100.0,
        variant_median=100.0,
        effect=effect,
        device="box",
    )


def test_a_declared_effect_measured_too_widely_is_undecided_not_unconfirmed():
    wide, narrow = Effect(1.0, -40.0, 60.0, 3, 3), Effect(0.1, -0.5, 0.8, 30, 30)
    expectation = Expectation(patch="p.patch", metric="pp32", pct=10.0, device="box", line=1)
    (check,) = check_expectations([expectation], [patch_effect(wide)], ["box"])
    assert check.verdict == "undecided (interval too wide)"
    (check,) = check_expectations([expectation], [patch_effect(narrow)], ["box"])
    assert check.verdict == "no detectable effect"


def test_more_blocks_run_while_an_interval_is_wider_than_the_plan_s_width_and_time_is_left():
    wide, narrow = (
        [patch_effect(Effect(1.0, -10.0, 12.0, 3, 3))],
        [patch_effect(Effect(1.0, -1.0, 2.0, 9, 9))],
    )
    assert more_blocks(wide, 5.0, 60.0, spent=10.0)
    assert not more_blocks(narrow, 5.0, 60.0, spent=10.0)  # narrow enough
    assert not more_blocks(wide, 5.0, 60.0, spent=61.0)  # out of time
    assert not more_blocks(wide, None, None, spent=0.0)  # no width set: the given blocks only
    assert more_blocks(wide, 5.0, None, spent=1e6)  # no time limit: bounded by MAX_BLOCKS in run_ab


def test_the_plan_sets_the_minimum_effect_and_the_adaptive_width(tmp_path: Path):
    path = tmp_path / "p.yaml"
    path.write_text(
        PLAN.format(ab="  blocks: 4\n  min_effect_pct: 1.5\n  max_width_pct: 3\n  max_seconds: 900")
    )
    plan = load_plan(path)
    assert (plan.ab.min_effect_pct, plan.ab.max_width_pct, plan.ab.max_seconds) == (1.5, 3.0, 900.0)
    path.write_text(PLAN.format(ab="  blocks: 4"))
    assert (load_plan(path).ab.min_effect_pct, load_plan(path).ab.max_width_pct) == (
        MIN_EFFECT_PCT,
        None,
    )


@settings(max_examples=60, deadline=None)
@given(
    key=st.sampled_from(["min_effect_pct", "max_width_pct"]),
    value=st.one_of(
        st.floats(allow_nan=True), st.integers(-10, 2000), st.booleans(), st.text(max_size=5)
    ),
)
def test_a_plan_s_percentages_load_or_name_file_line_and_key(
    tmp_path_factory: pytest.TempPathFactory, key: str, value: object
):
    path = tmp_path_factory.mktemp("plan") / "p.yaml"
    path.write_text(
        PLAN.format(
            ab=f"  {key}: {value!r}" if not isinstance(value, str) else f"  {key}: {value!r}"
        )
    )
    try:
        plan = load_plan(path)
    except ConfigError as exc:
        text = str(exc) + str(exc.path or "")
        assert "p.yaml" in text or key in text
        return
    got = getattr(plan.ab, key)
    assert got is None or 0 < got <= 1000


NOISY = (
    "#include <unistd.h>\n"
    "double ggml_speed(void) {\n    return 100.0 * (0.5 + (getpid() % 97) / 97.0);\n}\n"
)


def test_ab_adds_blocks_while_an_interval_is_too_wide_until_the_time_limit(
    kz, bench_tiny, tmp_path: Path
):
    import hashlib

    root = tmp_path / "device"
    (root / "models").mkdir(parents=True)
    (root / "models" / "q.gguf").write_bytes(b"GGUF stand-in")
    bench_tiny.add_patch(
        "noisy.patch", {"ggml/src/ggml.c": NOISY}, "ggml: a speed that varies run to run"
    )
    sha = hashlib.sha256(b"GGUF stand-in").hexdigest()
    plan = tmp_path / "plan.yaml"
    base = (
        f"model: {{path: models/q.gguf, sha256: {sha}}}\ndevice: local:{root}\n"
        "repetitions: 1\nseed: 11\n"
        "runs:\n  - {name: one, options: {t: 1}}\n"
    )
    plan.write_text(
        base + "ab: {variants: [upstream], blocks: 2, max_width_pct: 1, max_seconds: 2}\n"
    )
    result = kz("ab", "tiny", "--plan", str(plan), "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    seeds = [r["seed"] for r in report["runs"]]
    assert len(seeds) >= 2 and seeds == list(
        range(11, 11 + len(seeds))
    )  # one batch of 2 blocks per seed
    (effect,) = report["effects"]
    assert effect["effect"]["samples_a"] == 2 * len(seeds)
    shown = kz("ab", "tiny", "--plan", str(plan), "--markdown")
    assert "undecided" in shown.out and "no detectable effect" not in shown.out
    plan.write_text(
        base + "ab: {variants: [upstream], blocks: 2}\n"
    )  # no width: the blocks given, once
    once = json.loads(kz("ab", "tiny", "--plan", str(plan), "--json").out)
    assert [r["seed"] for r in once["runs"]] == [11]
