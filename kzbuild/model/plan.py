"""An experiment plan (``plans/NAME.yaml``): the model, the device, the llama-bench runs, and for
``kzbuild ab`` the variants."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kzbuild.model.bench import BenchSpec
from kzbuild.model.effect import MIN_EFFECT_PCT
from kzbuild.model.memory import MemoryLimits
from kzbuild.model.quality import QualitySpec


@dataclass(frozen=True)
class PlanModel:
    path: (
        str  # on the device; relative paths start at the device root (a name becomes models/<name>)
    )
    sha256: str | None  # None: not pinned yet (the run warns with the hash it measured)
    line: int  # of its sha256 key, for errors


@dataclass(frozen=True)
class PlanRun:
    """One llama-bench configuration (with its sweep) of the plan."""

    name: str
    spec: BenchSpec


@dataclass(frozen=True)
class PlanAb:
    variants: tuple[str, ...] = ()  # empty: every variant
    blocks: int | None = None
    cool_to: float | None = None  # deg C
    cool_wait: float | None = None  # seconds
    cool_zones: tuple[str, ...] = ()
    min_effect_pct: float = MIN_EFFECT_PCT  # "no detectable effect": an interval within +-this
    max_width_pct: float | None = None  # more blocks, a batch at a time, while an interval is wider
    max_seconds: float | None = None  # ... until this long has been spent benching


@dataclass(frozen=True)
class PlanTurn:
    """The team's turn: a prompt of ``prompt`` tokens prefilled with the run ``prefill``, then
    ``generate`` tokens decoded with the run ``decode`` (runs of the plan)."""

    prompt: int
    generate: int
    prefill: str
    decode: str


@dataclass(frozen=True)
class Plan:
    path: Path
    name: str
    description: str
    model: PlanModel
    device: str | None
    runs: tuple[PlanRun, ...]
    ab: PlanAb
    seed: int | None = None  # the sweep order of every run, and ab's interleaved order
    memory: MemoryLimits = MemoryLimits()  # memory_budget, htp_session_limit (in each run too)
    turn: PlanTurn | None = None
    quality: QualitySpec | None = None  # kzbuild ab checks each variant's output (quality:)
