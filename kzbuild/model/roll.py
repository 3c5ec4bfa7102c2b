"""What ``kzbuild roll`` finds: per candidate upstream, the stack check, who broke each conflicting
patch, the host build, the patches' own tests, the v79 plan, the bench A/B; and the outcome."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from kzbuild.model.effect import Effect, EffectVerdict
from kzbuild.model.quality import WRONG, QualityRecord, describe_output
from kzbuild.model.stackcheck import BumpPlan, StepStatus

# roll's defaults (kzbuild.measure.roll and its CLI take them from here)
DEFAULT_LIMIT = 3  # candidates of each kind (tags, versions) looked at
PLAN_TARGET = "v79"  # the target whose build plan each rolled candidate must produce
DEFAULT_BLOCKS = 3  # pin and candidate each benched this many times, ABAB
DEFAULT_THRESHOLD_PCT = 5.0  # the candidate's median may fall this many percent below the pin's

PR_SUBJECT = re.compile(r"\(#(\d+)\)\s*$")


def pr_number(subject: str) -> int | None:
    """The upstream pull request a squash-merged subject names: "ggml: fix x (#12345)" -> 12345."""
    match = PR_SUBJECT.search(subject)
    return int(match.group(1)) if match else None


class Outcome(str, Enum):
    """How far a candidate got."""

    ROLLABLE = "rollable"
    CONFLICT = "conflict"  # a patch does not apply
    BUILD_FAILED = "build failed"
    TESTS_FAILED = "tests failed"  # a live patch's Kz-Test fails
    REGRESSED = "regressed"  # the bench A/B fell past the threshold
    WRONG = "wrong output"  # the candidate's output is past the plan's quality limits
    OVER_BUDGET = "over memory budget"  # a run of the candidate is past the plan's memory limits
    NOT_TRIED = (
        "not tried"  # the stack holds, but a newer candidate is rollable: no build, no bench
    )


@dataclass(frozen=True)
class Candidate:
    """An upstream commit to try, and where it came from."""

    label: str  # what bump --to takes: a sha, branch, tag or pypi:package==version
    commit: str
    origin: str  # "default branch", "tag", "pypi", "--to"
    date: str = ""  # committer date, ISO 8601 (newest first)

    def to_dict(self) -> dict[str, str]:
        return {
            "label": self.label,
            "commit": self.commit,
            "origin": self.origin,
            "date": self.date,
        }


@dataclass(frozen=True)
class RollStep:
    """One check after the stack holds: "build", "tests", "plan" or "bench"."""

    kind: str
    label: str
    status: StepStatus
    detail: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "label": self.label,
            "status": self.status.value,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class BenchDelta:
    """The candidate's median against the pin's, from interleaved runs (see
    kzbuild.measure.stats)."""

    metric: str
    order: tuple[str, ...]  # the run order, "pin"/"candidate", as run
    pin: tuple[float, ...]
    candidate: tuple[float, ...]
    effect: Effect  # the candidate's median against the pin's
    spread_pin_pct: float  # (max - min) / median of each side's samples
    spread_candidate_pct: float
    threshold_pct: float
    quality: tuple[
        QualityRecord, ...
    ] = ()  # the plan's quality check: pin and candidate against the reference
    # the plan's memory limits (memory_budget, htp_session_limit:HTPn) a run of the candidate
    # exceeded
    memory_over: tuple[str, ...] = ()

    @property
    def wrong(self) -> bool:
        """The candidate's output is past the quality limits."""
        return any(
            record.variant == "candidate" and record.verdict == WRONG for record in self.quality
        )

    @property
    def regressed(self) -> bool:
        """The whole interval is below zero and the median fell more than the threshold."""
        return self.effect.high_pct < 0 and self.effect.delta_pct < -self.threshold_pct

    def describe(self) -> str:
        effect = self.effect
        return (
            (
                f"{self.metric}: {effect.delta_pct:+.1f}% ({effect.confidence:.0%} interval "
                f"[{effect.low_pct:+.1f}%, {effect.high_pct:+.1f}%]; "
                f"spread pin {self.spread_pin_pct:.1f}%, candidate "
                f"{self.spread_candidate_pct:.1f}%; "
                f"{len(self.pin)}+{len(self.candidate)} runs interleaved)"
            )
            + (
                ""
                if effect.verdict is EffectVerdict.EFFECT
                else f"; {effect.verdict.value} at +-{effect.min_effect_pct:g}%"
            )
            + "".join(
                f"; {record.variant} output: {describe_output(record)}" for record in self.quality
            )
            + (f"; candidate over {', '.join(self.memory_over)}" if self.memory_over else "")
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "metric": self.metric,
            "order": list(self.order),
            "pin": list(self.pin),
            "candidate": list(self.candidate),
            "delta_pct": self.effect.delta_pct,
            "low_pct": self.effect.low_pct,
            "high_pct": self.effect.high_pct,
            "spread_pin_pct": self.spread_pin_pct,
            "spread_candidate_pct": self.spread_candidate_pct,
            "threshold_pct": self.threshold_pct,
            "regressed": self.regressed,
            "verdict": self.effect.verdict.value,
            "quality": [record.to_dict() for record in self.quality],
            "wrong": self.wrong,
            "memory_over": list(self.memory_over),
        }


@dataclass(frozen=True)
class CandidateResult:
    candidate: Candidate
    plan: BumpPlan  # the stack checked at the candidate, with a bisect per conflict
    outcome: Outcome
    steps: tuple[RollStep, ...] = ()
    bench: BenchDelta | None = None

    @property
    def would_drop(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.plan.check.upstreamed)

    def to_dict(self) -> dict[str, object]:
        bisects = []
        for b in self.plan.bisects:
            entry = b.to_dict()
            entry["pr"] = pr_number(b.culprit.subject) if b.culprit else None
            bisects.append(entry)
        return {
            **self.candidate.to_dict(),
            "outcome": self.outcome.value,
            "history": self.plan.check.history,
            "commits_between": self.plan.check.commits_between,
            "patches": [p.to_dict() for p in self.plan.check.patches],
            "bisect": bisects,
            "would_drop": list(self.would_drop),
            "steps": [s.to_dict() for s in self.steps],
            "bench": self.bench.to_dict() if self.bench else None,
            "notes": list(self.plan.check.notes + self.plan.notes),
        }


@dataclass(frozen=True)
class Unchecked:
    """A source roll could not ask for candidates (its host or index did not answer), or a
    candidate of it that could not be fetched."""

    source: str  # the source's label, or the candidate's
    why: str  # what git or pip said

    def describe(self) -> str:
        return f"could not check {self.source}: {self.why}"


@dataclass(frozen=True)
class RollReport:
    recipe: str
    pin: str
    results: tuple[CandidateResult, ...]  # newest first
    notes: tuple[str, ...] = ()
    branch: str | None = None  # --write: the branch made
    commit: str | None = None  # --write: its commit
    unchecked: tuple[Unchecked, ...] = ()  # newer upstream may be there: the roll is incomplete

    @property
    def rollable(self) -> CandidateResult | None:
        return next((r for r in self.results if r.outcome is Outcome.ROLLABLE), None)

    @property
    def blocking(self) -> CandidateResult | None:
        """Without a rollable candidate: the newest one, whose failure the exit code reports."""
        return None if self.rollable or not self.results else self.results[0]

    def to_dict(self) -> dict[str, object]:
        rollable = self.rollable
        return {
            "recipe": self.recipe,
            "pin": self.pin,
            "rollable": rollable.candidate.to_dict() if rollable else None,
            "would_drop": list(rollable.would_drop) if rollable else [],
            "branch": self.branch,
            "commit": self.commit,
            "candidates": [r.to_dict() for r in self.results],
            "notes": list(self.notes),
            "unchecked": [{"source": u.source, "why": u.why} for u in self.unchecked],
        }
