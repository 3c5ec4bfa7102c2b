"""Helpers for the run, bench and results tests: device roots with a deployed release, records."""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from kzbuild.measure.resultfiles import shard_name, shards
from kzbuild.model.result import BenchRecord, BuildInfo, DeviceInfo, ModelInfo, VariantInfo

DATA = Path(__file__).parent / "data"
CAPTURED_JSON = (
    DATA / "llama-bench-0c1e570-cpu.json"
)  # real llama-bench -o json output (host build at the pin)
# real llama-bench -v stderr (host build at the pin, tiny qwen35 Q4_0, -p 16 -n 4 -r 2 -t 1)
CAPTURED_LOG = DATA / "llama-bench-0c1e570-cpu-v.stderr.log"
PEAKRSS_SOURCE = Path(__file__).parents[2] / "kernels" / "peakrss" / "kz-peakrss.c"


@functools.cache
def peakrss_binary() -> Path:
    """kz-peakrss compiled for this host from kernels/peakrss/ (once per test process)."""
    folder = Path(tempfile.mkdtemp(prefix="kz-peakrss-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    out = folder / "kz-peakrss"
    subprocess.run(["cc", "-O2", "-o", str(out), str(PEAKRSS_SOURCE)], check=True)
    return out


@dataclass
class DeviceRoot:
    """A device staging root laid out as deploy leaves it: releases/<id>/ and current -> it."""

    root: Path
    build_id: str

    @property
    def release(self) -> Path:
        return self.root / "releases" / self.build_id

    @property
    def spec(self) -> str:
        return f"local:{self.root}"

    def add_tool(self, name: str, text: str) -> Path:
        path = self.release / "bin" / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return path

    def add_file(self, relpath: str, data: bytes) -> Path:
        path = self.root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path


def total_kib() -> int:
    """This machine's memory (MemTotal of /proc/meminfo), KiB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1])
    raise AssertionError("no MemTotal in /proc/meminfo")


def make_device_root(
    root: Path,
    build_id: str = "b0000000000000001",
    manifest: dict[str, object] | None = None,
    *,
    peakrss: bool = True,
) -> DeviceRoot:
    """``peakrss``: the release has kz-peakrss (real, built for this host), as the project's
    recipes build it."""
    device = DeviceRoot(root, build_id)
    for sub in ("bin", "lib"):
        (device.release / sub).mkdir(parents=True)
    if peakrss:
        shutil.copy2(peakrss_binary(), device.release / "bin" / "kz-peakrss")
    if manifest is not None:
        (device.release / "manifest.json").write_text(json.dumps(manifest))
    os.symlink(f"releases/{build_id}", root / "current")
    return device


# A tool that holds --mib MiB (written, so resident) and logs buffers as llama.cpp does.
BUFFERS_TOOL = f"""#!{sys.executable} -S
import sys
args = sys.argv[1:]
held = b"x" * (int(args[args.index("--mib") + 1]) << 20)
print("generated", len(held) >> 20)
sys.stderr.write(
    "load_tensors:   CPU_REPACK model buffer size =     0.09 MiB\\n"
    "llama_kv_cache:        CPU KV buffer size =     0.03 MiB\\n"
    "sched_reserve:        CPU compute buffer size =     0.06 MiB\\n"
    "load_tensors:         HTP0 model buffer size =  3700.00 MiB\\n"
)
"""


def stored_run_id(err: str) -> str:
    """The run id kzbuild run's last stderr line says its record was stored as."""
    found = re.search(r"stored run (\S+):", flat(err))
    assert found, err
    return found[1]


# A tool that reports exactly what it received.
SHOW_ARGS = f"""#!{sys.executable} -S
import json, os, sys
json.dump({{"argv": sys.argv[1:], "env": {{k: v for k, v in os.environ.items() if k.startswith("KZ_T_") or k.endswith("LIBRARY_PATH")}}, "cwd": os.getcwd()}}, sys.stdout)
"""


def record(
    *,
    run_id: str = "r1",
    build_id: str = "build-a",
    test: str = "pp512",
    samples: tuple[float, ...] = (100.0, 101.0, 99.0),
    device: str = "pad3",
    fingerprint: str = "vendor/pad3:15/AP3A",
    model_sha: str = "a" * 64,
    env: dict[str, str] | None = None,
    config: dict[str, object] | None = None,
    host_time: str = "2026-10-01T10:00:00+00:00",
    seq: int = 0,
) -> BenchRecord:
    """A measured record as bench makes it, with the fields compare groups on."""
    return BenchRecord(
        run_id=run_id,
        kind="bench",
        host_time=host_time,
        test=test,
        seq=seq,
        build=BuildInfo(
            build_id=build_id, release_dir=f"/data/local/tmp/kz-engine/releases/{build_id}"
        ),
        device=DeviceInfo(
            name=device, address=f"adb:{device}", fingerprint={"android.fingerprint": fingerprint}
        ),
        model=ModelInfo(path="models/q.gguf", sha256=model_sha),
        config=config
        if config is not None
        else {"n_threads": 8, "n_gpu_layers": 99, "n_batch": 512},
        avg_ts=sum(samples) / len(samples),
        samples_ts=samples,
        env=env
        if env is not None
        else {"LD_LIBRARY_PATH": f"/data/local/tmp/kz-engine/releases/{build_id}/lib"},
    )


def flat(text: str) -> str:
    """Terminal output with rich's line wrapping undone."""
    return " ".join(text.split())


# Stands in for llama-bench in the fast tier: logs to stderr, appends what it received to
# received.jsonl in its working dir, prints a real captured llama-bench JSON on stdout, and
# exits 3 when KZ_T_FAIL=1. The slow tier runs the real llama-bench.
REPLAY_LLAMA_BENCH = f"""#!{sys.executable} -S
import json, os, sys
sys.stderr.write("replay: loading model\\n")
with open("received.jsonl", "a") as out:
    out.write(json.dumps({{"argv": sys.argv[1:], "env": {{k: v for k, v in os.environ.items() if k.startswith(("KZ_T_", "GGML_"))}}}}) + "\\n")
if os.environ.get("KZ_T_FAIL") == "1":
    sys.stderr.write("replay: failing as asked\\n")
    sys.exit(3)
if "-v" in sys.argv:
    sys.stderr.write(open({str(CAPTURED_LOG)!r}).read())
sys.stdout.write(open({str(CAPTURED_JSON)!r}).read())
"""


# Values a shell would mangle if anything on the way pasted them unquoted.
TRICKY = [
    "ADD|SUB",
    "$(touch pwned)",
    "`touch pwned`",
    "$HOME",
    "a b  c",
    "it's",
    '"q"',
    "*",
    "~",
    "x;y",
    "a\nb",
    "\\",
    "-t 6",
    "--",
    "",
]


def env_options(values: list[str]) -> list[str]:
    """``--env KZ_T_0=v0 --env KZ_T_1=v1 ...``"""
    return [arg for n, value in enumerate(values) for arg in ("--env", f"KZ_T_{n}={value}")]


SHARD = shard_name(record().host_time)  # the shard the records above go to


def exported(folder: Path) -> str:
    """Every shard of a results folder, oldest month first."""
    return "".join(path.read_text() for path in shards(folder))


def history(
    builds: int, *, devices: tuple[str, ...] = ("pad3",), step_at: int | None = None
) -> list[BenchRecord]:
    """Nightly builds over time: a pp512 and a tg128 record per run, a new upstream commit every
    third build, an A/B run (full, minus:x.patch) every fifth, and a 20 % drop in prefill from
    build ``step_at`` on."""
    found = []
    ab = [None, VariantInfo("full", 0, 2, 7), VariantInfo("minus:x.patch", 1, 2, 7)]
    for b in range(builds):
        commit = (f"{b // 3:07x}" + "c0ffee" * 6)[:40]
        lock = f"{b // 3:064x}"
        build = BuildInfo(f"b{b:05d}", lock_sha256=lock, build_commit=commit)
        time = f"2026-{1 + b * 11 // builds:02d}-{1 + b % 28:02d}T00:00:00+00:00"
        for device in devices:
            for variant in ab if b % 5 == 4 else [None]:
                run_id = f"{device}-{b:05d}-{variant.name if variant else 'main'}"
                for seq, (test, base) in enumerate((("pp512", 100.0), ("tg128", 20.0))):
                    dropped = step_at is not None and b >= step_at and test == "pp512"
                    level = base * (0.8 if dropped else 1.0)
                    samples = (level, level * 1.01, level * 0.99)
                    made = record(run_id=run_id, device=device, test=test, samples=samples, seq=seq)
                    found.append(replace(made, host_time=time, build=build, variant=variant))
    return found
