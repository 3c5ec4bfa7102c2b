#!/usr/bin/env python3
"""Start-up figures (issues 11 and 13): what a command costs when it has nothing to do.

    python benchmarks/bench_startup.py [--runs 15] [--cache-dir DIR] [--work-dir DIR]

Each command runs as a subprocess, as a user runs it, interleaved with the anchor
`python -c "import typer, rich"` (same interpreter, same venv) so that load on the machine hits
both alike. Prints the median wall time of each and its ratio to the anchor's median. Goals:
`--help` <= 1.5x; a no-op `status`, `sync` and `build` <= 2.5x.

kzbuild's modules are byte-compiled first (`compileall`), as `pip install` does for an installed
kzbuild; an editable install under PYTHONDONTWRITEBYTECODE=1 (as on the CI machine) would
otherwise compile every module from source on each start, while typer and rich, the anchor,
come byte-compiled from their wheels.

The project is a temp copy of this repo's recipes, patches, kernels and toolchains. The object
cache and work dir default to the slow test tier's (~/.cache/kzbuild-test), so the first run
syncs and builds demo-host only when that tier has not.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.cachedir import persistent_cache_root  # noqa: E402

TEST_CACHE = persistent_cache_root()
KZBUILD = [sys.executable, "-m", "kzbuild"]
ANCHOR = [sys.executable, "-c", "import typer, rich"]
GOALS = {"--help": 1.5, "status": 2.5, "sync": 2.5, "build": 2.5}


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--cache-dir", type=Path, default=TEST_CACHE / "kz-cache")
    parser.add_argument("--work-dir", type=Path, default=TEST_CACHE / "kz-work")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="kz-startup-") as tmp:
        project = Path(tmp) / "project"
        for folder in ("recipes", "patches", "kernels", "toolchains"):
            shutil.copytree(REPO / folder, project / folder)
        root = [
            *KZBUILD,
            "--project",
            str(project),
            "--cache-dir",
            str(args.cache_dir),
            "--work-dir",
            str(args.work_dir),
        ]
        commands = {
            "--help": [*KZBUILD, "--help"],
            "status": [*root, "status", "demo-host"],
            "sync": [*root, "sync", "demo-host"],
            "build": [*root, "build", "demo-host"],
        }
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(REPO / "kzbuild")],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        print(
            "preparing: sync and build demo-host once (no-op when the slow test tier has)",
            flush=True,
        )
        subprocess.run([*root, "build", "demo-host"], check=True, stdout=subprocess.DEVNULL)

        times: dict[str, list[float]] = {"anchor": [], **{name: [] for name in commands}}
        for _ in range(args.runs):
            for name, argv in commands.items():
                times["anchor"].append(wall(ANCHOR))
                times[name].append(wall(argv))

    anchor = statistics.median(times["anchor"])
    print(f"\nmedian of {args.runs} runs each, interleaved with the anchor")
    print(f"{'command':10} {'median s':>9} {'ratio':>7} {'goal':>6}")
    print(f"{'anchor':10} {anchor:9.3f} {'1.00':>7}   python -c 'import typer, rich'")
    failed = 0
    for name in commands:
        median = statistics.median(times[name])
        ratio = median / anchor
        met = ratio <= GOALS[name]
        failed += not met
        print(
            f"{name:10} {median:9.3f} {ratio:7.2f} {GOALS[name]:6.1f}  {'ok' if met else 'MISSED'}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
