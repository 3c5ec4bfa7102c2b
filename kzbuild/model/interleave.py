"""An interleaved experiment on one device: its variants (arms), cooling, and what it measured.

Shared by ``kzbuild ab`` (what each patch buys) and ``kzbuild roll`` (the pin against a candidate).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kzbuild.errors import ResultsError
from kzbuild.model.result import BenchRecord

DEFAULT_COOL_WAIT = 600.0  # seconds a block waits at most for the device to cool down
DEFAULT_COOL_POLL = 10.0  # seconds between two readings of the thermal zones


@dataclass(frozen=True)
class Arm:
    """One variant of an experiment, deployed on the device."""

    name: str  # how records and reports name it, e.g. "full", "minus:<patch>", "upstream", "pin"
    release: str  # the release's name under ROOT/releases (DeployResult.release)


@dataclass(frozen=True)
class Cooling:
    """Before each block: wait until every chosen thermal zone reads below ``limit_c``."""

    limit_c: float
    max_wait_s: float = DEFAULT_COOL_WAIT  # then the block starts anyway, recorded as not cooled
    poll_s: float = DEFAULT_COOL_POLL
    zones: tuple[str, ...] = (
        "*",
    )  # fnmatch patterns of zone types (thermal_zone*/type) that count
    sysfs: str = "/sys"  # the device's sysfs root; tests point it at a tree they build


@dataclass(frozen=True)
class BlockStart:
    """The thermal zones when a block started (after cooling down, when asked)."""

    block: int
    temperatures: Mapping[str, float]  # deg C by zone type
    hottest_c: float
    waited_s: float
    cooled: bool  # below the limit (False: the wait ran out and the block started anyway)


@dataclass(frozen=True)
class Turn:
    """One variant's bench run within a block, in run order."""

    block: int
    blocks: int
    position: int  # within the block
    variant: str


@dataclass
class Checked:
    """What interleaved experiments on one device checked once, kept by a caller that runs several
    (bisect's rounds): the warnings given, the recipes whose log formats were checked, and
    whether each release's runs are measured under kz-peakrss (by its directory)."""

    warned: set[str] = field(default_factory=set)
    recipes: set[str | None] = field(default_factory=set)
    measured: dict[str, bool] = field(default_factory=dict)


@dataclass(frozen=True)
class InterleavedRun:
    run_id: str
    seed: int  # of the interleaved order (and the sweep order inside each turn)
    order: tuple[tuple[str, ...], ...]  # variant names, block by block
    records: Mapping[str, tuple[BenchRecord, ...]]  # by variant name, in run order
    starts: tuple[BlockStart, ...]  # one per block when cooling was asked, else none
    logs: Path

    def first_record(self) -> BenchRecord:
        """The run's first record: its test is what a sample of the run is of."""
        first = next((records[0] for records in self.records.values() if records), None)
        if first is None:
            raise ResultsError(f"run {self.run_id}: llama-bench measured nothing")
        return first
