"""Memory per run: kz-peakrss (the real tool, built here from kernels/peakrss/), llama.cpp's buffer
lines (a real llama-bench -v log), plans' memory_budget / htp_session_limit / turn, compare's
memory regressions, and the provenance id."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kzbuild.errors import BadRecord, ConfigError, LogFormatChanged
from kzbuild.measure import memory, plans
from kzbuild.measure.resultsdb import ResultsStore
from kzbuild.measure.turn import turn_time
from kzbuild.model.memory import BUFFER_KINDS, BufferSize, MemoryInfo, MemoryLimits, parse_size
from kzbuild.model.provenance import Provenance
from kzbuild.model.result import BenchRecord
from kzbuild.model.turn import reference_turn_s
from tests.bench.benchkit import (
    CAPTURED_LOG,
    PEAKRSS_SOURCE,
    REPLAY_LLAMA_BENCH,
    peakrss_binary,
    record,
    total_kib,
)

MIB_KIB = 1024


# --- kz-peakrss, the real tool ---
def peakrss(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(peakrss_binary()), *argv], capture_output=True, text=True, timeout=60
    )


def test_kz_peakrss_measures_a_real_process_peak_and_passes_its_exit_code():
    # a process that touches 200 MiB and frees it again before it ends: the peak is kept
    done = peakrss(
        sys.executable,
        "-c",
        "b = bytearray(200 * 1024 * 1024); del b; import sys; print('out'); sys.exit(3)",
    )
    assert done.returncode == 3 and done.stdout == "out\n"
    peak = memory.parse_peak(done.stderr)
    assert peak is not None and 200 * MIB_KIB < peak < total_kib()
    small = memory.parse_peak(peakrss(sys.executable, "-c", "pass").stderr)
    assert small is not None and small < peak - 150 * MIB_KIB  # each run is its own process's peak


def test_kz_peakrss_reports_a_killed_process_as_128_plus_its_signal():
    done = peakrss("sh", "-c", "kill -9 $$")
    assert done.returncode == 137 and done.stderr.strip().endswith("status 137")


def test_kz_peakrss_without_a_program_or_with_a_missing_one_says_so():
    assert peakrss().returncode == 125
    missing = peakrss("/nonexistent/tool")
    assert missing.returncode == 127 and "cannot run /nonexistent/tool" in missing.stderr


# --- llama.cpp's buffer lines ---
def test_buffers_of_a_real_llama_bench_log_each_at_its_largest():
    buffers = memory.parse_buffers(CAPTURED_LOG.read_text(), source="log")
    assert buffers == (
        BufferSize("CPU", "kv", 0.03),
        BufferSize("CPU", "rs", 0.03),
        BufferSize("CPU", "compute", 0.06),
        BufferSize("CPU", "output", 0.0),
        BufferSize("CPU_Mapped", "model", 0.11),
        BufferSize("CPU_REPACK", "model", 0.09),
    )  # compute: 0.06 for the pp16 context, 0.03 for tg4's


def test_buffer_lines_behind_common_logs_time_and_level_are_read():
    """llama-completion -v, at the pin: common/log.cpp puts the time and the level first."""
    text = (
        "0.00.052.713 I load_tensors:   CPU_REPACK model buffer size =     0.00 MiB\n"
        "0.00.137.049 I load_tensors:   CPU_REPACK model buffer size =     0.09 MiB\n"
        "0.00.147.849 I sched_reserve:        CPU compute buffer size =     5.15 MiB\n"
        "0.00.160.824 D ~llama_context:        CPU compute buffer size is   5.1460 MiB, matches\n"
        "I llama_kv_cache:        CPU KV buffer size =     0.50 MiB\n"
    )
    assert memory.parse_buffers(text, source="log") == (
        BufferSize("CPU", "kv", 0.5),
        BufferSize("CPU", "compute", 5.15),
        BufferSize("CPU_REPACK", "model", 0.09),
    )


def test_a_buffer_line_of_another_shape_is_refused_with_its_line():
    text = "ok\nload_tensors:   CPU_REPACK model buffer size =     0.09 GiB\n"
    with pytest.raises(LogFormatChanged, match=r"log:2: a buffer size line") as caught:
        memory.parse_buffers(text, source="log")
    assert caught.value.exit_code == 16


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["CPU", "CPU_REPACK", "HTP0", "HTP1-REPACK"]),
            st.sampled_from(list(memory.KINDS)),
            st.integers(0, 10**7),
        ),
        max_size=20,
    )
)
def test_printed_buffer_lines_parse_back_to_their_largest_size(lines):
    # as llama.cpp prints them: "%s: %10s KV buffer size = %8.2f MiB"
    text = "".join(
        f"func: {name:>10} {kind} buffer size = {hundredths / 100:8.2f} MiB\n"
        for name, kind, hundredths in lines
    )
    largest: dict[tuple[str, str], float] = {}
    for name, kind, hundredths in lines:
        key = (name, memory.KINDS[kind])
        largest[key] = max(largest.get(key, 0.0), float(f"{hundredths / 100:.2f}"))
    assert {(b.buffer, b.kind): b.mib for b in memory.parse_buffers(text, source="s")} == largest


@given(st.text(max_size=300))
def test_any_log_text_parses_or_is_refused_as_a_format_change(text):
    try:
        memory.parse_buffers(text, source="s")
    except LogFormatChanged:
        pass
    memory.parse_peak(text)  # never raises


def test_the_tree_formats_are_checked_and_a_changed_one_is_named():
    formats = {**memory.EXPECTED_FORMATS, **memory.PREFIX_FORMATS}
    sources = {
        path: "\n".join(f'LOG("{fmt}", x);' for fmt in listed) for path, listed in formats.items()
    }
    memory.check_tree_formats(sources, "tree")
    without_prefix = sources | {"common/log.cpp": 'fprintf(f, "%sI %s", a, b);'}
    with pytest.raises(LogFormatChanged, match=r"common/log.cpp: expected, not in the tree: %sD"):
        memory.check_tree_formats(without_prefix, "tree")
    sources["src/llama-kv-cache.cpp"] = r'LOG("%s: %10s KV buffer size = %8.2f GiB\n", x);'
    with pytest.raises(LogFormatChanged) as caught:
        memory.check_tree_formats(sources, "tree")
    assert "expected, not in the tree: %s: %10s KV buffer size = %8.2f MiB" in caught.value.message
    assert "in the tree, unknown here: %s: %10s KV buffer size = %8.2f GiB" in caught.value.message


# --- limits and sizes ---
@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4GiB", 4 * 2**30),
        ("3.5 GiB", int(3.5 * 2**30)),
        ("4096MiB", 4 * 2**30),
        ("4GB", 4 * 10**9),
        ("4", None),
        ("-1GiB", None),
        ("0MiB", None),
    ],
)
def test_sizes(text, size):
    assert parse_size(text) == size


@given(st.text(max_size=20))
def test_any_text_is_a_size_above_zero_or_none(text):
    size = parse_size(text)
    assert size is None or size > 0


@given(st.integers(1, 2**20), st.sampled_from(["KiB", "MiB", "GiB", "KB", "MB", "GB"]))
def test_a_written_size_reads_back(count, unit):
    base = 1024 if "i" in unit else 1000
    power = {"K": 1, "M": 2, "G": 3}[unit[0]]
    assert parse_size(f"{count}{unit}") == count * base**power


def test_a_run_over_its_limits_names_each_one():
    buffers = (
        BufferSize("HTP0", "model", 3000.0),
        BufferSize("HTP0-REPACK", "model", 700.0),
        BufferSize("HTP1", "model", 100.0),
    )
    info = MemoryInfo(
        peak_rss_kib=5 * 2**20,
        buffers=buffers,
        limits=MemoryLimits(budget_bytes=4 * 2**30, htp_session_bytes=int(3.5 * 2**30)),
    )
    assert info.over == ("memory_budget", "htp_session_limit:HTP0")  # HTP0 holds 3700 MiB > 3584
    assert dataclasses.replace(info, limits=MemoryLimits()).over == ()


@given(
    st.integers(0, 2**40),
    st.lists(
        st.tuples(
            st.sampled_from(["CPU", "HTP0"]), st.sampled_from(BUFFER_KINDS), st.integers(0, 10**8)
        ),
        max_size=5,
    ),
    st.one_of(st.none(), st.integers(1, 2**40)),
)
def test_memory_reads_back_as_itself(peak, buffers, budget):
    info = MemoryInfo(
        peak,
        tuple(BufferSize(b, k, m / 100) for b, k, m in buffers),
        MemoryLimits(budget_bytes=budget),
    )
    stored = dataclasses.replace(record(), memory=info)
    assert BenchRecord.from_dict(json.loads(json.dumps(stored.to_dict()))) == stored


def test_a_stored_memory_of_the_wrong_shape_is_refused():
    data = dataclasses.replace(record(), memory=MemoryInfo(1, ())).to_dict()
    data["memory"]["buffers"] = [["CPU", "weights", 1.0]]
    with pytest.raises(BadRecord, match="buffers"):
        BenchRecord.from_dict(data)


# --- provenance ---
PROVENANCE = Provenance(
    lock_sha256="1" * 64,
    toolchains={"cmake": "3.25.1"},
    build_id="host-1",
    model_sha256="a" * 64,
    device={"uname": "Linux x"},
)


@pytest.mark.parametrize(
    "change",
    [
        {"lock_sha256": "2" * 64},
        {"toolchains": {"cmake": "3.26"}},
        {"build_id": "host-2"},
        {"model_sha256": "b" * 64},
        {"device": {"uname": "Linux y"}},
        {"corpus_sha256": "c" * 64},
    ],
)
def test_every_part_changes_the_provenance_id(change):
    assert dataclasses.replace(PROVENANCE, **change).id != PROVENANCE.id


def test_a_provenance_whose_part_was_edited_is_refused():
    data = dataclasses.replace(record(), provenance=PROVENANCE).to_dict()
    assert BenchRecord.from_dict(json.loads(json.dumps(data))).provenance == PROVENANCE
    data["provenance"]["build_id"] = "host-3"
    with pytest.raises(BadRecord, match="not the hash of its parts"):
        BenchRecord.from_dict(data)


def test_results_show_provenance_lists_every_part(kz, project):
    with ResultsStore(project.root / "results") as store:
        store.add(
            [
                dataclasses.replace(record(run_id="r1"), provenance=PROVENANCE),
                dataclasses.replace(record(run_id="r2", test="tg128"), provenance=PROVENANCE),
            ]
        )
    shown = kz("results", "show", "--provenance", PROVENANCE.id[:8])
    assert shown.code == 0, shown.err
    for part in (
        "1" * 64,
        "host-1",
        "toolchain cmake: 3.25.1",
        "a" * 64,
        "device uname: Linux x",
        "2 record(s) in run(s) r1, r2",
    ):
        assert part in shown.out
    assert (
        json.loads(kz("results", "show", "--provenance", PROVENANCE.id, "--json").out)[
            "provenance"
        ]["id"]
        == PROVENANCE.id
    )
    assert kz("results", "show", "--provenance", "ffff").code == 13
    assert kz("results", "show").code == 2


# --- compare: memory beside tok/s, a rise is a regression ---
def with_peak(item: BenchRecord, mib: int) -> BenchRecord:
    return dataclasses.replace(item, memory=MemoryInfo(peak_rss_kib=mib * 1024))


def test_compare_flags_more_memory_past_the_threshold_with_exit_9(kz, project):
    with ResultsStore(project.root / "results") as store:
        store.add(
            [
                with_peak(record(run_id="r1", build_id="a"), 1000),
                with_peak(record(run_id="r2", build_id="b"), 1100),
            ]
        )
    result = kz("results", "compare", "r1", "r2", "--json")
    assert result.code == 9 and "use more memory than r1 past 5% (worst +10.0%)" in result.err
    row = json.loads(result.out)["rows"][0]
    assert row["verdict"] == "same" and row["memory"] == {
        "a_peak_kib": 1024000,
        "b_peak_kib": 1126400,
        "change_pct": 10.0,
        "verdict": "regression",
    }
    assert kz("results", "compare", "r1", "r2", "--memory-threshold", "15%").code == 0


# --- plans ---
PLAN = """\
model: {name: tiny.gguf, sha256: null}
memory_budget: 4GiB
htp_session_limit: 3.5GiB
turn: {prompt: 512, generate: 64, prefill: pp, decode: tg}
runs:
  - name: pp
    options: {p: "128,512", n: 0}
  - name: tg
    options: {p: 0, n: 64}
"""


def write_plan(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(text)
    return path


def test_a_plan_sets_the_memory_limits_of_every_run_and_the_turn(tmp_path):
    plan = plans.load_plan(write_plan(tmp_path, PLAN))
    assert plan.memory == MemoryLimits(4 * 2**30, int(3.5 * 2**30)) and all(
        run.spec.memory_limits == plan.memory for run in plan.runs
    )
    assert plan.turn is not None and (
        plan.turn.prompt,
        plan.turn.generate,
        plan.turn.prefill,
        plan.turn.decode,
    ) == (512, 64, "pp", "tg")


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "memory_budget: 4GiB",
            "memory_budget: lots",
            "plan.yaml:2: memory_budget: 'lots' is not a size",
        ),
        (
            "htp_session_limit: 3.5GiB",
            "htp_session_limit: 3",
            "plan.yaml:3: htp_session_limit: 3 is not a size",
        ),
        (
            "prefill: pp,",
            "prefill: nope,",
            "plan.yaml:4: prefill: names no run of the plan (runs: pp, tg)",
        ),
        ("prompt: 512", "prompt: 256", "run 'pp' does not measure -p 256"),
        ("generate: 64", "generate: 32", "run 'tg' does not measure -n 32"),
        ("prompt: 512", "prompt: 0", "prompt: must be a whole number from 1"),
    ],
)
def test_bad_memory_and_turn_keys_name_the_file_line_and_key(tmp_path, old, new, message):
    with pytest.raises(ConfigError) as caught:
        plans.load_plan(write_plan(tmp_path, PLAN.replace(old, new)))
    assert message in caught.value.message


# --- the turn ---
def test_the_turn_takes_the_best_prefill_and_decode_configuration():
    pp = [
        record(test="pp512", samples=(50.0,), config={"n_ubatch": 128}),
        record(test="pp512", samples=(64.0,), config={"n_ubatch": 512}),
        record(test="pp128", samples=(500.0,)),
    ]
    tg = [record(test="tg64", samples=(16.0,), config={"n_threads": 8})]
    turned = turn_time(pp, tg, prompt=512, generate=64)
    assert (
        turned.prefill_tps == 64.0
        and "ub=512" in turned.prefill_config
        and turned.ttft_s == 8.0
        and turned.turn_s == 12.0
    )
    assert reference_turn_s(64) == pytest.approx((0.19 + 64 / 21, 0.19 + 64 / 14))


# --- the whole bench command with a plan ---
@pytest.fixture
def planned(device_root, tmp_path):
    device_root.add_tool("llama-bench", REPLAY_LLAMA_BENCH)  # a python: its peak is several MiB
    device_root.add_file("models/tiny.gguf", b"tiny")
    replayed = (
        "runs:\n  - name: pp\n    options: {p: 32, n: 8, t: 1}\n"
        "turn: {prompt: 32, generate: 8, prefill: pp, decode: pp}\n"
    )
    return device_root, "model: {name: tiny.gguf, sha256: null}\n" + replayed


def test_a_plan_whose_budget_is_below_the_measured_peak_exits_15_and_marks_the_run(
    kz, planned, tmp_path
):
    device_root, plan = planned
    over = write_plan(tmp_path, plan + "memory_budget: 1MiB\n")
    result = kz("bench", "--plan", str(over), "--device", device_root.spec, "--json")
    assert result.code == 15, result.err
    assert "over the plan's memory limits" in result.err
    out = json.loads(result.out)
    records = out["runs"][0]["records"]
    assert all(
        r["memory_over"] == ["memory_budget"] and r["memory"]["peak_rss_kib"] > 1024
        for r in records
    )
    assert out["turn"]["ttft_s"] > 0 and out["turn"]["reference"]["ttft_s"] == 0.19
    shown = kz("results", "show", "latest", "--markdown")
    assert shown.code == 15 and all(
        line.endswith("| OVER memory_budget |")
        for line in shown.out.splitlines()
        if line.startswith("| pp32")
    )


def test_a_plan_within_its_budget_prints_memory_and_the_turn(kz, planned, tmp_path):
    device_root, plan = planned
    result = kz(
        "bench",
        "--plan",
        str(write_plan(tmp_path, plan + "memory_budget: 4GiB\n")),
        "--device",
        device_root.spec,
    )
    assert result.code == 0, result.err
    shown = kz("results", "show", "latest", "--markdown")
    assert shown.code == 0 and "| peak MiB | buffers MiB | over |" in shown.out
    row = next(line for line in shown.out.splitlines() if line.startswith("| pp32"))
    assert "| CPU 0.1 CPU_Mapped 0.1 CPU_REPACK 0.1 |  |" in row
    assert (
        "turn: prompt 32, generate 8: TTFT" in result.out
        and "reference ExecuTorch Qwen3-4B: TTFT 190 ms, decode 14-21 tok/s" in result.out
    )


def test_a_budget_on_a_release_without_kz_peakrss_is_refused(kz, tmp_path):
    from tests.bench.benchkit import make_device_root

    bare = make_device_root(tmp_path / "bare", manifest={"build_id": "b1"}, peakrss=False)
    bare.add_tool("llama-bench", REPLAY_LLAMA_BENCH)
    bare.add_file("models/tiny.gguf", b"tiny")
    plan = write_plan(
        tmp_path,
        "model: {name: tiny.gguf, sha256: null}\nmemory_budget: 4GiB\n"
        "runs:\n  - name: pp\n    options: {p: 32, n: 0}\n",
    )
    result = kz("bench", "--plan", str(plan), "--device", bare.spec)
    assert (
        result.code == 2
        and "has no kz-peakrss, so the memory_budget cannot be checked" in result.err
    )


def test_ab_gives_each_variant_its_turn_from_its_own_records(tmp_path):
    from kzbuild.cli.ab import variant_turns
    from kzbuild.model.ab import AbResult, AbRun
    from kzbuild.model.interleave import InterleavedRun

    plan = plans.load_plan(write_plan(tmp_path, PLAN))

    def run(name: str, test: str, full: float, upstream: float) -> AbRun:
        records = {
            "full": (record(test=test, samples=(full,)),),
            "upstream": (record(test=test, samples=(upstream,)),),
        }
        return AbRun(
            name, "pad3", InterleavedRun("r", 1, (("full", "upstream"),), records, (), tmp_path)
        )

    runs = (run("pp", "pp512", 64.0, 32.0), run("tg", "tg64", 16.0, 16.0))
    result = AbResult("tiny", "pad3", "host", 1, (), runs, (), ())
    turns = variant_turns(plan, result)
    assert (turns["full"].ttft_s, turns["full"].turn_s) == (8.0, 12.0)
    assert (turns["upstream"].ttft_s, turns["upstream"].turn_s) == (16.0, 20.0)


HEX = st.text("0123456789abcdef", min_size=64, max_size=64)


@given(
    st.one_of(st.none(), HEX),
    st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=8), max_size=3),
    st.one_of(st.none(), st.text(max_size=20)),
    st.one_of(st.none(), HEX),
    st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=20), max_size=3),
    st.one_of(st.none(), HEX),
)
def test_a_provenance_reads_back_as_itself_with_its_id(
    lock, toolchains, build, model, device, corpus
):
    made = Provenance(lock, toolchains, build, model, device, corpus)
    stored = dataclasses.replace(record(), provenance=made)
    read = BenchRecord.from_dict(json.loads(json.dumps(stored.to_dict())))
    assert read.provenance == made and read.provenance.id == made.id


ALLOC_C = r"""
#include <stdlib.h>
int main(void) {
    volatile char *p = malloc(64 << 20);
    for (int i = 0; i < (64 << 20); i += 4096) p[i] = 1;
    return 4;
}
"""


def test_a_device_runner_runs_kz_peakrss_and_the_tool_under_it(tmp_path):
    """linux-arm64 under qemu: the runner runs the aarch64 kz-peakrss, which runs the call as it
    was (runner and tool), and measures it."""
    from kzbuild.device.run import under_peakrss
    from kzbuild.model.device import Device
    from kzbuild.model.run import Invocation, Release

    sysroot = "/usr/aarch64-linux-gnu"
    release = tmp_path / "release"
    (release / "bin").mkdir(parents=True)
    (tmp_path / "alloc.c").write_text(ALLOC_C)
    for out, source in (("kz-peakrss", str(PEAKRSS_SOURCE)), ("alloc", str(tmp_path / "alloc.c"))):
        subprocess.run(
            ["aarch64-linux-gnu-gcc", "-O1", "-o", str(release / "bin" / out), source], check=True
        )
    runner = ("qemu-aarch64", "-L", sysroot)
    device = Device(name="arm", transport="local", root=str(tmp_path), runner_prefix=runner)
    call = Invocation(argv=(*runner, str(release / "bin" / "alloc")), env={}, cwd=str(tmp_path))
    wrapped = under_peakrss(
        call, Release(build_id="b", dir=str(release), manifest={}, manifest_sha256=None), device
    )
    assert wrapped.argv == (*runner, str(release / "bin" / "kz-peakrss"), *call.argv)
    done = subprocess.run(wrapped.argv, capture_output=True, text=True, timeout=120)
    peak = memory.parse_peak(done.stderr)
    assert done.returncode == 4 and peak is not None and 64 * MIB_KIB < peak < total_kib()
