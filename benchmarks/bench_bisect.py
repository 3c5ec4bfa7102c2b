#!/usr/bin/env python3
"""Bisect figures (issue 28): the right commit where a plain `git bisect run` is fooled by noise,
and what a pool of two devices saves.

A synthetic upstream of 64 commits (a real git repo) in which commit STEP makes the benched
number 10% lower; every bench sample carries seeded Gaussian noise (--noise, relative sd).
- plain: `git bisect run` with a script that benches each commit once and calls it bad when its
  one sample is below the midpoint of one sample of good and one of bad (what a user scripts);
- kzbuild: kzbuild.measure.bisect's search (interleaved rounds, bootstrap intervals, adaptive
  repeats) with the same noise model.
Both count builds (commits built) and bench samples. Then the same search on a pool of two
simulated devices against one: each bench turn sleeps --turn-ms (the device's time), the pool's
devices work in parallel threads, as kzbuild bisect runs them; the figure is wall time.
The devices here are simulated: this measures the search, not adb or llama-bench.

Usage: python benchmarks/bench_bisect.py [--trials N] [--noise 0.05] [--turn-ms 20]
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kzbuild.measure.bisect import BuiltCommit, Record, Search  # noqa: E402
from kzbuild.model.bisect import BisectLimits, BisectOutcome  # noqa: E402

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
    """A simulated device: commit index >= step is DROP slower, each sample with noise; each turn
    takes turn_s."""

    test = "pp512"

    def __init__(
        self, shas: Sequence[str], step: int, noise: float, seed: int, turn_s: float = 0.0
    ) -> None:
        self.index = {sha: i for i, sha in enumerate(shas)}
        self.step, self.noise, self.turn_s = step, noise, turn_s
        self.rng = random.Random(seed)
        self.samples = 0

    def __call__(
        self, artifacts: Mapping[str, str], blocks: int, seed: int
    ) -> Mapping[str, Sequence[float]]:
        time.sleep(self.turn_s * blocks * len(artifacts))
        self.samples += blocks * len(artifacts)
        return {
            sha: [
                100.0
                * (1 - DROP if self.index[sha] >= self.step else 1.0)
                * self.rng.gauss(1.0, self.noise)
                for _ in range(blocks)
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument(
        "--noise", type=float, default=0.05, help="relative sd of a sample (default 5%%)"
    )
    parser.add_argument(
        "--turn-ms", type=float, default=20.0, help="simulated device time per bench turn"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kz-bench-bisect-") as tmp:
        work = Path(tmp)
        shas = make_repo(work / "upstream")
        rows = []
        for trial in range(args.trials):
            step = random.Random(trial).randrange(1, COMMITS)
            named, plain_samples = plain(work / "upstream", shas, step, args.noise, seed=trial)
            outcome, hi, builds, samples = kzbuild_search(
                work / f"k{trial}", shas, {"d": Device(shas, step, args.noise, trial)}, trial
            )
            rows.append(
                (
                    step,
                    named == step,
                    plain_samples,
                    outcome is BisectOutcome.FOUND and hi == step,
                    builds,
                    samples,
                )
            )
        plain_right = sum(r[1] for r in rows)
        ours_right = sum(r[3] for r in rows)
        print(
            f"{args.trials} trials, 64 commits, a {DROP:.0%} step, {args.noise:.0%} noise per "
            "sample"
        )
        print(
            f"  plain git bisect run (one sample per commit): right {plain_right}/{args.trials}, "
            f"{sum(r[2] for r in rows) / len(rows):.1f} samples on average, builds = samples"
        )
        print(
            f"  kzbuild bisect: right {ours_right}/{args.trials}, "
            f"{sum(r[4] for r in rows) / len(rows):.1f} builds, "
            f"{sum(r[5] for r in rows) / len(rows):.1f} samples on average"
        )
        turn = args.turn_ms / 1000
        times = {}
        for name, count in (("one device", 1), ("pool of two", 2)):
            started = time.monotonic()
            for trial in range(3):
                step = 37 + trial
                devices = {
                    f"d{n}": Device(shas, step, args.noise, trial * 10 + n, turn)
                    for n in range(count)
                }
                kzbuild_search(work / f"{name}{trial}", shas, devices, trial)
            times[name] = (time.monotonic() - started) / 3
        print(
            f"  wall time per bisect at {args.turn_ms:g} ms per bench turn: one device "
            f"{times['one device']:.2f} s, "
            f"pool of two {times['pool of two']:.2f} s "
            f"({times['pool of two'] / times['one device']:.2f}x; goal <= 0.7x)"
        )


if __name__ == "__main__":
    main()
