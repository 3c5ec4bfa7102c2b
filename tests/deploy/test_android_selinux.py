"""Android's SELinux forbids ``adb shell`` to hard-link any file (AOSP system/sepolicy,
public/shell.te: ``neverallow shell file_type:file link``). The adb test device can hold its shell
to that rule (``make_adb_device(selinux=True)``, tests/adbdevice/selinux.py).

kzbuild's device store is built on hard links (a release is hard links into objects/; a direct
models push links the arriving file; split models are hard links), so on a real Android device
deploy and models push fail today. The two tests marked xfail(strict) say so: they pass once the
store works without hard links, and strict makes that pass a failure until the mark is removed.
Until then the failure must be a clear one, at once: the other tests hold that.
"""

from __future__ import annotations

import json
import time

import pytest

from kzbuild.device import modelpush
from kzbuild.device.adb import AdbTransport
from kzbuild.errors import DeviceError
from tests.deploy.test_deploy_adb import ROOT
from tests.deploy.test_models_push import write_model

NO_HARD_LINKS = "the device store needs hard links, which Android denies to adb shell"


def shell(device, script: str) -> tuple[bool, str]:
    result = AdbTransport(device.device(root=ROOT), connect_timeout=5).run(["sh", "-c", script])
    return result.ok, result.text() + result.stderr.decode(errors="replace")


def test_the_devices_shell_may_not_hard_link_but_may_symlink_and_rename(make_adb_device):
    device = make_adb_device(selinux=True)
    tmp = "/data/local/tmp"
    assert shell(device, f"echo x > {tmp}/a && ln -s a {tmp}/s && mv {tmp}/s {tmp}/t") == (True, "")
    ok, said = shell(device, f"ln {tmp}/a {tmp}/b")
    assert not ok and "Permission denied" in said
    ok, said = shell(
        device, f"cd {tmp} && tar -c -f t.tar a && mkdir x && cd x && tar -x -f ../t.tar"
    )
    assert ok, said  # tar's own files are written, not linked
    assert not make_adb_device().fs.shell_setup  # the default device keeps the host's rules


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=NO_HARD_LINKS)
def test_deploy_to_a_device_that_denies_hard_links(kz, make_adb_device, artifacts):
    device = make_adb_device(selinux=True)
    spec = f"adb:{device.serial}:{ROOT}"
    result = kz("deploy", "--device", spec, "--artifact", str(artifacts.make("b1")), "--json")
    assert result.code == 0, result.err  # today: tar: can't link ... Permission denied
    assert json.loads(result.out)["files_sent"] == 3


@pytest.mark.xfail(strict=True, raises=DeviceError, reason=NO_HARD_LINKS)
def test_models_push_to_a_device_that_denies_hard_links(make_adb_device, tmp_path):
    device = make_adb_device(selinux=True)
    model = write_model(tmp_path / "m.gguf", tensors=2)
    transport = AdbTransport(device.device(root=ROOT), connect_timeout=5)
    pushed = modelpush.push_model(transport, device.device(root=ROOT), model)
    assert pushed.bytes_sent == model.stat().st_size


def test_deploy_says_at_once_that_the_device_refuses_hard_links(kz, make_adb_device, artifacts):
    device = make_adb_device(selinux=True)
    spec = f"adb:{device.serial}:{ROOT}"
    result = kz("deploy", "--device", spec, "--artifact", str(artifacts.make("b1")))
    assert result.code == 8
    assert f"device adb:{device.serial} does not allow hard links: completing the release" in (
        result.err
    )
    assert "hint: Android's SELinux forbids adb shell to hard-link files" in result.err
    assert "Traceback" not in result.err
    current = AdbTransport(device.device(root=ROOT), connect_timeout=5).run(
        ["readlink", f"{ROOT}/current"]
    )
    assert not current.ok  # nothing was switched to


def test_models_push_says_at_once_that_the_device_refuses_hard_links(kz, make_adb_device, tmp_path):
    device = make_adb_device(selinux=True)
    model = write_model(tmp_path / "m.gguf", tensors=2)
    started = time.monotonic()
    result = kz("models", "push", str(model), "--device", f"adb:{device.serial}:{ROOT}")
    assert result.code == 8
    assert f"device adb:{device.serial} does not allow hard links" in result.err
    assert "cannot create hard link" in result.err  # toybox's own words
    assert "hint: Android's SELinux forbids adb shell" in result.err
    assert time.monotonic() - started < 30  # not the checker's 60 s wait for a stalled file
