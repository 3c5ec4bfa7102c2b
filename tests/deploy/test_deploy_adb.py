"""The deploy flow through the real adb client against the adb test device (tests/adbdevice)."""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest

from kzbuild.build.artifacts import load_artifact
from kzbuild.device import deploy
from kzbuild.device.adb import AdbTransport
from kzbuild.device.base import RemoteResult
from kzbuild.device.chunkstore import MISMATCH, PUSH_PIECE, PUSHED_SCRIPT, SUMS_FILE, Gate
from kzbuild.device.steps import Step
from kzbuild.errors import DeviceError
from tests.fixtures_deploy import assert_store_invariant, flip_byte, sha256, write_manifest

ROOT = "/data/local/tmp/kz-engine"
# a release's files are symlinks into the store: its programs find its libraries this way (as
# upstream's scripts run them), not by $ORIGIN
RELEASE_LIBS = {"LD_LIBRARY_PATH": f"{ROOT}/current/lib"}


def adb_deploy(kz, adb_device, artifact, *extra: str):
    return kz(
        "deploy",
        "--device",
        f"adb:{adb_device.serial}:{ROOT}",
        "--artifact",
        str(artifact),
        "--json",
        *extra,
    )


def ok(result) -> dict:
    assert result.code == 0, result.err
    return json.loads(result.out)


def current(adb_device) -> str:
    return os.readlink(adb_device.host_path(f"{ROOT}/current"))


def run_hello(adb_device) -> str:
    result = AdbTransport(adb_device.device(root=ROOT), connect_timeout=5).run(
        [f"{ROOT}/current/bin/hello"], env=RELEASE_LIBS
    )
    assert result.ok, result.stderr
    return result.text()


def test_deploy_redeploy_changed_library_and_rollback_over_adb(kz, adb_device, artifacts):
    first = ok(adb_deploy(kz, adb_device, artifacts.make("b1")))
    assert first["device"] == f"adb:{adb_device.serial}" and first["files_sent"] == 3
    assert current(adb_device) == "releases/b1"
    assert run_hello(adb_device) == "hello from v1\nblob 65536\n"

    again = ok(adb_deploy(kz, adb_device, artifacts.make("b1")))
    assert (again["bytes_sent"], again["files_sent"], again["switched"]) == (0, 0, False)

    build2 = artifacts.make("b2", greeting="hello from v2")
    changed = ok(adb_deploy(kz, adb_device, build2))
    assert changed["files_sent"] == 1
    assert 0 < changed["bytes_sent"] <= (build2 / "lib" / "libgreet.so").stat().st_size
    assert run_hello(adb_device) == "hello from v2\nblob 65536\n"

    back = ok(
        kz(
            "deploy",
            "--device",
            f"adb:{adb_device.serial}:{ROOT}",
            "--rollback",
            "--keep",
            "1",
            "--json",
        )
    )
    assert (back["release"], back["pruned"]) == ("b1", ["b2"])
    assert run_hello(adb_device) == "hello from v1\nblob 65536\n"


def test_an_executable_with_spaces_and_quotes_in_its_path_runs_after_a_deploy_over_adb(
    kz, adb_device, artifacts
):
    build = artifacts.make("b1")
    (build / "bin" / "hello").rename(
        build / "bin" / 'it\'s a "hello"'
    )  # the list of executables reaches xargs -0
    write_manifest(build, "b1")
    ok(adb_deploy(kz, adb_device, build))
    result = AdbTransport(adb_device.device(root=ROOT), connect_timeout=5).run(
        [f'{ROOT}/current/bin/it\'s a "hello"'], env=RELEASE_LIBS
    )
    assert (result.returncode, result.text()) == (0, "hello from v1\nblob 65536\n")


def test_a_push_cut_over_adb_keeps_current_and_the_rerun_completes(kz, adb_device, artifacts):
    ok(adb_deploy(kz, adb_device, artifacts.make("b1")))
    blob_size = PUSH_PIECE + (1 << 19)  # pushed in two pieces: 8 MiB and 512 KiB
    build2 = artifacts.make("b2", greeting="hello from v2", blob_seed=2, blob_size=blob_size)
    adb_device.drop_send_after(PUSH_PIECE + 100_000)  # in whichever order, one piece arrived
    cut = adb_deploy(kz, adb_device, build2)
    assert cut.code == DeviceError.exit_code
    assert f"adb:{adb_device.serial}" in cut.err
    assert current(adb_device) == "releases/b1"
    assert run_hello(adb_device) == "hello from v1\nblob 65536\n"
    rerun = ok(adb_deploy(kz, adb_device, build2))
    assert current(adb_device) == "releases/b2"
    assert rerun["files_sent"] == 2  # libgreet and libblob changed
    assert rerun["bytes_resumed"] >= 1 << 19  # the pieces that had arrived are not sent again
    assert run_hello(adb_device) == f"hello from v2\nblob {blob_size}\n"


def test_a_rotten_piece_left_by_a_cut_push_fails_the_check_and_is_sent_again(
    kz, adb_device, artifacts
):
    ok(adb_deploy(kz, adb_device, artifacts.make("b1")))
    blob_size = PUSH_PIECE + 1000
    build2 = artifacts.make("b2", greeting="hello from v2", blob_seed=2, blob_size=blob_size)
    blob = build2 / "lib" / "libblob.so"
    # what a cut push left: the first piece whole, with one byte that storage turned
    rotten = bytearray(blob.read_bytes()[:PUSH_PIECE])
    rotten[10] ^= 0xFF
    incoming = adb_device.host_path(f"{ROOT}/incoming")
    (incoming / f"{sha256(blob)}.0").write_bytes(rotten)

    rerun = ok(adb_deploy(kz, adb_device, build2))
    assert rerun["bytes_resumed"] == PUSH_PIECE  # taken as arrived, then the joined file failed
    assert rerun["bytes_sent"] >= blob_size  # so all of its pieces were sent again
    assert run_hello(adb_device) == f"hello from v2\nblob {blob_size}\n"
    assert assert_store_invariant(adb_device.host_path(ROOT)) == "b2"
    assert not list(incoming.iterdir())  # neither the rotten piece nor any other is left


def test_kept_contents_are_hashed_during_the_push_and_rot_in_them_is_repaired(
    kz, adb_device, artifacts
):
    build1 = artifacts.make("b1")
    ok(adb_deploy(kz, adb_device, build1))
    build2 = artifacts.make("b2", greeting="hello from v2")  # keeps hello and libblob of b1
    changed = ok(adb_deploy(kz, adb_device, build2))
    assert changed["files_sent"] == 1 and changed["repaired"] == []
    # the first command's background sha256sum of the kept contents gave its verdict
    verdict = adb_device.host_path(f"{ROOT}/.switch/.kz-kept").read_text().split()
    assert verdict[0] == "ok" and len(verdict) == 2
    blob = json.loads((build1 / "manifest.json").read_text())["files"]["lib/libblob.so"]
    flip_byte(adb_device.host_path(f"{ROOT}/objects/{blob['sha256']}"))  # rot in what b3 keeps
    build3 = artifacts.make("b3", greeting="hello from v3")
    third = ok(adb_deploy(kz, adb_device, build3))
    assert adb_device.host_path(f"{ROOT}/.switch/.kz-kept").read_text().split()[0] == "bad"
    assert "releases/b3/lib/libblob.so" in third["repaired"]
    assert current(adb_device) == "releases/b3"
    assert run_hello(adb_device) == "hello from v3\nblob 65536\n"
    assert_store_invariant(adb_device.host_path(ROOT))


class Recording(AdbTransport):
    """The adb transport, noting when each device command with stdin starts (the one that checks
    what was pushed, or another) and when the push ends."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.events: list[tuple[str, float]] = []

    def run_input(self, argv, data, **options):
        self.events.append(("check" if PUSHED_SCRIPT in argv else "command", time.monotonic()))
        return super().run_input(argv, data, **options)

    def push_files(self, files, remote, **options):
        super().push_files(files, remote, **options)
        self.events.append(("pushed", time.monotonic()))


def test_a_first_deploy_hashes_each_content_as_it_arrives_in_a_command_started_with_the_push(
    adb_device, artifacts
):
    build = artifacts.make("b1", blob_size=4 << 20)
    adb_device.faults.send_delay = 0.01  # a slow cable: 64 KiB per 10 ms
    transport = Recording(adb_device.device(root=ROOT), connect_timeout=5)
    result = deploy.deploy(transport, adb_device.device(root=ROOT), load_artifact(build))
    assert result.files_sent == 3 and current(adb_device) == "releases/b1"
    kinds = [kind for kind, _ in transport.events]
    # the command that checks, stores, releases and switches started before the push ended
    assert kinds.index("check") < kinds.index("pushed")
    files = json.loads((build / "manifest.json").read_text())["files"].values()
    names = sorted(entry["sha256"] for entry in files)
    sums = adb_device.host_path(f"{ROOT}/.switch/.kz-sums").read_text().split()
    assert sorted(sums[1::2]) == names and sums[::2] == sums[1::2]  # "SHA  SHA" for each
    assert_store_invariant(adb_device.host_path(ROOT))


def pushed_check(adb_device, names: list[str], lines: list[str]) -> RemoteResult:
    """PUSHED_SCRIPT on the device with a sums file, fed ``lines`` as the push's gate."""
    incoming = f"{ROOT}/incoming"
    sums = f"{ROOT}/.switch/{SUMS_FILE}"
    step = Step(PUSHED_SCRIPT, (incoming + "/", "0", "", sums, *names), "checking")
    transport = AdbTransport(adb_device.device(root=ROOT), connect_timeout=5)
    return transport.run_input(step.argv, iter([("\n".join(lines) + "\n").encode()]))


def stored_contents(adb_device, *contents: bytes) -> list[str]:
    names = []
    for folder in ("incoming", "objects", ".switch"):
        adb_device.host_path(f"{ROOT}/{folder}").mkdir(parents=True, exist_ok=True)
    for data in contents:
        name = hashlib.sha256(data).hexdigest()
        adb_device.host_path(f"{ROOT}/incoming/{name}").write_bytes(data)
        names.append(name)
    return names


def test_the_gated_check_stores_only_what_it_hashed_once_each(adb_device) -> None:
    a, b = stored_contents(adb_device, b"alpha", b"beta")
    objects = adb_device.host_path(f"{ROOT}/objects")
    # a content the gate never named is hashed by nobody: not stored (the host names each one
    # once, see test_a_gate_names_each_content_once)
    missed = pushed_check(adb_device, [a, b], [a, "/"])
    assert missed.returncode == MISMATCH and not (objects / b).exists()
    assert (objects / a).read_bytes() == b"alpha"  # what matched is stored, as without a gate
    # a content that turned on the device after it arrived
    adb_device.host_path(f"{ROOT}/incoming/{b}").write_bytes(b"betA")
    turned = pushed_check(adb_device, [b], [b, "/"])
    assert turned.returncode == MISMATCH and not (objects / b).exists()
    # the push ended without its "/": nothing is stored
    adb_device.host_path(f"{ROOT}/incoming/{b}").write_bytes(b"beta")
    cut = pushed_check(adb_device, [b], [b])
    assert cut.returncode == 1 and not (objects / b).exists()
    whole = pushed_check(adb_device, [b], [b, "/"])
    assert whole.returncode == 0 and (objects / b).read_bytes() == b"beta"


def test_a_gate_names_each_content_once() -> None:
    gate = Gate()
    gate.stored("a" * 64)
    with pytest.raises(ValueError, match="twice"):
        gate.stored("a" * 64)
    gate.stored("b" * 64)
    gate.close(pushed=True)
    assert b"".join(gate.lines()) == f"{'a' * 64} {'b' * 64}\n/\n".encode()
    cut = Gate()
    cut.close(pushed=False)
    with pytest.raises(DeviceError, match="the push did not finish"):
        list(cut.lines())
