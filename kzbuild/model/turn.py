"""The wait the user feels: time to first token and the whole turn, from measured throughputs."""

from __future__ import annotations

from dataclasses import dataclass

# The seed reference the team measures against: ExecuTorch, Qwen3-4B on the same tablet (May 2026).
REFERENCE_NAME = "ExecuTorch Qwen3-4B"
REFERENCE_TTFT_S = 0.190
REFERENCE_DECODE_TPS = (14.0, 21.0)


@dataclass(frozen=True)
class TurnTime:
    prompt: int  # tokens prefilled
    generate: int  # tokens decoded
    prefill_tps: float  # median tok/s of the best pp<prompt> configuration
    decode_tps: float  # median tok/s of the best tg<generate> configuration
    prefill_config: str  # which configuration, as results shows it
    decode_config: str

    @property
    def ttft_s(self) -> float:
        """Time to first token: the prompt's prefill (its last logits give the first token)."""
        return self.prompt / self.prefill_tps

    @property
    def turn_s(self) -> float:
        """The whole turn: the prefill, then ``generate`` decoded tokens."""
        return self.ttft_s + self.generate / self.decode_tps


def reference_turn_s(generate: int) -> tuple[float, float]:
    """The reference's whole turn, fastest and slowest, for ``generate`` tokens."""
    fast, slow = REFERENCE_DECODE_TPS[1], REFERENCE_DECODE_TPS[0]
    return REFERENCE_TTFT_S + generate / fast, REFERENCE_TTFT_S + generate / slow
