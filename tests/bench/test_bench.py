"""kzbuild bench: llama-bench argv, JSON parsing, provenance, device probe, sweeps, env-name
checks."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kzbuild.device.local import LocalTransport
from kzbuild.errors import ConfigError, ResultsError
from kzbuild.measure import bench
from kzbuild.measure.resultsdb import ResultsStore
from kzbuild.model.bench import BenchPoint, BenchSpec, DeviceModel, SweepAxis
from kzbuild.model.device import Device
from kzbuild.model.run import Release
from kzbuild.model.sync import Lock
from tests.bench.benchkit import CAPTURED_JSON, CAPTURED_LOG, REPLAY_LLAMA_BENCH, exported, flat
from tests.conftest import GIT_ENV, git

MODEL_BYTES = b"GGUF tiny stand-in model bytes"


# --- parsing real llama-bench output ---
def test_real_llama_bench_json_becomes_one_record_per_test():
    tests = bench.parse_llama_bench_json(CAPTURED_JSON.read_bytes())
    release = Release(
        build_id="b1",
        dir="/d/releases/b1",
        manifest={"recipe": "demo-host", "lock_sha256": "f" * 64},
        manifest_sha256="e" * 64,
    )
    device = Device(name="pad3", transport="adb", serial="pad3", root="/d")
    state = bench.DeviceState(
        fingerprint={"android.fingerprint": "x/y:15"}, conditions={"thermal_c": {"cpu-0": 41.0}}
    )
    spec = BenchSpec(model="models/tiny.gguf")
    point = BenchPoint(index=1, total=2, values=(("t", "1"),))
    records = [
        bench.make_record(
            test,
            run_id="r",
            host_time="2026-12-01T00:00:00+00:00",
            seq=n,
            release=release,
            device=device,
            state=state,
            spec=spec,
            model_hash="a" * 64,
            argv=("llama-bench", "-t", "1"),
            env={"K": "V"},
            cwd="/d",
            point=point,
            seed=9,
        )
        for n, test in enumerate(tests)
    ]
    assert [(r.test, r.seq) for r in records] == [("pp32", 0), ("tg8", 1)]
    prefill = records[0]
    assert prefill.samples_ts == tests[0].samples_ts and len(prefill.samples_ts) == 3
    assert prefill.summary.median == sorted(tests[0].samples_ts)[1]
    assert prefill.build.build_commit == "0c1e570"
    assert prefill.build.recipe == "demo-host" and prefill.build.lock_sha256 == "f" * 64
    assert prefill.build.manifest_sha256 == "e" * 64 and prefill.build.build_id == "b1"
    assert (
        prefill.config["n_threads"] == 1
        and "avg_ts" not in prefill.config
        and "test_time" not in prefill.config
    )
    assert prefill.model.sha256 == "a" * 64 and prefill.model.type == tests[0].model_type
    assert (
        prefill.sweep.point == {"t": "1"} and prefill.sweep.seed == 9 and prefill.sweep.index == 1
    )
    assert prefill.conditions["thermal_c"] == {"cpu-0": 41.0}
    assert prefill.raw == json.loads(CAPTURED_JSON.read_text())[0]


def test_output_that_is_not_llama_bench_json_is_refused():
    with pytest.raises(ResultsError, match="not valid JSON"):
        bench.parse_llama_bench_json(b"| model | size |\n")
    with pytest.raises(
        ResultsError, match="expected a non-empty JSON list of tests, got {'avg_ts': 1}"
    ):
        bench.parse_llama_bench_json(b'{"avg_ts": 1}')


# --- the device probe ---
def test_probe_reads_thermal_zones_and_power_supplies_from_sysfs(tmp_path):
    sysfs = tmp_path / "sys"
    for zone, kind, temp in (
        ("thermal_zone0", "cpu-0-0", "41250"),
        ("thermal_zone1", "cpu-0-0", "39000"),
        ("thermal_zone2", "battery", "30"),
    ):
        (sysfs / "class/thermal" / zone).mkdir(parents=True)
        (sysfs / "class/thermal" / zone / "type").write_text(kind + "\n")
        (sysfs / "class/thermal" / zone / "temp").write_text(
            temp + ("\n" if kind != "battery" else "")
        )  # one without newline
    (sysfs / "class/thermal/thermal_zone3").mkdir()  # no readable temp: skipped
    (sysfs / "class/thermal/thermal_zone4").mkdir()
    (sysfs / "class/thermal/thermal_zone4/temp").write_text("55000\n")  # no type: named by its zone
    battery = sysfs / "class/power_supply/battery"
    battery.mkdir(parents=True)
    (battery / "status").write_text("Charging\n")
    (battery / "capacity").write_text("87\n")
    state = bench.probe(LocalTransport(str(tmp_path)), sysfs=str(sysfs))
    assert state.conditions["thermal_c"] == {
        "cpu-0-0": 41.2,
        "cpu-0-0#2": 39.0,
        "battery": 30.0,
        "thermal_zone4": 55.0,
    }
    assert state.conditions["power"] == {"battery.status": "Charging", "battery.capacity": "87"}
    uname = subprocess.run(
        ["uname", "-a"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert state.fingerprint == {"uname": uname}


def test_probe_of_an_android_device_keeps_fingerprint_soc_and_battery():
    text = (
        "android.fingerprint\tOnePlus/pad3/OPD2413:15/AP3A.240617.008/1:user/release-keys\n"
        "android.soc_model\tSM8750\n"
        "battery\tCurrent Battery Service state:\n"
        "battery\t  AC powered: false\n"
        "battery\t  USB powered: true\n"
        "battery\t  level: 91\n"
        "battery\t  temperature: 312\n"
        "uname\tLinux localhost 6.6.30-android15 #1 SMP PREEMPT aarch64 Toybox\n"
        "thermal.cpu-1-0-0\t47800\n"
    )
    state = bench.parse_probe(text)
    assert state.fingerprint == {
        "android.fingerprint": "OnePlus/pad3/OPD2413:15/AP3A.240617.008/1:user/release-keys",
        "android.soc_model": "SM8750",
    }
    assert state.conditions["battery"] == {
        "AC powered": "false",
        "USB powered": "true",
        "level": "91",
        "temperature": "312",
    }
    assert state.conditions["thermal_c"] == {"cpu-1-0-0": 47.8}


# --- the request and the sweep ---
def test_only_the_given_options_reach_llama_bench():
    spec = BenchSpec(
        model="models/m.gguf", options=(("t", "8"), ("p", "512")), extra_args=("-fa", "1")
    )
    point = BenchPoint(0, 1, (("ngl", "99"), ("env:GGML_HEXAGON_GDN_SELECT", "2")))
    assert bench.llama_bench_args(spec, point, spec.model) == [
        "-o",
        "json",
        "-v",
        "-m",
        "models/m.gguf",
        "-p",
        "512",
        "-ngl",
        "99",
        "-t",
        "8",
        "-fa",
        "1",
    ]
    assert point.env(BenchSpec(model="m", env=(("A", "1"),))) == {
        "A": "1",
        "GGML_HEXAGON_GDN_SELECT": "2",
    }


def test_sweep_is_the_cartesian_product_in_a_seeded_random_order():
    spec = BenchSpec(
        model="m",
        sweep=(
            bench.parse_sweep("ngl=0,16,32,99"),
            bench.parse_sweep("t=4,6,8"),
            bench.parse_sweep("env:GGML_HEXAGON_GDN_SELECT=0,1,2"),
        ),
        seed=1234,
    )
    seed, points = bench.plan(spec)
    assert seed == 1234
    combos = [p.values for p in points]
    assert len(combos) == 36 and len(set(combos)) == 36
    assert Counter(dict(c)["ngl"] for c in combos) == {"0": 9, "16": 9, "32": 9, "99": 9}
    assert [p.index for p in points] == list(range(36)) and {p.total for p in points} == {36}
    assert [p.values for p in bench.plan(spec)[1]] == combos  # same seed, same order
    other = [p.values for p in bench.plan(BenchSpec(model="m", sweep=spec.sweep, seed=4321))[1]]
    assert other != combos and sorted(other) == sorted(combos)
    product_order = [p.values for p in sorted(points, key=lambda p: p.values)]
    assert combos != product_order  # randomized, not nested-loop order


def test_without_a_sweep_there_is_one_run_and_a_fresh_seed_is_recorded():
    seed, points = bench.plan(BenchSpec(model="m"))
    assert isinstance(seed, int) and [p.values for p in points] == [()]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ngl", "is not AXIS=V1,V2"),
        ("threads=4,8", "unknown axis 'threads'"),
        ("t=4,,8", "non-empty and distinct"),
        ("t=4,4", "non-empty and distinct"),
        ("env:1X=0,1", "invalid environment variable name"),
    ],
)
def test_bad_sweeps_are_refused(text, message):
    with pytest.raises(ConfigError, match=message):
        bench.parse_sweep(text)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            BenchSpec(model="m", options=(("t", "8"),), sweep=(SweepAxis("t", ("4", "6")),)),
            "t is both swept and fixed",
        ),
        (
            BenchSpec(
                model="m",
                env=(("GGML_HEXAGON_NHVX", "4"),),
                sweep=(SweepAxis("env:GGML_HEXAGON_NHVX", ("2",)),),
            ),
            "both swept and fixed",
        ),
        (
            BenchSpec(model="m", sweep=(SweepAxis("t", ("4",)), SweepAxis("t", ("6",)))),
            "given twice",
        ),
        (BenchSpec(model="m", extra_args=("-o", "csv")), "'-o' is set by kzbuild bench itself"),
    ],
)
def test_contradictory_requests_are_refused(spec, message):
    with pytest.raises(ConfigError, match=message):
        bench.check_spec(spec)


# --- the whole command, with llama-bench replaying a real output ---
@pytest.fixture
def bench_root(device_root):
    device_root.add_tool("llama-bench", REPLAY_LLAMA_BENCH)
    device_root.add_file("models/tiny.gguf", MODEL_BYTES)
    return device_root


@pytest.fixture
def settings_for(project):
    return project.settings


def received(device_root) -> list[dict[str, object]]:
    return [
        json.loads(line) for line in (device_root.root / "received.jsonl").read_text().splitlines()
    ]


def test_bench_stores_records_with_full_provenance(kz, project, bench_root):
    result = kz(
        "bench",
        "--device",
        bench_root.spec,
        "-m",
        "models/tiny.gguf",
        "-t",
        "1",
        "-r",
        "3",
        "--env",
        "KZ_T_MODE=ADD|SUB",
        "--sweep",
        "ngl=0,99",
        "--seed",
        "5",
        "--json",
        "--",
        "-fa",
        "1",
    )
    assert result.code == 0, result.err
    out = json.loads(result.out)
    assert out["seed"] == 5 and len(out["records"]) == 4  # 2 points x (pp32, tg8)
    calls = received(bench_root)
    order = [
        p.values
        for p in bench.plan(BenchSpec(model="m", sweep=(SweepAxis("ngl", ("0", "99")),), seed=5))[1]
    ]
    assert [call["argv"] for call in calls] == [
        [
            "-o",
            "json",
            "-v",
            "-m",
            "models/tiny.gguf",
            "-ngl",
            dict(values)["ngl"],
            "-t",
            "1",
            "-r",
            "3",
            "-fa",
            "1",
        ]
        for values in order
    ]
    assert all(call["env"] == {"KZ_T_MODE": "ADD|SUB"} for call in calls)

    first = out["records"][0]
    lib = f"{bench_root.release}/lib"
    tools = [f"{bench_root.release}/bin/kz-peakrss", f"{bench_root.release}/bin/llama-bench"]
    assert first["argv"] == [*tools, *calls[0]["argv"]]
    assert first["env"] == {
        "LD_LIBRARY_PATH": lib,
        "ADSP_LIBRARY_PATH": lib,
        "KZ_T_MODE": "ADD|SUB",
    }
    assert first["cwd"] == str(bench_root.root)
    assert first["build"]["build_id"] == bench_root.build_id
    assert (
        first["build"]["manifest_sha256"]
        == hashlib.sha256((bench_root.release / "manifest.json").read_bytes()).hexdigest()
    )
    assert first["build"]["recipe"] == "demo-host" and first["build"]["lock_sha256"] == "0" * 64
    assert first["model"]["sha256"] == hashlib.sha256(MODEL_BYTES).hexdigest()
    assert first["device"]["name"] == bench_root.spec and first["device"]["fingerprint"]["uname"]
    assert "thermal_c" in first["conditions"]
    assert first["host_time"].endswith("+00:00")
    assert first["sweep"] == {
        "point": {"ngl": dict(order[0])["ngl"]},
        "seed": 5,
        "index": 0,
        "total": 2,
    }

    logs = Path(out["logs"])
    log_text = (logs / "000.stderr.log").read_text()
    replayed = CAPTURED_LOG.read_text()
    assert log_text.startswith("replay: loading model\n" + replayed)
    assert log_text.count("\n") == replayed.count("\n") + 2
    last = log_text.splitlines()[-1]
    assert re.fullmatch(r"kz-peakrss: format 1 peak_rss_kib \d+ status 0", last)
    # the record's provenance: every part, and its id the hash of them
    provenance = first["provenance"]
    assert provenance["build_id"] == bench_root.build_id and provenance["lock_sha256"] == "0" * 64
    assert provenance["model_sha256"] == first["model"]["sha256"]
    assert provenance["device"] == first["device"]["fingerprint"]
    assert len(provenance["id"]) == 16 and len({r["provenance"]["id"] for r in out["records"]}) == 1
    assert json.loads((logs / "000.json").read_text()) == json.loads(CAPTURED_JSON.read_text())
    with ResultsStore(project.root / "results") as store:
        assert len(store.records(out["run_id"])) == 4
    assert len(exported(project.root / "results").splitlines()) == 4


def test_bench_prints_a_table_of_medians(kz, bench_root):
    result = kz("bench", "--device", bench_root.spec, "-m", "models/tiny.gguf")
    assert result.code == 0, result.err
    assert (
        "pp32" in result.out
        and "tg8" in result.out
        and "stored 2 records as run" in flat(result.out)
    )


def test_cooldown_waits_between_runs_only(settings_for, bench_root):
    pauses: list[float] = []
    spec = BenchSpec(
        model="models/tiny.gguf", sweep=(SweepAxis("t", ("1", "2", "3")),), cooldown=1.5
    )
    device = Device(name="local", transport="local", root=str(bench_root.root), env=())
    with ResultsStore(settings_for.results) as store:
        run = bench.bench(
            settings_for, LocalTransport(device.root), device, spec, store, sleep=pauses.append
        )
    assert pauses == [1.5, 1.5]
    assert len(run.records) == 6


def test_a_failing_run_keeps_the_finished_ones_and_names_its_log(kz, project, bench_root):
    seed = next(
        s
        for s in range(100)
        if dict(
            bench.plan(
                BenchSpec(model="m", sweep=(SweepAxis("env:KZ_T_FAIL", ("0", "1")),), seed=s)
            )[1][0].values
        )["env:KZ_T_FAIL"]
        == "0"
    )
    result = kz(
        "bench",
        "--device",
        bench_root.spec,
        "-m",
        "models/tiny.gguf",
        "--sweep",
        "env:KZ_T_FAIL=0,1",
        "--seed",
        str(seed),
    )
    assert result.code == 12
    err = flat(result.err)
    assert (
        "command failed with exit code 3" in err
        and "replay: failing as asked" in err
        and "001.stderr.log" in err
    )
    with ResultsStore(project.root / "results") as store:
        assert [r.test for r in store.records()] == ["pp32", "tg8"]


def test_a_missing_model_is_reported(kz, bench_root):
    result = kz("bench", "--device", bench_root.spec, "-m", "models/absent.gguf")
    assert result.code == 2
    assert "cannot read model 'models/absent.gguf'" in flat(
        result.err
    ) and "kzbuild models push" in flat(result.err)


def test_reserved_llama_bench_arguments_are_refused(kz, bench_root):
    result = kz("bench", "--device", bench_root.spec, "-m", "models/tiny.gguf", "--", "-o", "csv")
    assert result.code == 2
    assert "'-o' is set by kzbuild bench itself" in flat(result.err)


# --- env names come from the pinned tree ---
HEXAGON_SOURCE = """
static void ggml_hexagon_init(void) {
    const char * str_verbose  = getenv("GGML_HEXAGON_VERBOSE");
    const char * str_gdn_select = getenv("GGML_HEXAGON_GDN_SELECT");
}
"""


def synced_tree(project) -> None:
    """The layout kzbuild sync leaves: a worktree whose head the recipe's lock names."""
    worktree = project.settings.worktree("demo-host")
    worktree.mkdir(parents=True)
    git(worktree, "init", "-q")
    (worktree / "ggml/src/ggml-hexagon").mkdir(parents=True)
    (worktree / "ggml/src/ggml-hexagon/ggml-hexagon.cpp").write_text(HEXAGON_SOURCE)
    git(worktree, "add", "-A")
    git(worktree, "commit", "-q", "-m", "tree", env=GIT_ENV)
    head = git(worktree, "rev-parse", "HEAD")
    # a later uncommitted edit must not count: the pinned tree is what the build used
    (worktree / "ggml/src/ggml-hexagon/ggml-hexagon.cpp").write_text(
        HEXAGON_SOURCE + 'getenv("GGML_HEXAGON_LOCAL_EDIT");\n'
    )
    lock = Lock(
        "demo-host",
        head,
        git(worktree, "rev-parse", "HEAD^{tree}"),
        "test",
        (),
        "0" * 64,
        None,
        head,
    )
    project.write("recipes/demo-host.lock.json", lock.to_json())


def test_env_names_the_tree_does_not_read_are_warned_about(kz, project, bench_root):
    synced_tree(project)
    result = kz(
        "bench",
        "--device",
        bench_root.spec,
        "-m",
        "models/tiny.gguf",
        "--env",
        "GGML_HEXAGON_OPSYNC=1",
        "--sweep",
        "env:GGML_HEXAGON_GDN_SELECT=1,2",
        "--env",
        "GGML_HEXAGON_LOCAL_EDIT=1",
    )
    assert result.code == 0, result.err
    err = flat(result.err)
    assert "GGML_HEXAGON_OPSYNC is not read by ggml-hexagon at demo-host's pinned tree" in err
    assert "GGML_HEXAGON_LOCAL_EDIT is not read" in err
    assert "GGML_HEXAGON_GDN_SELECT is not read" not in err
    assert "known: GGML_HEXAGON_GDN_SELECT, GGML_HEXAGON_VERBOSE" in err


def test_env_names_cannot_be_checked_without_a_synced_tree(kz, bench_root):
    result = kz("run", "--device", bench_root.spec, "--env", "GGML_HEXAGON_NHVX=2", "llama-bench")
    assert result.code == 0
    assert "cannot check GGML_HEXAGON_* names: recipe demo-host is not synced here" in flat(
        result.err
    )


class CountingTransport(LocalTransport):
    """The host as the device, counting its commands (each is a round trip on a real device)."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.calls: list[list[str]] = []

    def run(self, argv, **options):
        self.calls.append(list(argv))
        return super().run(argv, **options)


def test_a_pushed_model_is_known_by_its_content_addressed_name(bench_root):
    """models push stores models/<sha256>.gguf after verifying it; bench need not hash gigabytes
    again. Tools are given the path the user named, unless it leads to a stored first split."""
    named = "c" * 64
    bench_root.add_file(f"models/{named}.gguf", b"verified on push")
    (bench_root.root / "models" / "pushed.gguf").symlink_to(f"{named}.gguf")
    device = Device(name="local", transport="local", root=str(bench_root.root))
    transport = CountingTransport(device.root)
    assert bench.device_model(transport, device, "models/pushed.gguf") == DeviceModel(
        sha256=named, tool_path="models/pushed.gguf"
    )
    assert len(transport.calls) == 1  # one round trip: the root's and the model's paths at once
    elsewhere = bench_root.add_file(f"other/{named}.gguf", b"not in models/")
    assert bench.device_model(transport, device, str(elsewhere)) == DeviceModel(
        sha256=hashlib.sha256(b"not in models/").hexdigest(), tool_path=str(elsewhere)
    )
    # a first split's name outside models/ is no stored model: hashed, and given as named
    stray = bench_root.add_file(f"other/{named}-00001-of-00002.gguf", b"a stray split")
    (bench_root.root / "stray.gguf").symlink_to(stray)
    assert bench.device_model(transport, device, "stray.gguf") == DeviceModel(
        sha256=hashlib.sha256(b"a stray split").hexdigest(), tool_path="stray.gguf"
    )
    assert bench.device_model(transport, device, "models/tiny.gguf") == DeviceModel(
        sha256=hashlib.sha256(MODEL_BYTES).hexdigest(), tool_path="models/tiny.gguf"
    )
    with pytest.raises(ConfigError, match="cannot read model 'models/none.gguf'"):
        bench.device_model(transport, device, "models/none.gguf")


@pytest.mark.filterwarnings(
    "error::pytest.PytestUnhandledThreadExceptionWarning"
)  # the output pump must not die
@pytest.mark.parametrize(
    "log", ["\\x1c\\n", "\\xc2\\xa0", "\\xc2\\x85", "\\xff\\xfe"]
)  # bytes: FS, NBSP and NEL in UTF-8, not UTF-8
def test_a_log_chunk_of_only_unusual_whitespace_or_bad_bytes_does_not_break_the_progress_display(
    kz, bench_root, log
):
    """bytes.strip keeps what str.strip drops: such a chunk has no line to show."""
    bench_root.add_tool(
        "llama-bench",
        REPLAY_LLAMA_BENCH.replace(
            'sys.stderr.write("replay: loading model\\n")',
            f'sys.stderr.buffer.write("{log}".encode("latin-1")); sys.stderr.flush()',
        ),
    )
    result = kz("bench", "--device", bench_root.spec, "-m", "models/tiny.gguf")
    assert result.code == 0, result.err


@pytest.mark.filterwarnings(
    "error::pytest.PytestUnhandledThreadExceptionWarning"
)  # the output pump must not die
def test_log_lines_that_look_like_markup_do_not_break_the_progress_display(kz, bench_root):
    bench_root.add_tool(
        "llama-bench",
        REPLAY_LLAMA_BENCH.replace(
            '"replay: loading model\\n"', '"[/bold] [red] unbalanced [/x]\\n"'
        ),
    )
    result = kz("bench", "--device", bench_root.spec, "-m", "models/tiny.gguf")
    assert result.code == 0, result.err


SHA = "a" * 64
SPLIT = "b" * 64
STORE = "/d/models"
HOPS = st.sampled_from(
    [
        f"{STORE}/x.gguf",
        f"{STORE}/{SHA}.gguf",
        f"{STORE}/{SHA}-00001-of-00003.gguf",
        f"{STORE}/{SPLIT}.gguf",
        "/elsewhere/m.gguf",
        "/d/models/sub/y.gguf",
        "",
        "/",
    ]
) | st.text(max_size=40)


def test_a_split_model_resolves_to_its_first_split_s_link_through_symlinks():
    """models/x.gguf -> <sha>.gguf -> <sha>-00001-of-00003.gguf -> <split>.gguf: the model's
    sha256, and the name llama.cpp finds the other splits by."""
    hops = [f"{STORE}/x.gguf", f"{STORE}/{SHA}.gguf", f"{STORE}/{SHA}-00001-of-00003.gguf"]
    answer = "\n".join(["/d", *hops, f"{STORE}/{SPLIT}.gguf"]) + "\n"
    assert bench.stored_model(answer, "models/x.gguf") == DeviceModel(SHA, hops[-1])
    whole = "\n".join(["/d", f"{STORE}/x.gguf", f"{STORE}/{SHA}.gguf"])
    assert bench.stored_model(whole, "models/x.gguf") == DeviceModel(SHA, "models/x.gguf")
    outside = "\n".join(["/d", f"{STORE}/x.gguf", f"/elsewhere/{SHA}.gguf"])
    assert bench.stored_model(outside, "models/x.gguf") is None  # hashed on the device


@settings(max_examples=200, deadline=None)
@given(st.lists(HOPS, max_size=6), st.sampled_from(["/d", "", "/"]) | st.text(max_size=10))
def test_any_answer_of_the_resolve_script_is_read_without_error(hops, root):
    model = bench.stored_model("\n".join([root, *hops]), "models/x.gguf")
    if model is not None:
        assert re.fullmatch("[0-9a-f]{64}", model.sha256)
        assert model.tool_path == "models/x.gguf" or model.tool_path in hops
