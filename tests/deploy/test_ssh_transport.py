"""SshTransport against a real sshd on 127.0.0.1: host keys, commands, files, dropped links."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kzbuild.device.registry import connect, parse_device_spec
from kzbuild.device.ssh import SshTransport
from kzbuild.errors import DeviceError
from tests.fixtures_ssh import keygen


def ssh_device(sshd, root: Path, port: int | None = None):
    device = parse_device_spec(sshd.spec(root, port))
    assert device is not None
    return device


@pytest.fixture
def transport(sshd, ssh_home, tmp_path):
    opened = connect(ssh_device(sshd, tmp_path))
    yield opened
    opened.close()


def test_unknown_host_key_is_refused_with_fingerprint_and_known_hosts_path(
    sshd, ssh_home, tmp_path
):
    ssh_home.known_hosts.write_text("")
    with pytest.raises(DeviceError) as caught:
        SshTransport(ssh_device(sshd, tmp_path))
    message = caught.value.message
    assert "unknown host key" in message
    assert sshd.host_fingerprint in message and sshd.host_fingerprint.startswith("SHA256:")
    assert str(ssh_home.known_hosts) in message
    assert "--trust-new-host" in (caught.value.hint or "")
    assert ssh_home.known_hosts.read_text() == ""


def test_missing_known_hosts_file_counts_as_unknown(sshd, ssh_home, tmp_path):
    ssh_home.known_hosts.unlink()
    with pytest.raises(DeviceError, match="unknown host key"):
        SshTransport(ssh_device(sshd, tmp_path))
    assert not ssh_home.known_hosts.exists()


def test_trust_new_host_stores_the_key_and_later_connections_check_it(sshd, ssh_home, tmp_path):
    ssh_home.known_hosts.unlink()
    first = SshTransport(ssh_device(sshd, tmp_path), trust_new_host=True)
    first.close()
    assert ssh_home.known_hosts.read_text() == sshd.known_hosts_line()
    second = SshTransport(ssh_device(sshd, tmp_path))  # strict again, and known now
    assert second.run(["true"]).ok
    second.close()


def test_a_changed_host_key_is_refused_even_with_trust_new_host(sshd, ssh_home, tmp_path):
    other = keygen(tmp_path / "other_host_key")
    key_type, key_b64 = other.with_suffix(".pub").read_text().split()[:2]
    ssh_home.known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {key_type} {key_b64}\n")
    with pytest.raises(DeviceError) as caught:
        SshTransport(ssh_device(sshd, tmp_path), trust_new_host=True)
    message = caught.value.message
    assert "CHANGED" in message and sshd.host_fingerprint in message
    from tests.fixtures_ssh import fingerprint

    assert fingerprint(other.with_suffix(".pub")) in message
    assert str(ssh_home.known_hosts) in message
    assert "ssh-keygen -R" in (caught.value.hint or "")
    assert ssh_home.known_hosts.read_text().count("\n") == 1  # not replaced


def test_explicit_known_hosts_path(sshd, ssh_home, tmp_path):
    elsewhere = tmp_path / "kh"
    elsewhere.write_text(sshd.known_hosts_line())
    ssh_home.known_hosts.unlink()
    opened = SshTransport(ssh_device(sshd, tmp_path), known_hosts=elsewhere)
    assert opened.run(["true"]).ok
    opened.close()


def test_a_wrong_client_key_fails_authentication_without_asking_for_a_password(
    sshd, ssh_home, tmp_path
):
    stranger = keygen(tmp_path / "stranger")
    device = ssh_device(sshd, tmp_path)
    device = type(device)(**{**device.__dict__, "key": str(stranger)})
    with pytest.raises(DeviceError) as caught:
        SshTransport(device)
    assert "authentication failed" in caught.value.message
    assert "passwords are not used" in (caught.value.hint or "")


def test_a_named_key_file_that_does_not_exist(sshd, ssh_home, tmp_path):
    device = ssh_device(sshd, tmp_path)
    device = type(device)(**{**device.__dict__, "key": str(tmp_path / "nope")})
    with pytest.raises(DeviceError, match=r"ssh key .*nope does not exist"):
        SshTransport(device)


def test_nothing_listening(ssh_home, tmp_path, sshd):
    from tests.fixtures_ssh import free_port

    port = free_port()
    with pytest.raises(DeviceError, match=f"cannot connect to 127.0.0.1:{port}"):
        SshTransport(ssh_device(sshd, tmp_path, port))


def test_the_connection_sends_small_packets_at_once(transport):
    """Nagle off, as OpenSSH's client has it: with it on, each command waited ~40 ms for a delayed
    ACK."""
    sock = transport._client.get_transport().sock
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_run_returns_the_real_exit_code_and_separate_streams(transport, tmp_path):
    result = transport.run(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.returncode, result.stdout, result.stderr) == (3, b"out\n", b"err\n")


def test_run_with_cwd_env_and_streaming(transport, tmp_path):
    chunks: list[bytes] = []
    result = transport.run(
        ["sh", "-c", 'pwd; printf %s "$KZ_X"'],
        cwd=str(tmp_path),
        env={"KZ_X": "a b|c"},
        on_stdout=chunks.append,
    )
    assert result.ok and result.stdout == b""
    assert b"".join(chunks) == f"{tmp_path}\na b|c".encode()


def test_run_timeout(transport):
    with pytest.raises(DeviceError, match="timed out after 0.5 s"):
        transport.run(["sleep", "5"], timeout=0.5)
    assert transport.run(["true"]).ok  # the connection is still usable


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    arg=st.text(
        st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40
    ),
    value=st.text(
        st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40
    ),
)
def test_any_argument_and_env_value_arrives_unchanged_over_ssh(transport, arg, value):
    result = transport.run(
        ["sh", "-c", 'printf %s "$1"; printf "\\0"; printf %s "$KZ_V"', "sh", arg],
        env={"KZ_V": value},
    )
    assert result.ok, result.stderr
    assert result.stdout == arg.encode() + b"\0" + value.encode()


def test_push_and_pull(transport, tmp_path):
    local = tmp_path / "data.bin"
    local.write_bytes(os.urandom(300_000))
    local.chmod(0o750)
    remote = tmp_path / "remote.bin"
    seen: list[int] = []
    transport.push(local, str(remote), progress=seen.append)
    assert remote.read_bytes() == local.read_bytes()
    assert remote.stat().st_mode & 0o777 == 0o750
    assert seen[-1] == 300_000 and seen == sorted(seen)
    back = tmp_path / "back.bin"
    transport.pull(str(remote), back)
    assert back.read_bytes() == local.read_bytes()


def test_push_into_a_missing_directory_names_the_path(transport, tmp_path):
    local = tmp_path / "f"
    local.write_text("x")
    with pytest.raises(DeviceError) as caught:
        transport.push(local, str(tmp_path / "no" / "such" / "f"))
    assert (
        "uploading f to" in caught.value.message and "failed on 127.0.0.1" in caught.value.message
    )


def test_a_connection_dropped_mid_upload_names_the_host(sshd, ssh_home, relay, tmp_path):
    opened = SshTransport(ssh_device(sshd, tmp_path, relay.port))
    local = tmp_path / "big.bin"
    local.write_bytes(os.urandom(2_000_000))
    relay.cut_after(500_000)
    with pytest.raises(DeviceError) as caught:
        opened.push(local, str(tmp_path / "big.remote"))
    assert (
        f"connection to 127.0.0.1:{relay.port} lost while uploading big.bin" in caught.value.message
    )
    with pytest.raises(DeviceError, match="connection .* (lost|is closed)"):
        opened.run(["true"])
    opened.close()


def test_a_command_killed_by_a_signal_is_not_a_lost_connection(transport):
    result = transport.run(["sh", "-c", "kill -9 $$"])
    assert result.returncode == -1  # ssh reports a signal, not an exit code
    assert transport.run(["true"]).ok


def test_a_connection_dropped_mid_command_names_the_host(sshd, ssh_home, relay, tmp_path):
    import threading

    opened = SshTransport(ssh_device(sshd, tmp_path, relay.port))
    threading.Timer(0.3, relay.cut_now).start()
    with pytest.raises(
        DeviceError, match=f"connection to 127.0.0.1:{relay.port} lost while running sleep"
    ):
        opened.run(["sleep", "5"])
    opened.close()
