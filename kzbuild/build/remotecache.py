"""A build cache shared between machines, on existing engines: a redis server or a WebDAV (HTTP
PUT/GET) server.

Two layers share one store:

- **ccache's own remote storage**: kzbuild hands the store to ccache (``CCACHE_REMOTE_STORAGE``)
  for the compile step, so every object file one machine compiles is a hit on the others.
- **artifacts by build id**: after a build, its files go to ``objects/<sha256>`` (once per
  content) and its manifest to ``artifacts/<build-id>.json``; before building, a machine
  fetches the manifest of its build id and every file, and checks each against the manifest's
  sha256 and size before anything is used. A mismatch refuses the whole artifact (an error in
  the log) and the build runs locally; that build's push replaces the damaged content.

The store is a cache, never a dependency: one that does not answer within the timeout (2 s)
or fails mid-way is reported as a warning, and the build goes on with the local caches.

Keys: redis ``kz:artifacts/<id>.json`` and ``kz:objects/<sha256>`` (ccache's own are
``ccache:<hash>``); HTTP ``<url>/kz/artifacts/<id>.json``, ``<url>/kz/objects/<sha256>``
and ccache under ``<url>/ccache/``.

Configuration: ``KZ_REMOTE_CACHE=URL``, else the project's ``.kz/config.yaml``::

    remote-cache:
      url: redis://:PASSWORD@cache.lan:6379/0   # or http://cache.lan:8080/kz-cache
      artifacts: true    # pull/push artifacts (default true)
      ccache: true       # ccache's remote storage (default true)
      timeout: 2         # seconds without an answer before the cache counts as down
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import socket
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Protocol, TypeVar

from kzbuild.adapters import proc, yamlconf
from kzbuild.adapters.filelock import locked
from kzbuild.adapters.files import write_atomic
from kzbuild.adapters.settings import Settings
from kzbuild.build.artifacts import publish, recorded_manifests, staged
from kzbuild.errors import ConfigError
from kzbuild.model.artifact import Artifact, ArtifactFile, parse_files
from kzbuild.model.build import BuildPlan
from kzbuild.model.remotecache import (
    DEFAULT_TIMEOUT,
    ArtifactCounts,
    CacheStats,
    CcacheCounts,
    RemoteConfig,
    RemoteOutcome,
    RemoteUsage,
)
from kzbuild.model.urls import basic_auth, redact, remember_secrets, split_credentials

log = logging.getLogger(__name__)

ENV = "KZ_REMOTE_CACHE"
CONFIG = Path(".kz") / "config.yaml"  # in the project (git-ignored: it may hold a password)
MAX_TIMEOUT = 60.0
MAX_MANIFEST = 16 << 20
LOOKUPS = "artifact-lookups.json"  # in the machine's cache dir
MAX_ARTIFACT = 2 << 30  # bytes of one stored artifact's files: a manifest claiming more is refused
T = TypeVar("T")


# --- configuration -----------------------------------------------------------------------


def load_config(
    settings: Settings, environ: Mapping[str, str], *, disabled: bool = False
) -> RemoteConfig | None:
    """The remote cache to use: none with ``--no-remote-cache``; the URL of ``KZ_REMOTE_CACHE``
    over the file's; the other keys from the project's ``.kz/config.yaml``."""
    if disabled:
        return None
    path = settings.project / CONFIG
    section: yamlconf.Mapping | None = None
    if path.is_file():
        doc = yamlconf.load(path)
        doc.check_keys(["remote-cache"])
        section = doc.get_mapping("remote-cache")
        section.check_keys(
            ["url", "artifacts", "ccache", "timeout"], required=["url"], context="remote-cache"
        )
    env_url = environ.get(ENV, "").strip()
    if not env_url and section is None:
        return None
    if env_url:
        url, source = check_url(env_url, lambda message: ConfigError(message, key=ENV)), ENV
    else:
        assert section is not None
        text = section.get_str("url") or ""
        url, source = (
            check_url(text, lambda message: section.error("url", message)),
            f"{path}:{section.line_of('url')}",
        )
    artifacts = ccache = True
    timeout = DEFAULT_TIMEOUT
    if section is not None:
        artifacts, ccache = _flag(section, "artifacts"), _flag(section, "ccache")
        value = section.get("timeout", DEFAULT_TIMEOUT)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not 0 < value <= MAX_TIMEOUT
        ):
            raise section.error(
                "timeout", f"must be a number of seconds above 0 and at most {MAX_TIMEOUT:.0f}"
            )
        timeout = float(value)
    return RemoteConfig(url=url, source=source, artifacts=artifacts, ccache=ccache, timeout=timeout)


def _flag(section: yamlconf.Mapping, key: str) -> bool:
    value = section.get(key, True)
    if not isinstance(value, bool):
        raise section.error(key, "must be true or false")
    return value


def check_url(text: str, error: _ErrorFactory) -> str:
    """A store URL kzbuild and ccache can both use; ``error`` makes the ConfigError naming where it
    was set."""
    remember_secrets(text)  # before anything shows it: a password holding a space splits the URL
    shown = redact(text)
    if any(c.isspace() or ord(c) < 32 for c in text):
        # not shown: a password holding a space splits the URL where redaction looks for it
        raise error("the URL holds whitespace or a control character")
    try:
        parts = urllib.parse.urlsplit(text)
        _ = parts.port  # a port that is not a number raises here
    except ValueError as exc:
        raise error(f"'{shown}' is not a URL: {exc}") from None
    if parts.scheme not in ("redis", "http", "https"):
        raise error(f"'{shown}': the scheme must be redis://, http:// or https://")
    if not parts.hostname:
        raise error(f"'{shown}' names no host")
    if parts.query or parts.fragment or "|" in text:
        raise error(
            f"'{shown}' must not have a query, a fragment or ccache attributes ('|'); kzbuild adds "
            "its own"
        )
    if parts.scheme == "redis" and parts.path not in ("", "/") and not parts.path[1:].isdigit():
        raise error(f"'{shown}': a redis URL's path is the database number (redis://HOST:PORT/0)")
    return text


class _ErrorFactory(Protocol):
    def __call__(self, message: str) -> ConfigError: ...


# --- stores ------------------------------------------------------------------------------


class StoreError(Exception):
    """The store failed to answer (down, slow, refused, a protocol error, past a bound): the caller
    falls back to local."""


class _TooBig(StoreError):
    """A reply longer than the caller's limit, left unread."""


TIMED_OUT = "no answer within the timeout"
MAX_LINE = 64 << 10  # bytes in a RESP line, an HTTP status or header line
MAX_HEADERS = 100
MAX_DEPTH = 4  # arrays in arrays of a redis reply (kzbuild's commands answer flat ones)
MAX_ITEMS = 1 << 16  # elements of one redis array
MAX_REPLY = MAX_MANIFEST  # a reply with no limit of its own (PING, INFO, an error page)
MAX_REDIRECTS = 4
# bytes a second a store must move: each transfer adds its size / MIN_RATE to the deadline
MIN_RATE = 4 << 20
CHUNK = 1 << 16
REDIRECTS = (301, 302, 303, 307, 308)


class Clock:
    """The deadline of one exchange with a store: every connect, send and receive waits at most
    what is left of it, so a server that drips its answer cannot stretch the exchange."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def restart(self, seconds: float) -> None:
        self.seconds, self.end = seconds, time.monotonic() + seconds

    def extend(self, seconds: float) -> None:
        self.seconds += seconds
        self.end += seconds

    def left(self) -> float:
        left = self.end - time.monotonic()
        if left <= 0:
            raise StoreError(
                f"no complete answer within the timeout ({self.seconds:.1f} s for the exchange)"
            )
        return left


class _Wire:
    """One connection, read and written in bounded pieces before the clock's deadline."""

    def __init__(self, sock: socket.socket, clock: Clock) -> None:
        self.sock = sock
        self.clock = clock
        self.buffer = bytearray()

    @classmethod
    def connect(cls, host: str, port: int, clock: Clock, *, tls: bool = False) -> _Wire:
        try:
            sock = socket.create_connection((host, port), timeout=clock.left())
        except TimeoutError:
            raise StoreError(TIMED_OUT) from None
        except (OSError, ValueError) as exc:  # refused, unreachable; a host IDNA cannot encode
            raise StoreError(f"cannot connect: {getattr(exc, 'strerror', None) or exc}") from None
        if tls:
            import ssl  # only an https store needs it (start-up time)

            try:
                sock.settimeout(clock.left())
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
            except (OSError, ValueError) as exc:
                sock.close()
                raise StoreError(f"TLS failed: {exc}") from None
        return cls(sock, clock)

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            self._wait()
            view = view[self.sock.send(view[:CHUNK]) :]

    def line(self) -> bytes:
        """The next line, with its end; longer than MAX_LINE: refused."""
        start = 0
        while (end := self.buffer.find(b"\n", start)) < 0:
            if len(self.buffer) > MAX_LINE:
                raise StoreError(f"a reply line longer than {MAX_LINE} bytes")
            start = len(self.buffer)
            self._fill()
        return self._take(end + 1)

    def exact(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self._fill()
        return self._take(size)

    def rest(self, limit: int) -> bytes:
        """Everything up to the end of the connection, at most ``limit`` bytes."""
        while self._fill(eof_ok=True):
            if len(self.buffer) > limit:
                raise _TooBig(f"is more than the {limit} bytes expected")
        return self._take(len(self.buffer))

    def close(self) -> None:
        self.sock.close()

    def _take(self, size: int) -> bytes:
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    def _wait(self) -> None:
        self.sock.settimeout(self.clock.left())

    def _fill(self, *, eof_ok: bool = False) -> bool:
        self._wait()
        chunk = self.sock.recv(CHUNK)
        if not chunk:
            if eof_ok:
                return False
            raise StoreError("the connection closed mid-reply")
        self.buffer += chunk
        return True


def _guarded(what: str, action: Callable[[], T]) -> T:
    """``action``, with every failure of the network or of a server's answer as a StoreError."""
    try:
        return action()
    except StoreError:
        raise
    except TimeoutError:
        raise StoreError(TIMED_OUT) from None
    except (OSError, ValueError, UnicodeError) as exc:  # resets, a number that is not one
        raise StoreError(f"{what}: {exc}") from None


class Store(Protocol):
    clock: Clock

    def ping(self) -> None: ...
    def get(self, key: str, limit: int) -> bytes | None: ...
    def put(self, key: str, data: bytes) -> None: ...
    def exists(self, key: str) -> bool: ...
    def usage(self) -> RemoteUsage: ...
    def close(self) -> None: ...


class RedisStore:
    """A minimal RESP2 client over one socket: AUTH, SELECT, PING, GET, SET, EXISTS, INFO, DBSIZE.
    Replies are bounded: line length, nesting depth, array length, string size."""

    PREFIX = "kz:"

    def __init__(self, url: str, timeout: float, clock: Clock | None = None) -> None:
        parts = urllib.parse.urlsplit(url)
        self.clock = clock or Clock(timeout)
        port = _guarded("the URL's port", lambda: parts.port) or 6379
        self.wire = _Wire.connect(parts.hostname or "", port, self.clock)
        try:
            _, credentials = split_credentials(url)
            if credentials is not None and any(credentials):
                user, password = credentials
                self.call("AUTH", *([user] if user else []), password)
            if parts.path not in ("", "/"):
                self.call("SELECT", parts.path[1:])
        except StoreError:
            self.close()
            raise

    def call(self, *args: str | bytes, limit: int = MAX_REPLY) -> object:
        """Send one command and read its reply; a string reply longer than ``limit`` is refused
        unread."""
        out = [f"*{len(args)}\r\n".encode()]
        for arg in args:
            data = arg.encode() if isinstance(arg, str) else arg
            out += [f"${len(data)}\r\n".encode(), data, b"\r\n"]
        return _guarded("connection failed", lambda: self._exchange(b"".join(out), limit))

    def _exchange(self, request: bytes, limit: int) -> object:
        self.wire.send(request)
        return self._reply(limit, 0)

    def _reply(self, limit: int, depth: int) -> object:
        line = self.wire.line()
        if not line.endswith(b"\r\n"):
            raise StoreError(f"not a redis reply: {line[:40]!r}")
        kind, body = line[:1], line[1:-2]
        if kind == b"+":
            return body.decode(errors="replace")
        if kind == b"-":
            raise StoreError(f"redis refused: {body.decode(errors='replace')}")
        if kind == b":":
            return _number(body)
        if kind == b"$":
            size = _number(body)
            if size < 0:
                return None
            if size > limit:  # the connection is left mid-reply: the caller stops using the store
                raise _TooBig(f"is {size} bytes, more than the {limit} expected")
            data = self.wire.exact(size + 2)
            return data[:-2]
        if kind == b"*":
            count = _number(body)
            if depth >= MAX_DEPTH or count > MAX_ITEMS:
                raise StoreError(
                    f"a reply nested deeper than {MAX_DEPTH} or longer than {MAX_ITEMS} items"
                )
            return [self._reply(MAX_REPLY, depth + 1) for _ in range(max(count, 0))]
        raise StoreError(f"not a redis reply: {line[:40]!r}")

    def ping(self) -> None:
        if self.call("PING") != "PONG":
            raise StoreError("PING was not answered with PONG")

    def get(self, key: str, limit: int) -> bytes | None:
        try:
            value = self.call(
                "GET", self.PREFIX + key, limit=limit
            )  # a value bigger than expected is never read
        except _TooBig as exc:
            raise StoreError(f"{key} {exc}") from None
        if value is not None and not isinstance(value, bytes):
            raise StoreError(f"GET {key} did not answer a string")
        return value

    def put(self, key: str, data: bytes) -> None:
        self.call("SET", self.PREFIX + key, data)

    def exists(self, key: str) -> bool:
        return self.call("EXISTS", self.PREFIX + key) == 1

    def usage(self) -> RemoteUsage:
        info = self.call("INFO")
        text = info.decode(errors="replace") if isinstance(info, bytes) else ""
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        entries = self.call("DBSIZE")

        def number(key: str) -> int | None:
            value = fields.get(key, "").strip()
            return int(value) if value.isdigit() and len(value) < 20 else None

        return RemoteUsage(
            size_bytes=number("used_memory"),
            entries=entries if isinstance(entries, int) else None,
            server_hits=number("keyspace_hits"),
            server_misses=number("keyspace_misses"),
        )

    def close(self) -> None:
        self.wire.close()


def _number(text: bytes) -> int:
    """A RESP length or integer: at most 19 digits, so no number is too large for a size."""
    digits = text[1:] if text[:1] == b"-" else text
    if not digits.isdigit() or len(digits) > 19:
        raise StoreError(f"not a redis number: {text[:40]!r}")
    return int(text)


@dataclass(frozen=True)
class _Answer:
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes | None


class HttpStore:
    """Plain HTTP GET/PUT/HEAD against a WebDAV server (nginx's dav module: PUT with
    create_full_put_path), one connection a request. A redirect is followed for GET and HEAD,
    without the credentials when it names another host, scheme or port; the whole exchange,
    redirects included, has one deadline."""

    def __init__(self, url: str, timeout: float, clock: Clock | None = None) -> None:
        clean, credentials = split_credentials(url)
        self.base = clean.rstrip("/") + "/kz/"
        self.headers: dict[str, str] = {}
        if credentials is not None and any(credentials):
            self.headers["Authorization"] = basic_auth(*credentials)
        self.clock = clock or Clock(timeout)

    def _request(
        self, method: str, key: str, data: bytes | None = None, limit: int | None = None
    ) -> bytes | None:
        url, headers = self.base + key, dict(self.headers)
        for _ in range(MAX_REDIRECTS + 1):
            once = partial(self._once, method, url, headers, data, limit)
            answer = _guarded(f"{method} {key}", once)
            location = answer.headers.get("location")
            if answer.status not in REDIRECTS or location is None:
                break
            if method not in ("GET", "HEAD"):
                raise StoreError(
                    f"{method} {key}: redirected (HTTP {answer.status}); a store must take it "
                    "where it is asked"
                )
            target = urllib.parse.urljoin(url, location)
            if _origin(target) != _origin(url):
                headers.pop("Authorization", None)  # the credentials are for the configured host
            url = target
        else:
            raise StoreError(f"{method} {key}: more than {MAX_REDIRECTS} redirects")
        if answer.status == 404 and method in ("GET", "HEAD"):
            return None
        if not 200 <= answer.status < 300:
            raise StoreError(f"{method} {key}: HTTP {answer.status} {answer.reason}")
        return answer.body if limit is not None else b""

    def ping(self) -> None:
        self._request("HEAD", "ping")  # any answer (404 included) shows the server is there

    def get(self, key: str, limit: int) -> bytes | None:
        try:
            return self._request("GET", key, limit=limit)
        except _TooBig as exc:
            raise StoreError(f"{key} {exc}") from None

    def put(self, key: str, data: bytes) -> None:
        self._request("PUT", key, data=data)

    def exists(self, key: str) -> bool:
        return self._request("HEAD", key) is not None

    def usage(self) -> RemoteUsage:
        return RemoteUsage(
            problem="a WebDAV store without PROPFIND lists nothing: its size is not known here"
        )

    def close(self) -> None:
        pass

    def _once(
        self, method: str, url: str, headers: dict[str, str], data: bytes | None, limit: int | None
    ) -> _Answer:
        """One request on its own connection, and its answer (a body only for a 2xx GET)."""
        parts = urllib.parse.urlsplit(url)
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        plain = target.isascii() and target.isprintable() and " " not in target
        if parts.scheme not in ("http", "https") or not plain:
            raise StoreError(f"{method}: not a URL this store can ask: {url[:80]!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        wire = _Wire.connect(parts.hostname or "", port, self.clock, tls=tls)
        try:
            host = parts.netloc.rpartition("@")[2]
            lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Connection: close"]
            lines += [f"{name}: {value}" for name, value in headers.items()]
            if data is not None:
                lines.append(f"Content-Length: {len(data)}")
            wire.send(("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + (data or b""))
            status, reason = _status_line(wire.line())
            fields = _header_lines(wire)
            wanted = limit is not None and method == "GET" and 200 <= status < 300
            body = _body(wire, fields, limit) if wanted and limit is not None else None
            return _Answer(status, reason, fields, body)
        finally:
            wire.close()


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port


def _status_line(line: bytes) -> tuple[int, str]:
    match = re.fullmatch(rb"HTTP/1\.[01] ([1-5][0-9][0-9])(?: ([^\r\n]*))?\r?\n", line)
    if match is None:
        raise StoreError(f"not an HTTP answer: {line[:40]!r}")
    return int(match.group(1)), (match.group(2) or b"").decode("latin-1")


def _header_lines(wire: _Wire) -> dict[str, str]:
    fields: dict[str, str] = {}
    for _ in range(MAX_HEADERS + 1):
        line = wire.line()
        if line in (b"\r\n", b"\n"):
            return fields
        name, colon, value = line.decode("latin-1").partition(":")
        if not colon:
            raise StoreError(f"not an HTTP header: {line[:40]!r}")
        fields[name.strip().lower()] = value.strip()
    raise StoreError(f"more than {MAX_HEADERS} header lines")


def _body(wire: _Wire, fields: dict[str, str], limit: int) -> bytes:
    """The body, refused unread when its announced size is past ``limit``."""
    if "chunked" in fields.get("transfer-encoding", "").lower():
        return _chunked(wire, limit)
    length = fields.get("content-length")
    if length is None:
        return wire.rest(limit)
    if not length.isdigit() or len(length) > 19:
        raise StoreError(f"a Content-Length that is not a size: {length[:40]!r}")
    if int(length) > limit:
        raise _TooBig(f"is {int(length)} bytes, more than the {limit} expected")
    return wire.exact(int(length))


def _chunked(wire: _Wire, limit: int) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        text = wire.line().split(b";")[0].strip()
        if not re.fullmatch(rb"[0-9a-fA-F]{1,15}", text):
            raise StoreError(f"not a chunk size: {text[:40]!r}")
        if not (size := int(text, 16)):
            break
        total += size
        if total > limit:
            raise _TooBig(f"is more than the {limit} bytes expected")
        parts.append(wire.exact(size))
        wire.exact(2)
    while wire.line() not in (b"\r\n", b"\n"):  # trailer fields
        pass
    return b"".join(parts)


def open_store(config: RemoteConfig, clock: Clock | None = None) -> Store:
    kind = RedisStore if config.kind == "redis" else HttpStore
    return kind(config.url, config.timeout, clock)


# --- one build's use of the cache --------------------------------------------------------


class ArtifactRefused(Exception):
    """A stored artifact does not match its manifest (or its build id): it is never used."""


@dataclass
class RemoteCache:
    """The store as one build uses it: probed once, then pull, the compile's ccache settings, push.

    Every failure becomes a warning and the cache is off for the rest of the build."""

    config: RemoteConfig
    store: Store | None
    problems: list[str]
    spent: float = 0.0
    pulled: bool = False
    pushed: bool = False
    refused: str | None = None
    uploaded: int = 0
    downloaded: int = 0
    damaged: set[str] = field(
        default_factory=set
    )  # contents the store held wrong: the push replaces them
    allowance: float = DEFAULT_TIMEOUT  # seconds this build may spend with the store (see _begin)

    @classmethod
    def open(cls, config: RemoteConfig) -> RemoteCache:
        started = time.monotonic()
        cache = cls(config, None, [], allowance=config.timeout)
        try:
            store = open_store(config, Clock(config.timeout))
            store.ping()
            cache.store = store
        except StoreError as exc:
            cache._down(exc)
        cache.spent = time.monotonic() - started
        return cache

    def _begin(self, store: Store) -> None:
        """One deadline for all of this build's exchanges with the store: the timeout, plus the
        time each transfer's size needs at MIN_RATE; the time spent so far is taken from it."""
        store.clock.restart(max(self.allowance - self.spent, 1e-3))

    def _allow(self, store: Store, size: int) -> None:
        self.allowance += size / MIN_RATE
        store.clock.extend(size / MIN_RATE)

    def _down(self, exc: StoreError) -> None:
        message = f"remote cache {self.config.shown}: {exc}; building with the local caches only"
        log.warning("%s", message)
        self.problems.append(message)
        if self.store is not None:
            self.store.close()
        self.store = None

    def ccache_env(self) -> dict[str, str]:
        """ccache's remote storage for the compile step (nothing when the store is down or ccache is
        off)."""
        if self.store is None or not self.config.ccache:
            return {}
        if self.config.url.startswith("https://"):
            message = (
                f"remote cache {self.config.shown}: ccache's HTTP storage speaks no https; "
                "compiles use the local ccache only"
            )
            log.warning("%s", message)
            self.problems.append(message)
            return {}
        return {"CCACHE_REMOTE_STORAGE": ccache_url(self.config)}

    def pull(self, plan: BuildPlan) -> Artifact | None:
        """The artifact of the plan's build id from the store, verified, in place; None when absent,
        refused or down."""
        if self.store is None or not self.config.artifacts:
            return None
        started = time.monotonic()
        try:
            self._begin(self.store)
            return self._pull(self.store, plan)
        except StoreError as exc:
            self._down(exc)
        except (
            ArtifactRefused,
            ConfigError,
            OSError,
        ) as exc:  # OSError: files the manifest lays out impossibly (or a full disk)
            self.refused = str(exc)
            log.error(
                "refusing the artifact %s from the remote cache %s: %s; building locally",
                plan.build_id,
                self.config.shown,
                exc,
            )
        finally:
            self.spent += time.monotonic() - started
        return None

    def _pull(self, store: Store, plan: BuildPlan) -> Artifact | None:
        raw = store.get(f"artifacts/{plan.build_id}.json", MAX_MANIFEST)
        if raw is None:
            return None
        files = check_manifest(raw, plan)
        self._allow(store, sum(entry.size for entry in files))
        with staged(plan.artifact_dir.parent, plan.build_id) as staging:
            for entry in files:
                data = store.get(f"objects/{entry.sha256}", entry.size)
                if data is None:
                    raise ArtifactRefused(
                        f"the store lacks the content of {entry.path} (sha256 {entry.sha256})"
                    )
                found = hashlib.sha256(data).hexdigest()
                if found != entry.sha256 or len(data) != entry.size:
                    self.damaged.add(entry.sha256)
                    raise ArtifactRefused(
                        f"{entry.path}: sha256 {found} ({len(data)} bytes), the manifest says "
                        f"{entry.sha256} ({entry.size} bytes)"
                    )
                self.downloaded += len(data)
                target = staging / entry.path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                target.chmod(entry.mode)
            self.downloaded += len(raw)
            artifact = publish(staging, raw, plan.artifact_dir.parent, plan.build_id)
        self.pulled = True
        return artifact

    def push(self, artifact: Artifact) -> None:
        """Store the artifact: each content the store lacks (or held damaged), then the manifest,
        last."""
        if self.store is None or not self.config.artifacts:
            return
        started = time.monotonic()
        try:
            self._begin(self.store)
            self._allow(self.store, sum(entry.size for entry in artifact.files))
            for entry in artifact.files:
                key = f"objects/{entry.sha256}"
                if entry.sha256 in self.damaged or not self.store.exists(key):
                    data = artifact.local(entry.path).read_bytes()
                    self.store.put(key, data)
                    self.uploaded += len(data)
            manifest = artifact.manifest_path.read_bytes()
            self.store.put(f"artifacts/{artifact.build_id}.json", manifest)
            self.uploaded += len(manifest)
            self.pushed = True
        except StoreError as exc:
            self._down(exc)
        finally:
            self.spent += time.monotonic() - started

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    def outcome(self) -> RemoteOutcome:
        return RemoteOutcome(
            store=self.config.shown,
            available=not self.problems or self.pulled or self.pushed,
            pulled=self.pulled,
            pushed=self.pushed,
            uploaded_bytes=self.uploaded,
            downloaded_bytes=self.downloaded,
            refused=self.refused,
            problems=tuple(self.problems),
            seconds=self.spent,
        )


def check_manifest(raw: bytes, plan: BuildPlan) -> tuple[ArtifactFile, ...]:
    """The files of a stored manifest, which must be the one of the plan's build id: same id, same
    inputs."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ArtifactRefused(f"its manifest is not UTF-8 JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("build_id") != plan.build_id:
        raise ArtifactRefused("its manifest is not the one of this build id")
    if _canonical(doc.get("inputs")) != _canonical(plan.inputs):
        raise ArtifactRefused("its manifest's inputs are not the ones this build id is the hash of")
    try:
        files = parse_files(doc.get("files"))
    except ValueError as exc:
        raise ArtifactRefused(f"its manifest: {exc}") from None
    total = sum(entry.size for entry in files)
    if total > MAX_ARTIFACT:  # before anything is fetched
        raise ArtifactRefused(
            f"its manifest claims {total} bytes of files, more than the {MAX_ARTIFACT} an "
            "artifact may hold"
        )
    return files


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def ccache_url(config: RemoteConfig) -> str:
    """The store as ccache's remote_storage: redis as is (a password with no user is ccache's
    ``PASSWORD@``), HTTP under ``/ccache``; kzbuild's timeouts as ccache's attributes."""
    parts = urllib.parse.urlsplit(config.url)
    if config.kind == "redis":
        url = config.url
        if (
            parts.username == "" and parts.password is not None
        ):  # redis://:PASSWORD@ -> redis://PASSWORD@
            url = config.url.replace("://:", "://", 1)
    else:
        url = urllib.parse.urlunsplit(
            (parts.scheme, parts.netloc, parts.path.rstrip("/") + "/ccache", "", "")
        )
    ms = int(config.timeout * 1000)
    return f"{url}|connect-timeout={ms}|operation-timeout={ms}"


# --- statistics --------------------------------------------------------------------------


def count_lookup(cache_dir: Path, how: str) -> None:
    """Count one build's way to its artifact (local, pulled, built) for ``kzbuild cache stats``."""
    path = cache_dir / LOOKUPS
    with locked(cache_dir / "locks" / f"{LOOKUPS}.lock", what="the artifact lookup counters"):
        counts = read_lookups(cache_dir).to_dict()
        counts[how] = int(str(counts.get(how, 0))) + 1
        # statistics, not results: a crash may lose a count, so no fsync on every no-op build
        write_atomic(
            path,
            json.dumps({key: counts[key] for key in ("local", "pulled", "built")}).encode(),
            durable=False,
        )


def read_lookups(cache_dir: Path) -> ArtifactCounts:
    try:
        doc = json.loads((cache_dir / LOOKUPS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return ArtifactCounts()
    if not isinstance(doc, dict):
        return ArtifactCounts()

    def number(key: str) -> int:
        value = doc.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

    return ArtifactCounts(local=number("local"), pulled=number("pulled"), built=number("built"))


def ccache_counts(ccache_dir: Path) -> CcacheCounts | None:
    """ccache's own counters for ``ccache_dir`` (None when ccache is missing or has never run
    there)."""
    if not ccache_dir.is_dir():
        return None
    result = proc.run(["ccache", "--print-stats"], env={"CCACHE_DIR": str(ccache_dir)}, check=False)
    if not result.ok:
        return None
    fields: dict[str, int] = {}
    for line in result.stdout.splitlines():
        name, _, value = line.partition("\t")
        if value.strip().isdigit():
            fields[name] = int(value)
    return CcacheCounts(
        size_bytes=fields.get("cache_size_kibibyte", 0) * 1024,
        files=fields.get("files_in_cache", 0),
        local_hits=fields.get("local_storage_hit", 0),
        remote_hits=fields.get("remote_storage_hit", 0),
        misses=fields.get("cache_miss", 0),
        remote_errors=fields.get("remote_storage_error", 0)
        + fields.get("remote_storage_timeout", 0),
    )


def cache_stats(settings: Settings, config: RemoteConfig | None) -> CacheStats:
    """Local sizes and hit rates (ccache's counters, the artifacts dir, the lookup counters) and the
    remote store's own figures."""
    count = size = 0
    for manifest, _ in recorded_manifests(settings.artifacts):
        count += 1
        size += sum(p.stat().st_size for p in manifest.parent.rglob("*") if p.is_file())
    usage = None
    if config is not None:
        try:
            store = open_store(config)
            try:
                usage = store.usage()
            finally:
                store.close()
        except StoreError as exc:
            usage = RemoteUsage(problem=str(exc))
    ccache_dir = settings.ccache
    return CacheStats(
        ccache_dir=str(ccache_dir),
        ccache=ccache_counts(ccache_dir),
        artifacts_dir=str(settings.artifacts),
        artifact_count=count,
        artifact_bytes=size,
        artifact_counts=read_lookups(settings.cache),
        remote=config,
        remote_usage=usage,
    )
