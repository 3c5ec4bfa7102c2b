"""kzbuild run: the release's tool, the device env plus --env, exact arguments, the tool's exit
code."""

from __future__ import annotations

import json
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kzbuild.device.base import remote_command
from kzbuild.device.run import invocation
from kzbuild.model.device import Device
from kzbuild.model.run import Release
from tests.bench.benchkit import SHOW_ARGS, TRICKY, flat, make_device_root

# Anything a process can receive: no NUL (execve cannot carry it), no lone surrogates.
ARG_TEXT = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40
)
VALUES = st.one_of(st.sampled_from(TRICKY), ARG_TEXT)
SLOW_EXAMPLES = settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@SLOW_EXAMPLES
@given(args=st.lists(VALUES, max_size=5), value=VALUES)
def test_any_argument_and_env_value_arrives_unchanged_through_kzbuild_run(
    kz, device_root, args, value
):
    device_root.add_tool("show-args", SHOW_ARGS)
    result = kz(
        "run",
        "--device",
        device_root.spec,
        "--env",
        f"KZ_T_VALUE={value}",
        "--",
        "show-args",
        *args,
    )
    assert result.code == 0, result.err
    seen = json.loads(result.out)
    assert seen["argv"] == args
    assert seen["env"]["KZ_T_VALUE"] == value


@SLOW_EXAMPLES
@given(args=st.lists(VALUES, max_size=5), value=VALUES)
def test_the_device_command_line_of_a_run_survives_a_real_shell(device_root, args, value):
    """adb and ssh run remote_command(...) under sh on the device: the same bytes must arrive."""
    device_root.add_tool("show-args", SHOW_ARGS)
    device = Device(
        name="t",
        transport="ssh",
        root=str(device_root.root),
        env=(("LD_LIBRARY_PATH", "{current}/lib"),),
    )
    release = Release(
        build_id=device_root.build_id,
        dir=str(device_root.release),
        manifest={},
        manifest_sha256=None,
    )
    call = invocation(device, release, "show-args", args, {"KZ_T_VALUE": value})
    line = remote_command(call.argv, cwd=call.cwd, env=call.env)
    seen = json.loads(subprocess.run(["sh", "-c", line], capture_output=True, check=True).stdout)
    assert seen["argv"] == args
    assert seen["env"] == {"KZ_T_VALUE": value, "LD_LIBRARY_PATH": f"{device_root.release}/lib"}
    assert seen["cwd"] == str(device_root.root)


def test_run_adds_nothing_and_uses_the_release_env(kz, device_root):
    device_root.add_tool("show-args", SHOW_ARGS)
    result = kz("run", "--device", device_root.spec, "show-args", "-m", "models/x.gguf")
    assert result.code == 0, result.err
    seen = json.loads(result.out)
    assert seen["argv"] == ["-m", "models/x.gguf"]  # no -t 6 -ub 1024
    lib = f"{device_root.release}/lib"
    assert seen["env"] == {
        "LD_LIBRARY_PATH": lib,
        "ADSP_LIBRARY_PATH": lib,
    }  # no GGML_HEXAGON_OPPOLL
    assert seen["cwd"] == str(device_root.root)


def test_run_returns_the_tools_exit_code_and_streams_both_outputs(kz, device_root):
    device_root.add_tool("fails", "#!/bin/sh\necho to-stdout\necho to-stderr >&2\nexit 42\n")
    result = kz("run", "--device", device_root.spec, "fails")
    assert result.code == 42
    assert result.out == "to-stdout\n"
    assert "to-stderr" in flat(result.err)


def test_run_uses_the_release_current_points_to(kz, device_root):
    device_root.add_tool("which", "#!/bin/sh\necho first\n")
    newer = device_root.root / "releases" / "b2"
    (newer / "bin").mkdir(parents=True)
    (newer / "bin" / "which").write_text("#!/bin/sh\necho second\n")
    (newer / "bin" / "which").chmod(0o755)
    (device_root.root / "current").unlink()
    (device_root.root / "current").symlink_to("releases/b2")
    assert kz("run", "--device", device_root.spec, "which").out == "second\n"


def test_run_applies_the_runner_prefix(kz, project, device_root):
    device_root.add_tool("show-args", SHOW_ARGS)
    project.write(
        "recipes/devices.yaml",
        f"devices:\n  wrapped:\n    transport: local\n    root: {device_root.root}\n    runner: "
        "[env, KZ_T_RUNNER=yes]\n",
    )
    result = kz("run", "--device", "wrapped", "show-args", "x")
    assert result.code == 0, result.err
    seen = json.loads(result.out)
    assert seen["argv"] == ["x"]
    assert seen["env"]["KZ_T_RUNNER"] == "yes"


def test_run_times_out(kz, device_root):
    device_root.add_tool("sleeper", "#!/bin/sh\nexec sleep 5\n")
    result = kz("run", "--device", device_root.spec, "--timeout", "0.3", "sleeper")
    assert result.code == 8
    assert "timed out after 0.3 s" in flat(result.err)


def test_run_without_a_deployed_release_says_so(kz, tmp_path):
    (tmp_path / "empty").mkdir()
    result = kz("run", "--device", f"local:{tmp_path / 'empty'}", "llama-bench")
    assert result.code == 8
    assert "no release is deployed" in flat(result.err)
    assert "kzbuild deploy" in flat(result.err)


def test_run_of_a_missing_tool_lists_the_release_tools(kz, device_root):
    device_root.add_tool("llama-bench", "#!/bin/sh\n")
    result = kz("run", "--device", device_root.spec, "llama-cli")
    assert result.code == 2
    assert "has no tool 'llama-cli'" in flat(result.err)
    assert "llama-bench" in flat(result.err)


def test_run_refuses_a_path_as_tool(kz, device_root):
    result = kz("run", "--device", device_root.spec, "../../bin/sh")
    assert result.code == 2
    assert "is not a tool name" in flat(result.err)


def test_bad_env_assignments_are_refused(kz, device_root):
    result = kz("run", "--device", device_root.spec, "--env", "NOVALUE", "x")
    assert result.code == 2
    assert "--env 'NOVALUE' is not NAME=VALUE" in flat(result.err)
    result = kz("run", "--device", device_root.spec, "--env", "1BAD=x", "x")
    assert result.code == 2
    assert "invalid environment variable name" in flat(result.err)


def test_a_release_without_a_readable_manifest_still_runs_and_says_what_is_missing(kz, tmp_path):
    device = make_device_root(tmp_path / "bare", build_id="no-manifest")
    device.add_tool("show-args", SHOW_ARGS)
    result = kz("run", "--device", device.spec, "show-args")
    assert result.code == 0
    assert "release" in flat(
        result.err
    ) and "has no manifest.json; provenance will lack build inputs" in flat(result.err)
    (device.release / "manifest.json").write_text("[1, 2]")
    result = kz("run", "--device", device.spec, "show-args")
    assert result.code == 0
    assert "manifest.json is not a JSON object" in flat(result.err)


def test_options_after_the_tool_belong_to_the_tool(kz, device_root):
    device_root.add_tool("show-args", SHOW_ARGS)
    result = kz(
        "run", "--device", device_root.spec, "show-args", "--help", "-e", "X=1", "--device", "d"
    )
    assert result.code == 0, result.err
    assert json.loads(result.out)["argv"] == ["--help", "-e", "X=1", "--device", "d"]


@pytest.mark.parametrize(
    ("device_env", "expected"),
    [
        ((), "R/lib"),  # a device env without it: the release's lib/ still
        ((("LD_LIBRARY_PATH", "/vendor/lib64"),), "R/lib:/vendor/lib64"),
        ((("LD_LIBRARY_PATH", "/vendor/lib64:{current}/lib"),), "/vendor/lib64:R/lib"),
    ],
)
def test_a_run_finds_the_release_s_libraries_whatever_the_device_env_says(device_env, expected):
    """A release's files are symlinks into the store, so $ORIGIN is the store's: LD_LIBRARY_PATH
    always holds the release's lib/, first unless the device's env places it."""
    device = Device(name="t", transport="ssh", root="/d", env=device_env)
    release = Release(build_id="b", dir="R", manifest={}, manifest_sha256=None)
    call = invocation(device, release, "tool", [], {})
    assert call.env["LD_LIBRARY_PATH"] == expected
