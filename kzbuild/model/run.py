"""A release on a device and one invocation of a tool in it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Release:
    """The release ``current`` pointed at when it was resolved."""

    build_id: str
    dir: str  # absolute device path
    manifest: Mapping[str, Any]  # the deployed manifest.json; empty when the release has none
    manifest_sha256: str | None


@dataclass(frozen=True)
class Invocation:
    """A tool run exactly as it happens on the device."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
