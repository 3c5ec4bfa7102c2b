#!/usr/bin/env python3
"""Store integrity figures: corruptions injected into a device store, how many `device verify`
detects, how many the next deploy repairs.

    python benchmarks/bench_store.py [--rounds 40] [--seed 1] [--libs 4] [--lib-mb 1]

The device is a local store in a temp dir (ssh and adb test devices store on local disk the
same way). Two releases share most contents. Each round injects one corruption of a random
kind, runs the store check (what `kzbuild device verify` runs), then deploys every damaged
release's build again (current last) and checks the store again. Goal: 100% detected, and
every corruption of a release or its contents repaired. A corrupt model is detected only:
deploy does not send models.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kzbuild.adapters.files import sha256_file  # noqa: E402
from kzbuild.build.artifacts import load_artifact  # noqa: E402
from kzbuild.device import deploy, modelpush  # noqa: E402
from kzbuild.device.integrity import verify_store  # noqa: E402
from kzbuild.device.local import LocalTransport  # noqa: E402
from kzbuild.device.store import Layout, Remote  # noqa: E402
from kzbuild.model.device import Device  # noqa: E402
from tests.fixtures_deploy import ArtifactMaker, assert_store_invariant, flip_byte, write_manifest  # noqa: E402

Corruption = Callable[[random.Random, Path], str]  # damages the store at root; says what it did


def flip_object(rng: random.Random, root: Path) -> str:
    victim = rng.choice(sorted((root / "objects").iterdir()))
    flip_byte(victim, rng.randrange(victim.stat().st_size))
    return f"flipped a byte of objects/{victim.name[:12]}"


def truncate_object(rng: random.Random, root: Path) -> str:
    victim = rng.choice(sorted((root / "objects").iterdir()))
    os.truncate(victim, victim.stat().st_size // 2)
    return f"truncated objects/{victim.name[:12]}"


def delete_release_file(rng: random.Random, root: Path) -> str:
    victim = rng.choice(release_files(root))
    victim.unlink()
    return f"deleted {victim.relative_to(root)}"


def replace_release_file(rng: random.Random, root: Path) -> str:
    """A new inode with other bytes in place of a release file: the object itself stays sound."""
    victim = rng.choice(release_files(root))
    data = bytearray(victim.read_bytes())
    data[rng.randrange(len(data))] ^= 0x01
    victim.unlink()
    victim.write_bytes(bytes(data))
    return f"replaced {victim.relative_to(root)}"


def flip_model(rng: random.Random, root: Path) -> str:
    victim = next((root / "models").glob("*.gguf"))
    flip_byte(victim, rng.randrange(4, victim.stat().st_size))
    return "flipped a byte of the model"


def release_files(root: Path) -> list[Path]:
    return sorted(
        p for p in (root / "releases").glob("*/**/*") if p.is_file() and p.name != "manifest.json"
    )


KINDS: dict[str, Corruption] = {
    "flip object byte": flip_object,
    "truncate object": truncate_object,
    "delete release file": delete_release_file,
    "replace release file": replace_release_file,
    "flip model byte": flip_model,
}


@dataclass
class CorruptionTally:
    injected: Counter[str] = field(default_factory=Counter)
    detected: Counter[str] = field(default_factory=Counter)
    repaired: Counter[str] = field(default_factory=Counter)
    repairable: Counter[str] = field(default_factory=Counter)
    verify_seconds: list[float] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return sum(self.detected.values()) == sum(self.injected.values()) and sum(
            self.repaired.values()
        ) == sum(self.repairable.values())


def run_corruptions(rounds: int, seed: int, libs: int = 4, lib_mb: float = 1.0) -> CorruptionTally:
    """Inject ``rounds`` random corruptions into a local device store; count what is detected and
    repaired."""
    rng = random.Random(seed)
    logging.getLogger("kzbuild").setLevel(logging.ERROR)  # each repair warns; the table says it all
    work = Path(tempfile.mkdtemp(prefix="kz-bench-store-"))
    maker = ArtifactMaker(work / "artifacts", work / "parts")
    builds = {}
    for index, greeting in enumerate(("hello from v1", "hello from v2"), start=1):
        directory = maker.make(f"b{index}", greeting=greeting)
        for lib in range(libs):
            (directory / "lib" / f"libbench{lib}.so").write_bytes(
                random.Random(lib).randbytes(int(lib_mb * 1e6))
            )
        write_manifest(directory, f"b{index}")
        builds[f"b{index}"] = load_artifact(directory)
    root = work / "device"
    device = Device(name="bench", transport="local", root=str(root))
    transport = LocalTransport(str(root))
    model = work / "tiny.gguf"
    model.write_bytes(b"GGUF" + os.urandom(1 << 20))
    modelpush.push_model(transport, device, model)
    for build in builds.values():
        deploy.deploy(transport, device, build)
    current = "b2"

    tally = CorruptionTally()
    for _ in range(rounds):
        kind = rng.choice(sorted(KINDS))
        KINDS[kind](rng, root)
        tally.injected[kind] += 1
        started = time.perf_counter()
        report = verify_store(Remote(transport), Layout(str(root)))
        tally.verify_seconds.append(time.perf_counter() - started)
        tally.detected[kind] += not report.ok
        if kind == "flip model byte":
            # detected only (deploy does not send models): put it back by hand
            (root / "models" / f"{sha256_file(model)}.gguf").write_bytes(model.read_bytes())
            continue
        tally.repairable[kind] += 1
        for name in sorted(report.damaged_releases, key=lambda name: name == current):
            deploy.deploy(transport, device, builds[name])
        deploy.deploy(transport, device, builds[current])
        try:
            assert_store_invariant(root)
            tally.repaired[kind] += verify_store(Remote(transport), Layout(str(root))).ok
        except AssertionError as exc:
            print(f"not repaired after {kind}: {exc}")
    shutil.rmtree(work, ignore_errors=True)
    return tally


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--libs", type=int, default=4)
    parser.add_argument("--lib-mb", type=float, default=1.0)
    args = parser.parse_args()
    tally = run_corruptions(args.rounds, args.seed, args.libs, args.lib_mb)
    injected, detected, repaired, repairable = (
        tally.injected,
        tally.detected,
        tally.repaired,
        tally.repairable,
    )
    print(f"{'corruption':24} {'injected':>9} {'detected':>9} {'repaired':>9}")
    for kind in sorted(KINDS):
        fixed = f"{repaired[kind]}" if repairable[kind] else "n/a"
        print(f"{kind:24} {injected[kind]:>9} {detected[kind]:>9} {fixed:>9}")
    total, found, fixed, fixable = (
        sum(injected.values()),
        sum(detected.values()),
        sum(repaired.values()),
        sum(repairable.values()),
    )
    print(f"{'total':24} {total:>9} {found:>9} {fixed:>9}")
    seconds = sorted(tally.verify_seconds)
    print(
        f"\ndetected {found}/{total} ({100 * found / max(total, 1):.0f}%), repaired "
        f"{fixed}/{fixable} of release and content damage "
        f"({100 * fixed / max(fixable, 1):.0f}%); store check median "
        f"{seconds[len(seconds) // 2]:.3f} s"
    )
    print(f"targets (100% detected, 100% repaired): {'PASS' if tally.passed else 'FAIL'}")


if __name__ == "__main__":
    main()
