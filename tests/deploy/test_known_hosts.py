"""known_hosts lines kzbuild cannot use are skipped with a warning; @revoked keys are refused;
against a real sshd."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kzbuild.device.registry import parse_device_spec
from kzbuild.device.ssh import SshTransport, read_known_hosts
from kzbuild.errors import DeviceError
from tests.fixtures_ssh import keygen

GARBAGE = [
    "# a comment",
    "",
    "   ",
    "onefield",
    "two fields",
    "host ssh-ed25519 !!!not-base64!!!",
    "host sk-ssh-ed25519@openssh.com AAAAGnNrLXNzaC1lZDI1NTE5QG9wZW5zc2guY29tAAAAIG==",
    "@cert-authority *.example ssh-ed25519 "
    "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
    "@unknown-marker host ssh-ed25519 "
    "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
    "host ssh-ed25519 AAAA",
    "|1|c2FsdA==|aGFzaA== ssh-ed25519 "
    "AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
]
BINARY = b"\x00\xff\xfe binary \x80\n"


def ssh_device(sshd, root: Path):
    device = parse_device_spec(sshd.spec(root))
    assert device is not None
    return device


@pytest.fixture
def ssh_warnings(caplog: pytest.LogCaptureFixture):
    """Warnings of kzbuild.device.ssh (the CLI's logging setup stops propagation to the root
    logger)."""
    logger = logging.getLogger("kzbuild.device.ssh")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.WARNING, logger="kzbuild.device.ssh")
    yield caplog
    logger.removeHandler(caplog.handler)


def write_known_hosts(path: Path, lines: list[str], *, binary: bool = True) -> None:
    path.write_bytes(("\n".join(lines) + "\n").encode() + (BINARY if binary else b""))


def test_garbage_lines_are_skipped_with_warnings_and_the_good_line_connects(
    sshd, ssh_home, tmp_path, ssh_warnings
):
    good = sshd.known_hosts_line().strip()
    write_known_hosts(ssh_home.known_hosts, [*GARBAGE, good])
    opened = SshTransport(ssh_device(sshd, tmp_path))
    assert opened.run(["true"]).ok
    opened.close()
    warned = [r.getMessage() for r in ssh_warnings.records]
    for number in (
        4,
        5,
        6,
        7,
        8,
        9,
        10,
        11,
        13,
    ):  # 1-based lines of GARBAGE and the binary line after the good one
        assert any(f"{ssh_home.known_hosts}:{number}: skipped" in w for w in warned), (
            number,
            warned,
        )
    assert not any(
        f"{ssh_home.known_hosts}:{number}:" in w for w in warned for number in (1, 2, 3, 12)
    )  # comment, blank lines, the good line


def test_only_garbage_is_an_unknown_host_exit_8_naming_the_host(sshd, ssh_home, tmp_path, kz):
    write_known_hosts(ssh_home.known_hosts, GARBAGE)
    result = kz("deploy", "--artifact", "x", "--device", sshd.spec(tmp_path))
    assert result.code == 8, result.err
    assert "unknown host key" in result.err and "127.0.0.1" in result.err
    assert "Traceback" not in result.err and "internal error" not in result.err


def test_a_hashed_host_line_is_used(sshd, ssh_home, tmp_path):
    key_type, key_b64 = sshd.host_key.with_suffix(".pub").read_text().split()[:2]
    from paramiko.hostkeys import HostKeys

    hashed = HostKeys.hash_host(f"[127.0.0.1]:{sshd.port}")
    ssh_home.known_hosts.write_text(f"{hashed} {key_type} {key_b64}\n")
    opened = SshTransport(ssh_device(sshd, tmp_path))
    assert opened.run(["true"]).ok
    opened.close()


@pytest.mark.parametrize("trust", [False, True])
def test_a_revoked_key_is_refused_even_when_also_listed_and_with_trust_new_host(
    sshd, ssh_home, tmp_path, trust
):
    key_type, key_b64 = sshd.host_key.with_suffix(".pub").read_text().split()[:2]
    ssh_home.known_hosts.write_text(sshd.known_hosts_line() + f"@revoked * {key_type} {key_b64}\n")
    before = ssh_home.known_hosts.read_text()
    with pytest.raises(DeviceError) as caught:
        SshTransport(ssh_device(sshd, tmp_path), trust_new_host=trust)
    assert (
        "@revoked" in caught.value.message and f"{ssh_home.known_hosts}:2" in caught.value.message
    )
    assert sshd.host_fingerprint in caught.value.message
    assert ssh_home.known_hosts.read_text() == before  # never stored


def test_a_revoked_other_key_does_not_block_the_good_one(sshd, ssh_home, tmp_path):
    other = keygen(tmp_path / "other")
    key_type, key_b64 = other.with_suffix(".pub").read_text().split()[:2]
    ssh_home.known_hosts.write_text(f"@revoked * {key_type} {key_b64}\n" + sshd.known_hosts_line())
    assert len(read_known_hosts(ssh_home.known_hosts).revoked) == 1
    opened = SshTransport(ssh_device(sshd, tmp_path))
    assert opened.run(["true"]).ok
    opened.close()


def test_an_unreadable_known_hosts_is_a_device_error(tmp_path):
    folder = tmp_path / "kh"
    folder.mkdir()
    with pytest.raises(DeviceError, match="cannot read known_hosts file"):
        read_known_hosts(folder)
