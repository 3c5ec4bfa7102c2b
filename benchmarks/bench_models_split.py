#!/usr/bin/env python3
"""Split models (issue 27, item 2, "the device keeps one copy of shared content"): ``kzbuild
models push --split`` next to a whole push and ``adb push``, and the bytes two variants take on
the device, same run.

    python benchmarks/bench_models_split.py [--size-mib 256] [--runs 3]

The adb test device and the two synthetic GGUFs of bench_models.py (32 F16 block tensors and a
``token_embd.weight`` of 1/16 of the size, in F32 in the model and in F16 in the variant).

cases:
1. the model pushed whole and with ``--split`` to fresh device roots (digest caches warm, so
   the time is the transfer and the device's work), against ``adb push`` of the file: a split
   push also cuts the splits out of the checked model on the device, a second write and hash;
2. the variant pushed after the split model (split without asking): bytes sent against the
   changed tensor's bytes, and the bytes the device's models/ grows by (each file once) against
   the changed tensor's bytes, and its time; the same for the variant pushed after the whole
   model, whole.
Figures: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_deploy import Timing, median, timed  # noqa: E402
from benchmarks.bench_models import ModelBench, write_model  # noqa: E402
from kzbuild.device import modelpush  # noqa: E402
from kzbuild.device.adb import AdbTransport  # noqa: E402
from kzbuild.model.deploy import ModelPushResult  # noqa: E402
from kzbuild.model.device import Device  # noqa: E402


class SplitBench(ModelBench):
    def push_model(self, root: str, model: Path, cache: Path, split: bool) -> ModelPushResult:
        device = Device(name="bench", transport="adb", serial=self.serial, root=root)
        transport = AdbTransport(device, server_port=self.server.port)
        return modelpush.push_model(transport, device, model, cache=cache, split=split)

    def stored(self, root: str) -> int:
        """Bytes of the distinct files of ROOT/models (its piece lists and manifests too)."""
        listing = self.adb(
            "shell", "-n", "-T", "--", f"find {root}/models -type f -exec stat -c '%i %s' {{}} +"
        ).stdout.decode()
        inodes = dict(line.split() for line in listing.splitlines() if line.strip())
        return sum(int(size) for size in inodes.values())


def measure(work: Path, size: int, runs: int) -> None:
    model, variant = work / "model.gguf", work / "variant.gguf"
    write_model(model, size, embd_f16=False)
    changed = write_model(variant, size, embd_f16=True)
    print(f"model {model.stat().st_size:,} bytes; the variant's token_embd {changed:,} bytes")
    bench = SplitBench(work / "adb")
    cache = work / "digests.json"
    try:
        warm = bench.root()
        for split in (False, True):  # fill both digest caches
            bench.push_model(warm, model, cache, split)
        bench.drop(warm)
        whole: list[Timing] = []
        split: list[Timing] = []
        adb: list[Timing] = []
        for _ in range(runs):
            roots = [bench.root() for _ in range(3)]
            whole.append(timed(lambda: bench.push_model(roots[0], model, cache, False)))
            split.append(timed(lambda: bench.push_model(roots[1], model, cache, True)))
            adb.append(timed(lambda: bench.push_file(roots[2], model)))
            bench.drop(*roots)
        anchor = median(adb).wall
        print(f"\n{'case':28} {'s wall':>8} {'x adb push':>10}")
        for label, times in (
            ("adb push", adb),
            ("models push", whole),
            ("models push --split", split),
        ):
            print(f"{label:28} {median(times).wall:8.2f} {median(times).wall / anchor:10.2f}")
        print(
            f"\n{'variant after the model':24} {'sent':>12} {'models/ grew':>13} {'x tensor':>9}"
            f" {'s wall':>7}"
        )
        for label, as_split in (("whole", False), ("split", True)):
            root = bench.root()
            bench.push_model(root, model, cache, as_split)
            before = bench.stored(root)
            results: list[ModelPushResult] = []
            took = timed(lambda: results.append(bench.push_model(root, variant, cache, as_split)))
            grew = bench.stored(root) - before
            print(
                f"{label:24} {results[0].bytes_sent:12,} {grew:13,} {grew / changed:9.2f}"
                f" {took.wall:7.2f}  (sent {results[0].bytes_sent / changed:.2f}x the tensor)"
            )
            bench.drop(root)
    finally:
        bench.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kz-bench-split-"))
    try:
        measure(work, args.size_mib << 20, args.runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        os.sync()


if __name__ == "__main__":
    main()
