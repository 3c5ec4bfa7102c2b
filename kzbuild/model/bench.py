"""What to benchmark: llama-bench's options, sweep axes and one bench request."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kzbuild.model.memory import MemoryLimits
from kzbuild.model.result import BenchRecord, VariantInfo

ENV_AXIS_PREFIX = "env:"


@dataclass(frozen=True)
class BenchOption:
    """A llama-bench option kzbuild passes through: its axis name, flag and JSON field."""

    name: str
    flag: str
    field: str  # the llama-bench JSON field that reports it; "" when none does
    help: str


BENCH_OPTIONS: tuple[BenchOption, ...] = (
    BenchOption("p", "-p", "n_prompt", "Prompt sizes (prefill tests), e.g. 512 or 128,512."),
    BenchOption("n", "-n", "n_gen", "Generation sizes (decode tests), e.g. 128; 0 for none."),
    BenchOption("ngl", "-ngl", "n_gpu_layers", "Layers offloaded to the accelerator (-ngl)."),
    BenchOption("t", "-t", "n_threads", "CPU threads (-t)."),
    BenchOption("b", "-b", "n_batch", "Logical batch size (-b)."),
    BenchOption("ub", "-ub", "n_ubatch", "Physical batch size (-ub)."),
    BenchOption("dev", "-dev", "devices", "llama.cpp devices, e.g. HTP0 or none (-dev)."),
    BenchOption("r", "-r", "", "Repetitions per test (-r)."),
)
OPTIONS_BY_NAME = {option.name: option for option in BENCH_OPTIONS}


@dataclass(frozen=True)
class SweepAxis:
    """``ngl=0,16,99`` or ``env:GGML_HEXAGON_GDN_SELECT=0,1,2``."""

    name: str
    values: tuple[str, ...]

    @property
    def env_name(self) -> str | None:
        return (
            self.name.removeprefix(ENV_AXIS_PREFIX)
            if self.name.startswith(ENV_AXIS_PREFIX)
            else None
        )


@dataclass(frozen=True)
class BenchSpec:
    model: str  # device path; relative paths are relative to the device root
    options: tuple[tuple[str, str], ...] = ()  # option name -> value, fixed for every run
    env: tuple[tuple[str, str], ...] = ()  # added to the device env for every run
    extra_args: tuple[str, ...] = ()  # more llama-bench arguments, passed as given
    sweep: tuple[SweepAxis, ...] = ()
    seed: int | None = None  # randomizes the sweep order; None: a fresh seed, recorded
    cooldown: float = 0.0  # seconds between runs
    timeout: float | None = None  # per run
    # a plan's memory_budget and htp_session_limit
    memory_limits: MemoryLimits = field(default_factory=MemoryLimits)


@dataclass(frozen=True)
class BenchPoint:
    """One llama-bench invocation of a sweep, in run order."""

    index: int
    total: int
    values: tuple[tuple[str, str], ...]  # axis name -> value

    def options(self, spec: BenchSpec) -> dict[str, str]:
        chosen = dict(spec.options)
        chosen.update(
            (name, value) for name, value in self.values if not name.startswith(ENV_AXIS_PREFIX)
        )
        return chosen

    def env(self, spec: BenchSpec) -> dict[str, str]:
        chosen = dict(spec.env)
        chosen.update(
            (name.removeprefix(ENV_AXIS_PREFIX), value)
            for name, value in self.values
            if name.startswith(ENV_AXIS_PREFIX)
        )
        return chosen


@dataclass(frozen=True)
class LlamaBenchTest:
    """One test of ``llama-bench -o json`` output, checked field by field
    (bench.parse_llama_bench_json)."""

    n_prompt: int
    n_gen: int
    n_depth: int
    avg_ts: float
    stddev_ts: float
    samples_ts: tuple[float, ...]
    build_commit: str
    model_type: str
    model_size: int
    config: Mapping[str, Any]  # every field that is not build, model, host or outcome: JSON scalars
    raw: Mapping[str, Any]  # the test as printed


@dataclass(frozen=True)
class DeviceState:
    fingerprint: Mapping[str, str]  # android.fingerprint + android.soc_model, else uname
    conditions: Mapping[str, Any]  # thermal (deg C by zone type), power, battery


@dataclass(frozen=True)
class DeviceModel:
    """A model on the device as its tools are given it: its sha256 (the record's identity) and
    the path on the tools' command line (a model stored as splits opens by its first split)."""

    sha256: str
    tool_path: str


@dataclass(frozen=True)
class BenchPart:
    """A bench run that is one turn of an interleaved experiment: its records join the experiment's
    run."""

    run_id: str
    logs: Path  # this turn's own folder
    first_seq: int  # records continue the run's positions
    model: DeviceModel  # resolved once for the experiment
    variant: VariantInfo
    measured: bool  # run under kz-peakrss, as the experiment checked once for the release


@dataclass(frozen=True)
class BenchRun:
    run_id: str
    seed: int
    records: tuple[BenchRecord, ...]
    logs: Path
