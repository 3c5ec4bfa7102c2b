"""An A/B effect: B's median against A's with a bootstrap interval (computed by
kzbuild.measure.stats.median_effect)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

CONFIDENCE = 0.95
MIN_EFFECT_PCT = 2.0  # the smallest effect worth knowing, unless a plan sets ab.min_effect_pct


class EffectVerdict(str, Enum):
    """What an interval decides: an effect (it excludes 0), none worth knowing (it lies within
    +-min_effect_pct), or nothing (it excludes neither: too wide)."""

    EFFECT = "effect"
    NONE = "no detectable effect"
    UNDECIDED = "interval too wide to decide"


@dataclass(frozen=True)
class Effect:
    """B's median against A's, in percent of A's, with a bootstrap interval."""

    delta_pct: float
    low_pct: float
    high_pct: float
    samples_a: int
    samples_b: int
    confidence: float = CONFIDENCE
    min_effect_pct: float = MIN_EFFECT_PCT  # an interval within +-this: "no detectable effect"

    @property
    def detectable(self) -> bool:
        return self.low_pct > 0 or self.high_pct < 0

    @property
    def width_pct(self) -> float:
        return self.high_pct - self.low_pct

    @property
    def verdict(self) -> EffectVerdict:
        if self.detectable:
            return EffectVerdict.EFFECT
        if -self.min_effect_pct < self.low_pct and self.high_pct < self.min_effect_pct:
            return EffectVerdict.NONE
        return EffectVerdict.UNDECIDED

    def describe(self) -> str:
        interval = f"{self.confidence:.0%} interval [{self.low_pct:+.1f}%, {self.high_pct:+.1f}%]"
        verdict = self.verdict
        if verdict is EffectVerdict.NONE:
            within = f"within +-{self.min_effect_pct:g}%"
            return f"no detectable effect ({self.delta_pct:+.1f}%, {interval}, {within})"
        if verdict is EffectVerdict.UNDECIDED:
            return (
                f"undecided: {interval} is too wide to exclude either 0 "
                f"or +-{self.min_effect_pct:g}% "
                f"({self.delta_pct:+.1f}%; more blocks or a quieter device)"
            )
        return f"{self.delta_pct:+.1f}% ({interval})"

    def contradicts(self, expected_pct: float) -> bool:
        """The interval lies wholly on the other side of zero from an expected effect."""
        return (expected_pct > 0 and self.high_pct < 0) or (expected_pct < 0 and self.low_pct > 0)
