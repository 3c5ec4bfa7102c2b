"""``kzbuild doctor`` and ``kzbuild ci`` through the CLI."""

from __future__ import annotations

import json

import pytest

from tests.conftest import have
from tests.fixtures_build import NDK_REVISION, hexagon_layout, ndk_layout
from tests.test_build_plan import clear_toolchain_env, unwrapped

needs_host_tools = pytest.mark.skipif(
    not (have("cmake") and have("ninja") and have("ccache") and have("gcc")),
    reason="needs cmake, ninja, ccache, gcc",
)


# --- doctor ----------------------------------------------------------------------------


def test_doctor_json_names_the_file_that_proved_each_version(tiny, kz, monkeypatch, tmp_path):
    clear_toolchain_env(monkeypatch)
    ndk = ndk_layout(tmp_path / "ndk")
    sdk = hexagon_layout(tmp_path)
    monkeypatch.setenv("ANDROID_NDK_ROOT", str(ndk))
    monkeypatch.setenv("HEXAGON_SDK_ROOT", str(sdk))
    result = kz("doctor", "--target", "v79", "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    (check,) = report["targets"]
    found = {t["name"]: t for t in check["toolchains"]}
    assert (
        found["ndk-r27d"]["proof"] == f"{ndk}/source.properties"
        and found["ndk-r27d"]["version"] == NDK_REVISION
    )
    assert found["hexagon-sdk-6.5"]["versions"] == {
        "Hexagon SDK": "6.5.0.0",
        "Hexagon tools": "19.0.07",
    }
    assert found["cmake"]["ok"] and found["cmake"]["proof"].endswith("cmake")
    assert {t["name"] for t in check["optional"]} == {"opencl-sdk"}


def test_doctor_mismatch_reads_like_what_was_found_and_what_is_needed(
    tiny, kz, monkeypatch, tmp_path
):
    clear_toolchain_env(monkeypatch)
    ndk = ndk_layout(tmp_path / "ndk", revision="26.1.10909125")
    monkeypatch.setenv("ANDROID_NDK_ROOT", str(ndk))
    tiny.project.recipe(
        "pad3",
        commit=tiny.commit,
        sources=[f"path: {tiny.upstream.path}"],
        extra="build:\n  targets: [v79]\n",
    )
    result = kz("doctor", "pad3")
    assert result.code == 6
    out = unwrapped(result.out)
    assert (
        f"found NDK 26.1.10909125 at {ndk}/source.properties; recipe pad3 needs r27d "
        "(27.3.13750724)" in out
    )
    assert "not ready" in out
    assert "not ready to build: v79" in unwrapped(result.err)


def test_doctor_without_a_target_reports_every_target_and_exits_0(tiny, kz, monkeypatch):
    clear_toolchain_env(monkeypatch)
    result = kz("doctor")
    assert result.code == 0
    for name in ("host", "linux-arm64", "v79"):
        assert name in result.out
    assert "NDK r27d not found" in unwrapped(result.out)
    assert kz("doctor", "--target", "v79").code == 6


def test_doctor_checks_what_the_recipes_device_needs(tiny, kz):
    tiny.project.write(
        "recipes/devices.yaml",
        "devices:\n  stand-in:\n    transport: local\n    root: /tmp/kz-stand-in\n    runner: "
        "[qemu-nothing-here, -L, /x]\n",
    )
    recipe = tiny.project.root / "recipes" / "tiny.yaml"
    recipe.write_text(recipe.read_text() + "device: stand-in\n")
    result = kz("doctor", "tiny", "--json")
    assert result.code == 6
    assert json.loads(result.out)["device"] == {
        "device": "stand-in",
        "transport": "local",
        "ok": False,
        "detail": "'qemu-nothing-here' is not on PATH; device stand-in needs it",
        "hint": None,
    }
    assert "device stand-in" in unwrapped(result.err)


# --- ci --------------------------------------------------------------------------------


@needs_host_tools
def test_ci_builds_what_it_can_and_skips_the_rest_with_why(tiny, kz, monkeypatch, tmp_path):
    clear_toolchain_env(monkeypatch)
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    recipe = tiny.project.root / "recipes" / "tiny.yaml"
    recipe.write_text(recipe.read_text().replace("targets: [host]", "targets: [host, v79]"))
    result = kz("ci", "tiny", "-j", "2")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    steps = {s["step"]: s for s in report["steps"]}
    assert [s["step"] for s in report["steps"]] == ["sync", "patches", "build:host", "build:v79"]
    assert steps["build:host"]["status"] == "ok" and steps["build:host"]["build_id"].startswith(
        "host-"
    )
    assert steps["build:v79"]["status"] == "skipped"
    assert steps["build:v79"]["detail"].startswith("toolchain not here: NDK r27d not found")
    markdown = summary.read_text()
    assert "### kzbuild ci: tiny passed" in markdown and "| build:v79 | ⏭️ skipped |" in markdown


def test_ci_fails_for_a_target_asked_for_whose_toolchain_is_missing(tiny, kz, monkeypatch):
    clear_toolchain_env(monkeypatch)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    result = kz("ci", "tiny", "--target", "v79")
    assert result.code == 6
    report = json.loads(result.out)
    assert report["ok"] is False and report["exit_code"] == 6
    assert (
        report["steps"][-1]["status"] == "failed"
        and "NDK r27d not found" in report["steps"][-1]["detail"]
    )


@needs_host_tools
def test_ci_reports_a_broken_build_with_the_build_exit_code(tiny, kz, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    tiny.add_patch(
        "broken.patch",
        {"ggml/src/ggml.c": "int ggml_answer(void) { return nope; }\n"},
        "ggml: break it",
    )
    result = kz("ci", "tiny", "-j", "2")
    assert result.code == 7
    report = json.loads(result.out)
    assert (report["steps"][1]["step"], report["steps"][1]["status"]) == ("patches", "ok")
    assert report["steps"][1]["detail"] == "1 clean"
    assert (
        report["steps"][2]["status"] == "failed" and "ninja failed" in report["steps"][2]["detail"]
    )


def test_ci_stops_when_sync_fails(tiny, kz, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    tiny.project.write("patches/bad.patch", "not a patch\n")
    (tiny.project.root / "patches" / "series").write_text("bad.patch\n")
    result = kz("ci", "tiny")
    assert result.code == 5
    report = json.loads(result.out)
    assert [(s["step"], s["status"]) for s in report["steps"]] == [
        ("sync", "failed"),
        ("build:host", "skipped"),
    ]


def test_ci_names_a_patch_that_only_applies_with_a_3way_merge(tiny, kz, monkeypatch):
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    fit = [f"// line {i}\n" for i in range(1, 41)]
    old_pin = tiny.commit
    assert (
        kz("sync", "tiny").code == 0
    )  # the shallow cache then holds the blobs the patch was written against
    moved = fit.copy()
    moved[17] = "// line 18, reworded upstream\n"
    tiny.commit = tiny.upstream.commit(
        {"common/fit.cpp": "".join(moved)}, "upstream rewords line 18"
    )
    recipe = tiny.project.root / "recipes" / "tiny.yaml"
    recipe.write_text(recipe.read_text().replace(old_pin, tiny.commit))
    patched = fit.copy()
    patched[19] = "// line 20, patched\n"
    tiny.add_patch(
        "drift.patch", {"common/fit.cpp": "".join(patched)}, "fit: patch line 20", base=old_pin
    )
    result = kz(
        "ci", "tiny", "--target", "v79"
    )  # v79 fails here (no NDK); the patches step is what this checks
    patches = json.loads(result.out)["steps"][1]
    assert (patches["step"], patches["status"]) == ("patches", "ok")
    assert patches["detail"].startswith("1 3way; drift.patch: 3way (3-way merged common/fit.cpp")
