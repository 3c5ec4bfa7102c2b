"""Comparing results: pairing the comparable groups of two selections, and naming what differs."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import replace

from kzbuild.errors import ConfigError, ResultsError
from kzbuild.model.result import BenchRecord, ComparedRow, Comparison, Group, Summary


def parse_threshold(text: str) -> float:
    """``5%`` or ``5`` -> 5.0 (percent): a finite number >= 0. The one parser of --threshold."""
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        raise ConfigError(f"threshold '{text}' is not a percentage", hint="use e.g. 5%") from None
    if not math.isfinite(
        value
    ):  # float() reads nan and inf; against nan every change would pass as "same"
        raise ConfigError(f"threshold '{text}' is not a finite percentage", hint="use e.g. 5%")
    if value < 0:
        raise ConfigError(f"threshold '{text}' is negative", hint="use e.g. 5%")
    return value


def group(records: Iterable[BenchRecord]) -> list[Group]:
    by_key: dict[tuple[object, ...], list[BenchRecord]] = defaultdict(list)
    for record in records:
        by_key[record.group_key].append(record)
    return [Group(key, tuple(items)) for key, items in by_key.items()]


def compare(
    a: Sequence[BenchRecord],
    b: Sequence[BenchRecord],
    *,
    a_label: str,
    b_label: str,
    metric: str | None = None,
    threshold_pct: float = 5.0,
    memory_threshold_pct: float = 5.0,
) -> Comparison:
    """Pair the groups of A and B that ran the same test on the same device, model and env.

    Throughput is better when higher: B regresses when its median is more than the threshold
    below A's. Raises ResultsError when nothing pairs, naming what differs.
    """
    if metric is not None:
        a, b = [r for r in a if r.test == metric], [r for r in b if r.test == metric]
        for label, selected in ((a_label, a), (b_label, b)):
            if not selected:
                raise ResultsError(f"{label} has no '{metric}' results")
    groups_a, groups_b = group(a), group(b)
    by_key_b = {g.key: g for g in groups_b}
    rows = []
    for group_a in groups_a:
        group_b = by_key_b.get(group_a.key)
        if group_b is not None:
            row = _compare_pair(group_a, group_b, threshold_pct)
            rows.append(_with_memory(row, memory_threshold_pct))
    if not rows:
        raise ResultsError(
            f"nothing in {a_label} is comparable with {b_label}: {explain_mismatch(a, b)}"
        )
    rows.sort(
        key=lambda row: (
            row.a.first.device.name,
            row.a.first.test,
            describe_config(row.a.first),
            row.a.first.env_set,
        )
    )
    paired = {row.a.key for row in rows}
    return Comparison(
        a_label=a_label,
        b_label=b_label,
        metric=metric,
        threshold_pct=threshold_pct,
        rows=tuple(rows),
        only_a=tuple(g for g in groups_a if g.key not in paired),
        only_b=tuple(g for g in groups_b if g.key not in paired),
        memory_threshold_pct=memory_threshold_pct,
    )


def _with_memory(row: ComparedRow, threshold_pct: float) -> ComparedRow:
    """The row with B's median peak memory against A's: more memory past the threshold is a
    regression."""
    peak_a, peak_b = row.a.peak_kib, row.b.peak_kib
    if not peak_a or peak_b is None:
        return row
    change = (peak_b - peak_a) / peak_a * 100.0
    verdict = "same"
    if abs(change) > threshold_pct:
        verdict = "regression" if change > 0 else "improvement"
    return replace(row, memory_change_pct=change, memory_verdict=verdict)


def _compare_pair(a: Group, b: Group, threshold_pct: float) -> ComparedRow:
    median_a, median_b = a.summary.median, b.summary.median
    if not median_a or median_b is None:
        return ComparedRow(a, b, None, "n/a")
    change = (median_b - median_a) / median_a * 100.0
    verdict = (
        "regression"
        if change < -threshold_pct
        else "improvement"
        if change > threshold_pct
        else "same"
    )
    return ComparedRow(a, b, change, verdict)


def explain_mismatch(a: Sequence[BenchRecord], b: Sequence[BenchRecord]) -> str:
    """Name the first dimension on which A and B share nothing."""
    dimensions: tuple[
        tuple[str, Callable[[BenchRecord], Hashable], Callable[[BenchRecord], str]], ...
    ] = (
        ("device", lambda r: r.device.key, describe_device),
        (
            "model",
            lambda r: r.model.key,
            lambda r: r.model.sha256 and r.model.sha256[:12] or r.model.name,
        ),
        ("env set", lambda r: r.env_set, lambda r: describe_env(r.env_set) or "no env"),
        ("test", lambda r: r.test, lambda r: r.test),
        ("configuration", lambda r: r.config_key, lambda r: describe_config(r)),
        ("unit", lambda r: r.unit, lambda r: r.unit),
    )
    for name, key, show in dimensions:
        keys_a, keys_b = {key(r): r for r in a}, {key(r): r for r in b}
        if not keys_a.keys() & keys_b.keys():
            shown_a = "; ".join(sorted({show(r) for r in keys_a.values()}))
            shown_b = "; ".join(sorted({show(r) for r in keys_b.values()}))
            return (
                f"they share no {name} (A: {shown_a}; B: {shown_b}); results of different {name}s "
                "are never compared"
            )
    return "no test ran with the same device, model, env set and configuration in both"


def describe_device(record: BenchRecord) -> str:
    fingerprint = record.device.fingerprint
    detail = (
        fingerprint.get("android.fingerprint")
        or fingerprint.get("uname")
        or fingerprint.get("soc")
        or ""
    )
    return f"{record.device.name} [{detail}]" if detail else record.device.name


def describe_env(env_set: Iterable[tuple[str, str]]) -> str:
    return " ".join(f"{k}={v}" for k, v in env_set)


SHORT_CONFIG = (
    ("n_threads", "t"),
    ("n_gpu_layers", "ngl"),
    ("n_batch", "b"),
    ("n_ubatch", "ub"),
    ("devices", "dev"),
)


def describe_config(record: BenchRecord, skip: str = "") -> str:
    return describe_config_fields(record.config, skip)


def describe_config_fields(config: Mapping[str, object], skip: str = "") -> str:
    """The configuration in llama-bench's short option names, e.g. ``t=4 ngl=99``."""
    shown = [
        f"{short}={config[field]}"
        for field, short in SHORT_CONFIG
        if config.get(field) not in (None, "") and field != skip
    ]
    shown += [f"{k}={v}" for k, v in sorted(config.items()) if k in ("engine", "backend")]
    return " ".join(shown)


def varying_env(records: Iterable[BenchRecord]) -> set[str]:
    """Env names whose value differs between the given records (the rest is shared noise);
    one pass: a name some record lacks varies when another record has it."""
    values: dict[str, set[str]] = defaultdict(set)
    counts: dict[str, int] = defaultdict(int)
    total = 0
    for record in records:
        total += 1
        for name, value in record.env_set:
            values[name].add(value)
            counts[name] += 1
    return {name for name, seen in values.items() if len(seen) > 1 or counts[name] < total}


NOISY_SPREAD_PCT = 5.0  # a spread above this hides differences of a few percent


def is_noisy(summary: Summary) -> bool:
    return summary.spread_pct is not None and summary.spread_pct > NOISY_SPREAD_PCT


def unique(values: Iterable[str]) -> tuple[str, ...]:
    """The non-empty values, each once, in first-seen order."""
    return tuple(dict.fromkeys(v for v in values if v))
