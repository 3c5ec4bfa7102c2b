#!/usr/bin/env python3
"""Roll figures (issue 14): a warm `kzbuild roll` over three candidates that needs no build.

A synthetic upstream of 64 commits after the pin, a stack of three patches, three candidates:
master (a conflict brought in by commit 50, "(#50)"), tag v2 (a conflict brought in by commit 30)
and tag v1 (the stack holds; one patch upstreamed). Each conflict is bisected; v1 is rolled in the
stage: pin and lock written, the live patches' Kz-Test run with pytest, the v79 plan made.
`--no-build` skips the host build (what "needs no build" means here). The whole command, as a user
runs it (a fresh Python process each time), on a warm cache. Target: under 10 s.

Usage: python benchmarks/bench_roll.py [--runs N]
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

from tests.conftest import Project, UpstreamRepo, git  # noqa: E402
from tests.fixtures_stack import add_patch, file_source, fit, make_patch  # noqa: E402

TARGET_S = 10.0
KZ_TEST = "def test_ok():\n    assert True\n"


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


def setup(root: Path) -> Project:
    upstream = UpstreamRepo(root / "upstream")
    base = upstream.commit({"common/fit.cpp": fit(), "README.md": "synthetic\n"}, "initial import")
    project = Project(root=root / "project", cache=root / "cache", work=root / "work")
    for folder in ("recipes", "patches", "tests"):
        (project.root / folder).mkdir(parents=True)
    project.write("patches/series", "")
    project.write("tests/test_ok.py", KZ_TEST)
    shutil.copytree(REPO / "toolchains", project.root / "toolchains")
    trailers = ("Upstream-Status: Pending", "Kz-Test: tests/test_ok.py")
    add_patch(
        project,
        "a.patch",
        make_patch(
            upstream, base, {"common/fit.cpp": fit(line5="fixed 5")}, "common: a", trailers=trailers
        ),
    )
    add_patch(
        project,
        "b.patch",
        make_patch(
            upstream,
            base,
            {"common/fit.cpp": fit(line20="fixed 20")},
            "common: b",
            trailers=trailers,
        ),
    )
    add_patch(
        project,
        "c.patch",
        make_patch(
            upstream,
            base,
            {"common/fit.cpp": fit(line35="fixed 35")},
            "common: c",
            trailers=trailers,
        ),
    )
    project.recipe("r", commit=base, sources=[file_source(upstream)])
    for i in range(1, 65):
        if i == 10:
            upstream.commit({"common/fit.cpp": fit(line20="fixed 20")}, "common: take b (#10)")
        elif i == 30:
            upstream.commit(
                {"common/fit.cpp": fit(line20="fixed 20", line35="upstream 35")},
                "common: rework 35 (#30)",
            )
        elif i == 50:
            upstream.commit(
                {
                    "common/fit.cpp": fit(
                        line5="upstream 5", line20="fixed 20", line35="upstream 35"
                    )
                },
                "common: rework 5 (#50)",
            )
        else:
            upstream.commit({f"src/f{i}.c": f"int f{i};\n"}, f"src: f{i}")
        if i == 20:
            git(upstream.path, "tag", "v1")
        if i == 40:
            git(upstream.path, "tag", "v2")
    return project


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kz-bench-roll-") as tmp:
        project = setup(Path(tmp))
        start = time.perf_counter()
        first = kzbuild(project, "roll", "r", "--no-build", "--json")
        cold = time.perf_counter() - start
        report = json.loads(first.stdout)
        print(
            f"exit {first.returncode}; "
            + "; ".join(f"{c['label']}: {c['outcome']}" for c in report["candidates"])
        )
        for c in report["candidates"]:
            for b in c["bisect"]:
                print(
                    f"  {c['label']}: {b['patch']} broken by #{b['pr']} ({b['apply_checks']} apply "
                    f"checks over {b['commits']} commits)"
                )
        print(f"  would drop: {', '.join(report['would_drop'])}")
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            kzbuild(project, "roll", "r", "--no-build", "--json")
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        print(
            f"roll over 3 candidates, no build: cold {cold:.2f} s; warm median {median:.2f} s, max "
            f"{max(times):.2f} s "
            f"over {args.runs} runs; {median / TARGET_S:.2f} x the {TARGET_S:.0f} s target"
        )


if __name__ == "__main__":
    main()
