"""A private adb server (the real Debian ``adb``) on its own port, owned by its pid."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


class PrivateAdbServer:
    """``adb -P PORT nodaemon server`` started in the foreground, so its pid is ours to stop.

    Its HOME is a temp dir: the adb key it generates stays out of the user's ~/.android.
    """

    def __init__(self, home: Path) -> None:
        adb = shutil.which("adb")
        if adb is None:
            raise RuntimeError("the adb client is not installed (Debian package 'adb')")
        self.adb_path = adb
        self.home = home
        self.port = free_port()
        self.log = home / "adb-server.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        """What a client needs to talk to this server."""
        return {"ANDROID_ADB_SERVER_PORT": str(self.port)}

    def start(self, timeout: float = 10.0) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [self.adb_path, "-P", str(self.port), "nodaemon", "server"],
                env={**os.environ, "HOME": str(self.home), **self.env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while not port_open(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"adb server on port {self.port} did not start:\n{self.log.read_text()}"
                )
            time.sleep(0.05)

    def adb(self, *args: str, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
        """Run the adb client against this server (for tests and fixture set-up)."""
        return subprocess.run(
            [self.adb_path, "-P", str(self.port), *args],
            env={**os.environ, **self.env},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def stop(self) -> None:
        """Stop the server by its pid (never by name: other adb servers may be running)."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
