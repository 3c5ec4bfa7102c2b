"""kzbuild profile, fast tier: ggml-hexagon's profile-op lines, the format check against a synced
tree, kz-profile's output, aggregation, storage, --compare and the build plan of kz-profile."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kzbuild.errors import BadRecord, ProfileFormatChanged
from kzbuild.measure import htpprofile, profiling
from kzbuild.measure.htpprofile import BATCH_FORMAT, OP_FORMAT, check_tree_formats, parse_htp_log
from kzbuild.model.profile import BatchTotals, OpTime, PhaseProfile, ProfileRecord, ProfileSpec
from kzbuild.model.result import BuildInfo, DeviceInfo, ModelInfo
from kzbuild.model.run import Release
from tests.bench.benchkit import flat
from tests.conftest import REPO_ROOT


def c_printf(fmt: str, *args: object) -> str:
    """A C format string as written in the source (``\\n`` as two characters), rendered like
    printf."""
    python = fmt.replace(r"\n", "\n").replace("%llu", "%d").replace("%u", "%d")
    return python % args


def op_line(
    op: str, usec: int, *, session: str = "HTP0", dst: str = "out-3", fmt: str = OP_FORMAT
) -> str:
    mhz = 0.0 if usec == 0 else 1512.0
    return c_printf(
        fmt,
        session,
        op,
        f"a x b -> {dst}",
        "128:4 -> 128:4",
        "f32 -> f32",
        "4:512 -> 4:512",
        "----",
        usec,
        usec * 1512,
        77,
        mhz,
        "",
    )


def batch_line(n_ops: int, usec: int, *, session: str = "HTP0", fmt: str = BATCH_FORMAT) -> str:
    return c_printf(fmt, session, n_ops, "----", usec, usec * 1512, 5, 1512.0)


def hexagon_cpp(op_format: str = OP_FORMAT, batch_format: str = BATCH_FORMAT) -> str:
    """The shape of ggml-hexagon.cpp's two profiler calls."""
    return (
        "static void ggml_hexagon_dump_op_prof() {\n"
        f'    GGML_LOG_DEBUG("{op_format}", sess_name.c_str(), node.op_name().c_str());\n'
        "}\n"
        "static void ggml_hexagon_dump_batch_prof() {\n"
        f'    GGML_LOG_DEBUG("{batch_format}",\n                   sess_name.c_str(), rsp.n_ops);\n'
        "}\n"
    )


# --- the HTP parser ---
def test_two_gated_delta_net_lines_sum_to_4000(kz, tmp_path):
    log = tmp_path / "htp.log"
    log.write_text(
        "\n".join(
            [
                batch_line(2, 4100),
                op_line("GATED_DELTA_NET", 1500),
                op_line("GATED_DELTA_NET", 2500, dst="out-7"),
                "",
            ]
        )
    )
    result = kz("profile", "--from-log", str(log), "--json")
    assert result.code == 0, result.err
    phases = json.loads(result.out)["phases"]
    assert [p["phase"] for p in phases] == ["all"]
    [gdn] = phases[0]["ops"]
    assert (gdn["op"], gdn["backends"], gdn["count"], gdn["usec"], gdn["share"]) == (
        "GATED_DELTA_NET",
        ["HTP0"],
        2,
        4000,
        1.0,
    )
    shown = kz("profile", "--from-log", str(log))
    assert shown.code == 0 and "GATED_DELTA_NET" in shown.out and "4.000" in shown.out  # ms


def test_phase_markers_split_prefill_and_decode_and_timed_runs_do_not_count(tmp_path):
    lines = [
        op_line("MUL_MAT", 999),  # before any marker: model load, warm-up
        "kz-profile: phase prefill plain rep 0 begin",
        batch_line(2, 300),
        op_line("MUL_MAT", 100, dst="ffn_out-0"),
        op_line("MUL_MAT", 200, dst="ffn_out-1"),
        "kz-profile: phase prefill plain rep 0 end",
        "kz-profile: phase prefill timed rep 0 begin",
        op_line("MUL_MAT", 5000),
        "kz-profile: phase prefill timed rep 0 end",
        "kz-profile: phase decode plain rep 0 begin",
        op_line("RMS_NORM", 7, dst="norm"),
        "kz-profile: phase decode plain rep 0 end",
    ]
    parsed = parse_htp_log("\n".join(lines).encode(), source="log")
    by_phase = {p.phase: p for p in parsed.phases}
    assert set(by_phase) == {"prefill", "decode"}
    assert sorted((r.layer, r.usec) for r in by_phase["prefill"].ops) == [(0, 100.0), (1, 200.0)]
    assert [(r.op, r.layer, r.usec) for r in by_phase["decode"].ops] == [("RMS_NORM", -1, 7.0)]
    assert parsed.batches["prefill"] == BatchTotals(batches=1, ops=2, usec=300)
    by_layer = profiling.summarize(by_phase["prefill"], by="layer")
    assert [(s.layer, s.op, s.usec) for s in by_layer] == [
        (0, "MUL_MAT", 100.0),
        (1, "MUL_MAT", 200.0),
    ]


def test_pmu_suffix_and_log_prefixes_are_read(tmp_path):
    line = op_line("ADD", 12).rstrip("\n") + " pmu [1,2,3,4,5,6,7,8]"
    parsed = parse_htp_log(f"0.01.234.567 D {line}\n".encode(), source="log")
    assert [(r.op, r.usec) for r in parsed.phases[0].ops] == [("ADD", 12.0)]


@pytest.mark.parametrize(
    "line",
    [
        "ggml-hex: HTP0 profile-op MUL_MAT|a|b|c|d|e|usec 12 cycles 3 start 1",  # no mhz
        # fields missing
        "ggml-hex: HTP0 profile-op MUL_MAT|a|b|c|usec 12 cycles 3 start 1 mhz 1.0",
        "ggml-hex: HTP0 profile-op MUL_MAT|a|b|c|d|e|usec -12 cycles 3 start 1 mhz 1.0",
        "ggml-hex: HTP0 profile-op OPBATCH|----|n-ops x|----|----|----|usec 1 cycles 3 start 1 mhz "
        "1.0",
        # more than %u prints
        "ggml-hex: HTP0 profile-op MUL_MAT|a|b|c|d|e|usec 99999999999 cycles 3 start 1 mhz 1.0",
        # numbers past what int() reads
        "ggml-hex: HTP0 profile-op MUL_MAT|a|b|c|d|e|usec "
        + "9" * 5000
        + " cycles 3 start 1 mhz 1.0",
        "ggml-hex: HTP0 profile-op OPBATCH|----|n-ops "
        + "9" * 5000
        + "|x|----|----|usec 1 cycles 3 start 1 mhz 1.0",
    ],
)
def test_a_profile_op_line_of_another_shape_is_refused_naming_file_and_line(kz, tmp_path, line):
    log = tmp_path / "bad.log"
    log.write_text(op_line("ADD", 3) + line + "\n")
    with pytest.raises(BadRecord, match=re.escape(f"{log}:2")):
        parse_htp_log(log.read_bytes(), source=str(log))
    result = kz("profile", "--from-log", str(log))
    assert (
        result.code == 13 and f"{log}:2" in flat(result.err) and "Traceback" not in flat(result.err)
    )


def test_a_layer_number_too_long_for_int_is_no_layer(tmp_path):
    parsed = parse_htp_log(op_line("ADD", 3, dst="out-" + "9" * 5000).encode(), source="log")
    assert [(r.op, r.layer) for r in parsed.phases[0].ops] == [("ADD", -1)]


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_from_log_refuses_what_is_not_a_regular_file_without_reading_it(kz, tmp_path, kind):
    path = {"fifo": tmp_path / "fifo", "dev-zero": Path("/dev/zero"), "directory": tmp_path}[kind]
    if kind == "fifo":
        os.mkfifo(path)  # opening it would block until a writer came
    started = time.monotonic()
    result = kz("profile", "--from-log", str(path))
    assert result.code == 2 and "is not a regular file" in flat(result.err), result.err
    assert str(path) in flat(result.err) and time.monotonic() - started < 10


def test_from_log_refuses_a_log_past_its_size_bound(kz, tmp_path, monkeypatch):
    log = tmp_path / "big.log"
    log.write_text(op_line("ADD", 3) * 100)
    monkeypatch.setattr(profiling, "MAX_LOG", 1000)
    result = kz("profile", "--from-log", str(log))
    said = "more than the 1000 a saved log may have"
    assert result.code == 2 and said in flat(result.err), result.err


def test_a_log_without_profile_lines_says_so(kz, tmp_path):
    log = tmp_path / "plain.log"
    log.write_text("llama_model_loader: loaded meta data\n")
    result = kz("profile", "--from-log", str(log))
    assert result.code == 13 and "GGML_HEXAGON_PROFILE=1" in flat(result.err)


PART = st.text(
    st.characters(blacklist_characters="|\n\r", blacklist_categories=("Cs",)),
    min_size=0,
    max_size=12,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["MUL_MAT", "GATED_DELTA_NET", "ADD", "FLASH_ATTN_EXT"]),
            st.integers(0, 2**32 - 1),
            PART,
        ),
        max_size=20,
    )
)
def test_lines_rendered_from_the_format_strings_read_back(ops):
    text = "".join(op_line(op, usec, dst=dst) for op, usec, dst in ops)
    parsed = parse_htp_log(text.encode(), source="log")
    totals: dict[str, float] = {}
    for op, usec, _ in ops:
        totals[op] = totals.get(op, 0) + usec
    got = {s.op: s.usec for s in profiling.summarize(parsed.phases[0])} if ops else {}
    assert got == totals


@settings(max_examples=300, deadline=None)
@given(
    data=st.one_of(
        st.binary(max_size=400),
        st.lists(
            st.one_of(
                PART,
                st.just("ggml-hex: HTP0 profile-op "),
                st.just("|usec 1 cycles 2 start 3 mhz 0.0"),
                st.just("kz-profile: phase prefill plain rep 0 begin"),
                st.just("\n"),
            )
        ).map(lambda xs: "".join(xs).encode()),
    )
)
def test_bad_input_gives_a_bad_record_or_a_result_never_a_traceback(data):
    try:
        parsed = parse_htp_log(data, source="log")
    except BadRecord as exc:
        assert "log:" in exc.message
        return
    for phase in parsed.phases:
        assert all(row.usec >= 0 and row.count >= 1 for row in phase.ops)


# --- the format check ---
def test_the_format_check_passes_the_expected_strings_and_names_what_differs():
    check_tree_formats(hexagon_cpp(), "ggml-hexagon.cpp")
    changed = OP_FORMAT.replace("usec %u cycles", "usec %u nsec %u cycles")
    with pytest.raises(ProfileFormatChanged) as raised:
        check_tree_formats(hexagon_cpp(op_format=changed), "ggml-hexagon.cpp")
    assert changed in raised.value.message and OP_FORMAT in raised.value.message
    with pytest.raises(ProfileFormatChanged, match="prints no 'profile-op' lines"):
        check_tree_formats("int main() {}\n", "ggml-hexagon.cpp")


def synced_recipe(kz, project, upstream, name: str, source: str) -> None:
    commit = upstream.commit({htpprofile.HEXAGON_CPP: source}, f"hexagon {name}")
    project.recipe(name, commit=commit, sources=[f"path: {upstream.path}"])
    result = kz("sync", name)
    assert result.code == 0, result.err


def test_from_log_checks_the_synced_trees_format_first(kz, project, upstream, tmp_path):
    log = tmp_path / "htp.log"
    log.write_text(op_line("GATED_DELTA_NET", 1500) + op_line("GATED_DELTA_NET", 2500))
    synced_recipe(kz, project, upstream, "same", hexagon_cpp())
    same = kz("profile", "--from-log", str(log), "--recipe", "same", "--json")
    assert same.code == 0, same.err
    assert json.loads(same.out)["phases"][0]["ops"][0]["usec"] == 4000
    synced_recipe(
        kz,
        project,
        upstream,
        "bumped",
        hexagon_cpp(batch_format=BATCH_FORMAT.replace("n-ops %u", "n-ops %u n-bufs %u")),
    )
    bumped = kz("profile", "--from-log", str(log), "--recipe", "bumped")
    assert bumped.code == 13, bumped.err
    assert (
        "profile-op format differs" in flat(bumped.err)
        and "n-bufs" in flat(bumped.err)
        and "Traceback" not in flat(bumped.err)
    )


# --- kz-profile's output ---
TOOL_OUTPUT = {
    "tool": "kz-profile",
    "format": 2,
    "n_prompt": 64,
    "n_gen": 4,
    "n_ubatch": 64,
    "n_threads": 1,
    "reps": 2,
    "phases": [
        {
            "phase": "prefill",
            "tokens": 64,
            "wall_us_plain": [900.0, 1000.0],
            "wall_us_timed": [1100.0, 1200.0],
            "nodes": [
                {"op": "MUL_MAT", "backend": "CPU", "layer": 0, "count": 4, "us": [300.0, 310.0]},
                {"op": "MUL_MAT", "backend": "CPU", "layer": 1, "count": 4, "us": [300.0, 290.0]},
                {
                    "op": "GATED_DELTA_NET",
                    "backend": "CPU",
                    "layer": 0,
                    "count": 2,
                    "us": [200.0, 220.0],
                },
                {"op": "GET_ROWS", "backend": "CPU", "layer": -1, "count": 2, "us": [0.0, 0.0]},
            ],
        },
        {
            "phase": "decode",
            "tokens": 4,
            "wall_us_plain": [50.0, 60.0],
            "wall_us_timed": [80.0, 90.0],
            "nodes": [
                {"op": "MUL_MAT", "backend": "CPU", "layer": 0, "count": 16, "us": [50.0, 50.0]}
            ],
        },
    ],
}


def test_tool_output_is_read_and_summarized_per_repetition():
    config, phases = profiling.parse_tool_output(
        json.dumps(TOOL_OUTPUT).encode(), source="out.json"
    )
    assert config["reps"] == 2 and [p.phase for p in phases] == ["prefill", "decode"]
    rows = profiling.summarize(phases[0], reps=2)
    # the repetition of median timed wall (the lower middle of two: rep 0, 1100 us) and its own ops
    assert profiling.median_rep(phases[0]) == 0
    assert [(r.op, r.count, r.usec) for r in rows] == [
        ("MUL_MAT", 4, 600.0),
        ("GATED_DELTA_NET", 1, 200.0),
        ("GET_ROWS", 1, 0.0),
    ]
    assert sum(r.share for r in rows) == pytest.approx(1.0)
    assert rows[0].share == pytest.approx(0.75)
    assert rows[1].spread_pct == pytest.approx(20 / 210 * 100) and rows[2].spread_pct is None
    assert profiling.phase_times(phases[0], 2) == (800.0, 900.0, 1100.0)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda d: d["phases"][0]["nodes"][0].update(us=-1), "nodes[0]: us"),
        (lambda d: d["phases"][0]["nodes"][0].update(us=[1.0]), "nodes[0]: us"),
        (lambda d: d["phases"][0]["nodes"][0].update(us=600.0), "nodes[0]: us"),
        (lambda d: d.update(format=1), "format 2"),
        (lambda d: d["phases"][0]["nodes"][0].update(layer=-7), "nodes[0]: layer"),
        (lambda d: d["phases"][0].update(phase="warmup"), "phase"),
        (lambda d: d["phases"][0].update(wall_us_plain=[1, 2, 3]), "wall_us_plain"),
        (lambda d: d.update(tool="llama-bench"), "not kz-profile output"),
        (lambda d: d.update(phases=[]), "phases"),
    ],
)
def test_tool_output_of_the_wrong_shape_is_refused(change, named):
    data = json.loads(json.dumps(TOOL_OUTPUT))
    change(data)
    with pytest.raises(BadRecord, match=re.escape(named)):
        profiling.parse_tool_output(json.dumps(data).encode(), source="out.json")


# --- storage and --compare ---
def record(
    run_id: str,
    *,
    gdn_us: float,
    backend: str = "CPU",
    sha: str = "a" * 64,
    host_time: str = "2026-12-03T10:00:00+00:00",
) -> ProfileRecord:
    prefill = PhaseProfile(
        "prefill",
        64,
        (OpTime("MUL_MAT", "CPU", 0, 4, 1000.0), OpTime("GATED_DELTA_NET", backend, 0, 1, gdn_us)),
        (1500.0,),
        (1700.0,),
    )
    return ProfileRecord(
        run_id=run_id,
        host_time=host_time,
        build=BuildInfo(build_id="host-1", recipe="demo-host"),
        device=DeviceInfo(name="local", fingerprint={"uname": "Linux"}),
        model=ModelInfo(path="models/tiny.gguf", sha256=sha),
        config={"n_prompt": 64, "n_gen": 0, "reps": 1, "dev": "none"},
        graph=(prefill,),
        env={"LD_LIBRARY_PATH": "/x/lib"},
        argv=("kz-profile", "-m", "m"),
    )


def test_stored_runs_read_back_and_compare(kz, project):
    store = profiling.ProfileStore(project.root / "results")
    a, b = (
        record("20261203-100000-aaaa", gdn_us=400.0),
        record(
            "20261203-110000-bbbb",
            gdn_us=100.0,
            backend="HTP0",
            host_time="2026-12-03T11:00:00+00:00",
        ),
    )
    store.add(a)
    store.add(b)
    assert store.records() == [a, b]
    assert store.select("latest") == b and store.select("20261203-10") == a
    result = kz("profile", "--compare", "20261203-10", "20261203-11", "--json")
    assert result.code == 0, result.err
    rows = {row["op"]: row for row in json.loads(result.out)["rows"]}
    gdn = rows["GATED_DELTA_NET"]
    assert (gdn["a_usec"], gdn["b_usec"], gdn["delta_usec"], gdn["change_pct"]) == (
        400.0,
        100.0,
        -300.0,
        -75.0,
    )
    assert (gdn["a_backends"], gdn["b_backends"]) == (["CPU"], ["HTP0"])
    assert rows["MUL_MAT"]["delta_usec"] == 0.0
    shown = kz("profile", "--compare", "20261203-10", "20261203-11")
    assert shown.code == 0 and "-75.0%" in shown.out
    single = kz("profile", "--show", "latest", "--by", "layer", "--json")
    assert (
        single.code == 0 and json.loads(single.out)["summary"]["graph"][0]["ops"][0]["layer"] == 0
    )
    no_npu = kz("profile", "--show", "latest", "--npu")
    assert no_npu.code == 13 and "has no ggml-hexagon profiler times" in flat(no_npu.err)


def test_compare_refuses_different_models_and_unknown_runs(kz, project):
    store = profiling.ProfileStore(project.root / "results")
    store.add(record("20261203-100000-aaaa", gdn_us=400.0))
    store.add(record("20261203-110000-bbbb", gdn_us=100.0, sha="b" * 64))
    different = kz("profile", "--compare", "20261203-10", "20261203-11")
    assert different.code == 13 and "different models" in flat(different.err)
    missing = kz("profile", "--compare", "20261203-10", "nope")
    assert missing.code == 13 and "'nope' matches no profile run" in flat(missing.err)


def test_a_bad_stored_line_is_named_and_a_cut_last_line_skipped(project, caplog):
    store = profiling.ProfileStore(project.root / "results")
    store.add(record("20261203-100000-aaaa", gdn_us=400.0))
    with open(store.path, "a") as file:
        file.write('{"run_id": "cut')
    assert len(store.records()) == 1 and "skipped the unterminated last line" in caplog.text
    store.add(record("20261203-110000-bbbb", gdn_us=1.0))  # not glued onto the cut line
    with pytest.raises(BadRecord, match=r"profiles.jsonl:2"):
        store.records()


def test_a_run_that_is_not_utf8_text_is_refused_before_it_is_stored(project):
    store = profiling.ProfileStore(project.root / "results")
    bad = dataclasses.replace(
        record("20261203-100000-aaaa", gdn_us=400.0), env={"X": "\ud800"}
    )  # a lone surrogate
    with pytest.raises(BadRecord, match="profile run '20261203-100000-aaaa' cannot be stored"):
        store.add(bad)
    assert not store.path.exists()


def test_plot_writes_a_png(project, tmp_path):
    out = profiling.plot(record("20261203-100000-aaaa", gdn_us=400.0), tmp_path / "p.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("files", "dev", "env", "npu", "profile_env"),
    [
        ({profiling.HEXAGON_LIB: {}}, None, (), True, "1"),
        (
            {profiling.HEXAGON_LIB: {}},
            "HTP0",
            (("GGML_HEXAGON_PROFILE", "2"),),
            True,
            "2",
        ),  # --env wins
        ({profiling.HEXAGON_LIB: {}}, "none", (), False, None),
        ({"lib/libggml-cpu.so": {}}, None, (), False, None),
    ],
)
def test_the_npu_profiler_runs_on_hexagon_builds_unless_dev_none(files, dev, env, npu, profile_env):
    release = Release(build_id="b", dir="/r", manifest={"files": files}, manifest_sha256=None)
    spec = ProfileSpec(model="m.gguf", dev=dev, env=env)
    got_npu, got_env = profiling.run_env(release, spec)
    assert (got_npu, got_env.get("GGML_HEXAGON_PROFILE")) == (npu, profile_env)
    assert (
        "-v" in profiling.tool_args(spec, spec.model, verbose=got_npu)
    ) == npu  # debug logging carries the profile-op lines


def test_options_are_checked_before_any_device_is_reached(kz):
    assert kz("profile").code == 2
    assert (
        kz("profile", "-m", "m.gguf", "-p", "0", "--device", "ssh://nobody@127.0.0.1:1/x").code == 2
    )
    assert kz("profile", "-m", "m.gguf", "--dev", "HTP0,HTP1").code == 2
    assert kz("profile", "--from-log", "x", "--show", "latest").code == 2
    assert kz("profile", "--show", "latest", "--by", "tensor").code == 2


# --- building kz-profile with the artifact ---
def test_the_build_plan_builds_kz_profile_against_the_llama_build(kz, tiny):
    shutil.copytree(REPO_ROOT / "kernels" / "profile", tiny.project.root / "kernels" / "profile")
    recipe = tiny.project.root / "recipes" / "tiny.yaml"
    recipe.write_text(
        recipe.read_text().replace("build:\n", "build:\n  tools: [llama-bench, kz-profile]\n")
    )
    result = kz("build", "tiny", "--dry-run", "--json")
    assert result.code == 0, result.err
    plan = json.loads(result.out)
    steps = {step["name"]: step["argv"] for step in plan["steps"]}
    assert list(steps) == ["configure", "build", "kz-profile-configure", "kz-profile-build"]
    assert "kz-profile" not in steps["build"] and "llama-bench" in steps["build"]
    configure = steps["kz-profile-configure"]
    assert configure[configure.index("-S") + 1] == str(tiny.project.root / "kernels" / "profile")
    assert (
        f"-DKZ_LLAMA_BUILD={plan['build_dir']}" in configure
        and f"-DKZ_LLAMA_SOURCE={plan['source']}" in configure
    )
    shared = [
        arg
        for arg in steps["configure"]
        if arg.startswith(("-DCMAKE_CXX_COMPILER", "-DCMAKE_INSTALL_RPATH"))
    ]
    assert shared and all(
        arg in configure for arg in shared
    )  # the same compiler and rpath as llama.cpp
    assert "kz-profile" in plan["tools"]
    (tiny.project.root / "kernels" / "profile" / "kz-profile.cpp").write_text("// changed\n")
    again = json.loads(kz("build", "tiny", "--dry-run", "--json").out)
    assert again["build_id"] != plan["build_id"]  # its sources are among the build id's inputs


def test_a_missing_kz_tool_project_is_a_config_error(kz, tiny):
    recipe = tiny.project.root / "recipes" / "tiny.yaml"
    recipe.write_text(
        recipe.read_text().replace("build:\n", "build:\n  tools: [llama-bench, kz-profile]\n")
    )
    result = kz("build", "tiny", "--dry-run")
    assert result.code == 2 and "CMakeLists.txt is missing" in flat(result.err)


def test_each_kernels_folder_gets_its_own_tool_build_dir(tmp_path):
    """Two projects sharing a work dir share the llama.cpp build dir; cmake refuses to configure a
    build dir from a second source folder, so kz-profile's build dir follows its source folder."""
    from kzbuild.build import kztools

    def tool_dir(kernels):
        configure = kztools.steps(
            kernels,
            ["kz-profile"],
            cmake="cmake",
            ninja="ninja",
            cmake_defs={},
            source=tmp_path / "src",
            build_dir=tmp_path / "build",
            env=(),
        )[0]
        return configure.argv[configure.argv.index("-B") + 1]

    assert tool_dir(tmp_path / "a" / "kernels") == tool_dir(tmp_path / "a" / "kernels")
    assert tool_dir(tmp_path / "a" / "kernels") != tool_dir(tmp_path / "b" / "kernels")
