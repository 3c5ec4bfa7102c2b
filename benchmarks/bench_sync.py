#!/usr/bin/env python3
"""Sync figures for issue 2: bytes of a cold pinned sync vs a full clone, and warm no-op time.

    python benchmarks/bench_sync.py [--commits 3000] [--sdist]

1. A synthetic upstream with a long history (each commit rewrites a few of many files), served
   over git:// by a real git daemon on 127.0.0.1. Compares the bytes a full clone stores with
   the bytes kzbuild's cold sync stores in its object cache.
2. With --sdist: the same for the real pin from the llama-cpp-python sdist (uses the sdist
   cache; downloads it once).
3. Warm no-op `kzbuild sync` wall time (median of 7 runs, as a subprocess: what a user waits).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.cachedir import persistent_cache_root  # noqa: E402

ENV = {
    **os.environ,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "u",
    "GIT_AUTHOR_EMAIL": "u@x",
    "GIT_COMMITTER_NAME": "u",
    "GIT_COMMITTER_EMAIL": "u@x",
}


def git(*args: str, cwd: Path | None = None, stdin: str | None = None) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, env=ENV, check=True, capture_output=True, text=True, input=stdin
    ).stdout.strip()


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def synthetic_history(path: Path, commits: int, files: int = 400) -> str:
    """A repo whose history is much larger than its tip, built fast with git fast-import."""
    git("init", "-q", "--bare", str(path))
    lines = []
    for n in range(commits):
        lines.append("commit refs/heads/master")
        lines.append(f"committer u <u@x> {1_600_000_000 + n} +0000")
        msg = f"commit {n}"
        lines.append(f"data {len(msg)}\n{msg}")
        for k in range(3 if n else files):
            index = (n * 7 + k * 131) % files if n else k
            body = "".join(
                f"// file {index} revision {n} line {i} {os.urandom(8).hex()}\n" for i in range(40)
            )
            lines.append(f"M 100644 inline src/f{index}.c")
            lines.append(f"data {len(body)}\n{body}")
    git("fast-import", "--quiet", cwd=path, stdin="\n".join(lines) + "\n")
    git("config", "uploadpack.allowReachableSHA1InWant", "true", cwd=path)
    git("repack", "-adq", cwd=path)
    return git("rev-parse", "master", cwd=path)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def kz(project: Path, cache: Path, work: Path, *args: str) -> float:
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "kzbuild",
            "--project",
            str(project),
            "--cache-dir",
            str(cache),
            "--work-dir",
            str(work),
            *args,
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - start


def make_project(root: Path, commit: str, source: str) -> Path:
    (root / "recipes").mkdir(parents=True)
    (root / "patches").mkdir()
    (root / "patches/series").write_text("")
    (root / "recipes/bench.yaml").write_text(
        f"upstream:\n  commit: {commit}\n  sources:\n    - {source}\n"
    )
    return root


def bench_synthetic(tmp: Path, commits: int) -> None:
    served = tmp / "served"
    served.mkdir()
    tip = synthetic_history(served / "up.git", commits)
    pin = git("rev-parse", "master~5", cwd=served / "up.git")
    port = free_port()
    daemon = subprocess.Popen(
        [
            "git",
            "daemon",
            "--reuseaddr",
            "--export-all",
            "--listen=127.0.0.1",
            f"--port={port}",
            f"--base-path={served}",
            str(served),
        ],
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)
        url = f"git://127.0.0.1:{port}/up.git"
        clone = tmp / "full.git"
        git("clone", "-q", "--bare", url, str(clone))
        full = dir_bytes(clone / "objects")
        project = make_project(tmp / "p", pin, f"git: {url}")
        cold = kz(project, tmp / "cache", tmp / "work", "sync", "bench")
        synced = dir_bytes(tmp / "cache/upstream.git/objects")
        print(
            f"synthetic upstream: {commits} commits, tip {tip[:12]}, pin {pin[:12]} (5 below the "
            "tip)"
        )
        print(f"  full clone objects:      {full / 1e6:9.2f} MB")
        print(
            f"  kzbuild cold sync cache: {synced / 1e6:9.2f} MB  = {100 * synced / full:.2f}% of a "
            "full clone"
            f"  (target <= 5%), {cold:.2f} s"
        )
        report_noop(project, tmp / "cache", tmp / "work")
    finally:
        daemon.terminate()
        daemon.wait()


def bench_sdist(tmp: Path) -> None:
    cache = tmp / "sdist-cache"
    cache.mkdir()
    shared = persistent_cache_root() / "sdists"
    shared.mkdir(parents=True, exist_ok=True)
    (cache / "sdists").symlink_to(shared)
    pin = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
    project = make_project(tmp / "sp", pin, "pypi-sdist: llama-cpp-python==0.3.36")
    cold = kz(project, cache, tmp / "sw", "sync", "bench")
    synced = dir_bytes(cache / "upstream.git/objects")
    sdist = next(shared.glob("llama_cpp_python-0.3.36.*"))
    print("real pin 0c1e57098 from the llama-cpp-python 0.3.36 sdist:")
    print(f"  sdist download (once per machine): {sdist.stat().st_size / 1e6:.1f} MB")
    print(
        f"  kzbuild object cache: {synced / 1e6:.1f} MB, cold sync {cold:.2f} s (sdist already "
        "cached)"
    )
    print(
        "  a full clone of llama.cpp is about 1.4 GB (facts sheet): "
        f"{100 * synced / 1.4e9:.1f}% of it"
    )
    report_noop(project, cache, tmp / "sw")


def report_noop(project: Path, cache: Path, work: Path) -> None:
    times = [kz(project, cache, work, "sync", "bench") for _ in range(7)]
    print(
        f"  warm no-op sync: median {statistics.median(times):.3f} s, max {max(times):.3f} s "
        "(target < 1 s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--commits", type=int, default=3000)
    parser.add_argument(
        "--sdist", action="store_true", help="also measure the real pin from the PyPI sdist"
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kz-bench-sync-"))
    try:
        bench_synthetic(tmp, args.commits)
        if args.sdist:
            bench_sdist(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
