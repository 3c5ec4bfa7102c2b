"""Real builds (cmake + ninja + ccache) of a tiny llama.cpp-shaped upstream: the whole build path in
seconds."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess

import pytest

from kzbuild.adapters.settings import Settings
from kzbuild.build import builder
from kzbuild.errors import BuildFailed, ConfigError, WorktreeError
from kzbuild.source.recipes import load_recipe
from tests.conftest import have
from tests.fixtures_build import reuse_artifact_of

pytestmark = pytest.mark.skipif(
    not (have("cmake") and have("ninja") and have("ccache") and have("gcc")),
    reason="needs cmake, ninja, ccache, gcc",
)


def run_build(tiny, **kwargs):
    events = []
    prepared = builder.prepare(
        tiny.settings,
        load_recipe(tiny.project.root, "tiny"),
        "host",
        environ=tiny.environ(),
        options=builder.BuildOptions(jobs=2, **kwargs),
        progress=events.append,
    )
    result = builder.build(prepared, progress=events.append)
    return result, events


def test_build_makes_a_complete_artifact_with_a_manifest(tiny):
    result, events = run_build(tiny)
    artifact = result.artifact
    assert not result.reused
    assert artifact.path == tiny.project.work / "artifacts" / artifact.build_id
    assert sorted(f.path for f in artifact.files) == [
        "bin/llama-bench",
        "bin/llama-completion",
        "bin/test-backend-ops",
        "lib/libggml.so",
    ]
    assert not (artifact.path / "lib" / "libggml.so").is_symlink()

    manifest = json.loads((artifact.path / "manifest.json").read_text())
    for key in ("build_id", "recipe", "target", "inputs", "toolchains", "cmake", "times", "files"):
        assert key in manifest, key
    assert manifest["recipe"] == "tiny" and manifest["target"] == "host"
    lock_file = tiny.project.root / "recipes" / "tiny.lock.json"
    assert (
        manifest["lock_sha256"] == hashlib.sha256(lock_file.read_bytes()).hexdigest()
    )  # what bench records as provenance
    assert manifest["inputs"]["upstream"]["commit"] == tiny.commit
    assert manifest["toolchains"]["host-gcc"]["proof"].endswith("g++")
    assert manifest["cmake"]["configure"][0].endswith("cmake") and manifest["cmake"]["build"][
        0
    ].endswith("ninja")
    assert manifest["times"]["build_s"] > 0 and "started" in manifest["times"]
    for rel, info in manifest["files"].items():
        data = (artifact.path / rel).read_bytes()
        assert info["sha256"] == hashlib.sha256(data).hexdigest() and info["size"] == len(data)
    assert manifest["files"]["bin/llama-bench"]["mode"] == "0755"
    assert artifact.file("bin/llama-bench").mode == 0o755

    assert result.ccache is not None and result.ccache.misses >= 2
    assert (artifact.path.parent / f"{artifact.build_id}.log").is_file()
    progress = [(e.done, e.total) for e in events if e.stage == "build" and e.total]
    assert progress[-1][0] == progress[-1][1] >= 4  # ninja's [n/N] lines were followed to the end


def test_tools_run_from_the_artifact_without_ld_library_path(tiny, tmp_path):
    artifact = run_build(tiny)[0].artifact
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    out = subprocess.run(
        [artifact.path / "bin" / "llama-bench"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == f"build_commit={artifact.build_commit} answer=42"
    assert artifact.build_commit.startswith(tiny.commit[:7] + "-kz")


def test_second_build_reuses_the_artifact_without_running_cmake(tiny, kz):
    first = run_build(tiny)[0]
    cache_file = first.plan.build_dir / "CMakeCache.txt"
    stamp = cache_file.stat().st_mtime_ns
    log_text = first.plan.log.read_text()
    result = kz("build", "tiny", "--json")
    assert result.code == 0, result.err
    data = json.loads(result.out)
    assert data["reused"] is True and data["build_id"] == first.artifact.build_id
    assert cache_file.stat().st_mtime_ns == stamp
    assert first.plan.log.read_text() == log_text
    text = kz("build", "tiny")
    assert "up to date" in text.out and "cmake not run" in text.out


def test_rebuild_with_warm_ccache_skips_configure_and_hits(tiny):
    first = run_build(tiny)[0]
    for path in sorted(first.artifact.path.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    first.artifact.path.rmdir()
    # a fresh build dir: every compile must come from ccache
    import shutil

    shutil.rmtree(first.plan.build_dir)
    again = run_build(tiny)[0]
    assert again.artifact.build_id == first.artifact.build_id
    assert again.ccache is not None and again.ccache.misses == 0 and again.ccache.hits >= 2
    assert (
        again.artifact.file("lib/libggml.so").sha256 == first.artifact.file("lib/libggml.so").sha256
    )


def test_a_changed_patch_gives_a_new_artifact(tiny, tmp_path):
    first = run_build(tiny)[0]
    tiny.add_patch(
        "answer.patch",
        {"ggml/src/ggml.c": "int ggml_answer(void) { return 43; }\n"},
        "ggml: a better answer",
    )
    second, _ = run_build(tiny)
    assert second.artifact.build_id != first.artifact.build_id
    assert first.artifact.path.is_dir()  # the old artifact stays for rollback and comparisons
    out = subprocess.run(
        [second.artifact.path / "bin" / "llama-bench"], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == f"build_commit={second.artifact.build_commit} answer=43"
    assert second.times["configure_s"] > 0  # LLAMA_BUILD_COMMIT changed, so cmake ran again


def test_compile_error_fails_with_the_error_lines_and_the_log(tiny, kz):
    tiny.add_patch(
        "broken.patch",
        {"ggml/src/ggml.c": "int ggml_answer(void) { return nope; }\n"},
        "ggml: break it",
    )
    result = kz("build", "tiny")
    assert result.code == 7
    err = result.err.replace("\n", "")
    assert "ninja failed (exit 1) building tiny for host" in err
    assert "ggml.c:1:32: error:" in err and "nope" in err and "undeclared" in err
    assert "Entering directory" not in err
    assert "full log:" in err and ".log" in err
    artifacts = tiny.project.work / "artifacts"
    assert [p.suffix for p in artifacts.iterdir()] == [".log"]  # no artifact, no staging dir left


def test_unknown_tool_fails_the_build_naming_it(tiny):
    with pytest.raises(BuildFailed) as info:
        run_build(tiny, extra_tools=("llama-nothing",))
    assert "unknown target 'llama-nothing'" in info.value.message


def test_load_manifest_errors(tmp_path):
    with pytest.raises(ConfigError) as info:
        builder.load_manifest(tmp_path)
    assert "cannot read the manifest" in str(info.value)
    (tmp_path / "manifest.json").write_text('{"build_id": "host-1"}')
    with pytest.raises(ConfigError) as info:
        builder.load_manifest(tmp_path / "manifest.json")
    assert "'files' must be a non-empty mapping" in str(info.value)


def test_ninja_progress_ignores_sub_builds():
    seen = []
    watcher = builder._NinjaProgress(seen.append, "build")
    for line in [
        "[1/356] a",
        "[144/356] b",
        "[1/16] htp skel",
        "[16/16] htp skel",
        "[145/356] c",
        "x.c:1: error: bad",
    ]:
        watcher(line)
    assert [(e.done, e.total) for e in seen] == [
        (1, 356),
        (144, 356),
        (144, 356),
        (144, 356),
        (145, 356),
        (145, 356),
    ]
    assert watcher.errors() == ["x.c:1: error: bad"]


def test_ccache_stats_log(tmp_path):
    log = tmp_path / "stats.log"
    assert builder.read_ccache_log(log) is None
    log.write_text(
        "# a.c\ncache_miss\ndirect_cache_miss\n# b.c\ndirect_cache_hit\n# "
        "c.c\npreprocessed_cache_hit\n"
    )
    stats = builder.read_ccache_log(log)
    assert stats is not None and (stats.hits, stats.misses) == (2, 1)
    assert stats.hit_rate == pytest.approx(2 / 3)


def test_build_refuses_a_worktree_that_moved_after_planning(tiny):
    prepared = builder.prepare(
        tiny.settings,
        load_recipe(tiny.project.root, "tiny"),
        "host",
        environ=tiny.environ(),
        options=builder.BuildOptions(jobs=2),
    )
    (prepared.worktree.path / "ggml" / "stray.c").write_text(
        "int stray;\n"
    )  # edited after the plan
    with pytest.raises(WorktreeError) as info:
        builder.build(prepared)
    assert "changed since the build of tiny was planned" in info.value.message
    assert "uncommitted changes" in info.value.message
    assert not prepared.plan.artifact_dir.exists()


def test_a_build_holds_the_worktree_against_sync(tiny):
    """While a build compiles (shared lock), a sync (exclusive) cannot move the tree."""
    from kzbuild.errors import Busy

    prepared = builder.prepare(
        tiny.settings,
        load_recipe(tiny.project.root, "tiny"),
        "host",
        environ=tiny.environ(),
        options=builder.BuildOptions(jobs=2),
    )
    with prepared.worktree.lock(shared=True):
        with prepared.worktree.lock(shared=True, wait=0.2):
            pass  # two builds of one tree may run together
        with pytest.raises(Busy) as info:
            with prepared.worktree.lock(wait=0.2):
                pass
    assert "is in use by another kzbuild process" in info.value.message


def test_the_same_sources_built_elsewhere_are_reused_not_compiled(tiny, tmp_path):
    """What the slow tier does with the demo's build (tests/fixtures_build.build_real): another
    project, cache and work dir with the same sources and toolchains make the same build id, and
    the artifact copied from there is reused."""
    first, _ = run_build(tiny)
    assert not first.reused
    elsewhere = tmp_path / "elsewhere"
    no_lock = shutil.ignore_patterns("*.lock.json")
    shutil.copytree(tiny.project.root, elsewhere / "project", ignore=no_lock)
    other = Settings(elsewhere / "project", cache=elsewhere / "cache", work=elsewhere / "work")
    recipe = load_recipe(other.project, "tiny")
    options = builder.BuildOptions(jobs=2)
    prepared = builder.prepare(other, recipe, "host", environ=tiny.environ(), options=options)
    assert prepared.plan.build_id == first.artifact.build_id  # no path enters the build id
    assert reuse_artifact_of(tiny.settings, prepared.plan)
    again = builder.build(prepared)
    assert again.reused
    assert again.artifact.path == other.work / "artifacts" / first.artifact.build_id
    assert not (other.work / "build").exists()  # nothing configured, nothing compiled
    bench = again.artifact.path / "bin" / "llama-bench"
    out = subprocess.run([bench], capture_output=True, text=True, check=True)
    assert out.stdout == f"build_commit={first.artifact.build_commit} answer=42\n"
    assert not reuse_artifact_of(tiny.settings, prepared.plan)  # there already: nothing copied
