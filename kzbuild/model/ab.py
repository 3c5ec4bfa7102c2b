"""``kzbuild ab``: the variants of a recipe's patch stack, how each was built, and what each patch
buys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kzbuild.model.effect import Effect
from kzbuild.model.interleave import InterleavedRun
from kzbuild.model.patch import Expectation
from kzbuild.model.quality import WRONG, PatchQuality, QualityRecord

FULL = "full"  # the whole stack: the reference every other variant is compared with
UPSTREAM = "upstream"  # the pin with no patches
MINUS = "minus:"  # + a patch's series name: the stack without that one patch
ALL_MINUS = "minus"  # in a variant selection: every "minus:" variant
DEFAULT_BLOCKS = 5  # interleaved blocks without --blocks or the plan's ab.blocks


@dataclass(frozen=True)
class VariantSpec:
    name: str
    patches: tuple[str, ...]  # series names it applies, in order
    without: str | None = None  # the patch a "minus:" variant leaves out

    @property
    def slug(self) -> str:
        """Its folder name under WORK/ab/<recipe>/."""
        if self.without is None:
            return self.name
        return "minus-" + self.without.removesuffix(".patch").replace("/", "--")


@dataclass(frozen=True)
class VariantBuild:
    """A variant synced and built, or why it could not be (a patch that does not apply without the
    one left out)."""

    spec: VariantSpec
    build_id: str | None
    reused: bool  # the artifact existed: nothing was compiled
    problem: str | None = None
    release: str | None = None  # its release on the device, once deployed
    bytes_sent: int = 0  # by its deploy


@dataclass(frozen=True)
class PatchEffect:
    """What a patch (or the whole stack, for ``upstream``) buys on one test and configuration:
    the full stack (B) against the variant without it (A), each turn counted once by its median."""

    variant: str
    patch: str | None  # None for upstream: the whole stack
    test: str  # pp512, tg64, ...
    # llama-bench configuration and env that vary, e.g. "t=8 ub=512 dev=HTP0
    # GGML_HEXAGON_GDN_SELECT=2"
    config: str
    full_median: float  # t/s: median of the full stack's turns
    variant_median: float
    effect: Effect  # in percent of the variant's median, with its bootstrap interval
    device: str  # where both were measured: an effect never mixes devices


Verdict = Literal[
    "confirmed",
    "contradicted",
    "no detectable effect",
    "undecided (interval too wide)",
    "not measured",
    "other device",
]


@dataclass(frozen=True)
class ExpectCheck:
    expectation: Expectation
    verdict: Verdict
    effects: tuple[PatchEffect, ...]  # the measured effects it was checked against

    @property
    def describe(self) -> str:
        shown = "; ".join(
            f"{e.config or 'default config'}: {e.effect.describe()}" for e in self.effects
        )
        return (
            f"{self.expectation.patch}: Kz-Expect {self.expectation.describe()}: {self.verdict}"
            + (f" ({shown})" if shown else "")
        )


@dataclass(frozen=True)
class AbRun:
    """One interleaved experiment of an ab: the command line's bench, or one run of a plan; every
    variant on one device."""

    name: str  # the plan's run name; "" for the command line's
    device: str  # the device's name (with a pool, each run keeps one device for all its batches)
    run: InterleavedRun


@dataclass(frozen=True)
class AbResult:
    recipe: str
    device: str  # the device's name; with a pool, the names of the members that benched
    target: str
    seed: int
    variants: tuple[VariantBuild, ...]
    runs: tuple[AbRun, ...]
    effects: tuple[PatchEffect, ...]
    checks: tuple[ExpectCheck, ...]
    quality: tuple[QualityRecord, ...] = ()  # each variant's output against the reference's
    patch_quality: tuple[PatchQuality, ...] = ()

    @property
    def wrong(self) -> tuple[QualityRecord, ...]:
        """The variants past the quality limits."""
        return tuple(record for record in self.quality if record.verdict == WRONG)

    @property
    def contradicted(self) -> tuple[ExpectCheck, ...]:
        return tuple(check for check in self.checks if check.verdict == "contradicted")
