"""Toolchain detection against directory layouts that hold only the files detection reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kzbuild.adapters import yamlconf
from kzbuild.build.toolchains import (
    Detector,
    detect,
    load_configured_paths,
    load_toolchains,
    parse_toolchain,
)
from kzbuild.errors import ConfigError
from tests.conftest import REPO_ROOT, have
from tests.fixtures_build import NDK_REVISION, hexagon_layout, ndk_layout, program

SPECS = load_toolchains(REPO_ROOT / "toolchains")
PATH_ONLY = {"PATH": os.environ.get("PATH", os.defpath)}


def find(name: str, environ: dict[str, str], configured: Path | None = None):
    return detect(SPECS[name], environ, configured, needed_by="recipe pad3-v79")


def test_every_toolchain_file_loads():
    assert {
        "ndk-r27d",
        "hexagon-sdk-6.5",
        "host-gcc",
        "aarch64-linux-gnu",
        "snapdragon-docker",
        "cmake",
        "ninja",
        "ccache",
    } <= set(SPECS)
    assert SPECS["ndk-r27d"].wanted == f"r27d ({NDK_REVISION})"


# --- NDK -------------------------------------------------------------------------------


def test_ndk_found_through_android_ndk_root_names_source_properties(tmp_path):
    ndk = ndk_layout(tmp_path / "android-ndk-r27d")
    found = find("ndk-r27d", {**PATH_ONLY, "ANDROID_NDK_ROOT": str(ndk)})
    assert found.ok, found.problems
    assert found.version == NDK_REVISION
    assert found.proof == str(ndk / "source.properties")
    assert found.cmake_options() == [
        ("CMAKE_TOOLCHAIN_FILE", f"{ndk}/build/cmake/android.toolchain.cmake")
    ]
    assert found.environment() == [("ANDROID_NDK_ROOT", str(ndk))]


def test_ndk_found_through_android_ndk_home_and_sdk_folder(tmp_path):
    ndk = ndk_layout(tmp_path / "ndk-home")
    assert find("ndk-r27d", {**PATH_ONLY, "ANDROID_NDK_HOME": str(ndk)}).root == ndk
    sdk_ndk = ndk_layout(tmp_path / "sdk" / "ndk" / NDK_REVISION)
    found = find("ndk-r27d", {**PATH_ONLY, "ANDROID_HOME": str(tmp_path / "sdk")})
    assert found.ok and found.root == sdk_ndk


def test_ndk_of_the_wrong_version_says_what_was_found_where(tmp_path):
    ndk = ndk_layout(tmp_path / "android-ndk-r26b", revision="26.1.10909125")
    found = find("ndk-r27d", {**PATH_ONLY, "ANDROID_NDK_ROOT": str(ndk)})
    assert not found.ok
    assert found.problems[0] == (
        f"found NDK 26.1.10909125 at {ndk}/source.properties; recipe pad3-v79 needs r27d "
        "(27.3.13750724) (from $ANDROID_NDK_ROOT)"
    )


def test_configured_path_comes_first_and_a_wrong_env_ndk_is_passed_over(tmp_path):
    good = ndk_layout(tmp_path / "good")
    old = ndk_layout(tmp_path / "old", revision="25.2.9519653")
    found = find(
        "ndk-r27d", {**PATH_ONLY, "ANDROID_NDK_ROOT": str(old), "ANDROID_NDK_HOME": str(good)}
    )
    assert found.ok and found.root == good
    assert any("25.2.9519653" in note for note in found.notes)
    configured = find("ndk-r27d", {**PATH_ONLY, "ANDROID_NDK_ROOT": str(old)}, configured=good)
    assert configured.ok and configured.root == good


def test_ndk_missing_lists_every_place_it_looked():
    found = find("ndk-r27d", dict(PATH_ONLY))
    assert not found.ok
    problem = found.problems[0]
    assert problem.startswith(
        "NDK r27d not found: $ANDROID_NDK_ROOT is unset; $ANDROID_NDK_HOME is unset"
    )
    assert "/opt/android-ndk-r27d does not exist" in problem
    assert found.render("{root}") == "<ndk-r27d:root>"


def test_ndk_without_its_toolchain_file_or_version_file(tmp_path):
    ndk = ndk_layout(tmp_path / "ndk")
    (ndk / "build" / "cmake" / "android.toolchain.cmake").unlink()
    assert (
        find("ndk-r27d", {**PATH_ONLY, "ANDROID_NDK_ROOT": str(ndk)})
        .problems[0]
        .startswith(f"NDK at {ndk} lacks build/cmake/android.toolchain.cmake")
    )
    ndk2 = ndk_layout(tmp_path / "ndk2")
    (ndk2 / "source.properties").unlink()
    assert (
        find("ndk-r27d", {**PATH_ONLY, "ANDROID_NDK_ROOT": str(ndk2)})
        .problems[0]
        .startswith(f"cannot tell the NDK version at {ndk2}: source.properties is missing")
    )
    (ndk2 / "source.properties").write_text("Pkg.Desc = Android NDK\n")
    assert (
        "no version in"
        in find("ndk-r27d", {**PATH_ONLY, "ANDROID_NDK_ROOT": str(ndk2)}).problems[0]
    )


def test_env_pointing_at_nothing_is_reported(tmp_path):
    found = find("ndk-r27d", {**PATH_ONLY, "ANDROID_NDK_ROOT": str(tmp_path / "nope")})
    assert found.problems[0] == f"{tmp_path / 'nope'} is not a folder (from $ANDROID_NDK_ROOT)"


# --- Hexagon SDK -----------------------------------------------------------------------


def test_hexagon_sdk_derives_tools_root_when_unset(tmp_path):
    sdk = hexagon_layout(tmp_path)
    found = find("hexagon-sdk-6.5", {**PATH_ONLY, "HEXAGON_SDK_ROOT": str(sdk)})
    assert found.ok, found.problems
    tools = sdk / "tools" / "HEXAGON_Tools" / "19.0.07"
    assert found.version == "6.5.0.0" and found.proof == str(sdk)
    assert dict(found.versions) == {"Hexagon SDK": "6.5.0.0", "Hexagon tools": "19.0.07"}
    assert dict(found.cmake_options()) == {
        "HEXAGON_SDK_ROOT": str(sdk),
        "HEXAGON_TOOLS_ROOT": str(tools),
    }


def test_hexagon_tools_root_from_env_must_be_19_0_07(tmp_path):
    sdk = hexagon_layout(tmp_path)
    other = tmp_path / "tools" / "19.0.02"
    other.mkdir(parents=True)
    found = find(
        "hexagon-sdk-6.5",
        {**PATH_ONLY, "HEXAGON_SDK_ROOT": str(sdk), "HEXAGON_TOOLS_ROOT": str(other)},
    )
    assert not found.ok
    assert found.problems[0].startswith(
        f"found Hexagon tools 19.0.02 at {other}; recipe pad3-v79 needs 19.0.07 (from "
        "$HEXAGON_TOOLS_ROOT)"
    )


def test_hexagon_sdk_6_6_is_not_6_5(tmp_path):
    sdk = hexagon_layout(tmp_path, version="6.6.0.0")
    found = find("hexagon-sdk-6.5", {**PATH_ONLY, "HEXAGON_SDK_ROOT": str(sdk)})
    assert found.problems[0].startswith(
        f"found Hexagon SDK 6.6.0.0 at {sdk}; recipe pad3-v79 needs 6.5 (6.5.*)"
    )


def test_hexagon_sdk_without_qaic_or_with_an_unversioned_folder(tmp_path):
    sdk = hexagon_layout(tmp_path)
    (sdk / "ipc" / "fastrpc" / "qaic" / "bin" / "qaic").unlink()
    assert (
        "lacks ipc/fastrpc/qaic/bin/qaic"
        in find("hexagon-sdk-6.5", {**PATH_ONLY, "HEXAGON_SDK_ROOT": str(sdk)}).problems[0]
    )
    renamed = hexagon_layout(tmp_path / "b").rename(tmp_path / "hexsdk")
    problem = find("hexagon-sdk-6.5", {**PATH_ONLY, "HEXAGON_SDK_ROOT": str(renamed)}).problems[0]
    assert problem.startswith(
        f"cannot tell the Hexagon SDK version at {renamed}: its folder name 'hexsdk' is not a "
        "version"
    )


# --- programs --------------------------------------------------------------------------


def test_programs_on_path_prove_their_version_with_their_own_output(tmp_path):
    bin_dir = tmp_path / "bin"
    cmake = program(bin_dir, "cmake", 'echo "cmake version 3.18.4"\n')
    found = find("cmake", {"PATH": str(bin_dir)})
    assert found.problems == (f"found cmake 3.18.4 at {cmake}; recipe pad3-v79 needs >= 3.22.2",)
    program(bin_dir, "g++", 'echo "g++ (Debian 12.2.0-14+deb12u1) 12.2.0"\n')
    program(bin_dir, "gcc", "exit 0\n")
    gcc = find("host-gcc", {"PATH": str(bin_dir)})
    assert (
        gcc.ok
        and gcc.version == "12.2.0"
        and dict(gcc.banners) == {"g++": "g++ (Debian 12.2.0-14+deb12u1) 12.2.0"}
    )
    program(bin_dir, "ninja", "echo nonsense\n")
    assert (
        find("ninja", {"PATH": str(bin_dir)}).problems[0]
        == f"cannot tell the version of {bin_dir / 'ninja'}: 'ninja --version' printed none"
    )
    assert find("ccache", {"PATH": str(bin_dir)}).problems == ("'ccache' (ccache) is not on PATH",)


@pytest.mark.skipif(not have("cmake") or not have("g++"), reason="needs the host's cmake and g++")
def test_this_machines_build_tools_are_found():
    for name in ("host-gcc", "cmake", "ninja", "ccache"):
        found = find(name, dict(PATH_ONLY))
        assert found.ok, found.problems
        assert found.proof and Path(found.proof).is_file()
    gcc = find("host-gcc", dict(PATH_ONLY))
    banner = gcc.identity()["banners"][
        "g++"
    ]  # the whole line: a distro rebuild of the same version changes it
    assert str(gcc.version) in banner and banner != gcc.version


def test_docker_without_an_engine_says_not_available_here(tmp_path):
    bin_dir = tmp_path / "bin"
    program(
        bin_dir,
        "docker",
        'case "$1" in\n  --version) echo "Docker version 28.2.2, build e6534b4";;\n'
        '  *) echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock." >&2; exit '
        "1;;\nesac\n",
    )
    found = find("snapdragon-docker", {"PATH": str(bin_dir)})
    assert not found.ok
    assert found.problems[0].startswith("the docker engine is not available here:")
    assert "Cannot connect to the Docker daemon" in found.problems[0]
    assert (
        found.version == "v0.7" and found.proof == "ghcr.io/snapdragon-toolchain/arm64-android:v0.7"
    )


@pytest.mark.skipif(not have("docker"), reason="no docker client on this machine")
def test_docker_here_is_reported_honestly():
    found = find("snapdragon-docker", dict(PATH_ONLY))
    if not found.ok:
        assert "the docker engine is not available here" in found.problems[0]


# --- the YAML itself -------------------------------------------------------------------


def spec_from(tmp_path: Path, text: str):
    path = tmp_path / "tc.yaml"
    path.write_text(text)
    return parse_toolchain(yamlconf.load(path), name="tc")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "label: X\nprovides: [x]\nprogram: {cc: gcc}\n",
            "tc.yaml:3: program: unknown key in toolchain",
        ),
        (
            "label: X\nprovides: [x]\ndirectory: {env: [A]}\nversion: {file: f, regex: 'no "
            "group'}\n",
            "regex: the regex needs a group",
        ),
        (
            "label: X\nprovides: [x]\ndirectory: {env: [A]}\ncmake: {A: '{rot}'}\n",
            "A: unknown field {rot}",
        ),
        ("label: X\nprovides: []\n", "provides: name at least one role"),
        ("label: X\nprovides: [x]\nversion: {file: f}\n", "a top-level version needs a directory"),
        (
            "label: X\nprovides: [x]\nprograms: {d: docker}\nimage: {repository: r, tag: t, "
            "digest: 'sha256:xyz'}\n",
            "is not an image digest",
        ),
        (
            "label: X\nprovides: [x]\nprograms: {d: docker}\nprobes: [{what: w, program: e, args: "
            "[]}]\n",
            "'e' is not one of this toolchain's programs",
        ),
        (
            "label: X\nprovides: [x]\ndirectory: {env: [A]}\nversion: {expect: '1'}\n",
            "say where the version is read",
        ),
    ],
)
def test_bad_toolchain_files_name_file_line_and_key(tmp_path, text, message):
    with pytest.raises(ConfigError) as info:
        spec_from(tmp_path, text)
    assert message in str(info.value)
    assert str(tmp_path / "tc.yaml") in str(info.value)


def test_unknown_key_gets_a_suggestion(tmp_path):
    with pytest.raises(ConfigError) as info:
        spec_from(tmp_path, "label: X\nprovides: [x]\nprogams: {cc: gcc}\n")
    assert info.value.hint == "did you mean 'programs'?"


def test_digest_pins_the_image(tmp_path):
    digest = "sha256:" + "ab" * 32
    spec = spec_from(
        tmp_path,
        "label: X\nprovides: [x]\nprograms: {docker: docker}\nimage: {repository: ghcr.io/a/b, "
        f"tag: v1, digest: '{digest}'}}\n",
    )
    assert spec.image is not None and spec.image.ref == f"ghcr.io/a/b@{digest}"


def test_configured_paths_file(tmp_path):
    local = tmp_path / "toolchains.yaml"
    local.write_text(f"ndk-r27d: {tmp_path / 'ndk'}\n")
    assert load_configured_paths(local, SPECS) == {"ndk-r27d": tmp_path / "ndk"}
    local.write_text("ndk-r27: /x\n")
    with pytest.raises(ConfigError) as info:
        load_configured_paths(local, SPECS)
    assert (
        "ndk-r27: unknown key" in str(info.value) and info.value.hint == "did you mean 'ndk-r27d'?"
    )


def test_detector_names_unknown_toolchains():
    with pytest.raises(ConfigError) as info:
        Detector(SPECS, PATH_ONLY).spec("ndk-r99")
    assert "no toolchain named 'ndk-r99'" in str(info.value)
