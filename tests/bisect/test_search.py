"""The bisect search on synthetic measurements: the right commit in few builds, no false alarms,
skipped builds, and a resumed bisect that measures nothing twice."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kzbuild.errors import BuildFailed, ResultsError
from kzbuild.measure.bisect import BuiltCommit, Record, Search, compare
from kzbuild.model.bisect import BisectLimits, BisectOutcome, PairVerdict

SHAS = [f"{i:040x}" for i in range(64)]
LIMITS = BisectLimits()
IDENTITY = {"recipe": "tiny", "metric": "pp32 t/s"}
Stopped = Callable[[], bool]


def never() -> bool:
    return False


class Synthetic:
    """A device whose commit ``step`` (and later) is ``drop`` slower, with seeded noise of ``noise``
    (relative sd)."""

    def __init__(
        self,
        step: int | None,
        *,
        drop: float = 0.10,
        noise: float = 0.02,
        seed: int = 0,
        unbuildable: Sequence[int] = (),
        interrupt_at: int | None = None,
    ) -> None:
        self.step, self.drop, self.noise = step, drop, noise
        self.rng = random.Random(seed)
        self.unbuildable = set(unbuildable)
        self.built: list[str] = []
        self.benched: list[tuple[str, ...]] = []
        self.interrupt_at = interrupt_at

    test = "pp32"

    def build(self, sha: str) -> BuiltCommit:
        self.built.append(sha)
        if SHAS.index(sha) in self.unbuildable:
            return BuiltCommit(failed="cmake: error")
        return BuiltCommit(artifact=f"/artifacts/{sha[:8]}", build_id=sha[:16])

    def __call__(
        self, artifacts: Mapping[str, str], blocks: int, seed: int, stopped: Stopped = never
    ) -> Mapping[str, Sequence[float]]:
        if self.interrupt_at is not None and len(self.benched) == self.interrupt_at:
            raise KeyboardInterrupt
        self.benched.append(tuple(artifacts))
        speed = {
            sha: 100.0
            * (1 - self.drop if self.step is not None and SHAS.index(sha) >= self.step else 1.0)
            for sha in artifacts
        }
        drawn = {
            sha: [speed[sha] * self.rng.gauss(1.0, self.noise) for _ in range(blocks)]
            for sha in artifacts
        }
        # asked between blocks, as a device's bencher does; measuring takes no time here
        done = next((n for n in range(1, blocks) if self.block(stopped)), blocks)
        return {sha: values[:done] for sha, values in drawn.items()}

    def block(self, stopped: Stopped) -> bool:
        """Whether to stop before the next block."""
        return stopped()


def search(tmp_path: Path, device: Synthetic, shas: Sequence[str] = SHAS, seed: int = 1) -> Search:
    return Search(
        Record.open(tmp_path, IDENTITY, shas),
        device.build,
        {"box": device},
        BisectLimits(),
        seed=seed,
    )


@pytest.mark.parametrize("step", [1, 2, 17, 37, 62, 63])
def test_a_10_percent_step_is_found_in_at_most_8_builds_among_64_commits(tmp_path, step):
    device = Synthetic(step, seed=step)
    outcome, effect, lo, hi = search(tmp_path, device).run()
    assert (outcome, hi, lo) == (BisectOutcome.FOUND, step, step - 1)
    assert len(device.built) <= 8, len(device.built)
    assert effect.delta_pct == pytest.approx(-10, abs=2.5) and effect.high_pct < 0


def test_a_range_with_no_change_says_so_at_least_19_times_in_20(tmp_path):
    verdicts = []
    for trial in range(20):
        device = Synthetic(None, seed=1000 + trial)
        outcome, effect, _, _ = search(tmp_path / str(trial), device, seed=trial).run()
        verdicts.append(outcome)
        assert len(device.built) == 2  # only the two ends
    assert verdicts.count(BisectOutcome.NO_CHANGE) >= 19, verdicts


def test_only_pairs_that_cannot_be_told_apart_take_more_samples(tmp_path):
    device = Synthetic(30, seed=3)
    found = search(tmp_path, device)
    found.run()
    limits = BisectLimits()
    sizes = {len(c.samples["box"]) for c in found.commits if c.samples}
    assert min(sizes) == limits.samples_per_round and max(sizes) <= 3 * limits.max_samples
    noisy = Synthetic(30, seed=3, noise=0.08)
    crowded = search(tmp_path / "noisy", noisy)
    crowded.run()
    assert sum(len(v) for c in crowded.commits for v in c.samples.values()) > sum(
        len(v) for c in found.commits for v in c.samples.values()
    )


def test_a_commit_that_does_not_build_is_skipped_with_its_reason(tmp_path):
    device = Synthetic(37, seed=7, unbuildable=[31])  # 31 is the first middle
    outcome, _, lo, hi = (found := search(tmp_path, device)).run()
    assert (outcome, hi) == (BisectOutcome.FOUND, 37)
    assert found.commits[31].skipped == "cmake: error" and not found.commits[31].samples


def test_an_unbuildable_culprit_leaves_the_range_it_hides_in(tmp_path):
    device = Synthetic(37, seed=8, unbuildable=[37, 38])
    outcome, _, lo, hi = search(tmp_path, device).run()
    assert outcome is BisectOutcome.SKIPPED_RANGE and (lo, hi) == (36, 39)


def test_an_end_that_does_not_build_is_a_build_failure(tmp_path):
    with pytest.raises(BuildFailed, match="the good end"):
        search(tmp_path, Synthetic(5, unbuildable=[0])).run()


def test_a_bisect_cut_midway_resumes_with_no_commit_measured_twice(tmp_path):
    whole = Synthetic(37, seed=11)
    expected = search(tmp_path / "whole", whole).run()
    cut = Synthetic(37, seed=11, interrupt_at=3)
    with pytest.raises(KeyboardInterrupt):
        search(tmp_path / "cut", cut).run()
    assert len(cut.benched) == 3
    resumed = Synthetic(37, seed=11)
    resumed.rng.setstate(cut.rng.getstate())
    found = search(tmp_path / "cut", resumed).run()
    assert found[0] == expected[0] and found[3] == expected[3]
    assert (
        cut.benched + resumed.benched == whole.benched
    )  # the rounds done before the cut are not run again
    assert not set(resumed.built) & set(cut.built)  # nor the builds


def test_a_pool_of_two_devices_narrows_in_fewer_steps_and_never_mixes_devices(tmp_path):
    one = Synthetic(37, seed=21)
    single = search(tmp_path / "one", one)
    assert single.run()[3] == 37
    a, b = (
        Synthetic(37, seed=22),
        Synthetic(37, seed=23, drop=0.12),
    )  # b is another unit: its own speeds
    pooled = Search(
        Record.open(tmp_path / "pool", IDENTITY, SHAS),
        a.build,
        {"a": a, "b": b},
        BisectLimits(),
        seed=1,
    )
    outcome, effect, lo, hi = pooled.run()
    assert (outcome, hi) == (BisectOutcome.FOUND, 37)
    rounds_single = len({s.lo for s in single.steps} | {s.hi for s in single.steps})
    assert len({(s.lo, s.hi) for s in pooled.steps}) < len({(s.lo, s.hi) for s in single.steps}), (
        rounds_single
    )
    for step in pooled.steps:  # each mid compared with the ends on its own device
        device = step.note.removeprefix("on ")
        for index in (step.lo, step.mid, step.hi):
            assert pooled.commits[index].samples[device]


def pooled(
    folder: Path, devices: Mapping[str, Synthetic], seed: int = 1, *, ahead: bool = False
) -> Search:
    first = next(iter(devices.values()))
    return Search(
        Record.open(folder, IDENTITY, SHAS), first.build, devices, BisectLimits(), seed, ahead=ahead
    )


def test_a_pool_of_two_says_no_change_on_a_flat_range_at_least_19_times_in_20(tmp_path):
    verdicts = []
    for trial in range(20):
        search = pooled(
            tmp_path / str(trial),
            {"a": Synthetic(None, seed=2000 + trial), "b": Synthetic(None, seed=3000 + trial)},
            seed=trial,
        )
        verdicts.append(search.run()[0])
        if verdicts[-1] is BisectOutcome.NO_CHANGE:  # no comparison said to be stopped by a change
            assert not any("put the change outside" in note for note in search.notes), search.notes
    assert verdicts.count(BisectOutcome.NO_CHANGE) >= 19, verdicts


def test_a_pool_says_no_change_only_if_no_device_told_the_ends_apart(tmp_path):
    # a is too noisy to tell the ends apart within the sample limit; b tells them apart at once:
    # the change is real, and a's "could not tell" must not turn it into "no change" (a, that
    # noisy, may still mislead the search: only the outcome is checked)
    blurred, clear = Synthetic(37, noise=0.3, seed=51), Synthetic(37, noise=0.01, seed=52)
    search = pooled(tmp_path, {"a": blurred, "b": clear})
    assert search.run()[0] is BisectOutcome.FOUND
    ends = [search.commits[i].samples for i in (0, 63)]
    limits = BisectLimits()
    assert compare(ends[0]["a"], ends[1]["a"], limits, seed=1)[0] is PairVerdict.UNDECIDED
    assert compare(ends[0]["b"], ends[1]["b"], limits, seed=1)[0] is PairVerdict.DIFFERENT


def test_at_5_percent_noise_a_pool_of_two_names_the_right_commit_as_often_as_one_device(tmp_path):
    # fixed seeds; a pool used to be wrong more often (seed 10 here): either device's ends that it
    # could not tell apart said "no change", and a commit that differed from both ends at its
    # first 3 samples decided its step on them
    wrong = {1: [], 2: []}
    for trial in range(11):
        step = random.Random(trial).randrange(1, 64)
        for count, misses in wrong.items():
            devices = {
                f"d{n}": Synthetic(step, noise=0.05, seed=10 * trial + n) for n in range(count)
            }
            outcome, _, _, hi = pooled(tmp_path / f"{trial}-{count}", devices, seed=trial).run()
            if (outcome, hi) != (BisectOutcome.FOUND, step):
                misses.append(trial)
    assert len(wrong[2]) <= len(wrong[1]) <= 1, wrong


class Slow(Synthetic):
    """A unit so noisy while it compares commit ``noisy_at`` that the comparison runs to the sample
    limit, a slow round at a time; its other comparisons have the usual noise. ``measuring`` is
    set once its first round has begun."""

    def __init__(self, step: int, *, noisy_at: int, seed: int) -> None:
        super().__init__(step, seed=seed)
        self.noisy_at = SHAS[noisy_at]
        self.measuring = threading.Event()

    def __call__(
        self, artifacts: Mapping[str, str], blocks: int, seed: int, stopped: Stopped = never
    ) -> Mapping[str, Sequence[float]]:
        self.measuring.set()
        time.sleep(0.5)
        self.noise = 0.3 if self.noisy_at in artifacts else 0.02
        return super().__call__(artifacts, blocks, seed, stopped)


class Waiting(Synthetic):
    """A unit that begins measuring only once ``other`` has begun."""

    def __init__(self, step: int, *, other: Slow, seed: int) -> None:
        super().__init__(step, seed=seed)
        self.other = other

    def __call__(
        self, artifacts: Mapping[str, str], blocks: int, seed: int, stopped: Stopped = never
    ) -> Mapping[str, Sequence[float]]:
        assert self.other.measuring.wait(10)
        return super().__call__(artifacts, blocks, seed, stopped)


class Held(Slow):
    """A Slow unit whose blocks end only once its comparison became moot (or 10 s passed): the
    answer that makes it moot comes in the middle of its round."""

    def block(self, stopped: Stopped) -> bool:
        deadline = time.monotonic() + 10
        while not stopped() and time.monotonic() < deadline:
            time.sleep(0.01)
        return stopped()


def test_a_pool_stops_the_comparison_another_devices_answer_made_moot(tmp_path):
    # the change at 5: a's commit (31, the middle) answers "at or below" in a few quick rounds,
    # which makes b's (47, the middle of the upper half) moot while b, too noisy there to settle
    # soon, is in the middle of its first round: b stops after the block in progress
    slow = Held(5, noisy_at=47, seed=32)
    fast = Waiting(5, other=slow, seed=31)
    search = pooled(tmp_path, {"a": fast, "b": slow})
    outcome, _, lo, hi = search.run()
    assert (outcome, hi) == (BisectOutcome.FOUND, 5)
    assert len(search.commits[47].samples["b"]) == 1  # the first of its round's 3 blocks
    assert any(note.startswith(f"{SHAS[47][:12]} on b: stopped") for note in search.notes), (
        search.notes
    )
    assert all(step.mid != 47 for step in search.steps)  # a stopped comparison decides nothing


class Paced(Synthetic):
    """A unit whose rounds take ``round_s``; with ``after``, it begins its first round only once
    that unit has finished its first."""

    def __init__(self, step: int, *, seed: int, round_s: float, after: Paced | None = None) -> None:
        super().__init__(step, seed=seed)
        self.round_s, self.after = round_s, after
        self.measured = threading.Event()

    def __call__(
        self, artifacts: Mapping[str, str], blocks: int, seed: int, stopped: Stopped = never
    ) -> Mapping[str, Sequence[float]]:
        assert self.after is None or self.after.measured.wait(10)
        time.sleep(self.round_s)
        got = super().__call__(artifacts, blocks, seed, stopped)
        self.measured.set()
        return got


def test_a_comparison_its_elders_samples_rule_out_stops_and_its_device_takes_the_likely_side(
    tmp_path,
):
    # the change at 5: a's first comparison (31) shows after one round that 31 is already slow
    # (the change at or below it) while it goes on telling 31 from 63; b began with 47 (the wider
    # upper stretch, before a had a sample), which that rules out: b stops it after the block in
    # progress (its first) and takes 15, in the lower half, without waiting for a's answer
    a = Paced(5, seed=71, round_s=0.3)
    b = Paced(5, seed=72, round_s=0.05, after=a)
    search = pooled(tmp_path, {"a": a, "b": b})
    outcome, _, _, hi = search.run()
    assert (outcome, hi) == (BisectOutcome.FOUND, 5)
    assert f"{SHAS[47][:12]} on b: stopped, another device's samples so far put the change " in (
        " ".join(search.notes)
    )
    assert len(search.commits[47].samples["b"]) == 1  # one block of the round's three
    first = [tuple(SHAS.index(sha) for sha in round) for round in b.benched]
    assert first[:2] == [(0, 47, 63), (0, 15, 63)], first  # its next includes the ends again
    assert all(step.mid != 47 for step in search.steps)


def test_a_device_whose_only_free_commit_is_ruled_out_races_instead_of_spinning(tmp_path):
    # the change at 1 of 0..3: a compares 1 (slow rounds); after its first round 0 and 1 differ
    # (the change at or below 1, surely) while 1 against 3 is not settled yet. The only commit
    # left free is 2, which that rules out: b must not take it (it would be stopped at once, and
    # taken again, and again, as long as a measures) but race a on 1
    a = Paced(1, seed=91, round_s=0.3)
    b = Paced(1, seed=92, round_s=0.02, after=a)
    search = Search(Record.open(tmp_path, IDENTITY, SHAS[:4]), a.build, {"a": a, "b": b}, LIMITS, 1)
    outcome, _, lo, hi = search.run()
    assert (outcome, lo, hi) == (BisectOutcome.FOUND, 0, 1)
    stopped = [note for note in search.notes if ": stopped, " in note]
    assert len(stopped) <= 2, stopped[:5]
    assert not any(SHAS.index(sha) == 2 for round in b.benched[1:] for sha in round), b.benched


def test_a_device_with_no_commit_left_races_the_comparison_in_flight_and_the_first_answer_counts(
    tmp_path,
):
    # one commit between the ends: a compares it, too noisy there to settle soon; b, once it has
    # compared the ends, compares the same commit on its own and answers first
    slow = Slow(1, noisy_at=1, seed=81)
    fast = Waiting(1, other=slow, seed=82)
    search = Search(
        Record.open(tmp_path, IDENTITY, SHAS[:3]), slow.build, {"a": slow, "b": fast}, LIMITS, 1
    )
    outcome, _, lo, hi = search.run()
    assert (outcome, lo, hi) == (BisectOutcome.FOUND, 0, 1)
    assert [(step.mid, step.note) for step in search.steps] == [(1, "on b")]
    assert f"{SHAS[1][:12]} on a: stopped, another device's answer came first" in search.notes
    assert 0 < len(search.commits[1].samples["a"]) < LIMITS.max_samples


@pytest.mark.parametrize("ahead", [False, True])
def test_a_pooled_bisect_cut_midway_resumes_with_no_sample_taken_again(tmp_path, ahead):
    cut = {"a": Synthetic(37, seed=41), "b": Synthetic(37, seed=42, interrupt_at=2)}
    with pytest.raises(KeyboardInterrupt):
        pooled(tmp_path, cut, ahead=ahead).run()
    before = json.loads(next(tmp_path.glob("*.json")).read_text())["commits"]
    resumed = {"a": Synthetic(37, seed=43), "b": Synthetic(37, seed=44)}
    search = pooled(tmp_path, resumed, ahead=ahead)
    assert search.run()[3] == 37
    for old, new in zip(before, search.commits, strict=True):
        for device, samples in old["samples"].items():
            assert new.samples[device][: len(samples)] == samples  # kept, only added to
    assert not set(resumed["a"].built) & set(cut["a"].built)  # nothing built twice


class SlowBuilds(Synthetic):
    """A unit whose rounds take ``round_s`` and whose builds take ``build_s``; each build is noted
    with the thread that made it."""

    def __init__(self, step: int, *, seed: int, round_s: float, build_s: float, **kw: Any) -> None:
        super().__init__(step, seed=seed, **kw)
        self.round_s, self.build_s = round_s, build_s
        self.threads: list[tuple[int, str]] = []

    def build(self, sha: str) -> BuiltCommit:
        time.sleep(self.build_s)
        self.threads.append((SHAS.index(sha), threading.current_thread().name))
        return super().build(sha)

    def __call__(
        self, artifacts: Mapping[str, str], blocks: int, seed: int, stopped: Stopped = never
    ) -> Mapping[str, Sequence[float]]:
        time.sleep(self.round_s)
        return super().__call__(artifacts, blocks, seed, stopped)


@pytest.mark.parametrize("count", [1, 2])
def test_builds_made_ahead_leave_no_device_waiting_for_one_after_its_first_comparison(
    tmp_path, count
):
    # builds far shorter than a round: each commit a device takes after its first comparison was
    # built while the devices measured, not when the device asked for it (one device's next
    # commit is one of two; a pool's two answers may come at once, after a round, and the likely
    # commits then are counted by chance: once in a while a pool builds one on demand)
    units = {f"d{n}": SlowBuilds(37, seed=60 + n, round_s=0.5, build_s=0.05) for n in range(count)}
    builder = units["d0"]
    search = pooled(tmp_path, units, ahead=True)
    assert search.run()[3] == 37
    handed = [index for index, thread in builder.threads if thread != "kz-ahead"]
    first = {1: [], 2: [31, 47]}[count]  # the pool's first two comparisons begin at once
    assert handed[: 2 + len(first)] == [0, 63, *first], builder.threads
    assert len(handed) <= 2 + len(first) + (count - 1), builder.threads
    assert search.built_ahead == {
        index for index, thread in builder.threads if thread == "kz-ahead"
    }
    measured = {i for i, c in enumerate(search.commits) if c.samples}
    assert search.builds == len(builder.built) and search.unused_ahead == len(
        search.built_ahead - measured
    )


def test_a_commit_that_fails_to_build_ahead_is_skipped_as_it_would_be_on_demand(tmp_path):
    unit = SlowBuilds(37, seed=7, round_s=0.3, build_s=0.0, unbuildable=[31])
    search = pooled(tmp_path, {"box": unit}, ahead=True)
    outcome, _, _, hi = search.run()
    assert (outcome, hi) == (BisectOutcome.FOUND, 37)
    assert (31, "kz-ahead") in unit.threads and unit.built.count(SHAS[31]) == 1
    assert search.commits[31].skipped == "cmake: error" and not search.commits[31].samples


class CutMidBuild(Synthetic):
    """Ctrl-C while a commit is built ahead: the device's round is interrupted, and the build,
    whose compiler got the signal too, fails a moment later."""

    def __init__(self, step: int, *, seed: int) -> None:
        super().__init__(step, seed=seed)
        self.building = threading.Event()

    def build(self, sha: str) -> BuiltCommit:
        if threading.current_thread().name != "kz-ahead":
            return super().build(sha)
        self.building.set()
        time.sleep(0.3)
        self.built.append(sha)
        return BuiltCommit(failed="ninja: interrupted by user")

    def __call__(
        self, artifacts: Mapping[str, str], blocks: int, seed: int, stopped: Stopped = never
    ) -> Mapping[str, Sequence[float]]:
        assert self.building.wait(10)
        raise KeyboardInterrupt


def test_an_ahead_build_cut_by_ctrl_c_is_not_recorded_as_a_failed_commit(tmp_path):
    unit = CutMidBuild(37, seed=5)
    with pytest.raises(KeyboardInterrupt):
        pooled(tmp_path, {"box": unit}, ahead=True).run()
    assert unit.built[-1] == SHAS[31]  # the build ahead was made, and failed
    resumed = Synthetic(37, seed=5)
    search = pooled(tmp_path, {"box": resumed})
    assert not search.commits[31].skipped
    assert search.run()[3] == 37 and SHAS[31] in resumed.built


def test_an_ahead_build_cut_by_ctrl_c_while_another_device_ends_its_round_is_not_recorded(
    tmp_path,
):
    # the other device takes longer to end its round than a failed ahead build waits for the stop
    cut, busy = CutMidBuild(37, seed=6), Paced(37, seed=7, round_s=2.5)
    with pytest.raises(KeyboardInterrupt):
        pooled(tmp_path, {"a": cut, "b": busy}, ahead=True).run()
    ahead = SHAS.index(cut.built[-1])
    record = json.loads(next(tmp_path.glob("*.json")).read_text())["commits"]
    assert ahead not in (0, 31, 47, 63) and not any(c["skipped"] for c in record)


def test_compare_needs_the_minimum_effect_as_well_as_an_interval_off_zero():
    limits = BisectLimits(min_effect_pct=3.0)
    assert (
        compare([100, 100.1, 99.9], [99, 99.1, 98.9], limits, seed=0)[0] is PairVerdict.SAME
    )  # -1%: real, too small
    assert compare([100, 100.1, 99.9], [90, 90.1, 89.9], limits, seed=0)[0] is PairVerdict.DIFFERENT
    assert compare([100, 80, 120], [95, 75, 115], limits, seed=0)[0] is PairVerdict.UNDECIDED


def test_a_damaged_record_is_named_and_another_bisects_record_refused(tmp_path):
    record = Record.open(tmp_path, IDENTITY, SHAS[:3])
    record.save()
    record.path.write_text("{not json")
    with pytest.raises(ResultsError, match=str(record.path)):
        Record.open(tmp_path, IDENTITY, SHAS[:3])
    record.save()
    with pytest.raises(ResultsError, match="other commits"):
        Record.open(tmp_path, IDENTITY, SHAS[:4])


def test_a_zero_sample_is_read_only_where_the_metric_allows_it(tmp_path):
    """A mean KLD of 0 is a result (the good end against its own logits); 0 t/s or MiB is not."""
    record = Record.open(tmp_path, IDENTITY, SHAS[:2], zero_ok=True)
    record.commits[0].samples["box"] = [0.0]
    record.save()
    assert Record.open(tmp_path, IDENTITY, SHAS[:2], zero_ok=True).commits[0].samples == {
        "box": [0.0]
    }
    with pytest.raises(ResultsError, match="samples must be numbers above 0"):
        Record.open(tmp_path, IDENTITY, SHAS[:2])


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=20,
    )
)
def test_any_json_in_the_record_is_read_or_refused_clearly(tmp_path_factory, doc):
    folder = tmp_path_factory.mktemp("record")
    record = Record.open(folder, IDENTITY, SHAS[:2])
    record.path.parent.mkdir(parents=True, exist_ok=True)
    record.path.write_text(json.dumps({"version": 1, "identity": IDENTITY, "commits": doc}))
    try:
        Record.open(folder, IDENTITY, SHAS[:2])
    except ResultsError:
        pass
