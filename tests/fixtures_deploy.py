"""Artifacts for deploy tests: real small ELF programs and libraries plus a manifest.

``bin/hello`` links ``lib/libgreet.so`` and ``lib/libblob.so`` through ``$ORIGIN/../lib``,
so running it from a deployed release shows the release is complete and linked right.
``libblob.so`` carries a random payload (``.incbin``) to make a file large enough to cut
mid-transfer.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import stat
import subprocess
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from kzbuild.device.base import NO_SPACE, Member, RemoteResult, device_full
from kzbuild.device.local import LocalTransport
from kzbuild.device.store import object_link
from kzbuild.errors import DeviceError
from kzbuild.model.artifact import parse_mode

GREET_C = '#include <stdio.h>\nvoid greet(void) { puts("%s"); }\n'
BLOB_C = (
    'asm(".section .rodata\\n.global blob_data\\nblob_data:\\n.incbin \\"%s\\"\\n.global '
    'blob_end\\nblob_end:\\n.text");\n'
    "extern const char blob_data[], blob_end[];\n"
    "long blob_size(void) { return blob_end - blob_data; }\n"
)
HELLO_C = (
    "#include <stdio.h>\nvoid greet(void); long blob_size(void);\n"
    'int main(void) { greet(); printf("blob %ld\\n", blob_size()); return 0; }\n'
)


def compile_c(source: str, output: Path, *args: str) -> None:
    c_file = output.with_suffix(output.suffix + ".c")
    c_file.write_text(source)
    subprocess.run(
        ["gcc", "-O1", "-o", str(output), str(c_file), *args], check=True, capture_output=True
    )
    c_file.unlink()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_manifest(directory: Path, build_id: str, *, recipe: str | None = None) -> Path:
    """manifest.json over every file under ``directory`` (as ``kzbuild build`` writes it)."""
    files = {}
    for path in sorted(
        p for p in directory.rglob("*") if p.is_file() and p.name != "manifest.json"
    ):
        rel = path.relative_to(directory).as_posix()
        files[rel] = {
            "sha256": sha256(path),
            "size": path.stat().st_size,
            "mode": f"{path.stat().st_mode & 0o7777:04o}",
        }
    manifest = {
        "build_id": build_id,
        "recipe": recipe,
        "target": "host",
        "files": files,
        "inputs": {"test": True},
    }
    target = directory / "manifest.json"
    target.write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return target


def small_edit(data: bytes, rng: random.Random) -> bytes:
    """A 4 KiB insertion and eight scattered 64-byte edits (issue 27's small edit)."""
    edited = bytearray(data)
    for index in range(8):
        at = (index * 2 + 1) * len(data) // 17
        edited[at : at + 64] = rng.randbytes(64)
    middle = len(edited) // 2
    return bytes(edited[:middle]) + rng.randbytes(4096) + bytes(edited[middle:])


def assert_store_invariant(root: Path) -> str | None:
    """The device store under ``root`` (a local path: every test device stores on this disk) is
    sound; returns the release ``current`` points at (None before the first deploy).

    Every ``objects/<sha256>`` hashes to its name, every ``chunks/<name>`` to a sha256 that starts
    with its name; every release holds exactly what its
    manifest.json lists, as regular files with those contents (executable where listed so); no
    manifest shares an inode with
    anything (a write through it would reach the store); nothing is setuid, setgid or sticky;
    ``current`` (if any) points at a complete release.
    """
    objects = root / "objects"
    for obj in objects.iterdir() if objects.is_dir() else ():
        assert sha256(obj) == obj.name, f"objects/{obj.name} hashes to {sha256(obj)}"
    chunks = root / "chunks"
    for chunk in chunks.iterdir() if chunks.is_dir() else ():
        assert sha256(chunk).startswith(chunk.name), (
            f"chunks/{chunk.name} hashes to {sha256(chunk)}"
        )
    for path in root.rglob("*"):
        info = path.lstat()
        assert not info.st_mode & 0o7000, f"{path} has mode {info.st_mode & 0o7777:o}"
    releases = root / "releases"
    complete = set()
    for release in releases.iterdir() if releases.is_dir() else ():
        if release.name.startswith("."):
            continue  # a staging dir a cut deploy left
        manifest = release / "manifest.json"
        assert manifest.lstat().st_nlink == 1, f"{manifest} is hard-linked"
        files = json.loads(manifest.read_text())["files"]
        on_disk = {
            p.relative_to(release).as_posix() for p in release.rglob("*") if not p.is_dir()
        } - {"manifest.json"}
        assert on_disk == set(files), (
            f"release {release.name}: {sorted(on_disk ^ set(files))} differ from its manifest"
        )
        for rel, entry in files.items():
            path = release / rel
            # a hard link (its content stays when the object goes), or, where the device refuses
            # those (Android's adb shell), a relative symlink into the store
            if path.is_symlink():
                assert os.readlink(path) == object_link(rel, entry["sha256"]), f"{path} misleads"
            assert stat.S_ISREG(path.stat().st_mode), f"{path} leads to no regular file"
            assert sha256(path) == entry["sha256"], f"{path} does not match its manifest"
            if parse_mode(rel, entry.get("mode", 0o644)) & 0o111:
                assert path.stat().st_mode & 0o111 == 0o111, f"{path} is not executable"
        complete.add(release.name)
    if not os.path.lexists(root / "current"):
        return None
    target = os.readlink(root / "current")
    assert target.startswith("releases/") and target.removeprefix("releases/") in complete, (
        f"current -> {target} is no complete release"
    )
    return target.removeprefix("releases/")


def whole_chunks(incoming: Path, original: Path) -> int:
    """Bytes of the chunks of ``original`` that lie complete in ``incoming`` (what a resumed deploy
    need not send)."""
    from kzbuild.device.chunkstore import split

    sizes = {piece.name: piece.size for piece in split(original, original.stat().st_size)}
    return sum(
        size
        for name, size in sizes.items()
        if (incoming / name).is_file() and (incoming / name).stat().st_size == size
    )


def flip_byte(path: Path, offset: int = 100) -> None:
    """Change one byte of ``path`` in place, as failing storage would (every hard link sees it)."""
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))


class ArtifactMaker:
    """Builds artifact dirs under ``root``; compiled parts are cached in ``cache``."""

    def __init__(self, root: Path, cache: Path) -> None:
        self.root = root
        self.cache = cache
        root.mkdir(parents=True, exist_ok=True)
        cache.mkdir(parents=True, exist_ok=True)

    def _greet(self, greeting: str) -> Path:
        out = (
            self.cache
            / f"greet-{hashlib.sha256(greeting.encode()).hexdigest()[:12]}"
            / "libgreet.so"
        )
        if not out.exists():
            out.parent.mkdir()
            compile_c(GREET_C % greeting, out, "-shared", "-fPIC")
        return out

    def _blob(self, seed: int, size: int) -> Path:
        out = self.cache / f"blob-{seed}-{size}" / "libblob.so"
        if not out.exists():
            out.parent.mkdir()
            payload = out.parent / "payload.bin"
            payload.write_bytes(random.Random(seed).randbytes(size))
            compile_c(BLOB_C % payload, out, "-shared", "-fPIC")
        return out

    def _hello(self) -> Path:
        out = self.cache / "hello" / "hello"
        if not out.exists():
            out.parent.mkdir()
            libs = self._greet("x").parent, self._blob(0, 16).parent
            compile_c(
                HELLO_C,
                out,
                *[f"-L{d}" for d in libs],
                "-lgreet",
                "-lblob",
                "-Wl,-rpath,$ORIGIN/../lib",
            )
        return out

    def make(
        self,
        build_id: str,
        *,
        greeting: str = "hello from v1",
        blob_seed: int = 1,
        blob_size: int = 64 * 1024,
        recipe: str | None = None,
        extra: dict[str, bytes] | None = None,
    ) -> Path:
        directory = self.root / build_id
        if directory.exists():
            shutil.rmtree(directory)
        (directory / "bin").mkdir(parents=True)
        (directory / "lib").mkdir()
        shutil.copy2(self._hello(), directory / "bin" / "hello")
        shutil.copy2(self._greet(greeting), directory / "lib" / "libgreet.so")
        shutil.copy2(self._blob(blob_seed, blob_size), directory / "lib" / "libblob.so")
        for rel, data in (extra or {}).items():
            (directory / rel).parent.mkdir(parents=True, exist_ok=True)
            (directory / rel).write_bytes(data)
        write_manifest(directory, build_id, recipe=recipe)
        return directory


def truncated(data: Iterable[bytes], budget: int, spent: list[int]) -> Iterator[bytes]:
    """``data`` up to ``budget`` bytes; ``spent[0]`` counts what went out, ``spent[1]`` is 1 if some
    was cut off."""
    for piece in data:
        kept = piece[: max(budget - spent[0], 0)]
        spent[0] += len(kept)
        if kept:
            yield kept
        if len(kept) < len(piece):
            spent[1] = 1
            return


class CuttingTransport(LocalTransport):
    """A local transport whose connection 'drops' after a number of bytes, as a dropped link
    would."""

    def __init__(self, root: str, budget: int) -> None:
        super().__init__(root)
        self.budget = budget

    def run_input(
        self, argv: Sequence[str], data: Iterable[bytes], *, timeout: float | None = None
    ) -> RemoteResult:
        spent = [0, 0]
        result = super().run_input(argv, truncated(data, self.budget, spent), timeout=timeout)
        self.budget -= spent[0]
        if spent[1]:
            raise DeviceError(f"{self.address}: connection lost while running {argv[0]}")
        return result

    def _copy(self, local: Path, remote: str, offset: int, progress) -> None:  # type: ignore[no-untyped-def]
        size = local.stat().st_size - offset
        if size <= self.budget:
            self.budget -= size
            return super()._copy(local, remote, offset, progress)
        with open(local, "rb") as src, open(remote, "r+b" if offset else "wb") as dst:
            src.seek(offset)
            dst.seek(offset)
            dst.write(src.read(self.budget))
        raise DeviceError(f"{self.address}: connection lost while uploading {local.name}")


class NoSpaceTransport:
    """Wraps a transport; an upload that would take the device past ``budget`` bytes writes up to
    it, then fails as a full disk does (the transports' own ENOSPC error)."""

    def __init__(self, inner: Any, budget: int) -> None:
        self.inner = inner
        self.budget = budget

    def __getattr__(self, name: str) -> Any:
        if name == "push_files" and hasattr(self.inner, name):
            return self._push_files
        return getattr(
            self.inner, name
        )  # address, run, pull, close; append only where inner has it

    def _push_files(self, files: Sequence[Member], remote: str, **options: Any) -> None:
        """The files in order until the budget runs out, the last one cut there."""
        arrived = []
        for member in files:
            data = b"".join(member.read())[: self.budget]
            self.budget -= len(data)
            arrived.append(replace(member, size=len(data), read=partial(iter, (data,))))
            if not self.budget:
                break
        self.inner.push_files(arrived, remote, **options)
        if not self.budget:
            raise device_full(self.inner.address, f"writing {remote}/ failed: {NO_SPACE}")

    def run_input(
        self, argv: Sequence[str], data: Iterable[bytes], *, timeout: float | None = None
    ) -> RemoteResult:
        spent = [0, 0]
        result = self.inner.run_input(argv, truncated(data, self.budget, spent), timeout=timeout)
        self.budget -= spent[0]
        if not spent[1]:
            return result
        written, self.budget = spent[0], 0
        # the dir the command writes to: incoming/ for a stream (which may carry the release and
        # the lock's removal after it), else its last path
        paths = [arg for arg in argv if arg.startswith("/")]
        where = next((arg for arg in paths if arg.endswith("/incoming/")), paths[-1])
        raise device_full(
            self.inner.address, f"writing {where} failed after {written} bytes: {NO_SPACE}"
        )

    def push(self, local: Path, remote: str, *, progress: Any = None) -> None:
        size = local.stat().st_size
        if size <= self.budget:
            self.budget -= size
            return self.inner.push(local, remote, progress=progress)
        partial = local.with_name(local.name + ".arrived")
        partial.write_bytes(local.read_bytes()[: self.budget])
        try:
            self.inner.push(partial, remote)
        finally:
            partial.unlink()
        written, self.budget = self.budget, 0
        raise device_full(
            self.inner.address, f"writing {remote} failed after {written} bytes: {NO_SPACE}"
        )


def pids_where(match: Callable[[Path], bool]) -> list[int]:
    """The pids whose /proc entry ``match`` accepts; an entry that vanishes meanwhile, is not
    readable (not ours) or is malformed counts as no match."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if match(entry):
                    found.append(int(entry.name))
    return found
