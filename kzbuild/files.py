"""Files: writes that a crash cannot leave half done, and content digests."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

HASH_CHUNK = 1 << 20


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` in one rename: readers see the old file or the new one,
    and after a crash the new one is on disk (fsynced before the rename), never a torn file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
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
