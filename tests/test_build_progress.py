"""Build progress in logs and pipes: timestamped lines with the stage and ninja's fraction, and the
expected duration."""

from __future__ import annotations

import re
import time

import pytest

from tests.conftest import have
from tests.fixtures_build import TINY_CMAKE

pytestmark = pytest.mark.skipif(
    not (have("cmake") and have("ninja") and have("ccache") and have("gcc")),
    reason="needs cmake, ninja, ccache, gcc",
)

# after ggml is built, a step takes 2 s without printing anything, as a long compile does (ninja
# prints [n/N] when an edge ends)
SLOW_STEP = """
add_custom_command(OUTPUT slow.stamp COMMAND sleep 2 COMMAND ${CMAKE_COMMAND} -E touch slow.stamp)
add_custom_target(slow DEPENDS slow.stamp)
add_dependencies(slow ggml)
add_dependencies(llama-bench slow)
"""
LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ tiny → host: (?P<stage>\w+)(?: (?P<fraction>\[\d+/\d+\]))? "
    r"\((?P<elapsed>\d+) s\)$",
    re.M,
)


def test_a_silent_build_step_still_prints_a_line_with_the_stage_every_interval(
    tiny, kz, monkeypatch
):
    monkeypatch.setenv("KZ_PROGRESS_INTERVAL", "0.25")
    tiny.add_patch("slow.patch", {"CMakeLists.txt": TINY_CMAKE + SLOW_STEP}, "build: a slow step")
    result = kz("build", "tiny", "-j", "2")
    assert result.code == 0, result.err
    lines = list(LINE.finditer(result.err))
    assert lines[0]["stage"] == "started"
    stages = [line["stage"] for line in lines]
    assert {"sync", "configure", "build"} <= set(stages)
    during_build = [line for line in lines if line["stage"] == "build"]
    # one line when the stage began, then one per interval while sleep ran (2 s / 0.25 s, with
    # slack for a busy machine)
    assert len(during_build) >= 4, result.err
    with_fraction = [line["fraction"] for line in during_build if line["fraction"]]
    assert len(with_fraction) >= 4 and len(set(with_fraction)) < len(with_fraction), (
        result.err
    )  # the same [n/N] repeated while the step ran


def test_a_build_states_what_to_expect_from_the_last_build_of_its_target(tiny, kz):
    first = kz("build", "tiny", "-j", "2")
    assert first.code == 0, first.err
    assert "no earlier host build is recorded, so no expected duration" in first.err
    tiny.add_patch(
        "answer.patch",
        {"tools/main.c": "int ggml_answer(void);\nint main(void) { return ggml_answer() * 0; }\n"},
        "tools: quieter",
    )
    second = kz("build", "tiny", "-j", "2")
    assert second.code == 0, second.err
    expected = re.search(
        r"expect about (\d+) s after the sync \(the last host build, (host-\S+), started (\S+), "
        r"took that\)",
        second.err,
    )
    assert expected, second.err
    assert f"built {expected[2]} " in first.out  # the last build is the first one
    reused = kz("build", "tiny", "-j", "2")
    assert reused.code == 0 and "up to date" in reused.out
    assert (
        "expect" not in reused.err and "no expected duration" not in reused.err
    )  # nothing will be built


def test_in_a_pipe_a_fetch_reports_gits_phase_and_percentage(capsys):
    from kzbuild.cli.ui import activity

    with activity("syncing tiny") as progress:
        progress("remote: Counting objects: 100% (12/12), done.")
        progress("Receiving objects:  57% (81/141), 1.2 MiB | 3 MiB/s")
        progress("Receiving objects:  58% (82/141), 1.2 MiB | 3 MiB/s")
    err = capsys.readouterr().err
    assert re.search(r"Z syncing tiny: started \(0 s\)\n", err)
    assert "syncing tiny: Counting objects 100% (12/12), done. (0 s)" in err
    assert "syncing tiny: Receiving objects 57% (81/141), 1.2 MiB | 3 MiB/s (0 s)" in err
    assert "58%" not in err  # the same phase again waits for the next interval


def test_in_a_pipe_a_long_progress_line_is_printed_whole(capsys, monkeypatch):
    from kzbuild.cli.ui import activity

    monkeypatch.setenv("KZ_PROGRESS_INTERVAL", "0.05")
    step = "building upstream: build [39/140] Building CXX object ggml/src/CMakeFiles/ggml-cpu.dir/"
    line = step + "ggml-cpu/arch/arm/repack-with-a-long-name.cpp.o"
    with activity("ab of demo-host on local") as progress:
        progress(line)
        time.sleep(0.3)  # a few intervals: the heartbeat prints the line
    err = capsys.readouterr().err
    assert re.search(rf"Z ab of demo-host on local: started {re.escape(line)} \(0 s\)\n", err), err
