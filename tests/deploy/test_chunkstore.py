"""The pieces of deploy's chunk transfer: FastCDC cuts, and the tar streams the device unpacks."""

from __future__ import annotations

import hashlib
import io
import os
import random
import subprocess
import tarfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from kzbuild.device.base import Member
from kzbuild.device.chunkstore import (
    DIRECTORY,
    MAX_CHUNK,
    MIN_CHUNK,
    NAME_HEX,
    SYMLINK,
    TAR_BLOCK,
    WHOLE_BELOW,
    constant,
    split,
    tar_header,
    tar_stream,
)
from kzbuild.device.modelpush import sweep_stages

NAME_PART = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._-+", min_size=1, max_size=40)
PATHS = st.lists(NAME_PART, min_size=1, max_size=8).map("/".join)


def test_a_file_is_cut_into_chunks_named_by_their_sha256_that_add_up_to_it(tmp_path: Path) -> None:
    data = random.Random(1).randbytes(300_000)
    path = tmp_path / "lib.so"
    path.write_bytes(data)
    pieces = split(path, len(data))
    assert b"".join(data[p.offset : p.offset + p.size] for p in pieces) == data
    assert all(
        p.name == hashlib.sha256(data[p.offset : p.offset + p.size]).hexdigest()[:NAME_HEX]
        for p in pieces
    )
    assert all(MIN_CHUNK <= p.size <= MAX_CHUNK for p in pieces[:-1])


def test_an_edit_in_the_middle_changes_only_the_chunks_around_it(tmp_path: Path) -> None:
    data = random.Random(2).randbytes(4_000_000)
    edited = data[:2_000_000] + b"patched!" + data[2_000_100:]
    (tmp_path / "a").write_bytes(data)
    (tmp_path / "b").write_bytes(edited)
    before = {p.name for p in split(tmp_path / "a", len(data))}
    after = split(tmp_path / "b", len(edited))
    new = [p for p in after if p.name not in before]
    assert sum(p.size for p in new) <= 3 * MAX_CHUNK  # not the whole 4 MB


def test_a_small_file_travels_whole(tmp_path: Path) -> None:
    path = tmp_path / "small"
    path.write_bytes(random.Random(3).randbytes(WHOLE_BELOW - 1))
    assert split(path, WHOLE_BELOW - 1) == ()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(PATHS, st.binary(max_size=2000)),
        min_size=1,
        max_size=6,
        unique_by=lambda item: item[0],
    )
)
def test_tar_streams_read_back_with_names_sizes_and_contents(
    files: list[tuple[str, bytes]],
) -> None:
    archive = b"".join(
        tar_stream([Member(name, len(data), constant(data)) for name, data in files])
    )
    assert len(archive) % TAR_BLOCK == 0
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        members = tar.getmembers()
        assert [(m.name, m.size, m.mode) for m in members] == [
            (name, len(data), 0o644) for name, data in files
        ]
        assert [tar.extractfile(m).read() for m in members] == [data for _, data in files]  # type: ignore[union-attr]


@settings(max_examples=60, deadline=None)
@given(PATHS, PATHS)
def test_symlink_and_directory_headers_read_back(name: str, target: str) -> None:
    archive = (
        tar_header(name, 0, kind=DIRECTORY, mode=0o755)
        + tar_header(f"{name}/f", 0, kind=SYMLINK, linkname=target)
        + bytes(2 * TAR_BLOCK)
    )
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        directory, link = tar.getmembers()
    assert (directory.name, directory.isdir(), directory.mode) == (name, True, 0o755)
    assert (link.name, link.issym(), link.linkname) == (f"{name}/f", True, target)


@settings(max_examples=60, deadline=None)
@given(PATHS, st.integers(0, 1 << 40), st.integers(0, 1 << 40))
def test_headers_read_back_with_any_size_and_time(name: str, size: int, mtime: int) -> None:
    """Sizes and times past ustar's 11 octal digits (8 GiB) go in a pax header."""
    with tarfile.open(fileobj=io.BytesIO(tar_header(name, size, mtime=mtime)), mode="r:") as tar:
        member = tar.next()
    assert member is not None
    assert (member.name, member.size, int(member.mtime)) == (name, size, mtime)


def test_gnu_tar_unpacks_a_stream_with_long_names_and_symlinks(tmp_path: Path) -> None:
    long_name = "/".join(["d" * 60] * 4) + "/file"  # over ustar's 100 + 155: a pax header
    (tmp_path / "objects").mkdir()
    (tmp_path / "objects" / "abc").write_bytes(b"content")
    members = [Member("plain", 5, constant(b"hello")), Member(long_name, 3, constant(b"xyz"))]
    archive = (
        b"".join(tar_stream(members, end=False))
        + tar_header("rel", 0, kind=DIRECTORY, mode=0o755)
        + tar_header("rel/lib.so", 0, kind=SYMLINK, linkname="../objects/abc")
        + bytes(2 * TAR_BLOCK)
    )
    subprocess.run(["tar", "-x", "-f", "-"], cwd=tmp_path, input=archive, check=True)
    assert (tmp_path / "plain").read_bytes() == b"hello" and (
        tmp_path / long_name
    ).read_bytes() == b"xyz"
    assert os.readlink(tmp_path / "rel" / "lib.so") == "../objects/abc"
    assert (tmp_path / "rel" / "lib.so").read_bytes() == b"content"


def test_staging_dirs_a_killed_kzbuild_left_are_swept(tmp_path: Path) -> None:
    gone = subprocess.run(["sh", "-c", "echo $$"], check=True, capture_output=True, text=True)
    dead = tmp_path / f"kz-stage-{gone.stdout.strip()}-x1"
    alive = tmp_path / f"kz-stage-{os.getpid()}-x2"
    for folder in (dead, alive):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "chunk").write_bytes(b"data")
    sweep_stages(tmp_path)
    assert not dead.exists() and (alive / "sub" / "chunk").read_bytes() == b"data"
