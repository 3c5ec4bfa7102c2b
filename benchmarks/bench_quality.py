#!/usr/bin/env python3
"""What the quality check costs (issue 24) next to the bench it guards: one llama-bench run of the
same model.

    python benchmarks/bench_quality.py --artifact DIR [--model FILE] [--repeats 3] [-t 2]

DIR is a host artifact with bin/llama-perplexity and bin/llama-bench (kzbuild build of demo-host);
without --model the model is the tiny qwen35 (Q4_0). The artifact is deployed to a local device in
a temp dir, and every run goes through kzbuild's own code, as kzbuild ab runs it:

- one llama-bench run: llama-bench's defaults (pp512 and tg128, 5 repetitions), as `kzbuild bench`
  runs without options;
- the quality check of one variant: the reference's logits recorded (bare upstream on the CPU,
  here the same build), then one variant compared against them (check_variants with two
  variants costs one reference run and two comparisons: the figure per variant is the second
  half), at the plan's defaults: -c 512, 4 chunks.

The two alternate, --repeats times each. Prints the medians and the ratio (goal: the check of one
variant at most 1.5x one
llama-bench run).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kzbuild.adapters.settings import Settings  # noqa: E402
from kzbuild.build.builder import load_manifest  # noqa: E402
from kzbuild.device.deploy import deploy  # noqa: E402
from kzbuild.device.local import LocalTransport  # noqa: E402
from kzbuild.device.modelpush import push_model  # noqa: E402
from kzbuild.device.registry import local_device  # noqa: E402
from kzbuild.device.run import invocation, release_named  # noqa: E402
from kzbuild.measure import quality  # noqa: E402
from kzbuild.measure.tinymodel import write_tiny_model  # noqa: E402
from kzbuild.model.quality import CPU_ONLY, QualityLimits, QualitySpec  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--artifact", type=Path, required=True)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("-t", "--threads", default="2")
    args = parser.parse_args()
    artifact = load_manifest(args.artifact / "manifest.json")
    with tempfile.TemporaryDirectory(prefix="kz-bench-quality-") as tmp:
        base = Path(tmp)
        settings = Settings(project=base / "project", cache=base / "cache", work=base / "work")
        device = local_device(settings, str(base / "device"))
        transport = LocalTransport(device.root)
        release = deploy(transport, device, artifact).release
        model = args.model or write_tiny_model(
            base / "tiny-qwen35.gguf", arch="qwen35", ftype="q4_0"
        )
        push_model(transport, device, model, name="m.gguf")
        call = invocation(
            device,
            release_named(transport, device, release),
            "llama-bench",
            ["-m", "models/m.gguf", "-t", args.threads],
            {},
        )

        def bench() -> float:
            start = time.perf_counter()
            result = transport.run(call.argv, cwd=call.cwd, env=call.env)
            if not result.ok:
                sys.exit(f"llama-bench failed: {result.text()[-2000:]}")
            return time.perf_counter() - start

        threads = (("t", args.threads),)
        spec = QualitySpec(
            limits=QualityLimits(max_kld=1.0),
            options=threads,
            reference_options=(*CPU_ONLY, *threads),
        )
        store = quality.quality_store(base / "results")

        def check() -> tuple[float, float]:
            """(reference + 1 variant, reference + 2 variants): the second variant's cost is the
            difference."""
            start = time.perf_counter()
            marks: list[float] = []
            quality.check_variants(
                transport,
                device,
                {"upstream": release, "full": release},
                spec,
                "models/m.gguf",
                store,
                base / "logs",
                on_variant=lambda name: marks.append(time.perf_counter()),
            )
            end = time.perf_counter()
            # marks: reference started, upstream compared, full compared
            return marks[2] - start, end - marks[2]

        benches, checks = [], []
        for _ in range(args.repeats):  # alternated, so a shared machine's load weighs on both alike
            benches.append(bench())
            checks.append(check())
    one_bench = statistics.median(benches)
    first = statistics.median(c[0] for c in checks)
    per_variant = statistics.median(c[1] for c in checks)
    print(
        f"model: {model.name if args.model else 'tiny qwen35 Q4_0'}, artifact {artifact.build_id}, "
        f"-t {args.threads}, median of {args.repeats}"
    )
    print(f"one llama-bench run (pp512 + tg128, 5 reps):          {one_bench:7.2f} s")
    print(
        f"quality: reference logits + first variant (-c 512 x 4): {first:7.2f} s  = "
        f"{first / one_bench:.2f}x one llama-bench run"
    )
    print(
        f"quality: each further variant:                         {per_variant:7.2f} s  = "
        f"{per_variant / one_bench:.2f}x"
    )
    print(
        "goal: the check of one variant <= 1.5x one llama-bench run: "
        f"{'met' if first <= 1.5 * one_bench else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
