#!/usr/bin/env python3
"""What measuring memory costs a bench (issue 24): llama-bench's tok/s plain, with -v (the log that
names the buffers), under kz-peakrss, and both, as kzbuild bench runs it.

    python benchmarks/bench_memory.py --artifact .kz/artifacts/host-XXXX [--rounds 5]

Writes a tiny Q4_0 model (kzbuild.measure.tinymodel) and runs the artifact's llama-bench
(-p 512 -n 64 -r 3 -t 1 -o json, or --prompt/--gen) in interleaved rounds, each round every
condition once in a
shuffled order. Prints per condition the median prefill and decode tok/s and its ratio to plain, the
peak resident memory kz-peakrss measured and the model file's size.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kzbuild.measure.memory import parse_buffers, parse_peak  # noqa: E402
from kzbuild.measure.tinymodel import write_tiny_model  # noqa: E402

CONDITIONS = {
    "plain": (False, False),
    "-v": (True, False),
    "kz-peakrss": (False, True),
    "kz-peakrss -v": (True, True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifact", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--arch", default="qwen35")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--gen", type=int, default=64)
    args = parser.parse_args()
    bench, peakrss = args.artifact / "bin" / "llama-bench", args.artifact / "bin" / "kz-peakrss"
    for tool in (bench, peakrss):
        if not tool.is_file():
            sys.exit(
                f"{tool} is missing: build a recipe whose tools include llama-bench and kz-peakrss"
            )
    with tempfile.TemporaryDirectory(prefix="kz-bench-memory-") as tmp:
        model = write_tiny_model(Path(tmp) / "tiny.gguf", arch=args.arch, ftype="q4_0")
        tps: dict[str, dict[str, list[float]]] = {
            name: {f"pp{args.prompt}": [], f"tg{args.gen}": []} for name in CONDITIONS
        }
        peaks: list[int] = []
        buffers = ()
        rng = random.Random(24)
        for _ in range(args.rounds):
            order = list(CONDITIONS)
            rng.shuffle(order)
            for name in order:
                verbose, wrapped = CONDITIONS[name]
                argv = [
                    str(bench),
                    "-m",
                    str(model),
                    "-p",
                    "64",
                    "-n",
                    "16",
                    "-r",
                    "3",
                    "-t",
                    "1",
                    "-o",
                    "json",
                    *(["-v"] if verbose else []),
                ]
                done = subprocess.run(
                    [str(peakrss), *argv] if wrapped else argv,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                for test in json.loads(done.stdout):
                    tps[name][f"pp{args.prompt}" if test["n_prompt"] else f"tg{args.gen}"].append(
                        test["avg_ts"]
                    )
                if wrapped and verbose:
                    peak = parse_peak(done.stderr)
                    assert peak is not None
                    peaks.append(peak)
                    buffers = parse_buffers(done.stderr, source="llama-bench")
        base = {test: statistics.median(values) for test, values in tps["plain"].items()}
        print(
            f"{args.rounds} rounds, tiny {args.arch} Q4_0 ({model.stat().st_size / 1024:.0f} KiB), "
            f"llama-bench -p {args.prompt} -n {args.gen} -r 3 -t 1"
        )
        for name, tests in tps.items():
            shown = ", ".join(
                f"{test} {statistics.median(v):.1f} t/s (x{statistics.median(v) / base[test]:.3f})"
                for test, v in tests.items()
            )
            print(f"  {name:14} {shown}")
        print(
            f"peak resident memory (kz-peakrss): median {statistics.median(peaks) / 1024:.1f} MiB; "
            f"model file {model.stat().st_size / 1024 / 1024:.2f} MiB"
        )
        print("buffers (MiB): " + ", ".join(f"{b.buffer} {b.kind} {b.mib:.2f}" for b in buffers))


if __name__ == "__main__":
    main()
