"""Android's SELinux forbids ``adb shell`` to hard-link any file (AOSP system/sepolicy,
public/shell.te: ``neverallow shell file_type:file link``). The adb test device can hold its shell
to that rule (``make_adb_device(selinux=True)``, tests/adbdevice/selinux.py).

kzbuild's release store is built on hard links (a release is hard links into objects/), and so
are split models: on a real Android device deploy and `models push --split` fail today. The test
marked xfail(strict) says so: it passes once releases work without hard links, and strict makes
that pass a failure until the mark is removed. Until then the failure must be a clear one, at
once. A whole model's push works: its checker reads the arriving file where it may not link it.
"""

from __future__ import annotations

import json

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


def test_models_push_to_a_device_that_denies_hard_links_is_stored_verified(
    kz, make_adb_device, tmp_path
):
    """The direct push's checker reads the arriving file itself when it may not link it."""
    device = make_adb_device(selinux=True)
    model = write_model(tmp_path / "m.gguf", tensors=4)
    spec = f"adb:{device.serial}:{ROOT}"
    result = kz("models", "push", str(model), "--device", spec, "--json")
    assert result.code == 0, result.err
    pushed = json.loads(result.out)
    assert pushed["bytes_sent"] == model.stat().st_size
    stored = device.fs.host_path(f"{ROOT}/models/{pushed['sha256']}.gguf")
    assert stored.read_bytes() == model.read_bytes()
    assert device.fs.host_path(f"{ROOT}/models/m.gguf").resolve() == stored.resolve()
    assert not list(device.fs.host_path(f"{ROOT}/incoming").iterdir())
    again = json.loads(kz("models", "push", str(model), "--device", spec, "--json").out)
    assert (again["already_there"], again["bytes_sent"]) == (True, 0)


def test_a_cut_models_push_to_such_a_device_starts_again_and_is_stored(make_adb_device, tmp_path):
    """adbd removes a file whose push was cut, and without the link nothing of it stays: the next
    push sends it all again, and what it stores is whole."""
    device = make_adb_device(selinux=True)
    model = write_model(tmp_path / "m.gguf", tensors=6)
    target = device.device(root=ROOT)
    device.faults.send_delay = 0.01  # the checker is there while the file arrives
    device.drop_send_after(model.stat().st_size * 3 // 4)
    with pytest.raises(DeviceError):
        modelpush.push_model(AdbTransport(target, connect_timeout=5), target, model)
    device.faults.send_delay = 0.0
    again = modelpush.push_model(AdbTransport(target, connect_timeout=5), target, model)
    assert (again.bytes_resumed, again.bytes_sent) == (0, model.stat().st_size)
    stored = device.fs.host_path(f"{ROOT}/models/{again.sha256}.gguf")
    assert stored.read_bytes() == model.read_bytes()


def test_a_split_models_push_says_at_once_that_the_device_refuses_hard_links(
    kz, make_adb_device, tmp_path
):
    device = make_adb_device(selinux=True)
    model = write_model(tmp_path / "m.gguf", tensors=3)
    result = kz("models", "push", str(model), "--split", "--device", f"adb:{device.serial}:{ROOT}")
    assert result.code == 8
    assert f"device adb:{device.serial} does not allow hard links" in result.err
    assert "hint: Android's SELinux forbids adb shell" in result.err
    assert "Traceback" not in result.err


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
