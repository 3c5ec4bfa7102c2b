"""The deploy flow over ssh to a real sshd on 127.0.0.1 (the device root is a temp dir here)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from kzbuild.errors import DeviceError
from tests.fixtures_deploy import whole_chunks


def ssh_deploy(kz, sshd, root: Path, artifact: Path, *extra: str, port: int | None = None):
    return kz(
        "deploy", "--device", sshd.spec(root, port), "--artifact", str(artifact), "--json", *extra
    )


def ok(result) -> dict:
    assert result.code == 0, result.err
    return json.loads(result.out)


def run_hello_over_ssh(kz, sshd, root: Path) -> str:
    from kzbuild.device.registry import connect, parse_device_spec

    transport = connect(parse_device_spec(sshd.spec(root)))
    try:
        result = transport.run(
            [f"{root}/current/bin/hello"], env={"LD_LIBRARY_PATH": f"{root}/current/lib"}
        )
    finally:
        transport.close()
    assert result.ok, result.stderr
    return result.text()


def test_deploy_redeploy_and_one_changed_library(kz, sshd, ssh_home, artifacts, tmp_path):
    root = tmp_path / "device"
    first = ok(ssh_deploy(kz, sshd, root, artifacts.make("b1")))
    assert first["device"] == f"ssh://{sshd.user}@127.0.0.1:{sshd.port}"
    assert first["files_sent"] == 3 and first["bytes_sent"] > 0
    assert os.readlink(root / "current") == "releases/b1"
    assert run_hello_over_ssh(kz, sshd, root) == "hello from v1\nblob 65536\n"

    again = ok(ssh_deploy(kz, sshd, root, artifacts.make("b1")))
    assert (
        again["bytes_sent"],
        again["files_sent"],
        again["metadata_bytes"],
        again["switched"],
    ) == (0, 0, 0, False)

    build2 = artifacts.make("b2", greeting="hello from v2")
    changed = ok(ssh_deploy(kz, sshd, root, build2))
    assert changed["files_sent"] == 1 and changed["files_skipped"] == 2
    assert 0 < changed["bytes_sent"] <= (build2 / "lib" / "libgreet.so").stat().st_size
    assert run_hello_over_ssh(kz, sshd, root) == "hello from v2\nblob 65536\n"


def settled_size(folder: Path, skip: set[str], quiet: float = 1.0, limit: float = 30.0) -> int:
    """Bytes of the files in ``folder`` (but ``skip`` and dot files) once they have not changed for
    ``quiet`` seconds."""
    deadline = time.monotonic() + limit
    last = -1
    while True:
        size = sum(
            p.stat().st_size
            for p in folder.iterdir()
            if p.is_file() and p.name not in skip and not p.name.startswith(".")
        )
        if size == last or time.monotonic() > deadline:
            return size
        last = size
        time.sleep(quiet)


def cut_once_chunks_arrived(relay, incoming: Path, original: Path, limit: float = 60.0) -> None:
    """Once ``relay`` holds the connection, wait until whole chunks of ``original`` lie in
    ``incoming`` and it is quiet, then cut the connection (at the latest after ``limit`` s)."""
    deadline = time.monotonic() + limit
    try:
        if relay.held.wait(limit):
            while time.monotonic() < deadline:
                settled_size(incoming, skip=set(), quiet=0.5, limit=limit)
                if whole_chunks(incoming, original) > 0:
                    break
    finally:
        relay.cut_now()


def test_cut_mid_transfer_keeps_current_then_a_rerun_resumes(
    kz, sshd, ssh_home, relay, artifacts, tmp_path
):
    root = tmp_path / "device"
    ok(ssh_deploy(kz, sshd, root, artifacts.make("b1")))
    big = 3 * 1024 * 1024
    build2 = artifacts.make("b2", blob_seed=2, blob_size=big)
    blob = build2 / "lib" / "libblob.so"
    blob_sha = json.loads((build2 / "manifest.json").read_text())["files"]["lib/libblob.so"][
        "sha256"
    ]
    # sshd drops the bytes it holds for the device's tar when the connection goes (up to its
    # channel window, 2 MiB): on a busy machine that was once all but the first 64 KiB, no whole
    # chunk, nothing to resume. So the link stalls mid-stream, and is cut once chunks are stored.
    relay.cut_after(big // 2, hold=True)
    cutter = threading.Thread(
        target=cut_once_chunks_arrived, args=(relay, root / "incoming", blob), daemon=True
    )
    cutter.start()
    cut = ssh_deploy(kz, sshd, root, build2, port=relay.port)
    cutter.join()
    assert relay.held.is_set() and relay.cut.is_set()
    assert cut.code == DeviceError.exit_code, cut.err
    assert f"connection to 127.0.0.1:{relay.port} lost" in " ".join(cut.err.split())
    assert os.readlink(root / "current") == "releases/b1"
    assert run_hello_over_ssh(kz, sshd, root) == "hello from v1\nblob 65536\n"
    # chunks of libblob arrived in incoming/, the last one cut short; measure once the device's tar
    # is quiet. Only chunks count: a cut that lands on a tar block boundary lets the device start
    # putting libblob together from the chunks it has (a partial file under its sha256, never
    # stored).
    arrived = settled_size(root / "incoming", skip={blob_sha})
    assert 0 < arrived < big
    assert not (root / "objects" / blob_sha).exists() and not (root / "releases" / "b2").exists()

    whole = whole_chunks(root / "incoming", blob)
    assert 0 < whole <= arrived
    rerun = ok(ssh_deploy(kz, sshd, root, build2))
    assert rerun["bytes_resumed"] == whole  # at most the chunk that was cut is sent again
    assert rerun["bytes_sent"] == blob.stat().st_size - rerun["bytes_resumed"]
    assert os.readlink(root / "current") == "releases/b2"
    assert run_hello_over_ssh(kz, sshd, root) == f"hello from v1\nblob {big}\n"


def test_unknown_host_is_refused_and_trust_new_host_stores_it(
    kz, sshd, ssh_home, artifacts, tmp_path
):
    ssh_home.known_hosts.write_text("")
    build = artifacts.make("b1")
    refused = ssh_deploy(kz, sshd, tmp_path / "device", build)
    assert refused.code == DeviceError.exit_code
    err = "".join(refused.err.split())  # rich may wrap long lines anywhere
    assert (
        "unknownhostkey" in err
        and sshd.host_fingerprint in err
        and str(ssh_home.known_hosts) in err
    )
    assert not (tmp_path / "device").exists()
    trusted = ok(ssh_deploy(kz, sshd, tmp_path / "device", build, "--trust-new-host"))
    assert trusted["files_sent"] == 3
    assert ssh_home.known_hosts.read_text() == sshd.known_hosts_line()


def test_rollback_and_keep_over_ssh(kz, sshd, ssh_home, artifacts, tmp_path):
    root = tmp_path / "device"
    for index in (1, 2, 3):
        ok(ssh_deploy(kz, sshd, root, artifacts.make(f"b{index}", greeting=f"hello from v{index}")))
    back = ok(kz("deploy", "--device", sshd.spec(root), "--rollback", "--keep", "2", "--json"))
    assert (back["release"], back["previous"], back["pruned"]) == ("b2", "b3", ["b1"])
    assert run_hello_over_ssh(kz, sshd, root) == "hello from v2\nblob 65536\n"
    assert sorted(p.name for p in (root / "releases").iterdir()) == ["b2", "b3"]


def test_a_named_ssh_device_with_its_key(kz, project, sshd, ssh_home, artifacts, tmp_path):
    (ssh_home.path / ".ssh" / "id_ed25519").unlink()  # only the key named in devices.yaml works
    root = tmp_path / "device"
    project.write(
        "recipes/devices.yaml",
        "devices:\n"
        "  box:\n"
        "    transport: ssh\n"
        f"    host: 127.0.0.1\n    port: {sshd.port}\n    user: {sshd.user}\n"
        f"    key: {sshd.client_key}\n    root: {root}\n",
    )
    summary = ok(kz("deploy", "--device", "box", "--artifact", str(artifacts.make("b1")), "--json"))
    assert summary["files_sent"] == 3
    assert os.readlink(root / "current") == "releases/b1"
