#!/usr/bin/env python3
"""Deploy figures for issue 13: kzbuild deploy next to rsync and scp, in the same run, over the same sshd.

    python benchmarks/bench_deploy.py [--from DIR --to DIR] [--small-files 3000] [--runs 3]

A real OpenSSH server on 127.0.0.1 (throwaway keys, as in the tests) is the device for
kzbuild (paramiko), scp and rsync (OpenSSH's client) alike. Bytes are counted by a loopback
TCP relay in front of it, both directions, ssh handshake included, for every tool; times are
taken on the direct port (median of ``--runs``; kzbuild's time is connect + deploy through the
library: Python's start-up is issue 13's start-up part, measured by the start-up benchmark).

The artifacts are real builds: ``--from`` and ``--to`` are two `kzbuild build` outputs of one
target whose patch stacks differ (default: the first such pair of host artifacts in the test
cache, ``$KZ_TEST_CACHE/kz-work/artifacts``, which the slow test tier builds).

cases, each with its anchor:
1. first deploy of FROM to an empty device: seconds, against ``scp -r`` (goal <= 1.3x) and rsync;
2. ``--small-files`` files of 0.5-4 KB, first deploy: seconds, against rsync (goal <= 2x);
3. one changed library: FROM deployed, then FROM with its largest library taken from TO (a
   real rebuild of it): bytes, against rsync of the same change (goal <= 3x);
4. a real patch rebuild: FROM deployed, then TO: bytes, against rsync (goal <= 3x);
5. no-op redeploy: bytes and seconds (no anchor: 0 content bytes);
6. over adb (the adb test device of tests/adbdevice: the real adb client and server, mksh and
   toybox as on Android): first deploy of FROM and the one changed library of case 3, seconds,
   against ``adb push`` of the same files (no goal: the anchor for the adb line).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kzbuild.build.artifacts import load_artifact  # noqa: E402
from kzbuild.device import deploy  # noqa: E402
from kzbuild.device.adb import AdbTransport  # noqa: E402
from kzbuild.device.registry import parse_device_spec  # noqa: E402
from kzbuild.device.ssh import SshTransport  # noqa: E402
from tests.adbdevice import AdbTestDevice, PrivateAdbServer  # noqa: E402
from tests.fixtures_deploy import ArtifactMaker, write_manifest  # noqa: E402
from tests.fixtures_ssh import Relay, SshServer, free_port, keygen  # noqa: E402

GOALS = {"first deploy / scp": 1.3, "3,000 small files / rsync": 2.0, "one changed library / rsync": 3.0, "patch rebuild / rsync": 3.0}


@dataclass
class Link:
    server: SshServer
    relay: Relay
    home: Path

    def ssh_options(self, port: int) -> list[str]:
        return [
            "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={self.home / '.ssh' / 'known_hosts'}",
            "-i", str(self.server.client_key), "-o", f"Port={port}",
        ]  # fmt: skip

    def remote(self, root: Path) -> str:
        return f"{self.server.user}@{self.server.host}:{root}"


def test_cache_artifacts() -> Path:
    return Path(os.environ.get("KZ_TEST_CACHE", Path.home() / ".cache" / "kzbuild-test")) / "kz-work" / "artifacts"


def differing(a: Path, b: Path) -> list[str]:
    files_a = {p.relative_to(a).as_posix(): p for p in a.rglob("*") if p.is_file() and p.name != "manifest.json"}
    files_b = {p.relative_to(b).as_posix(): p for p in b.rglob("*") if p.is_file() and p.name != "manifest.json"}
    if set(files_a) != set(files_b):
        return []
    return [rel for rel in sorted(files_b) if files_a[rel].read_bytes() != files_b[rel].read_bytes()]


def find_rebuild_pair() -> tuple[Path, Path]:
    """Two host artifacts in the test cache with the same files, some of them different."""
    candidates = sorted(p for p in test_cache_artifacts().glob("host-*") if (p / "manifest.json").is_file())
    for index, first in enumerate(candidates):
        for second in candidates[index + 1 :]:
            if differing(first, second):
                return first, second
    raise SystemExit(f"no two differing host artifacts under {test_cache_artifacts()}: run the slow tier (pytest -m slow) or pass --from/--to")


def one_library_changed(base: Path, rebuilt: Path, work: Path) -> tuple[Path, str]:
    """``base`` with its largest library that ``rebuilt`` changed taken from ``rebuilt``."""
    changed = max(differing(base, rebuilt), key=lambda rel: (rebuilt / rel).stat().st_size)
    copy = work / "one-lib"
    shutil.copytree(base, copy)
    (copy / changed).unlink()
    shutil.copy2(rebuilt / changed, copy / changed)
    write_manifest(copy, "one-lib")
    return copy, changed


def small_files_artifact(work: Path, count: int) -> Path:
    rng = random.Random(13)
    extra = {f"share/d{index % 30:02d}/f{index:05d}.txt": rng.randbytes(rng.randint(500, 4000)) for index in range(count)}
    return ArtifactMaker(work / "small", work / "parts").make("small", extra=extra)


def kz_deploy(link: Link, root: Path, artifact: Path, port: int) -> tuple[deploy.DeployResult, float]:
    device = parse_device_spec(link.server.spec(root, port))
    assert device is not None
    started = time.perf_counter()
    transport = SshTransport(device)
    try:
        result = deploy.deploy(transport, device, load_artifact(artifact))
    finally:
        transport.close()
    return result, time.perf_counter() - started


def scp(link: Link, root: Path, artifact: Path, port: int) -> float:
    started = time.perf_counter()
    subprocess.run(["scp", "-q", "-r", *link.ssh_options(port), str(artifact), link.remote(root)], check=True)
    return time.perf_counter() - started


def rsync(link: Link, root: Path, artifact: Path, port: int) -> float:
    started = time.perf_counter()
    ssh = " ".join(["ssh", *link.ssh_options(port)])
    subprocess.run(["rsync", "-a", "--delete", "-e", ssh, f"{artifact}/", f"{link.remote(root)}/"], check=True)
    return time.perf_counter() - started


def counted(link: Link, action: Callable[[int], object]) -> int:
    """Bytes both ways through the relay while ``action(relay port)`` runs."""
    link.relay.count_from_zero()
    action(link.relay.port)
    return sum(link.relay.moved)


class Case:
    def __init__(self, work: Path) -> None:
        self.work = work
        self.roots = 0

    def root(self) -> Path:
        self.roots += 1
        return self.work / f"device-{self.roots}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--from", dest="base", type=Path, help="an artifact dir (default: from the test cache)")
    parser.add_argument("--to", dest="rebuilt", type=Path, help="the same target rebuilt with another patch stack")
    parser.add_argument("--small-files", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if shutil.which("rsync") is None or shutil.which("scp") is None:
        raise SystemExit("rsync and scp are the anchors: install rsync and openssh-client (scripts/setup does)")
    base, rebuilt = (args.base.resolve(), args.rebuilt.resolve()) if args.base and args.rebuilt else find_rebuild_pair()

    work = Path(tempfile.mkdtemp(prefix="kz-bench-deploy-"))
    server = SshServer(work, free_port(), keygen(work / "host_key"), keygen(work / "client_key"))
    server.start()
    relay = Relay(server.port)
    try:
        home = work / "home"
        (home / ".ssh").mkdir(parents=True)
        shutil.copy(server.client_key, home / ".ssh" / "id_ed25519")
        (home / ".ssh" / "known_hosts").write_text(server.known_hosts_line() + server.known_hosts_line(relay.port))
        os.environ["HOME"] = str(home)
        os.environ.pop("SSH_AUTH_SOCK", None)
        link = Link(server, relay, home)
        rows = measure(link, Case(work), base, rebuilt, args.small_files, args.runs)
    finally:
        relay.close()
        server.stop()
    rows += measure_adb(work, base, rebuilt, args.runs)
    report(rows, base, rebuilt)
    shutil.rmtree(work, ignore_errors=True)


Row = tuple[str, str, float, str, float]  # case, unit, kzbuild, anchor name, anchor


def measure(link: Link, case: Case, base: Path, rebuilt: Path, small_count: int, runs: int) -> list[Row]:
    direct = link.server.port
    rows: list[Row] = []

    # 1. first deploy: time against scp and rsync (fresh roots each run), bytes through the relay
    kz_s = statistics.median(kz_deploy(link, case.root(), base, direct)[1] for _ in range(runs))
    scp_s = statistics.median(scp(link, case.root(), base, direct) for _ in range(runs))
    rsync_s = statistics.median(rsync(link, case.root(), base, direct) for _ in range(runs))
    rows += [("first deploy", "s", kz_s, "scp", scp_s), ("first deploy", "s", kz_s, "rsync", rsync_s)]
    kz_b = counted(link, lambda port: kz_deploy(link, case.root(), base, port))
    scp_b = counted(link, lambda port: scp(link, case.root(), base, port))
    rows.append(("first deploy", "bytes", kz_b, "scp", scp_b))

    # 2. many small files
    small = small_files_artifact(case.work, small_count)
    kz_s = statistics.median(kz_deploy(link, case.root(), small, direct)[1] for _ in range(runs))
    rsync_s = statistics.median(rsync(link, case.root(), small, direct) for _ in range(runs))
    rows.append((f"{small_count:,} small files", "s", kz_s, "rsync", rsync_s))

    # 3, 4. deltas: the device holds BASE, then gets the change
    one_lib, changed = one_library_changed(base, rebuilt, case.work)
    print(f"one changed library: {changed} ({(one_lib / changed).stat().st_size:,} bytes)")
    for label, target in (("one changed library", one_lib), ("patch rebuild", rebuilt)):
        kz_root, rsync_root = case.root(), case.root()
        kz_deploy(link, kz_root, base, direct)
        rsync(link, rsync_root, base, direct)
        result: list[deploy.DeployResult] = []
        kz_b = counted(link, lambda port, root=kz_root, to=target: result.append(kz_deploy(link, root, to, port)[0]))
        rsync_b = counted(link, lambda port, root=rsync_root, to=target: rsync(link, root, to, port))
        rows.append((label, "bytes", kz_b, "rsync", rsync_b))
        print(f"{label}: kzbuild sent {result[0].bytes_sent:,} content bytes for {result[0].files_sent} file(s)")

    # 5. no-op redeploy
    root = case.root()
    kz_deploy(link, root, base, direct)
    noop = [kz_deploy(link, root, base, direct) for _ in range(runs)]
    assert all(result.bytes_sent == 0 for result, _ in noop)
    rows.append(("no-op redeploy", "s", statistics.median(seconds for _, seconds in noop), "-", 0.0))
    return rows


def measure_adb(work: Path, base: Path, rebuilt: Path, runs: int) -> list[Row]:
    """Case 6: kzbuild deploy over adb to the test device, against ``adb push`` of the same files."""
    server = PrivateAdbServer(work / "adb-server")
    server.start()
    device = AdbTestDevice(work / "adb-device")
    try:
        one_lib, changed = one_library_changed(base, rebuilt, work / "adb")
        roots = iter(f"/data/local/tmp/kz-{n}" for n in range(10 * runs))

        def kz(root: str, artifact: Path) -> float:
            started = time.perf_counter()
            deploy.deploy(AdbTransport(device.device(root=root), server_port=server.port), device.device(root=root), load_artifact(artifact))
            return time.perf_counter() - started

        def push(local: Path) -> float:
            started = time.perf_counter()
            subprocess.run([server.adb_path, "-P", str(server.port), "-s", device.serial, "push", str(local), f"{next(roots)}/"], check=True, capture_output=True)
            return time.perf_counter() - started

        kz_first = statistics.median(kz(next(roots), base) for _ in range(runs))
        push_first = statistics.median(push(base) for _ in range(runs))
        deltas = []
        for _ in range(runs):
            root = next(roots)
            kz(root, base)
            deltas.append(kz(root, one_lib))
        push_delta = statistics.median(push(one_lib / changed) for _ in range(runs))
        return [("first deploy (adb)", "s", kz_first, "adb push", push_first), ("one changed library (adb)", "s", statistics.median(deltas), "adb push", push_delta)]
    finally:
        device.stop()
        server.stop()


def report(rows: list[Row], base: Path, rebuilt: Path) -> None:
    files = load_artifact(base)
    print(f"\nartifacts: {base.name} ({len(files.files)} files, {files.total_size / 1e6:.2f} MB) -> {rebuilt.name}: {', '.join(differing(base, rebuilt))} differ")
    print(f"\n{'case':26} {'unit':5} {'kzbuild':>12} {'anchor':>7} {'anchor value':>13} {'ratio':>7} {'goal':>6}")
    passed = True
    for label, unit, mine, anchor, theirs in rows:
        ratio = mine / theirs if theirs else float("nan")
        goal = GOALS.get(f"{label} / {anchor}") if unit == "s" or label != "first deploy" else None
        mark = "" if goal is None else (" ok" if ratio <= goal else " MISSED")
        passed &= goal is None or ratio <= goal
        value = f"{mine:.3f}" if unit == "s" else f"{int(mine):,}"
        anchor_value = f"{theirs:.3f}" if unit == "s" else f"{int(theirs):,}"
        shown = f"{ratio:.2f}" if theirs else "-"
        print(f"{label:26} {unit:5} {value:>12} {anchor:>7} {anchor_value if theirs else '-':>13} {shown:>7} {('' if goal is None else f'<={goal:g}'):>6}{mark}")
    print(f"\ngoals (issue 13): {'PASS' if passed else 'FAIL'}")


if __name__ == "__main__":
    main()
