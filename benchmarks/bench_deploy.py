#!/usr/bin/env python3
"""Deploy figures (issues 13 and 27): kzbuild deploy next to scp, rsync and adb push, same run.

    python benchmarks/bench_deploy.py [--from DIR --to DIR] [--files 100,1000,10000] [--runs 3]
                                      [--no-ssh] [--no-adb] [--busy N]

Two devices, each with its anchors:

- ssh: a real OpenSSH server on 127.0.0.1 (throwaway keys, as in the tests) is the device for
  kzbuild (paramiko), scp and rsync (OpenSSH's client) alike. Bytes are counted by a loopback
  TCP relay in front of it, both directions, ssh handshake included; times are taken on the
  direct port.
- adb: the adb test device of tests/adbdevice (the real adb client and server, mksh and toybox
  as on Android), run in a process of its own so that its work is not counted as the client's.

Every time is reported twice: wall seconds and the client's CPU seconds (this process and the
children it waited for, from getrusage: kzbuild's library call and its adb push; scp, rsync,
adb and their ssh). Medians of ``--runs``, the tools taking turns. The machine this runs on is
often shared: the ratios hold within one run, the seconds do not carry over. ``--busy N`` makes
it busy on purpose, reproducibly: N processes that only burn CPU run beside every measurement, as
a build machine's other jobs would (issue 27: the goals hold on a busy machine too).

The release: ``--from`` and ``--to`` are two `kzbuild build` outputs of one target whose patch
stacks differ (default: the first such pair of host artifacts in the test cache,
``$KZ_TEST_CACHE/kz-work/artifacts``, which the slow test tier builds; without one, a synthetic
17.5 MB release of eight libraries and twenty tools, whose rebuild edits two libraries).

cases (goal in brackets):
1. first deploy of FROM: against scp (<= 1.3x) and rsync; against adb push (<= 2x);
2. first deploy of N files of 0.5-4 KB for each N of ``--files``: against rsync (<= 2x) and
   scp; against adb push (<= 2x);
3. one changed library (FROM, then FROM with its largest changed library from TO): bytes
   against rsync (<= 3x); time against ``adb push --sync`` of the changed tree (<= 2x);
4. a real patch rebuild (FROM, then TO): bytes against rsync (<= 3x);
5. a small edit: a 6 MB library with a 4 KiB insertion and eight scattered 64-byte edits:
   bytes against rsync (<= 3x);
6. no-op redeploy over ssh (no anchor: 0 content bytes).

The adb rows also show the device's ``sha256sum`` (toybox, built as Android builds it: through
libcrypto, see docs/testing.md) of the bytes a deploy checks, timed alone: the share of a
deploy's time that is hashing. adb push
hashes nothing, so after the table each adb case is also given without that hashing, and broken
down: the host's own work (planning, staging), the push, the device commands' round trips
(kzbuild's own command ``true``, timed alone) and the device's work in them, hashing
apart (a deploy that keeps stored contents hashes them during the push: that part is off the
critical path, and the line "the rest" then shows what is left after all the hashing). Last, what
one process costs on the device (``toybox true`` in a loop): the unit of the device's work.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kzbuild.build.artifacts import load_artifact  # noqa: E402
from kzbuild.device import deploy  # noqa: E402
from kzbuild.device.adb import AdbTransport  # noqa: E402
from kzbuild.device.base import ByteSource, Member, RemoteResult  # noqa: E402
from kzbuild.device.registry import parse_device_spec  # noqa: E402
from kzbuild.device.ssh import SshTransport  # noqa: E402
from kzbuild.model.device import Device  # noqa: E402
from tests.adbdevice import PrivateAdbServer  # noqa: E402
from tests.adbdevice.process import DeviceProcess  # noqa: E402
from tests.cachedir import persistent_cache_root  # noqa: E402
from tests.fixtures_deploy import small_edit, write_manifest  # noqa: E402
from tests.fixtures_ssh import Relay, SshServer, free_port, keygen  # noqa: E402

GOALS = {
    ("first deploy", "scp"): 1.3,
    ("first deploy (adb)", "adb push"): 2.0,
    ("one changed library", "rsync"): 3.0,
    ("one changed library (adb)", "adb push --sync"): 2.0,
    ("patch rebuild", "rsync"): 3.0,
    ("small edit", "rsync"): 3.0,
}
FILES_GOALS = {"rsync": 2.0, "adb push": 2.0}  # first deploy of N small files


@dataclass(frozen=True)
class Timing:
    wall: float
    cpu: float


@contextmanager
def busy(processes: int) -> Iterator[None]:
    """``processes`` CPU-bound processes running while the block runs (none for 0)."""
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)
    ]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and of its children that were waited for, to
    the microsecond (os.times counts 10 ms ticks: coarser than an adb client's CPU time)."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed(action: Callable[[], object]) -> Timing:
    """Wall and client CPU seconds of ``action`` (this process and its waited-for children)."""
    before, started = cpu_seconds(), time.perf_counter()
    action()
    wall, after = time.perf_counter() - started, cpu_seconds()
    return Timing(wall, after - before)


def median(timings: list[Timing]) -> Timing:
    return Timing(
        statistics.median(t.wall for t in timings), statistics.median(t.cpu for t in timings)
    )


Row = tuple[str, str, Timing | int, str, Timing | int]  # case, unit, kzbuild, anchor, anchor's


# --- releases ---
def test_cache_artifacts() -> Path:
    cache = persistent_cache_root()
    return Path(cache) / "kz-work" / "artifacts"


def tree(root: Path) -> dict[str, Path]:
    return {
        p.relative_to(root).as_posix(): p
        for p in root.rglob("*")
        if p.is_file() and p.name != "manifest.json"
    }


def differing(a: Path, b: Path) -> list[str]:
    files_a, files_b = tree(a), tree(b)
    if set(files_a) != set(files_b):
        return []
    return [
        rel for rel in sorted(files_b) if files_a[rel].read_bytes() != files_b[rel].read_bytes()
    ]


def find_rebuild_pair() -> tuple[Path, Path] | None:
    """Two host artifacts in the test cache with the same files, some of them different."""
    candidates = sorted(
        p for p in test_cache_artifacts().glob("host-*") if (p / "manifest.json").is_file()
    )
    for index, first in enumerate(candidates):
        for second in candidates[index + 1 :]:
            if differing(first, second):
                return first, second
    return None


def synthetic_pair(work: Path) -> tuple[Path, Path]:
    """A 17.5 MB release (eight libraries, twenty tools) and a rebuild that edits two libraries."""
    rng = random.Random(27)
    base, rebuilt = work / "synthetic-from", work / "synthetic-to"
    sizes = (6_000_000, 4_000_000, 3_000_000, 2_000_000, 1_000_000, 500_000, 300_000, 200_000)
    for index, size in enumerate(sizes):
        data = rng.randbytes(size)
        for root, content in (
            (base, data),
            (rebuilt, small_edit(data, rng) if index < 2 else data),
        ):
            (root / "lib").mkdir(parents=True, exist_ok=True)
            (root / "lib" / f"lib{index}.so").write_bytes(content)
    for index in range(20):
        data = rng.randbytes(rng.randint(2_000, 60_000))
        for root in (base, rebuilt):
            (root / "bin").mkdir(exist_ok=True)
            (root / "bin" / f"tool{index}").write_bytes(data)
            (root / "bin" / f"tool{index}").chmod(0o755)
    write_manifest(base, "synthetic-from")
    write_manifest(rebuilt, "synthetic-to")
    return base, rebuilt


def one_library_changed(base: Path, rebuilt: Path, work: Path) -> tuple[Path, str]:
    """``base`` with its largest library that ``rebuilt`` changed taken from ``rebuilt``."""
    changed = max(differing(base, rebuilt), key=lambda rel: (rebuilt / rel).stat().st_size)
    copy = work / "one-lib"
    shutil.copytree(base, copy)
    (copy / changed).unlink()
    shutil.copy2(rebuilt / changed, copy / changed)
    os.utime(copy / changed)  # newer than the device's copy, for adb push --sync
    write_manifest(copy, "one-lib")
    return copy, changed


def small_edit_pair(work: Path) -> tuple[Path, Path]:
    rng = random.Random(6)
    data = rng.randbytes(6 << 20)
    before, after = work / "edit-before", work / "edit-after"
    for root, content in ((before, data), (after, small_edit(data, rng))):
        (root / "lib").mkdir(parents=True)
        (root / "lib" / "libbig.so").write_bytes(content)
        write_manifest(root, root.name)
    return before, after


def small_files(work: Path, count: int) -> Path:
    rng = random.Random(count)
    root = work / f"files-{count}"
    for index in range(count):
        path = root / f"share/d{index % 30:02d}/f{index:05d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(rng.randint(500, 4000)))
    write_manifest(root, f"files-{count}")
    return root


# --- ssh ---
@dataclass
class Link:
    server: SshServer
    relay: Relay
    home: Path
    work: Path
    roots: int = 0

    def ssh_options(self, port: int) -> list[str]:
        known = self.home / ".ssh" / "known_hosts"
        return [
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={known}",
            "-i",
            str(self.server.client_key),
            "-o",
            f"Port={port}",
        ]

    def root(self) -> Path:
        self.roots += 1
        return self.work / f"device-{self.roots}"

    def kz(self, root: Path, artifact: Path, port: int | None = None) -> deploy.DeployResult:
        device = parse_device_spec(self.server.spec(root, port or self.server.port))
        assert device is not None
        transport = SshTransport(device)
        try:
            return deploy.deploy(transport, device, load_artifact(artifact))
        finally:
            transport.close()

    def scp(self, root: Path, artifact: Path, port: int | None = None) -> None:
        options = self.ssh_options(port or self.server.port)
        target = f"{self.server.user}@{self.server.host}:{root}"
        subprocess.run(["scp", "-q", "-r", *options, str(artifact), target], check=True)

    def rsync(self, root: Path, artifact: Path, port: int | None = None) -> None:
        ssh = " ".join(["ssh", *self.ssh_options(port or self.server.port)])
        target = f"{self.server.user}@{self.server.host}:{root}/"
        subprocess.run(["rsync", "-a", "--delete", "-e", ssh, f"{artifact}/", target], check=True)

    def counted(self, action: Callable[[int], object]) -> int:
        """Bytes both ways through the relay while ``action(relay port)`` runs."""
        self.relay.count_from_zero()
        action(self.relay.port)
        return sum(self.relay.moved)


def first_deploys(
    link: Link, label: str, artifact: Path, runs: int, anchors: list[str]
) -> list[Row]:
    """kzbuild and each anchor in turn, ``runs`` times, each to a fresh root."""
    tools: dict[str, Callable[[Path, Path], object]] = {
        "kzbuild": link.kz,
        "scp": link.scp,
        "rsync": link.rsync,
    }
    times: dict[str, list[Timing]] = {name: [] for name in ["kzbuild", *anchors]}
    for _ in range(runs):
        for name in times:
            root = link.root()
            times[name].append(timed(lambda tool=tools[name], root=root: tool(root, artifact)))
    mine = median(times["kzbuild"])
    return [(label, "s", mine, name, median(times[name])) for name in anchors]


def delta_bytes(link: Link, label: str, before: Path, after: Path) -> Row:
    kz_root, rsync_root = link.root(), link.root()
    link.kz(kz_root, before)
    link.rsync(rsync_root, before)
    result: list[deploy.DeployResult] = []
    kz_b = link.counted(lambda port: result.append(link.kz(kz_root, after, port)))
    rsync_b = link.counted(lambda port: link.rsync(rsync_root, after, port))
    sent = result[0]
    print(f"{label}: kzbuild sent {sent.bytes_sent:,} content bytes for {sent.files_sent} file(s)")
    return (label, "bytes", kz_b, "rsync", rsync_b)


def measure_ssh(work: Path, releases: Releases, runs: int) -> list[Row]:
    work.mkdir()
    server = SshServer(work, free_port(), keygen(work / "host_key"), keygen(work / "client_key"))
    server.start()
    relay = Relay(server.port)
    # ssh and scp read this HOME's keys; the adb part after it must find the user's caches again
    saved = {name: os.environ.get(name) for name in ("HOME", "SSH_AUTH_SOCK")}
    try:
        home = work / "home"
        (home / ".ssh").mkdir(parents=True)
        shutil.copy(server.client_key, home / ".ssh" / "id_ed25519")
        lines = server.known_hosts_line() + server.known_hosts_line(relay.port)
        (home / ".ssh" / "known_hosts").write_text(lines)
        os.environ["HOME"] = str(home)
        os.environ.pop("SSH_AUTH_SOCK", None)
        link = Link(server, relay, home, work)
        rows = first_deploys(link, "first deploy", releases.base, runs, ["scp", "rsync"])
        kz_b = link.counted(lambda port: link.kz(link.root(), releases.base, port))
        scp_b = link.counted(lambda port: link.scp(link.root(), releases.base, port))
        rows.append(("first deploy", "bytes", kz_b, "scp", scp_b))
        for count, artifact in releases.files.items():
            rows += first_deploys(link, f"{count:,} files", artifact, runs, ["rsync", "scp"])
        rows.append(delta_bytes(link, "one changed library", releases.base, releases.one_lib))
        rows.append(delta_bytes(link, "patch rebuild", releases.base, releases.rebuilt))
        rows.append(delta_bytes(link, "small edit", *releases.edit))
        root = link.root()
        link.kz(root, releases.base)
        noop = median([timed(lambda: link.kz(root, releases.base)) for _ in range(runs)])
        rows.append(("no-op redeploy", "s", noop, "-", Timing(0.0, 0.0)))
        return rows
    finally:
        relay.close()
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# --- adb ---
class TimedAdb(AdbTransport):
    """The adb transport, adding up where a deploy's time goes: its device commands and its
    pushes."""

    def __init__(self, device: Device, *, server_port: int) -> None:
        self.commands = 0
        self.spent = {"commands": 0.0, "push": 0.0}
        super().__init__(device, server_port=server_port)

    def _add(self, what: str, started: float) -> None:
        self.spent[what] += time.perf_counter() - started

    def run(self, argv: Sequence[str], **options: Any) -> RemoteResult:
        started, self.commands = time.perf_counter(), self.commands + 1
        try:
            return super().run(argv, **options)
        finally:
            self._add("commands", started)

    def run_input(self, argv: Sequence[str], data: ByteSource, **options: Any) -> RemoteResult:
        started, self.commands = time.perf_counter(), self.commands + 1
        try:
            return super().run_input(argv, data, **options)
        finally:
            self._add("commands", started)

    def push_files(self, files: Sequence[Member], remote: str, **options: Any) -> None:
        started = time.perf_counter()
        try:
            super().push_files(files, remote, **options)
        finally:
            self._add("push", started)


@dataclass(frozen=True)
class Breakdown:
    """Where one adb deploy's wall time went (seconds; ``commands`` device commands)."""

    total: float
    push: float
    command_time: float
    commands: int

    def lines(self, round_trip: float, hashing: float) -> list[str]:
        """The parts: the host's own work, the push, the commands' round trips (``round_trip``
        each: adb's per-command cost), and the device's work in them, hashing (timed alone)
        apart."""
        trips = min(self.commands * round_trip, self.command_time)
        device = self.command_time - trips
        parts = [
            ("host (plan, read)", self.total - self.push - self.command_time),
            ("the sync push of the files", self.push),
            (f"{self.commands} device commands: round trips", trips),
            ("  device work: sha256sum (timed alone)", min(hashing, device)),
            ("  device work: the rest (join, store, release)", max(device - hashing, 0.0)),
        ]
        return [f"    {name:48} {sec:7.3f} s {sec / self.total:5.0%}" for name, sec in parts]


def median_breakdown(items: list[Breakdown]) -> Breakdown:
    return Breakdown(
        statistics.median(b.total for b in items),
        statistics.median(b.push for b in items),
        statistics.median(b.command_time for b in items),
        round(statistics.median(b.commands for b in items)),
    )


class AdbBench:
    """The private adb server and the test device (in a process of its own)."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.server = PrivateAdbServer(work / "adb-server")
        self.server.start()
        self.device = DeviceProcess(work / "adb-device", REPO)
        self.serial = self.device.serial
        self.server.adb("connect", self.serial)
        self.roots = 0
        device = Device(name="bench", transport="adb", serial=self.serial, root="/data/local/tmp")
        self.transport = AdbTransport(device, server_port=self.server.port)

    def root(self) -> str:
        self.roots += 1
        return f"/data/local/tmp/kz-{self.roots}"

    def adb(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        argv = [self.server.adb_path, "-P", str(self.server.port), "-s", self.serial, *args]
        return subprocess.run(argv, check=True, capture_output=True)

    def kz(self, root: str, artifact: Path) -> Breakdown:
        started = time.perf_counter()
        device = Device(name="bench", transport="adb", serial=self.serial, root=root)
        transport = TimedAdb(device, server_port=self.server.port)
        deploy.deploy(transport, device, load_artifact(artifact))
        total = time.perf_counter() - started
        spent = transport.spent
        return Breakdown(total, spent["push"], spent["commands"], transport.commands)

    def round_trip(self) -> float:
        """The cost of one device command that does nothing: the transport's ``true`` (on the adb
        server's socket, as every command of a deploy)."""
        started = time.perf_counter()
        self.shell("true")
        return time.perf_counter() - started

    def shell(self, command: str) -> None:
        """``command`` in the device's shell, as kzbuild runs its commands."""
        result = self.transport.run(["sh", "-c", command])
        if not result.ok:
            raise SystemExit(f"{command} failed on the device: {result.stderr.decode()}")

    def process_cost(self) -> float:
        """What one process costs on the device: 50 runs of ``toybox true`` in one shell, less
        that shell's own round trip, over 50."""
        script = "i=0; while [ $i -lt 50 ]; do toybox true; i=$((i + 1)); done"
        started = time.perf_counter()
        self.shell(script)
        return max(time.perf_counter() - started - self.round_trip(), 0.0) / 50

    def push(self, root: str, artifact: Path, *sync: str) -> None:
        self.adb("push", *sync, f"{artifact}/.", root)

    def hashing(self, root: str) -> Timing:
        """The device's sha256sum of every file under ``root``, alone (what a deploy hashes)."""
        script = 'cd "$1" && find . -type f | xargs sha256sum > /dev/null'
        return timed(lambda: self.shell(f"sh -c '{script}' kz {root}"))

    def stop(self) -> None:
        self.server.adb("disconnect", self.serial)
        self.device.stop()
        self.server.stop()


def measure_adb(work: Path, releases: Releases, runs: int) -> tuple[list[Row], list[str]]:
    """The adb rows, and the lines that break each case down (printed after the table)."""
    work.mkdir()
    bench = AdbBench(work)
    try:
        rows: list[Row] = []
        notes: list[str] = []
        round_trip = statistics.median(bench.round_trip() for _ in range(max(runs, 5)))
        cases = [
            ("first deploy (adb)", releases.base),
            *[(f"{count:,} files (adb)", artifact) for count, artifact in releases.files.items()],
        ]
        for label, artifact in cases:
            kz, push, parts = [], [], []
            for _ in range(runs):
                kz.append(timed(lambda r=bench.root(), a=artifact: parts.append(bench.kz(r, a))))
                push.append(timed(lambda root=bench.root(), a=artifact: bench.push(root, a)))
            hashed = bench.root()
            bench.push(hashed, artifact)
            hashing = median([bench.hashing(hashed) for _ in range(runs)])
            rows += [(label, "s", median(kz), "adb push", median(push))]
            rows += [(label, "s", hashing, "sha256", 0)]
            notes += explain(label, median(kz), median(push), hashing, parts, round_trip)
        kz, push, parts = [], [], []
        for _ in range(runs):
            kz_root, push_root = bench.root(), bench.root()
            bench.kz(kz_root, releases.base)
            kz.append(timed(lambda r=kz_root: parts.append(bench.kz(r, releases.one_lib))))
            bench.push(push_root, releases.base)
            push.append(timed(lambda root=push_root: bench.push(root, releases.one_lib, "--sync")))
        label = "one changed library (adb)"
        # a deploy that keeps stored contents hashes them all (the changed file as it is stored)
        hashing = median([bench.hashing(push_root) for _ in range(runs)])
        rows += [(label, "s", median(kz), "adb push --sync", median(push))]
        rows += [(label, "s", hashing, "sha256", 0)]
        notes += explain(label, median(kz), median(push), hashing, parts, round_trip)
        notes.append(f"the cost of one device command (true): {round_trip:.3f} s")
        process = statistics.median(bench.process_cost() for _ in range(max(runs, 3)))
        notes.append(f"one process on the device (toybox true): {process * 1000:.1f} ms")
        return rows, notes
    finally:
        bench.stop()


def explain(
    label: str,
    mine: Timing,
    anchor: Timing,
    hashing: Timing,
    parts: list[Breakdown],
    round_trip: float,
) -> list[str]:
    """Where a case's time went (medians of its runs), and its wall ratio with the device's
    sha256sum, which adb push does not run, left out."""
    rest = max(mine.wall - hashing.wall, 0.0)
    ratio = rest / anchor.wall if anchor.wall else 0.0
    head = f"{label}: without the device's sha256sum {rest:.3f} s, {ratio:.2f}x the anchor"
    return [head, *median_breakdown(parts).lines(round_trip, hashing.wall)]


# --- main ---
@dataclass(frozen=True)
class Releases:
    base: Path
    rebuilt: Path
    one_lib: Path
    edit: tuple[Path, Path]
    files: dict[int, Path]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--from", dest="base", type=Path, help="an artifact dir")
    parser.add_argument("--to", dest="rebuilt", type=Path, help="the same target, other patches")
    parser.add_argument("--files", default="100,1000,10000", help="counts of small files")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-ssh", action="store_true")
    parser.add_argument("--no-adb", action="store_true")
    parser.add_argument(
        "--busy", type=int, default=0, metavar="N", help="N CPU-bound processes run meanwhile"
    )
    args = parser.parse_args()
    if not args.no_ssh and (shutil.which("rsync") is None or shutil.which("scp") is None):
        raise SystemExit("rsync and scp are the anchors: install rsync and openssh-client")

    work = Path(tempfile.mkdtemp(prefix="kz-bench-deploy-"))
    try:
        if args.base and args.rebuilt:
            pair = (args.base.resolve(), args.rebuilt.resolve())
        else:
            pair = find_rebuild_pair() or synthetic_pair(work)
        base, rebuilt = pair
        one_lib, changed = one_library_changed(base, rebuilt, work)
        print(f"one changed library: {changed} ({(one_lib / changed).stat().st_size:,} bytes)")
        counts = [int(text) for text in args.files.split(",") if text]
        releases = Releases(
            base, rebuilt, one_lib, small_edit_pair(work), {n: small_files(work, n) for n in counts}
        )
        rows: list[Row] = []
        notes: list[str] = []
        before = os.getloadavg()[0]
        with busy(args.busy):
            if not args.no_ssh:
                rows += measure_ssh(work / "ssh", releases, args.runs)
            if not args.no_adb:
                adb_rows, notes = measure_adb(work / "adb", releases, args.runs)
                rows += adb_rows
            after = os.getloadavg()[0]
        print(
            f"machine: {os.cpu_count()} cores, {args.busy} CPU-bound process(es) beside the "
            f"measurements (--busy), load average {before:.1f} before, {after:.1f} at the end"
        )
        report(rows, base, rebuilt)
        if notes:
            print("\nwhere the adb time goes (wall, medians):")
            print("\n".join(notes))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def goal_of(label: str, unit: str, anchor: str) -> float | None:
    if " files" in label and unit == "s":
        return FILES_GOALS.get(anchor)
    if label == "first deploy" and unit == "bytes":
        return None
    return GOALS.get((label, anchor))


def report(rows: list[Row], base: Path, rebuilt: Path) -> None:
    release = load_artifact(base)
    size = release.total_size / 1e6
    print(f"\nrelease: {base.name} ({len(release.files)} files, {size:.2f} MB) -> {rebuilt.name}")
    print("times: wall / client CPU seconds, medians; the machine may be shared with other work")
    head = f"{'case':27} {'anchor':16} {'kzbuild':>17} {'anchor':>17} {'ratio':>12} {'goal':>6}"
    print(f"\n{head}")
    passed = True
    hashing: dict[str, float] = {}
    for label, unit, mine, anchor, theirs in rows:
        if anchor == "sha256" and isinstance(mine, Timing):
            hashing[label] = mine.wall
            line = f"{label:27} {'device sha256sum':16} {mine.wall:>8.3f} s{'':>9}"
            print(line + f"{'':>18} share of kzbuild: {share(rows, label, mine.wall)}")
            continue
        goal = goal_of(label, unit, anchor)
        if isinstance(mine, Timing) and isinstance(theirs, Timing):
            ratio = (
                mine.wall / theirs.wall if theirs.wall else 0.0,
                ratio_of(mine.cpu, theirs.cpu),
            )
            values = f"{mine.wall:7.3f}/{mine.cpu:<7.3f} {theirs.wall:8.3f}/{theirs.cpu:<7.3f}"
            shown = f"{ratio[0]:5.2f}/{ratio[1]:<5.2f}" if theirs.wall else "-"
            worst = max(ratio)
        else:
            ratio_b = int(mine) / int(theirs) if theirs else 0.0
            values = f"{int(mine):>17,} {int(theirs):>17,}"
            shown, worst = f"{ratio_b:.2f}", ratio_b
        ok = goal is None or worst <= goal
        passed &= ok
        mark = "" if goal is None else (" ok" if ok else " MISSED")
        goal_text = "" if goal is None else f"<={goal:g}"
        print(f"{label:27} {anchor:16} {values} {shown:>12} {goal_text:>6}{mark}")
    print(f"\ngoals (wall and CPU): {'PASS' if passed else 'FAIL'}")


def ratio_of(mine: float, theirs: float) -> float:
    return mine / theirs if theirs > 0.005 else 0.0  # below the clock's grain: no ratio


def share(rows: list[Row], label: str, seconds: float) -> str:
    total = next(
        (
            mine.wall
            for case, unit, mine, anchor, _ in rows
            if case == label and anchor != "sha256" and isinstance(mine, Timing)
        ),
        0.0,
    )
    return f"{seconds / total:.0%}" if total else "-"


if __name__ == "__main__":
    main()
