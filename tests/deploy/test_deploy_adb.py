"""The deploy flow through the real adb client against the adb test device (tests/adbdevice)."""

from __future__ import annotations

import json
import os

from kzbuild.device.adb import AdbTransport
from kzbuild.device.chunkstore import PUSH_PIECE
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
