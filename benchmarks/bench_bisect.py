#!/usr/bin/env python3
"""Bisect figures (issue 28): the right commit where a plain `git bisect run` is fooled by noise,
and what a pool of two adb devices on two adb servers saves.

A synthetic upstream of 64 commits (a real git repo) in which commit STEP makes the benched
number 10% lower; every bench sample carries seeded Gaussian noise (--noise, relative sd).
- plain: `git bisect run` with a script that benches each commit once and calls it bad when its
  one sample is below the midpoint of one sample of good and one of bad (what a user scripts);
- kzbuild: kzbuild.measure.bisect's search (interleaved rounds, bootstrap intervals, adaptive
  repeats) with the same noise model.
Both count builds (commits built) and bench samples; kzbuild's search runs on one simulated device
and on a pool of two (each with its own noise).

Then the pool, for real: `kzbuild bisect` (the command, a process of its own each time) over a
tiny llama.cpp-shaped upstream of 64 commits (real sync, cmake builds into the artifact store,
deploys, llama-bench runs) on one adb test device, and on a pool of two adb test devices served
by two real `adb` servers on two ports (the second device named with `server: HOST:PORT`, as a
tablet on another machine is). Each test device runs in a process of its own. Its llama-bench
sleeps --turn-ms (the device's time: on a tablet llama-bench runs there, not on this machine's
cores) and its t/s carries --pool-noise. A first bisect of each kind, untimed, fills the artifact
store; each timed one has its own seed (so its own record: everything is benched again, nothing
is built again). The timed bisects alternate between the kinds; each one's wall time and rounds
are printed, then the median wall time of --pool-trials bisects of each kind and the range of the
machine's load average (taken before each).

Usage: python benchmarks/bench_bisect.py [--trials N] [--noise 0.05] [--turn-ms 300]
           [--pool-noise 0.02] [--pool-trials 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kzbuild.measure.bisect import BuiltCommit, Record, Search  # noqa: E402
from kzbuild.model.bisect import BisectLimits, BisectOutcome  # noqa: E402
from tests.ab.conftest import SPEED  # noqa: E402
from tests.adbdevice import PrivateAdbServer  # noqa: E402
from tests.adbdevice.process import DeviceProcess  # noqa: E402
from tests.conftest import Project, UpstreamRepo  # noqa: E402
from tests.fixtures_build import TINY_CMAKE, install_toolchains  # noqa: E402

COMMITS = 64
DROP = 0.10
PLAIN_SCRIPT = """\
import os, random, subprocess, sys
index = int(subprocess.check_output(["git", "show", "-s", "--format=%s", "HEAD"], text=True).split()[-1])
rng = random.Random(int(os.environ["KZ_BENCH_SEED"]) * 1000 + index)
speed = 100.0 * (1 - {drop} if index >= int(os.environ["KZ_STEP"]) else 1.0) * rng.gauss(1.0, {noise})
with open(os.environ["KZ_COUNT"], "a") as count:
    count.write("x")
sys.exit(1 if speed < float(os.environ["KZ_THRESHOLD"]) else 0)
"""


def make_repo(folder: Path) -> list[str]:
    def run(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(folder), *args], check=True, capture_output=True, text=True
        )
        return done.stdout

    folder.mkdir(parents=True)
    env_free = ["-c", "user.name=bench", "-c", "user.email=bench@example.invalid"]
    run("init", "-q")
    shas = []
    for index in range(COMMITS):
        (folder / "n.txt").write_text(f"{index}\n")
        run("add", "n.txt")
        run(*env_free, "commit", "-q", "-m", f"commit {index}")
        shas.append(run("rev-parse", "HEAD").strip())
    return shas


def plain(repo: Path, shas: Sequence[str], step: int, noise: float, seed: int) -> tuple[int, int]:
    """git bisect run benching each commit once: the commit it names, and the samples it took."""
    rng = random.Random(seed)
    good, bad = (100.0 * rng.gauss(1.0, noise), 100.0 * (1 - DROP) * rng.gauss(1.0, noise))
    script = repo.parent / "measure.py"
    script.write_text(PLAIN_SCRIPT.format(drop=DROP, noise=noise))
    count = repo.parent / f"count-{seed}"
    count.write_text("")
    env = {
        "KZ_BENCH_SEED": str(seed),
        "KZ_STEP": str(step),
        "KZ_THRESHOLD": str((good + bad) / 2),
        "KZ_COUNT": str(count),
        "PATH": "/usr/bin:/bin",
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": str(repo.parent),
    }
    git = ["git", "-C", str(repo)]
    subprocess.run(
        [*git, "bisect", "start", shas[-1], shas[0]], check=True, capture_output=True, env=env
    )
    out = subprocess.run(
        [*git, "bisect", "run", sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    subprocess.run([*git, "bisect", "reset"], check=True, capture_output=True, env=env)
    named = next(
        (line.split()[0] for line in out.splitlines() if "is the first bad commit" in line), ""
    )
    return (shas.index(named) if named in shas else -1), 2 + len(count.read_text())


class Device:
    """A simulated device: commit index >= step is DROP slower, each sample with noise."""

    test = "pp512"

    def __init__(self, shas: Sequence[str], step: int, noise: float, seed: int) -> None:
        self.index = {sha: i for i, sha in enumerate(shas)}
        self.step, self.noise = step, noise
        self.rng = random.Random(seed)
        self.samples = 0

    def __call__(
        self,
        artifacts: Mapping[str, str],
        blocks: int,
        seed: int,
        stopped: Callable[[], bool],
    ) -> Mapping[str, Sequence[float]]:
        # a stop between blocks ends the round, as on a device
        done = next((n for n in range(1, blocks) if stopped()), blocks)
        self.samples += done * len(artifacts)
        return {
            sha: [
                100.0
                * (1 - DROP if self.index[sha] >= self.step else 1.0)
                * self.rng.gauss(1.0, self.noise)
                for _ in range(done)
            ]
            for sha in artifacts
        }


def kzbuild_search(
    folder: Path, shas: Sequence[str], devices: Mapping[str, Device], seed: int
) -> tuple[BisectOutcome, int, int, int]:
    built: list[str] = []

    def build(sha: str) -> BuiltCommit:
        built.append(sha)
        return BuiltCommit(artifact=sha, build_id=sha[:16])

    search = Search(
        Record.open(folder, {"bench": str(seed)}, shas),
        build,
        dict(devices),
        BisectLimits(),
        seed=seed,
    )
    outcome, _, _, hi = search.run()
    return outcome, hi, len(built), sum(d.samples for d in devices.values())


# --- the pool, for real: kzbuild bisect on two adb test devices behind two adb servers ---

POOL_STEP = 41  # of 1..63 after the pin
ROOT = "/data/local/tmp/kz-engine"
# llama-bench -o json shaped, as the ab tests' tiny one; it sleeps KZ_TINY_TURN_MS (the device's
# time) and its t/s carries KZ_TINY_NOISE (relative sd; a sum of 12 uniforms, no libm needed)
SLEEPY_BENCH = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
double ggml_speed(void);
int main(void) {
    double s = ggml_speed(), z = -6.0;
    const char * noise = getenv("KZ_TINY_NOISE");
    const char * ms = getenv("KZ_TINY_TURN_MS");
    srand((unsigned) getpid() * 2654435761u ^ (unsigned) time(NULL));
    for (int i = 0; i < 12; i++) z += rand() / (RAND_MAX + 1.0);
    if (noise) s *= 1.0 + atof(noise) * z;
    if (ms) usleep(atoi(ms) * 1000);
    printf("[{\"build_commit\":\"%s\",\"model_type\":\"tiny\",\"model_size\":1000,"
           "\"n_prompt\":32,\"n_gen\":0,\"n_depth\":0,\"n_threads\":1,\"avg_ts\":%.3f,"
           "\"stddev_ts\":1.0,\"samples_ts\":[%.3f]}]\n", LLAMA_BUILD_COMMIT, s, s);
    return 0;
}
"""
PLAN = """\
description: bisect on a pool of adb test devices
model: {{path: models/q.gguf, sha256: {sha}}}
repetitions: 1
env: {{KZ_TINY_TURN_MS: "{turn_ms}", KZ_TINY_NOISE: "{noise}"}}
runs:
  - name: prefill
    options: {{p: 32, n: 0, t: 1}}
"""


def pool_project(work: Path, turn_ms: int, noise: float) -> tuple[Project, list[str]]:
    """The tiny upstream (64 commits, POOL_STEP 10% slower), its recipe and the plan."""
    upstream = UpstreamRepo(work / "upstream")
    shas = [
        upstream.commit(
            {"CMakeLists.txt": TINY_CMAKE, "tools/main.c": SLEEPY_BENCH, "ggml/src/ggml.c": SPEED},
            "tiny llama.cpp-shaped build whose llama-bench takes the device's time",
        )
    ]
    for n in range(1, 64):
        files = {"docs/log.txt": f"change {n}\n"}
        if n == POOL_STEP:
            files["ggml/src/ggml.c"] = SPEED.replace("100.0", "90.0")
        shas.append(upstream.commit(files, f"change {n}"))
    project = Project(root=work / "project", cache=work / "cache", work=work / "work")
    for folder in ("recipes", "patches", "kernels"):
        (project.root / folder).mkdir(parents=True)
    project.write("patches/series", "")
    install_toolchains(project)
    project.recipe(
        "tiny",
        commit=shas[0],
        sources=[f"path: {upstream.path}"],
        extra="build:\n  targets: [host]\n",
    )
    sha = hashlib.sha256(b"GGUF stand-in").hexdigest()
    project.write("plans/pool.yaml", PLAN.format(sha=sha, turn_ms=turn_ms, noise=noise))
    return project, shas


def pool_bisect(
    project: Project, shas: Sequence[str], device: str, seed: int, env: Mapping[str, str]
) -> tuple[float, dict[str, object]]:
    """One `kzbuild bisect` as a user runs it: its wall time and its --json report."""
    argv = [
        *(sys.executable, "-m", "kzbuild", "--project", str(project.root)),
        *("--cache-dir", str(project.cache), "--work-dir", str(project.work)),
        *("bisect", "tiny", "--good", shas[0], "--bad", shas[-1]),
        *("--plan", str(project.root / "plans" / "pool.yaml"), "--device", device),
        *("--seed", str(seed), "--json"),
    ]
    started = time.monotonic()
    done = subprocess.run(argv, cwd=REPO, env=dict(env), capture_output=True, text=True)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"kzbuild bisect on {device} failed ({done.returncode}):\n{done.stderr}")
    report: dict[str, object] = json.loads(done.stdout)
    return wall, report


def pool_figures(work: Path, turn_ms: int, noise: float, trials: int) -> None:
    project, shas = pool_project(work, turn_ms, noise)
    servers = [PrivateAdbServer(work / f"adb-server-{n}") for n in (1, 2)]
    devices: list[DeviceProcess] = []
    try:
        for server in servers:
            server.start()
            devices.append(DeviceProcess(work / f"adb-device-{len(devices) + 1}", REPO))
        model = work / "q.gguf"
        model.write_bytes(b"GGUF stand-in")
        for server, device in zip(servers, devices, strict=True):
            server.adb("connect", device.serial)
            server.adb("-s", device.serial, "shell", "mkdir", "-p", f"{ROOT}/models")
            server.adb("-s", device.serial, "push", str(model), f"{ROOT}/models/q.gguf")
        first, second = devices
        project.write(
            "recipes/devices.yaml",
            "devices:\n"
            f"  pad-a: {{transport: adb, serial: '{first.serial}', root: {ROOT}}}\n"
            f"  pad-b: {{transport: adb, serial: '{second.serial}', root: {ROOT}, "
            f"server: '127.0.0.1:{servers[1].port}'}}\n"
            "pools:\n  pads: [pad-a, pad-b]\n",
        )
        # pad-a is on the default server (this port); pad-b only through the other one
        env = {**os.environ, **servers[0].env, "PYTHONPATH": str(REPO)}
        kinds = {"one device": "pad-a", "pool of two": "pads"}
        for kind, device in kinds.items():  # fills the artifact store
            wall, report = pool_bisect(project, shas, device, 1000, env)
            print(
                f"  first bisect, {kind}: {wall:.1f} s, {report['builds']} builds "
                f"({report['built_ahead_unused']} of them ahead, not needed), "
                f"{report['benches']} rounds"
            )
        times: dict[str, list[float]] = {kind: [] for kind in kinds}
        rounds: dict[str, list[int]] = {kind: [] for kind in kinds}
        loads: list[float] = []
        for trial in range(trials):
            order = list(kinds) if trial % 2 == 0 else list(reversed(kinds))
            for kind in order:
                loads.append(os.getloadavg()[0])
                wall, report = pool_bisect(project, shas, kinds[kind], trial, env)
                notes = report["notes"]
                assert isinstance(notes, list)
                stopped = sum(": stopped, " in str(note) for note in notes)
                print(
                    f"  seed {trial}, {kind}: {wall:.1f} s, {report['benches']} rounds, "
                    f"{stopped} comparisons stopped as moot"
                )
                culprit = report["culprit"]
                if not isinstance(culprit, dict) or culprit["sha"] != shas[POOL_STEP]:
                    raise SystemExit(f"{kind}, seed {trial}: not the right commit: {culprit}")
                times[kind].append(wall)
                rounds[kind].append(int(str(report["benches"])))
        one, two = (statistics.median(times[kind]) for kind in kinds)
        print(
            f"  kzbuild bisect on real adb test devices ({turn_ms} ms of llama-bench per turn, "
            f"{noise:.0%} noise, warm artifact store, median of {trials}): one device "
            f"{one:.1f} s ({statistics.median(rounds['one device']):g} interleaved rounds), "
            f"pool of two on two adb servers {two:.1f} s "
            f"({statistics.median(rounds['pool of two']):g} rounds): {two / one:.2f}x; "
            f"goal <= 0.7x (load average {min(loads):.1f} to {max(loads):.1f})"
        )
    finally:
        for server, device in zip(servers, devices, strict=False):
            server.adb("disconnect", device.serial)
        for device in devices:
            device.stop()
        for server in servers:
            server.stop()


def simulated(work: Path, trials: int, noise: float) -> None:
    """The plain script against kzbuild's search (builds on demand) on simulated devices."""
    shas = make_repo(work / "upstream")
    plain_right, plain_samples = 0, 0
    # kzbuild's search on one simulated device, and on a pool of two: right, builds, samples
    ours = {"one device": [0, 0, 0], "a pool of two": [0, 0, 0]}
    for trial in range(trials):
        step = random.Random(trial).randrange(1, COMMITS)
        named, samples = plain(work / "upstream", shas, step, noise, seed=trial)
        plain_right, plain_samples = plain_right + (named == step), plain_samples + samples
        for kind, count in (("one device", 1), ("a pool of two", 2)):
            devices = {f"d{n}": Device(shas, step, noise, trial + 1000 * n) for n in range(count)}
            outcome, hi, builds, samples = kzbuild_search(
                work / f"k{trial}-{count}", shas, devices, trial
            )
            found = outcome is BisectOutcome.FOUND and hi == step
            ours[kind] = [
                ours[kind][0] + found,
                ours[kind][1] + builds,
                ours[kind][2] + samples,
            ]
    print(f"{trials} trials, 64 commits, a {DROP:.0%} step, {noise:.0%} noise per sample")
    print(
        f"  plain git bisect run (one sample per commit): right {plain_right}/{trials}, "
        f"{plain_samples / trials:.1f} samples on average, builds = samples"
    )
    for kind, (right, builds, samples) in ours.items():
        print(
            f"  kzbuild bisect on {kind}: right {right}/{trials}, "
            f"{builds / trials:.1f} builds, {samples / trials:.1f} samples on average"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument(
        "--noise", type=float, default=0.05, help="relative sd of a sample (default 5%%)"
    )
    parser.add_argument(
        "--turn-ms", type=int, default=300, help="the test devices' llama-bench time per turn"
    )
    parser.add_argument(
        "--pool-noise", type=float, default=0.02, help="relative sd of the test devices' t/s"
    )
    parser.add_argument(
        "--pool-trials", type=int, default=2, help="timed bisects of each kind (0: none)"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kz-bench-bisect-") as tmp:
        work = Path(tmp)
        if args.trials:
            simulated(work, args.trials, args.noise)
        if args.pool_trials:
            pool_figures(work / "pool", args.turn_ms, args.pool_noise, args.pool_trials)


if __name__ == "__main__":
    main()
