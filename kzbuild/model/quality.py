"""Whether a variant's output stays right: llama-perplexity's KL divergence against reference
logits.

A quality record is one ``llama-perplexity --kl-divergence`` run of a variant's release against
the logits that the reference (by default bare upstream on the CPU backend) recorded for the same
model, corpus, context and chunks; with its provenance and the verdict against the plan's limits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from kzbuild.model.jsonfields import Fields, number_or_none
from kzbuild.model.result import FIELD_NAMES as RESULT_FIELDS
from kzbuild.model.result import BuildInfo, DeviceInfo, ModelInfo, build_info, device_info

Verdict = Literal["right", "wrong"]
RIGHT: Literal["right"] = "right"
WRONG: Literal["wrong"] = "wrong"
DEFAULT_CORPUS = "fr-atelier"  # kzbuild/measure/corpora/<name>.txt
DEFAULT_CONTEXT = 512
DEFAULT_CHUNKS = 4
# llama-perplexity options a quality spec may set, by the llama-bench name the plans use
OPTION_FLAGS = {"dev": "--device", "ngl": "-ngl", "t": "-t", "ub": "-ub", "fa": "-fa"}
CPU_ONLY = (("dev", "none"), ("ngl", "0"))  # the reference's default: the CPU backend


@dataclass(frozen=True)
class QualityLimits:
    max_kld: float | None = None  # mean KL divergence (nats) a variant may reach
    min_top1: float | None = (
        None  # percent of tokens whose most likely next token is the reference's
    )

    def problems(self, stats: KldStats) -> tuple[str, ...]:
        """What in ``stats`` is past a limit (empty: right)."""
        found = []
        if self.max_kld is not None and stats.kld_mean > self.max_kld:
            found.append(f"mean KLD {stats.kld_mean:.6f} > max_kld {self.max_kld:g}")
        if self.min_top1 is not None and stats.top1_pct < self.min_top1:
            found.append(f"top-1 agreement {stats.top1_pct:.3f}% < min_top1 {self.min_top1:g}%")
        return tuple(found)


@dataclass(frozen=True)
class QualitySpec:
    """How ``kzbuild ab`` checks each variant's output."""

    limits: QualityLimits = QualityLimits()
    corpus: str = DEFAULT_CORPUS
    context: int = DEFAULT_CONTEXT  # -c, and -b: one sequence per batch
    chunks: int = DEFAULT_CHUNKS
    options: tuple[tuple[str, str], ...] = ()  # how each variant runs (OPTION_FLAGS names)
    env: tuple[tuple[str, str], ...] = ()
    reference: str = "upstream"  # the variant whose logits are the base
    reference_options: tuple[tuple[str, str], ...] = CPU_ONLY
    timeout: float | None = None


@dataclass(frozen=True)
class KldStats:
    """What ``llama-perplexity --kl-divergence`` prints, the figures kzbuild keeps."""

    ppl: float  # Mean PPL(Q)
    ppl_base: float  # Mean PPL(base)
    ppl_ratio: float  # Mean PPL(Q)/PPL(base)
    kld_mean: float
    kld_mean_unc: float
    kld_p99: float  # 99.0% KLD
    kld_median: float
    kld_max: float
    top1_pct: float  # Same top p, in percent
    top1_unc_pct: float


@dataclass(frozen=True)
class CorpusInfo:
    name: str
    sha256: str


@dataclass(frozen=True)
class QualityReference:
    variant: str
    build_id: str | None
    options: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class QualityRecord:
    run_id: str
    host_time: str
    variant: str  # the ab variant; "" outside an ab
    build: BuildInfo
    device: DeviceInfo
    model: ModelInfo
    corpus: CorpusInfo
    reference: QualityReference
    config: Mapping[str, Any]  # context, chunks, options
    stats: KldStats
    limits: QualityLimits
    verdict: Verdict
    problems: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    argv: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["argv"], data["problems"] = list(self.argv), list(self.problems)
        return data

    @classmethod
    def from_dict(cls, data: object, where: str = "quality record") -> QualityRecord:
        fields = Fields(data, where)
        fields.check_known(FIELD_NAMES[cls])
        build, device, model = (
            fields.object("build"),
            fields.object("device"),
            fields.object("model"),
        )
        build.check_known(RESULT_FIELDS[BuildInfo])
        device.check_known(RESULT_FIELDS[DeviceInfo])
        model.check_known(RESULT_FIELDS[ModelInfo])
        corpus, reference, stats, limits = (
            fields.object(key) for key in ("corpus", "reference", "stats", "limits")
        )
        for part, kind in (
            (corpus, CorpusInfo),
            (reference, QualityReference),
            (stats, KldStats),
            (limits, QualityLimits),
        ):
            part.check_known(FIELD_NAMES[kind])
        return cls(
            run_id=fields.text("run_id"),
            host_time=fields.text("host_time"),
            variant=fields.text("variant"),
            build=build_info(build),
            device=device_info(device),
            model=ModelInfo(
                path=model.text("path", ""),
                sha256=model.text("sha256"),
                name=model.text("name", ""),
                type=model.text("type", ""),
            ),
            corpus=CorpusInfo(name=corpus.text("name"), sha256=corpus.text("sha256")),
            reference=QualityReference(
                reference.text("variant"),
                reference.optional_text("build_id"),
                reference.text_map("options", {}),
            ),
            config=fields.scalar_map("config", {}),
            stats=KldStats(**{name: _finite(stats, name) for name in FIELD_NAMES[KldStats]}),
            limits=QualityLimits(
                max_kld=_optional_float(limits.optional_number("max_kld", zero_ok=True)),
                min_top1=_optional_float(limits.optional_number("min_top1", zero_ok=True)),
            ),
            verdict=RIGHT if fields.choice("verdict", (RIGHT, WRONG)) == RIGHT else WRONG,
            problems=fields.texts("problems", ()),
            env=fields.text_map("env", {}),
            argv=fields.texts("argv", ()),
        )


def describe_output(record: QualityRecord) -> str:
    """One line: the figures and the verdict (with what broke the limits)."""
    stats = record.stats
    figures = (
        f"mean KLD {stats.kld_mean:.6f}, 99% KLD {stats.kld_p99:.6f}, top-1 {stats.top1_pct:.3f}%, "
        f"PPL ratio {stats.ppl_ratio:.4f}"
    )
    return f"{figures}: {record.verdict}" + (
        f" ({'; '.join(record.problems)})" if record.problems else ""
    )


def _finite(fields: Fields, key: str) -> float:
    """Any finite number: llama-perplexity's mean KLD rounds to a hair below zero when nothing
    changed."""
    value = number_or_none(fields.data.get(key))
    if value is None:
        raise fields.error(key, "a finite number")
    return float(value)


def _optional_float(value: int | float | None) -> float | None:
    return None if value is None else float(value)


FIELD_NAMES: dict[type, frozenset[str]] = {
    cls: frozenset(f.name for f in dataclasses.fields(cls))
    for cls in (QualityRecord, CorpusInfo, QualityReference, KldStats, QualityLimits)
}


@dataclass(frozen=True)
class PatchQuality:
    """What a patch does to the output: the full stack's record against the stack without it's."""

    variant: str
    patch: str | None  # None for upstream: the whole stack
    full: QualityRecord
    without: QualityRecord
    verdict: Verdict
    why: str = ""

    @property
    def kld_added(self) -> float:
        return self.full.stats.kld_mean - self.without.stats.kld_mean
