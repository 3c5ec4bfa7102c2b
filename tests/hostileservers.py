"""Cache servers that misbehave, on 127.0.0.1: a redis speaking RESP and a WebDAV-like HTTP
store, each an honest store (a dict) until told to answer reads of some keys with one hostile
answer. Used by tests/test_hostile_cache.py and benchmarks/bench_faults.py.

Hostile answers (``mode``): ``nested`` arrays 100 000 deep, ``huge`` a size of 1 TiB announced,
``garbage`` a reply that is not the protocol, ``drip`` the honest answer at 64 bytes a second,
``endless`` bytes without end, ``long-line`` a line without end, ``manifest-1tib`` the honest
manifest with a file claimed to be 1 TiB, ``redirect`` (HTTP) a 302 to another server on
another port, which records the headers it was sent, ``redirect-here`` a 301 to the same server.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Callable
from typing import BinaryIO

DRIP_RATE = 64  # bytes a second
TIB = 1 << 40
REDIS_MODES = ("nested", "huge", "garbage", "drip", "endless", "long-line", "manifest-1tib")
HTTP_MODES = ("redirect", "huge", "garbage", "drip", "endless", "long-line", "manifest-1tib")


class Server:
    """Accepts connections and serves each in a thread with ``handle``; ``close`` stops it."""

    def __init__(self, handle: Callable[[socket.socket], None]) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.handle = handle
        self.conns: list[socket.socket] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if self.closed:  # woken by close(): the fd may already be another listener's
                conn.close()
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self.handle(conn)
        except OSError:
            pass  # the client gave up (as it should)
        finally:
            conn.close()

    def close(self) -> None:
        self.closed = True
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() before the fd is reused
        except OSError:
            pass
        self.listener.close()
        for conn in self.conns:
            conn.close()


def hostile_manifest(raw: bytes) -> bytes:
    doc = json.loads(raw)
    next(iter(doc["files"].values()))["size"] = TIB
    return json.dumps(doc).encode()


def send_hostile(
    conn: socket.socket, mode: str, honest: bytes, framed: Callable[[bytes], bytes], server: Server
) -> None:
    """Answer with ``mode``; ``honest`` is the honest answer, ``framed`` frames a payload."""
    if mode == "drip":
        for i in range(len(honest)):
            if server.closed:
                return
            conn.sendall(honest[i : i + 1])
            time.sleep(1 / DRIP_RATE)
    elif mode in ("endless", "long-line"):
        piece = b"x" * 65536
        started = time.monotonic()
        while not server.closed and time.monotonic() - started < 30:
            conn.sendall(piece)
    elif mode == "manifest-1tib":
        conn.sendall(framed(hostile_manifest(honest_payload(honest))))
    else:
        raise AssertionError(mode)


def honest_payload(framed: bytes) -> bytes:
    """The payload of a framed honest answer (a RESP bulk string or an HTTP answer)."""
    if framed.startswith(b"$"):
        return framed.split(b"\r\n", 1)[1][:-2]
    return framed.split(b"\r\n\r\n", 1)[1]


class FakeRedis:
    """A redis store speaking RESP2 (AUTH, SELECT, PING, GET, SET, EXISTS); reads of keys that
    hold ``target`` get the hostile answer of ``mode`` (None: honest)."""

    def __init__(self, password: str = "") -> None:
        self.password = password
        self.data: dict[bytes, bytes] = {}
        self.mode: str | None = None
        self.target = b"artifacts/"
        self.hostile_answers = 0
        self.server = Server(self._handle)
        self.port = self.server.port

    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.close()

    def _handle(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        while True:
            command = read_command(reader)
            if command is None:
                return
            name = command[0].upper()
            if name == b"GET" and self.mode is not None and self.target in command[1]:
                self.hostile_answers += 1
                self._hostile(conn, command[1])
                return
            conn.sendall(self._answer(name, command[1:]))

    def _answer(self, name: bytes, args: list[bytes]) -> bytes:
        if name in (b"AUTH", b"SELECT"):
            return (
                b"+OK\r\n"
                if name == b"SELECT" or args[-1] == self.password.encode()
                else b"-WRONGPASS\r\n"
            )
        if name == b"PING":
            return b"+PONG\r\n"
        if name == b"GET":
            value = self.data.get(args[0])
            return b"$-1\r\n" if value is None else b"$%d\r\n%s\r\n" % (len(value), value)
        if name == b"SET":
            self.data[args[0]] = args[1]
            return b"+OK\r\n"
        if name == b"EXISTS":
            return b":%d\r\n" % (args[0] in self.data)
        return b"-ERR unknown command\r\n"

    def _hostile(self, conn: socket.socket, key: bytes) -> None:
        honest = self._answer(b"GET", [key])
        mode = self.mode
        assert mode is not None
        if mode == "nested":
            conn.sendall(b"*1\r\n" * 100_000 + b":1\r\n")
        elif mode == "huge":
            conn.sendall(b"$%d\r\n" % TIB + b"x" * 65536)
        elif mode == "garbage":
            conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
        elif mode == "long-line":
            conn.sendall(b"+")
            send_hostile(conn, mode, honest, bulk, self.server)
        else:
            send_hostile(conn, mode, honest, bulk, self.server)


def bulk(payload: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(payload), payload)


def read_command(reader: BinaryIO) -> list[bytes] | None:
    """One RESP array of bulk strings from a binary file, or None at its end."""
    readline, read = reader.readline, reader.read
    head = readline()
    if not head:
        return None
    args = []
    for _ in range(int(head[1:])):
        size = int(readline()[1:])
        args.append(read(size + 2)[:-2])
    return args


class FakeHttpStore:
    """A WebDAV-like store (GET, HEAD, PUT) behind Basic auth; GETs of keys that hold ``target``
    get the hostile answer of ``mode``. ``elsewhere`` is the other server a redirect names: it
    answers 404 and keeps the headers of every request it got in ``elsewhere_headers``."""

    def __init__(self, user: str = "", password: str = "") -> None:
        self.auth = (user, password)
        self.data: dict[str, bytes] = {}
        self.mode: str | None = None
        self.target = "/kz/artifacts/"
        self.hostile_answers = 0
        self.elsewhere_headers: list[dict[str, str]] = []
        self.server = Server(self._handle)
        self.elsewhere = Server(self._handle_elsewhere)
        self.port = self.server.port

    def url(self) -> str:
        user, password = self.auth
        auth = f"{user}:{password}@" if password else ""
        return f"http://{auth}127.0.0.1:{self.port}/cache"

    def close(self) -> None:
        self.server.close()
        self.elsewhere.close()

    def _handle(self, conn: socket.socket) -> None:
        reader = conn.makefile("rb")
        request = read_request(reader)
        if request is None:
            return
        method, path, headers, body = request
        honest = self._answer(method, path, headers, body)
        if method == "GET" and self.mode is not None and self.target in path:
            self.hostile_answers += 1
            self._hostile(conn, path, honest)
        else:
            conn.sendall(honest)

    def _answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
        user, password = self.auth
        if password:
            from kzbuild.model.urls import basic_auth

            if headers.get("authorization") != basic_auth(user, password):
                return answer(401, b"")
        if method == "PUT":
            self.data[path] = body
            return answer(201, b"")
        value = self.data.get(path)
        if value is None:
            return answer(404, b"")
        return answer(200, value, head=method == "HEAD")

    def _hostile(self, conn: socket.socket, path: str, honest: bytes) -> None:
        mode = self.mode
        assert mode is not None
        if mode == "redirect":
            where = f"http://127.0.0.1:{self.elsewhere.port}{path}"
            conn.sendall(
                b"HTTP/1.1 302 Found\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % where.encode()
            )
        elif mode == "redirect-here":  # a relative Location: the same server
            where = path.replace("/artifacts/", "/objects/")
            conn.sendall(
                b"HTTP/1.1 301 Moved\r\nLocation: %s\r\nContent-Length: 0\r\n\r\n" % where.encode()
            )
        elif mode == "huge":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % TIB + b"x" * 65536)
        elif mode == "garbage":
            conn.sendall(b"HTP/1.1 2OO \xff\xfe garbage\r\n\r\n")
        elif mode == "long-line":
            conn.sendall(b"HTTP/1.1 200 OK\r\nX-Long: ")
            send_hostile(conn, mode, honest, framed_http, self.server)
        elif mode == "endless":
            conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
            send_hostile(conn, mode, honest, framed_http, self.server)
        else:
            send_hostile(conn, mode, honest, framed_http, self.server)

    def _handle_elsewhere(self, conn: socket.socket) -> None:
        request = read_request(conn.makefile("rb"))
        if request is not None:
            self.elsewhere_headers.append(request[2])
            conn.sendall(answer(404, b""))


def framed_http(payload: bytes) -> bytes:
    return answer(200, payload)


def answer(status: int, body: bytes, *, head: bool = False) -> bytes:
    reason = {200: "OK", 201: "Created", 401: "Unauthorized", 404: "Not Found"}[status]
    start = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return start.encode() + (b"" if head else body)


def read_request(reader: BinaryIO) -> tuple[str, str, dict[str, str], bytes] | None:
    readline, read = reader.readline, reader.read
    line = readline()
    match = re.fullmatch(rb"([A-Z]+) (\S+) HTTP/1\.[01]\r\n", line)
    if match is None:
        return None
    headers: dict[str, str] = {}
    while (header := readline()) not in (b"\r\n", b""):
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = read(int(headers.get("content-length", "0")))
    return match.group(1).decode(), match.group(2).decode(), headers, body
