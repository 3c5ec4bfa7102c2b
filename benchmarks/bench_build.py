#!/usr/bin/env python3
"""Build figures for issue 5: cold build, no-op build, rebuild after one patch changes.

    python benchmarks/bench_build.py [--jobs 2] [--file src/llama-context.cpp]

Builds the built-in recipe (demo-host: the pinned upstream from the PyPI sdist, with the
team's stack) for the host, through the kzbuild CLI as a subprocess (what a user waits for):

1. cold: a fresh kzbuild cache (empty ccache, sdists shared with the test cache) and work dir;
2. no-op: `kzbuild build` again, median of 7 (target: under 2 s);
3. a patch is added to the stack that edits one source file, then that patch changes: both
   rebuilds run with a warm ccache (target: the changed-patch rebuild under 25% of cold).

Runs a full cold llama.cpp build: about 5 minutes on 2 idle cores.
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

GIT_ENV = {
    **os.environ,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "Bench",
    "GIT_AUTHOR_EMAIL": "bench@localhost",
    "GIT_COMMITTER_NAME": "Bench",
    "GIT_COMMITTER_EMAIL": "bench@localhost",
}


def git(*args: str, cwd: Path) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True, text=True
    ).stdout


class Bench:
    def __init__(self, tmp: Path, jobs: int) -> None:
        project = real_project(tmp, fresh_cache=True)  # only the downloaded sdists are shared
        self.project, self.cache, self.work = project.root, project.cache, project.work
        self.jobs = jobs

    def build(self) -> tuple[float, dict]:
        argv = [
            sys.executable,
            "-m",
            "kzbuild",
            "--project",
            str(self.project),
            "--cache-dir",
            str(self.cache),
            "--work-dir",
            str(self.work),
            "build",
            "demo-host",
            "--target",
            "host",
            "-j",
            str(self.jobs),
            "--json",
        ]
        start = time.perf_counter()
        result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if result.returncode != 0:
            sys.exit(f"kzbuild build failed ({result.returncode}):\n{result.stderr[-3000:]}")
        return seconds, json.loads(result.stdout)

    def set_bench_patch(self, rel: str, marker: int) -> None:
        """A real format-patch that adds a function to one upstream file; the series gets it
        once."""
        source = self.work / "src" / "demo-host"
        scratch = self.project.parent / "patch-scratch"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        git("init", "-q", cwd=scratch)
        base = git("show", f"refs/kz/base:{rel}", cwd=source)
        target = scratch / rel
        target.parent.mkdir(parents=True)
        target.write_text(base)
        git("add", "-A", cwd=scratch)
        git("commit", "-qm", "base", cwd=scratch)
        target.write_text(
            base
            + f"\nint kz_bench_marker(void);\nint kz_bench_marker(void) {{ return {marker}; }}\n"
        )
        git("commit", "-qam", f"bench: marker {marker}", cwd=scratch)
        patch = git("format-patch", "-1", "--stdout", "--full-index", "HEAD", cwd=scratch)
        (self.project / "patches" / "bench.patch").write_text(patch)
        series = self.project / "patches" / "series"
        if "bench.patch" not in series.read_text():
            series.write_text(series.read_text() + "bench.patch\n")


def describe(label: str, seconds: float, data: dict) -> str:
    times = data.get("times", {})
    ccache = data.get("ccache") or {}
    rate = ccache.get("hit_rate")
    parts = [f"{label:28} {seconds:8.1f} s"]
    if not data.get("reused"):
        parts.append(
            f"(sync {times.get('sync_s', 0):.1f}, configure {times.get('configure_s', 0):.1f}, "
            f"ninja {times.get('build_s', 0):.1f}, collect {times.get('collect_s', 0):.1f})"
        )
        if rate is not None:
            parts.append(f"ccache {rate:.0%} of {ccache['hits'] + ccache['misses']} compiles")
    else:
        parts.append("(artifact reused; cmake not run)")
    return "  ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument(
        "--file", default="src/llama-context.cpp", help="upstream file the bench patch edits"
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kz-bench-build-"))
    try:
        bench = Bench(tmp, args.jobs)
        cold, data = bench.build()
        print(describe("cold build", cold, data))

        noops = [bench.build()[0] for _ in range(7)]
        print(
            f"{'no-op build':28} {statistics.median(noops):8.2f} s  median of 7, max "
            f"{max(noops):.2f} s (target < 2 s)"
        )

        bench.set_bench_patch(args.file, 1)
        added, data = bench.build()
        print(describe("patch added (warm ccache)", added, data))
        bench.set_bench_patch(args.file, 2)
        changed, data = bench.build()
        print(describe("patch changed (warm ccache)", changed, data))
        print(f"{'changed / cold':28} {100 * changed / cold:8.1f} %  (target < 25 %)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
