#!/usr/bin/env python3
"""Model push figures (issue 27, item 2): ``kzbuild models push`` next to ``adb push``, same run.

    python benchmarks/bench_models.py [--size-mib 1024] [--runs 3]

The device is the adb test device of tests/adbdevice (the real adb client and server, mksh and
toybox as on Android) in a process of its own, as in bench_deploy.py. The model is a synthetic
GGUF of ``--size-mib`` (default 1 GiB): 32 F16 block tensors of random bytes and a
``token_embd.weight`` of 1/16 of the size in F32; the variant holds that tensor in F16 (half
its bytes) and is otherwise the same.

cases (goal in brackets):
1. ``models push`` of the model to a fresh device root, the host's digest cache empty (the
   sha256 and pieces are computed while the pieces go out), against ``adb push`` of the file;
2. the same with the digest cache warm (the file pushed before, to another device) [<= 1.15x];
3. the variant pushed after the model: bytes sent against the changed tensor's bytes [<= 1.2x],
   and its time against ``adb push`` of the variant.

Also shown: the device's ``sha1sum`` and ``sha256sum`` of the model alone (toybox; the share of a
push that checking takes on this device). A cut push and its resume are tested in
tests/deploy/test_models_push.py, not measured here. Figures: benchmarks/README.md.
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

from benchmarks.bench_deploy import AdbBench, Timing, median, ratio_of, timed  # noqa: E402
from kzbuild.device import modelpush  # noqa: E402
from kzbuild.device.adb import AdbTransport  # noqa: E402
from kzbuild.model.deploy import ModelPushResult  # noqa: E402
from kzbuild.model.device import Device  # noqa: E402

GOALS = {"warm cache": 1.15, "variant bytes": 1.2}
BLOCKS = 32


def write_model(path: Path, size: int, *, embd_f16: bool, seed: int = 27) -> int:
    """A GGUF of about ``size`` bytes; returns the bytes of its token_embd tensor."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("kz-bench-model")
    writer.add_file_type(1)
    embd = rng.standard_normal(size // 16 // 4, dtype=np.float32)
    writer.add_tensor("token_embd.weight", embd.astype(np.float16) if embd_f16 else embd)
    block = (size - size // 16) // BLOCKS // 2
    for index in range(BLOCKS):
        data = np.frombuffer(rng.bytes(block * 2), dtype=np.float16)
        writer.add_tensor(f"blk.{index}.ffn_up.weight", data)
        writer.add_tensor(f"blk.{index}.attn_norm.weight", np.ones(4096, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return embd.size * (2 if embd_f16 else 4)


class ModelBench(AdbBench):
    def models_push(self, root: str, model: Path, cache: Path) -> ModelPushResult:
        device = Device(name="bench", transport="adb", serial=self.serial, root=root)
        transport = AdbTransport(device, server_port=self.server.port)
        return modelpush.push_model(transport, device, model, cache=cache)

    def push_file(self, root: str, model: Path) -> None:
        self.adb("shell", "-n", "-T", "--", f"mkdir -p {root}")
        self.adb("push", str(model), f"{root}/{model.name}")

    def drop(self, *roots: str) -> None:
        """Remove device roots (each run writes a model or two: the disk is not endless)."""
        self.adb("shell", "-n", "-T", "--", "rm -rf " + " ".join(roots))

    def checksum(self, root: str, model: Path, tool: str) -> Timing:
        path = f"{root}/{model.name}"
        return timed(lambda: self.adb("shell", "-n", "-T", "--", f"{tool} {path} > /dev/null"))


Row = tuple[str, str, float, float, float | None]  # case, unit, kzbuild, anchor, goal


def measure(work: Path, size: int, runs: int) -> list[Row]:
    model, variant = work / "model.gguf", work / "variant.gguf"
    embd_f32 = write_model(model, size, embd_f16=False)
    embd_f16 = write_model(variant, size, embd_f16=True)
    print(f"model {model.stat().st_size:,} bytes; token_embd {embd_f32:,} -> {embd_f16:,} bytes")
    bench = ModelBench(work / "adb")
    rows: list[Row] = []
    try:
        cold, warm, push = [], [], []
        for run in range(runs):
            cache = work / f"cold-{run}.json"
            roots = [bench.root() for _ in range(3)]
            cold.append(timed(lambda: bench.models_push(roots[0], model, cache)))
            warm.append(timed(lambda: bench.models_push(roots[1], model, cache)))
            push.append(timed(lambda: bench.push_file(roots[2], model)))
            bench.drop(*roots)
        rows += timing_rows("cold cache", median(cold), median(push))
        rows += timing_rows("warm cache", median(warm), median(push))
        sent, times, anchor = [], [], []
        for run in range(runs):
            root, cache = bench.root(), work / f"variant-{run}.json"
            bench.models_push(root, model, cache)
            results: list[ModelPushResult] = []
            times.append(timed(lambda: results.append(bench.models_push(root, variant, cache))))
            sent.append(results[0].bytes_sent)
            pushed = bench.root()
            anchor.append(timed(lambda: bench.push_file(pushed, variant)))
            bench.drop(root, pushed)
        rows.append(("variant bytes", "bytes", float(max(sent)), float(embd_f16), 1.2))
        rows += timing_rows("variant", median(times), median(anchor))
        hashed = bench.root()
        bench.push_file(hashed, model)
        for tool in ("sha1sum", "sha256sum"):
            seconds = bench.checksum(hashed, model, tool).wall
            rows.append((f"device {tool}", "s", seconds, median(push).wall, None))
    finally:
        bench.stop()
    return rows


def timing_rows(label: str, mine: Timing, theirs: Timing) -> list[Row]:
    goal = GOALS.get(label)
    return [
        (label, "s wall", mine.wall, theirs.wall, goal),
        (label, "s CPU", mine.cpu, theirs.cpu, None),
    ]


def report(rows: list[Row]) -> bool:
    print(f"\n{'case':16} {'unit':7} {'kzbuild':>15} {'adb push':>15} {'ratio':>7} {'goal':>6}")
    passed = True
    for label, unit, mine, theirs, goal in rows:
        ratio = mine / theirs if unit != "s CPU" and theirs else ratio_of(mine, theirs)
        ok = goal is None or ratio <= goal
        passed &= ok
        anchor = "changed tensor" if unit == "bytes" else "adb push"
        mark = "" if goal is None else (" ok" if ok else " MISSED")
        grain = 0 if unit == "bytes" else 3
        values = f"{mine:>15,.{grain}f} {theirs:>15,.{grain}f}"
        goal_text = f"<={goal:g}" if goal else ""
        print(f"{label:16} {unit:7} {values} {ratio:7.2f} {goal_text:>6}{mark}  ({anchor})")
    print(f"\ngoals: {'PASS' if passed else 'FAIL'}")
    return passed


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kz-bench-models-"))
    try:
        report(measure(work, args.size_mib << 20, args.runs))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        os.sync()


if __name__ == "__main__":
    main()
