#!/usr/bin/env python3
"""Fault figures for the trust issue: deploys killed, raced, starved of space; stores corrupted.

    python benchmarks/bench_faults.py [--rounds 2] [--no-ssh] [--corruptions 40] [--trust-only]

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

5. trust, round two (issue 25; ``--trust-only`` runs just these), through ``python -m kzbuild``
   on the tiny llama.cpp-shaped project: a build against each hostile answer of a fake redis
   and HTTP store (tests/hostileservers.py: nesting, 1 TiB sizes, garbage, drip, endless,
   long lines, a 1 TiB manifest, a redirect to another host), timed against a local build;
   runs with passwords configured (one percent-encoded holding / # ? @ and a space, one typed
   raw), then a grep of every output and every file under the machines' cache, work and
   results dirs; stuck device states on each transport (a directory or symlink at an object
   or chunk, incoming/ linked out of the root, garbage lock owners, bad KZ_LOCK_LEASE values,
   a damaged deploy log), each followed by a plain deploy and verify, which must succeed; a
   10^12-point plan, profile --from-log of /dev/zero and a FIFO, a non-UTF-8 work dir, and
   read-only work and cache dirs (a tmpfs, where mounting is permitted).

Figures: cases tried, tracebacks (any "Traceback" in any output), data lost (current not a
complete release, or a file not matching its hash), corruptions detected (and repaired) and
concurrent deploys complete (%); for 5: internal errors, devices left needing a person,
secrets found, the worst hostile-cache build against a local one. Targets: 0 tracebacks, 0
lost, 100% detected, 100% complete; 0 internal errors, 0 devices needing a person, 0 secrets,
no hostile-cache build more than 3 s slower than a local one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
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

# device commands of a deploy of b2 over b1 (local, ssh) (see tests/deploy/test_deploy_faults.py)
OPERATIONS = 3
BUSY, DEVICE_ERROR = 10, 8


@dataclass
class Finished:
    code: int
    output: str


@dataclass
class Cases:
    """Cases tried and the checks that failed, each named."""

    cases: int = 0
    failures: list[str] = field(default_factory=list)

    def fail(self, case: str, why: str) -> None:
        self.failures.append(f"{case}: {why}")


@dataclass
class Tally(Cases):
    tracebacks: int = 0
    lost: int = 0
    concurrent: int = 0
    concurrent_complete: int = 0


class Bench:
    def __init__(self, work: Path, tally: Tally) -> None:
        self.work = work
        self.tally = tally
        self.maker = ArtifactMaker(work / "artifacts", work / "parts")
        self.builds = {
            n: self.maker.make(f"b{n}", greeting=f"v{n}", blob_seed=n, blob_size=256 * 1024)
            for n in (1, 2, 3)
        }
        self.roots = 0

    def fresh_root(self) -> Path:
        self.roots += 1
        return self.work / f"device-{self.roots}"

    def start(self, args: list[str], **options) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
        env = options.pop("env", {})
        kz = ["--project", str(REPO), "--work-dir", str(self.work / "kz"), *args]
        return subprocess.Popen(
            fault_driver.command(kz, **options),
            cwd=REPO,
            env={**os.environ, "COLUMNS": "200", **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
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
            return self.tally.fail(
                case, f"recovery deploy exit {recovered.code}: {recovered.output}"
            )
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
        first = self.start(
            self.deploy_args(spec, 3, *wait), slow=0.05 if kind == "no-wait" else 0.02
        )
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
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "kz-bench", str(root)], check=True
        )
        try:
            spec = spec_for(root)
            if (setup := self.run(self.deploy_args(spec, 1))).code != 0:
                return self.tally.fail(case, f"setup deploy failed: {setup.output}")
            big = self.maker.make(f"big{size_kib}", greeting="big", blob_seed=9, blob_size=2 << 20)
            full = self.run(["deploy", "--device", spec, "--artifact", str(big)])
            if full.code != DEVICE_ERROR or " is full: " not in " ".join(full.output.split()):
                self.tally.fail(
                    case, f"expected exit 8 naming a full device, got {full.code}: {full.output}"
                )
            if self.check(case, root) != "b1":
                self.tally.fail(case, "current moved off b1 on a full disk")
            subprocess.run(["mount", "-o", "remount,size=16m", str(root)], check=True)
            grown = self.run(["deploy", "--device", spec, "--artifact", str(big)])
            if grown.code != 0 or self.check(case, root) != big.name:
                self.tally.fail(
                    case, f"deploy after the disk grew: exit {grown.code}: {grown.output}"
                )
        finally:
            subprocess.run(["umount", "-l", str(root)], check=True)


# --- trust, round two (issue 25): hostile caches, secrets, stuck devices, runaway inputs ------

INTERNAL = 70
HOSTILE_BUDGET = 3.0  # seconds a hostile cache may add to a build (the 2 s timeout and change)
# passwords as a team might pick them: one percent-encoded in the URL, one typed raw (a URL error)
ENCODED_PASSWORD = "se/cr#et?pw@x 1"
RAW_PASSWORD = "se/cretPW"
GARBAGE_OWNERS = {
    "newline host": ("machine\nevil\n123\n2026-01-01T00:00:00Z\ndeploy\ntok-1\n", -2 * 86400),
    "future heartbeat": ("elsewhere\n123\n2030-01-01T00:00:00Z\ndeploy\ntok-2\n", 30 * 86400),
    "pid 0 here": ("{host}\n0\n2026-01-01T00:00:00Z\ndeploy\ntok-3\n", 0),
    "pid too large": (
        "elsewhere\n" + "9" * 30 + "\n2026-01-01T00:00:00Z\ndeploy\ntok-4\n",
        -2 * 86400,
    ),
    "empty owner": ("", -2 * 86400),
}


@dataclass
class TrustTally(Cases):
    internal_errors: int = 0
    stuck_devices: int = 0
    secrets_found: int = 0
    hostile_builds: int = 0
    hostile_failed: int = 0
    local_seconds: float = 0.0
    worst_overhead: float = 0.0
    grepped_outputs: int = 0
    grepped_files: int = 0


class TrustBench:
    """The cases of issue 25 through ``python -m kzbuild`` subprocesses against real parts: the tiny
    llama.cpp-shaped project built for the host, fake hostile cache servers on 127.0.0.1
    (tests/hostileservers.py), local and ssh device roots."""

    def __init__(self, work: Path, tally: TrustTally, maker: ArtifactMaker) -> None:
        from tests.conftest import UpstreamRepo
        from tests.fixtures_build import TINY_CMAKE, TINY_MAIN, install_toolchains

        self.work = work
        self.tally = tally
        self.maker = maker
        self.outputs: list[str] = []  # every stdout and stderr, for the secrets grep
        self.grepped = 0  # files
        upstream = UpstreamRepo(
            work / "upstream"
        )  # as tests/conftest.py's upstream and tiny fixtures
        upstream.commit(
            {"ggml/src/ggml.c": "int ggml_answer(void) { return 42; }\n"}, "initial import"
        )
        commit = upstream.commit({"CMakeLists.txt": TINY_CMAKE, "tools/main.c": TINY_MAIN}, "tiny")
        self.project = work / "project"
        for folder in ("recipes", "patches", "kernels"):
            (self.project / folder).mkdir(parents=True)
        (self.project / "patches" / "series").write_text("")
        (self.project / "recipes" / "tiny.yaml").write_text(
            "description: tiny\nupstream:\n  remote: https://example.invalid/llama.cpp\n"
            f"  commit: {commit}\n  sources:\n    - path: {upstream.path}\n"
            "build:\n  targets: [host]\n"
        )
        install_toolchains(_ProjectRoot(self.project))  # type: ignore[arg-type]
        self.machines = 0
        self.builds = tuple(
            maker.make(f"t{n}", greeting=f"t{n}", blob_seed=10 + n, blob_size=256 << 10)
            for n in (1, 2)
        )

    def kz(
        self, machine: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 300
    ) -> Finished:
        argv = [
            sys.executable,
            "-m",
            "kzbuild",
            "--project",
            str(machine / "project"),
            "--cache-dir",
            str(machine / "cache"),
            "--work-dir",
            str(machine / "work"),
            "--results-dir",
            str(machine / "results"),
            *args,
        ]
        full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
        done = subprocess.run(
            argv, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout
        )
        output = done.stdout + done.stderr
        self.outputs.append(output)
        shows_traceback = "Traceback" in output and "-vv" not in args  # -vv shows every error's
        if (
            done.returncode == INTERNAL
            or "internal error (a kzbuild bug)" in output
            or shows_traceback
        ):
            self.tally.internal_errors += 1
            self.tally.fail(f"kzbuild {' '.join(args[:3])}", f"internal error: {output[-600:]}")
        return Finished(done.returncode, output)

    def machine(self, config: str | None = None) -> Path:
        """A fresh "machine": a copy of the project with empty cache, work and results dirs."""
        self.machines += 1
        machine = self.work / f"machine-{self.machines}"
        shutil.copytree(self.project, machine / "project")
        if config is not None:
            (machine / "project" / ".kz").mkdir()
            (machine / "project" / ".kz" / "config.yaml").write_text(config)
        return machine

    # --- hostile caches ---
    def local_baseline(self, rounds: int = 3) -> None:
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            done = self.kz(self.machine(), "build", "tiny", "--no-remote-cache")
            times.append(time.perf_counter() - started)
            if done.code != 0:
                self.tally.fail("local build", done.output[-400:])
        self.tally.local_seconds = sorted(times)[len(times) // 2]

    def hostile(self, kind: str, mode: str) -> None:
        from tests.hostileservers import FakeHttpStore, FakeRedis

        case = f"hostile {kind} cache: {mode}"
        self.tally.cases += 1
        server = FakeRedis("hostile-pw") if kind == "redis" else FakeHttpStore("kz", "hostile-pw")
        try:
            config = f"remote-cache:\n  url: {server.url()}\n  ccache: false\n"
            pushed = self.kz(self.machine(config), "build", "tiny", "--json")
            if pushed.code != 0:
                return self.tally.fail(case, f"the honest push failed: {pushed.output[-400:]}")
            server.mode = mode
            started = time.perf_counter()
            built = self.kz(self.machine(config), "build", "tiny", "--json")
            seconds = time.perf_counter() - started
        finally:
            server.close()
        self.tally.hostile_builds += 1
        overhead = seconds - self.tally.local_seconds
        self.tally.worst_overhead = max(self.tally.worst_overhead, overhead)
        if built.code != 0:
            self.tally.hostile_failed += 1
            return self.tally.fail(
                case, f"the build failed (exit {built.code}): {built.output[-400:]}"
            )
        if overhead > HOSTILE_BUDGET:
            self.tally.fail(case, f"{overhead:.1f} s slower than a local build")
        if (
            kind == "http"
            and mode == "redirect"
            and any("authorization" in h for h in server.elsewhere_headers)
        ):
            self.tally.secrets_found += 1
            self.tally.fail(case, "the credentials followed the redirect to another host")

    # --- secrets ---
    def secrets(self) -> None:
        """Runs with passwords configured, then a grep of everything kzbuild wrote and printed."""
        from urllib.parse import quote

        from tests.hostileservers import FakeRedis

        self.tally.cases += 1
        server = FakeRedis(ENCODED_PASSWORD)
        machines = []
        try:
            url = f"redis://:{quote(ENCODED_PASSWORD, safe='')}@127.0.0.1:{server.port}/0"
            machine = self.machine(f"remote-cache:\n  url: {url}\n")
            machines.append(machine)
            for args in (
                ["-v", "build", "tiny"],
                ["build", "tiny", "--json"],
                ["-vv", "build", "tiny", "--dry-run"],
                ["cache", "stats"],
                ["cache", "stats", "--json"],
            ):
                self.kz(machine, *args)
            if not server.data:
                self.tally.fail("secrets", "the build with the password configured pushed nothing")
            wrong = f"redis://:{quote(ENCODED_PASSWORD, safe='')}-wrong@127.0.0.1:{server.port}"
            self.kz(self.machine(), "-v", "build", "tiny", env={"KZ_REMOTE_CACHE": wrong})
            raw = f"redis://:{RAW_PASSWORD}@127.0.0.1:{server.port}"  # unencoded '/': a bad URL
            broken = self.machine(f"remote-cache:\n  url: {raw}\n")
            machines.append(broken)
            self.kz(broken, "-vv", "build", "tiny")
            self.kz(self.machine(), "-vv", "cache", "stats", env={"KZ_REMOTE_CACHE": raw})
            spaced = f"redis://:{ENCODED_PASSWORD}@127.0.0.1:{server.port}"  # a raw space: refused
            self.kz(self.machine(), "-vv", "build", "tiny", env={"KZ_REMOTE_CACHE": spaced})
        finally:
            server.close()
        secrets = {ENCODED_PASSWORD, quote(ENCODED_PASSWORD, safe=""), RAW_PASSWORD}
        for index, output in enumerate(self.outputs):
            if any(secret in output for secret in secrets):
                self.tally.secrets_found += 1
                self.tally.fail("secrets", f"output {index} shows a password")
        holders = []
        for machine in (self.work / f"machine-{n}" for n in range(1, self.machines + 1)):
            for path in machine.rglob("*"):
                if path.is_file() and not path.is_symlink():
                    self.grepped += 1
                    data = path.read_bytes()
                    if any(secret.encode() in data for secret in secrets):
                        holders.append(path)
        for path in holders:
            if path.parent.name == ".kz" and path.name == "config.yaml":
                continue  # the config file holds the password by design
            self.tally.secrets_found += 1
            self.tally.fail("secrets", f"{path} holds a password")
        if sum(path.name == "config.yaml" for path in holders) != 2:  # the grep's own check
            self.tally.fail(
                "secrets", "the grep did not find the passwords in the two config files"
            )

    # --- stuck devices ---
    def stuck(self, label: str, spec_for: Callable[[Path], str], state: str) -> None:
        case = f"{label} stuck device: {state}"
        self.tally.cases += 1
        root = self.work / f"stuck-{self.tally.cases}"
        spec = spec_for(root)
        machine = self.machine()
        b1, b2 = self.builds
        if self.kz(machine, "deploy", "--device", spec, "--artifact", str(b1)).code != 0:
            return self.tally.fail(case, "setup deploy failed")
        if state in ("object is a directory", "chunk is a symlink", "object is a symlink"):
            folder = root / ("chunks" if "chunk" in state else "objects")
            victim = sorted(folder.iterdir())[0]
            data = victim.read_bytes()
            victim.unlink()
            if "directory" in state:
                victim.mkdir()
            else:
                (self.work / f"outside-{self.tally.cases}").write_bytes(data)
                victim.symlink_to(self.work / f"outside-{self.tally.cases}")
        elif state == "incoming links out of the root":
            (root / "incoming").rmdir()
            (self.work / f"outside-{self.tally.cases}").mkdir()
            (root / "incoming").symlink_to(self.work / f"outside-{self.tally.cases}")
        elif state in GARBAGE_OWNERS:
            owner, offset = GARBAGE_OWNERS[state]
            (root / ".lock").mkdir()
            (root / ".lock" / "owner").write_text(owner.format(host=socket.gethostname()))
            moment = time.time() + offset
            os.utime(root / ".lock" / "owner", (moment, moment))
        elif state.startswith("KZ_LOCK_LEASE="):
            refused = self.kz(
                machine,
                "deploy",
                "--device",
                spec,
                "--artifact",
                str(b2),
                env={"KZ_LOCK_LEASE": state.partition("=")[2]},
            )
            if refused.code != 2 or (root / ".lock").exists():
                self.tally.fail(case, f"expected exit 2 and no lock left, got {refused.code}")
        elif state == "damaged deploy log":
            self.kz(machine, "deploy", "--device", spec, "--artifact", str(b2))
            log = root / "deploys.log"
            log.write_bytes(log.read_bytes()[:-5] + b"\x00\n")
            refused = self.kz(machine, "deploy", "--device", spec, "--rollback")
            if refused.code != DEVICE_ERROR or "deploys.log" not in refused.output:
                self.tally.fail(case, f"--rollback did not refuse naming the log: {refused.code}")
            log.write_text(
                ""
            )  # a person's fix is to remove the bad lines; deploy must work regardless
        # what a person would otherwise do: nothing. A plain deploy and verify must succeed.
        again = self.kz(machine, "deploy", "--device", spec, "--artifact", str(b2))
        verify = self.kz(machine, "device", "verify", "--device", spec)
        try:
            current = assert_store_invariant(root)
        except (AssertionError, OSError) as exc:
            current = f"broken: {exc}"
        if again.code != 0 or verify.code != 0 or current != "t2":
            self.tally.stuck_devices += 1
            self.tally.fail(
                case,
                f"needs a person: deploy {again.code}, verify {verify.code}, current {current}",
            )

    # --- runaway inputs and unwritable places ---
    def runaway(self) -> None:
        machine = self.machine()
        values = "[" + ", ".join(str(v) for v in range(1, 1001)) + "]"
        plan = machine / "huge-plan.yaml"
        plan.write_text(
            "model:\n  path: models/m.gguf\n  sha256: "
            + "a" * 64
            + "\nruns:\n  - name: r\n    options: {n: 0}\n"
            "    sweep:\n"
            + "".join(f"      {axis}: {values}\n" for axis in ("p", "b", "ub", "env:A"))
        )
        fifo = machine / "fifo"
        os.mkfifo(fifo)
        checks = [
            (
                "a 10^12-point plan",
                ["bench", "--plan", str(plan), "--device", f"local:{machine / 'dev'}"],
                2,
            ),
            ("profile --from-log /dev/zero", ["profile", "--from-log", "/dev/zero"], 2),
            ("profile --from-log FIFO", ["profile", "--from-log", str(fifo)], 2),
            (
                "non-UTF-8 work dir",
                ["--work-dir", os.fsdecode(bytes(machine) + b"/w\xff"), "recipes"],
                2,
            ),
        ]
        for label, args, code in checks:
            self.tally.cases += 1
            started = time.perf_counter()
            done = self.kz(machine, *args, timeout=60)
            if done.code != code or time.perf_counter() - started > 10:
                self.tally.fail(
                    label,
                    f"exit {done.code} after {time.perf_counter() - started:.1f} s, "
                    f"expected {code}",
                )

    def read_only(self, place: str) -> None:
        self.tally.cases += 1
        machine = self.machine()
        folder = machine / place
        folder.mkdir()
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "kz-bench", str(folder)], check=True
        )
        try:
            done = self.kz(machine, "build", "tiny")
            if done.code != 14 or str(folder) not in " ".join(done.output.split()):
                self.tally.fail(f"read-only {place} dir", f"exit {done.code}: {done.output[-300:]}")
        finally:
            subprocess.run(["umount", "-l", str(folder)], check=True)


@dataclass
class _ProjectRoot:
    root: Path


def run_trust(
    work: Path, transports: list[tuple[str, Callable[[Path], str]]], can_mount_here: bool
) -> TrustTally:
    from tests.hostileservers import HTTP_MODES, REDIS_MODES

    tally = TrustTally()
    bench = TrustBench(
        work / "trust", tally, ArtifactMaker(work / "trust-artifacts", work / "trust-parts")
    )
    bench.local_baseline()
    for kind, modes in (("redis", REDIS_MODES), ("http", HTTP_MODES)):
        for mode in modes:
            bench.hostile(kind, mode)
    bench.secrets()
    tally.grepped_outputs, tally.grepped_files = len(bench.outputs), bench.grepped
    states = [
        "object is a directory",
        "object is a symlink",
        "chunk is a symlink",
        "incoming links out of the root",
        *GARBAGE_OWNERS,
        *(f"KZ_LOCK_LEASE={v}" for v in ("nan", "inf", "-1", "1e400")),
        "damaged deploy log",
    ]
    for label, spec_for in transports:
        for state in states:
            bench.stuck(label, spec_for, state)
    bench.runaway()
    if can_mount_here:
        for place in ("work", "cache"):
            bench.read_only(place)
    return tally


def print_trust(tally: TrustTally) -> bool:
    print("trust (issue 25):")
    print(f"  cases tried                       {tally.cases}")
    print(f"  internal errors                   {tally.internal_errors}")
    print(f"  devices left needing a person     {tally.stuck_devices}")
    print(
        f"  secrets found by grep             {tally.secrets_found} "
        f"(in {tally.grepped_outputs} outputs, "
        f"{tally.grepped_files} files)"
    )
    print(
        f"  hostile-cache builds              {tally.hostile_builds} "
        f"({tally.hostile_failed} failed)"
    )
    print(
        f"  local build / worst overhead      {tally.local_seconds:.1f} s / "
        f"{tally.worst_overhead:+.1f} s "
        f"(goal <= +{HOSTILE_BUDGET:.0f} s)"
    )
    print(f"  failed checks                     {len(tally.failures)}")
    for failure in tally.failures:
        print(f"    {failure}")
    return not (
        tally.internal_errors
        or tally.stuck_devices
        or tally.secrets_found
        or tally.hostile_failed
        or tally.worst_overhead > HOSTILE_BUDGET
        or tally.failures
    )


def can_mount(work: Path) -> str | None:
    """None if a tmpfs can be mounted here, else why not."""
    probe = work / "mount-probe"
    probe.mkdir()
    result = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "kz-probe", str(probe)],
        capture_output=True,
        text=True,
    )
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
    parser.add_argument(
        "--rounds", type=int, default=2, help="rounds of each concurrency case per transport"
    )
    parser.add_argument("--no-ssh", action="store_true", help="the local transport only")
    parser.add_argument(
        "--corruptions",
        type=int,
        default=40,
        help="corruptions injected into a device store (see bench_store.py)",
    )
    parser.add_argument(
        "--trust-only",
        action="store_true",
        help="only the cases of issue 25 (hostile caches, secrets, stuck devices, ...)",
    )
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
        server = SshServer(
            work / "sshd", free_port(), keygen(work / "host_key"), keygen(work / "client_key")
        )
        server.start()
        ssh_home(work, server)
        transports.append(("ssh", server.spec))
    no_mount = can_mount(work)
    started = time.perf_counter()
    trust: TrustTally | None = None
    try:
        trust = run_trust(work, transports, no_mount is None)
        for label, spec_for in [] if args.trust_only else transports:
            for point in range(1, OPERATIONS + 1):
                bench.kill(label, spec_for, point)
            for kind in ("deploys", "no-wait", "rollback", "keep"):
                for _ in range(args.rounds):
                    bench.concurrent(label, spec_for, kind)
            if no_mount is None:
                for size in (
                    768,
                    1024,
                ):  # b1 takes about 620 KiB: its libblob.so also lies in chunks/
                    bench.full_disk(label, spec_for, size)
    finally:
        if server:
            server.stop()
    if args.trust_only:
        names = ", ".join(label for label, _ in transports)
        print(f"transports: {names}; {time.perf_counter() - started:.1f} s")
        passed = print_trust(trust)
        shutil.rmtree(work, ignore_errors=True)
        sys.exit(0 if passed else 1)
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
    print(
        f"corruptions detected         {100 * detected / max(injected, 1):.0f}% "
        f"({detected}/{injected}; "
        f"repaired {sum(corruptions.repaired.values())}/{sum(corruptions.repairable.values())} of "
        "those deploy can repair)"
    )
    print(
        f"concurrent deploys complete  {complete:.0f}% "
        f"({tally.concurrent_complete}/{tally.concurrent})"
    )
    print(f"failed checks                {len(tally.failures)}")
    for failure in tally.failures:
        print(f"  {failure}")
    trusted = print_trust(trust)
    faults_passed = not (tally.tracebacks or tally.lost or tally.failures) and complete == 100.0
    passed = faults_passed and corruptions.passed and trusted
    print(
        "targets (0 tracebacks, 0 lost, 100% detected and repaired, 100% complete, no failed "
        f"case): {'PASS' if passed else 'FAIL'}"
    )
    shutil.rmtree(work, ignore_errors=True)
    sys.exit(0 if passed else 1)


if __name__ == "__main__":
    main()
