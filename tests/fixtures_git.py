"""A real git daemon on 127.0.0.1 serving bare copies of synthetic upstreams (sync and roll
tests)."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import UpstreamRepo, git


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def git_daemon(tmp_path):
    """A real git daemon on 127.0.0.1 serving tmp_path/served."""
    base = tmp_path / "served"
    base.mkdir()
    port = free_port()
    daemon = subprocess.Popen(
        [
            "git",
            "daemon",
            "--reuseaddr",
            "--export-all",
            "--listen=127.0.0.1",
            f"--port={port}",
            f"--base-path={base}",
            str(base),
        ],
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    yield base, port
    daemon.terminate()
    daemon.wait(timeout=10)


def serve(upstream: UpstreamRepo, base: Path, *, allow_sha_want: bool) -> Path:
    served = base / "llama.cpp.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(upstream.path), str(served)], check=True)
    git(
        served,
        "config",
        "uploadpack.allowReachableSHA1InWant",
        "true" if allow_sha_want else "false",
    )
    git(served, "config", "uploadpack.allowFilter", "true")
    return served
