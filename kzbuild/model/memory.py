"""What a measured process held in memory: its peak resident set and the buffers llama.cpp reported.

The peak comes from ``kz-peakrss`` (``kernels/peakrss/``), which runs the tool and reads the
kernel's ``ru_maxrss`` of its process when it ends: measured, never estimated. The buffers are the
``... buffer size = N MiB`` lines llama.cpp logs for each buffer type (CPU, CPU_Mapped,
CPU_REPACK, HTP0, ...) and kind (model weights, KV cache, recurrent state, compute, output).
One llama-bench process runs all the tests of one sweep point, so all its records carry the
same memory; a buffer that several tests' contexts allocated counts at its largest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kzbuild.errors import ConfigError
from kzbuild.model.jsonfields import Fields

BUFFER_KINDS = ("model", "kv", "rs", "compute", "output")
HTP_SESSION_RE = re.compile(
    r"^(HTP\d+)"
)  # HTP0, HTP0-REPACK, ...: the NPU session a buffer lives in
MIB = 1024 * 1024
KIB = 1024


@dataclass(frozen=True)
class BufferSize:
    buffer: str  # the buffer type's name as llama.cpp prints it: CPU, CPU_REPACK, HTP0, ...
    kind: str  # one of BUFFER_KINDS
    mib: float  # as printed, two decimals


@dataclass(frozen=True)
class MemoryLimits:
    """A plan's limits: the process's peak (memory_budget) and each HTP session's buffers
    (htp_session_limit)."""

    budget_bytes: int | None = None
    htp_session_bytes: int | None = None

    @property
    def any(self) -> bool:
        return self.budget_bytes is not None or self.htp_session_bytes is not None


@dataclass(frozen=True)
class MemoryInfo:
    peak_rss_kib: int | None  # None: the release has no kz-peakrss, nothing was measured
    buffers: tuple[BufferSize, ...] = ()
    limits: MemoryLimits = field(default_factory=MemoryLimits)

    @property
    def peak_bytes(self) -> int | None:
        return None if self.peak_rss_kib is None else self.peak_rss_kib * KIB

    def htp_sessions(self) -> dict[str, float]:
        """MiB of buffers per HTP session (HTP0, HTP1, ...)."""
        sessions: dict[str, float] = {}
        for item in self.buffers:
            found = HTP_SESSION_RE.match(item.buffer)
            if found:
                sessions[found[1]] = sessions.get(found[1], 0.0) + item.mib
        return sessions

    @property
    def over(self) -> tuple[str, ...]:
        """The limits this run exceeded: ``memory_budget`` and ``htp_session_limit:HTPn``."""
        found = []
        budget, session = self.limits.budget_bytes, self.limits.htp_session_bytes
        if budget is not None and self.peak_bytes is not None and self.peak_bytes > budget:
            found.append("memory_budget")
        if session is not None:
            found += [
                f"htp_session_limit:{name}"
                for name, mib in sorted(self.htp_sessions().items())
                if mib * MIB > session
            ]
        return tuple(found)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "peak_rss_kib": self.peak_rss_kib,
            "buffers": [[b.buffer, b.kind, b.mib] for b in self.buffers],
        }
        if self.limits.any:
            data["limits"] = {
                "budget_bytes": self.limits.budget_bytes,
                "htp_session_bytes": self.limits.htp_session_bytes,
            }
        return data

    @classmethod
    def from_fields(cls, fields: Fields) -> MemoryInfo:
        fields.check_known(frozenset({"peak_rss_kib", "buffers", "limits"}))
        buffers = []
        listed = fields.data.get("buffers", [])
        if not isinstance(listed, list):
            raise fields.error("buffers", "a list of [buffer, kind, MiB]")
        for index, item in enumerate(listed):
            if not (
                isinstance(item, list)
                and len(item) == 3
                and isinstance(item[0], str)
                and item[0]
                and item[1] in BUFFER_KINDS
                and isinstance(item[2], (int, float))
                and not isinstance(item[2], bool)
                and 0 <= item[2] < 2**53
            ):
                raise fields.error(
                    "buffers",
                    f"a list of [buffer, kind, MiB] (item {index} is not; "
                    f"kinds: {', '.join(BUFFER_KINDS)})",
                )
            buffers.append(BufferSize(item[0], item[1], item[2]))
        limits = MemoryLimits()
        if fields.data.get("limits") is not None:
            section = fields.object("limits")
            section.check_known(frozenset({"budget_bytes", "htp_session_bytes"}))
            limits = MemoryLimits(
                section.optional_count("budget_bytes"), section.optional_count("htp_session_bytes")
            )
        return cls(
            peak_rss_kib=fields.optional_count("peak_rss_kib"),
            buffers=tuple(buffers),
            limits=limits,
        )


# "4GiB", "3.5 GB", "512MiB", "4096 MiB": binary units only mean 1024; decimal ones 1000
SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B)\s*$", re.IGNORECASE)
UNITS = {"K": 1, "M": 2, "G": 3, "T": 4}
SIZE_EXAMPLE = "a size such as 4GiB, 3.5GiB or 4096MiB"
SIZE_HINT = "KiB MiB GiB TiB count in 1024s, KB MB GB TB in 1000s"


def parse_size(text: str) -> int | None:
    """Bytes of a size such as ``4GiB`` or ``3.5GB``; None when it is not one."""
    found = SIZE_RE.match(text)
    if not found:
        return None
    unit = found[2].upper()
    base = 1024 if "I" in unit else 1000
    value = int(float(found[1]) * base ** UNITS[unit[0]])
    return value if value > 0 else None


def size_option(option: str, text: str | None) -> int | None:
    """The bytes a command-line option gives (None when not given); a usage error naming the
    option when it is not a size."""
    if text is None:
        return None
    size = parse_size(text)
    if size is None:
        raise ConfigError(f"{option} {text!r} is not {SIZE_EXAMPLE}", hint=SIZE_HINT)
    return size


def format_mib(value_bytes: int | float | None) -> str:
    return "-" if value_bytes is None else f"{value_bytes / MIB:.1f}"
