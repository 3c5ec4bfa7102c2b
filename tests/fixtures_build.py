"""Fixtures for the build tests: a tiny upstream shaped like llama.cpp, and toolchain layouts.

The tiny upstream is a real CMake project (a shared ``ggml`` and three tools) that builds in
about a second with cmake + ninja + ccache, so the fast tier exercises the whole build path
for real. Toolchain layouts hold only the files detection reads; they test detection and
never stand in for a build.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from kzbuild.adapters.settings import Settings
from kzbuild.build import builder
from kzbuild.build.artifacts import existing_artifact, publish, staged
from kzbuild.model.artifact import MANIFEST, Artifact
from kzbuild.model.build import BuildPlan, BuildResult
from kzbuild.source.recipes import load_recipe
from tests.conftest import REPO_ROOT, Project, UpstreamRepo, git, persistent_test_cache

TINY_CMAKE = """\
cmake_minimum_required(VERSION 3.14)
project(tinyllama C)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
set(CMAKE_LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
if (NOT DEFINED LLAMA_BUILD_COMMIT)
    set(LLAMA_BUILD_COMMIT unknown)
endif()
add_library(ggml ggml/src/ggml.c)
set_target_properties(ggml PROPERTIES VERSION 0.9.0 SOVERSION 0)
foreach(tool llama-bench llama-completion test-backend-ops)
    add_executable(${tool} tools/main.c)
    target_link_libraries(${tool} PRIVATE ggml)
    target_compile_definitions(${tool} PRIVATE LLAMA_BUILD_COMMIT="${LLAMA_BUILD_COMMIT}")
endforeach()
"""
TINY_MAIN = """\
#include <stdio.h>
int ggml_answer(void);
int main(void) {
    printf("build_commit=%s answer=%d\\n", LLAMA_BUILD_COMMIT, ggml_answer());
    return 0;
}
"""
NDK_REVISION = "27.3.13750724"


@dataclass
class Tiny:
    """A project whose recipe ``tiny`` builds the tiny upstream for the host."""

    project: Project
    upstream: UpstreamRepo
    commit: str

    @property
    def settings(self) -> Settings:
        return self.project.settings

    def environ(self, **extra: str) -> dict[str, str]:
        """This machine's PATH, and nothing that could point at a real NDK or SDK."""
        return {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(self.project.root), **extra}

    def add_patch(
        self, name: str, files: dict[str, str], subject: str, *, base: str | None = None
    ) -> Path:
        """A real ``git format-patch`` of an edit on top of ``base`` (default: the pin), appended to
        the series."""
        git(self.upstream.path, "checkout", "-q", "-b", f"patch-{name}", base or self.commit)
        self.upstream.commit(files, subject)
        text = (
            git(self.upstream.path, "format-patch", "-1", "--stdout", "--full-index", "HEAD") + "\n"
        )
        git(self.upstream.path, "checkout", "-q", "master")
        git(self.upstream.path, "branch", "-q", "-D", f"patch-{name}")
        path = self.project.write(f"patches/{name}", text)
        series = self.project.root / "patches" / "series"
        series.write_text(series.read_text() + f"{name}\n")
        return path


def install_toolchains(project: Project) -> None:
    shutil.copytree(REPO_ROOT / "toolchains", project.root / "toolchains")


@pytest.fixture
def tiny(project: Project, upstream: UpstreamRepo) -> Tiny:
    commit = upstream.commit(
        {"CMakeLists.txt": TINY_CMAKE, "tools/main.c": TINY_MAIN},
        "tiny llama.cpp-shaped build",
    )
    install_toolchains(project)
    project.recipe(
        "tiny",
        commit=commit,
        sources=[f"path: {upstream.path}"],
        extra="build:\n  targets: [host]\n",
    )
    return Tiny(project, upstream, commit)


# --- toolchain layouts -----------------------------------------------------------------


def ndk_layout(root: Path, revision: str = NDK_REVISION) -> Path:
    """An NDK folder with only what detection reads."""
    (root / "build" / "cmake").mkdir(parents=True)
    (root / "build" / "cmake" / "android.toolchain.cmake").write_text(
        "# layout for detection tests\n"
    )
    (root / "source.properties").write_text(
        f"Pkg.Desc = Android NDK\nPkg.Revision = {revision}\nPkg.BaseRevision = 27.0.0\n"
    )
    return root


def hexagon_layout(parent: Path, version: str = "6.5.0.0", tools: str = "19.0.07") -> Path:
    """``Hexagon_SDK/<version>/`` with the files detection reads and the tools folder."""
    root = parent / "Hexagon_SDK" / version
    for rel in (
        "build/cmake/hexagon_fun.cmake",
        "ipc/fastrpc/qaic/bin/qaic",
        "setup_sdk_env.source",
    ):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("# layout for detection tests\n")
    (root / "tools" / "HEXAGON_Tools" / tools).mkdir(parents=True)
    return root


def program(folder: Path, name: str, script: str) -> Path:
    """A stand-in executable for detection tests: only its ``--version`` output matters."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


# --- the real pinned tree (slow tier) --------------------------------------------------


def real_project(tmp_path: Path, *, fresh_cache: bool = False) -> Project:
    """The repo's recipes, patches, kernels and toolchains in a temp project (locks removed).

    By default the object cache, ccache, build dirs and artifacts live under the persistent test
    cache, so a second run on the same machine downloads nothing and rebuilds nothing. With
    ``fresh_cache`` the object cache and work dir are new (only the downloaded sdists are shared),
    for tests of what a first sync does. Sdists the demo downloaded (demo_settings) are copied in
    rather than downloaded again.
    """
    root = tmp_path / "project"
    for folder in ("recipes", "patches", "kernels", "toolchains"):
        shutil.copytree(REPO_ROOT / folder, root / folder)
    for lock in (root / "recipes").glob("*.lock.json"):
        lock.unlink()
    base = persistent_test_cache()
    (base / "sdists").mkdir(exist_ok=True)
    copy_missing_sdists(demo_settings().sdists, base / "sdists")
    cache = tmp_path / "cache" if fresh_cache else base / "kz-cache"
    cache.mkdir(exist_ok=True)
    if not (cache / "sdists").exists():
        (cache / "sdists").symlink_to(base / "sdists")  # downloaded once per machine
    return Project(
        root=root, cache=cache, work=tmp_path / "work" if fresh_cache else base / "kz-work"
    )


def demo_settings() -> Settings:
    """Where scripts/demo keeps its caches and artifacts: kzbuild's defaults for this repo, in this
    environment (KZ_CACHE_DIR, KZ_WORK_DIR, XDG_CACHE_HOME; scripts/test-all keeps XDG_CACHE_HOME
    where it was before it empties HOME)."""
    return Settings.resolve(os.environ, cwd=REPO_ROOT, project=REPO_ROOT)


def copy_missing_sdists(source: Path, into: Path) -> None:
    """Copy each sdist (and the commit remembered beside it) that ``into`` lacks from ``source``."""
    if not source.is_dir():
        return
    for sdist in source.iterdir():
        target = into / sdist.name
        if sdist.is_file() and not target.exists():
            partial = into / f".kz-copy-{os.getpid()}-{sdist.name}"
            shutil.copy2(sdist, partial)
            partial.replace(target)  # whole or not at all, as a download enters the cache


def reuse_artifact_of(other: Settings, plan: BuildPlan) -> bool:
    """Copy the artifact of ``plan``'s build id from ``other``'s artifacts (the demo's) into the
    plan's artifacts dir when only ``other`` has it: the same sources and toolchains give the same
    build id wherever they are, so the build then reuses it instead of compiling."""
    root = plan.artifact_dir.parent
    found = existing_artifact(other.artifacts.resolve(), plan.build_id)
    if found is None or found.path.parent == root or existing_artifact(root, plan.build_id):
        return False
    root.mkdir(parents=True, exist_ok=True)
    with staged(root, plan.build_id) as staging:
        shutil.copytree(found.path, staging, symlinks=True)
        publish(staging, (staging / MANIFEST).read_bytes(), root, plan.build_id)
    return True


def build_real(tmp_path: Path, target: str, recipe: str = "demo-host") -> BuildResult:
    """Build ``recipe`` (default: the pinned upstream from the PyPI sdist, with the stack) for
    ``target`` through kzbuild.

    With the persistent caches, a build whose inputs did not change reuses its artifact in
    seconds; so does a build scripts/demo made on this machine (reuse_artifact_of). Other slow
    tests can take llama.cpp binaries from here (``result.artifact``).
    """
    project = real_project(tmp_path)
    prepared = builder.prepare(
        project.settings,
        load_recipe(project.root, recipe),
        target,
        environ=os.environ,
        options=builder.BuildOptions(jobs=2),
    )
    reuse_artifact_of(demo_settings(), prepared.plan)
    return builder.build(prepared)


@pytest.fixture(scope="session")
def real_host_build(tmp_path_factory: pytest.TempPathFactory) -> BuildResult:
    """The real host build of demo-host, made (or reused) once per session for every slow test that
    runs llama.cpp.

    Registered as a plugin by the root conftest: a session fixture imported into several test
    modules would run once per module.
    """
    return build_real(tmp_path_factory.mktemp("real-host-build"), "host")


def run_from_artifact(
    artifact: Artifact,
    tool: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """Run a tool as a user would: from the artifact, with no LD_LIBRARY_PATH (the rpath finds
    lib/).

    Output is decoded with replacement: tiny models' random weights generate arbitrary bytes.
    """
    environ = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    argv = [artifact.local(f"bin/{tool}"), *args]
    return subprocess.run(
        argv,
        env={**environ, **(env or {})},
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
    )
