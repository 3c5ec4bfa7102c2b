"""A profile: where the time of a prefill and a decode went, per op and backend, with provenance.

One :class:`ProfileRecord` per ``kzbuild profile`` run, a line of ``results/profiles.jsonl``. Its
provenance is a bench record's (build, device, model, env, argv, cwd, conditions); its phases
hold the node timings of kz-profile's timer (``graph``) and, on the NPU, what ggml-hexagon's own
profiler reported (``npu``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kzbuild.model.jsonfields import Fields
from kzbuild.model.result import BuildInfo, DeviceInfo, ModelInfo, run_fields

NO_LAYER = -1  # a node of no layer (the output head, the input embedding)
MAX_ROWS = 100_000  # (op, backend, layer) rows of one phase: more is not a llama.cpp graph
MAX_REPS = 10_000


@dataclass(frozen=True)
class OpTime:
    """The nodes of one op type on one backend in one layer: how many ran and their total time."""

    op: str
    backend: str
    layer: int
    count: int
    usec: float  # over all repetitions
    usec_reps: tuple[float, ...] = ()  # per repetition (kz-profile's timer); () for totals only

    def usec_in(self, rep: int | None, reps: int) -> float:
        """Its time in repetition ``rep``; without per-repetition times, the mean per repetition."""
        if rep is not None and self.usec_reps:
            return self.usec_reps[rep]
        return self.usec / max(reps, 1)

    @classmethod
    def from_dict(cls, data: object, where: str) -> OpTime:
        fields = Fields(data, where)
        fields.check_known(FIELD_NAMES[cls])
        layer = fields.data.get("layer")
        if isinstance(layer, bool) or not isinstance(layer, int) or layer < NO_LAYER:
            raise fields.error("layer", f"an integer >= {NO_LAYER}")
        return cls(
            op=fields.text("op"),
            backend=fields.text("backend"),
            layer=layer,
            count=fields.count("count", minimum=1),
            usec=fields.number("usec", zero_ok=True),
            usec_reps=tuple(
                float(x) for x in fields.numbers("usec_reps", (), max_items=MAX_REPS, zero_ok=True)
            ),
        )


@dataclass(frozen=True)
class PhaseProfile:
    """Prefill or decode (``all`` for a log without phase markers)."""

    phase: str
    tokens: int
    ops: tuple[OpTime, ...]
    wall_us_plain: tuple[float, ...] = ()  # per repetition, without the per-node timer
    wall_us_timed: tuple[float, ...] = ()  # per repetition, with it

    @property
    def op_usec(self) -> float:
        return sum(row.usec for row in self.ops)

    @property
    def per_rep(self) -> bool:
        """Every op holds a time per timed repetition: a repetition's ops and wall are one run."""
        reps = len(self.wall_us_timed)
        return reps > 0 and all(len(row.usec_reps) == reps for row in self.ops)

    def rep_usec(self, rep: int) -> float:
        """The sum of the ops of repetition ``rep`` (per_rep phases only)."""
        return sum(row.usec_reps[rep] for row in self.ops)

    @classmethod
    def from_dict(cls, data: object, where: str) -> PhaseProfile:
        fields = Fields(data, where)
        fields.check_known(FIELD_NAMES[cls])
        ops = fields.data.get("ops")
        if not isinstance(ops, list) or len(ops) > MAX_ROWS:
            raise fields.error("ops", f"a list of at most {MAX_ROWS} rows")
        return cls(
            phase=fields.text("phase"),
            tokens=fields.count("tokens"),
            ops=tuple(
                OpTime.from_dict(row, f"{where}: ops[{index}]") for index, row in enumerate(ops)
            ),
            wall_us_plain=tuple(
                float(x) for x in fields.numbers("wall_us_plain", (), max_items=MAX_REPS)
            ),
            wall_us_timed=tuple(
                float(x) for x in fields.numbers("wall_us_timed", (), max_items=MAX_REPS)
            ),
        )


@dataclass(frozen=True)
class ProfileRecord:
    run_id: str
    host_time: str
    build: BuildInfo
    device: DeviceInfo
    model: ModelInfo
    config: Mapping[str, Any]  # n_prompt, n_gen, n_ubatch, n_threads, reps, dev, ngl
    graph: tuple[PhaseProfile, ...]  # kz-profile's timer
    npu: tuple[PhaseProfile, ...] = ()  # ggml-hexagon's profiler (GGML_HEXAGON_PROFILE=1)
    env: Mapping[str, str] = field(default_factory=dict)
    argv: tuple[str, ...] = ()
    cwd: str = ""
    conditions: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["argv"] = list(self.argv)
        for key in ("graph", "npu"):
            data[key] = [_phase_dict(phase) for phase in getattr(self, key)]
        return data

    @classmethod
    def from_dict(cls, data: object, where: str = "profile") -> ProfileRecord:
        fields = Fields(data, where)
        fields.check_known(FIELD_NAMES[cls])
        return cls(**run_fields(fields), graph=_phases(fields, "graph"), npu=_phases(fields, "npu"))


def _phase_dict(phase: PhaseProfile) -> dict[str, Any]:
    return {
        "phase": phase.phase,
        "tokens": phase.tokens,
        "ops": [asdict(row) | {"usec_reps": list(row.usec_reps)} for row in phase.ops],
        "wall_us_plain": list(phase.wall_us_plain),
        "wall_us_timed": list(phase.wall_us_timed),
    }


def _phases(fields: Fields, key: str) -> tuple[PhaseProfile, ...]:
    value = fields.data.get(key, [])
    if not isinstance(value, list) or len(value) > 16:
        raise fields.error(key, "a list of phases")
    return tuple(
        PhaseProfile.from_dict(item, f"{fields.where}: {key}[{index}]")
        for index, item in enumerate(value)
    )


FIELD_NAMES: dict[type, frozenset[str]] = {
    cls: frozenset(f.name for f in dataclasses.fields(cls))
    for cls in (OpTime, PhaseProfile, ProfileRecord)
}


# --- what kzbuild profile is asked, and what it reports ---
@dataclass(frozen=True)
class ProfileSpec:
    model: str  # device path; relative paths start at the device root
    n_prompt: int = 512
    n_gen: int = 16
    n_ubatch: int | None = None
    threads: int | None = None
    ngl: int | None = None
    dev: str | None = None  # HTP0, none, ...; None: llama.cpp's default placement
    reps: int = 1
    env: tuple[tuple[str, str], ...] = ()
    timeout: float | None = None


@dataclass(frozen=True)
class ProfileRun:
    record: ProfileRecord
    logs: Path


@dataclass(frozen=True)
class OpSummary:
    """One row of a report: an op type (or a layer's op type) with its count, time per repetition
    and share."""

    layer: int | None  # None when grouped by op only
    op: str
    backends: tuple[str, ...]
    count: int
    usec: float
    share: float  # of the phase's graph time (the sum over its ops)
    # (max - min) / median over the repetitions; None without per-repetition times
    spread_pct: float | None = None


@dataclass(frozen=True)
class ComparedOp:
    phase: str
    op: str
    a_usec: float | None  # per repetition; None when the op did not run in A
    b_usec: float | None
    a_backends: tuple[str, ...]
    b_backends: tuple[str, ...]

    @property
    def delta_usec(self) -> float:
        return (self.b_usec or 0.0) - (self.a_usec or 0.0)

    @property
    def change_pct(self) -> float | None:
        return (
            None
            if not self.a_usec or self.b_usec is None
            else self.delta_usec / self.a_usec * 100.0
        )


@dataclass(frozen=True)
class BatchTotals:
    """The OPBATCH lines of one phase: the NPU's time per batch, ops included."""

    batches: int
    ops: int
    usec: int


@dataclass(frozen=True)
class HtpProfile:
    phases: tuple[PhaseProfile, ...]
    batches: dict[str, BatchTotals]  # phase -> its OPBATCH totals
    lines: int  # profile-op lines read
