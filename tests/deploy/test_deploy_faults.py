"""Deploys survive faults: kill -9 at many points, concurrent writers, two machines, a full disk.

Over the local, ssh (real sshd) and adb (the test device) transports. Killed and concurrent
runs are ``python -m tests.deploy.fault_driver`` subprocesses (a real process, a real
SIGKILL); afterwards :func:`assert_store_invariant` checks the device store file by file.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kzbuild.build.artifacts import load_artifact
from kzbuild.device import devicelock
from kzbuild.device.chunkstore import split
from kzbuild.errors import Busy, DeviceError
from tests.deploy import fault_driver
from tests.fixtures_deploy import (
    NoSpaceTransport,
    assert_store_invariant,
    flip_byte,
    pids_where,
    small_edit,
)

ADB_ROOT = "/data/local/tmp/kz-engine"


@dataclass
class Target:
    """A device for the tests: its --device spec and where its root is on this machine."""

    kind: str
    spec: str
    root: Path
    home: Path | None = None  # an adb test device's HOME, in the environment of its commands


@pytest.fixture(params=["local", "ssh", "adb"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    if request.param == "local":
        return Target("local", f"local:{tmp_path / 'device'}", tmp_path / "device")
    if request.param == "ssh":
        sshd = request.getfixturevalue("sshd")
        request.getfixturevalue("ssh_home")
        return Target("ssh", sshd.spec(tmp_path / "device"), tmp_path / "device")
    adb_device = request.getfixturevalue("adb_device")
    return Target(
        "adb",
        f"adb:{adb_device.serial}:{ADB_ROOT}",
        adb_device.host_path(ADB_ROOT),
        adb_device.fs.root,
    )


@dataclass
class Finished:
    code: int
    out: str
    err: str

    @property
    def flat_err(self) -> str:
        return " ".join(self.err.split())  # rich wraps long lines


class Spawner:
    """Starts ``kzbuild`` through the fault driver as a separate process against the test
    project."""

    def __init__(self, project) -> None:  # type: ignore[no-untyped-def]
        self.project = project

    def start(
        self,
        *args: str,
        kill_at: int | None = None,
        slow: float = 0.0,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[str]:
        kz = [
            "--project",
            str(self.project.root),
            "--cache-dir",
            str(self.project.cache),
            "--work-dir",
            str(self.project.work),
            *args,
        ]
        return subprocess.Popen(
            fault_driver.command(kz, kill_at=kill_at, slow=slow),
            cwd=fault_driver.REPO,
            env={**os.environ, "COLUMNS": "200", **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    @staticmethod
    def finish(process: subprocess.Popen[str]) -> Finished:
        out, err = process.communicate(timeout=120)
        return Finished(process.returncode, out, err)

    def run(self, *args: str, **options) -> Finished:  # type: ignore[no-untyped-def]
        return self.finish(self.start(*args, **options))


@pytest.fixture
def spawn(project) -> Spawner:  # type: ignore[no-untyped-def]
    return Spawner(project)


@pytest.fixture
def clean_lock_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The default lease and this host's real name, whatever the environment says."""
    monkeypatch.delenv(devicelock.LEASE_ENV, raising=False)
    monkeypatch.delenv(devicelock.HOST_ENV, raising=False)
    yield


def deploy_args(target: Target, artifact: Path, *extra: str) -> list[str]:
    return ["deploy", "--device", target.spec, "--artifact", str(artifact), "--json", *extra]


def deployed(kz, target: Target, artifact: Path, *extra: str) -> dict:  # type: ignore[no-untyped-def]
    result = kz(*deploy_args(target, artifact, *extra))
    assert result.code == 0, result.err
    return json.loads(result.out)


def last_logged(root: Path) -> str:
    return (root / "deploys.log").read_text().splitlines()[-1].split("\t")[2]


def lock_left(root: Path) -> bool:
    return (root / ".lock").exists()


def device_processes(home: Path) -> list[int]:
    """The pids of the processes an adb test device's commands started (their environment holds
    the device's HOME, which its shell sets)."""
    marker = b"HOME=" + bytes(home)
    return pids_where(lambda entry: marker in (entry / "environ").read_bytes().split(b"\0"))


def no_device_processes_within(home: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while device_processes(home):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# a deploy of b2 over b1 (two changed libraries) makes 3 device operations: 1 lock, state and
# inventory (one sequence, kzbuild.device.steps), 2 chunk lists up (the device answers which
# chunks it lacks), 3 refresh, one tar stream of chunks (and, last, the release's own tar of the
# manifest and hard links, as a file) that ends in assembly, sha256sum and the store moves on the
# device, then sha256sum of the contents b1 left in the store, the release, switch and unlock. A
# kill at 2 or 3 cuts that command's input in half: half the lists, half the stream (so no
# release, no switch). Over adb no chunk lists go up: the contents are a push of a staged dir (2,
# cut after half its bytes), and the command that checks and stores them also hashes what b1
# left, builds the release (3, cut in its half), switches and unlocks. bench_faults.py kills at
# each.
KILL_POINTS = {"local": (1, 2, 3), "ssh": (2, 3), "adb": (2, 3)}
# the same with b2 a small edit of b1's library, sent as deltas (not over adb)
DELTA_KILL_POINTS = {"local": (2, 3), "ssh": (2, 3)}


def delta_builds(artifacts) -> tuple[Path, Path, Path]:  # type: ignore[no-untyped-def]
    """b1 with a 2 MiB library; b2 and b3, two other small edits of it."""
    data = random.Random(11).randbytes(2 << 20)
    edits = [small_edit(data, random.Random(seed)) for seed in (2, 3)]
    return (
        artifacts.make("b1", extra={"lib/libdata.so": data}),
        artifacts.make("b2", extra={"lib/libdata.so": edits[0]}),
        artifacts.make("b3", extra={"lib/libdata.so": edits[1]}),
    )


def library_chunks(build: Path) -> dict[str, int]:
    library = build / "lib" / "libdata.so"
    return {piece.name: piece.size for piece in split(library, library.stat().st_size)}


@pytest.mark.parametrize(
    ("target", "point", "delta"),
    [(kind, point, False) for kind, points in KILL_POINTS.items() for point in points]
    + [(kind, point, True) for kind, points in DELTA_KILL_POINTS.items() for point in points],
    indirect=["target"],
)
def test_kill_9_mid_deploy_then_a_fresh_deploy_recovers(
    kz, spawn, target, artifacts, point, delta, clean_lock_env
):
    if delta:
        build1, build2, _ = delta_builds(artifacts)
    else:
        build1 = artifacts.make("b1")
        build2 = artifacts.make("b2", greeting="hello from v2", blob_seed=2)
    deployed(kz, target, build1)
    killed = spawn.run(*deploy_args(target, build2), kill_at=point)
    assert killed.code == -signal.SIGKILL, killed.err
    assert lock_left(target.root)  # held by a dead process
    assert assert_store_invariant(target.root) == "b1"
    if target.home is not None:  # no device command of the dead kzbuild waits on (say, the push)
        assert no_device_processes_within(target.home, 5.0)

    fresh = deployed(
        kz, target, build2
    )  # no --wait: a dead holder on this host is recovered at once
    assert fresh["release"] == "b2"
    assert not delta or fresh["bytes_sent"] < 100_000  # still a delta against b1's chunks
    assert assert_store_invariant(target.root) == "b2"
    assert not lock_left(target.root)


def test_concurrent_deploys_one_waits_one_finishes_first(
    kz, spawn, target, artifacts, clean_lock_env
):
    deployed(kz, target, artifacts.make("b1"))
    builds = [
        artifacts.make("b2", greeting="v2", blob_seed=2),
        artifacts.make("b3", greeting="v3", blob_seed=3),
    ]
    runs = [spawn.start(*deploy_args(target, build, "--wait", "60"), slow=0.02) for build in builds]
    finished = [spawn.finish(run) for run in runs]
    assert [run.code for run in finished] == [0, 0], [run.err for run in finished]
    current = assert_store_invariant(target.root)
    assert current in ("b2", "b3") and current == last_logged(target.root)
    assert not lock_left(target.root)


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_concurrent_deploy_without_wait_the_loser_exits_10_naming_the_holder(
    kz, spawn, target, artifacts, clean_lock_env
):
    deployed(kz, target, artifacts.make("b1"))
    build2 = artifacts.make("b2", greeting="v2", blob_seed=2)
    slow = spawn.start(*deploy_args(target, build2), slow=1.0)
    while not lock_left(target.root):
        assert slow.poll() is None, spawn.finish(slow).err
    loser = spawn.run(*deploy_args(target, artifacts.make("b3", greeting="v3", blob_seed=3)))
    winner = spawn.finish(slow)
    assert winner.code == 0, winner.err
    assert loser.code == Busy.exit_code, loser.err
    assert f"is busy: deploy by {devicelock.host_name()} pid {slow.pid} since" in loser.flat_err
    assert "--wait SECONDS" in loser.flat_err
    assert assert_store_invariant(target.root) == "b2"


@pytest.mark.parametrize(
    ("target", "other"),
    [("local", "keep"), ("ssh", "rollback"), ("adb", "keep")],
    indirect=["target"],
)
def test_deploy_against_rollback_or_keep_1_leaves_a_complete_current(
    kz, spawn, target, artifacts, other, clean_lock_env
):
    deployed(kz, target, artifacts.make("b1"))
    deployed(kz, target, artifacts.make("b2", greeting="v2", blob_seed=2))
    deploy = spawn.start(
        *deploy_args(target, artifacts.make("b3", greeting="v3", blob_seed=3), "--wait", "60"),
        slow=0.02,
    )
    second = (
        ["deploy", "--device", target.spec, "--rollback", "--wait", "60"]
        if other == "rollback"
        else deploy_args(target, artifacts.make("b1"), "--keep", "1", "--wait", "60")
    )
    finished = [spawn.finish(deploy), spawn.run(*second, slow=0.02)]
    assert [run.code for run in finished] == [0, 0], [run.err for run in finished]
    current = assert_store_invariant(target.root)
    assert current == last_logged(target.root)
    if other == "keep":
        assert len(list((target.root / "releases").iterdir())) in (
            1,
            2,
        )  # b1 alone, or b1 and a later b3


@pytest.mark.parametrize("target", ["local", "adb"], indirect=True)
def test_two_machines_a_dead_holder_elsewhere_is_recovered_by_its_lease(
    kz, spawn, target, artifacts, monkeypatch
):
    deployed(kz, target, artifacts.make("b1"))
    build2 = artifacts.make("b2", greeting="v2", blob_seed=2)
    killed = spawn.run(
        *deploy_args(target, build2), kill_at=3, env={devicelock.HOST_ENV: "machine-one"}
    )
    assert killed.code == -signal.SIGKILL

    monkeypatch.setenv(
        devicelock.HOST_ENV, "machine-two"
    )  # the pid of machine-one says nothing here
    refused = kz(*deploy_args(target, build2))
    assert refused.code == Busy.exit_code
    assert f"is busy: deploy by machine-one pid {killed_pid(target.root)} since" in " ".join(
        refused.err.split()
    )
    assert assert_store_invariant(target.root) == "b1"

    monkeypatch.setenv(devicelock.LEASE_ENV, "1")
    recovered = deployed(
        kz, target, build2, "--wait", "10"
    )  # waits until the heartbeat is over 1 s old
    assert recovered["release"] == "b2"
    assert assert_store_invariant(target.root) == "b2" and not lock_left(target.root)


def killed_pid(root: Path) -> int:
    return int((root / ".lock" / "owner").read_text().splitlines()[1])


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_two_machines_deploying_at_once_take_turns(kz, spawn, target, artifacts, clean_lock_env):
    deployed(kz, target, artifacts.make("b1"))
    runs = [
        spawn.start(
            *deploy_args(
                target, artifacts.make(f"b{n}", greeting=f"v{n}", blob_seed=n), "--wait", "60"
            ),
            slow=0.02,
            env={devicelock.HOST_ENV: f"machine-{n}"},
        )
        for n in (2, 3)
    ]
    finished = [spawn.finish(run) for run in runs]
    assert [run.code for run in finished] == [0, 0], [run.err for run in finished]
    assert assert_store_invariant(target.root) == last_logged(target.root)


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_models_push_waits_for_a_deploy(kz, spawn, target, artifacts, tmp_path, clean_lock_env):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + os.urandom(50_000))
    deploy = spawn.start(*deploy_args(target, artifacts.make("b1")), slow=0.1)
    while not lock_left(target.root):
        assert deploy.poll() is None, spawn.finish(deploy).err
    push = kz("models", "push", str(model), "--device", target.spec, "--wait", "60", "--json")
    assert push.code == 0, push.err
    assert spawn.finish(deploy).code == 0
    assert assert_store_invariant(target.root) == "b1"
    assert (target.root / "models" / "m.gguf").read_bytes() == model.read_bytes()


def test_a_lock_judged_stale_is_only_removed_while_it_holds_that_token(tmp_path):
    from kzbuild.device.local import LocalTransport
    from kzbuild.device.store import Layout, Remote

    root = tmp_path / "device"
    remote, layout = Remote(LocalTransport(str(root))), Layout(str(root))
    held = devicelock.acquire(remote, layout, "deploy", wait=0)
    assert devicelock.remove_if_held_by(remote, layout, "a-token-judged-stale-earlier") is False
    assert (root / ".lock" / "owner").read_text().splitlines()[4] == held.owner.token
    held.refresh()
    held.release()
    assert not lock_left(root)
    successor = devicelock.acquire(remote, layout, "deploy", wait=0)
    with pytest.raises(Busy, match="lost its lock"):
        held.refresh()
    successor.release()
    assert not lock_left(root)


def test_a_lock_released_between_the_mkdir_and_the_look_at_it_is_taken_on_the_next_try(
    tmp_path, monkeypatch
):
    """Two deploys at once: the mkdir of one fails as the other holds the lock, and the holder
    releases it before the look that follows; that is no error, the lock is free again."""
    from kzbuild.device.local import LocalTransport
    from kzbuild.device.store import Layout, Remote

    fake = tmp_path / "bin"
    fake.mkdir()
    raced = tmp_path / "raced"
    real = subprocess.run(["sh", "-c", "command -v mkdir"], capture_output=True, text=True)
    (fake / "mkdir").write_text(
        "#!/bin/sh\n"
        "for a; do last=$a; done\n"
        f"case $last in */.lock) if [ ! -e {raced} ]; then : > {raced}; "
        "echo \"mkdir: cannot create directory '$last': File exists\" >&2; exit 1; fi ;; esac\n"
        f'exec {real.stdout.strip()} "$@"\n'
    )
    (fake / "mkdir").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    root = tmp_path / "device"
    remote, layout = Remote(LocalTransport(str(root))), Layout(str(root))
    held = devicelock.acquire(remote, layout, "deploy", wait=0)
    assert raced.exists()  # the first mkdir of the lock failed as if it were held
    held.release()
    assert not lock_left(root)


# --- a full disk ---
@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs as the device root; skipped where mounting is not permitted."""
    root = tmp_path / "device"
    root.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "kz-test", str(root)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or 'mount failed'}")
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=True)


def grow(disk: Path) -> None:
    subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)


@pytest.mark.parametrize(
    ("target", "blob_size"),
    [("local", 1 << 20), ("ssh", 1 << 20), ("local", 200 << 10)],
    indirect=["target"],
)
def test_a_full_disk_is_exit_8_naming_device_and_path_then_the_deploy_completes(
    kz, small_disk, target, artifacts, blob_size, clean_lock_env
):
    """1 MiB: the disk fills up while the stream arrives; 200 KiB (3 chunks): the chunks arrive,
    then the disk
    fills up while the file is put together from them (no corruption: a full disk)."""
    assert target.root == small_disk
    deployed(kz, target, artifacts.make("b1"))
    build2 = artifacts.make("b2", greeting="v2", blob_seed=2, blob_size=blob_size)
    full = kz(*deploy_args(target, build2))
    assert full.code == DeviceError.exit_code, full.err
    message = " ".join(full.err.split())
    device = target.spec.removesuffix(str(small_disk)) if target.kind == "ssh" else target.spec
    assert f"error: device {device} is full:" in message and f"{small_disk}/incoming/" in message
    assert assert_store_invariant(small_disk) == "b1" and not lock_left(small_disk)

    grow(small_disk)  # space freed
    again = deployed(kz, target, build2)
    assert again["release"] == "b2" and again["bytes_resumed"] > 0
    assert assert_store_invariant(small_disk) == "b2"


def test_push_failing_with_enospc_keeps_current_over_every_transport(
    kz, target, artifacts, clean_lock_env
):
    from kzbuild.device import deploy
    from kzbuild.device.registry import connect, parse_device_spec

    deployed(kz, target, artifacts.make("b1"))
    build2 = load_artifact(artifacts.make("b2", greeting="v2", blob_seed=2, blob_size=300_000))
    device = parse_device_spec(target.spec)
    transport = NoSpaceTransport(connect(device), budget=100_000)
    try:
        with pytest.raises(DeviceError, match=" is full: writing .*/incoming/") as failed:
            deploy.deploy(transport, device, build2)
    finally:
        transport.close()
    assert failed.value.exit_code == DeviceError.exit_code
    assert assert_store_invariant(target.root) == "b1" and not lock_left(target.root)
    assert deployed(kz, target, build2.path)["release"] == "b2"
    assert assert_store_invariant(target.root) == "b2"


def test_two_processes_recovering_one_dead_holders_lock_at_once_both_finish(
    kz, spawn, artifacts, tmp_path, clean_lock_env
):
    target = Target("local", f"local:{tmp_path / 'device'}", tmp_path / "device")
    deployed(kz, target, artifacts.make("b1"))
    killed = spawn.run(
        *deploy_args(target, artifacts.make("b2", greeting="v2", blob_seed=2)), kill_at=2
    )
    assert killed.code == -signal.SIGKILL and lock_left(target.root)
    runs = [
        spawn.start(
            *deploy_args(
                target, artifacts.make(f"b{n}", greeting=f"v{n}", blob_seed=n), "--wait", "60"
            )
        )
        for n in (3, 4)
    ]
    finished = [spawn.finish(run) for run in runs]
    assert [run.code for run in finished] == [0, 0], [run.err for run in finished]
    assert assert_store_invariant(target.root) == last_logged(target.root)
    assert not lock_left(target.root) and not list(target.root.glob(".lock*"))


# --- chunks: a corrupted chunk, an assembly cut short ---
CHUNKED = ["local", "ssh"]  # over adb contents travel whole or in pieces, never chunks


def data_builds(artifacts, seed: int = 7) -> tuple[Path, Path, bytes]:  # type: ignore[no-untyped-def]
    """b1 and b2 with a 2 MiB lib/libdata.so (about 25 chunks) that differs in 64 bytes in the
    middle
    (and another libgreet.so); the data of b1."""
    data = random.Random(seed).randbytes(2 << 20)
    edited = data[:1_000_000] + os.urandom(64) + data[1_000_064:]
    build2 = artifacts.make("b2", greeting="hello from v2", extra={"lib/libdata.so": edited})
    return artifacts.make("b1", extra={"lib/libdata.so": data}), build2, data


@pytest.mark.parametrize("target", CHUNKED, indirect=True)
def test_a_rotten_chunk_is_caught_by_the_file_check_and_replaced(
    kz, target, artifacts, clean_lock_env
):
    build1, build2, data = data_builds(artifacts)
    deployed(kz, target, build1)
    pieces = split(build1 / "lib" / "libdata.so", len(data))
    first = target.root / "chunks" / pieces[0].name  # b2's libdata.so starts with the same chunk
    flip_byte(first, 10)

    summary = deployed(kz, target, build2)
    assert summary["release"] == "b2"
    assert (
        hashlib.sha256(first.read_bytes()).hexdigest().startswith(pieces[0].name)
    )  # sent again, renamed over the rotten one
    assert assert_store_invariant(target.root) == "b2"
    assert kz("device", "verify", "--device", target.spec).code == 0


@pytest.mark.parametrize("target", CHUNKED, indirect=True)
def test_verify_reports_and_drops_a_damaged_chunk_and_deploy_sends_it_again(
    kz, target, artifacts, clean_lock_env
):
    build1, build2, data = data_builds(artifacts)
    deployed(kz, target, build1)
    name = split(build1 / "lib" / "libdata.so", len(data))[0].name
    flip_byte(target.root / "chunks" / name, 10)
    damaged = kz("device", "verify", "--device", target.spec)
    assert damaged.code == DeviceError.exit_code
    assert f"damaged chunk {name}: chunks/{name}" in " ".join(damaged.out.split())
    assert not (target.root / "chunks" / name).exists()
    assert kz("device", "verify", "--device", target.spec).code == 0  # releases were never touched
    summary = deployed(kz, target, build2)
    assert (
        summary["bytes_sent"] < len(data) // 2
    )  # the dropped chunk, the edited ones and libgreet.so's, not all of libdata.so
    assert (target.root / "chunks" / name).exists() and assert_store_invariant(target.root) == "b2"


def test_an_assembly_cut_short_is_assembled_again_never_stored(
    kz, target, artifacts, clean_lock_env
):
    build1, build2, _ = data_builds(artifacts)
    deployed(kz, target, build1)
    # what a device that died in the middle of cat leaves: b2's libdata.so, half assembled
    # (assembly, check and store are one device command, so no kill of kzbuild can leave it)
    entry = json.loads((build2 / "manifest.json").read_text())["files"]["lib/libdata.so"]
    data = (build2 / "lib" / "libdata.so").read_bytes()
    (target.root / "incoming" / entry["sha256"]).write_bytes(data[: len(data) // 2])
    summary = deployed(kz, target, build2)
    assert summary["release"] == "b2"
    assert assert_store_invariant(target.root) == "b2"


@pytest.mark.parametrize("target", ["local", "ssh"], indirect=True)
def test_a_rotten_base_fails_the_file_check_and_its_chunks_are_sent_instead(
    kz, target, artifacts, clean_lock_env
):
    build1, build2, _ = delta_builds(artifacts)
    deployed(kz, target, build1)
    old, new = library_chunks(build1), library_chunks(build2)
    rotten = [target.root / "chunks" / name for name in old.keys() - new.keys()]
    for path in rotten:  # the chunks b2's deltas read: other bytes, the same size
        path.write_bytes(path.read_bytes()[::-1])
    summary = deployed(kz, target, build2)
    assert summary["release"] == "b2"
    # the deltas, then every chunk b1 lacks, sent whole
    assert summary["bytes_sent"] > sum(new[name] for name in new.keys() - old.keys())
    assert not any(path.exists() for path in rotten)  # dropped: one of them had rotted
    assert assert_store_invariant(target.root) == "b2"
    assert kz("device", "verify", "--device", target.spec).code == 0


@pytest.mark.parametrize("target", ["local", "ssh"], indirect=True)
def test_two_delta_deploys_at_once_each_pruning_the_other_both_land(
    kz, spawn, target, artifacts, clean_lock_env
):
    build1, build2, build3 = delta_builds(artifacts)
    deployed(kz, target, build1)
    args = ("--wait", "60", "--keep", "1")
    runs = [
        spawn.start(*deploy_args(target, build, *args), slow=0.02) for build in (build2, build3)
    ]
    finished = [spawn.finish(run) for run in runs]
    assert [run.code for run in finished] == [0, 0], [run.err for run in finished]
    sent = [json.loads(run.out)["bytes_sent"] for run in finished]
    assert max(sent) < 200_000, sent  # both sent deltas, against b1 or the other's release
    current = assert_store_invariant(target.root)
    assert current in ("b2", "b3") and current == last_logged(target.root)
    assert sorted(os.listdir(target.root / "releases")) == [current]
    assert kz("device", "verify", "--device", target.spec).code == 0
