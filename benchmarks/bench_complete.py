#!/usr/bin/env python3
"""Tab completion figures (issue 31): what the first `kzbuild <TAB>` costs.

    python benchmarks/bench_complete.py [--runs 7] [--repo DIR]

Runs bash's completion request as the script `--show-completion bash` prints makes it
(``_KZBUILD_COMPLETE=complete_bash``, ``COMP_WORDS``, ``COMP_CWORD``) against the kzbuild source
in DIR (default: this repo; pass a checkout of another commit to compare), for three words:
the command names (``kzbuild <TAB>``), recipe names (``kzbuild sync <TAB>``) and build targets
(``kzbuild build --target <TAB>``). Each is timed cold, with no byte-compiled kzbuild (as on a
fresh clone, or always under PYTHONDONTWRITEBYTECODE=1), and warm; interleaved with the anchor
`python -c "import typer"`, and the medians printed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WORDS = {
    "commands": ["kzbuild", ""],
    "recipes": ["kzbuild", "sync", ""],
    "targets": ["kzbuild", "build", "--target", ""],
}


def complete(repo: Path, words: list[str], *, cold: bool) -> tuple[float, str]:
    """Wall time of one completion request, and what it offered."""
    if cold:
        for cached in (repo / "kzbuild").rglob("__pycache__"):
            shutil.rmtree(cached)
    env = {
        **os.environ,
        "PYTHONPATH": str(repo),
        "_KZBUILD_COMPLETE": "complete_bash",
        "COMP_WORDS": " ".join(words),
        "COMP_CWORD": str(len(words) - 1),
    }
    if cold:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "kzbuild"], cwd=repo, env=env, capture_output=True, text=True
    )
    return time.perf_counter() - start, " ".join(done.stdout.split())


def anchor() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import typer"], check=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--repo", type=Path, default=REPO)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"anchor": []}
    offered: dict[str, str] = {}
    for _ in range(args.runs):
        for name, words in WORDS.items():
            for cold in (True, False):
                times["anchor"].append(anchor())
                seconds, offered[name] = complete(args.repo, words, cold=cold)
                times.setdefault(f"{name} {'cold' if cold else 'warm'}", []).append(seconds)
    print(f"{args.repo}: median of {args.runs} runs each")
    for name, values in times.items():
        print(f"  {name:16} {statistics.median(values):6.3f} s")
    for name, words in offered.items():
        print(f"  {name}: {words}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
