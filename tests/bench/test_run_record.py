"""kzbuild run stores a record as bench does: the real kz-peakrss's peak, llama.cpp's buffers from
the tool's own stderr, the build, the device and the provenance; results show, compare and
--provenance read it; --memory-budget and --htp-session-limit exit 15 past them."""

from __future__ import annotations

import hashlib
import json

from tests.bench.benchkit import (
    BUFFERS_TOOL,
    flat,
    make_device_root,
    stored_run_id,
    total_kib,
)

MODEL = b"GGUF stand-in for kzbuild run"


def run(kz, device_root, *extra: str, mib: int = 64):  # type: ignore[no-untyped-def]
    return kz(
        "run",
        "--device",
        device_root.spec,
        *extra,
        "llama-tool",
        "-m",
        "models/x.gguf",
        "--mib",
        str(mib),
    )


def test_a_run_is_stored_with_its_peak_buffers_and_provenance(kz, device_root):
    device_root.add_tool("llama-tool", BUFFERS_TOOL)
    device_root.add_file("models/x.gguf", MODEL)
    done = run(kz, device_root)
    assert done.code == 0, done.err
    assert done.out == "generated 64\n"  # stdout is the tool's alone
    run_id = stored_run_id(done.err)
    shown = kz("results", "show", run_id, "--json")
    assert shown.code == 0, shown.err
    (record,) = json.loads(shown.out)
    assert record["kind"] == "run" and record["test"] == "llama-tool"
    assert record["config"] == {"args": "-m models/x.gguf --mib 64"}
    assert record["argv"][0].endswith("/bin/kz-peakrss")  # measured, not estimated
    peak = record["memory"]["peak_rss_kib"]
    assert 64 * 1024 < peak < total_kib()
    buffers = {(b[0], b[1]): b[2] for b in record["memory"]["buffers"]}
    assert buffers[("CPU_REPACK", "model")] == 0.09 and buffers[("CPU", "kv")] == 0.03
    assert record["build"]["build_id"] == device_root.build_id
    assert record["device"]["fingerprint"] and record["memory_over"] == []
    provenance = record["provenance"]
    assert provenance["model_sha256"] == hashlib.sha256(MODEL).hexdigest()
    assert provenance["build_id"] == device_root.build_id and provenance["lock_sha256"] == "0" * 64
    parts = kz("results", "show", "--provenance", provenance["id"][:8])
    assert parts.code == 0, parts.err
    assert f"build id: {device_root.build_id}" in parts.out and run_id in parts.out


def test_the_same_run_twice_is_compared_and_more_memory_is_a_regression(kz, device_root):
    device_root.add_tool("llama-tool", BUFFERS_TOOL)
    device_root.add_file("models/x.gguf", MODEL)
    first = stored_run_id(run(kz, device_root, mib=32).err)
    device_root.add_tool("llama-tool", BUFFERS_TOOL.replace("<< 20)", "<< 21)"))  # twice as much
    second = stored_run_id(run(kz, device_root, mib=32).err)
    compared = kz("results", "compare", first, second, "--json")
    assert compared.code == 9, compared.err
    (row,) = json.loads(compared.out)["rows"]
    assert row["memory"]["verdict"] == "regression" and row["memory"]["change_pct"] > 50
    assert "use more memory" in flat(compared.err)


def test_a_run_over_its_memory_budget_or_htp_session_limit_exits_15(kz, device_root):
    device_root.add_tool("llama-tool", BUFFERS_TOOL)
    device_root.add_file("models/x.gguf", MODEL)
    over = run(kz, device_root, "--memory-budget", "16MiB")
    assert over.code == 15, over.err
    assert "OVER memory_budget" in flat(over.err) and "over the plan's memory limits" in flat(
        over.err
    )
    shown = kz("results", "show", stored_run_id(over.err), "--json")
    assert shown.code == 15 and json.loads(shown.out)[0]["memory_over"] == ["memory_budget"]
    within = run(kz, device_root, "--memory-budget", "4GiB")
    assert within.code == 0, within.err
    session = run(kz, device_root, "--htp-session-limit", "3.5GiB")  # HTP0 holds 3700 MiB
    assert session.code == 15 and "htp_session_limit:HTP0" in flat(session.err)
    bad = run(kz, device_root, "--memory-budget", "lots")
    assert bad.code == 2 and "--memory-budget 'lots' is not a size" in flat(bad.err)


def test_without_kz_peakrss_a_run_is_stored_without_a_peak_and_a_budget_is_refused(kz, tmp_path):
    device = make_device_root(tmp_path / "old", build_id="old-build", peakrss=False)
    device.add_tool("llama-tool", BUFFERS_TOOL)
    refused = run(kz, device, "--memory-budget", "4GiB")
    assert refused.code == 2 and "has no kz-peakrss" in flat(refused.err)
    done = run(kz, device)
    assert done.code == 0, done.err
    assert "peak memory is not measured" in flat(done.err)
    (record,) = json.loads(kz("results", "show", stored_run_id(done.err), "--json").out)
    assert record["memory"]["peak_rss_kib"] is None and record["memory"]["buffers"]
    assert record["provenance"]["model_sha256"] is None  # models/x.gguf is not there: a warning


def test_a_failed_run_stores_nothing(kz, device_root):
    device_root.add_tool("fails", "#!/bin/sh\necho to-stderr >&2\nexit 3\n")
    failed = kz("run", "--device", device_root.spec, "fails")
    assert failed.code == 3 and "stored run" not in failed.err
    listed = kz("results", "list", "--json")
    assert listed.code == 0 and json.loads(listed.out) == []
