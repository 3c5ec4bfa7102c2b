"""kzbuild profile, one statistic everywhere (issue 30): each repetition's op times and walls come
from one graph run; the report shows the repetition of median timed wall with each op's spread,
and a phase whose repetitions disagree gets no ranking. Constructed repetitions, one preempted."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kzbuild.errors import BadRecord
from kzbuild.measure import profiling
from kzbuild.model.profile import OpTime, PhaseProfile, ProfileRecord
from kzbuild.model.result import BuildInfo, DeviceInfo, ModelInfo
from tests.bench.benchkit import flat

# the prefill: walls 2075, 11030, 1882 us; the preempted repetition 2 inflates every op
PREEMPTED = (2075.0, 11030.0, 1882.0)
STEADY = (2075.0, 2120.0, 1990.0)


def phase(walls: tuple[float, ...]) -> PhaseProfile:
    scale = [w / 2000.0 for w in walls]  # each repetition's ops scale with its own run
    ops = (
        ("MUL_MAT", 0, 900.0),
        ("GATED_DELTA_NET", 0, 500.0),
        ("MUL", 0, 150.0),
        ("MUL_MAT", 1, 100.0),
    )
    rows = tuple(
        OpTime(op, "CPU", layer, 3 * 2, sum(us * s for s in scale), tuple(us * s for s in scale))
        for op, layer, us in ops
    )
    return PhaseProfile(
        "prefill", 64, rows, wall_us_plain=tuple(w * 0.85 for w in walls), wall_us_timed=walls
    )


def record(run_id: str, walls: tuple[float, ...]) -> ProfileRecord:
    return ProfileRecord(
        run_id=run_id,
        host_time=f"2026-12-04T00:00:0{run_id[-1]}+00:00",
        build=BuildInfo(build_id="host-1", recipe="demo-host"),
        device=DeviceInfo(name="local"),
        model=ModelInfo(path="models/tiny.gguf", sha256="a" * 64),
        config={"n_prompt": 64, "n_gen": 0, "reps": len(walls)},
        graph=(phase(walls),),
    )


def test_the_ops_and_walls_shown_are_one_repetition_s_and_add_up():
    for walls in (PREEMPTED, STEADY):
        shown = phase(walls)
        rep = profiling.median_rep(shown)
        assert rep == 0  # 2075 us is the median of both
        graph, plain, timed = profiling.phase_times(shown, 3)
        assert (
            graph == pytest.approx(shown.rep_usec(0))
            and timed == walls[0]
            and plain == pytest.approx(walls[0] * 0.85)
        )
        assert graph <= timed  # the sum of one run's ops never exceeds that run's wall
        rows = profiling.summarize(shown, reps=3)
        assert [r.op for r in rows] == ["MUL_MAT", "GATED_DELTA_NET", "MUL"]
        assert (
            rows[0].usec == pytest.approx(1000.0 * 2075 / 2000) and rows[0].count == 4
        )  # 2 nodes a run in each of 2 layers
        assert sum(r.share for r in rows) == pytest.approx(1.0)


def test_the_preempted_repetition_shows_in_each_op_s_spread_and_flags_the_phase():
    preempted, steady = phase(PREEMPTED), phase(STEADY)
    assert profiling.disagrees(preempted) and not profiling.disagrees(steady)
    assert profiling.wall_spread_pct(preempted) == pytest.approx((11030 - 1882) / 2075 * 100)
    assert all(
        r.spread_pct == pytest.approx((11030 - 1882) / 2075 * 100)
        for r in profiling.summarize(preempted, reps=3)
    )
    assert all(
        r.spread_pct == pytest.approx((2120 - 1990) / 2075 * 100)
        for r in profiling.summarize(steady, reps=3)
    )
    assert not profiling.disagrees(preempted, max_spread_pct=500.0)


def test_show_prints_no_ranking_for_disagreeing_repetitions(kz, project):
    store = profiling.ProfileStore(project.root / "results")
    store.add(record("20261204-000000-aaa1", PREEMPTED))
    store.add(record("20261204-000000-aaa2", STEADY))
    bad = kz("profile", "--show", "20261204-000000-aaa1")
    assert bad.code == 0, bad.err
    text = flat(bad.out + bad.err)
    assert "repetitions disagree" in text and "2075, 11030, 1882" in text and "MUL_MAT" not in text
    as_json = json.loads(kz("profile", "--show", "20261204-000000-aaa1", "--json").out)["summary"][
        "graph"
    ][0]
    assert (
        as_json["repetitions_disagree"] is True
        and as_json["ops"] == []
        and as_json["repetition"] == 0
    )
    good = kz("profile", "--show", "20261204-000000-aaa2")
    text = flat(good.out + good.err)
    assert (
        "MUL_MAT" in text
        and "spread" in text
        and "repetition 1 of 3, the median timed wall" in text
    )
    assert "graph time 1.712 ms" in text  # 1712 us: repetition 1's ops, under its 2.075 ms wall
    loose = kz("profile", "--show", "20261204-000000-aaa1", "--max-spread", "1000")
    assert "MUL_MAT" in flat(loose.out) and "disagree" not in flat(loose.out + loose.err)
    compared = kz("profile", "--compare", "20261204-000000-aaa2", "20261204-000000-aaa1")
    assert (
        compared.code != 0 and "disagree" in flat(compared.err) and "Traceback" not in compared.err
    )


def test_per_repetition_times_are_stored_and_read_back(project):
    store = profiling.ProfileStore(project.root / "results")
    stored = record("20261204-000000-aaa3", STEADY)
    store.add(stored)
    assert store.records() == [stored] and store.records()[0].graph[0].per_rep


@given(
    us=st.lists(
        st.one_of(
            st.floats(allow_nan=True, allow_infinity=True),
            st.integers(-5, 5),
            st.text(max_size=2),
            st.none(),
        ),
        max_size=4,
    )
)
def test_a_node_s_per_repetition_times_are_checked(us: list[object]):
    data = {
        "tool": "kz-profile",
        "format": 2,
        "n_prompt": 8,
        "n_gen": 0,
        "n_ubatch": 8,
        "n_threads": 1,
        "reps": 2,
        "phases": [
            {
                "phase": "prefill",
                "tokens": 8,
                "wall_us_plain": [5.0, 6.0],
                "wall_us_timed": [7.0, 8.0],
                "nodes": [{"op": "ADD", "backend": "CPU", "layer": 0, "count": 2, "us": us}],
            }
        ],
    }
    try:
        _, phases = profiling.parse_tool_output(json.dumps(data).encode(), source="out.json")
    except BadRecord as exc:
        assert "out.json" in str(exc) and "nodes[0]: us" in str(exc)
        return
    (row,) = phases[0].ops
    assert (
        len(row.usec_reps) == 2
        and all(x >= 0 for x in row.usec_reps)
        and row.usec == sum(row.usec_reps)
    )
