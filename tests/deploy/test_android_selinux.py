"""Android's SELinux forbids ``adb shell`` to hard-link any file (AOSP system/sepolicy,
public/shell.te: ``neverallow shell file_type:file link``). The adb test device holds its shell
to that rule by default (tests/adbdevice/selinux.py), so every adb test runs under it; these
tests show the rule and the whole loop on such a device: releases are symlinks into the store,
and the tools still find their libraries.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time

import pytest

from kzbuild.device import modelpush
from kzbuild.device.adb import AdbTransport
from kzbuild.device.store import Layout
from kzbuild.errors import DeviceError
from tests.deploy.test_deploy_adb import ROOT
from tests.deploy.test_models_push import arrived, write_model
from tests.fixtures_deploy import assert_store_invariant


def shell(device, script: str) -> tuple[bool, str]:
    result = AdbTransport(device.device(root=ROOT), connect_timeout=5).run(["sh", "-c", script])
    return result.ok, result.text() + result.stderr.decode(errors="replace")


def test_the_devices_shell_may_not_hard_link_or_mkfifo_but_may_symlink_and_rename(make_adb_device):
    device = make_adb_device(selinux=True)
    tmp = "/data/local/tmp"
    assert shell(device, f"echo x > {tmp}/a && ln -s a {tmp}/s && mv {tmp}/s {tmp}/t") == (True, "")
    ok, said = shell(device, f"ln {tmp}/a {tmp}/b")
    assert not ok and "Permission denied" in said
    ok, said = shell(device, f"mkfifo {tmp}/f")  # no fifo_file for shell in /data/local/tmp
    assert not ok and "Permission denied" in said
    ok, said = shell(
        device, f"cd {tmp} && tar -c -f t.tar a && mkdir x && cd x && tar -x -f ../t.tar"
    )
    assert ok, said  # tar's own files are written, not linked
    assert make_adb_device().fs.shell_setup  # every adb test device holds the rule
    assert not make_adb_device(selinux=False).fs.shell_setup


def test_deploy_run_verify_and_prune_on_a_device_that_denies_hard_links(
    kz, make_adb_device, artifacts
):
    """The whole release loop under Android's rule: a release is symlinks into objects/, its
    program finds its libraries (kzbuild sets LD_LIBRARY_PATH: $ORIGIN is the store's), verify
    repairs a broken link with a symlink, and prune removes what no kept release lists."""
    device = make_adb_device()
    spec = f"adb:{device.serial}:{ROOT}"
    first = kz("deploy", "--device", spec, "--artifact", str(artifacts.make("b1")), "--json")
    assert first.code == 0, first.err
    assert json.loads(first.out)["files_sent"] == 3
    hello = device.fs.host_path(f"{ROOT}/releases/b1/bin/hello")
    assert os.readlink(hello).startswith("../../../objects/")
    ran = kz("run", "--device", spec, "hello")
    assert (ran.code, ran.out) == (0, "hello from v1\nblob 65536\n"), ran.err

    hello.unlink()
    verified = kz("device", "verify", "--device", spec, "--json")
    assert verified.code != 0 and "releases/b1/bin/hello" in verified.out
    redeploy = kz("deploy", "--device", spec, "--artifact", str(artifacts.make("b1")), "--json")
    assert redeploy.code == 0, redeploy.err
    assert os.readlink(hello).startswith("../../../objects/")
    assert kz("device", "verify", "--device", spec, "--json").code == 0

    second = artifacts.make("b2", greeting="hello from v2")
    assert kz("deploy", "--device", spec, "--artifact", str(second), "--keep", "1").code == 0
    objects = device.fs.host_path(f"{ROOT}/objects")
    listed = json.loads(device.fs.host_path(f"{ROOT}/releases/b2/manifest.json").read_text())
    assert {path.name for path in objects.iterdir()} == {
        entry["sha256"] for entry in listed["files"].values()
    }  # b1's own library went with b1
    assert assert_store_invariant(device.fs.host_path(ROOT)) == "b2"
    ran = kz("run", "--device", spec, "hello")
    assert (ran.code, ran.out) == (0, "hello from v2\nblob 65536\n"), ran.err


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


def test_a_cut_models_push_to_such_a_device_resumes_from_what_arrived(make_adb_device, tmp_path):
    """adbd removes a file whose push was cut, and the checker may not link it: it holds the file
    open, and copies what arrived out of it once adbd removed it (adbd's SIGHUP does not stop it).
    The next push checks that copy and sends only the rest; what it stores is whole."""
    device = make_adb_device(selinux=True)
    model = write_model(tmp_path / "m.gguf", tensors=6)
    target = device.device(root=ROOT)
    device.faults.send_delay = 0.01  # the checker is there while the file arrives
    device.drop_send_after(model.stat().st_size * 3 // 4)
    with pytest.raises(DeviceError):
        modelpush.push_model(AdbTransport(target, connect_timeout=5), target, model)
    device.faults.send_delay = 0.0
    again = modelpush.push_model(AdbTransport(target, connect_timeout=5), target, model)
    assert again.bytes_resumed >= model.stat().st_size // 2  # whole pieces before the cut
    assert again.bytes_resumed + again.bytes_sent == model.stat().st_size
    stored = device.fs.host_path(f"{ROOT}/models/{again.sha256}.gguf")
    assert stored.read_bytes() == model.read_bytes()


def prologue(device, work: str) -> modelpush.DeviceModels:
    step = modelpush.prologue_step(Layout(ROOT), work)
    transport = AdbTransport(device.device(root=ROOT), connect_timeout=5)
    return modelpush.parse_prologue(transport.run(step.argv, timeout=60))


def slow_copies(device, slow: bool = True) -> None:
    """The device's ``cat`` takes a second more (``slow``), or is toybox's again."""
    cat = device.fs.bin / "cat"
    toybox = device.fs.bin / "toybox"
    cat.unlink()
    if slow:
        cat.write_text(f'#!{device.fs.shell}\nsleep 1\nexec {toybox} cat "$@"\n')
        cat.chmod(0o755)
    else:
        cat.symlink_to(toybox.resolve())


def test_a_push_run_again_at_once_after_a_pulled_cable_waits_for_the_copy_of_what_arrived(
    make_adb_device, tmp_path
):
    """When the cable goes, the checker copies the cut push's file into part after adbd removed it:
    for a model of GBs that takes seconds on a phone, and the user, the cable back, runs the push
    again at once. The next push's prologue waits for that copy (the checker's pid in the work
    dir) instead of finding no part and sending the whole model again."""
    device = make_adb_device(selinux=True)
    model = write_model(tmp_path / "m.gguf", tensors=40)  # 48 MB: a copy that takes a while
    size = model.stat().st_size
    target = device.device(root=ROOT)
    device.faults.send_delay = 0.002  # a slow cable: the push takes a few seconds
    slow_copies(device)  # the copy of what arrived takes a second, as GBs on a phone
    failed: list[BaseException] = []

    def push() -> None:
        try:
            modelpush.push_model(AdbTransport(target, connect_timeout=5), target, model)
        except DeviceError as exc:
            failed.append(exc)

    thread = threading.Thread(target=push)
    thread.start()
    incoming = device.fs.host_path(f"{ROOT}/incoming")
    deadline = time.monotonic() + 60
    while arrived(incoming) < size // 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    device.disconnect_all()  # the cable pulled: every connection goes, the checker's too
    thread.join(60)
    assert failed, "the push should have failed"
    device.faults.send_delay = 0.0
    (work,) = [p.name for p in incoming.iterdir()]
    found = prologue(device, work)  # at once, as a push run again would
    assert found.arrived.get("part", 0) >= size // 2, found.arrived
    assert not {"part.kz", "checker"} & set(found.arrived)
    slow_copies(device, False)
    again = modelpush.push_model(AdbTransport(target, connect_timeout=5), target, model)
    assert again.bytes_resumed >= size // 2
    assert again.bytes_resumed + again.bytes_sent == size
    stored = device.fs.host_path(f"{ROOT}/models/{again.sha256}.gguf")
    assert stored.read_bytes() == model.read_bytes()


def run_checker(device, work: str, script: str) -> threading.Thread:
    """``script`` in the work dir on ``device``, in a thread, as a checker: its pid in
    ``checker``; returns once that file is there."""
    transport = AdbTransport(device.device(root=ROOT), connect_timeout=5)
    folder = f"{ROOT}/incoming/{work}"
    setup = (
        'mkdir -p "$1" && cd "$1" && read -r me rest < /proc/self/stat && echo "$me" > checker; '
    )

    def run() -> None:
        with contextlib.suppress(DeviceError):  # a checker still running when the device stops
            transport.run(["sh", "-c", setup + script, "kz", folder])

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    checker = device.fs.host_path(f"{folder}/checker")
    deadline = time.monotonic() + 10
    while not checker.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert checker.exists()
    return thread


def test_the_prologue_waits_for_a_checker_that_copies_and_gives_up_on_one_that_stalls(
    make_adb_device,
):
    device = make_adb_device(selinux=True)
    copying = run_checker(
        device,
        ".kzm-copying",
        "i=0; while [ $i -lt 10 ]; do echo 123456789 >> part.kz; sleep 0.1; i=$((i + 1)); done; "
        "mv part.kz part; rm -f checker",
    )
    found = prologue(device, ".kzm-copying")
    assert found.arrived == {"part": 100}  # it waited for the whole copy
    copying.join(10)

    stalled = run_checker(device, ".kzm-stalled", "echo 123 > part.kz; sleep 30")
    started = time.monotonic()
    found = prologue(device, ".kzm-stalled")
    waited = time.monotonic() - started
    assert modelpush.STALLED_WAITS * 0.1 <= waited < 20, waited
    assert found.arrived == {}  # what it left is removed: the next push starts afresh
    assert stalled.is_alive()  # gone on at once, not waited for
