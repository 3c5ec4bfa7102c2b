"""What `kzbuild bisect` keeps and reports: the commits of a range, their builds and samples."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from kzbuild.model.effect import Effect
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
    # the effect's *_pct fields hold a shift in the metric's own unit (mean KLD), not a percentage
    absolute: bool = False
