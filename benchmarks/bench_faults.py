#!/usr/bin/env python3
"""Fault figures for the trust issue: deploys killed, raced, starved of space; stores corrupted.

    python benchmarks/bench_faults.py [--rounds 2] [--no-ssh] [--corruptions 40]

Every case runs `kzbuild deploy` as a subprocess through ``tests/deploy/fault_driver.py`` on
the local transport and over ssh to a real OpenSSH server on 127.0.0.1 (throwaway keys, as
in the tests), then checks the device store file by file (``assert_store_invariant``):

1. kill -9 at each device operation of a deploy (b2 over b1), then a plain deploy, which
   must recover the dead holder's lock and finish;
2. concurrency (``--rounds`` each): two deploys of different builds, deploy against
   ``--rollback``, deploy against ``--keep 1``, all with ``--wait``; and two deploys
   without ``--wait``, where the loser must exit 10;
3. a full disk (a tmpfs device root, where mounting is permitted): exit 8 naming the full
   device, current unchanged, and after the disk grows the deploy completes;
4. corruptions of a device store (bench_store.py): flipped, truncated, deleted or replaced
   files, each checked by `device verify`'s store check, then repaired by deploy.

Figures: cases tried, tracebacks (any "Traceback" in any output), data lost (current not a
complete release, or a file not matching its hash), corruptions detected (and repaired) and
concurrent deploys complete (%). Targets: 0 tracebacks, 0 lost, 100% detected, 100% complete.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_store import run_corruptions  # noqa: E402
from tests.deploy import fault_driver  # noqa: E402
from tests.fixtures_deploy import ArtifactMaker, assert_store_invariant  # noqa: E402
from tests.fixtures_ssh import SshServer, free_port, keygen  # noqa: E402

OPERATIONS = 4  # device commands of a deploy of b2 over b1 (local, ssh) (see tests/deploy/test_deploy_faults.py)
BUSY, DEVICE_ERROR = 10, 8


@dataclass
class Finished:
    code: int
    output: str


@dataclass
class Tally:
    cases: int = 0
    tracebacks: int = 0
    lost: int = 0
    concurrent: int = 0
    concurrent_complete: int = 0
    failures: list[str] = field(default_factory=list)

    def fail(self, case: str, why: str) -> None:
        self.failures.append(f"{case}: {why}")


class Bench:
    def __init__(self, work: Path, tally: Tally) -> None:
        self.work = work
        self.tally = tally
        self.maker = ArtifactMaker(work / "artifacts", work / "parts")
        self.builds = {n: self.maker.make(f"b{n}", greeting=f"v{n}", blob_seed=n, blob_size=256 * 1024) for n in (1, 2, 3)}
        self.roots = 0

    def fresh_root(self) -> Path:
        self.roots += 1
        return self.work / f"device-{self.roots}"

    def start(self, args: list[str], **options) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
        env = options.pop("env", {})
        kz = ["--project", str(REPO), "--work-dir", str(self.work / "kz"), *args]
        return subprocess.Popen(
            fault_driver.command(kz, **options), cwd=REPO, env={**os.environ, "COLUMNS": "200", **env},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )

    def finish(self, process: subprocess.Popen[str]) -> Finished:
        output, _ = process.communicate(timeout=300)
        if "Traceback" in output:
            self.tally.tracebacks += 1
        return Finished(process.returncode, output)

    def run(self, args: list[str], **options) -> Finished:  # type: ignore[no-untyped-def]
        return self.finish(self.start(args, **options))

    def deploy_args(self, spec: str, build: int, *extra: str) -> list[str]:
        return ["deploy", "--device", spec, "--artifact", str(self.builds[build]), *extra]

    def check(self, case: str, root: Path) -> str | None:
        """The current release if the store is sound; counts and records a loss otherwise."""
        try:
            return assert_store_invariant(root)
        except (AssertionError, OSError) as exc:
            self.tally.lost += 1
            self.tally.fail(case, f"store invariant broken: {exc}")
            return None

    # --- the cases ---
    def kill(self, label: str, spec_for: Callable[[Path], str], point: int) -> None:
        case = f"{label} kill -9 at operation {point}"
        self.tally.cases += 1
        root = self.fresh_root()
        spec = spec_for(root)
        if (setup := self.run(self.deploy_args(spec, 1))).code != 0:
            return self.tally.fail(case, f"setup deploy failed: {setup.output}")
        killed = self.run(self.deploy_args(spec, 2), kill_at=point)
        if killed.code != -signal.SIGKILL:
            self.tally.fail(case, f"expected SIGKILL, got exit {killed.code}")
        self.check(case, root)
        recovered = self.run(self.deploy_args(spec, 2))
        if recovered.code != 0:
            return self.tally.fail(case, f"recovery deploy exit {recovered.code}: {recovered.output}")
        if self.check(case, root) != "b2":
            self.tally.fail(case, "current is not b2 after the recovery deploy")

    def concurrent(self, label: str, spec_for: Callable[[Path], str], kind: str) -> None:
        case = f"{label} concurrent {kind}"
        self.tally.cases += 1
        root = self.fresh_root()
        spec = spec_for(root)
        self.tally.concurrent += 1
        for build in (1, 2) if kind in ("rollback", "keep") else (1,):
            if (setup := self.run(self.deploy_args(spec, build))).code != 0:
                return self.tally.fail(case, f"setup deploy failed: {setup.output}")
        wait = [] if kind == "no-wait" else ["--wait", "120"]
        second = {
            "deploys": self.deploy_args(spec, 2, *wait),
            "no-wait": self.deploy_args(spec, 2, *wait),
            "rollback": ["deploy", "--device", spec, "--rollback", *wait],
            "keep": self.deploy_args(spec, 1, "--keep", "1", *wait),
        }[kind]
        first = self.start(self.deploy_args(spec, 3, *wait), slow=0.05 if kind == "no-wait" else 0.02)
        if kind == "no-wait":
            while not (root / ".lock").exists() and first.poll() is None:
                time.sleep(0.01)
        other = self.start(second, slow=0.02)
        codes = sorted(self.finish(process).code for process in (first, other))
        allowed = ([0, 0], [0, BUSY]) if kind == "no-wait" else ([0, 0],)
        current = self.check(case, root)
        logged = (root / "deploys.log").read_text().splitlines()[-1].split("\t")[2]
        if codes not in allowed:
            return self.tally.fail(case, f"exit codes {codes}")
        if current != logged:
            return self.tally.fail(case, f"current {current} but the log's last switch is {logged}")
        self.tally.concurrent_complete += 1

    def full_disk(self, label: str, spec_for: Callable[[Path], str], size_kib: int) -> None:
        case = f"{label} full disk ({size_kib} KiB)"
        self.tally.cases += 1
        root = self.fresh_root()
        root.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "kz-bench", str(root)], check=True)
        try:
            spec = spec_for(root)
            if (setup := self.run(self.deploy_args(spec, 1))).code != 0:
                return self.tally.fail(case, f"setup deploy failed: {setup.output}")
            big = self.maker.make(f"big{size_kib}", greeting="big", blob_seed=9, blob_size=2 << 20)
            full = self.run(["deploy", "--device", spec, "--artifact", str(big)])
            if full.code != DEVICE_ERROR or " is full: " not in " ".join(full.output.split()):
                self.tally.fail(case, f"expected exit 8 naming a full device, got {full.code}: {full.output}")
            if self.check(case, root) != "b1":
                self.tally.fail(case, "current moved off b1 on a full disk")
            subprocess.run(["mount", "-o", "remount,size=16m", str(root)], check=True)
            grown = self.run(["deploy", "--device", spec, "--artifact", str(big)])
            if grown.code != 0 or self.check(case, root) != big.name:
                self.tally.fail(case, f"deploy after the disk grew: exit {grown.code}: {grown.output}")
        finally:
            subprocess.run(["umount", "-l", str(root)], check=True)


def can_mount(work: Path) -> str | None:
    """None if a tmpfs can be mounted here, else why not."""
    probe = work / "mount-probe"
    probe.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "kz-probe", str(probe)], capture_output=True, text=True)
    if result.returncode != 0:
        return result.stderr.strip() or "mount failed"
    subprocess.run(["umount", str(probe)], check=True)
    return None


def ssh_home(work: Path, server: SshServer) -> None:
    home = work / "home"
    (home / ".ssh").mkdir(parents=True)
    shutil.copy(server.client_key, home / ".ssh" / "id_ed25519")
    (home / ".ssh" / "known_hosts").write_text(server.known_hosts_line())
    os.environ["HOME"] = str(home)
    os.environ.pop("SSH_AUTH_SOCK", None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each concurrency case per transport")
    parser.add_argument("--no-ssh", action="store_true", help="the local transport only")
    parser.add_argument("--corruptions", type=int, default=40, help="corruptions injected into a device store (see bench_store.py)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kz-bench-faults-"))
    os.environ.pop("KZ_LOCK_HOST", None)
    os.environ.pop("KZ_LOCK_LEASE", None)
    tally = Tally()
    bench = Bench(work, tally)
    transports: list[tuple[str, Callable[[Path], str]]] = [("local", lambda root: f"local:{root}")]
    server = None
    if not args.no_ssh:
        (work / "sshd").mkdir()
        server = SshServer(work / "sshd", free_port(), keygen(work / "host_key"), keygen(work / "client_key"))
        server.start()
        ssh_home(work, server)
        transports.append(("ssh", server.spec))
    no_mount = can_mount(work)
    started = time.perf_counter()
    try:
        for label, spec_for in transports:
            for point in range(1, OPERATIONS + 1):
                bench.kill(label, spec_for, point)
            for kind in ("deploys", "no-wait", "rollback", "keep"):
                for _ in range(args.rounds):
                    bench.concurrent(label, spec_for, kind)
            if no_mount is None:
                for size in (768, 1024):  # b1 takes about 620 KiB: its libblob.so also lies in chunks/
                    bench.full_disk(label, spec_for, size)
    finally:
        if server:
            server.stop()
    corruptions = run_corruptions(args.corruptions, seed=1)
    seconds = time.perf_counter() - started

    complete = 100.0 * tally.concurrent_complete / tally.concurrent if tally.concurrent else 0.0
    print(f"transports: {', '.join(label for label, _ in transports)}; {seconds:.1f} s")
    if no_mount:
        print(f"full-disk cases skipped: cannot mount a tmpfs here ({no_mount})")
    print(f"cases tried                  {tally.cases}")
    print(f"tracebacks                   {tally.tracebacks}")
    print(f"data lost                    {tally.lost}")
    injected, detected = sum(corruptions.injected.values()), sum(corruptions.detected.values())
    print(f"corruptions detected         {100 * detected / max(injected, 1):.0f}% ({detected}/{injected}; "
          f"repaired {sum(corruptions.repaired.values())}/{sum(corruptions.repairable.values())} of those deploy can repair)")
    print(f"concurrent deploys complete  {complete:.0f}% ({tally.concurrent_complete}/{tally.concurrent})")
    print(f"failed checks                {len(tally.failures)}")
    for failure in tally.failures:
        print(f"  {failure}")
    passed = tally.tracebacks == 0 and tally.lost == 0 and complete == 100.0 and not tally.failures and corruptions.passed
    print(f"targets (0 tracebacks, 0 lost, 100% detected and repaired, 100% complete, no failed case): {'PASS' if passed else 'FAIL'}")
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
