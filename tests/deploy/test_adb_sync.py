"""kzbuild's own sync protocol client (``AdbTransport.push_files``) against the adb test device,
through the real adb server: what arrives, in what order, and what a broken transfer leaves."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import threading
import time
from collections.abc import Iterator
from functools import partial

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kzbuild.device.adb import (
    SYNC_DATA,
    SYNC_HEADER,
    SYNC_WRITE,
    AdbTransport,
    SyncBroken,
    SyncFailed,
    SyncPush,
)
from kzbuild.device.base import Member
from kzbuild.errors import DeviceError

REMOTE = "/data/local/tmp/sync"


def member(name: str, data: bytes, mode: int = 0o644, pieces: int = 1) -> Member:
    """A file of ``data`` whose reader yields it in ``pieces`` parts (as the readers of whole files
    and of ranges do)."""
    step = max(len(data) // pieces, 1)
    parts = [data[start : start + step] for start in range(0, len(data), step)] or [b""]
    return Member(name, len(data), partial(iter, parts), label=name, mode=mode)


def transport(adb_device, **options) -> AdbTransport:
    return AdbTransport(adb_device.device(), connect_timeout=5, **options)


def arrived(adb_device) -> dict[str, bytes]:
    root = adb_device.host_path(REMOTE)
    files = {}
    for folder, _, names in os.walk(root):
        for name in names:
            with contextlib.suppress(FileNotFoundError):  # a cut file the device is removing
                with open(os.path.join(folder, name), "rb") as handle:
                    files[os.path.relpath(os.path.join(folder, name), root)] = handle.read()
    return files


def settled(adb_device, expected: dict[str, bytes]) -> dict[str, bytes]:
    """What arrived, once it is ``expected`` or 5 s passed: adbd removes a cut file after the
    connection dropped, which may be after the push reported it."""
    deadline = time.monotonic() + 5
    while (got := arrived(adb_device)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def test_files_arrive_whole_with_their_modes_and_are_reported_in_order(adb_device) -> None:
    sizes = [0, 1, SYNC_DATA - 1, SYNC_DATA, SYNC_DATA + 1, SYNC_WRITE + 12345, 3 * SYNC_WRITE]
    files = [
        member(
            f"d{index % 2}/f{index}", os.urandom(size), 0o755 if index == 3 else 0o644, index + 1
        )
        for index, size in enumerate(sizes)
    ]
    stored: list[str] = []
    transport(adb_device).push_files(files, REMOTE, on_stored=lambda m: stored.append(m.name))
    assert stored == [file.name for file in files]
    assert arrived(adb_device) == {file.name: b"".join(file.read()) for file in files}
    modes = {
        file.name: stat.S_IMODE(os.stat(adb_device.host_path(f"{REMOTE}/{file.name}")).st_mode)
        for file in files
    }
    assert modes == {file.name: file.mode for file in files}


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(
        st.sampled_from(
            [0, 7, SYNC_DATA - 8, SYNC_DATA, SYNC_DATA + 8, SYNC_WRITE - 3, SYNC_WRITE]
        ),
        min_size=1,
        max_size=6,
    ),
    pieces=st.integers(min_value=1, max_value=5),
)
def test_any_mix_of_sizes_and_reads_arrives_byte_for_byte(adb_device, sizes, pieces) -> None:
    files = [member(f"n{i}", os.urandom(size), pieces=pieces) for i, size in enumerate(sizes)]
    transport(adb_device).push_files(files, REMOTE)
    got = arrived(adb_device)
    assert {name: got[name] for name in got if name.startswith("n")} == {
        file.name: b"".join(file.read()) for file in files
    }
    for name in got:
        os.unlink(adb_device.host_path(f"{REMOTE}/{name}"))


def test_a_drop_mid_transfer_is_an_error_and_leaves_only_whole_files(adb_device) -> None:
    files = [member(f"f{index}", os.urandom(300_000)) for index in range(4)]
    adb_device.drop_send_after(700_000)  # in the third file
    stored: list[str] = []
    with pytest.raises(DeviceError, match=r"device offline \(while pushing to .*, [0-2] of 4 file"):
        transport(adb_device).push_files(files, REMOTE, on_stored=lambda m: stored.append(m.name))
    # the answers to the last files may be lost with the connection, never a file that is not there
    whole = {file.name: b"".join(file.read()) for file in files[:2]}
    assert settled(adb_device, whole) == whole and set(stored) <= set(whole)
    assert stored == [file.name for file in files[: len(stored)]]


def test_a_file_the_device_cannot_create_fails_with_its_words(adb_device) -> None:
    blocker = adb_device.host_path(f"{REMOTE}/taken")
    os.makedirs(os.path.dirname(blocker), exist_ok=True)
    open(blocker, "wb").close()  # a regular file where the push needs a dir
    files = [member("ok", b"first"), member("taken/inside", b"second"), member("later", b"x")]
    with pytest.raises(DeviceError, match=r"push to /data/local/tmp/sync/ failed: .*create"):
        transport(adb_device).push_files(files, REMOTE)
    assert arrived(adb_device) == {"ok": b"first", "taken": b""}
    assert transport(adb_device).run(["true"]).ok  # the device serves the next command


def test_a_local_file_that_changed_while_sent_stops_the_push(adb_device) -> None:
    def shrunk() -> Iterator[bytes]:
        yield b"x" * 1000  # the manifest said 2000 bytes

    files = [member("a", b"a" * 10), Member("b", 2000, shrunk, label="lib/b.so")]
    with pytest.raises(DeviceError, match=r"lib/b.so changed while it was being sent"):
        transport(adb_device).push_files(files, REMOTE)
    assert "b" not in settled(adb_device, {})  # "a" may have gone before it


def test_a_path_longer_than_adb_carries_is_named(adb_device) -> None:
    files = [member("x" * 1100, b"data")]
    with pytest.raises(DeviceError, match=r"longer than adb carries"):
        transport(adb_device).push_files(files, REMOTE)


def test_the_transfer_timeout_bounds_the_whole_copy(adb_device) -> None:
    adb_device.faults.send_delay = 0.2  # each 64 KiB chunk
    files = [member("big", os.urandom(20 * SYNC_DATA))]
    with pytest.raises(DeviceError, match=r"timed out after 0.5 s with 0 of 1 file\(s\) stored"):
        transport(adb_device, transfer_timeout=0.5).push_files(files, REMOTE)
    adb_device.faults.send_delay = 0.0
    assert transport(adb_device).run(["true"]).ok


def answered(answers: bytes, files: list[Member]) -> tuple[str, int]:
    """A SyncPush of ``files`` against a peer that drains what it is sent and answers
    ``answers``, then hangs up: how it ended, and the files it counted stored."""
    ours, peer = socket.socketpair()

    def device() -> None:
        with peer:
            peer.sendall(answers)
            peer.shutdown(socket.SHUT_WR)
            with contextlib.suppress(OSError):
                while peer.recv(1 << 16):
                    pass

    thread = threading.Thread(target=device)
    thread.start()
    push = SyncPush(ours, files, None)
    try:
        push.send(REMOTE, time.monotonic() + 10)
        ended = "done"
    except SyncFailed as exc:
        ended = f"failed: {exc.words}"
    except SyncBroken:
        ended = "broken"
    except OSError:
        ended = "cut"
    finally:
        ours.close()
        thread.join()
    return ended, push.stored


OKAY = SYNC_HEADER.pack(b"OKAY", 0)


def test_answers_that_are_no_sync_protocol_are_a_broken_stream() -> None:
    files = [member("a", b"1"), member("b", b"2")]
    assert answered(OKAY + OKAY, files) == ("done", 2)
    assert answered(OKAY + b"JUNKJUNK", files) == ("broken", 1)
    words = b"couldn't create file: Read-only file system"
    assert answered(SYNC_HEADER.pack(b"FAIL", len(words)) + words, files) == (
        f"failed: {words.decode()}",
        0,
    )
    assert answered(OKAY, files) == ("cut", 1)  # the device hung up after the first


@settings(max_examples=100, deadline=None)
@given(
    answers=st.binary(max_size=64)
    | st.lists(st.sampled_from([OKAY, b"FAIL", b"\x05\0\0\0no"])).map(b"".join)
)
def test_any_answer_ends_in_one_of_the_push_s_own_outcomes(answers: bytes) -> None:
    ended, stored = answered(answers, [member("a", b"1"), member("b", b"2" * 70_000)])
    assert ended in ("done", "broken", "cut") or ended.startswith("failed: ")
    assert 0 <= stored <= 2 and (ended != "done" or stored == 2)
