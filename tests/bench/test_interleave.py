"""kzbuild.measure.interleave: variants benched in seeded interleaved blocks from their own
releases, cooling between blocks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kzbuild.device.local import LocalTransport
from kzbuild.device.registry import resolve_device
from kzbuild.errors import ConfigError, DeviceError
from kzbuild.measure import interleave
from kzbuild.measure.resultsdb import ResultsStore
from kzbuild.measure.stats import interleaved_order
from kzbuild.model.bench import BenchSpec, SweepAxis
from kzbuild.model.device import Device
from kzbuild.model.interleave import Arm, Cooling
from tests.bench.benchkit import REPLAY_LLAMA_BENCH, DeviceRoot, make_device_root


def two_releases(tmp_path: Path) -> DeviceRoot:
    """A device root with releases A (current) and B, each with the replaying llama-bench, and a
    model."""
    device = make_device_root(
        tmp_path / "device",
        build_id="build-a",
        manifest={"build_id": "build-a", "recipe": "demo-host"},
    )
    device.add_tool("llama-bench", REPLAY_LLAMA_BENCH)
    shutil.copytree(device.release, device.root / "releases" / "build-b")
    (device.root / "releases" / "build-b" / "manifest.json").write_text(
        json.dumps({"build_id": "build-b", "recipe": "demo-host"})
    )
    device.add_file("models/q.gguf", b"model bytes")
    return device


def run_two_arms(
    project, device_root: DeviceRoot, store: ResultsStore, names: tuple[str, str], **options
) -> interleave.InterleavedRun:
    """run_interleaved on the local device of ``two_releases``: arm ``names[0]`` from build-a,
    ``names[1]`` from build-b."""
    return interleave.run_interleaved(
        project.settings,
        LocalTransport(str(device_root.root)),
        Device(name="dev", transport="local", root=str(device_root.root)),
        [Arm(names[0], "build-a"), Arm(names[1], "build-b")],
        BenchSpec(model="models/q.gguf"),
        store,
        **options,
    )


def sysfs_with(root: Path, temps: dict[str, int]) -> Path:
    for index, (kind, milli) in enumerate(temps.items()):
        zone = root / "class" / "thermal" / f"thermal_zone{index}"
        zone.mkdir(parents=True, exist_ok=True)
        (zone / "type").write_text(kind + "\n")
        (zone / "temp").write_text(f"{milli}\n")
    return root


def test_every_block_runs_every_variant_once_in_the_seeded_order_from_its_own_release(
    project, tmp_path
):
    device_root = two_releases(tmp_path)
    with ResultsStore(project.root / "results") as store:
        run = run_two_arms(project, device_root, store, ("base", "cand"), blocks=4, seed=7)
        stored = store.records(run.run_id)
    assert run.order == tuple(tuple(b) for b in interleaved_order(["base", "cand"], 4, 7))
    ran = [r.variant.name for r in stored if r.variant and r.test == "pp32"]
    assert ran == [name for block in run.order for name in block]  # stored in run order, one run id
    for name, build in (("base", "build-a"), ("cand", "build-b")):
        records = run.records[name]
        assert len(records) == 8 and {r.build.build_id for r in records} == {build}
        assert {r.build.release_dir for r in records} == {f"{device_root.root}/releases/{build}"}
        bin_dir = f"{device_root.root}/releases/{build}/bin"
        wrapped = (f"{bin_dir}/kz-peakrss", f"{bin_dir}/llama-bench")
        assert {r.argv[:2] for r in records} == {wrapped}
        assert sorted(r.variant.block for r in records if r.test == "pp32") == [0, 1, 2, 3]
        assert {(r.variant.seed, r.variant.blocks, r.variant.start_c) for r in records} == {
            (7, 4, None)
        }
    assert [r.seq for r in stored] == list(range(16))
    assert (device_root.root / "current").readlink() == Path("releases/build-a")  # never switched


def test_a_run_told_to_stop_ends_after_the_block_in_progress_with_whole_blocks(project, tmp_path):
    device_root = two_releases(tmp_path)
    asked: list[int] = []

    def stopped() -> bool:  # asked before blocks 1, 2, ...: stop before the third
        asked.append(len(asked) + 1)
        return len(asked) == 2

    with ResultsStore(project.root / "results") as store:
        run = run_two_arms(
            project, device_root, store, ("base", "cand"), blocks=5, seed=7, stopped=stopped
        )
        stored = store.records(run.run_id)
    assert asked == [1, 2]  # never before the first block
    assert run.order == tuple(tuple(b) for b in interleaved_order(["base", "cand"], 5, 7))[:2]
    for name in ("base", "cand"):
        assert sorted(r.variant.block for r in run.records[name] if r.test == "pp32") == [0, 1]
    assert len(stored) == sum(len(records) for records in run.records.values())


def test_cooling_waits_until_the_zones_read_below_the_limit_and_records_them(project, tmp_path):
    device_root = two_releases(tmp_path)
    sysfs = sysfs_with(tmp_path / "sys", {"cpu-0-0": 52000, "gpuss-0": 44000, "battery": 30})
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # the device cools by 2 degrees per 10 s
        slept.append(seconds)
        now[0] += seconds
        zone = sysfs / "class/thermal/thermal_zone0/temp"
        zone.write_text(str(int(zone.read_text()) - 2000 * int(seconds // 10)))

    cooling = Cooling(limit_c=45.0, max_wait_s=600, poll_s=10, sysfs=str(sysfs))
    with ResultsStore(project.root / "results") as store:
        run = run_two_arms(
            project,
            device_root,
            store,
            ("a", "b"),
            blocks=2,
            seed=1,
            cooling=cooling,
            sleep=sleep,
            clock=lambda: now[0],
        )
    first, second = run.starts
    assert (
        first.cooled and first.hottest_c == 44.0 and first.waited_s == 40.0
    )  # 52 -> 44 in four polls
    assert first.temperatures == {"cpu-0-0": 44.0, "gpuss-0": 44.0, "battery": 30.0}
    assert second.cooled and second.waited_s == 0.0
    assert slept == [10, 10, 10, 10]
    assert {
        (r.variant.block, r.variant.start_c, r.variant.waited_s)
        for rs in run.records.values()
        for r in rs
    } == {(0, 44.0, 40.0), (1, 44.0, 0.0)}


def test_a_device_that_never_cools_starts_the_block_after_the_bounded_wait(tmp_path, caplog):
    sysfs = sysfs_with(tmp_path / "sys", {"cpu-0-0": 80000, "cpu-0-1": 47000})
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    device = Device(name="hot", transport="local", root=str(tmp_path))
    cooling = Cooling(limit_c=45.0, max_wait_s=25, poll_s=10, zones=("cpu-0-1",), sysfs=str(sysfs))
    start = interleave.wait_cool(
        LocalTransport(str(tmp_path)), device, cooling, 0, sleep=sleep, clock=lambda: now[0]
    )
    assert (
        not start.cooled and start.waited_s == 25 and start.temperatures == {"cpu-0-1": 47.0}
    )  # only the chosen zone counts
    assert "block 1 starts at 47.0 C (cpu-0-1), not below 45.0 C after 25 s" in caplog.text


def test_no_thermal_zones_is_a_clear_device_error(tmp_path):
    (tmp_path / "sys" / "class" / "thermal").mkdir(parents=True)
    device = Device(name="bare", transport="local", root=str(tmp_path))
    with pytest.raises(
        DeviceError,
        match=r"bare: no thermal zones to read .*/sys/class/thermal/thermal_zone\*/temp",
    ):
        interleave.wait_cool(
            LocalTransport(str(tmp_path)), device, Cooling(45.0, sysfs=str(tmp_path / "sys")), 0
        )
    sysfs_with(tmp_path / "sys", {"battery": 30000})
    with pytest.raises(ConfigError, match="no thermal zone matches --cool-zones cpu\\*") as caught:
        interleave.wait_cool(
            LocalTransport(str(tmp_path)),
            device,
            Cooling(45.0, zones=("cpu*",), sysfs=str(tmp_path / "sys")),
            0,
        )
    assert caught.value.hint == "its zones: battery"


@pytest.mark.parametrize(
    ("text", "value"), [("45C", 45.0), ("45", 45.0), ("42.5c", 42.5), (" 50 °C", 50.0)]
)
def test_temperatures_parse(text, value):
    assert interleave.parse_temperature(text) == value


@pytest.mark.parametrize("text", ["hot", "45F", "", "1e3", "400C", "\u0664\u0665C"])
def test_bad_temperatures_are_refused(text):
    with pytest.raises(ConfigError, match="--cool-to"):
        interleave.parse_temperature(text)


def test_arms_need_distinct_names_and_deployed_releases(project, tmp_path):
    device_root = two_releases(tmp_path)
    device = Device(name="dev", transport="local", root=str(device_root.root))
    transport = LocalTransport(str(device_root.root))
    with ResultsStore(project.root / "results") as store:
        with pytest.raises(ConfigError, match="distinct names"):
            interleave.run_interleaved(
                project.settings,
                transport,
                device,
                [Arm("a", "build-a"), Arm("a", "build-b")],
                BenchSpec(model="models/q.gguf"),
                store,
                blocks=1,
            )
        with pytest.raises(DeviceError, match="no release 'build-c' is deployed"):
            interleave.run_interleaved(
                project.settings,
                transport,
                device,
                [Arm("a", "build-a"), Arm("c", "build-c")],
                BenchSpec(model="models/q.gguf"),
                store,
                blocks=1,
            )
        with pytest.raises(DeviceError, match="no release '../build-a' is deployed"):
            interleave.run_interleaved(
                project.settings,
                transport,
                device,
                [Arm("a", "build-a"), Arm("c", "../build-a")],
                BenchSpec(model="models/q.gguf"),
                store,
                blocks=1,
            )


def test_interleaved_over_ssh_with_cooling_read_through_the_transport(
    project, sshd, ssh_home, tmp_path
):
    device_root = two_releases(tmp_path)
    sysfs = sysfs_with(tmp_path / "sys", {"cpu-0-0": 41000})
    device = resolve_device(project.settings, sshd.spec(device_root.root), None)
    from kzbuild.device.registry import connect

    transport = connect(device)
    try:
        with ResultsStore(project.root / "results") as store:
            run = interleave.run_interleaved(
                project.settings,
                transport,
                device,
                [Arm("a", "build-a"), Arm("b", "build-b")],
                BenchSpec(model="models/q.gguf"),
                store,
                blocks=2,
                seed=3,
                cooling=Cooling(45.0, sysfs=str(sysfs)),
            )
    finally:
        transport.close()
    assert [s.temperatures for s in run.starts] == [{"cpu-0-0": 41.0}] * 2
    assert {r.build.build_id for r in run.records["b"]} == {"build-b"}
    assert len(run.records["a"]) == len(run.records["b"]) == 4


def test_env_names_are_checked_once_for_the_whole_experiment(project, tmp_path, caplog):
    device_root = two_releases(tmp_path)
    device = Device(name="dev", transport="local", root=str(device_root.root))
    spec = BenchSpec(
        model="models/q.gguf", sweep=(SweepAxis("env:GGML_HEXAGON_GDN_SELECT", ("1", "2")),)
    )
    with ResultsStore(project.root / "results") as store:
        interleave.run_interleaved(
            project.settings,
            LocalTransport(str(device_root.root)),
            device,
            [Arm("a", "build-a"), Arm("b", "build-b")],
            spec,
            store,
            blocks=3,
            seed=2,
        )
    assert (
        caplog.text.count("cannot check GGML_HEXAGON_* names: recipe demo-host is not synced here")
        == 1
    )


def test_the_device_lock_is_held_for_the_whole_run_and_a_holder_is_refused(project, tmp_path):
    """A deploy meanwhile could prune an arm's release: the run holds the lock, and waits for no
    one."""
    from kzbuild.device.devicelock import device_lock
    from kzbuild.errors import Busy

    device_root = two_releases(tmp_path)
    device = Device(name="dev", transport="local", root=str(device_root.root))
    transport = LocalTransport(str(device_root.root))
    arms = [Arm("base", "build-a"), Arm("cand", "build-b")]
    lock_dir = device_root.root / ".lock"
    held_during: list[bool] = []
    with ResultsStore(project.root / "results") as store:
        interleave.run_interleaved(
            project.settings,
            transport,
            device,
            arms,
            BenchSpec(model="models/q.gguf"),
            store,
            blocks=2,
            seed=3,
            on_turn=lambda turn: held_during.append(lock_dir.exists()),
        )
        assert held_during == [True] * 4 and not lock_dir.exists()
        with (
            device_lock(transport, str(device_root.root), "deploy"),
            pytest.raises(Busy, match="deploy"),
        ):
            interleave.run_interleaved(
                project.settings,
                transport,
                device,
                arms,
                BenchSpec(model="models/q.gguf"),
                store,
                blocks=2,
                seed=3,
            )
