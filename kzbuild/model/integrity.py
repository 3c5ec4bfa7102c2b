"""What a check of a device's content store found (``kzbuild device verify``, and deploy's check
of the release it makes current)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

DamageKind = Literal["object", "release", "model", "chunk"]
MISSING = "missing"


@dataclass(frozen=True)
class Damage:
    kind: DamageKind
    name: str  # the object's sha256, the release, the model file, or the chunk
    path: str  # relative to the device root, e.g. releases/b1/lib/libggml.so
    expected: str  # sha256 (for a release manifest: what it should be)
    found: str  # sha256 on the device, or MISSING, or what is wrong


@dataclass(frozen=True)
class StoreReport:
    device: str
    root: str
    objects: int  # how many were checked
    releases: int
    models: int
    damage: tuple[Damage, ...]
    chunks: int = 0  # damaged ones were removed (a deploy sends a missing chunk again)

    @property
    def ok(self) -> bool:
        return not self.damage

    @property
    def damaged_releases(self) -> tuple[str, ...]:
        return tuple(sorted({entry.name for entry in self.damage if entry.kind == "release"}))

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "ok": self.ok, "damaged_releases": list(self.damaged_releases)}
