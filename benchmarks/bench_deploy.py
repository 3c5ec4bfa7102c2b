#!/usr/bin/env python3
"""Deploy figures for issue 6: incremental deploys over ssh next to a naive full copy.

    python benchmarks/bench_deploy.py [--artifact DIR] [--libs 8] [--lib-mb 4] [--runs 5] [--link-mbs 40]

A real OpenSSH server on 127.0.0.1 (throwaway keys, as in the tests) is the device. The
artifact is DIR (e.g. a `kzbuild build` output) or a synthetic one: real ELF bin/hello with its
libraries plus ``--libs`` random libraries of ``--lib-mb`` MB.

1. first deploy (empty device): bytes and seconds;
2. no-op redeploy of the same build: bytes (must be 0) and seconds, median of ``--runs``;
   once through the library (connect + deploy) and once as a `kzbuild deploy` subprocess
   (what a user waits, Python start-up included);
3. one changed library: bytes (must equal that library's size) and seconds;
4. naive full copy of the same artifact over ssh, the way upstream's build.py does it:
   `rm -rf` the target, then push every file (connection included, like the deploys).

Loopback moves ~100 MB/s, so bytes barely cost time there; the same cases run again
through a relay limited to ``--link-mbs`` MB/s (a USB/Wi-Fi-like link), where they do.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kzbuild import deploy  # noqa: E402
from kzbuild.artifacts import load_artifact  # noqa: E402
from kzbuild.devices.registry import parse_device_spec  # noqa: E402
from kzbuild.devices.ssh import SshTransport  # noqa: E402
from tests.fixtures_deploy import ArtifactMaker, write_manifest  # noqa: E402
from tests.fixtures_ssh import Relay, SshServer, free_port, keygen  # noqa: E402


def mb(nbytes: int) -> str:
    return f"{nbytes / 1e6:.2f} MB"


def synthetic_artifact(work: Path, libs: int, lib_mb: float) -> Path:
    directory = ArtifactMaker(work / "artifacts", work / "parts").make("bench-1")
    for index in range(libs):
        (directory / "lib" / f"libbench{index}.so").write_bytes(os.urandom(int(lib_mb * 1e6)))
    write_manifest(directory, "bench-1")
    return directory


def changed_copy(artifact: Path, work: Path) -> tuple[Path, str, int]:
    """The artifact with one library rebuilt (new bytes, same size) under a new build id."""
    copy = work / "artifacts" / "bench-2"
    shutil.copytree(artifact, copy, symlinks=True)
    libs = sorted((copy / "lib").glob("*.so*"), key=lambda p: p.stat().st_size)
    victim = libs[len(libs) // 2]
    size = victim.stat().st_size
    victim.unlink()  # hard links or not, never touch the original
    victim.write_bytes(os.urandom(size))
    write_manifest(copy, "bench-2")
    return copy, victim.relative_to(copy).as_posix(), size


def naive_copy(device, artifact: Path, target: str) -> tuple[int, float]:  # type: ignore[no-untyped-def]
    """Connect, ``rm -rf`` the target, push every file (timed like a deploy: connection included)."""
    files = [p for p in sorted(artifact.rglob("*")) if p.is_file()]
    started = time.perf_counter()
    transport = SshTransport(device)
    transport.run(["rm", "-rf", target])
    dirs = sorted({posixpath.join(target, p.parent.relative_to(artifact).as_posix()) for p in files})
    transport.run(["mkdir", "-p", *dirs])
    sent = 0
    for path in files:
        transport.push(path, posixpath.join(target, path.relative_to(artifact).as_posix()))
        sent += path.stat().st_size
    transport.close()
    return sent, time.perf_counter() - started


def python_startup() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kzbuild", "--version"], cwd=REPO, capture_output=True, check=True)
    return time.perf_counter() - started


def measure(spec: str, artifact_dir: Path, changed_dir: Path, work: Path, runs: int) -> tuple[list[tuple[str, int, float]], int]:
    """The four cases against one device address; returns table rows and the changed deploy's bytes."""
    device = parse_device_spec(spec)
    assert device is not None
    artifact = load_artifact(artifact_dir)

    def timed_deploy(build: deploy.Artifact) -> tuple[deploy.DeployResult, float]:
        started = time.perf_counter()
        transport = SshTransport(device)
        try:
            result = deploy.deploy(transport, device, build)
        finally:
            transport.close()
        return result, time.perf_counter() - started

    first, first_s = timed_deploy(artifact)
    noop = [timed_deploy(artifact) for _ in range(runs)]
    assert all(result.bytes_sent == 0 and result.metadata_bytes == 0 for result, _ in noop)
    cli = []
    for _ in range(runs):
        started = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-m", "kzbuild", "--project", str(REPO), "--work-dir", str(work / "kz"), "deploy", "--device", spec, "--artifact", str(artifact_dir), "--json"],
            cwd=REPO, capture_output=True, text=True, check=True,
        ).stdout
        cli.append(time.perf_counter() - started)
        assert json.loads(out)["bytes_sent"] == 0
    changed, changed_s = timed_deploy(load_artifact(changed_dir))
    naive = [naive_copy(device, artifact_dir, posixpath.join(device.root, "naive")) for _ in range(min(runs, 3))]
    rows = [
        ("first deploy (empty device)", first.bytes_sent, first_s),
        ("no-op redeploy, library (median)", 0, statistics.median(s for _, s in noop)),
        ("no-op redeploy, kzbuild CLI (median)", 0, statistics.median(cli)),
        ("one changed library", changed.bytes_sent, changed_s),
        ("naive full copy: rm -rf + push all (median)", naive[0][0], statistics.median(s for _, s in naive)),
    ]
    return rows, changed.bytes_sent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifact", type=Path, help="an artifact dir with manifest.json (default: synthetic)")
    parser.add_argument("--libs", type=int, default=8)
    parser.add_argument("--lib-mb", type=float, default=4.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--link-mbs", type=float, default=40.0, help="also measure through a relay limited to this many MB/s (0: skip)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kz-bench-deploy-"))
    server = SshServer(work, free_port(), keygen(work / "host_key"), keygen(work / "client_key"))
    server.start()
    relay = Relay(server.port, rate=args.link_mbs * 1e6) if args.link_mbs else None
    try:
        home = work / "home"
        (home / ".ssh").mkdir(parents=True)
        shutil.copy(server.client_key, home / ".ssh" / "id_ed25519")
        (home / ".ssh" / "known_hosts").write_text(server.known_hosts_line() + (server.known_hosts_line(relay.port) if relay else ""))
        os.environ["HOME"] = str(home)
        os.environ.pop("SSH_AUTH_SOCK", None)

        artifact_dir = args.artifact.resolve() if args.artifact else synthetic_artifact(work, args.libs, args.lib_mb)
        artifact = load_artifact(artifact_dir)
        changed_dir, changed_lib, changed_size = changed_copy(artifact_dir, work)
        print(f"artifact: {len(artifact.files)} files, {mb(artifact.total_size)} ({artifact_dir})")
        print(f"changed library: {changed_lib}, {changed_size:,} bytes")
        links = [("loopback, no limit", server.spec(work / "device-direct"))]
        if relay:
            links.append((f"loopback relay limited to {args.link_mbs:g} MB/s", server.spec(work / "device-slow", relay.port)))
        results = [(label, *measure(spec, artifact_dir, changed_dir, work, args.runs)) for label, spec in links]
    finally:
        if relay:
            relay.close()
        server.stop()

    startup = statistics.median(python_startup() for _ in range(args.runs))
    print(f"\nfor scale: `kzbuild --version` (Python start-up and imports alone) takes {startup:.3f} s here (median)")
    passed = True
    for label, rows, changed_bytes in results:
        print(f"\n{label}\n{'case':48} {'bytes sent':>14} {'seconds':>9}")
        for case, nbytes, seconds in rows:
            print(f"{case:48} {nbytes:>14,} {seconds:>9.3f}")
        passed &= rows[1][2] < 1.0 and changed_bytes == changed_size
    print(f"\ntargets (no-op: 0 bytes, < 1 s through the library; changed: only that library's bytes): {'PASS' if passed else 'FAIL'}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
