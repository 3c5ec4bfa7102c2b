"""Build plans (``--dry-run``), build ids and target options; no compiler runs here."""

from __future__ import annotations

import dataclasses
import json
import shlex

import pytest

from kzbuild.adapters.settings import Settings
from kzbuild.build import builder
from kzbuild.build.toolchains import Detector
from kzbuild.errors import ConfigError
from kzbuild.model.sync import AppliedPatch
from kzbuild.model.toolchain import Found
from kzbuild.source.recipes import load_recipe
from kzbuild.source.sync import sync
from tests.conftest import git
from tests.fixtures_build import NDK_REVISION, hexagon_layout, ndk_layout


def clear_toolchain_env(monkeypatch):
    for var in (
        "ANDROID_NDK_ROOT",
        "ANDROID_NDK_HOME",
        "ANDROID_HOME",
        "ANDROID_SDK_ROOT",
        "HEXAGON_SDK_ROOT",
        "HEXAGON_TOOLS_ROOT",
        "OPENCL_SDK_ROOT",
    ):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(
        "HOME", "/nonexistent-home"
    )  # no ~/Android/Sdk or ~/Qualcomm from the real user


def unwrapped(text: str) -> str:
    """Terminal output with rich's line folding undone (it folds long paths mid-word)."""
    return text.replace("\n", "")


def dry_run(kz, *args):
    result = kz("build", "tiny", "--dry-run", "--json", *args)
    assert result.code == 0, result.err
    return json.loads(result.out)


def cmake_options(plan):
    argv = plan["steps"][0]["argv"]
    return dict(arg[2:].split("=", 1) for arg in argv if arg.startswith("-D"))


def test_v79_plan_without_an_ndk(tiny, kz, monkeypatch):
    clear_toolchain_env(monkeypatch)
    plan = dry_run(kz, "--target", "v79", "-j", "2")
    options = cmake_options(plan)
    flags = (
        "-march=armv8.7a+fp16+dotprod+i8mm -fvectorize -ffp-model=fast -fno-finite-math-only -flto "
        "-D_GNU_SOURCE"
    )
    for key, value in {
        "ANDROID_ABI": "arm64-v8a",
        "ANDROID_PLATFORM": "android-34",
        "CMAKE_C_FLAGS": flags,
        "CMAKE_CXX_FLAGS": flags,
        "PREBUILT_LIB_DIR": "android_aarch64",
        "GGML_OPENMP": "OFF",
        "GGML_LLAMAFILE": "OFF",
        "GGML_OPENCL": "OFF",
        "GGML_HEXAGON": "ON",
        "LLAMA_OPENSSL": "OFF",
        "BUILD_SHARED_LIBS": "ON",
        "CMAKE_BUILD_TYPE": "Release",
        "CMAKE_TOOLCHAIN_FILE": "<ndk-r27d:root>/build/cmake/android.toolchain.cmake",
        "HEXAGON_SDK_ROOT": "<hexagon-sdk-6.5:root>",
        "HEXAGON_TOOLS_ROOT": "<hexagon-sdk-6.5:tools>",
        "LLAMA_BUILD_COMMIT": plan["build_commit"],
    }.items():
        assert options[key] == value, key
    assert plan["build_commit"].startswith(tiny.commit[:7] + "-kz")
    assert plan["build_id"].startswith("v79-")
    ninja = plan["steps"][1]["argv"]
    assert ninja[1:] == [
        "-C",
        plan["build_dir"],
        "-j",
        "2",
        "llama-bench",
        "llama-completion",
        "test-backend-ops",
    ]
    assert len(plan["missing"]) == 2
    assert plan["missing"][0].startswith("NDK r27d not found")
    assert plan["missing"][1].startswith("Hexagon SDK 6.5 not found")
    env = plan["steps"][0]["env"]
    assert env["CCACHE_DIR"] == str(tiny.project.cache / "ccache")


def test_v79_dry_run_text_prints_exact_commands_and_environment(tiny, kz, monkeypatch):
    clear_toolchain_env(monkeypatch)
    result = kz("build", "tiny", "--target", "v79", "--dry-run")
    assert result.code == 0, result.err
    out = result.out
    assert "missing: NDK r27d not found" in out
    configure = next(line for line in out.splitlines() if "-DANDROID_ABI=arm64-v8a" in line)
    words = shlex.split(configure)  # the printed line is a pasteable shell command
    assert words[0].startswith("CCACHE_DIR=")
    assert "-DGGML_HEXAGON=ON" in words
    assert any(w.startswith("-DCMAKE_C_FLAGS=-march=armv8.7a") for w in words)


def test_v79_plan_with_ndk_sdk_and_opencl_layouts(tiny, kz, monkeypatch, tmp_path):
    clear_toolchain_env(monkeypatch)
    ndk = ndk_layout(tmp_path / "android-ndk-r27d")
    sdk = hexagon_layout(tmp_path)
    opencl = tmp_path / "opencl"
    (opencl / "include" / "CL").mkdir(parents=True)
    (opencl / "include" / "CL" / "cl.h").write_text("")
    monkeypatch.setenv("ANDROID_NDK_ROOT", str(ndk))
    monkeypatch.setenv("HEXAGON_SDK_ROOT", str(sdk))
    monkeypatch.setenv("OPENCL_SDK_ROOT", str(opencl))
    plan = dry_run(kz, "--target", "v79")
    options = cmake_options(plan)
    assert plan["missing"] == []
    assert options["CMAKE_TOOLCHAIN_FILE"] == f"{ndk}/build/cmake/android.toolchain.cmake"
    assert options["HEXAGON_TOOLS_ROOT"] == f"{sdk}/tools/HEXAGON_Tools/19.0.07"
    assert options["GGML_OPENCL"] == "ON" and options["CMAKE_PREFIX_PATH"] == str(opencl)
    assert plan["toolchains"]["ndk-r27d"]["proof"] == f"{ndk}/source.properties"
    assert plan["toolchains"]["ndk-r27d"]["version"] == NDK_REVISION
    assert plan["steps"][0]["env"]["HEXAGON_SDK_ROOT"] == str(sdk)


def test_dry_run_writes_nothing_into_the_source_tree(tiny, kz, monkeypatch):
    clear_toolchain_env(monkeypatch)
    plan = dry_run(kz, "--target", "v79")
    source = tiny.settings.worktree("tiny")
    assert plan["source"] == str(source)
    assert git(source, "status", "--porcelain", "--untracked-files=all", "--ignored") == ""
    assert not (source / "CMakeUserPresets.json").exists()
    assert not (tiny.project.work / "build").exists()  # not even the build dir


def test_building_v79_without_toolchains_exits_with_the_toolchain_code(tiny, kz, monkeypatch):
    clear_toolchain_env(monkeypatch)
    result = kz("build", "tiny", "--target", "v79")
    assert result.code == 6
    assert "cannot build tiny for v79" in result.err
    assert "NDK r27d not found" in result.err
    assert "kzbuild doctor --target v79" in result.err
    assert not (tiny.project.work / "artifacts").exists()


def test_wrong_ndk_version_message_reaches_the_user(tiny, kz, monkeypatch, tmp_path):
    clear_toolchain_env(monkeypatch)
    ndk = ndk_layout(tmp_path / "ndk", revision="26.1.10909125")
    monkeypatch.setenv("ANDROID_NDK_ROOT", str(ndk))
    result = kz("build", "tiny", "--target", "v79")
    assert result.code == 6
    assert (
        f"found NDK 26.1.10909125 at {ndk}/source.properties; recipe tiny needs r27d "
        "(27.3.13750724)" in unwrapped(result.err)
    )


def test_linux_arm64_plan_cross_compiles_and_runs_under_qemu(tiny, kz):
    plan = dry_run(kz, "--target", "linux-arm64")
    options = cmake_options(plan)
    if plan["missing"]:
        pytest.skip(f"no aarch64 cross toolchain here: {plan['missing']}")
    assert options["CMAKE_SYSTEM_PROCESSOR"] == "aarch64"
    assert options["CMAKE_CXX_COMPILER"].endswith("aarch64-linux-gnu-g++")
    assert options["GGML_NATIVE"] == "OFF"
    assert plan["runner"][0].endswith("qemu-aarch64") and plan["runner"][1:] == [
        "-L",
        "/usr/aarch64-linux-gnu",
    ]


def test_snapdragon_docker_plan_runs_cmake_and_ninja_in_the_image(tiny, kz, monkeypatch):
    clear_toolchain_env(monkeypatch)
    digest = "sha256:" + "0f" * 32
    spec = tiny.project.root / "toolchains" / "snapdragon-docker.yaml"
    spec.write_text(spec.read_text().replace("  digest:  ", f"  digest: '{digest}'  "))
    plan = dry_run(kz, "--target", "v79", "--toolchain", "snapdragon-docker")
    assert set(plan["toolchains"]) == {
        "snapdragon-docker"
    }  # the image brings NDK, SDK, cmake, ninja, ccache
    configure, ninja = (step["argv"] for step in plan["steps"])
    assert configure[1:3] == ["run", "--rm"]
    image = f"ghcr.io/snapdragon-toolchain/arm64-android@{digest}"
    at = configure.index(image)
    assert configure[at + 1 : at + 3] == ["cmake", "-S"]
    assert (
        "-DCMAKE_TOOLCHAIN_FILE=/opt/android-ndk-r28b/build/cmake/android.toolchain.cmake"
        in configure
    )
    assert f"{plan['source']}:{plan['source']}" in configure
    assert ninja[ninja.index(image) + 1] == "ninja"
    assert "--env" in configure and f"CCACHE_DIR={tiny.project.cache / 'ccache'}" in configure
    if plan["missing"]:
        assert "not available here" in plan["missing"][0] or "not on PATH" in plan["missing"][0]


def test_a_toolchain_that_fills_no_role_of_the_target_is_refused(tiny, kz):
    result = kz("build", "tiny", "--target", "host", "--toolchain", "ndk-r27d", "--dry-run")
    assert result.code == 2
    assert "toolchain 'ndk-r27d' (android-ndk) replaces nothing target host uses" in result.err


def test_host_clang_replaces_host_gcc(tiny, kz):
    plan = dry_run(kz, "--target", "host", "--toolchain", "host-clang")
    assert "host-gcc" not in plan["toolchains"] and "host-clang" in plan["toolchains"]
    assert plan["build_dir"].endswith("/host+host-clang")


def test_unknown_target_and_toolchain(tiny, kz):
    result = kz("build", "tiny", "--target", "host", "--target", "v80", "--dry-run")
    assert result.code == 2 and "unknown target 'v80'" in result.err
    assert "hint: targets: host, linux-arm64, v79, v79-check" in result.err
    assert result.out == "" and "started" not in result.err  # refused before any work
    ci = kz("ci", "tiny", "--target", "v80")
    assert ci.code == 2 and "hint: targets: host, linux-arm64, v79, v79-check" in ci.err
    result = kz("build", "tiny", "--toolchain", "ndk-r99", "--dry-run")
    assert result.code == 2 and "no toolchain named 'ndk-r99'" in result.err


def test_server_tools_turn_the_server_build_on_without_downloads(tiny, kz):
    plain = cmake_options(dry_run(kz))
    assert plain["LLAMA_BUILD_SERVER"] == "OFF"
    plan = dry_run(kz, "--tool", "llama-cli")
    assert cmake_options(plan)["LLAMA_BUILD_SERVER"] == "ON"
    assert cmake_options(plan)["LLAMA_USE_PREBUILT_UI"] == "OFF"
    assert plan["tools"][-1] == "llama-cli"


def test_recipe_cmake_options_win_but_build_commit_stays(tiny, kz):
    recipe = tiny.project.root / "recipes" / "tiny.yaml"
    recipe.write_text(
        recipe.read_text() + "  cmake: {GGML_OPENMP: true, LLAMA_BUILD_COMMIT: fake}\n"
    )
    plan = dry_run(kz)
    options = cmake_options(plan)
    assert options["GGML_OPENMP"] == "ON"
    assert options["LLAMA_BUILD_COMMIT"] == plan["build_commit"]


# --- build ids -------------------------------------------------------------------------


def plan_for(tiny, settings: Settings, target: str = "host", found: list[Found] | None = None):
    recipe = load_recipe(settings.project, "tiny")
    synced = sync(settings, recipe)
    tgt = builder.target(target)
    detector = Detector.for_settings(settings, tiny.environ())
    if found is None:
        found, _ = builder.detect_for(tgt, (), detector, "test")
    return builder.plan_build(
        settings, recipe, synced, tgt, found, options=builder.BuildOptions(jobs=2)
    )


def test_build_id_ignores_paths_and_follows_every_input(tiny, tmp_path):
    base = plan_for(tiny, tiny.settings)
    elsewhere = Settings(
        project=tiny.project.root, cache=tmp_path / "other-cache", work=tmp_path / "other-work"
    )
    moved = plan_for(tiny, elsewhere)
    assert moved.build_id == base.build_id and moved.build_dir != base.build_dir

    found = [f for f in base_found(tiny)]
    cmake = next(f for f in found if f.name == "cmake")
    newer = Found(spec=cmake.spec, ok=True, version="3.31.0", values=cmake.values)
    bumped = plan_for(tiny, tiny.settings, found=[newer if f is cmake else f for f in found])
    assert bumped.build_id != base.build_id
    assert bumped.inputs["toolchains"] != base.inputs["toolchains"]

    assert plan_for(tiny, tiny.settings, target="linux-arm64").build_id != base.build_id

    recipe = tiny.project.root / "recipes" / "tiny.yaml"
    recipe.write_text(recipe.read_text() + "  cmake: {GGML_AVX: false}\n")
    assert plan_for(tiny, tiny.settings).build_id != base.build_id


def test_a_change_to_the_targets_own_cmake_definitions_changes_the_build_id(tiny, monkeypatch):
    base = plan_for(tiny, tiny.settings)
    native = dataclasses.replace(builder.TARGETS["host"], cmake=(("GGML_NATIVE", "ON"),))
    monkeypatch.setitem(builder.TARGETS, "host", native)
    changed = plan_for(tiny, tiny.settings)
    assert "-DGGML_NATIVE=ON" in changed.steps[0].argv
    assert changed.build_id != base.build_id


def base_found(tiny):
    detector = Detector.for_settings(tiny.settings, tiny.environ())
    found, _ = builder.detect_for(builder.target("host"), (), detector, "test")
    return found


def test_a_patch_changes_the_build_id_and_the_build_commit(tiny):
    before = plan_for(tiny, tiny.settings)
    tiny.add_patch(
        "answer.patch",
        {"ggml/src/ggml.c": "int ggml_answer(void) { return 43; }\n"},
        "ggml: a better answer",
    )
    after = plan_for(tiny, tiny.settings)
    assert after.build_id != before.build_id
    assert after.build_commit != before.build_commit
    assert (
        after.build_commit.split("-kz")[0] == before.build_commit.split("-kz")[0] == tiny.commit[:7]
    )
    assert after.inputs["patches"][0][0] == "answer.patch"


def test_unknown_target_in_library():
    with pytest.raises(ConfigError):
        builder.target("hexagon")


def test_a_patch_the_pin_already_holds_does_not_enter_the_build_id(tiny):
    """Equal sources, equal ids: a patch sync skipped as upstreamed changes no source (kzbuild ab's
    variants with and without it share their build); an applied one does."""
    recipe = load_recipe(tiny.settings.project, "tiny")
    lock = sync(tiny.settings, recipe).lock
    tgt, found = builder.target("host"), base_found(tiny)
    skipped = AppliedPatch(
        file="merged.patch", sha256="0" * 64, commit=None, upstreamed="reverse-apply: test"
    )
    applied = dataclasses.replace(skipped, commit="1" * 40, upstreamed=None)

    def inputs(*extra: AppliedPatch) -> dict[str, object]:
        return builder.build_inputs(
            recipe, dataclasses.replace(lock, patches=(*lock.patches, *extra)), tgt, (), found
        )

    assert inputs(skipped) == inputs()
    assert inputs(applied) != inputs()
