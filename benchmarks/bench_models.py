#!/usr/bin/env python3
"""Model push figures (issue 27, item 2): ``kzbuild models push`` next to ``adb push``, same run.

    python benchmarks/bench_models.py [--size-mib 1024] [--runs 3] [--trace]

The device is the adb test device of tests/adbdevice (the real adb client and server, mksh and
toybox as on Android) in a process of its own, as in bench_deploy.py. The model is a synthetic
GGUF of ``--size-mib`` (default 1 GiB): 32 F16 block tensors of random bytes and a
``token_embd.weight`` of 1/16 of the size in F32; the variant holds that tensor in F16 (half
its bytes) and is otherwise the same.

cases (goal in brackets), each run interleaved with its ``adb push`` anchor (medians shown):
1. ``models push`` of the model to a fresh device root, the host's digest cache empty (the
   sha256 and pieces are computed while the file goes out), against ``adb push`` of the file;
2. the same with the digest cache warm (the file pushed before, to another device) [<= 1.15x];
3. the variant pushed after the model: bytes sent against the changed tensor's bytes [<= 1.2x],
   and its time against ``adb push`` of the variant.

Each case shows wall time and the CPU seconds of each party: the client (this process and the
adb clients it waits for), the adb server, and the device (the test device's process, its
adbd written in Python, and the shells and toybox commands it runs); and the load average.
Also shown: the device's ``sha1sum`` and ``sha256sum`` of the model alone. ``--trace`` prints
where the time of one warm push goes: each device command and transfer, from the push's start.
A cut push and its resume are tested in tests/deploy/test_models_push.py, not measured here.
Figures: benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_deploy import AdbBench  # noqa: E402
from kzbuild.device import modelpush  # noqa: E402
from kzbuild.device.adb import AdbTransport  # noqa: E402
from kzbuild.device.base import ByteSource, Member, ProgressFn, RemoteResult  # noqa: E402
from kzbuild.model.deploy import ModelPushResult  # noqa: E402
from kzbuild.model.device import Device  # noqa: E402

GOALS = {"warm cache": 1.15, "variant bytes": 1.2}
BLOCKS = 32
TICKS = os.sysconf("SC_CLK_TCK")
# the device scripts a trace names
SCRIPTS = {
    "prologue": modelpush.PROLOGUE_SCRIPT,
    "check as it arrives": modelpush.FOLLOW_SCRIPT,
    "keep a cut part": modelpush.RESUME_SCRIPT,
    "check a batch": modelpush.CHECK_SCRIPT,
    "store": modelpush.STORE_SCRIPT,
}


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
    past = time.time() - 60  # written a while ago: the digest cache trusts what it hashes now
    os.utime(path, (past, past))
    return embd.size * (2 if embd_f16 else 4)


@dataclass(frozen=True)
class Usage:
    """Wall seconds of one action and the CPU seconds each party spent on it."""

    wall: float
    client: float
    server: float
    device: float
    load: float


def process_cpu(pid: int) -> float:
    """CPU seconds of a process and of the children it waited for."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / TICKS


def median_usage(items: list[Usage]) -> Usage:
    return Usage(
        *(
            statistics.median(getattr(item, name) for item in items)
            for name in Usage.__annotations__
        )
    )


class TracedAdb(AdbTransport):
    """The adb transport, noting when each device command and transfer ran."""

    def __init__(self, device: Device, *, server_port: int) -> None:
        self.events: list[tuple[float, float, str]] = []
        self.zero = time.perf_counter()
        super().__init__(device, server_port=server_port)

    def _note(self, label: str, started: float) -> None:
        self.events.append((started - self.zero, time.perf_counter() - self.zero, label))

    def run(self, argv: Sequence[str], **options: Any) -> RemoteResult:
        started = time.perf_counter()
        try:
            return super().run(argv, **options)
        finally:
            self._note(script_names(argv), started)

    def run_input(self, argv: Sequence[str], data: ByteSource, **options: Any) -> RemoteResult:
        started = time.perf_counter()
        try:
            return super().run_input(argv, data, **options)
        finally:
            self._note(script_names(argv), started)

    def push(self, local: Path, remote: str, *, progress: ProgressFn | None = None) -> None:
        started = time.perf_counter()
        try:
            super().push(local, remote, progress=progress)
        finally:
            self._note(f"adb push of the file ({local.stat().st_size:,} bytes)", started)

    def push_files(self, files: Sequence[Member], remote: str, **options: Any) -> None:
        size = sum(member.size for member in files)
        started = time.perf_counter()
        try:
            super().push_files(files, remote, **options)
        finally:
            self._note(f"adb push of a batch ({size:,} bytes)", started)


def script_names(argv: Sequence[str]) -> str:
    named = [name for name, script in SCRIPTS.items() if script in argv]
    return "command: " + (", ".join(named) or (argv[2][:40] if len(argv) > 2 else argv[0]))


class ModelBench(AdbBench):
    def connect(self, root: str, traced: bool = False) -> tuple[Device, AdbTransport]:
        device = Device(name="bench", transport="adb", serial=self.serial, root=root)
        kind = TracedAdb if traced else AdbTransport
        return device, kind(device, server_port=self.server.port)

    def models_push(self, root: str, model: Path, cache: Path) -> ModelPushResult:
        device, transport = self.connect(root)
        return modelpush.push_model(transport, device, model, cache=cache)

    def push_file(self, root: str, model: Path) -> None:
        self.adb("shell", "-n", "-T", "--", f"mkdir -p {root}")
        self.adb("push", str(model), f"{root}/{model.name}")

    def drop(self, *roots: str) -> None:
        """Remove device roots (each run writes a model or two: the disk is not endless)."""
        self.adb("shell", "-n", "-T", "--", "rm -rf " + " ".join(roots))

    def used(self, action: Callable[[], object]) -> Usage:
        """Wall time and each party's CPU seconds of ``action``."""
        assert self.server.process is not None
        pids = (self.server.process.pid, self.device.process.pid)
        before, parties, started = (
            os.times(),
            [process_cpu(pid) for pid in pids],
            time.perf_counter(),
        )
        action()
        wall, after = time.perf_counter() - started, os.times()
        server, device = (
            process_cpu(pid) - spent for pid, spent in zip(pids, parties, strict=True)
        )
        client = sum(after[i] - before[i] for i in range(4))
        return Usage(wall, client, server, device, os.getloadavg()[0])

    def checksum(self, root: str, model: Path, tool: str) -> Usage:
        path = f"{root}/{model.name}"
        return self.used(lambda: self.adb("shell", "-n", "-T", "--", f"{tool} {path} > /dev/null"))


Row = tuple[str, Usage | int, Usage | int, float | None]  # case, kzbuild, anchor, goal


def measure(work: Path, size: int, runs: int) -> list[Row]:
    model, variant = work / "model.gguf", work / "variant.gguf"
    embd_f32 = write_model(model, size, embd_f16=False)
    embd_f16 = write_model(variant, size, embd_f16=True)
    print(f"model {model.stat().st_size:,} bytes; token_embd {embd_f32:,} -> {embd_f16:,} bytes")
    bench = ModelBench(work / "adb")
    rows: list[Row] = []
    try:
        cold, warm, push = [], [], []
        for run in range(runs):  # interleaved: each case next to an anchor of its own time
            cache = work / f"cold-{run}.json"
            roots = [bench.root() for _ in range(4)]
            push.append(bench.used(lambda: bench.push_file(roots[2], model)))
            cold.append(bench.used(lambda: bench.models_push(roots[0], model, cache)))
            warm.append(bench.used(lambda: bench.models_push(roots[1], model, cache)))
            push.append(bench.used(lambda: bench.push_file(roots[3], model)))
            bench.drop(*roots)
            print(
                f"run {run + 1}: "
                + ", ".join(f"{u.wall:.2f}" for u in (*push[-2:], cold[-1], warm[-1]))
            )
        rows.append(("cold cache", median_usage(cold), median_usage(push), None))
        rows.append(("warm cache", median_usage(warm), median_usage(push), GOALS["warm cache"]))
        sent, times, anchor = [], [], []
        for run in range(runs):
            root, cache = bench.root(), work / f"variant-{run}.json"
            bench.models_push(root, model, cache)
            results: list[ModelPushResult] = []
            times.append(
                bench.used(lambda: results.append(bench.models_push(root, variant, cache)))
            )
            sent.append(results[0].bytes_sent)
            pushed = bench.root()
            anchor.append(bench.used(lambda: bench.push_file(pushed, variant)))
            bench.drop(root, pushed)
        rows.append(("variant bytes", max(sent), embd_f16, GOALS["variant bytes"]))
        rows.append(("variant", median_usage(times), median_usage(anchor), None))
        hashed = bench.root()
        bench.push_file(hashed, model)
        for tool in ("sha1sum", "sha256sum"):
            rows.append(
                (f"device {tool}", bench.checksum(hashed, model, tool), median_usage(push), None)
            )
    finally:
        bench.stop()
    return rows


def report(rows: list[Row]) -> bool:
    print(
        f"\n{'case':15} {'':7} {'wall s':>7} {'ratio':>6} {'goal':>6}  {'client':>6} "
        f"{'server':>6} {'device':>6} CPU s  load"
    )
    passed = True
    for label, mine, theirs, goal in rows:
        if isinstance(mine, int) or isinstance(theirs, int):
            ratio = float(mine) / float(theirs)
            ok = goal is None or ratio <= goal
            passed &= ok
            print(
                f"{label:15} kzbuild {mine:,} bytes against {theirs:,} (the changed tensor): "
                f"{ratio:.2f}x, goal <={goal:g}{'' if ok else ' MISSED'}"
            )
            continue
        ratio = mine.wall / theirs.wall
        ok = goal is None or ratio <= goal
        passed &= ok
        goal_text = f"<={goal:g}" if goal else ""
        mark = "" if goal is None else (" ok" if ok else " MISSED")
        for who, usage, shown in (
            ("kzbuild", mine, f"{ratio:6.2f} {goal_text:>6}{mark}"),
            ("adb", theirs, ""),
        ):
            print(
                f"{label if who == 'kzbuild' else '':15} {who:7} {usage.wall:7.2f} {shown:14}"
                f"{usage.client:6.2f} {usage.server:6.2f} {usage.device:6.2f}        "
                f"{usage.load:4.1f}"
            )
    print(f"\ngoals: {'PASS' if passed else 'FAIL'}")
    return passed


def trace(work: Path, size: int) -> None:
    """One warm push of the model, each device command and transfer on a timeline."""
    model = work / "model.gguf"
    write_model(model, size, embd_f16=False)
    bench = ModelBench(work / "adb")
    try:
        cache = work / "trace.json"
        bench.models_push(bench.root(), model, cache)  # warms the digest cache
        root = bench.root()
        device, transport = bench.connect(root, traced=True)
        assert isinstance(transport, TracedAdb)
        anchor = bench.used(lambda: bench.push_file(bench.root(), model))
        transport.zero = time.perf_counter()
        usage = bench.used(lambda: modelpush.push_model(transport, device, model, cache=cache))
        print(
            f"\nwarm push, load {usage.load:.1f}: {usage.wall:.2f} s (adb push "
            f"{anchor.wall:.2f} s); CPU s: client {usage.client:.2f}, adb server "
            f"{usage.server:.2f}, device {usage.device:.2f}"
        )
        for started, ended, label in sorted(transport.events):
            print(f"  {started:6.2f} -> {ended:6.2f}  {ended - started:6.2f} s  {label}")
    finally:
        bench.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--trace", action="store_true", help="a timeline of one warm push")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kz-bench-models-"))
    try:
        if args.trace:
            trace(work, args.size_mib << 20)
        else:
            report(measure(work, args.size_mib << 20, args.runs))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        os.sync()


if __name__ == "__main__":
    main()
