"""A real OpenSSH server on 127.0.0.1 for tests, and a TCP relay that can slow or cut a connection.

The server runs ``/usr/sbin/sshd`` with its own config, throwaway host and client keys made
by ssh-keygen, and a free port, as the current user; it is stopped by its pid. As root,
sshd insists on its privilege-separation dir ``/run/sshd`` (Debian's service creates it at
boot); the fixture creates it when missing. Sessions get the server's workdir as HOME so
the user's own shell rc files stay out of the timings.
"""

from __future__ import annotations

import getpass
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

SSHD = "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def keygen(path: Path) -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "kz-test", "-f", str(path)],
        check=True,
    )
    return path


def fingerprint(public_key: Path) -> str:
    """The SHA256:... fingerprint as ssh-keygen prints it."""
    out = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(public_key)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return out.split()[1]


@dataclass
class SshServer:
    workdir: Path
    port: int
    host_key: Path
    client_key: Path
    process: subprocess.Popen[bytes] | None = None
    host: str = "127.0.0.1"

    @property
    def user(self) -> str:
        return getpass.getuser()

    @property
    def host_fingerprint(self) -> str:
        return fingerprint(self.host_key.with_suffix(".pub"))

    def known_hosts_line(self, port: int | None = None) -> str:
        key_type, key_b64 = self.host_key.with_suffix(".pub").read_text().split()[:2]
        return f"[{self.host}]:{port or self.port} {key_type} {key_b64}\n"

    def spec(self, root: Path, port: int | None = None) -> str:
        return f"ssh://{self.user}@{self.host}:{port or self.port}{root}"

    def start(self) -> None:
        if os.geteuid() == 0 and not Path("/run/sshd").is_dir():
            Path("/run/sshd").mkdir(mode=0o755)
        authorized = self.workdir / "authorized_keys"
        shutil.copy(self.client_key.with_suffix(".pub"), authorized)
        config = self.workdir / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    f"ListenAddress {self.host}",
                    f"HostKey {self.host_key}",
                    f"PidFile {self.workdir / 'sshd.pid'}",
                    f"AuthorizedKeysFile {authorized}",
                    "StrictModes no",
                    "UsePAM no",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PermitRootLogin prohibit-password",
                    "Subsystem sftp internal-sftp",
                    "MaxStartups 50",
                    # bash sources ~/.bashrc for ssh commands; this machine's user rc files
                    # (pyenv init) would add ~0.3 s to every command
                    f"SetEnv HOME={self.workdir}",
                    "LogLevel ERROR",
                    "",
                ]
            )
        )
        log = open(self.workdir / "sshd.log", "ab")
        self.process = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=log
        )
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.workdir / 'sshd.log').read_text()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=1) as conn:
                    if conn.recv(8).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("sshd did not start listening")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=10)


def shutdown(*sockets: socket.socket) -> None:
    for sock in sockets:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class Relay:
    """Relays 127.0.0.1:port to a server, optionally at ``rate`` bytes/s each way (a slow link);
    ``cut_after(n)`` drops every connection after n more client bytes, or with ``hold`` stops
    relaying client bytes there (and sets ``held``) until ``cut_now()``: the server then has time
    to hand on what it had buffered, as a stalled cable allows before it is pulled. ``moved``
    counts the bytes relayed (client to server, server to client) since the last
    ``count_from_zero()``."""

    def __init__(self, target_port: int, rate: float | None = None) -> None:
        self.target_port = target_port
        self.rate = rate
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._lock = threading.Lock()
        self._budget: int | None = None
        self._hold = False
        self._sockets: list[socket.socket] = []
        self.moved = [0, 0]
        self.cut = threading.Event()
        self.held = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def count_from_zero(self) -> None:
        with self._lock:
            self.moved = [0, 0]

    def cut_after(self, nbytes: int, *, hold: bool = False) -> None:
        with self._lock:
            self._budget = nbytes
            self._hold = hold

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, counted: bool) -> None:
        started, moved = time.monotonic(), 0
        try:
            while data := source.recv(16384):
                with self._lock:
                    self.moved[0 if counted else 1] += len(data)
                if self.rate:
                    moved += len(data)
                    time.sleep(max(0.0, moved / self.rate - (time.monotonic() - started)))
                if counted:
                    with self._lock:
                        if self._budget is not None:
                            if len(data) >= self._budget:
                                data = data[: self._budget]
                                self._budget = 0
                            else:
                                self._budget -= len(data)
                    if self._budget == 0:
                        sink.sendall(data)
                        if self._hold:
                            self.held.set()
                            self.cut.wait()
                        self.cut_now()
                        return
                sink.sendall(data)
        except OSError:
            pass
        finally:
            shutdown(source, sink)

    def cut_now(self) -> None:
        """Drop every connection, as a pulled cable would."""
        self.cut.set()
        with self._lock:
            shutdown(*self._sockets)

    def close(self) -> None:
        self.listener.close()
        self.cut_now()
        for sock in self._sockets:
            sock.close()


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    if not Path(SSHD).exists() or shutil.which("ssh-keygen") is None:
        pytest.skip("openssh-server is not installed here")
    workdir = tmp_path_factory.mktemp("sshd")
    server = SshServer(
        workdir=workdir,
        port=free_port(),
        host_key=keygen(workdir / "host_ed25519"),
        client_key=keygen(workdir / "client_ed25519"),
    )
    server.start()
    yield server
    server.stop()


@dataclass
class SshHome:
    """A HOME whose ~/.ssh holds the test client key and a known_hosts that trusts the test
    server."""

    path: Path

    @property
    def known_hosts(self) -> Path:
        return self.path / ".ssh" / "known_hosts"


@pytest.fixture
def ssh_home(tmp_path: Path, sshd: SshServer, monkeypatch: pytest.MonkeyPatch) -> SshHome:
    home = tmp_path / "home"
    dot_ssh = home / ".ssh"
    dot_ssh.mkdir(parents=True, mode=0o700)
    shutil.copy(sshd.client_key, dot_ssh / "id_ed25519")
    (dot_ssh / "known_hosts").write_text(sshd.known_hosts_line())
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return SshHome(home)


@pytest.fixture
def relay(sshd: SshServer, ssh_home: SshHome) -> Iterator[Relay]:
    """A relay to the test sshd; ssh_home's known_hosts trusts the server behind the relay's port
    too."""
    proxy = Relay(sshd.port)
    with open(ssh_home.known_hosts, "a") as handle:
        handle.write(sshd.known_hosts_line(proxy.port))
    yield proxy
    proxy.close()
