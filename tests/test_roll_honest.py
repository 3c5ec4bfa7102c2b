"""kzbuild roll keeps its caches and its report (issue 30): stage builds hit ccache whatever the
directory; a dirty tree still writes the report; an existing kz/roll/* branch; DROPPED.yaml's
Drop-When; the rolled recipe's description; the exit-5 hint; no worktree left by a killed roll."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest
import yaml

from kzbuild.adapters.settings import Settings
from kzbuild.build import builder
from kzbuild.measure.roll import Stage
from kzbuild.source.recipes import load_recipe
from tests.conftest import REPO_ROOT, git, have
from tests.fixtures_build import TINY_CMAKE
from tests.fixtures_stack import add_patch, file_source, fit, make_patch
from tests.test_roll import FAST, git_project

needs_build_tools = pytest.mark.skipif(
    not (have("cmake") and have("ninja") and have("ccache") and have("gcc")),
    reason="needs cmake, ninja, ccache, gcc",
)


def host_build(settings: Settings, recipe, tiny):
    return builder.build(
        builder.prepare(
            settings, recipe, "host", environ=tiny.environ(), options=builder.BuildOptions(jobs=2)
        )
    )


@needs_build_tools
def test_a_stage_build_of_the_same_sources_hits_ccache(tiny, tmp_path):
    recipe = load_recipe(tiny.project.root, "tiny")
    first = host_build(tiny.settings, recipe, tiny)
    assert first.ccache is not None and first.ccache.misses >= 2
    stage = Stage(
        tiny.settings, recipe
    )  # <work>/roll/tiny/work: another work dir, another source path
    staged = stage.create()
    try:
        again = host_build(stage.settings, staged, tiny)
    finally:
        stage.remove()
    assert again.plan.source != first.plan.source and not again.reused
    assert (
        again.ccache is not None
        and again.ccache.misses == 0
        and again.ccache.hits == first.ccache.hits + first.ccache.misses
    )
    # a work dir elsewhere entirely, under a recipe of another name
    other = replace(tiny.settings, work=tmp_path / "elsewhere" / "deeper")
    tiny.project.write(
        "recipes/tiny-renamed.yaml", (tiny.project.root / "recipes" / "tiny.yaml").read_text()
    )
    third = host_build(other, load_recipe(tiny.project.root, "tiny-renamed"), tiny)
    assert (
        third.ccache is not None
        and third.ccache.misses == 0
        and third.ccache.hits == first.ccache.hits + first.ccache.misses
    )


@needs_build_tools
def test_a_build_dir_configured_from_the_worktree_path_is_configured_again(tiny):
    recipe = load_recipe(tiny.project.root, "tiny")
    first = host_build(tiny.settings, recipe, tiny)
    cache = first.plan.build_dir / "CMakeCache.txt"
    text = cache.read_text()
    link = str(first.plan.build_dir.parent / "source")
    assert f"CMAKE_HOME_DIRECTORY:INTERNAL={link}\n" in text
    cache.write_text(
        text.replace(link, str(first.plan.source))
    )  # as a build before the link left it
    (first.plan.build_dir / "kz-configure.json").unlink()
    shutil.rmtree(first.artifact.path)
    again = host_build(tiny.settings, recipe, tiny)
    assert (
        again.times["configure_s"] > 0
        and f"CMAKE_HOME_DIRECTORY:INTERNAL={link}\n" in cache.read_text()
    )


# --- --write: DROPPED.yaml's commit, the description ---


def test_the_drop_records_the_patch_s_own_drop_when_and_the_description_says_what_rolled(
    project, upstream, kz
):
    base = upstream.head()
    drop_when = "0123456789abcdef0123"  # the patch names the commit that upstreams it
    trailers = ("Upstream-Status: Pending", f"Drop-When: {drop_when}", "Kz-Test: tests/test_fit.py")
    add_patch(
        project,
        "taken.patch",
        make_patch(
            upstream,
            base,
            {"common/fit.cpp": fit(line20="fixed 20")},
            "common: fix 20",
            trailers=trailers,
        ),
    )
    project.recipe("r", commit=base, sources=[file_source(upstream)])
    recipe_file = project.root / "recipes" / "r.yaml"
    recipe_file.write_text(
        recipe_file.read_text().replace(
            "description: test recipe r", f"description: r at {base[:12]}, host  # ours"
        )
    )
    # upstream takes the fix with another change: no patch-id match, proven by reverse apply
    rolled = upstream.commit(
        {"common/fit.cpp": fit(line20="fixed 20", line30="more 30")},
        "common: fix 20 and more (#51)",
    )
    git_project(project)
    result = kz("roll", "r", *FAST, "--write", "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    branch = report["branch"]
    (candidate,) = report["candidates"]
    assert [p["proof"]["kind"] for p in candidate["patches"]] == ["reverse-apply"]
    dropped = yaml.safe_load(git(project.root, "show", f"{branch}:patches/DROPPED.yaml"))
    (record,) = dropped["dropped"] if isinstance(dropped, dict) else dropped
    assert record["patch"] == "taken.patch" and record["upstream"] == drop_when  # not the candidate
    described = git(project.root, "show", f"{branch}:recipes/r.yaml").splitlines()[0]
    assert (
        described
        == f"description: r at {rolled[:12]}, host (rolled to master {rolled[:12]})  # ours"
    )
    assert (
        load_recipe(project.root, "r").description == f"r at {base[:12]}, host"
    )  # the user's file is untouched


# --- a killed roll leaves no registered worktree ---

SLOW_STEP = """
add_custom_command(OUTPUT slow.stamp
    COMMAND ${{CMAKE_COMMAND}} -E touch {marker}
    COMMAND sleep 97
    COMMAND ${{CMAKE_COMMAND}} -E touch slow.stamp)
add_custom_target(slow DEPENDS slow.stamp)
add_dependencies(ggml slow)
"""


def worktrees(root) -> list[str]:
    return [
        line
        for line in git(root, "worktree", "list", "--porcelain").splitlines()
        if line.startswith("worktree ")
    ]


@needs_build_tools
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_roll_killed_mid_build_removes_its_stage(tiny, tmp_path, signum):
    marker = tmp_path / "building"
    recipe_file = tiny.project.root / "recipes" / "tiny.yaml"
    recipe_file.write_text(
        recipe_file.read_text().replace(f"path: {tiny.upstream.path}", file_source(tiny.upstream))
    )
    tiny.upstream.commit(
        {"CMakeLists.txt": TINY_CMAKE + SLOW_STEP.format(marker=marker)}, "build: a slow step"
    )
    git_project(tiny.project)
    before = worktrees(tiny.project.root)
    settings = tiny.settings
    argv = [
        sys.executable,
        "-c",
        "import sys; from kzbuild.cli import main; sys.exit(main(sys.argv[1:]))",
        "--project",
        str(settings.project),
        "--cache-dir",
        str(settings.cache),
        "--work-dir",
        str(settings.work),
        "roll",
        "tiny",
        "--no-tests",
        "--plan-target",
        "none",
    ]
    env = {**tiny.environ(), "PYTHONPATH": str(REPO_ROOT)}
    roll = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and roll.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), roll.communicate(timeout=5)
        stage = settings.work / "roll" / "tiny" / "project"
        assert f"worktree {stage}" in worktrees(
            tiny.project.root
        )  # mid-build: the stage is registered
        roll.send_signal(signum)
        out, err = roll.communicate(timeout=60)
    finally:
        if roll.poll() is None:
            roll.kill()
    assert roll.returncode == 130, err
    assert worktrees(tiny.project.root) == before and not stage.exists()
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert "sleep 97" not in ps  # the build stopped with the roll


def test_a_roll_starts_by_removing_what_a_killed_one_left(project, upstream, kz):
    project.recipe("r", commit=upstream.head(), sources=[file_source(upstream)])
    git_project(project)
    before = worktrees(project.root)
    settings = project.settings
    recipe = load_recipe(project.root, "r")
    for name in ("", "--pin"):  # as a SIGKILL leaves them: registered, never removed
        Stage(settings, recipe, name).create()
    assert len(worktrees(project.root)) == len(before) + 2
    result = kz("roll", "r", *FAST)  # nothing newer: no stage is made this time
    assert result.code == 0, result.err
    assert (
        worktrees(project.root) == before
        and not (settings.work / "roll" / "r" / "project").exists()
    )
