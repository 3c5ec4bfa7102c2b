"""Real cache servers on 127.0.0.1 for the remote-cache tests: redis-server and nginx with its dav
module.

Each is started once per session (per xdist worker) on a free port with its own config and
data in a temp dir, as the current user, and stopped by its pid. Function-scoped wrappers
empty the store before each test. ``silent_server`` accepts connections and never answers
(a hung cache); ``closed_port`` is a port nothing listens on (a cache that is down).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.fixtures_ssh import free_port

REDIS = shutil.which("redis-server") or "/usr/bin/redis-server"
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
REDIS_PASSWORD = "pw-Zq81-never-logged"
DAV_USER, DAV_PASSWORD = "kz", "dav-pw-4k9-never-logged"


def wait_listening(process: subprocess.Popen[bytes], port: int, log: Path, what: str) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited: {log.read_text(errors='replace')}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not start listening on {port}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        process.wait(timeout=10)


@dataclass
class RedisServer:
    port: int
    password: str
    process: subprocess.Popen[bytes]

    def url(self, password: str | None = None) -> str:
        return f"redis://:{password or self.password}@127.0.0.1:{self.port}"

    def call(self, *args: str | bytes) -> bytes | int | None | list[object] | str:
        """One command through kzbuild's own client (what the tests check is the server's state)."""
        from kzbuild.build.remotecache import RedisStore

        store = RedisStore(self.url(), 5.0)
        try:
            return store.call(*args)  # type: ignore[return-value]
        finally:
            store.close()

    def keys(self, pattern: str = "*") -> list[str]:
        found = self.call("KEYS", pattern)
        assert isinstance(found, list)
        return sorted(k.decode() for k in found if isinstance(k, bytes))


@pytest.fixture(scope="session")
def redis_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if not Path(REDIS).exists():
        pytest.skip("redis-server is not installed here (scripts/setup installs it)")
    workdir = tmp_path_factory.mktemp("redis")
    port = free_port()
    log = workdir / "redis.log"
    process = subprocess.Popen(
        [
            REDIS,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--requirepass",
            REDIS_PASSWORD,
            "--dir",
            str(workdir),
            "--logfile",
            str(log),
            "--daemonize",
            "no",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_listening(process, port, log, "redis-server")
    yield RedisServer(port, REDIS_PASSWORD, process)
    stop(process)


@pytest.fixture
def redis_cache(redis_session: RedisServer) -> RedisServer:
    redis_session.call("FLUSHALL")
    redis_session.call("CONFIG", "RESETSTAT")
    return redis_session


NGINX_CONF = """\
daemon off;
master_process on;
worker_processes 1;
{user}
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log {dir}/access.log;
    client_body_temp_path {dir}/tmp/body;
    proxy_temp_path {dir}/tmp/proxy;
    fastcgi_temp_path {dir}/tmp/fastcgi;
    uwsgi_temp_path {dir}/tmp/uwsgi;
    scgi_temp_path {dir}/tmp/scgi;
    client_max_body_size 0;
    server {{
        listen 127.0.0.1:{port};
        root {dir}/data;
        location / {{
            dav_methods PUT DELETE MKCOL;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
        }}
        location /private/ {{
            auth_basic "kz cache";
            auth_basic_user_file {dir}/htpasswd;
            dav_methods PUT DELETE MKCOL;
            create_full_put_path on;
        }}
    }}
}}
"""


@dataclass
class DavServer:
    port: int
    workdir: Path
    process: subprocess.Popen[bytes]

    @property
    def data(self) -> Path:
        return self.workdir / "data"

    @property
    def access_log(self) -> Path:
        return self.workdir / "access.log"

    def url(self, userinfo: str = "") -> str:
        """The open store; with ``userinfo`` (``USER:PASSWORD``) the one behind basic auth
        (DAV_USER, DAV_PASSWORD)."""
        return (
            f"http://{userinfo}@127.0.0.1:{self.port}/private/cache"
            if userinfo
            else f"http://127.0.0.1:{self.port}/cache"
        )

    def stored(self) -> list[str]:
        return sorted(
            p.relative_to(self.data).as_posix() for p in self.data.rglob("*") if p.is_file()
        )


@pytest.fixture(scope="session")
def dav_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DavServer]:
    if not Path(NGINX).exists():
        pytest.skip("nginx is not installed here (scripts/setup installs it)")
    workdir = tmp_path_factory.mktemp("nginx")
    (workdir / "tmp").mkdir()
    (workdir / "data").mkdir()
    port = free_port()
    # as root, nginx's workers would run as nobody, who cannot write the temp dirs
    user = "user root root;" if os.geteuid() == 0 else ""
    (workdir / "nginx.conf").write_text(NGINX_CONF.format(dir=workdir, port=port, user=user))
    (workdir / "htpasswd").write_text(
        f"{DAV_USER}:{{PLAIN}}{DAV_PASSWORD}\n"
    )  # nginx reads {PLAIN} passwords
    log = workdir / "error.log"
    process = subprocess.Popen(
        [NGINX, "-p", str(workdir), "-c", str(workdir / "nginx.conf"), "-e", str(log)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_listening(process, port, log, "nginx")
    yield DavServer(port, workdir, process)
    stop(process)


@pytest.fixture
def dav_cache(dav_session: DavServer) -> DavServer:
    shutil.rmtree(dav_session.data)
    dav_session.data.mkdir()
    dav_session.access_log.write_text("")  # nginx appends; the file stays open
    return dav_session


class SilentServer:
    """Accepts every connection and never sends a byte: a cache that hangs."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.held: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        self.listener.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def silent_server() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


@pytest.fixture
def closed_port() -> int:
    return free_port()
