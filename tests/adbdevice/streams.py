"""One adb stream of the test device: bytes in from the host's WRTEs, bytes out as WRTEs.

Flow control follows the protocol: after each WRTE the device waits for the host's OKAY
before sending the next one.
"""

from __future__ import annotations

import queue
import threading
from typing import Protocol

from tests.adbdevice.wire import WRTE


class StreamClosed(Exception):
    """The host closed the stream, or the connection went away."""


class StreamOwner(Protocol):
    max_payload: int

    def send(self, command: int, arg0: int, arg1: int, data: bytes = b"") -> None: ...

    def close_stream(self, stream: Stream) -> None: ...

    def drop(self) -> None: ...


class Stream:
    def __init__(self, owner: StreamOwner, local_id: int, remote_id: int) -> None:
        self.owner = owner
        self.local_id = local_id
        self.remote_id = remote_id
        self.closed = threading.Event()
        self._inbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._buffer = bytearray()
        self._eof = False
        self._may_write = threading.Semaphore(1)
        self._write_lock = threading.Lock()

    # --- called by the connection's reader ---
    def deliver(self, data: bytes) -> None:
        self._inbox.put(data)

    def acknowledged(self) -> None:
        self._may_write.release()

    def peer_closed(self) -> None:
        self.closed.set()
        self._inbox.put(None)
        self._may_write.release()

    # --- used by services ---
    def _next(self) -> bool:
        if self._eof:
            return False
        item = self._inbox.get()
        if item is None:
            self._eof = True
            return False
        self._buffer += item
        return True

    def read_some(self) -> bytes:
        """What the host has sent so far (waiting for at least one byte); b"" at the end."""
        if not self._buffer and not self._next():
            return b""
        data = bytes(self._buffer)
        self._buffer.clear()
        return data

    def read_exact(self, size: int) -> bytes:
        while len(self._buffer) < size:
            if not self._next():
                raise StreamClosed(f"stream closed with {len(self._buffer)} of {size} bytes read")
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    def write(self, data: bytes) -> None:
        """Send ``data`` whole (one caller at a time), split into WRTEs of the agreed size."""
        with self._write_lock:
            for start in range(0, len(data), self.owner.max_payload):
                self._may_write.acquire()
                if self.closed.is_set():
                    raise StreamClosed("stream closed while writing")
                try:
                    self.owner.send(
                        WRTE,
                        self.local_id,
                        self.remote_id,
                        data[start : start + self.owner.max_payload],
                    )
                except OSError as exc:
                    raise StreamClosed(str(exc)) from exc

    def close(self) -> None:
        if not self.closed.is_set():
            self.closed.set()
            self.owner.close_stream(self)
        self._inbox.put(None)  # wakes a reader still waiting for input
