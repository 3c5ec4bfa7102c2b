#!/usr/bin/env python3
"""v79 compile check figures for issue 18: cold check vs warm check (target: warm <= 10% of cold).

    python benchmarks/bench_v79check.py [--jobs 2]

Runs `kzbuild build demo-host --target v79-check` through the CLI as a subprocess (what a user
waits for) in a fresh project, cache and work dir (sdists shared with the test cache):

1. cold: empty ccache: every HTP source and the host backend compile;
2. warm, median of 3: the artifact is deleted before each run, so every compile runs again,
   through ccache (the run a CI job with a restored cache, or a second work dir, does).

Prints the wall time of the command and the compile stage (from the manifest) and both ratios.
A cold run takes about 1.5-2 minutes on 2 idle cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fixtures_build import real_project  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kz-bench-v79check-") as tmp:
        fresh = real_project(Path(tmp), fresh_cache=True)  # only the downloaded sdists are shared
        project, cache, work = fresh.root, fresh.cache, fresh.work
        argv = [
            sys.executable,
            "-m",
            "kzbuild",
            "--project",
            str(project),
            "--cache-dir",
            str(cache),
            "--work-dir",
            str(work),
            "build",
            "demo-host",
            "--target",
            "v79-check",
            "-j",
            str(args.jobs),
            "--json",
        ]
        sync = subprocess.run(
            [*argv[:9], "sync", "demo-host"], cwd=REPO, capture_output=True, text=True
        )
        if sync.returncode != 0:
            sys.exit(f"kzbuild sync failed ({sync.returncode}):\n{sync.stderr[-3000:]}")

        def check() -> tuple[float, dict]:
            start = time.perf_counter()
            result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
            seconds = time.perf_counter() - start
            if result.returncode != 0:
                sys.exit(
                    "kzbuild build --target v79-check failed "
                    f"({result.returncode}):\n{result.stderr[-3000:]}"
                )
            out = json.loads(result.stdout)
            shutil.rmtree(out["artifact"])  # the next run compiles again
            return seconds, out

        cold_wall, cold = check()
        warm = [check() for _ in range(3)]
        warm_wall = statistics.median(w for w, _ in warm)
        warm_compile = statistics.median(float(out["times"]["compile_s"]) for _, out in warm)
        cold_compile = float(cold["times"]["compile_s"])
        sources = cold["compiled"] + cold["cached"]
        print(
            f"sources: {sources} (HTP for hexagonv79 + host backend for aarch64), jobs {args.jobs}"
        )
        print(
            f"cold: {cold_wall:6.1f} s wall, compile {cold_compile:6.1f} s ({cold['cached']} from "
            "ccache)"
        )
        print(
            f"warm: {warm_wall:6.1f} s wall, compile {warm_compile:6.1f} s (median of 3; "
            f"{min(out['cached'] for _, out in warm)} of {sources} from ccache)"
        )
        print(
            f"ratio warm/cold: wall {warm_wall / cold_wall:.1%}, compile "
            f"{warm_compile / cold_compile:.1%} (target <= 10%)"
        )


if __name__ == "__main__":
    main()
