#!/usr/bin/env python3
"""Patch-stack figures (issue 3): warm `patches check` of a three-patch stack, and bisect cost.

1. `kzbuild patches check` of the three real patches (made from llama.cpp 0.3.21 with
   `kzbuild patches new`) against 0.3.36, on a warm cache: the whole command, as a user runs
   it (a fresh Python process each time). Target: under 3 s.
2. `kzbuild bump --bisect` over 64 synthetic upstream commits, with the breaking commit at
   several positions: apply checks per bisect. Target: at most 7 (log2 64 = 6).

Usage: python benchmarks/bench_stack.py [--cache-dir DIR] [--runs N]
The cache defaults to $KZ_CACHE_DIR or ~/.cache/kzbuild (the sdists are downloaded there once).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kzbuild.source import recipes  # noqa: E402
from tests.conftest import PIN_0_3_21, Project, UpstreamRepo  # noqa: E402
from tests.fixtures_stack import (  # noqa: E402
    add_patch,
    file_source,
    fit,
    make_patch,
    make_real_patches,
    real_recipe_yaml,
)

BISECT_POSITIONS = (1, 2, 17, 32, 33, 37, 50, 63, 64)


def kzbuild(project: Project, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable,
        "-m",
        "kzbuild",
        "--project",
        str(project.root),
        "--cache-dir",
        str(project.cache),
        "--work-dir",
        str(project.work),
        *args,
    ]
    return subprocess.run(
        argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True
    )


def new_project(root: Path, cache: Path) -> Project:
    project = Project(root=root / "project", cache=cache, work=root / "work")
    for folder in ("recipes", "patches"):
        (project.root / folder).mkdir(parents=True)
    project.write("patches/series", "")
    return project


def bench_check(cache: Path, runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="kz-bench-stack-") as tmp:
        project = new_project(Path(tmp), cache)
        project.write("recipes/real.yaml", real_recipe_yaml(PIN_0_3_21, "0.3.21"))
        print(
            "setup: syncing llama.cpp 0.3.21 and making three patches with 'kzbuild patches new' "
            "...",
            flush=True,
        )
        make_real_patches(project.settings, recipes.load_recipe(project.root, "real"))
        target = "pypi:llama-cpp-python==0.3.36"
        for label, extra in (
            ("at the pin (0.3.21)", ()),
            ("against 0.3.36", ("--against", target)),
        ):
            warm = kzbuild(
                project, "patches", "check", "real", *extra, "--json"
            )  # fetches, fills the scratch repo
            verdicts = [(p["patch"], p["verdict"]) for p in json.loads(warm.stdout)["patches"]]
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                kzbuild(project, "patches", "check", "real", *extra, "--json")
                times.append(time.perf_counter() - start)
            print(
                f"patches check {label}: median {statistics.median(times):.2f} s, max "
                f"{max(times):.2f} s "
                f"over {runs} runs (target < 3 s)"
            )
            print("  " + ", ".join(f"{name} {verdict}" for name, verdict in verdicts))


def bench_bisect() -> None:
    worst = 0
    for position in BISECT_POSITIONS:
        with tempfile.TemporaryDirectory(prefix="kz-bench-bisect-") as tmp:
            root = Path(tmp)
            upstream = UpstreamRepo(root / "upstream")
            base = upstream.commit(
                {"common/fit.cpp": fit(), "README.md": "synthetic\n"}, "initial import"
            )
            project = new_project(root, root / "cache")
            add_patch(
                project,
                "fix.patch",
                make_patch(
                    upstream, base, {"common/fit.cpp": fit(line5="fixed 5")}, "common: fix 5"
                ),
            )
            project.recipe("r", commit=base, sources=[file_source(upstream)])
            kzbuild(project, "sync", "r")
            culprit = ""
            for i in range(1, 65):
                if i == position:
                    culprit = upstream.commit(
                        {"common/fit.cpp": fit(line5="upstream 5")}, f"breaks the patch ({i})"
                    )
                else:
                    upstream.commit({f"src/f{i}.c": f"int f{i};\n"}, f"src: f{i}")
            start = time.perf_counter()
            result = kzbuild(project, "bump", "r", "--to", "master", "--bisect", "--json")
            elapsed = time.perf_counter() - start
            (found,) = json.loads(result.stdout)["bisect"]
            assert found["culprit"]["sha"] == culprit, found
            worst = max(worst, found["apply_checks"])
            print(
                f"bisect, breaking commit {position:2d} of {found['commits']}: "
                f"{found['apply_checks']} apply checks, "
                f"found {found['culprit']['sha'][:12]} ({elapsed:.1f} s for the whole bump)"
            )
    print(f"bisect over 64 commits: at most {worst} apply checks (target <= 7)")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    default_cache = Path(os.environ.get("KZ_CACHE_DIR") or Path.home() / ".cache" / "kzbuild")
    parser.add_argument("--cache-dir", type=Path, default=default_cache)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--skip-real", action="store_true", help="only the synthetic bisect figures"
    )
    args = parser.parse_args()
    if not args.skip_real:
        bench_check(args.cache_dir.resolve(), args.runs)
    bench_bisect()


if __name__ == "__main__":
    main()
