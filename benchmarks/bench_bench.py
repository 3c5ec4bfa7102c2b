#!/usr/bin/env python3
"""Bench overhead for issue 6: `kzbuild bench` against running llama-bench directly, same device.

    python benchmarks/bench_bench.py --llama-bin DIR [--rounds 7] [--arch llama|qwen35]

DIR holds a host build's llama-bench and its shared libraries (a cmake bin dir, or an artifact
with bin/ and lib/; default: $KZ_LLAMA_BIN_DIR). The device is `local`: a staging root in a
temp dir whose current release holds that llama-bench, and a tiny generated model.

For each workload, rounds alternate between:
  direct      llama-bench as a subprocess with exactly the argv, env and cwd kzbuild uses;
  kzbuild     `python -m kzbuild bench ...` as a subprocess: what a user waits for, including
              interpreter start, device probe, model hash, storing and the JSONL export;
  in-process  kzbuild.measure.bench.bench() called directly (kzbuild's own work, no interpreter
  start).
Medians are reported with the overhead over direct, in ms and percent.
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kzbuild.adapters.settings import Settings  # noqa: E402
from kzbuild.device.local import LocalTransport  # noqa: E402
from kzbuild.device.registry import parse_device_spec  # noqa: E402
from kzbuild.device.run import current_release, invocation  # noqa: E402
from kzbuild.measure import bench  # noqa: E402
from kzbuild.measure.resultsdb import ResultsStore  # noqa: E402
from kzbuild.measure.tinymodel import write_tiny_model  # noqa: E402
from kzbuild.model.bench import BenchSpec  # noqa: E402

SHORT = (("p", "64"), ("n", "16"), ("r", "3"), ("t", "1"))
DEFAULTS = (("t", "1"),)  # llama-bench's own: -p 512 -n 128 -r 5
WORKLOADS: dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]] = {
    "short (-p 64 -n 16 -r 3)": (SHORT, ()),
    "llama-bench defaults (-p 512 -n 128 -r 5)": (DEFAULTS, ()),
    "long (-p 2048 -n 256 -r 5)": ((("p", "2048"), ("n", "256"), ("t", "1")), ()),
    "sustained (-p 512 -n 128 -r 40)": ((("r", "40"), ("t", "1")), ()),
    "sweep ub=64,128,256,512, defaults (4 runs)": (DEFAULTS, ("ub=64,128,256,512",)),
}


def make_device(root: Path, llama_bin: Path, arch: str) -> None:
    tools, libs = (
        (llama_bin / "bin", llama_bin / "lib")
        if (llama_bin / "bin" / "llama-bench").is_file()
        else (llama_bin, llama_bin)
    )
    release = root / "releases" / "bench-host"
    (release / "bin").mkdir(parents=True)
    (release / "lib").mkdir()
    shutil.copy2(tools / "llama-bench", release / "bin" / "llama-bench")
    for lib in libs.glob("lib*.so*"):
        shutil.copy2(lib, release / "lib" / lib.name, follow_symlinks=False)
    (release / "manifest.json").write_text('{"build_id": "bench-host", "recipe": "demo-host"}')
    (root / "current").symlink_to("releases/bench-host")
    (root / "models").mkdir()
    write_tiny_model(root / "models" / "tiny.gguf", arch=arch, ftype="f32")


def timed(action) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--llama-bin", type=Path, default=os.environ.get("KZ_LLAMA_BIN_DIR"))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--arch", default="llama", choices=("llama", "qwen35"))
    args = parser.parse_args()
    if not args.llama_bin:
        parser.error("give --llama-bin DIR or set KZ_LLAMA_BIN_DIR")

    with tempfile.TemporaryDirectory(prefix="kz-bench-bench-") as temp:
        base = Path(temp)
        project = base / "project"
        for folder in ("recipes", "patches"):
            (project / folder).mkdir(parents=True)
        (project / "patches" / "series").write_text("")
        settings = Settings(project=project, cache=base / "cache", work=base / "work")
        root = base / "device"
        make_device(root, args.llama_bin, args.arch)
        device = parse_device_spec(f"local:{root}")
        assert device is not None
        transport = LocalTransport(str(root))
        release = current_release(transport, device)

        print(f"device local:{root}  model: tiny {args.arch} f32  rounds: {args.rounds}  (medians)")
        print(
            f"{'workload':44} {'direct':>9} {'kzbuild':>9} {'overhead':>17} {'in-process':>11} "
            f"{'overhead':>17}"
        )
        for name, (options, sweeps) in WORKLOADS.items():
            spec = BenchSpec(
                model="models/tiny.gguf",
                options=options,
                sweep=tuple(bench.parse_sweep(t) for t in sweeps),
                seed=0,
            )
            calls = [
                invocation(
                    device,
                    release,
                    "llama-bench",
                    bench.llama_bench_args(spec, point),
                    point.env(spec),
                )
                for point in bench.plan(spec)[1]
            ]
            cli = [
                sys.executable,
                "-m",
                "kzbuild",
                "--project",
                str(project),
                "--work-dir",
                str(base / "work"),
                "bench",
                "--device",
                f"local:{root}",
                "-m",
                spec.model,
                "--seed",
                "0",
            ]
            cli += [
                arg for option, value in options for arg in (f"-{option}", value)
            ]  # -p -n -r -t, as llama-bench
            cli += [arg for sweep in sweeps for arg in ("--sweep", sweep)]

            def direct() -> None:
                for call in calls:
                    subprocess.run(
                        call.argv,
                        cwd=call.cwd,
                        env={**os.environ, **call.env},
                        check=True,
                        capture_output=True,
                    )

            times: dict[str, list[float]] = {"direct": [], "kzbuild": [], "in-process": []}
            with ResultsStore(settings.results) as store:
                for _ in range(args.rounds):
                    times["direct"].append(timed(direct))
                    times["kzbuild"].append(
                        timed(
                            lambda: subprocess.run(cli, cwd=REPO, check=True, capture_output=True)
                        )
                    )
                    times["in-process"].append(
                        timed(lambda: bench.bench(settings, transport, device, spec, store))
                    )
            direct, cli_time, inproc = (
                statistics.median(times[k]) for k in ("direct", "kzbuild", "in-process")
            )

            def overhead(total: float) -> str:
                return (
                    f"{(total - direct) * 1000:+7.0f} ms {100 * (total - direct) / direct:+6.1f}%"
                )

            print(
                f"{name:44} {direct:8.3f}s {cli_time:8.3f}s {overhead(cli_time):>17} "
                f"{inproc:10.3f}s {overhead(inproc):>17}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
