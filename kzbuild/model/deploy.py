"""What a deploy, a rollback and a model push did."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class DeployResult:
    device: str
    build_id: str
    release: str
    previous: str | None  # the release `current` pointed at before
    switched: bool
    files_sent: int
    files_skipped: int
    bytes_sent: int  # contents sent: the chunks and small files the device lacked
    bytes_skipped: int  # contents the device already held, whole files or chunks
    bytes_resumed: int  # contents an earlier, cut deploy had already delivered
    metadata_bytes: int  # the release's manifest.json
    seconds: float
    pruned: tuple[str, ...] = ()
    repaired: tuple[
        str, ...
    ] = ()  # files (relative to the root) re-linked to a re-sent content: they had not matched

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class RollbackResult:
    device: str
    release: str
    previous: str
    pruned: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class ModelPushResult:
    device: str
    sha256: str
    path: str  # content-addressed file on the device
    link: str  # readable name pointing at it
    bytes_sent: int
    bytes_resumed: int
    bytes_reused: int  # copied on the device out of models it held
    already_there: bool
    seconds: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)
