"""A benchmark result: one llama-bench test (or one manual reference figure) with its provenance.

Records are compared only with records of the same :attr:`BenchRecord.group_key`: the same
device (name and fingerprint), model (sha256), env set, test and llama-bench configuration.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

RecordKind = Literal["bench", "manual"]
RELEASE_TOKEN = "{release}"  # stands for the release dir in env values, so builds compare

# llama-bench JSON fields that describe the build, the model file, the host or the outcome
# rather than the configuration under test; every other field is configuration.
NOT_CONFIG_FIELDS = frozenset(
    {
        "build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_filename",
        "model_type", "model_size", "model_n_params", "n_prompt", "n_gen", "n_depth", "test_time",
        "avg_ns", "stddev_ns", "avg_ts", "stddev_ts", "samples_ns", "samples_ts",
    }
)  # fmt: skip


def bench_test_name(n_prompt: int, n_gen: int, n_depth: int = 0) -> str:
    """llama-bench's own test names: pp512, tg128, pp512+tg128, with ``@d4096`` for a depth."""
    parts = []
    if n_prompt:
        parts.append(f"pp{n_prompt}")
    if n_gen:
        parts.append(f"tg{n_gen}")
    name = "+".join(parts) or "empty"
    return f"{name}@d{n_depth}" if n_depth else name


def canonical_json(data: object) -> str:
    """One line, sorted keys: equal data gives equal bytes (ids, JSONL export)."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Summary:
    """Median and spread of a record's per-repetition throughput samples."""

    n: int
    median: float | None
    low: float | None
    high: float | None

    @property
    def spread_pct(self) -> float | None:
        """(max - min) / median, in percent; None without at least two samples."""
        if self.n < 2 or not self.median or self.low is None or self.high is None:
            return None
        return (self.high - self.low) / self.median * 100.0


def summarize(samples: Sequence[float], *, fallback: float | None = None) -> Summary:
    if not samples:
        return Summary(0, fallback, None, None)
    return Summary(len(samples), statistics.median(samples), min(samples), max(samples))


@dataclass(frozen=True)
class BuildInfo:
    build_id: str | None
    recipe: str | None = None
    manifest_sha256: str | None = None
    lock_sha256: str | None = None
    build_commit: str | None = None  # what llama-bench reports
    release_dir: str | None = None  # on the device
    upstream: str | None = None  # for manual rows: the upstream commit the figure was taken at


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    address: str = ""
    fingerprint: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """Identity for comparisons: the name plus what the device says it is."""
        return f"{self.name}|{canonical_json(dict(self.fingerprint))}"


@dataclass(frozen=True)
class ModelInfo:
    path: str = ""
    sha256: str | None = None
    name: str = ""  # manual rows: a description such as "Qwen3.5-4B Q4_0"
    type: str = ""  # llama-bench's model_type
    size: int | None = None

    @property
    def key(self) -> str:
        return self.sha256 or f"name:{self.name}"


@dataclass(frozen=True)
class SweepInfo:
    point: Mapping[str, str] = field(default_factory=dict)  # axis -> value, e.g. ngl -> 99
    seed: int | None = None
    index: int = 0  # position in the randomized order
    total: int = 1


@dataclass(frozen=True)
class BenchRecord:
    run_id: str
    kind: RecordKind
    host_time: str  # ISO 8601 UTC when the test's run started (manual: the date of the figure)
    test: str  # pp512, tg128, ...
    seq: int  # position in its run: records of a run keep the order llama-bench printed them in
    build: BuildInfo
    device: DeviceInfo
    model: ModelInfo
    config: Mapping[str, Any] = field(default_factory=dict)  # llama-bench configuration fields
    avg_ts: float | None = None
    stddev_ts: float | None = None
    samples_ts: tuple[float, ...] = ()
    range_ts: tuple[float, float] | None = None  # manual rows reported as "44-58"
    unit: str = "t/s"
    env: Mapping[str, str] = field(default_factory=dict)  # the effective env on the device
    argv: tuple[str, ...] = ()  # exactly what ran on the device
    cwd: str = ""
    conditions: Mapping[str, Any] = field(default_factory=dict)  # thermals, power, before the run
    sweep: SweepInfo = field(default_factory=SweepInfo)
    source: str = ""  # manual rows: where the figure comes from
    label: str = ""
    raw: Mapping[str, Any] = field(default_factory=dict)  # llama-bench's record as printed

    @property
    def record_id(self) -> str:
        """A content hash: importing the same record twice stores it once."""
        return hashlib.sha256(canonical_json(self.to_dict()).encode()).hexdigest()[:16]

    @property
    def summary(self) -> Summary:
        return summarize(self.samples_ts, fallback=self.avg_ts)

    @property
    def env_set(self) -> tuple[tuple[str, str], ...]:
        """The env with the release dir abstracted, so the same settings on two builds match."""
        release = self.build.release_dir
        return tuple(sorted((k, v.replace(release, RELEASE_TOKEN) if release else v) for k, v in self.env.items()))

    @property
    def config_key(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((k, canonical_json(v)) for k, v in self.config.items()))

    @property
    def group_key(self) -> tuple[object, ...]:
        """What must be equal for two records to be compared."""
        return (self.device.key, self.model.key, self.env_set, self.test, self.config_key, self.unit)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["samples_ts"] = list(self.samples_ts)
        data["argv"] = list(self.argv)
        data["range_ts"] = list(self.range_ts) if self.range_ts else None
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchRecord:
        fields = dict(data)
        fields.pop("record_id", None)
        range_ts = fields.get("range_ts")
        return cls(
            **{
                **fields,
                "build": BuildInfo(**fields["build"]),
                "device": DeviceInfo(**fields["device"]),
                "model": ModelInfo(**fields["model"]),
                "sweep": SweepInfo(**fields.get("sweep", {})),
                "samples_ts": tuple(fields.get("samples_ts", ())),
                "argv": tuple(fields.get("argv", ())),
                "range_ts": (float(range_ts[0]), float(range_ts[1])) if range_ts else None,
            }
        )
