"""The adb test device runs commands with Android's userland: mksh as ``sh`` and toybox applets
on a PATH that reaches nothing else, so deploy's device scripts are tested as the tablet runs them.
"""

from __future__ import annotations

import json
import posixpath
import subprocess
from pathlib import Path

import pytest

from kzbuild.device.adb import AdbTransport
from kzbuild.measure.bench import device_model
from tests.adbdevice import AdbTestDevice
from tests.adbdevice.fs import toybox_applets
from tests.adbdevice.toybox import ToyboxMissing, android_toybox, build_dir

# Every command kzbuild runs on a device outside a release (store, chunkstore, integrity,
# devicelock, deploy, run, bench, models push, device status, adb's progress poll). Android's
# toybox has each of them (``test``, ``[`` and ``echo`` are mksh builtins).
DEVICE_APPLETS = (
    "cat chmod cmp comm cut date dd df dirname env find grep head ln ls mkdir mkfifo mv nice "
    "printf readlink rm rmdir sed sha1sum sha256sum sleep sort stat tail tar tee touch truncate "
    "uname wc xargs"
).split()
# android_defconfig enables these "pending" commands, which Debian's toybox package lacks: the
# device has them, as Android does.
ANDROID_PENDING = ("tr", "dd", "diff", "expr", "gzip", "getopt")
# Debian's toybox has these, Android's does not; nor has Android the rest.
NOT_ON_ANDROID = ("wget", "su", "sha3sum", "bash", "dash", "gawk", "python3", "perl")


def shell(transport: AdbTransport, script: str, *args: str) -> list[str]:
    result = transport.run(["sh", "-c", script, "kz", *args])
    assert result.ok, result.stderr
    return result.text().splitlines()


def test_the_shell_is_mksh_and_sha256sum_is_toybox(transport: AdbTransport) -> None:
    version, sh, sha256sum, path = shell(
        transport,
        'printf "%s\\n" "$KSH_VERSION" "$(readlink -f "$(command -v sh)")" "$(readlink -f '
        '"$(command -v sha256sum)")" "$PATH"',
    )
    mksh, toybox, _ = toybox_applets()
    assert "MIRBSD KSH" in version  # mksh's own variable: bash and dash leave it unset
    assert (sh, sha256sum) == (mksh, toybox)
    assert ":" not in path  # one dir: the applets, sh and getprop
    assert shell(transport, "sha256sum --version") == shell(transport, "toybox --version")
    assert shell(transport, "toybox --version")[0].startswith("toybox ")


def test_the_toybox_is_androids_build_hashing_through_libcrypto() -> None:
    _, toybox, _ = toybox_applets()
    config = (build_dir() / "config").read_text().splitlines()
    assert {"CONFIG_TOYBOX_LIBCRYPTO=y", "CONFIG_SHA256SUM=y"} <= set(config)
    linked = subprocess.run(["ldd", toybox], capture_output=True, text=True, check=True).stdout
    assert "libcrypto.so" in linked


def test_nothing_but_mksh_and_toybox_is_reachable(transport: AdbTransport) -> None:
    found = shell(
        transport, "for c in " + " ".join(NOT_ON_ANDROID) + '; do command -v "$c" || true; done'
    )
    assert found == []


def test_androids_pending_applets_are_there(transport: AdbTransport) -> None:
    _, toybox, _ = toybox_applets()
    script = 'for c in "$@"; do readlink -f "$(command -v "$c")"; done'
    assert shell(transport, script, *ANDROID_PENDING) == [toybox] * len(ANDROID_PENDING)
    assert shell(transport, "printf 'a-b' | tr - _") == ["a_b"]


def test_every_applet_the_device_scripts_use_is_toybox(transport: AdbTransport) -> None:
    _, toybox, applets = toybox_applets()
    assert set(DEVICE_APPLETS) <= set(applets)
    script = 'for c in "$@"; do printf "%s %s\\n" "$c" "$(readlink -f "$(command -v "$c")")"; done'
    resolved = dict(line.split(" ", 1) for line in shell(transport, script, *DEVICE_APPLETS))
    assert resolved == dict.fromkeys(DEVICE_APPLETS, toybox)


def test_models_push_over_adb_stores_once_and_bench_names_the_model_by_its_store_name(
    kz, adb_device: AdbTestDevice, tmp_path: Path
) -> None:
    root = "/data/local/tmp/kz-engine"
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF" + bytes(range(256)) * 1024)
    spec = f"adb:{adb_device.serial}:{root}"
    first = kz("models", "push", str(model), "--device", spec, "--json")
    assert first.code == 0, first.err
    pushed = json.loads(first.out)
    assert (pushed["already_there"], pushed["bytes_sent"]) == (False, model.stat().st_size)
    again = kz("models", "push", str(model), "--device", spec, "--json")
    assert again.code == 0, again.err
    assert (json.loads(again.out)["already_there"], json.loads(again.out)["bytes_sent"]) == (
        True,
        0,
    )

    device = adb_device.device(root=root)
    transport = AdbTransport(device, connect_timeout=5)
    # mksh's pwd -P and toybox's readlink -f into models/
    assert device_model(transport, device, "models/tiny.gguf").sha256 == pushed["sha256"]
    copy = posixpath.join(root, "copy.gguf")
    assert transport.run(["cp", posixpath.join(root, "models", "tiny.gguf"), copy]).ok
    # toybox sha256sum on the device
    assert device_model(transport, device, copy).sha256 == pushed["sha256"]


def test_without_the_build_the_device_says_how_to_make_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KZ_TEST_CACHE", str(tmp_path))  # nothing built there: no fallback
    with pytest.raises(ToyboxMissing, match="run scripts/setup"):
        android_toybox()
