"""``kzbuild bisect``: the first upstream commit that moved a number, told apart from the noise.

The search is a binary search whose every comparison is statistical, as Chromium's Pinpoint does
for browsers: two commits are *different* when the bootstrap interval of their medians' relative
difference excludes zero and the median moved by at least the minimum effect of interest, and
*the same* when the interval lies within ± that minimum. Anything else takes another round of
samples, up to a limit; only pairs that cannot yet be told apart get more. Each commit is benched
interleaved with the two ends of the current range (one device, one seeded order), so drift
lands on all three alike.

A bisect keeps a record (``WORK/bisect/<recipe>/<id>.json``) written after every build and every
round: run again, it replays its decisions from the recorded samples and measures only what is
missing, so a bisect cut by Ctrl-C or a lost device resumes with no commit re-measured.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import shutil
import statistics
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from itertools import pairwise
from pathlib import Path
from typing import NamedTuple, Protocol

from kzbuild.adapters.filelock import locked
from kzbuild.adapters.files import write_atomic
from kzbuild.adapters.proc import Progress
from kzbuild.adapters.settings import Settings
from kzbuild.build import builder
from kzbuild.build.toolchains import configured_paths_file
from kzbuild.device.base import Transport
from kzbuild.device.devicelock import device_lock
from kzbuild.errors import BuildFailed, ConfigError, KzError, PatchError, ResultsError
from kzbuild.measure.interleave import deploy_arms, run_interleaved
from kzbuild.measure.pool import Ahead, feed
from kzbuild.measure.quality import check_variants, quality_store
from kzbuild.measure.resultsdb import ResultsStore
from kzbuild.measure.stats import median_effect
from kzbuild.model.bench import BenchSpec
from kzbuild.model.bisect import (
    KLD,
    BisectLimits,
    BisectOutcome,
    BisectReport,
    CommitState,
    Metric,
    NarrowingStep,
    PairVerdict,
)
from kzbuild.model.build import BuildOptions
from kzbuild.model.device import Device
from kzbuild.model.effect import Effect
from kzbuild.model.interleave import Checked, Cooling
from kzbuild.model.quality import QualitySpec
from kzbuild.model.recipe import Recipe
from kzbuild.model.remotecache import RemoteConfig
from kzbuild.model.roll import pr_number
from kzbuild.model.stackcheck import UpstreamCommit
from kzbuild.source.sources import ObjectCache
from kzbuild.source.stack.apply import is_ancestor
from kzbuild.source.stack.check import fetch_range, resolve_target

log = logging.getLogger(__name__)

RECORD_VERSION = 1
AHEAD_STOP_GRACE_S = 1.0  # how long a failed ahead build waits for a stop before it counts
AHEAD_DEPTH = 2  # answers looked ahead for the commits to build ahead
AHEAD_PER_DEVICE = 2  # commits built ahead at most per device, the likeliest needed
# the chance that a comparison's answer is the one its samples so far lean to: its verdicts say
# so (True), the larger move of the median does (False), no samples yet (None)
LEAN_CHANCE = {True: 0.9, False: 0.6, None: 0.5}


@dataclass(frozen=True)
class BuiltCommit:
    """What building one commit gave: an artifact (with or without the stack), or why not."""

    artifact: str = ""
    build_id: str = ""
    bare: bool = False
    stack_problem: str = ""
    failed: str = ""  # why it could not be built: the commit is skipped


# build(sha) -> BuiltCommit
Builder = Callable[[str], BuiltCommit]


class Bencher(Protocol):
    """Benches artifacts (by commit, in range order; an anchored search gives the good end first)
    in ``blocks`` interleaved blocks; returns new samples by commit. It asks ``stopped()`` before
    each block after the first and, when told, returns the samples of the blocks it measured."""

    test: str | None  # the test whose samples it returns, once known

    def __call__(
        self, artifacts: Mapping[str, str], blocks: int, seed: int, stopped: Callable[[], bool]
    ) -> Mapping[str, Sequence[float]]: ...


def compare(
    a: Sequence[float], b: Sequence[float], limits: BisectLimits, *, seed: int
) -> tuple[PairVerdict, Effect]:
    """B against A: different, the same, or not yet told apart."""
    effect = median_effect(a, b, seed=seed, confidence=limits.confidence)
    if effect.detectable and abs(effect.delta_pct) >= limits.min_effect_pct:
        return PairVerdict.DIFFERENT, effect
    if -limits.min_effect_pct < effect.low_pct and effect.high_pct < limits.min_effect_pct:
        return PairVerdict.SAME, effect
    return PairVerdict.UNDECIDED, effect


class Judge(Protocol):
    """How B's samples compare with A's: the verdict and the effect."""

    def __call__(
        self, a: Sequence[float], b: Sequence[float], limits: BisectLimits, *, seed: int
    ) -> tuple[PairVerdict, Effect]: ...


def check_limits(limits: BisectLimits) -> None:
    if not 0 < limits.min_effect_pct < 100:
        raise ConfigError(
            f"minimum effect {limits.min_effect_pct}%: give a percentage above 0 and below 100"
        )
    if not 1 <= limits.samples_per_round <= limits.max_samples <= 1000:
        raise ConfigError(
            f"samples: {limits.samples_per_round} per round, at most {limits.max_samples}",
            hint="at least 1 per round, and a maximum no smaller than that (at most 1000)",
        )


@dataclass
class Record:
    """The bisect's state on disk: its identity, and every commit's build and samples."""

    path: Path
    identity: dict[str, str]
    commits: list[CommitState]
    test: str = ""  # the test the samples are of, as the bench named it

    @classmethod
    def open(
        cls,
        folder: Path,
        identity: Mapping[str, str],
        shas: Sequence[str],
        *,
        zero_ok: bool = False,
    ) -> Record:
        """The record of this bisect (same recipe, range, plan, metric, device), or a new one.
        ``zero_ok``: a sample may be 0 (a mean KLD), else every sample is above 0 (t/s, MiB)."""
        key = hashlib.sha256(json.dumps(dict(identity), sort_keys=True).encode()).hexdigest()[:16]
        path = folder / f"{key}.json"
        fresh = cls(path, dict(identity), [CommitState(sha) for sha in shas])
        if not path.exists():
            return fresh
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            if doc.get("version") != RECORD_VERSION or doc.get("identity") != dict(identity):
                raise ValueError("another bisect's record")
            commits = [_commit_state(item, zero_ok=zero_ok) for item in doc["commits"]]
            test = doc.get("test", "")
            if not isinstance(test, str):
                raise ValueError("test is not a string")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ResultsError(
                f"{path}: the bisect record cannot be read: {exc}",
                hint="delete it to start this bisect over (its builds stay in the artifact cache)",
            ) from None
        if [c.sha for c in commits] != list(shas):
            raise ResultsError(
                f"{path}: the record lists other commits than the range "
                f"{shas[0][:12]}..{shas[-1][:12]}",
                hint="delete it to start this bisect over",
            )
        return cls(path, dict(identity), commits, test=test)

    def save(self) -> None:
        doc = {
            "version": RECORD_VERSION,
            "identity": self.identity,
            "test": self.test,
            "commits": [c.to_dict() for c in self.commits],
        }
        write_atomic(self.path, json.dumps(doc, indent=1).encode())


def _commit_state(item: object, *, zero_ok: bool) -> CommitState:
    if not isinstance(item, dict):
        raise ValueError("a commit entry is not an object")
    samples = item.get("samples", {})
    if not isinstance(samples, dict) or not all(
        isinstance(device, str)
        and isinstance(values, list)
        and all(
            isinstance(v, (int, float))
            and not isinstance(v, bool)
            and (v > 0 or (zero_ok and v == 0))
            for v in values
        )
        for device, values in samples.items()
    ):
        least = "0 or more" if zero_ok else "above 0"
        raise ValueError(f"commit {item.get('sha')}: samples must be numbers {least} by device")
    text = {k: item.get(k, "") for k in ("sha", "skipped", "stack_problem", "build_id", "artifact")}
    if not all(isinstance(v, str) for v in text.values()) or not isinstance(
        item.get("built", False), bool
    ):
        raise ValueError(f"commit {item.get('sha')}: a field has the wrong type")
    return CommitState(
        str(text["sha"]),
        bool(item.get("built", False)),
        str(text["skipped"]),
        bool(item.get("bare", False)),
        str(text["stack_problem"]),
        str(text["build_id"]),
        str(text["artifact"]),
        {device: [float(v) for v in values] for device, values in samples.items()},
    )


@dataclass(frozen=True)
class Settled:
    """What one device's rounds over lo (mid) hi told: each neighbouring pair's verdict and
    effect, and lo against hi when asked (a device's first comparison in a pool)."""

    device: str
    verdicts: tuple[PairVerdict, ...]
    effects: tuple[Effect, ...]
    ends: tuple[PairVerdict, Effect] | None = None

    @property
    def ends_verdict(self) -> PairVerdict | None:
        """lo against hi, compared alone or beside a mid (``ends``); None when not compared."""
        if self.ends:
            return self.ends[0]
        return self.verdicts[0] if len(self.verdicts) == 1 else None

    @property
    def across(self) -> Effect:
        """hi against lo (of a comparison of the ends alone, or with ``ends``)."""
        return self.ends[1] if self.ends else self.effects[0]


@dataclass(frozen=True)
class Probe:
    """A comparison handed to one device: mid (None: the ends alone) between the range's ends as
    they stood, and (``ends``) the ends against each other, while no answer has told them apart."""

    lo: int
    mid: int | None
    hi: int
    ends: bool = False
    device: str = ""


class Leaning(NamedTuple):
    """Where a comparison in flight puts the change by its samples so far."""

    below: bool  # at or below its commit, else above it
    sure: bool  # its verdicts say so (else the larger move of the median does)
    ends_apart: bool  # its device tells the range's ends apart


@dataclass
class Narrowing:
    """Where a search stands: its range, and what is known of its ends."""

    lo: int
    hi: int
    fresh: set[str]  # devices not yet handed a comparison: their first one includes the ends
    ends_in_flight: int = 0
    apart: bool = False  # a device told the ends apart
    same: Settled | None = None  # the answer that says "no change"


@dataclass
class Search:
    """One bisect over a record: builds on demand, benches in interleaved rounds, narrows the range.

    One device compares the ends alone, then the commit nearest the middle of the range, and so on.
    A pool (several ``benchers``, one per device) keeps every device busy: a free device is handed
    the commit nearest the middle of the widest stretch of the range that no comparison in flight
    splits, first on the side that each comparison in flight leans to by its samples so far,
    between the range's two ends as they stand (so one device halves the range while another
    halves the half that its answer will likely leave); each device's first comparison includes
    the ends. A comparison never mixes devices. An answer that puts the change outside another
    device's commit stops that comparison after its block in progress, as do the verdicts so far
    of a comparison started before it that rule its side out; no device waits for another (with no
    commit left free, it races a comparison in flight on its own: the first answer counts). With
    ``ahead``, the commits the next comparisons may need are built in the background meanwhile."""

    record: Record
    build: Builder
    benchers: Mapping[str, Bencher]
    limits: BisectLimits
    seed: int
    on_event: Callable[[str], None] = lambda message: None
    judge: Judge = compare  # how two commits' samples compare (the metric's judge)
    # the samples are measured against the good end (a quality check): each commit is measured
    # once, beside the good end, rather than interleaved with the range's ends
    anchored: bool = False
    # build, in the background, the commits the next comparisons may need (pool.Ahead)
    ahead: bool = False
    builds: int = 0
    benches: int = 0
    steps: list[NarrowingStep] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    built_ahead: set[int] = field(default_factory=set)
    _saving: threading.Lock = field(default_factory=threading.Lock)
    _building: threading.Lock = field(default_factory=threading.Lock)  # one worktree
    _flight: list[Probe] = field(default_factory=list)  # the comparisons in flight
    _ahead: Ahead[int] | None = None
    _ahead_failed: set[int] = field(default_factory=set)
    _leanings: dict[tuple[Probe, tuple[int, ...]], Leaning] = field(default_factory=dict)

    @property
    def commits(self) -> list[CommitState]:
        return self.record.commits

    def run(self) -> tuple[BisectOutcome, Effect, int, int]:
        """Outcome, the effect across the final pair, and that pair's indices (lo, hi)."""
        if not self.benchers:
            raise ConfigError("no device to bench on")
        first, last = 0, len(self.commits) - 1
        for end, name in ((first, "good"), (last, "bad")):
            if not self._ensure_built(end):
                raise BuildFailed(
                    f"the {name} end {self.commits[end].sha[:12]} cannot be built: "
                    f"{self.commits[end].skipped}",
                    hint="choose a --good and --bad that build",
                )
        state = Narrowing(first, last, set(self.benchers))
        with (
            Ahead(lambda: self._wanted(state), self._build_ahead) if self.ahead else nullcontext()
        ) as ahead:
            self._ahead = ahead
            feed(
                list(self.benchers),
                lambda device, busy: self._pick(state, device, busy),
                self._work,
                lambda device, probe, found: self._answer(state, device, probe, found),
                lambda probe, earlier: self._moot(state, probe, earlier),
                ahead.stopping if ahead else None,
            )
        self._ahead = None
        if state.same is not None:
            return BisectOutcome.NO_CHANGE, state.same.across, first, last
        lo, hi = state.lo, state.hi
        between = [i for i in range(lo + 1, hi) if self.commits[i].skipped]
        final = self._final_effect(lo, hi)
        return (BisectOutcome.SKIPPED_RANGE if between else BisectOutcome.FOUND), final, lo, hi

    def _pick(self, state: Narrowing, device: str, busy: Sequence[Probe]) -> Probe | None:
        """The comparison for a free device, or None when there is none to make. A device's first
        includes the ends while they are not told apart (one device compares them alone). When
        the comparisons in flight leave no commit free, the device races the first of them: it
        compares the same commit on its own, and the first answer counts. A commit the samples of
        a comparison in flight rule out is not free (it would be stopped at once, ``_moot``, and
        taken again as long as that comparison runs)."""
        if state.same is not None:
            return None
        ends = device in state.fresh and not state.apart
        state.fresh.discard(device)

        def ruled_out(mid: int) -> bool:
            return self._moot(state, Probe(state.lo, mid, state.hi, ends), busy)

        mid = None if ends and len(self.benchers) == 1 else self._free_mid(state, busy)
        if mid is not None and ruled_out(mid):
            mid = None
        if mid is None and not ends:
            mid = next(
                (
                    p.mid
                    for p in busy
                    if p.mid is not None and state.lo < p.mid < state.hi and not ruled_out(p.mid)
                ),
                None,
            )
        if mid is None and not ends:
            return None
        state.ends_in_flight += ends
        return Probe(state.lo, mid, state.hi, ends, device)

    def _work(self, device: str, probe: Probe, stopped: Callable[[], bool]) -> Settled | None:
        """A device's comparison (``_settle``); in flight (``_flight``) from its first round that
        measures, so a comparison the record answers builds nothing ahead."""

        def measuring() -> bool:
            if stopped():
                return True
            if probe not in self._flight:
                self._flight.append(probe)
                self._moved()
            return False

        return self._settle(device, probe.lo, probe.mid, probe.hi, measuring, probe.ends)

    def _free_mid(self, state: Narrowing, busy: Sequence[Probe]) -> int | None:
        """The buildable commit nearest the middle of the first of the stretches (``_stretches``)
        that has one; None when every stretch is empty."""
        for lo, hi in self._stretches(state.lo, state.hi, busy):
            mid = self._next_mid(lo, hi)
            if mid is not None:
                return mid
        return None

    def _stretches(self, lo: int, hi: int, busy: Sequence[Probe]) -> list[tuple[int, int]]:
        """The stretches of lo..hi that the commits in flight leave, widest first: first those on
        the side each comparison in flight leans to by its samples so far (the side its answer
        will likely keep), then the others; the lower of two as wide first."""
        inside = [p for p in busy if p.mid is not None and lo < p.mid < hi]
        points = sorted({lo, hi} | {p.mid for p in inside if p.mid is not None})
        leanings = [
            (p.mid, lean.below) for p in inside if p.mid is not None and (lean := self._leaning(p))
        ]

        def unlikely(gap: tuple[int, int]) -> bool:
            return any(gap[0] >= mid if below else gap[1] <= mid for mid, below in leanings)

        return sorted(pairwise(points), key=lambda gap: (unlikely(gap), gap[0] - gap[1], gap[0]))

    def _wanted(self, state: Narrowing) -> list[int]:
        """The commits not yet built (nor failed) that the next comparisons may need, likeliest
        first: the ``AHEAD_PER_DEVICE`` per device likeliest of those ``_plan`` finds."""
        if state.same is not None:
            return []
        chances: dict[int, float] = {}
        self._plan(state.lo, state.hi, list(self._flight), 1.0, AHEAD_DEPTH, chances)
        likeliest = sorted(chances, key=lambda i: (-chances[i], i))
        return [
            i
            for i in likeliest[: AHEAD_PER_DEVICE * len(self.benchers)]
            if not (self.commits[i].built or self.commits[i].skipped or i in self._ahead_failed)
        ]

    def _plan(
        self,
        lo: int,
        hi: int,
        flight: Sequence[Probe],
        chance: float,
        depth: int,
        chances: dict[int, float],
    ) -> None:
        """Into ``chances``: for each comparison in flight and each of its answers, the commit that
        ``_free_mid`` would then pick beside the others in flight, with the chance of getting there
        (an answer is as likely as its comparison's samples so far lean to it, ``LEAN_CHANCE``);
        then, ``depth`` - 1 answers further, what would follow."""
        for probe in flight:
            if probe.mid is None:  # the ends alone: told apart, the range stays
                outcomes = [((lo, hi), 1.0)]
            elif lo < probe.mid < hi:
                lean = self._leaning(probe)
                likely = LEAN_CHANCE[None if lean is None else lean.sure]
                below = lean is None or lean.below
                halves = [(lo, probe.mid), (probe.mid, hi)]
                outcomes = [(halves[not below], likely), (halves[below], 1 - likely)]
            else:
                continue
            others = [p for p in flight if p is not probe]
            for (a, b), p in outcomes:
                index = self._planned_mid(a, b, others)
                if index is None:
                    continue
                chances[index] = max(chances.get(index, 0.0), chance * p)
                if depth > 1:
                    then = [*others, Probe(a, index, b, device=probe.device)]
                    self._plan(a, b, then, chance * p, depth - 1, chances)

    def _planned_mid(self, lo: int, hi: int, busy: Sequence[Probe]) -> int | None:
        """The commit ``_free_mid`` would pick in lo..hi beside ``busy``, were the commits not yet
        built all buildable (None: none is left)."""
        for a, b in self._stretches(lo, hi, busy):
            for index in self._by_middle(a, b):
                if not self.commits[index].skipped:
                    return index
        return None

    def _build_ahead(self, index: int, stopping: threading.Event) -> None:
        try:
            self._ensure_built(index, stopping)
        except KzError as exc:  # the search builds it again if it needs it, and says so then
            log.warning("building %s ahead: %s", self.commits[index].sha[:12], exc.message)
            self._ahead_failed.add(index)

    def _moved(self) -> None:
        if self._ahead is not None:
            self._ahead.moved()

    def _leaning(self, probe: Probe) -> Leaning | None:
        """Where a comparison in flight puts the change by its device's samples so far (as its
        answer would, were they all); None before its first round."""
        assert probe.mid is not None
        points = (probe.lo, probe.mid, probe.hi)
        with self._saving:
            samples = [list(self.commits[i].samples.get(probe.device, ())) for i in points]
        if not all(samples):
            return None
        key = (probe, tuple(len(values) for values in samples))
        if key not in self._leanings:
            found = [self.judge(a, b, self.limits, seed=self.seed) for a, b in pairwise(samples)]
            below, note = self._culprit_is_below(
                Settled(probe.device, tuple(v for v, _ in found), tuple(e for _, e in found))
            )
            apart = self.judge(samples[0], samples[2], self.limits, seed=self.seed)[0]
            self._leanings[key] = Leaning(below, not note, apart is PairVerdict.DIFFERENT)
        return self._leanings[key]

    def _answer(self, state: Narrowing, device: str, probe: Probe, found: Settled | None) -> None:
        """Narrow the range by a device's answer (None: it was stopped as moot); ends that one
        device found the same, or that no device told apart, say "no change"."""
        state.ends_in_flight -= probe.ends
        if probe in self._flight:
            self._flight.remove(probe)
            self._moved()
        sha = self.commits[probe.mid].sha[:12] if probe.mid is not None else ""
        if found is None and probe.ends and not state.apart:
            state.fresh.add(device)  # its next comparison includes the ends again
        if found is None:
            if sha and state.same is None:  # with no change, nothing else mattered
                assert probe.mid is not None
                why = (
                    "samples so far put the change outside it, likely"
                    if state.lo < probe.mid < state.hi
                    else "answer came first"
                    if probe.mid in (state.lo, state.hi)
                    else "answer put the change outside it"
                )
                self.notes.append(f"{sha} on {device}: stopped, another device's {why}")
            return
        if probe.ends:
            verdict = found.ends_verdict
            state.apart |= verdict is PairVerdict.DIFFERENT
            undecided = not (state.apart or state.fresh or state.ends_in_flight)
            if verdict is PairVerdict.SAME or undecided:
                state.same = found
                return
        if probe.mid is None:
            return
        if not state.lo < probe.mid < state.hi:
            why = (
                "another device answered it"
                if probe.mid in (state.lo, state.hi)
                else "other answers put the change outside it"
            )
            self.notes.append(f"{sha} on {device}: answered after {why}")
            return
        below, note = self._culprit_is_below(found)
        if note:
            self.notes.append(f"{sha}: {note}; followed the larger change of the median")
        self.steps.append(
            NarrowingStep(
                probe.lo,
                probe.mid,
                probe.hi,
                found.verdicts[0],
                found.verdicts[1],
                "lower half" if below else "upper half",
                note=f"on {device}",
            )
        )
        if below:
            state.hi = probe.mid
        else:
            state.lo = probe.mid

    def _moot(self, state: Narrowing, probe: Probe, earlier: Sequence[Probe]) -> bool:
        """Whether a comparison in flight no longer matters: no change was found, or its commit is
        outside the range (its ends still count while no device has told them apart), or on the
        side that the verdicts so far of a comparison started before it rule out (its answer will
        likely put the change outside it; ends not yet told apart count only where that
        comparison's device tells them apart so far)."""
        if state.same is not None:
            return True
        if probe.ends and not state.apart:
            return probe.mid is not None and self._ruled_out(state, probe, earlier, ends=True)
        if probe.mid is None or not state.lo < probe.mid < state.hi:
            return True
        return self._ruled_out(state, probe, earlier, ends=False)

    def _ruled_out(
        self, state: Narrowing, probe: Probe, earlier: Sequence[Probe], *, ends: bool
    ) -> bool:
        assert probe.mid is not None
        for other in earlier:
            if other.mid is None or not state.lo < other.mid < state.hi:
                continue
            lean = self._leaning(other)
            if lean is None or not lean.sure or (ends and not lean.ends_apart):
                continue
            if probe.mid > other.mid if lean.below else probe.mid < other.mid:
                return True
        return False

    @staticmethod
    def _culprit_is_below(found: Settled) -> tuple[bool, str]:
        """Whether the change lies at or before mid (mid already looks like hi), else after it;
        and why, when the verdicts alone do not say."""
        v_lo, v_hi = found.verdicts
        if v_lo is PairVerdict.DIFFERENT and v_hi is not PairVerdict.DIFFERENT:
            return True, ""
        if v_hi is PairVerdict.DIFFERENT and v_lo is not PairVerdict.DIFFERENT:
            return False, ""
        # both differ (two steps), or neither could be told apart within the limit: follow
        # the larger move
        note = (
            "both halves moved"
            if v_lo is v_hi is PairVerdict.DIFFERENT
            else "not told apart within the sample limit"
        )
        return abs(found.effects[0].delta_pct) >= abs(found.effects[1].delta_pct), note

    def _final_effect(self, lo: int, hi: int) -> Effect:
        """The culprit against its parent, on a device that measured both (measuring them if none
        did)."""
        shared = [
            d
            for d in self.benchers
            if self.commits[lo].samples.get(d) and self.commits[hi].samples.get(d)
        ]
        if not shared:
            shared = [next(iter(self.benchers))]
            self._settle(shared[0], lo, None, hi)
        device = shared[0]
        return self.judge(
            self.commits[lo].samples[device],
            self.commits[hi].samples[device],
            self.limits,
            seed=self.seed,
        )[1]

    def _settle(
        self,
        device: str,
        lo: int,
        mid: int | None,
        hi: int,
        stopped: Callable[[], bool] = lambda: False,
        with_ends: bool = False,
    ) -> Settled | None:
        """Bench lo (mid) hi interleaved on one device in rounds until each pair is told apart or
        hits the limit (``with_ends``: lo against hi first; when they are the same, that is the
        answer). A round asks for ``samples_per_round`` more samples than the last; the record's
        samples count, so a resumed bisect measures only what it lacks. None: told to stop
        (``stopped()``, asked before each round that measures and, inside one, before each of its
        blocks after the first: a moot comparison frees its device after the block in progress)."""
        points = [i for i in (lo, mid, hi) if i is not None]
        pairs = [*pairwise(points), *([(lo, hi)] if with_ends else [])]
        told = len(points) - 1  # the neighbouring pairs; then lo against hi, if asked
        wanted = self.limits.samples_per_round
        while True:
            if self._missing(device, points, wanted) > 0 and stopped():
                return None
            self._ensure_samples(device, points, wanted, stopped)
            if self._missing(device, points, wanted) > 0:
                continue  # a round cut short is never judged: told to stop, or measured again
            found = [
                self.judge(
                    self.commits[a].samples[device],
                    self.commits[b].samples[device],
                    self.limits,
                    seed=self.seed,
                )
                for a, b in pairs
            ]
            verdicts = tuple(v for v, _ in found[:told])
            # one change lies on one side of mid: both sides moving is a sign of noise (or of two
            # changes), told only by the samples up to the limit
            both = (PairVerdict.DIFFERENT, PairVerdict.DIFFERENT)
            decided = PairVerdict.UNDECIDED not in verdicts and verdicts != both
            if with_ends:
                ends = found[told][0]
                decided = ends is PairVerdict.SAME or (ends is PairVerdict.DIFFERENT and decided)
            if decided or wanted >= self.limits.max_samples:
                return Settled(
                    device,
                    verdicts,
                    tuple(e for _, e in found[:told]),
                    found[told] if with_ends else None,
                )
            wanted = min(wanted + self.limits.samples_per_round, self.limits.max_samples)

    def _missing(self, device: str, points: Sequence[int], wanted: int) -> int:
        return wanted - min(len(self.commits[i].samples.get(device, ())) for i in points)

    def _ensure_samples(
        self, device: str, points: Sequence[int], wanted: int, stopped: Callable[[], bool]
    ) -> None:
        missing = self._missing(device, points, wanted)
        if missing <= 0:
            return
        if self.anchored:  # only the commits that lack samples, after the good end
            points = [i for i in points if len(self.commits[i].samples.get(device, ())) < wanted]
            artifacts = {self.commits[0].sha: self.commits[0].artifact}
        else:
            artifacts = {}
        artifacts |= {self.commits[i].sha: self.commits[i].artifact for i in points}
        shown = ", ".join(sha[:12] for sha in artifacts)
        self.on_event(
            f"{device}: checking the output of {shown} against the first"
            if self.anchored
            else f"{device}: benching {shown}, {missing} interleaved block(s)"
        )
        bencher = self.benchers[device]
        got = bencher(artifacts, missing, self.seed + 1000 * sum(points) + wanted, stopped)
        with self._saving:
            for i in points:
                new = list(got.get(self.commits[i].sha, ()))
                if not new:
                    raise ResultsError(
                        f"{device}: the bench of {self.commits[i].sha[:12]} gave no sample of the "
                        "metric"
                    )
                self.commits[i].samples.setdefault(device, []).extend(new)
            self.benches += 1
            self.record.test = bencher.test or self.record.test
            self.record.save()
        self._moved()  # the leanings changed

    def _ensure_built(self, index: int, ahead: threading.Event | None = None) -> bool:
        """Whether the commit is built, building it if need be (one build at a time: one worktree).
        ``ahead``: built ahead, in the background, until that is set."""
        state = self.commits[index]
        with self._building:
            if state.built or state.skipped or (ahead is not None and ahead.is_set()):
                return state.built
            self.on_event(
                f"building {state.sha[:12]} ({index}/{len(self.commits) - 1})"
                + (" ahead" if ahead is not None else "")
            )
            outcome = self.build(state.sha)
            # Ctrl-C reaches an ahead build's compilers too: a build failing as the search stops
            # is no failure of the commit (its stop comes soon after, and is waited for)
            if outcome.failed and ahead is not None and ahead.wait(AHEAD_STOP_GRACE_S):
                return False
            with self._saving:  # the devices of a pool save their rounds meanwhile
                self.builds += 1
                if outcome.failed:
                    state.skipped = outcome.failed
                else:
                    state.built, state.artifact = True, outcome.artifact
                    state.build_id, state.bare = outcome.build_id, outcome.bare
                    state.stack_problem = outcome.stack_problem
                if ahead is not None:
                    self.built_ahead.add(index)
                self.record.save()
        return state.built

    @property
    def unused_ahead(self) -> int:
        """Commits built ahead that no comparison measured."""
        return sum(1 for i in self.built_ahead if not any(self.commits[i].samples.values()))

    @staticmethod
    def _by_middle(lo: int, hi: int) -> list[int]:
        """The commits strictly inside lo..hi, nearest its middle first."""
        goal = lo + (hi - lo) // 2
        return sorted(range(lo + 1, hi), key=lambda i: (abs(i - goal), i))

    def _next_mid(self, lo: int, hi: int) -> int | None:
        """The buildable commit strictly inside lo..hi nearest its middle (None: there is none);
        an unbuildable one is passed over, as ``git bisect skip`` does."""
        for index in self._by_middle(lo, hi):
            if self._ensure_built(index):
                return index
        return None


def report(
    search: Search,
    recipe: str,
    metric: str,
    found: tuple[BisectOutcome, Effect, int, int],
    describe: Callable[[str], UpstreamCommit],
    *,
    absolute: bool = False,
) -> BisectReport:
    """The report of a finished search; ``describe(sha)`` names a commit (subject, author, date)."""
    outcome, effect, lo, hi = found
    commits = tuple(search.commits)
    culprit = describe(commits[hi].sha) if outcome is BisectOutcome.FOUND else None
    narrowed = outcome is not BisectOutcome.NO_CHANGE
    return BisectReport(
        recipe=recipe,
        metric=metric,
        good=commits[0].sha,
        bad=commits[-1].sha,
        outcome=outcome,
        commits=commits,
        steps=tuple(search.steps),
        builds=search.builds,
        benches=search.benches,
        effect=effect,
        culprit=culprit,
        culprit_index=hi if culprit else None,
        range_lo=lo if narrowed else None,
        range_hi=hi if narrowed else None,
        pr=pr_number(culprit.subject) if culprit else None,
        notes=tuple(search.notes),
        built_ahead_unused=search.unused_ahead,
        absolute=absolute,
    )


# --- a recipe's upstream range, built commit by commit and benched on a device ---


def commit_range(
    settings: Settings, recipe: Recipe, good: str, bad: str, progress: Progress | None = None
) -> list[str]:
    """good, then every first-parent commit after it up to bad (fetching that history if needed)."""
    good_target = resolve_target(settings, recipe, good, progress)
    bad_target = resolve_target(settings, recipe, bad, progress)
    cache = ObjectCache(settings)
    for target in (good_target, bad_target):
        cache.ensure(target.commit, target.sources + recipe.upstream.sources, progress=progress)
    note = fetch_range(settings, recipe, bad_target, good_target.commit, progress)
    git = cache.git
    if not is_ancestor(git, good_target.commit, bad_target.commit):
        why = (
            note
            if note and note.startswith("history missing")
            else f"{good} is not an ancestor of {bad}"
        )
        raise ConfigError(
            f"cannot bisect {good}..{bad}: {why}",
            hint="--good must be an older commit on the history of --bad, from a git source with "
            "history",
        )
    between = git(
        "rev-list",
        "--first-parent",
        "--ancestry-path",
        "--reverse",
        f"{good_target.commit}..{bad_target.commit}",
    ).split()
    if not between:
        raise ConfigError(f"cannot bisect {good}..{bad}: they are the same commit")
    return [good_target.commit, *between]


def describe_commit(settings: Settings, sha: str) -> UpstreamCommit:
    fields = (
        ObjectCache(settings)
        .git("log", "-1", "--format=%H%x00%s%x00%an <%ae>%x00%aI", sha)
        .split("\0")
    )
    return UpstreamCommit(*fields[:4])


def bisect_work(settings: Settings, recipe: Recipe) -> Path:
    """WORK/bisect/<recipe>: one scratch worktree and build dir that every commit is synced into,
    the derived recipes (with the stack, and bare), and the records."""
    return settings.work / "bisect" / recipe.name.replace("/", "--")


class CommitBuilder:
    """Builds a recipe at any upstream commit: with its patch stack where the stack applies, else
    bare (and says so); a commit that does not build is skipped with the build's reason."""

    def __init__(
        self,
        settings: Settings,
        recipe: Recipe,
        target: str,
        *,
        environ: Mapping[str, str],
        options: BuildOptions = BuildOptions(),
        remote: RemoteConfig | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.work = bisect_work(settings, recipe)
        self.settings = replace(settings, work=self.work)
        self.recipe, self.target, self.environ, self.remote, self.progress = (
            recipe,
            target,
            environ,
            remote,
            progress,
        )
        # one content-addressed store: a second bisect over the range builds nothing
        self.options = replace(
            options, artifacts=options.artifacts or builder.artifacts_root(settings)
        )
        toolchains = configured_paths_file(settings)
        if toolchains.is_file():
            self.work.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(toolchains, configured_paths_file(self.settings))

    def _derived(self, sha: str, *, bare: bool) -> Recipe:
        folder = self.work / ("bare" if bare else "stack")
        folder.mkdir(parents=True, exist_ok=True)
        series = self.recipe.series
        if bare:
            series = folder / "series"
            series.write_text(
                f"# kzbuild bisect: {self.recipe.name} without its patches\n", encoding="utf-8"
            )
        upstream = replace(self.recipe.upstream, commit=sha)
        return replace(
            self.recipe, path=folder / self.recipe.path.name, upstream=upstream, series=series
        )

    def __call__(self, sha: str) -> BuiltCommit:
        stack_problem = ""
        try:
            prepared = builder.prepare(
                self.settings,
                self._derived(sha, bare=False),
                self.target,
                environ=self.environ,
                options=self.options,
            )
        except PatchError as exc:
            stack_problem = exc.message.splitlines()[0]
            log.warning(
                "%s: the patch stack does not apply (%s); testing it bare", sha[:12], stack_problem
            )
            prepared = builder.prepare(
                self.settings,
                self._derived(sha, bare=True),
                self.target,
                environ=self.environ,
                options=self.options,
            )
        try:
            result = builder.build(prepared, progress=None, remote=self.remote)
        except BuildFailed as exc:
            return BuiltCommit(
                failed=exc.message.splitlines()[0],
                bare=bool(stack_problem),
                stack_problem=stack_problem,
            )
        return BuiltCommit(
            artifact=str(result.artifact.path),
            build_id=result.artifact.build_id,
            bare=bool(stack_problem),
            stack_problem=stack_problem,
        )


def judge_of(metric: Metric) -> Judge:
    """Speed and memory: ``compare``. KLD: different when the median moved by the metric's
    kld_step or more (the effect's *_pct fields then hold that shift, in nats: a check of the
    output is no noisy sample)."""
    if metric.kind != KLD:
        return compare

    def kld(
        a: Sequence[float], b: Sequence[float], limits: BisectLimits, *, seed: int
    ) -> tuple[PairVerdict, Effect]:
        shift = statistics.median(b) - statistics.median(a)
        effect = Effect(shift, shift, shift, len(a), len(b), 1.0, metric.kld_step)
        verdict = PairVerdict.DIFFERENT if abs(shift) >= metric.kld_step else PairVerdict.SAME
        return verdict, effect

    return kld


class DeviceBencher:
    """Deploys the commits' artifacts (only what the device lacks moves) and benches them in
    interleaved blocks on one device (``kzbuild ab``'s runner); a sample is one turn's value of the
    metric (its test's t/s, or that process's memory)."""

    def __init__(
        self,
        settings: Settings,
        transport: Transport,
        device: Device,
        spec: BenchSpec,
        metric: Metric,
        *,
        cooling: Cooling | None = None,
        wait: float = 0.0,
    ) -> None:
        self.settings, self.transport, self.device, self.spec = settings, transport, device, spec
        self.metric, self.cooling, self.wait = metric, cooling, wait
        self.test = metric.test
        self.checked = Checked()  # warned and checked once per bisect, not per round

    def __call__(
        self, artifacts: Mapping[str, str], blocks: int, seed: int, stopped: Callable[[], bool]
    ) -> Mapping[str, Sequence[float]]:
        named = [(sha[:12], Path(path)) for sha, path in artifacts.items()]
        arms = deploy_arms(self.transport, self.device, named, wait=self.wait)
        # a store of its own: the devices of a pool bench at once, each in its thread
        with ResultsStore(self.settings.results) as store:
            done = run_interleaved(
                self.settings,
                self.transport,
                self.device,
                arms,
                self.spec,
                store,
                blocks=blocks,
                seed=seed,
                cooling=self.cooling,
                checked=self.checked,
                stopped=stopped,
            )
        if self.test is None:
            self.test = done.first_record().test
        by_arm = {sha[:12]: sha for sha in artifacts}
        return {
            by_arm[name]: [
                value
                for r in records
                if r.test == self.test
                for value in (self.metric.value(r),)
                if value
            ]
            for name, records in done.records.items()
        }


class QualityBencher:
    """Deploys the commits' artifacts and checks each one's output on one device as ``kzbuild ab``
    does (llama-perplexity's KL divergence, the plan's quality: settings), against the logits of
    the first artifact given, the good end's (an anchored search gives it first); a sample is a
    commit's mean KLD, one check of them all (a single block: nothing to stop between). Each check
    is stored with the quality records."""

    test: str | None = None

    def __init__(
        self,
        settings: Settings,
        transport: Transport,
        device: Device,
        model: str,
        spec: QualitySpec,
        *,
        wait: float = 0.0,
    ) -> None:
        self.settings, self.transport, self.device = settings, transport, device
        self.model, self.spec, self.wait = model, spec, wait

    def __call__(
        self, artifacts: Mapping[str, str], blocks: int, seed: int, stopped: Callable[[], bool]
    ) -> Mapping[str, Sequence[float]]:
        named = [(sha[:12], Path(path)) for sha, path in artifacts.items()]
        arms = deploy_arms(self.transport, self.device, named, wait=self.wait)
        releases = {arm.name: arm.release for arm in arms}
        with device_lock(self.transport, self.device.root, "bisect", wait=self.wait):
            records = check_variants(
                self.transport,
                self.device,
                releases,
                replace(self.spec, reference=named[0][0]),
                self.model,
                quality_store(self.settings.results),
                self.settings.work / "quality",
            )
        by_arm = {sha[:12]: sha for sha in artifacts}
        return {by_arm[r.variant]: [r.stats.kld_mean] for r in records}


def bisect(
    settings: Settings,
    recipe: Recipe,
    *,
    good: str,
    bad: str,
    build: Callable[[str], BuiltCommit],
    benchers: Mapping[str, Bencher],
    identity: Mapping[str, str],
    metric: Metric,
    limits: BisectLimits = BisectLimits(),
    seed: int = 0,
    progress: Progress | None = None,
    build_ahead: bool = True,
) -> BisectReport:
    """Bisect good..bad of the recipe's upstream; resumes from the record of the same bisect.
    ``build_ahead``: build the commits the next comparisons may need while the devices measure
    (not when a device is this host, whose measurements the builds would slow)."""
    check_limits(limits)
    shas = commit_range(settings, recipe, good, bad, progress)
    folder = bisect_work(settings, recipe) / "records"
    with locked(
        bisect_work(settings, recipe) / ".lock",
        what=f"the bisect worktree of {recipe.name}",
        wait=0,
    ):
        record = Record.open(
            folder,
            {**identity, "good": shas[0], "bad": shas[-1], "seed": str(seed)},
            shas,
            zero_ok=metric.anchored,
        )
        search = Search(
            record,
            build,
            benchers,
            limits,
            seed,
            on_event=progress or (lambda message: None),
            judge=judge_of(metric),
            anchored=metric.anchored,
            ahead=build_ahead,
        )
        found = search.run()
    label = metric.label(record.test or None)
    return report(
        search,
        recipe.name,
        label,
        found,
        lambda sha: describe_commit(settings, sha),
        absolute=metric.anchored,
    )


def to_json(found: BisectReport) -> dict[str, object]:
    return {
        "recipe": found.recipe,
        "metric": found.metric,
        "good": found.good,
        "bad": found.bad,
        "outcome": found.outcome.value,
        "builds": found.builds,
        "built_ahead_unused": found.built_ahead_unused,
        "benches": found.benches,
        "effect": dataclasses.asdict(found.effect) if found.effect else None,
        "effect_unit": "mean KLD" if found.absolute else "%",
        "culprit": found.culprit.to_dict() if found.culprit else None,
        "pr": found.pr,
        "range": [found.range_lo, found.range_hi] if found.range_lo is not None else None,
        "commits": [{"index": i, **c.to_dict()} for i, c in enumerate(found.commits) if tried(c)],
        "steps": [
            {
                **dataclasses.asdict(s),
                "verdict_lo": s.verdict_lo.value,
                "verdict_hi": s.verdict_hi.value,
            }
            for s in found.steps
        ],
        "notes": list(found.notes),
    }


def tried(commit: CommitState) -> bool:
    """Measured, or skipped (a build made ahead for a comparison that never came is neither)."""
    return bool(commit.skipped) or any(commit.samples.values())


def builds_made(found: BisectReport) -> str:
    unused = found.built_ahead_unused
    return f"{found.builds} built here" + (
        f" ({unused} of them ahead, for comparisons that never came)" if unused else ""
    )


def markdown(found: BisectReport) -> str:
    """Every commit tried, its samples and its verdict; then the answer."""
    lines = [
        f"# bisect of {found.recipe}: {found.metric}",
        "",
        f"{found.good[:12]}..{found.bad[:12]}: {len(found.commits) - 1} commits, "
        f"{builds_made(found)}, {found.benches} interleaved rounds",
        "",
        "| # | commit | built | samples | median | verdict |",
        "|---|---|---|---|---|---|",
    ]
    digits = 6 if found.absolute else 2
    verdicts = {
        s.mid: f"vs lower end {s.verdict_lo.value}, vs upper end {s.verdict_hi.value}: {s.chose}"
        for s in found.steps
    }
    for index, commit in enumerate(found.commits):
        if not tried(commit):
            continue
        built = (
            f"skipped: {commit.skipped}"
            if commit.skipped
            else "bare (stack does not apply)"
            if commit.bare
            else "with the stack"
        )
        every = [v for values in commit.samples.values() for v in values]
        median = (
            "; ".join(
                f"{statistics.median(v):.{digits}f} on {d}" for d, v in commit.samples.items() if v
            )
            or "-"
        )
        end = (
            "good end"
            if index == 0
            else "bad end"
            if index == len(found.commits) - 1
            else verdicts.get(index, "")
        )
        lines.append(f"| {index} | {commit.sha[:12]} | {built} | {len(every)} | {median} | {end} |")
    lines += ["", answer(found)]
    lines += [f"- {note}" for note in found.notes]
    return "\n".join(lines) + "\n"


def describe_effect(found: BisectReport) -> str:
    effect = found.effect
    if effect is None:
        return ""
    if found.absolute:
        return f"mean KLD {effect.delta_pct:+.6f} (a change of {effect.min_effect_pct:g} counts)"
    return effect.describe()


def answer(found: BisectReport) -> str:
    effect = describe_effect(found)
    if found.outcome is BisectOutcome.NO_CHANGE:
        return f"no change: good and bad cannot be told apart ({effect})"
    if found.outcome is BisectOutcome.SKIPPED_RANGE:
        lo, hi = found.range_lo or 0, found.range_hi or 0
        return (
            f"the change lies in {found.commits[lo].sha[:12]}..{found.commits[hi].sha[:12]}, "
            f"whose commits between could not be built ({effect})"
        )
    culprit = found.culprit
    assert culprit is not None
    pr = f"PR #{found.pr}" if found.pr is not None else "no PR number in the subject"
    return (
        f"first commit that moved {found.metric}: {culprit.sha[:12]} {culprit.subject} ({pr}, "
        f"{culprit.author}, {culprit.date}): {effect}"
    )
