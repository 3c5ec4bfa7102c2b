"""A benchmark result: one llama-bench test (or one manual reference figure) with its provenance.

Records are compared only with records of the same :attr:`BenchRecord.group_key`: the same
device (name and fingerprint), model (sha256), env set, test and llama-bench configuration.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypedDict, TypeVar, cast, get_args

from kzbuild.model.jsonfields import Fields, number_or_none
from kzbuild.model.memory import MemoryInfo
from kzbuild.model.provenance import Provenance
from kzbuild.model.run import Release

# bench: a llama-bench test; run: one kzbuild run of a tool (its memory, no throughput); manual:
# a reference figure from elsewhere
RecordKind = Literal["bench", "run", "manual"]
MEASURED_KINDS = ("bench", "run")  # measured here: written to the monthly shards
T = TypeVar("T")
MAX_SAMPLES = 10_000  # repetitions of one test: more is junk, not a benchmark
RELEASE_TOKEN = "{release}"  # stands for the release dir in env values, so builds compare

# llama-bench JSON fields that describe the build, the model file, the host or the outcome
# rather than the configuration under test; every other field is configuration.
NOT_CONFIG_FIELDS = frozenset(
    {
        "build_commit",
        "build_number",
        "cpu_info",
        "gpu_info",
        "backends",
        "model_filename",
        "model_type",
        "model_size",
        "model_n_params",
        "n_prompt",
        "n_gen",
        "n_depth",
        "test_time",
        "avg_ns",
        "stddev_ns",
        "avg_ts",
        "stddev_ts",
        "samples_ns",
        "samples_ts",
    }
)


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
    """One line, sorted keys: equal data gives equal bytes (ids, JSONL export). Standard JSON
    only: NaN and Infinity raise ValueError rather than write what other readers refuse."""
    return json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def content_id(stored: str) -> str:
    """The id of a record from its canonical JSON."""
    return hashlib.sha256(stored.encode()).hexdigest()[:16]


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

    @classmethod
    def of_release(cls, release: Release, build_commit: str | None) -> BuildInfo:
        """The build a device release holds, from its deployed manifest."""
        manifest = release.manifest
        return cls(
            build_id=release.build_id,
            recipe=manifest.get("recipe"),
            manifest_sha256=release.manifest_sha256,
            lock_sha256=manifest.get("lock_sha256"),
            build_commit=build_commit,
            release_dir=release.dir,
        )


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
class VariantInfo:
    """Which variant of an interleaved experiment (kzbuild ab, kzbuild roll) a record measured."""

    name: str  # e.g. "full", "minus:<patch>", "upstream"
    block: int  # the block of the interleaved order it ran in, from 0
    blocks: int
    seed: int  # of the interleaved order
    start_c: float | None = (
        None  # hottest thermal zone when its block started (after --cool-to), deg C
    )
    waited_s: float | None = None  # how long the block waited to cool down


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
    variant: VariantInfo | None = (
        None  # set by interleaved experiments; absent from the stored form when None
    )
    memory: MemoryInfo | None = None  # peak memory and llama.cpp's buffers; absent when None
    provenance: Provenance | None = None  # measured runs: the hash of every input; absent when None

    @property
    def record_id(self) -> str:
        """A content hash: importing the same record twice stores it once."""
        return content_id(canonical_json(self.to_dict()))

    @property
    def summary(self) -> Summary:
        return summarize(self.samples_ts, fallback=self.avg_ts)

    @property
    def env_set(self) -> tuple[tuple[str, str], ...]:
        """The env with the release dir abstracted, so the same settings on two builds match."""
        release = self.build.release_dir
        return tuple(
            sorted(
                (k, v.replace(release, RELEASE_TOKEN) if release else v)
                for k, v in self.env.items()
            )
        )

    @property
    def config_key(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted((k, canonical_json(v)) for k, v in self.config.items()))

    @property
    def group_key(self) -> tuple[object, ...]:
        """What must be equal for two records to be compared."""
        return (
            self.device.key,
            self.model.key,
            self.env_set,
            self.test,
            self.config_key,
            self.unit,
        )

    def to_dict(self) -> dict[str, Any]:
        data = _fields_dict(self)
        for name in ("build", "device", "model", "sweep"):
            data[name] = _fields_dict(data[name])
        data["variant"] = self.variant and _fields_dict(self.variant)
        data["samples_ts"] = list(self.samples_ts)
        data["argv"] = list(self.argv)
        data["range_ts"] = list(self.range_ts) if self.range_ts else None
        # records from before these fields existed keep their stored form and id
        for optional in ("variant", "memory", "provenance"):
            if getattr(self, optional) is None:
                del data[optional]
        if self.memory is not None:
            data["memory"] = self.memory.to_dict()
        if self.provenance is not None:
            data["provenance"] = self.provenance.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: object, where: str = "record") -> BenchRecord:
        """A record from its JSON form with every field type-checked; raises BadRecord naming the
        key."""
        fields = Fields(data, where)
        fields.check_known(FIELD_NAMES[cls] | {"record_id"})
        common = run_fields(fields)
        sweep = fields.object("sweep", {})
        sweep.check_known(FIELD_NAMES[SweepInfo])
        return cls(
            **common,
            kind=cast(RecordKind, fields.choice("kind", get_args(RecordKind))),
            test=fields.text("test"),
            seq=fields.count("seq"),
            avg_ts=fields.optional_number("avg_ts"),
            stddev_ts=fields.optional_number("stddev_ts", zero_ok=True),
            samples_ts=fields.numbers("samples_ts", (), max_items=MAX_SAMPLES),
            range_ts=_range(fields),
            unit=fields.text("unit", "t/s"),
            sweep=SweepInfo(
                point=sweep.text_map("point", {}),
                seed=sweep.optional_count("seed"),
                index=sweep.count("index", 0),
                total=sweep.count("total", 1, minimum=1),
            ),
            source=fields.text("source", ""),
            label=fields.text("label", ""),
            raw=fields.json_map("raw", {}),
            variant=_variant(fields),
            memory=_optional(fields, "memory", MemoryInfo.from_fields),
            provenance=_optional(fields, "provenance", Provenance.from_fields),
        )


def _fields_dict(instance: Any) -> dict[str, Any]:
    """A dataclass's fields as a dict, mappings copied one level deep: dataclasses.asdict's deep
    copy was most of the cost of storing or importing a record."""
    return {
        name: dict(value) if isinstance(value, Mapping) else value
        for name in FIELD_NAMES[type(instance)]
        for value in (getattr(instance, name),)
    }


class RunFields(TypedDict):
    """The fields every stored run's line carries (a bench record, a profile run), with their
    provenance."""

    run_id: str
    host_time: str
    build: BuildInfo
    device: DeviceInfo
    model: ModelInfo
    config: Mapping[str, Any]
    env: Mapping[str, str]
    argv: tuple[str, ...]
    cwd: str
    conditions: Mapping[str, Any]


def build_info(build: Fields) -> BuildInfo:
    """A stored record's ``build`` section (its keys already checked as known)."""
    return BuildInfo(**{name: build.optional_text(name) for name in FIELD_NAMES[BuildInfo]})


def device_info(device: Fields) -> DeviceInfo:
    """A stored record's ``device`` section (its keys already checked as known)."""
    return DeviceInfo(
        name=device.text("name"),
        address=device.text("address", ""),
        fingerprint=device.text_map("fingerprint", {}),
    )


def run_fields(fields: Fields) -> RunFields:
    """A stored run's common fields from its JSON form, type-checked; raises BadRecord naming the
    key."""
    build, device, model = fields.object("build"), fields.object("device"), fields.object("model")
    build.check_known(FIELD_NAMES[BuildInfo])
    device.check_known(FIELD_NAMES[DeviceInfo])
    model.check_known(FIELD_NAMES[ModelInfo])
    return RunFields(
        run_id=fields.text("run_id"),
        host_time=fields.text("host_time"),
        build=build_info(build),
        device=device_info(device),
        model=ModelInfo(
            path=model.text("path", ""),
            sha256=model.optional_text("sha256"),
            name=model.text("name", ""),
            type=model.text("type", ""),
            size=model.optional_count("size"),
        ),
        config=fields.scalar_map("config", {}),
        env=fields.text_map("env", {}),
        argv=fields.texts("argv", ()),
        cwd=fields.text("cwd", ""),
        conditions=fields.json_map("conditions", {}),
    )


def _optional(fields: Fields, key: str, read: Callable[[Fields], T]) -> T | None:
    return None if fields.data.get(key) is None else read(fields.object(key))


def _variant(fields: Fields) -> VariantInfo | None:
    if fields.data.get("variant") is None:
        return None
    variant = fields.object("variant")
    variant.check_known(FIELD_NAMES[VariantInfo])
    return VariantInfo(
        name=variant.text("name"),
        block=variant.count("block"),
        blocks=variant.count("blocks", minimum=1),
        seed=variant.count("seed"),
        start_c=_temperature(variant, "start_c"),
        waited_s=variant.optional_number("waited_s", zero_ok=True),
    )


def _temperature(fields: Fields, key: str) -> float | None:
    """Degrees C: any finite number (a sensor may read below zero)."""
    value = fields.data.get(key)
    if value is None:
        return None
    number = number_or_none(value)
    if number is None:
        raise fields.error(key, "a finite number")
    return float(number)


def _range(fields: Fields) -> tuple[float, float] | None:
    """A manual figure given as low-high: two numbers > 0, low first."""
    if fields.data.get("range_ts") is None:
        return None
    low_high = fields.numbers("range_ts", max_items=2)
    if len(low_high) != 2 or low_high[0] > low_high[1]:
        raise fields.error("range_ts", "[low, high]")
    return (low_high[0], low_high[1])


# computed once: every record read checks its keys against them
FIELD_NAMES: dict[type, frozenset[str]] = {
    cls: frozenset(f.name for f in dataclasses.fields(cls))
    for cls in (BenchRecord, BuildInfo, DeviceInfo, ModelInfo, SweepInfo, VariantInfo)
}


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    sql: str


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    kind: str
    host_time: str
    device: str
    build_ids: tuple[str, ...]
    models: tuple[str, ...]
    tests: tuple[str, ...]
    records: int


@dataclass(frozen=True)
class Group:
    """The records of one selection that may be compared with each other."""

    key: tuple[object, ...]
    records: tuple[BenchRecord, ...]

    @property
    def first(self) -> BenchRecord:
        return self.records[0]

    @property
    def summary(self) -> Summary:
        """Pooled samples of all records; records without samples (manual) count their value."""
        samples = [s for r in self.records for s in r.samples_ts]
        return summarize(samples or [r.avg_ts for r in self.records if r.avg_ts is not None])

    @property
    def peak_kib(self) -> float | None:
        """The median peak resident memory of the records' processes (KiB); None when none was
        measured."""
        measured = [r.memory for r in self.records if r.memory]
        peaks = [m.peak_rss_kib for m in measured if m.peak_rss_kib is not None]
        return statistics.median(peaks) if peaks else None


@dataclass(frozen=True)
class ComparedRow:
    a: Group
    b: Group
    change_pct: float | None
    verdict: str  # regression, improvement, same, n/a
    memory_change_pct: float | None = None  # of the median peak memory, B against A
    memory_verdict: str = "n/a"  # regression (more memory past the threshold), improvement, ...


@dataclass(frozen=True)
class Comparison:
    a_label: str
    b_label: str
    metric: str | None
    threshold_pct: float
    rows: tuple[ComparedRow, ...]
    only_a: tuple[Group, ...]
    only_b: tuple[Group, ...]

    memory_threshold_pct: float = 5.0

    @property
    def regressions(self) -> tuple[ComparedRow, ...]:
        return tuple(row for row in self.rows if row.verdict == "regression")

    @property
    def memory_regressions(self) -> tuple[ComparedRow, ...]:
        return tuple(row for row in self.rows if row.memory_verdict == "regression")


@dataclass(frozen=True)
class StoredLine:
    """A record read from a file with its stored form: a line already in the database is never
    parsed."""

    record: BenchRecord
    stored: str


@dataclass(frozen=True)
class Refused:
    where: str  # file:line
    reason: str


@dataclass(frozen=True)
class Merged:
    path: Path
    conflicts: int  # conflict blocks resolved
    duplicates: int  # lines dropped as a copy of another
