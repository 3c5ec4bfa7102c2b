"""What `kzbuild bisect` keeps and reports: the commits of a range, their builds and samples; and
what a sample is (the metric)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from kzbuild.errors import ConfigError
from kzbuild.model.effect import Effect
from kzbuild.model.memory import BUFFER_KINDS, MIB
from kzbuild.model.result import BenchRecord
from kzbuild.model.stackcheck import UpstreamCommit


class PairVerdict(str, Enum):
    """Two commits' samples compared against the minimum effect of interest."""

    SAME = "same"  # the interval lies within ± the minimum effect
    DIFFERENT = "different"  # the interval excludes 0 and the median moved by at least the minimum
    UNDECIDED = "undecided"  # neither yet: more samples may tell


class BisectOutcome(str, Enum):
    FOUND = "found"  # the first commit whose change in the metric is beyond the noise
    NO_CHANGE = "no change"  # good and bad cannot be told apart
    SKIPPED_RANGE = "skipped range"  # the change is in a range whose commits could not be built


@dataclass(frozen=True)
class BisectLimits:
    """When two commits count as different, and how many samples a pair may take to tell."""

    min_effect_pct: float = 3.0
    samples_per_round: int = 3
    max_samples: int = 15
    confidence: float = 0.99


@dataclass
class CommitState:
    """One commit of the range as the record keeps it (mutable: a bisect fills it in)."""

    sha: str
    built: bool = False
    skipped: str = ""  # why it could not be built ("" when it was not skipped)
    bare: bool = False  # built without the patch stack (the stack does not apply there)
    stack_problem: str = ""
    build_id: str = ""
    artifact: str = ""
    samples: dict[str, list[float]] = field(
        default_factory=dict
    )  # by device: a comparison never mixes them

    def to_dict(self) -> dict[str, object]:
        return {
            "sha": self.sha,
            "built": self.built,
            "skipped": self.skipped,
            "bare": self.bare,
            "stack_problem": self.stack_problem,
            "build_id": self.build_id,
            "artifact": self.artifact,
            "samples": {d: list(v) for d, v in self.samples.items()},
        }


@dataclass(frozen=True)
class NarrowingStep:
    """One narrowing step: a commit measured between the two ends, and where that left the range."""

    lo: int
    mid: int
    hi: int
    verdict_lo: PairVerdict
    verdict_hi: PairVerdict
    chose: str  # "lower half" or "upper half"
    note: str = ""


@dataclass(frozen=True)
class BisectReport:
    recipe: str
    metric: str
    good: str
    bad: str
    outcome: BisectOutcome
    commits: tuple[CommitState, ...]
    steps: tuple[NarrowingStep, ...]
    builds: int  # commits this bisect built or took from the cache
    benches: int  # interleaved bench rounds run by this invocation
    effect: Effect | None  # the culprit against its parent (or good against bad when no change)
    culprit: UpstreamCommit | None = None
    culprit_index: int | None = None
    range_lo: int | None = None  # with SKIPPED_RANGE: the last good and first bad measured
    range_hi: int | None = None
    pr: int | None = None
    notes: tuple[str, ...] = ()
    built_ahead_unused: int = 0  # of the builds: made ahead for a comparison that never came
    # the effect's *_pct fields hold a shift in the metric's own unit (mean KLD), not a percentage
    absolute: bool = False


SPEED, PEAK, BUFFER, KLD = "t/s", "peak-memory", "buffer", "kld"
METRIC_WORDS = (PEAK, BUFFER, KLD)
DEFAULT_KLD_STEP = 0.01  # a change in mean KLD (nats) that makes two commits differ, when the
# plan's quality: sets no max_kld
METRIC_SYNTAX = (
    "RUN:TEST (t/s), [RUN:]peak-memory, [RUN:]buffer:TYPE[:KIND] (MiB) or kld[:STEP] (mean KLD)"
)


@dataclass(frozen=True)
class Metric:
    """What a sample is. Speed: the median t/s of one test of one plan run, per interleaved turn.
    Memory: per turn, the peak resident MiB of the run's llama-bench process (kz-peakrss), or the
    MiB of the buffers llama.cpp logged for one buffer type (and kind). Quality: a commit's mean KL
    divergence against the good end's logits (the plan's quality: settings); two commits differ when
    it moved by ``kld_step`` or more."""

    run: str
    test: str | None  # None: the first test the run reports
    kind: str = SPEED  # SPEED, PEAK, BUFFER or KLD
    buffer: str = ""  # BUFFER: the buffer type, as llama.cpp names it (CPU, CPU_REPACK, HTP0, ...)
    buffer_kind: str = ""  # BUFFER: one of BUFFER_KINDS, or "" for all of the type's buffers
    kld_step: float = DEFAULT_KLD_STEP

    @classmethod
    def parse(
        cls, text: str | None, runs: Sequence[str], *, max_kld: float | None = None
    ) -> Metric:
        """``RUN:TEST``, ``RUN`` or ``:TEST`` (the plan's first run), default the first run's first
        test; ``[RUN:]peak-memory``; ``[RUN:]buffer:TYPE[:KIND]``; ``kld[:STEP]`` (STEP default:
        the plan's max_kld, else DEFAULT_KLD_STEP)."""
        parts = (text or "").split(":")
        named = parts[0] not in METRIC_WORDS
        run = (parts[0] if named else "") or runs[0]
        if run not in runs:
            raise ConfigError(
                f"--metric {text}: the plan has no run '{run}'", hint=f"its runs: {', '.join(runs)}"
            )
        tail = parts[1:] if named else parts
        word, rest = (tail[0], tail[1:]) if tail else ("", [])
        if word not in METRIC_WORDS:
            return cls(run, ":".join(tail) or None)
        bad = ConfigError(f"--metric {text}: not a metric", hint=f"give {METRIC_SYNTAX}")
        if word == PEAK and not rest:
            return cls(run, None, PEAK)
        if word == BUFFER and 1 <= len(rest) <= 2 and rest[0]:
            kind = rest[1] if len(rest) == 2 else ""
            if kind and kind not in BUFFER_KINDS:
                raise ConfigError(
                    f"--metric {text}: no buffer kind '{kind}'",
                    hint=f"kinds: {', '.join(BUFFER_KINDS)}",
                )
            return cls(run, None, BUFFER, buffer=rest[0], buffer_kind=kind)
        if word == KLD and not named and len(rest) <= 1:
            return cls(run, None, KLD, kld_step=_kld_step(text, rest, max_kld))
        raise bad

    @property
    def anchored(self) -> bool:
        """Measured against the good end (a quality check) rather than interleaved."""
        return self.kind == KLD

    def label(self, test: str | None = None) -> str:
        if self.kind == PEAK:
            return f"{self.run}:peak-memory MiB"
        if self.kind == BUFFER:
            kind = f":{self.buffer_kind}" if self.buffer_kind else ""
            return f"{self.run}:buffer:{self.buffer}{kind} MiB"
        if self.kind == KLD:
            return f"mean KLD against the good end (step {self.kld_step:g})"
        return f"{self.run}:{test or self.test or 'first test'} t/s"

    def value(self, record: BenchRecord) -> float | None:
        """The sample one bench record gives (None: it has none)."""
        if self.kind == SPEED:
            return record.summary.median
        memory = record.memory
        if memory is None:
            return None
        if self.kind == PEAK:
            return None if memory.peak_bytes is None else memory.peak_bytes / MIB
        return sum(
            b.mib
            for b in memory.buffers
            if b.buffer == self.buffer and self.buffer_kind in ("", b.kind)
        )


def _kld_step(text: str | None, given: Sequence[str], max_kld: float | None) -> float:
    if not given:
        return max_kld if max_kld else DEFAULT_KLD_STEP
    try:
        step = float(given[0])
    except ValueError:
        step = math.nan
    if not math.isfinite(step) or step <= 0:
        raise ConfigError(f"--metric {text}: the step must be a mean KLD above 0, e.g. kld:0.01")
    return step
