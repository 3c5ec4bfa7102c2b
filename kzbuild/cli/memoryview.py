"""How memory, the turn and provenance are shown: table cells, JSON, and the budget's exit code."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from kzbuild.cli.ui import print_json, say
from kzbuild.errors import ConfigError, OverMemoryBudget, RegressionFound, ResultsError
from kzbuild.measure.turn import turn_time
from kzbuild.model.memory import MIB, MemoryInfo
from kzbuild.model.plan import Plan
from kzbuild.model.result import BenchRecord, ComparedRow, Comparison
from kzbuild.model.turn import (
    REFERENCE_DECODE_TPS,
    REFERENCE_NAME,
    REFERENCE_TTFT_S,
    TurnTime,
    reference_turn_s,
)

MEMORY_HEADERS = ("peak MiB", "buffers MiB", "over")


def memory_cells(memory: MemoryInfo | None) -> list[str]:
    """Peak MiB, the buffers per buffer type (MiB, all kinds), and the limits it exceeded."""
    if memory is None:
        return ["-", "-", ""]
    peak = "-" if memory.peak_bytes is None else f"{memory.peak_bytes / MIB:.1f}"
    per_type: dict[str, float] = {}
    for item in memory.buffers:
        per_type[item.buffer] = per_type.get(item.buffer, 0.0) + item.mib
    buffers = " ".join(f"{name} {mib:.1f}" for name, mib in per_type.items()) or "-"
    return [peak, buffers, " ".join(f"OVER {name}" for name in memory.over)]


COMPARED_MEMORY_HEADERS = ("A peak MiB", "B peak MiB", "memory", "memory verdict")


def compared_memory_cells(row: ComparedRow) -> list[str]:
    peaks = [
        "-" if kib is None else f"{kib / 1024:.1f}" for kib in (row.a.peak_kib, row.b.peak_kib)
    ]
    change = "-" if row.memory_change_pct is None else f"{row.memory_change_pct:+.1f}%"
    return [*peaks, change, row.memory_verdict]


def compared_memory_json(row: ComparedRow) -> dict[str, object]:
    return {
        "a_peak_kib": row.a.peak_kib,
        "b_peak_kib": row.b.peak_kib,
        "change_pct": row.memory_change_pct,
        "verdict": row.memory_verdict,
    }


def check_memory_regressions(comparison: Comparison, a: str, b: str) -> None:
    """RegressionFound (exit 9, as for speed) when B's peak memory rose past the memory
    threshold."""
    found = comparison.memory_regressions
    if found:
        worst = max(row.memory_change_pct or 0.0 for row in found)
        raise RegressionFound(
            f"{len(found)} test(s) of {b} use more memory than {a} "
            f"past {comparison.memory_threshold_pct:g}% (worst {worst:+.1f}%)"
        )


def memory_json(memory: MemoryInfo | None) -> dict[str, object]:
    """What a record's JSON adds: its memory's limits exceeded (``over``, empty when within)."""
    return {"memory_over": list(memory.over) if memory else []}


def check_budget(records: Sequence[BenchRecord]) -> None:
    """OverMemoryBudget (exit 15) when a record exceeded its plan's memory_budget or
    htp_session_limit."""
    over = {(r.run_id, r.sweep.index, name) for r in records if r.memory for name in r.memory.over}
    if over:
        shown = "; ".join(f"run {run} point {index}: {name}" for run, index, name in sorted(over))
        raise OverMemoryBudget(
            f"{len(over)} run(s) over the plan's memory limits: {shown}",
            hint="the table marks them OVER; --json lists memory_over",
        )


def plan_turn(plan: Plan, records: Mapping[str, Sequence[BenchRecord]]) -> TurnTime | None:
    """The plan's turn from the records of its prefill and decode runs (by run name); None
    without a turn."""
    if plan.turn is None:
        return None
    turn = plan.turn
    return turn_time(
        records.get(turn.prefill, ()),
        records.get(turn.decode, ()),
        prompt=turn.prompt,
        generate=turn.generate,
    )


def turn_lines(name: str, turn: TurnTime) -> list[str]:
    fast, slow = reference_turn_s(turn.generate)
    low, high = REFERENCE_DECODE_TPS
    return [
        f"turn{' (' + name + ')' if name else ''}: prompt {turn.prompt}, generate {turn.generate}: "
        f"TTFT {turn.ttft_s * 1000:.0f} ms, whole turn {turn.turn_s:.2f} s",
        f"  prefill {turn.prefill_tps:.2f} tok/s ({turn.prefill_config}); "
        f"decode {turn.decode_tps:.2f} tok/s ({turn.decode_config})",
        f"  reference {REFERENCE_NAME}: TTFT {REFERENCE_TTFT_S * 1000:.0f} ms, "
        f"decode {low:g}-{high:g} tok/s, "
        f"whole turn {fast:.2f}-{slow:.2f} s",
    ]


def print_turn(name: str, turn: TurnTime) -> None:
    for line in turn_lines(name, turn):
        say(line)


def turn_json(turn: TurnTime) -> dict[str, object]:
    fast, slow = reference_turn_s(turn.generate)
    return {
        "prompt": turn.prompt,
        "generate": turn.generate,
        "ttft_s": turn.ttft_s,
        "turn_s": turn.turn_s,
        "prefill_tps": turn.prefill_tps,
        "decode_tps": turn.decode_tps,
        "prefill_config": turn.prefill_config,
        "decode_config": turn.decode_config,
        "reference": {
            "name": REFERENCE_NAME,
            "ttft_s": REFERENCE_TTFT_S,
            "decode_tps": list(REFERENCE_DECODE_TPS),
            "turn_s": [fast, slow],
        },
    }


TURN_RE = re.compile(r"^(\d+):(\d+)$")


def parse_turn(text: str | None) -> tuple[int, int]:
    found = TURN_RE.match(text or "")
    if not found or not int(found[1]) or not int(found[2]):
        raise ConfigError(
            f"--turn {text!r} is not PROMPT:GENERATE, two token counts above 0 such as 512:64"
        )
    return int(found[1]), int(found[2])


def provenance_records(records: Sequence[BenchRecord], wanted: str) -> list[BenchRecord]:
    """The records whose provenance id starts with ``wanted``; ResultsError when none or
    several ids match."""
    found = [r for r in records if r.provenance and r.provenance.id.startswith(wanted)]
    ids = {r.provenance.id for r in found if r.provenance}
    if not ids:
        raise ResultsError(
            f"no record has provenance id {wanted!r}",
            hint="kzbuild results show RUN lists the ids of a run",
        )
    if len(ids) > 1:
        raise ResultsError(f"provenance id {wanted!r} is ambiguous: {', '.join(sorted(ids))}")
    return found


def show_provenance(records: Sequence[BenchRecord], wanted: str, *, json_out: bool) -> None:
    """Every part of the id the records share, then the records (run, test)."""
    provenance = records[0].provenance
    assert provenance is not None  # provenance_records keeps records with one
    if json_out:
        print_json({"provenance": provenance.to_dict(), "records": [r.record_id for r in records]})
        return
    lines = [
        f"provenance {provenance.id}",
        f"  lock sha256: {provenance.lock_sha256 or '-'}",
        f"  build id: {provenance.build_id or '-'}",
    ]
    lines += [
        f"  toolchain {name}: {version}" for name, version in sorted(provenance.toolchains.items())
    ] or ["  toolchains: -"]
    lines += [
        f"  model sha256: {provenance.model_sha256 or '-'}",
        f"  corpus sha256: {provenance.corpus_sha256 or '- (not a quality record)'}",
    ]
    lines += [f"  device {key}: {value}" for key, value in sorted(provenance.device.items())] or [
        "  device: -"
    ]
    runs = sorted({r.run_id for r in records})
    lines.append(f"{len(records)} record(s) in run(s) {', '.join(runs)}")
    for line in lines:
        say(line)
