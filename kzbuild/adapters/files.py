"""Files: writes that a crash cannot leave half done, and content digests."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

HASH_CHUNK = 1 << 20


def write_atomic(path: Path, data: bytes, *, durable: bool = True) -> None:
    """Replace ``path`` with ``data`` in one rename: readers see the old file or the new one,
    and after a crash the new one is on disk (fsynced before the rename), never a torn file.
    ``durable=False`` skips the fsync (~10 ms) for files a crash may lose, such as counters and
    caches."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class TextCache:
    """Texts kept in one JSON file by key, for work that can always be redone (a parse, a probe).

    Each entry carries the sha256 of its text, so damage reads as a missing entry, never as other
    text; an unreadable file reads as empty. Writes replace the file atomically without fsync (a
    crash only costs redoing the work), and the oldest entries go beyond ``limit``. Two processes
    writing at once may each drop the other's new entry, which is redone next time."""

    FORMAT = 1

    def __init__(self, path: Path, *, limit: int) -> None:
        self.path = path
        self.limit = limit
        self._entries: dict[str, list[str]] | None = None

    def get(self, key: str) -> str | None:
        entry = self._load().get(key)
        if not (
            isinstance(entry, list)
            and len(entry) == 2
            and all(isinstance(part, str) for part in entry)
        ):
            return None
        digest, text = entry
        return (
            text
            if hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest() == digest
            else None
        )

    def put(self, key: str, text: str) -> None:
        entries = self._load()
        entries[key] = [hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(), text]
        while len(entries) > self.limit:
            del entries[next(iter(entries))]  # the oldest first
        self._write(entries)

    def discard(self, unwanted: Callable[[str], bool]) -> None:
        """Drop every entry whose text is ``unwanted`` (and every malformed one) from the file."""
        entries = self._load()
        dropped = [
            key
            for key, entry in entries.items()
            if not isinstance(entry, list)
            or any(not isinstance(part, str) or unwanted(part) for part in entry)
        ]
        for key in dropped:
            del entries[key]
        if dropped:
            self._write(entries)

    def _write(self, entries: dict[str, list[str]]) -> None:
        try:
            data = json.dumps({"format": self.FORMAT, "entries": entries}).encode()
            write_atomic(self.path, data, durable=False)
        except OSError as exc:
            log.debug("cannot keep %s: %s", self.path, exc)

    def _load(self) -> dict[str, list[str]]:
        if self._entries is None:
            try:
                stored = json.loads(self.path.read_bytes())
            except (OSError, ValueError, RecursionError):
                stored = None
            entries = (
                stored.get("entries")
                if isinstance(stored, dict) and stored.get("format") == self.FORMAT
                else None
            )
            self._entries = entries if isinstance(entries, dict) else {}
        return self._entries


def folder_digest(folder: Path) -> str:
    """sha256 over a folder's files (relative path and content), in path order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(folder).as_posix()}\0".encode())
        with open(path, "rb") as handle:
            while chunk := handle.read(HASH_CHUNK):
                digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()
