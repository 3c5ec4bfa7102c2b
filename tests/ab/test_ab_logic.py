"""kzbuild ab's pure logic: variants, effects per patch, Kz-Expect verdicts, the markdown table and
plot;
and the statistics the issue asks of it, on synthetic samples."""

from __future__ import annotations

import dataclasses
import random
import struct

import pytest

from kzbuild.errors import ConfigError
from kzbuild.measure import ab
from kzbuild.measure.stats import interleaved_order, median_effect
from kzbuild.model.ab import VariantBuild, VariantSpec
from kzbuild.model.patch import Expectation
from kzbuild.model.result import VariantInfo
from tests.bench.benchkit import record

SERIES = ["backport.patch", "a.patch", "b.patch"]


# --- variants ---
def test_variants_are_the_full_stack_the_stack_without_each_live_patch_and_upstream():
    specs = ab.variant_specs(
        SERIES, ["a.patch", "b.patch"]
    )  # backport.patch: upstreamed at the pin, not live
    assert [(s.name, s.patches, s.without) for s in specs] == [
        ("full", ("backport.patch", "a.patch", "b.patch"), None),
        ("minus:a.patch", ("backport.patch", "b.patch"), "a.patch"),
        ("minus:b.patch", ("backport.patch", "a.patch"), "b.patch"),
        ("upstream", (), None),
    ]
    assert [s.slug for s in specs] == ["full", "minus-a", "minus-b", "upstream"]
    assert VariantSpec("minus:dir/x.patch", (), "dir/x.patch").slug == "minus-dir--x"


def test_a_selection_keeps_the_full_stack_and_names_unknown_variants():
    assert [s.name for s in ab.variant_specs(SERIES, ["a.patch", "b.patch"], ["upstream"])] == [
        "full",
        "upstream",
    ]
    assert [s.name for s in ab.variant_specs(SERIES, ["a.patch", "b.patch"], ["minus"])] == [
        "full",
        "minus:a.patch",
        "minus:b.patch",
    ]
    with pytest.raises(ConfigError, match="there is no variant 'minus:backport.patch'") as caught:
        ab.variant_specs(SERIES, ["a.patch", "b.patch"], ["minus:backport.patch"])
    assert "minus:a.patch" in (caught.value.hint or "")
    ab.check_selection(["full", "upstream", "minus", "minus:x.patch"])
    for bad in ("minus:", "everything", "Full"):
        with pytest.raises(ConfigError, match="there is no variant"):
            ab.check_selection([bad])


# --- effects and expectations ---
def turns(
    variant: str,
    speeds: list[float],
    *,
    test: str = "pp512",
    config: dict[str, object] | None = None,
) -> list:  # type: ignore[type-arg]
    """One record per block, as run_interleaved stores them (each with its own three samples)."""
    return [
        dataclasses.replace(
            record(
                run_id="ab1",
                build_id=f"b-{variant}",
                test=test,
                samples=(s * 0.99, s, s * 1.01),
                config=config,
                seq=block,
            ),
            variant=VariantInfo(name=variant, block=block, blocks=len(speeds), seed=1),
        )
        for block, s in enumerate(speeds)
    ]


SPECS = [
    VariantSpec("full", ("a.patch", "b.patch")),
    VariantSpec("minus:a.patch", ("b.patch",), "a.patch"),
    VariantSpec("upstream", ()),
]


def test_each_patch_gets_the_full_stacks_median_against_the_variants_per_test_and_configuration():
    records = {
        "full": turns("full", [110, 111, 109, 110])
        + turns("full", [20, 20.2, 19.8, 20], test="tg64"),
        "minus:a.patch": turns("minus:a.patch", [100, 101, 99, 100])
        + turns("minus:a.patch", [20.1, 19.9, 20, 20], test="tg64"),
        "upstream": turns("upstream", [90, 91, 89, 90]),
    }
    found = {(e.variant, e.test): e for e in ab.effects(records, SPECS, seed=1)}
    assert set(found) == {
        ("minus:a.patch", "pp512"),
        ("minus:a.patch", "tg64"),
        ("upstream", "pp512"),
    }  # upstream ran no tg64
    pp = found[("minus:a.patch", "pp512")]
    assert pp.patch == "a.patch" and pp.full_median == 110 and pp.variant_median == 100
    assert (
        pp.effect.delta_pct == pytest.approx(10.0)
        and pp.effect.detectable
        and pp.effect.samples_a == pp.effect.samples_b == 4
    )
    assert pp.config == "t=8 ngl=99 b=512"
    assert not found[("minus:a.patch", "tg64")].effect.detectable
    assert found[("upstream", "pp512")].patch is None and found[
        ("upstream", "pp512")
    ].effect.delta_pct == pytest.approx(100 * 20 / 90)


def test_configurations_are_never_mixed():
    records = {
        "full": turns("full", [110, 110], config={"n_ubatch": 128})
        + turns("full", [50, 50], config={"n_ubatch": 512}),
        "minus:a.patch": turns("minus:a.patch", [100, 100], config={"n_ubatch": 128})
        + turns("minus:a.patch", [50, 50], config={"n_ubatch": 512}),
    }
    found = sorted((e.config, round(e.effect.delta_pct, 6)) for e in ab.effects(records, SPECS[:2]))
    assert found == [("ub=128", 10.0), ("ub=512", 0.0)]


def expectation(
    pct: float, *, metric: str = "pp512", device: str = "pad3", patch: str = "a.patch"
) -> Expectation:
    return Expectation(patch=patch, metric=metric, pct=pct, device=device, line=9)


def test_expectations_are_confirmed_contradicted_undetected_unmeasured_or_for_another_device():
    records = {
        "full": turns("full", [110, 111, 109, 110]),
        "minus:a.patch": turns("minus:a.patch", [100, 101, 99, 100]),
    }
    measured = ab.effects(records, SPECS[:2])
    declared = [
        expectation(+10),
        expectation(-5),
        expectation(+10, metric="tg64"),
        expectation(+10, device="pad4"),
        expectation(+3, patch="b.patch"),
    ]
    verdicts = [c.verdict for c in ab.check_expectations(declared, measured, ["pad3"])]
    assert verdicts == ["confirmed", "contradicted", "not measured", "other device", "not measured"]
    flat = {
        "full": turns("full", [100, 104, 96, 100]),
        "minus:a.patch": turns("minus:a.patch", [101, 97, 103, 100]),
    }
    (check,) = ab.check_expectations([expectation(+10)], ab.effects(flat, SPECS[:2]), ["pad3"])
    # +-4% noise on 4 turns cannot exclude +-2%
    assert check.verdict == "undecided (interval too wide)"
    wide_minimum = ab.effects(flat, SPECS[:2], min_effect_pct=10)
    (check,) = ab.check_expectations([expectation(+10)], wide_minimum, ["pad3"])
    assert (
        check.verdict == "no detectable effect"
        and "a.patch: Kz-Expect pp512 +10% on pad3: no detectable effect" in check.describe
    )


def test_the_markdown_table_names_each_patch_unbuildable_variants_and_verdicts(tmp_path):
    records = {
        "full": turns("full", [110, 111, 109]),
        "minus:a.patch": turns("minus:a.patch", [100, 101, 99]),
    }
    measured = ab.effects(records, SPECS[:2])
    variants = [
        VariantBuild(SPECS[0], "host-1", True),
        VariantBuild(SPECS[1], None, False, problem="patch b.patch does not apply"),
    ]
    text = ab.markdown(
        measured, variants, ab.check_expectations([expectation(+5)], measured, ["pad3"])
    )
    lines = text.splitlines()
    assert lines[0].startswith("| patch | test | configuration | full stack t/s | without it t/s |")
    assert lines[2].startswith(
        "| a.patch | pp512 | t=8 ngl=99 b=512 | 110.00 | 100.00 | +10.0% (95% interval ["
    )
    assert "**minus:a.patch could not be built:** patch b.patch does not apply" in text
    assert "| a.patch | pp512 +5% on pad3 | confirmed |" in text
    png = ab.plot_effects(measured, tmp_path / "out" / "ab.png")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24])[0] > 300
    with pytest.raises(ConfigError, match="nothing to plot"):
        ab.plot_effects([], tmp_path / "none.png")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match="cannot write the plot to") as caught:
        ab.plot_effects(measured, tmp_path / "a-file" / "ab.png")  # its folder is a file
    assert caught.value.hint == "--plot names a PNG file in a writable folder"


# --- the statistics, on synthetic samples (what the issue asks) ---
def noisy(rng: random.Random, level: float, n: int, noise: float = 0.03) -> list[float]:
    return [level * rng.gauss(1.0, noise) for _ in range(n)]


def test_a_20_percent_effect_with_realistic_noise_is_flagged_with_an_interval_that_excludes_0():
    rng = random.Random(20)
    effect = median_effect(noisy(rng, 100, 8), noisy(rng, 120, 8), seed=1)
    assert effect.detectable and effect.low_pct > 0 and effect.low_pct < 20 < effect.high_pct


def test_a_null_effect_is_flagged_in_at_most_10_percent_of_200_seeded_trials():
    flagged = sum(
        median_effect(
            noisy(random.Random(t), 100, 8),
            noisy(random.Random(10_000 + t), 100, 8),
            seed=t,
            resamples=500,
        ).detectable
        for t in range(200)
    )
    assert flagged <= 20, (
        flagged
    )  # 5 of 200 (2.5%) with these seeds; 2.5-6.5% for 5 to 15 turns per variant


def drifting_device(
    order: list[list[str]], truth: dict[str, float], drift_per_turn: float, seed: int
) -> dict[str, list[float]]:
    """Speeds measured in ``order`` on a device that gets slower by ``drift_per_turn`` each turn
    (heat)."""
    rng = random.Random(seed)
    measured: dict[str, list[float]] = {name: [] for name in truth}
    for turn, name in enumerate(name for block in order for name in block):
        measured[name].append(truth[name] * (1 - drift_per_turn * turn) * rng.gauss(1.0, 0.005))
    return measured


def test_linear_drift_is_no_effect_under_interleaving_but_shows_as_one_under_sequential_runs():
    truth = {"full": 100.0, "minus:a.patch": 100.0}  # the patch changes nothing
    interleaved = drifting_device(
        interleaved_order(list(truth), blocks=10, seed=3), truth, drift_per_turn=0.01, seed=1
    )
    sequential = drifting_device(
        [["full"]] * 10 + [["minus:a.patch"]] * 10, truth, drift_per_turn=0.01, seed=1
    )
    assert not median_effect(interleaved["minus:a.patch"], interleaved["full"], seed=1).detectable
    by_order = median_effect(sequential["minus:a.patch"], sequential["full"], seed=1)
    assert by_order.detectable and by_order.delta_pct > 8  # the drift, read as the patch's effect
