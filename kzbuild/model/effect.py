"""An A/B effect: B's median against A's with a bootstrap interval (computed by kzbuild.measure.stats.median_effect)."""

from __future__ import annotations

from dataclasses import dataclass

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Effect:
    """B's median against A's, in percent of A's, with a bootstrap interval."""

    delta_pct: float
    low_pct: float
    high_pct: float
    samples_a: int
    samples_b: int
    confidence: float = CONFIDENCE

    @property
    def detectable(self) -> bool:
        return self.low_pct > 0 or self.high_pct < 0

    def describe(self) -> str:
        interval = f"[{self.low_pct:+.1f}%, {self.high_pct:+.1f}%]"
        if not self.detectable:
            return f"no detectable effect ({self.delta_pct:+.1f}%, {self.confidence:.0%} interval {interval})"
        return f"{self.delta_pct:+.1f}% ({self.confidence:.0%} interval {interval})"

    def contradicts(self, expected_pct: float) -> bool:
        """The interval lies wholly on the other side of zero from an expected effect."""
        return (expected_pct > 0 and self.high_pct < 0) or (expected_pct < 0 and self.low_pct > 0)
