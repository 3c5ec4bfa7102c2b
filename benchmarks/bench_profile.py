#!/usr/bin/env python3
"""What kz-profile's per-node timer costs (issue 16): wall time with and without it, per phase.

    python benchmarks/bench_profile.py --artifact DIR [--reps 5] [-p 64] [-n 8] [--arch
    qwen35|llama]

DIR is a host artifact with bin/kz-profile (kzbuild build of demo-host). The model is a tiny
generated one. kz-profile runs each repetition twice, on a context without the eval callback and
on one with it; this prints, per phase, the medians of both, the overhead, and how much of the
timed wall time the per-op times account for (graph time / timed wall, at most 1).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kzbuild.measure import profiling  # noqa: E402
from kzbuild.measure.tinymodel import write_tiny_model  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--artifact", type=Path, required=True)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("-p", type=int, default=64)
    parser.add_argument("-n", type=int, default=8)
    parser.add_argument("--arch", choices=("qwen35", "llama"), default="qwen35")
    args = parser.parse_args()
    tool = args.artifact / "bin" / "kz-profile"
    with tempfile.TemporaryDirectory() as tmp:
        model = write_tiny_model(Path(tmp) / "tiny.gguf", arch=args.arch, ftype="q4_0")
        argv = [
            str(tool),
            "-m",
            str(model),
            "-p",
            str(args.p),
            "-n",
            str(args.n),
            "-t",
            "1",
            "-r",
            str(args.reps),
        ]
        result = subprocess.run(argv, capture_output=True, check=True, timeout=900)
    config, phases = profiling.parse_tool_output(result.stdout, source="kz-profile")
    print(
        f"kz-profile, tiny {args.arch} q4_0, -p {args.p} -n {args.n} -t 1, {config['reps']} "
        "repetitions (medians)"
    )
    print(f"{'phase':8} {'plain ms':>9} {'timed ms':>9} {'overhead':>9} {'graph/timed':>12}")
    for phase in phases:
        plain, timed = (
            statistics.median(phase.wall_us_plain),
            statistics.median(phase.wall_us_timed),
        )
        covered = phase.op_usec / sum(
            phase.wall_us_timed
        )  # all repetitions' op times over all their timed wall time
        print(
            f"{phase.phase:8} {plain / 1000:9.3f} {timed / 1000:9.3f} "
            f"{(timed - plain) / plain * 100:+8.1f}% {covered:12.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
