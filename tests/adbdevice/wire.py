"""The adb wire formats the test device speaks: transport packets, shell protocol v2, sync.

Transport packet (both directions): a 24-byte little-endian header ``command, arg0, arg1,
data_length, data_check, magic`` (``magic == command ^ 0xffffffff``) followed by the data.
Inside a stream opened with ``shell,v2:`` every chunk is ``id:u8 length:u32`` + data; inside
``sync:`` requests are ``id:4s length:u32`` + payload.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import BinaryIO


def command_id(name: bytes) -> int:
    return int(struct.unpack("<I", name)[0])


CNXN = command_id(b"CNXN")
AUTH = command_id(b"AUTH")
OPEN = command_id(b"OPEN")
OKAY = command_id(b"OKAY")
CLSE = command_id(b"CLSE")
WRTE = command_id(b"WRTE")

A_VERSION = 0x01000001  # the version that lets both sides skip the data checksum
MAX_PAYLOAD = 1024 * 1024
AUTH_TOKEN, AUTH_SIGNATURE, AUTH_RSAPUBLICKEY = 1, 2, 3

HEADER = struct.Struct("<6I")


class ProtocolError(Exception):
    """The peer sent something that is not an adb packet."""


@dataclass(frozen=True)
class Packet:
    command: int
    arg0: int
    arg1: int
    data: bytes

    @property
    def name(self) -> str:
        return struct.pack("<I", self.command).decode("ascii", "replace")


def encode(command: int, arg0: int, arg1: int, data: bytes = b"") -> bytes:
    checksum = sum(data) & 0xFFFFFFFF
    return HEADER.pack(command, arg0, arg1, len(data), checksum, command ^ 0xFFFFFFFF) + data


def read_exact(handle: BinaryIO, size: int) -> bytes | None:
    """``size`` bytes, or None at a clean end of stream before the first byte."""
    data = handle.read(size)
    if not data:
        return None
    if len(data) != size:
        raise ProtocolError(f"stream ended inside a packet ({len(data)} of {size} bytes)")
    return data


def read_packet(handle: BinaryIO) -> Packet | None:
    header = read_exact(handle, HEADER.size)
    if header is None:
        return None
    command, arg0, arg1, length, _checksum, magic = HEADER.unpack(header)
    if magic != command ^ 0xFFFFFFFF:
        raise ProtocolError(f"bad magic in packet header {header.hex()}")
    if length > MAX_PAYLOAD:
        raise ProtocolError(f"payload of {length} bytes exceeds {MAX_PAYLOAD}")
    data = read_exact(handle, length) if length else b""
    if data is None:
        raise ProtocolError("stream ended before the packet payload")
    return Packet(command, arg0, arg1, data)


# --- shell protocol v2 (inside a "shell,v2:" stream) ---
SHELL_STDIN, SHELL_STDOUT, SHELL_STDERR, SHELL_EXIT, SHELL_CLOSE_STDIN, SHELL_WINDOW_SIZE = range(6)
SHELL_HEADER = struct.Struct("<BI")


def shell_packet(kind: int, data: bytes) -> bytes:
    return SHELL_HEADER.pack(kind, len(data)) + data


# --- sync (inside a "sync:" stream) ---
SYNC_HEADER = struct.Struct("<4sI")
SYNC_DATA_MAX = 64 * 1024
SYNC_PATH_MAX = 1024
STAT_V1 = struct.Struct("<4sIII")  # id, mode, size, mtime
STAT_V2 = struct.Struct(
    "<4sIQQIIIIQqqq"
)  # id, error, dev, ino, mode, nlink, uid, gid, size, atime, mtime, ctime
DENT_V1 = struct.Struct("<4sIIII")  # id, mode, size, mtime, namelen
DENT_V2 = struct.Struct("<4sIQQIIIIQqqqI")  # stat_v2 fields + namelen


def sync_status(ident: bytes, message: bytes = b"") -> bytes:
    """An OKAY/FAIL/DONE/DATA record: id, length, then ``message``."""
    return SYNC_HEADER.pack(ident, len(message)) + message
