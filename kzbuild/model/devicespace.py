"""What the store on a device holds, and what pruning would free (``kzbuild device status``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ReleaseSpace:
    name: str
    current: bool
    holds: int  # bytes of the distinct contents its manifest lists (shared ones included)
    own: int  # bytes of the contents no other release holds


@dataclass(frozen=True)
class ModelSpace:
    sha256: str
    size: int  # bytes of its files (its splits, when it is stored as splits)
    names: tuple[str, ...]  # the readable names pointing at it
    own: int  # bytes of its files no other model holds
    splits: int  # files it is stored as (1: one whole file)


@dataclass(frozen=True)
class KeepSpace:
    keep: int
    removes: tuple[str, ...]  # the releases ``--keep N`` removes
    frees: int  # bytes: contents only they (or nothing) hold, the chunks only those use, and
    # the cut model pushes prune gives up


@dataclass(frozen=True)
class SpaceReport:
    device: str
    root: str
    releases: tuple[ReleaseSpace, ...]  # most recently switched to first
    contents: int  # bytes in objects/, each content once however many releases hold it
    chunks: int  # bytes in chunks/ (kept beside the contents, to send deltas)
    models: tuple[ModelSpace, ...]
    model_files: int  # bytes in models/, each file once however many models hold it
    incoming: int  # bytes of cut uploads waiting to be resumed
    keeps: tuple[KeepSpace, ...]
    hard_links: bool  # releases hard-link their contents (else symlinks: Android's adb shell)

    @property
    def total(self) -> int:
        return self.contents + self.chunks + self.model_files + self.incoming

    def to_dict(self) -> dict[str, object]:
        return asdict(self) | {"total": self.total}
