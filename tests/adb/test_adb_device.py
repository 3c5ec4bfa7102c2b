"""The test device itself, driven by the real adb client: what the transport tests rely on."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.adbdevice import AdbTestDevice, PrivateAdbServer
from tests.adbdevice.fixtures import MakeDevice
from tests.adbdevice.fs import OutputRewriter


@pytest.fixture
def online(adb_device: AdbTestDevice, adb_server: PrivateAdbServer) -> AdbTestDevice:
    assert adb_server.adb("connect", adb_device.serial).stdout.startswith("connected to")
    return adb_device


def adb_s(
    server: PrivateAdbServer, device: AdbTestDevice, *args: str, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [server.adb_path, "-P", str(server.port), "-s", device.serial, *args],
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=20,
    )


def test_banner_names_the_product(online: AdbTestDevice, adb_server: PrivateAdbServer) -> None:
    listing = adb_server.adb("devices", "-l").stdout
    assert f"{online.serial}        device product:testpad model:testpad device:testpad" in listing


def test_unauthorized_device_is_listed_so(
    make_adb_device: MakeDevice, adb_server: PrivateAdbServer
) -> None:
    device = make_adb_device(mode="unauthorized")
    assert (
        adb_server.adb("connect", device.serial).stdout.strip()
        == f"failed to authenticate to {device.serial}"
    )
    assert f"{device.serial}\tunauthorized" in adb_server.adb("devices").stdout


def test_shell_v2_forwards_stdin(online: AdbTestDevice, adb_server: PrivateAdbServer) -> None:
    result = adb_s(adb_server, online, "shell", "-T", "rev; exit 5", input="hello\n")
    assert (result.stdout, result.returncode) == ("olleh\n", 5)


def test_old_style_shell_merges_streams_without_exit_code(
    online: AdbTestDevice, adb_server: PrivateAdbServer
) -> None:
    # -x: the client opens plain "shell:" (no v2 protocol)
    result = adb_s(adb_server, online, "shell", "-x", "echo out; echo err >&2; exit 3")
    assert (result.stdout, result.stderr, result.returncode) == ("out\nerr\n", "", 0)
    assert adb_s(adb_server, online, "exec-out", "printf raw").stdout == "raw"


def test_shell_sees_device_paths(online: AdbTestDevice, adb_server: PrivateAdbServer) -> None:
    online.host_path("/data/local/tmp/f").write_text("content\n")
    result = adb_s(
        adb_server,
        online,
        "shell",
        "-T",
        "sha256sum /data/local/tmp/f; cat /data/local/tmp/f; echo $TMPDIR",
    )
    lines = result.stdout.splitlines()
    assert lines[0].endswith("  /data/local/tmp/f") and lines[1:] == ["content", "/data/local/tmp"]
    # only whole path names are mapped
    assert (
        adb_s(adb_server, online, "shell", "-T", "echo /data/local/tmpfoo").stdout
        == "/data/local/tmpfoo\n"
    )


def test_toybox_basics_are_there(online: AdbTestDevice, adb_server: PrivateAdbServer) -> None:
    script = (
        "set -e; cd /data/local/tmp; mkdir -p r/a; echo x > r/a/f; mv r/a r/b; ln -s b r/current;"
        " cat r/current/f; rm -rf r; test ! -e r; uname"
    )
    result = adb_s(adb_server, online, "shell", "-T", script)
    assert (result.stdout, result.returncode) == ("x\nLinux\n", 0)


def test_pull_of_a_directory_lists_it(
    online: AdbTestDevice, adb_server: PrivateAdbServer, tmp_path: Path
) -> None:
    tree = online.host_path("/data/local/tmp/tree")
    (tree / "sub").mkdir(parents=True)
    (tree / "a.bin").write_bytes(os.urandom(70_000))
    (tree / "sub" / "b.txt").write_text("b")
    result = adb_s(adb_server, online, "pull", "/data/local/tmp/tree", str(tmp_path / "copy"))
    assert result.returncode == 0, result.stdout
    assert (tmp_path / "copy" / "a.bin").read_bytes() == (tree / "a.bin").read_bytes()
    assert (tmp_path / "copy" / "sub" / "b.txt").read_text() == "b"


def test_push_into_a_directory_uses_stat(
    online: AdbTestDevice, adb_server: PrivateAdbServer, tmp_path: Path
) -> None:
    online.host_path("/data/local/tmp/dest").mkdir()
    source = tmp_path / "lib.so"
    source.write_bytes(b"\x7fELF")
    assert adb_s(adb_server, online, "push", str(source), "/data/local/tmp/dest").returncode == 0
    assert online.host_path("/data/local/tmp/dest/lib.so").read_bytes() == b"\x7fELF"


def test_push_of_a_tree_keeps_symlinks(
    online: AdbTestDevice, adb_server: PrivateAdbServer, tmp_path: Path
) -> None:
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "libx.so.1").write_text("lib")
    (tmp_path / "tree" / "libx.so").symlink_to("libx.so.1")
    assert (
        adb_s(adb_server, online, "push", str(tmp_path / "tree"), "/data/local/tmp/t").returncode
        == 0
    )
    pushed = online.host_path("/data/local/tmp/t")
    assert (
        os.readlink(pushed / "libx.so") == "libx.so.1" and (pushed / "libx.so").read_text() == "lib"
    )


def test_device_paths_cannot_climb_out_of_the_root(adb_device: AdbTestDevice) -> None:
    assert adb_device.host_path("/../../etc/passwd") == adb_device.fs.root / "etc" / "passwd"


@pytest.mark.parametrize("cut", range(0, 40, 3))
def test_output_rewriter_across_chunk_boundaries(cut: int) -> None:
    host = b"/tmp/adbdevice0/fs/data/local/tmp"
    text = b"a " + host + b"/x\n" + host + b" b " + host[:-1] + b"\n"
    rewriter = OutputRewriter(host, b"/data/local/tmp")
    out = rewriter.feed(text[:cut]) + rewriter.feed(text[cut:]) + rewriter.flush()
    assert out == b"a /data/local/tmp/x\n/data/local/tmp b " + host[:-1] + b"\n"
