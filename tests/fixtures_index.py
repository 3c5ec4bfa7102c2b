"""Package indexes for sdist tests: local PEP 503/691 trees (file://) and the same over HTTP.

Every test that uses ``pip_env`` sees only the pip configuration it sets: no config files
(PIP_CONFIG_FILE=/dev/null) and no PIP_* variables from the machine, so nothing reaches PyPI.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT


@pytest.fixture
def pip_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith("PIP_") or name.lower() in (
            "http_proxy",
            "https_proxy",
            "all_proxy",
            "no_proxy",
            "netrc",
        ):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    return monkeypatch


def fake_sdist(
    name: str, version: str, *, vendored_git: Path | None = None, payload: str = ""
) -> bytes:
    """A small .tar.gz sdist; with ``vendored_git``, that bare repo under
    .git/modules/vendor/llama.cpp."""
    top = f"{name}-{version}"
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo(f"{top}/PKG-INFO")
        data = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{payload}".encode()
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
        if vendored_git is not None:
            archive.add(vendored_git, arcname=f"{top}/.git/modules/vendor/llama.cpp")
    return buffer.getvalue()


@dataclass
class Index:
    """A PEP 503 tree: ROOT/simple/PROJECT/index.html (+ index.json, PEP 691) and ROOT/files/."""

    root: Path

    @property
    def url(self) -> str:
        return (self.root / "simple").as_uri()

    def add(
        self,
        project: str,
        files: dict[str, bytes],
        *,
        sha256: dict[str, str] | None = None,
        hashes: bool = True,
    ) -> None:
        """Publish ``files`` for ``project``; ``sha256`` overrides the hash the pages give for a
        file."""
        (self.root / "files").mkdir(parents=True, exist_ok=True)
        page = self.root / "simple" / project
        page.mkdir(parents=True, exist_ok=True)
        anchors, entries = [], []
        for filename, data in files.items():
            (self.root / "files" / filename).write_bytes(data)
            digest = (sha256 or {}).get(filename, hashlib.sha256(data).hexdigest())
            fragment = "#sha256=" + digest if hashes else ""
            anchors.append(f'<a href="../../files/{filename}{fragment}">{filename}</a><br/>')
            entries.append(
                {
                    "filename": filename,
                    "url": f"../../files/{filename}",
                    "hashes": {"sha256": digest} if hashes else {},
                }
            )
        (page / "index.html").write_text(
            "<!DOCTYPE html><html><body>\n" + "\n".join(anchors) + "\n</body></html>\n"
        )
        (page / "index.json").write_text(
            json.dumps({"meta": {"api-version": "1.1"}, "name": project, "files": entries})
        )


@pytest.fixture
def make_index(tmp_path: Path) -> Callable[[str], Index]:
    def make(name: str) -> Index:
        return Index(tmp_path / name)

    return make


@dataclass
class Served:
    base: str  # http(s)://127.0.0.1:PORT
    log: Path

    def requests(self) -> list[str]:
        return self.log.read_text().splitlines()


@pytest.fixture
def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate (and key) for 127.0.0.1, made by openssl."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


@pytest.fixture
def index_server(tmp_path: Path) -> Iterator[Callable[..., Served]]:
    """Serve an Index's root over HTTP on 127.0.0.1 (tests/indexserver.py), optionally behind basic
    auth."""
    started: list[subprocess.Popen[str]] = []

    def start(
        index: Index,
        user: str | None = None,
        password: str | None = None,
        *,
        tls: tuple[Path, Path] | None = None,
    ) -> Served:
        log = tmp_path / f"http-{len(started)}.log"
        argv = [
            sys.executable,
            "-m",
            "tests.indexserver",
            str(index.root),
            *([user, password] if user and password else []),
        ]
        env = {
            **os.environ,
            **({"INDEX_TLS_CERT": str(tls[0]), "INDEX_TLS_KEY": str(tls[1])} if tls else {}),
        }
        server = subprocess.Popen(
            argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=log.open("w"), text=True
        )
        started.append(server)
        assert server.stdout is not None
        port = int(server.stdout.readline())
        return Served(f"{'https' if tls else 'http'}://127.0.0.1:{port}", log)

    yield start
    for server in started:
        server.terminate()
        server.wait(timeout=10)
