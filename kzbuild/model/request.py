"""What a measuring command asks for: the command line as given (BenchArgs, AbArgs, RollArgs,
BisectArgs), and the request the resolver (measure/request.py) makes of it, the plan and the
defaults, once."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from kzbuild.model.bench import BenchSpec
from kzbuild.model.bisect import BisectLimits, Metric
from kzbuild.model.interleave import Cooling
from kzbuild.model.plan import Plan, PlanAb
from kzbuild.model.quality import QualitySpec

# the command-line options that are llama-bench's own, each with llama-bench's name for it
LLAMA_BENCH_FLAGS = {
    "prompt": "p",
    "gen": "n",
    "ngl": "ngl",
    "threads": "t",
    "batch": "b",
    "ubatch": "ub",
    "dev": "dev",
    "repetitions": "r",
}


@dataclass(frozen=True)
class BenchArgs:
    """The llama-bench part of a measuring command's line (bench, ab), as given: None or empty
    when not given. The names are the command's own option names."""

    model: str | None = None
    prompt: str | None = None
    gen: str | None = None
    ngl: str | None = None
    threads: str | None = None
    batch: str | None = None
    ubatch: str | None = None
    dev: str | None = None
    repetitions: str | None = None
    env: tuple[str, ...] = ()
    sweep: tuple[str, ...] = ()
    seed: int | None = None
    cooldown: float = 0.0
    timeout: float | None = None
    extra: tuple[str, ...] = ()
    plan_file: Path | None = None
    device: str | None = None

    @classmethod
    def names(cls) -> frozenset[str]:
        return frozenset(field.name for field in fields(cls))

    def llama_bench_options(self) -> tuple[tuple[str, str], ...]:
        """The llama-bench options given, by llama-bench's names, in llama-bench's order."""
        return tuple(
            (flag, value)
            for name, flag in LLAMA_BENCH_FLAGS.items()
            if (value := getattr(self, name)) is not None
        )


@dataclass(frozen=True)
class BenchRequest:
    """The runs to bench, each (its plan name, or "" without a plan; its spec), and where."""

    plan: Plan | None
    runs: tuple[tuple[str, BenchSpec], ...]
    device: str | None  # the option's, else the plan's; None: the default device


@dataclass(frozen=True)
class AbArgs:
    """What only ``kzbuild ab`` takes, as given."""

    target: str | None = None
    variants: tuple[str, ...] = ()
    blocks: int | None = None
    cool_to: str | None = None
    cool_wait: float | None = None
    cool_zones: tuple[str, ...] = ()
    max_kld: float | None = None
    min_top1: float | None = None


@dataclass(frozen=True)
class AbRequest:
    """An A/B of the recipe's variants: the bench runs, and how the blocks are run and judged."""

    bench: BenchRequest
    target: str
    selection: tuple[str, ...]  # empty: every variant
    blocks: int
    seed: int | None  # the interleaved order's; None: fresh, recorded
    cooling: Cooling | None
    precision: PlanAb  # the minimum effect of interest, the adaptive width
    quality: QualitySpec | None


@dataclass(frozen=True)
class RollArgs:
    """What ``kzbuild roll`` takes that a plan or a default completes, as given."""

    plan_target: str  # 'none': no build plan is checked
    plan_file: Path | None = None
    to: tuple[str, ...] = ()


@dataclass(frozen=True)
class RollRequest:
    plan: Plan | None  # benches each candidate against the pin on the device, with its first run
    to: tuple[str, ...]  # the upstream refs to try; empty: the newest ones
    plan_target: str | None  # the target whose build plan each candidate must produce
    blocks: int
    seed: int


@dataclass(frozen=True)
class BisectArgs:
    """What ``kzbuild bisect`` takes that its plan or a default completes, as given."""

    plan_file: Path
    metric: str | None = None
    target: str | None = None
    device: str | None = None
    seed: int | None = None
    limits: BisectLimits = BisectLimits()


@dataclass(frozen=True)
class BisectRequest:
    """A bisect's request: the plan's run the metric names, and how commits are told apart."""

    plan: Plan
    plan_digest: str  # sha256 of the plan file: part of the record's identity
    metric: Metric
    spec: BenchSpec  # the plan run the metric names
    quality: QualitySpec  # the plan's quality: settings (a kld metric checks the output with them)
    limits: BisectLimits  # a kld metric: one sample per commit
    target: str
    device: str | None  # the option's, else the plan's; None: the recipe's device
    seed: int  # the option's, else the plan's, else 0
