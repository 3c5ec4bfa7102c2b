"""kzbuild roll keeps its caches and its report (issue 30): stage builds hit ccache whatever the
directory; a dirty tree still writes the report; an existing kz/roll/* branch; DROPPED.yaml's
Drop-When; the rolled recipe's description; the exit-5 hint; no worktree left by a killed roll."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from kzbuild.adapters.settings import Settings
from kzbuild.build import builder
from kzbuild.measure.roll import Stage
from kzbuild.source.recipes import load_recipe
from tests.conftest import have

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
