"""The measuring commands' resolver: the command line over the plan over the defaults, once, into
frozen requests; each bad value refused before a device is contacted."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kzbuild.errors import ConfigError, KzError
from kzbuild.measure.request import resolve_ab, resolve_bench
from kzbuild.model.ab import DEFAULT_BLOCKS
from kzbuild.model.interleave import DEFAULT_COOL_WAIT
from kzbuild.model.request import LLAMA_BENCH_FLAGS, AbArgs, BenchArgs

PLAN = """\
description: test plan
model:
  path: models/q.gguf
  sha256: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa
device: pad3
seed: 7
runs:
  - name: prefill
    options: {p: 32, n: 0}
ab: {variants: [upstream], blocks: 3, cool_to: 44.5C, cool_wait: 60, cool_zones: [cpu*]}
"""


@pytest.fixture
def plan_file(tmp_path: Path) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN)
    return path


def test_without_a_plan_the_options_make_one_run_in_llama_benchs_names_and_order():
    request = resolve_bench(
        BenchArgs(model="m.gguf", repetitions="3", prompt="64", dev="HTP0", device="pad1")
    )
    assert request.plan is None and request.device == "pad1"
    [(name, spec)] = request.runs
    assert name == "" and spec.model == "m.gguf"
    assert spec.options == (("p", "64"), ("dev", "HTP0"), ("r", "3"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.device = "other"  # type: ignore[misc]


def test_a_plan_gives_the_runs_and_the_device_unless_the_option_names_one(plan_file):
    request = resolve_bench(BenchArgs(plan_file=plan_file))
    assert request.device == "pad3" and [name for name, _ in request.runs] == ["prefill"]
    assert resolve_bench(BenchArgs(plan_file=plan_file, device="pad1")).device == "pad1"


def test_a_plan_refuses_each_bench_option_beside_it_naming_them_all(plan_file):
    args = BenchArgs(plan_file=plan_file, model="m", gen="8", sweep=("t=1,2",), cooldown=1.0)
    with pytest.raises(ConfigError) as refused:
        resolve_bench(args)
    assert "-n, -m, --sweep, --cooldown cannot be given with it" in refused.value.message


def test_ab_takes_the_option_over_the_plan_over_the_default(plan_file):
    from_plan = resolve_ab(BenchArgs(plan_file=plan_file), AbArgs(), default_target="host")
    assert (from_plan.blocks, from_plan.seed, from_plan.selection) == (3, 7, ("upstream",))
    assert from_plan.cooling is not None and from_plan.cooling.limit_c == 44.5
    assert (from_plan.cooling.max_wait_s, from_plan.cooling.zones) == (60, ("cpu*",))
    assert from_plan.target == "host" and from_plan.bench.device == "pad3"

    given = resolve_ab(
        BenchArgs(plan_file=plan_file, seed=11),  # ab's --seed goes with a plan
        AbArgs(target="linux-arm64", variants=("minus",), blocks=9, cool_to="40", cool_wait=5),
        default_target="host",
    )
    assert (given.blocks, given.seed, given.selection, given.target) == (
        9,
        11,
        ("minus",),
        "linux-arm64",
    )
    assert given.cooling is not None and given.cooling.limit_c == 40.0
    assert given.cooling.max_wait_s == 5 and given.cooling.zones == ("cpu*",)

    bare = resolve_ab(BenchArgs(model="m"), AbArgs(), default_target="host")
    assert (bare.blocks, bare.seed, bare.cooling, bare.quality) == (
        DEFAULT_BLOCKS,
        None,
        None,
        None,
    )
    [(_, spec)] = bare.bench.runs
    assert spec.seed is None  # --seed orders ab's blocks, not its sweep
    warm = resolve_ab(BenchArgs(model="m"), AbArgs(cool_to="45C"), default_target="host")
    assert warm.cooling is not None and warm.cooling.max_wait_s == DEFAULT_COOL_WAIT
    assert warm.cooling.zones == ("*",)


def test_ab_refuses_a_bad_variant_or_temperature_before_any_work():
    with pytest.raises(ConfigError):
        resolve_ab(BenchArgs(model="m"), AbArgs(variants=("sideways",)), default_target="host")
    with pytest.raises(ConfigError):
        resolve_ab(BenchArgs(model="m"), AbArgs(cool_to="warm"), default_target="host")


@given(
    st.sampled_from(sorted(LLAMA_BENCH_FLAGS)),
    st.text(min_size=1, max_size=12),
    st.lists(st.text(max_size=12), max_size=2),
)
def test_any_option_value_or_sweep_is_a_request_or_a_kzbuild_error(option, value, sweep):
    try:
        request = resolve_bench(BenchArgs(model="m", sweep=tuple(sweep), **{option: value}))
    except KzError:
        return
    [(_, spec)] = request.runs
    assert (LLAMA_BENCH_FLAGS[option], value) in spec.options


def test_a_roll_takes_its_blocks_and_seed_from_the_plan_else_the_defaults(plan_file):
    from kzbuild.measure.request import resolve_roll
    from kzbuild.model.request import RollArgs
    from kzbuild.model.roll import DEFAULT_BLOCKS as ROLL_BLOCKS

    benched = resolve_roll(RollArgs(plan_target="none", plan_file=plan_file, to=("b1234",)))
    assert benched.plan is not None and (benched.blocks, benched.seed) == (3, 7)
    assert benched.plan_target is None and benched.to == ("b1234",)
    bare = resolve_roll(RollArgs(plan_target="v79"))
    assert bare.plan is None and bare.blocks == ROLL_BLOCKS and bare.plan_target == "v79"
    assert isinstance(bare.seed, int)  # drawn here, so the report names it


def test_a_bisect_takes_its_target_device_and_seed_from_the_options_else_the_plan(plan_file):
    from kzbuild.measure.request import resolve_bisect
    from kzbuild.model.bisect import KLD, BisectLimits
    from kzbuild.model.request import BisectArgs

    planned = resolve_bisect(BisectArgs(plan_file=plan_file), "host")
    assert (planned.target, planned.device, planned.seed) == ("host", "pad3", 7)
    assert planned.metric.run == "prefill" and planned.spec.model == "models/q.gguf"
    assert planned.limits == BisectLimits() and len(planned.plan_digest) == 64
    given_ = resolve_bisect(
        BisectArgs(plan_file=plan_file, metric="kld:0.5", target="v79", device="pads", seed=0),
        "host",
    )
    assert (given_.target, given_.device, given_.seed) == ("v79", "pads", 0)
    assert given_.metric.kind == KLD and given_.metric.kld_step == 0.5
    assert (given_.limits.samples_per_round, given_.limits.max_samples) == (1, 1)
    with pytest.raises(ConfigError, match="the plan has no run 'decode'"):
        resolve_bisect(BisectArgs(plan_file=plan_file, metric="decode"), "host")
    with pytest.raises(ConfigError, match="minimum effect"):
        resolve_bisect(BisectArgs(plan_file, limits=BisectLimits(min_effect_pct=0)), "host")
