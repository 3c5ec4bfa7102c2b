# ruff: noqa: F811  (the fixtures target and clean_lock_env come from test_deploy_faults)
"""No device is left needing a person: locks with garbage owners or skewed heartbeats are
recovered, bad lock settings are refused before the device is touched; on local, ssh and adb."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from pathlib import Path

import pytest

from kzbuild.device import devicelock
from kzbuild.device.store import LINK_KIND, SYMBOLIC
from kzbuild.errors import Busy, ConfigError, DeviceError
from tests.deploy.test_deploy_faults import Target, clean_lock_env, target  # noqa: F401
from tests.fixtures_deploy import assert_store_invariant

DAY = 86400


def plant_lock(root: Path, owner: str, *, heartbeat: float) -> None:
    """A lock left on the device: ``owner`` as the owner file, its mtime ``heartbeat``."""
    lock = root / ".lock"
    lock.mkdir(parents=True)
    (lock / "owner").write_text(owner)
    os.utime(lock / "owner", (heartbeat, heartbeat))


OWNERS = {
    # a host name holding a newline shifts every field: the pid reads as "evil"
    "newline-host": ("machine\nevil\n123\n2026-01-01T00:00:00Z\ndeploy\ntok-1\n", -2 * DAY),
    "future-heartbeat": ("elsewhere\n123\n2030-01-01T00:00:00Z\ndeploy\ntok-2\n", +30 * DAY),
    "pid-0-here": ("{host}\n0\n2026-01-01T00:00:00Z\ndeploy\ntok-3\n", 0),
    "pid-huge": (
        "elsewhere\n99999999999999999999999\n2026-01-01T00:00:00Z\ndeploy\ntok-4\n",
        -2 * DAY,
    ),
    "pid-huge-here": ("{host}\n9999999999\n2026-01-01T00:00:00Z\ndeploy\ntok-5\n", 0),
    "empty": ("", -2 * DAY),
    "binary": ("\x00\xff\n\n\n\n\n", -2 * DAY),
}


@pytest.mark.parametrize("case", sorted(OWNERS))
def test_a_lock_with_a_garbage_owner_is_recovered(kz, target, artifacts, case, clean_lock_env):
    first = kz("deploy", "--device", target.spec, "--artifact", str(artifacts.make("b1")), "--json")
    assert first.code == 0, first.err
    owner, offset = OWNERS[case]
    plant_lock(target.root, owner.format(host=socket.gethostname()), heartbeat=time.time() + offset)
    build2 = artifacts.make("b2", greeting="v2", blob_seed=2)
    result = kz("deploy", "--device", target.spec, "--artifact", str(build2), "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["release"] == "b2" and "breaking the stale lock" in result.err
    assert assert_store_invariant(target.root) == "b2" and not (target.root / ".lock").exists()


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_a_live_lock_with_an_unreadable_owner_waits_for_the_lease(
    kz, target, artifacts, clean_lock_env
):
    plant_lock(
        target.root, "elsewhere\n99999999999999999999999\nx\ndeploy\ntok\n", heartbeat=time.time()
    )
    result = kz("deploy", "--device", target.spec, "--artifact", str(artifacts.make("b1")))
    assert result.code == Busy.exit_code and "is busy" in " ".join(result.err.split())
    assert (target.root / ".lock").is_dir()


@pytest.mark.parametrize("lease", ["nan", "inf", "-inf", "-1", "0", "1e400", "ten", "", " 5"])
@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_a_bad_lease_is_refused_before_the_device_is_touched(
    kz, target, artifacts, lease, monkeypatch
):
    monkeypatch.setenv(devicelock.LEASE_ENV, lease)
    result = kz("deploy", "--device", target.spec, "--artifact", str(artifacts.make("b1")))
    if lease == " 5":  # float() takes blanks around a number
        assert result.code == 0, result.err
        return
    assert result.code == ConfigError.exit_code, result.err
    assert devicelock.LEASE_ENV in result.err and "Traceback" not in result.err
    assert not (target.root / ".lock").exists()


@pytest.mark.parametrize("host", ["two\nlines", "tab\there", ""])
@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_a_host_name_that_would_garble_the_owner_file_is_refused(
    kz, target, artifacts, host, monkeypatch
):
    monkeypatch.setenv(devicelock.HOST_ENV, host)
    result = kz("deploy", "--device", target.spec, "--artifact", str(artifacts.make("b1")))
    assert result.code == (0 if host == "" else ConfigError.exit_code), (
        result.err
    )  # "" is the real name
    assert not (target.root / ".lock").exists()


# --- a wrong kind of file in the store ---------------------------------------------------


def wrong_kind(path: Path, kind: str, outside: Path) -> None:
    """Put a directory, or a symlink to a good copy outside the root, where ``path`` was."""
    data = path.read_bytes()
    path.unlink()
    if kind == "directory":
        path.mkdir()
        (path / "x").write_text("x")
    else:
        outside.write_bytes(data)
        path.symlink_to(outside)


@pytest.mark.parametrize("kind", ["directory", "symlink"])
@pytest.mark.parametrize("where", ["objects", "chunks"])
def test_a_wrong_kind_of_file_in_the_store_is_replaced(
    kz, target, artifacts, tmp_path, kind, where
):
    build1 = artifacts.make("b1")
    assert kz("deploy", "--device", target.spec, "--artifact", str(build1)).code == 0
    store = target.root / where
    if not any(store.iterdir()):  # over adb nothing is cut into chunks: one an older kzbuild left
        (store / hashlib.sha256(b"chunk").hexdigest()[:32]).write_bytes(b"chunk")
    victim = sorted(store.iterdir())[0]
    wrong_kind(victim, kind, tmp_path / "outside")
    verify = kz("device", "verify", "--device", target.spec)
    assert not victim.is_symlink() and not victim.is_dir()  # the wrong entry went
    symbolic = (target.root / LINK_KIND).read_text().strip() == SYMBOLIC
    if where == "objects" and symbolic:  # b1's link to it leads nowhere: damaged, then repaired
        assert verify.code == 8 and "damaged release b1: releases/b1/" in verify.out, verify.err
        repair = kz("deploy", "--device", target.spec, "--artifact", str(build1))
        assert repair.code == 0, repair.err
        verify = kz("device", "verify", "--device", target.spec)
    assert verify.code == 0, verify.out + verify.err  # the releases are whole
    build2 = artifacts.make("b2", greeting="v2", blob_seed=2)
    result = kz("deploy", "--device", target.spec, "--artifact", str(build2))
    assert result.code == 0, result.err
    assert assert_store_invariant(target.root) == "b2"
    assert kz("device", "verify", "--device", target.spec).code == 0
    if kind == "symlink":
        assert (tmp_path / "outside").is_file()  # what the link pointed at is never touched


def test_an_incoming_dir_linked_out_of_the_root_is_replaced(kz, target, artifacts, tmp_path):
    assert kz("deploy", "--device", target.spec, "--artifact", str(artifacts.make("b1"))).code == 0
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    incoming = target.root / "incoming"
    incoming.rmdir()
    incoming.symlink_to(outside)
    build2 = artifacts.make("b2", greeting="v2", blob_seed=2)
    result = kz("deploy", "--device", target.spec, "--artifact", str(build2))
    assert result.code == 0, result.err
    assert list(outside.iterdir()) == [] and incoming.is_dir() and not incoming.is_symlink()
    assert assert_store_invariant(target.root) == "b2"


def test_rollback_with_a_damaged_deploy_log_refuses_naming_it(kz, target, artifacts):
    for name in ("b1", "b2"):
        build = artifacts.make(name, greeting=name, blob_seed=len(name))
        assert kz("deploy", "--device", target.spec, "--artifact", str(build)).code == 0
    log = target.root / "deploys.log"
    log.write_bytes(log.read_bytes()[:-10] + b"\x00garbage\n")
    result = kz("deploy", "--device", target.spec, "--rollback")
    assert result.code == DeviceError.exit_code, result.err
    err = "".join(result.err.split())  # rich may wrap inside the path
    assert "/deploys.logisdamaged(line2)" in err and "nothingwasswitched" in err
    assert assert_store_invariant(target.root) == "b2"


@pytest.mark.parametrize("target", ["local"], indirect=True)
def test_a_models_dir_linked_to_a_bigger_partition_is_kept(kz, target, artifacts, tmp_path):
    bigger = tmp_path / "sdcard-models"
    bigger.mkdir()
    target.root.mkdir(parents=True)
    (target.root / "models").symlink_to(bigger)
    result = kz("deploy", "--device", target.spec, "--artifact", str(artifacts.make("b1")))
    assert result.code == 0, result.err
    assert (target.root / "models").is_symlink() and bigger.is_dir()
