#!/usr/bin/env python3
"""Cold sync vs the network floor (issue 13): goal ≤ 1.5× the time to download the sdist's bytes.

    python benchmarks/bench_coldsync.py [--rounds 1] [--package llama-cpp-python==0.3.36] [--recipe
    demo-host]

Each round runs, in turn (the order rotates between rounds, so a drift in the network does not
favour one of them), with this machine's pip configuration:

- pip alone:  ``pip download --no-deps --no-binary PKG PKG==X -d TMP`` (the issue's anchor);
- raw GET:    ``curl`` of the same file URL (the bytes alone, no index lookup);
- kzbuild:    ``kzbuild sync RECIPE`` with an empty cache and work dir (KZ_CACHE_DIR, KZ_WORK_DIR);
- kzbuild's sdist fetch alone (``ObjectCache.download_sdist`` into an empty cache, a subprocess:
  pip config list, the index page, the download and its hash check).

Then once: the same sync with the sdist already cached (what a cold sync costs besides the
download). Prints medians and the ratios of kzbuild's cold sync to both anchors. Downloads about
80 MB per run and round from the configured index (PyPI here).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kzbuild.source import pipindex  # noqa: E402 (after the path above)


def timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        argv, cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True, text=True
    )
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--package", default="llama-cpp-python==0.3.36")
    parser.add_argument(
        "--recipe", default="demo-host", help="a recipe whose source is --package's sdist"
    )
    args = parser.parse_args()
    package, version = args.package.split("==", 1)
    client = pipindex.Client(pipindex.read_pip_config())
    link = pipindex.find_sdist(client, package, version)
    print(f"{link.filename} from {pipindex.redact(link.url)}")
    cert = client.config.cert
    tmp = Path(tempfile.mkdtemp(prefix="kz-bench-coldsync-"))
    project = tmp / "project"  # a copy: the sync writes the recipe's lock file
    for folder in ("recipes", "patches", "kernels", "toolchains"):
        if (REPO / folder).is_dir():
            shutil.copytree(REPO / folder, project / folder)
    times: dict[str, list[float]] = {
        "pip alone": [],
        "raw GET (curl)": [],
        "kzbuild cold sync": [],
        "kzbuild sdist fetch": [],
    }
    size = 0

    def pip_alone(n: int) -> float:
        return timed(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                package,
                "--progress-bar",
                "off",
                args.package,
                "-d",
                str(tmp / f"pip-{n}"),
            ]
        )

    def raw_get(n: int) -> float:
        nonlocal size
        out = tmp / f"curl-{n}" / link.filename
        out.parent.mkdir()
        elapsed = timed(
            ["curl", "-sSfL", *(["--cacert", cert] if cert else []), "-o", str(out), link.url]
        )
        size = out.stat().st_size
        return elapsed

    def cold_sync(n: int) -> float:
        env = {"KZ_CACHE_DIR": str(tmp / f"cache-{n}"), "KZ_WORK_DIR": str(tmp / f"work-{n}")}
        return timed(
            [sys.executable, "-m", "kzbuild", "--project", str(project), "sync", args.recipe], env
        )

    def sdist_fetch(n: int) -> float:
        code = (
            "import sys; from pathlib import Path; from kzbuild.adapters.settings import Settings; "
            "from kzbuild.source.sources import ObjectCache; "
            "ObjectCache(Settings(project=Path(sys.argv[1]), cache=Path(sys.argv[2]), "
            "work=Path(sys.argv[3]))).download_sdist(sys.argv[4])"
        )
        return timed(
            [
                sys.executable,
                "-c",
                code,
                str(project),
                str(tmp / f"fetch-cache-{n}"),
                str(tmp / f"fetch-work-{n}"),
                args.package,
            ]
        )

    runs: list[tuple[str, Callable[[int], float]]] = [
        ("pip alone", pip_alone),
        ("raw GET (curl)", raw_get),
        ("kzbuild cold sync", cold_sync),
        ("kzbuild sdist fetch", sdist_fetch),
    ]
    try:
        for n in range(args.rounds):
            order = runs[n % len(runs) :] + runs[: n % len(runs)]
            for name, run in order:
                times[name].append(run(n))
                print(f"  round {n + 1}: {name:18s} {times[name][-1]:7.2f} s", flush=True)
        # the same sync with the sdist already cached: what a cold sync costs besides the download
        warm = tmp / "cache-sdist-only"
        (warm / "sdists").mkdir(parents=True)
        for sdist in (tmp / "cache-0" / "sdists").iterdir():
            shutil.copy(sdist, warm / "sdists")
        rest = timed(
            [sys.executable, "-m", "kzbuild", "--project", str(project), "sync", args.recipe],
            {"KZ_CACHE_DIR": str(warm), "KZ_WORK_DIR": str(tmp / "work-sdist-only")},
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"\n{args.package}: {size / 1e6:.1f} MB, {args.rounds} round(s), medians:")
    for name, value in median.items():
        print(f"  {name:32s} {value:7.2f} s")
    print(
        f"  {'kzbuild sync, sdist cached':32s} {rest:7.2f} s  (the part of a cold sync that is not "
        "the download)"
    )
    kz = median["kzbuild cold sync"]
    print(
        f"\nratio kzbuild cold sync / pip alone:      {kz / median['pip alone']:.2f}  (goal <= 1.5)"
    )
    print(f"ratio kzbuild cold sync / raw GET (curl): {kz / median['raw GET (curl)']:.2f}")
    print(
        "ratio kzbuild sdist fetch / raw GET (curl): "
        f"{median['kzbuild sdist fetch'] / median['raw GET (curl)']:.2f}"
        "  (kzbuild's download part; the rest of a cold sync is extract, git fetch, worktree, "
        "patches)"
    )


if __name__ == "__main__":
    main()
