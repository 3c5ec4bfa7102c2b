"""Sync deletes nothing it did not make: ignored files, forced discards, killed syncs, a lost base
ref.

Fault tests against real git repos. After each, ``assert_nothing_lost`` checks that the user's files
and commits are still in the worktree or kept under a refs/kz/discarded/ ref.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kzbuild.cli import main
from tests.conftest import GIT_ENV, git
from tests.test_sync import fit_line_edit, make_patch

IGNORES = "build/\n*.gguf\n"


def worktree(project) -> Path:
    return project.work / "src" / "r"


@pytest.fixture
def ignoring(project, upstream, tmp_path):
    """Upstream ignores build/ and *.gguf (like llama.cpp); the recipe pins it with four patches,
    of which the series first lists one."""
    upstream.commit({".gitignore": IGNORES}, "ignore build outputs")
    edits = [
        {"common/fit.cpp": fit_line_edit(5, "// kz: fix 1")},
        {"ggml/src/ggml.c": "int ggml_answer(void) { return 43; }\n"},
        {"ggml/src/new-op.c": "int new_op(void) { return 1; }\n"},
        {"README.md": "llama.cpp (synthetic, patched)\n"},
    ]
    for number, files in enumerate(edits, 1):
        shutil.copy(
            make_patch(upstream, tmp_path, files, f"fix {number}"),
            project.root / "patches" / f"fix-{number}.patch",
        )
    project.series("fix-1.patch")
    project.recipe("r", commit=upstream.head(), sources=[f"path: {upstream.path}"])
    return project


def all_patches(project) -> None:
    """Change the inputs, so the next sync has work to do."""
    project.series(*(f"fix-{n}.patch" for n in range(1, 5)))


def discarded_refs(wt: Path) -> list[str]:
    return git(wt, "for-each-ref", "--format=%(refname)", "refs/kz/discarded/").split()


def show(wt: Path, spec: str) -> str | None:
    result = subprocess.run(["git", "-C", str(wt), "show", spec], capture_output=True, text=True)
    return result.stdout if result.returncode == 0 else None


def assert_nothing_lost(wt: Path, files: dict[str, str], commits: tuple[str, ...] = ()) -> None:
    """Each file has its content in the worktree or in a refs/kz/discarded/ snapshot; each commit
    (by subject) is on HEAD or under a refs/kz/discarded/ ref."""
    refs = discarded_refs(wt)
    for path, content in files.items():
        here = (wt / path).read_text() if (wt / path).is_file() else None
        assert here == content or any(show(wt, f"{ref}:{path}") == content for ref in refs), (
            f"lost {path}"
        )
    reachable = git(wt, "log", "--format=%s", "HEAD", *refs).splitlines()
    for subject in commits:
        assert subject in reachable, f"lost commit {subject!r}"


def write_files(wt: Path, files: dict[str, str]) -> None:
    for path, content in files.items():
        (wt / path).parent.mkdir(parents=True, exist_ok=True)
        (wt / path).write_text(content)


BUILD_OUTPUTS = {
    "build/CMakeCache.txt": "CMAKE_BUILD_TYPE=Release\n",
    "build/bin/llama-cli": "ELF\n",
    "models/tiny.gguf": "GGUF\n",
}


def test_ignored_build_outputs_survive_a_sync(ignoring, kz):
    assert kz("sync", "r").code == 0
    wt = worktree(ignoring)
    write_files(wt, BUILD_OUTPUTS)
    assert git(wt, "status", "--porcelain") == ""  # ignored: not work sync would refuse for
    all_patches(ignoring)
    result = kz("sync", "r")
    assert result.code == 0, result.err
    assert "discarded" not in result.out
    for path, content in BUILD_OUTPUTS.items():
        assert (wt / path).read_text() == content
    assert discarded_refs(wt) == []


def test_ignored_file_where_a_patch_writes_blocks_sync_until_forced(
    ignoring, upstream, tmp_path, kz
):
    assert kz("sync", "r").code == 0
    wt = worktree(ignoring)
    (wt / ".git/info/exclude").write_text("notes/\n")  # the user's own ignore rule
    mine = {"notes/todo.txt": "my notes\n"}
    write_files(wt, mine)
    patch = make_patch(upstream, tmp_path, {"notes/todo.txt": "upstream notes\n"}, "add notes")
    shutil.copy(patch, ignoring.root / "patches/notes.patch")
    ignoring.series("fix-1.patch", "notes.patch")

    refused = kz("sync", "r")
    assert refused.code == 4
    assert "git-ignored" in refused.err and "notes/todo.txt" in refused.err
    assert (wt / "notes/todo.txt").read_text() == "my notes\n"

    forced = kz("sync", "r", "--force")
    assert forced.code == 0, forced.err
    assert "ignored      notes/todo.txt" in forced.out and "refs/kz/discarded/" in forced.out
    assert (wt / "notes/todo.txt").read_text() == "upstream notes\n"
    assert_nothing_lost(wt, mine)


USER_FILES = {"common/fit.cpp": "my local edit\n", "scratch.txt": "an untracked note\n"}


def make_user_work(wt: Path) -> None:
    """A commit, an uncommitted edit, an untracked file and ignored build outputs."""
    write_files(wt, {"mine.c": "int mine;\n"})
    git(wt, "add", "mine.c")
    git(wt, "commit", "-q", "-m", "my local work")
    write_files(wt, {**USER_FILES, **BUILD_OUTPUTS})


def test_user_work_blocks_sync_and_stays(ignoring, kz):
    assert kz("sync", "r").code == 0
    wt = worktree(ignoring)
    make_user_work(wt)
    all_patches(ignoring)
    result = kz("sync", "r")
    assert result.code == 4
    for text in ("common/fit.cpp", "scratch.txt", "my local work"):
        assert text in result.err
    assert "build/" not in result.err  # ignored and out of the way: not work at risk
    assert_nothing_lost(wt, {**USER_FILES, **BUILD_OUTPUTS}, ("my local work",))
    assert discarded_refs(wt) == []


def test_force_lists_what_it_discards_and_keeps_it_recoverable(ignoring, kz):
    assert kz("sync", "r").code == 0
    wt = worktree(ignoring)
    make_user_work(wt)
    all_patches(ignoring)
    result = kz("sync", "r", "--force")
    assert result.code == 0, result.err
    out = " ".join(result.out.split())
    (ref,) = discarded_refs(wt)
    assert f"discarded (kept under {ref})" in out
    assert "uncommitted M common/fit.cpp" in out and "uncommitted ?? scratch.txt" in out
    assert "commit" in out and "my local work" in out
    assert f"restore --source={ref}" in out and f"branch rescued {ref}^" in out
    assert git(wt, "status", "--porcelain") == ""
    assert (wt / "common/fit.cpp").read_text() == fit_line_edit(5, "// kz: fix 1")
    for path, content in BUILD_OUTPUTS.items():  # ignored and out of the way: untouched
        assert (wt / path).read_text() == content
    assert_nothing_lost(wt, {**USER_FILES, **BUILD_OUTPUTS}, ("my local work",))
    # The printed way back works.
    git(wt, "branch", "rescued", f"{ref}^")
    assert git(wt, "log", "-1", "--format=%s", "rescued") == "my local work"

    data = json.loads(kz("sync", "r", "--json").out)  # a no-op now: nothing more discarded
    assert data["changed"] is False and data["discarded"] is None


def test_missing_base_ref_falls_back_to_the_locked_upstream(ignoring, kz):
    assert kz("sync", "r").code == 0
    wt = worktree(ignoring)
    make_user_work(wt)
    git(wt, "checkout", "-q", "--", "common/fit.cpp")
    (wt / "scratch.txt").unlink()  # only the commit is left to protect
    git(wt, "update-ref", "-d", "refs/kz/base")
    all_patches(ignoring)
    result = kz("sync", "r")
    assert result.code == 4
    assert "commits that are not in patches/" in result.err and "my local work" in result.err
    assert "fix 1" not in result.err  # sync's own commit, above the fallback base
    assert_nothing_lost(wt, {}, ("my local work",))


def test_without_any_base_every_commit_sync_did_not_make_counts(ignoring, upstream, kz):
    assert kz("sync", "r").code == 0
    wt = worktree(ignoring)
    write_files(wt, {"mine.c": "int mine;\n"})
    git(wt, "add", "mine.c")
    git(wt, "commit", "-q", "-m", "my local work")
    git(wt, "update-ref", "-d", "refs/kz/base")
    (ignoring.root / "recipes/r.lock.json").unlink()
    newer = upstream.commit(
        {"README.md": "newer\n"}, "newer upstream"
    )  # HEAD does not descend from it
    ignoring.recipe("r", commit=newer, sources=[f"path: {upstream.path}"])
    result = kz("sync", "r")
    assert result.code == 4
    assert "my local work" in result.err
    assert_nothing_lost(wt, {}, ("my local work",))


def test_a_git_am_of_the_user_stopped_halfway_blocks_sync(ignoring, upstream, tmp_path, kz):
    assert kz("sync", "r").code == 0
    wt = worktree(ignoring)
    theirs = make_patch(
        upstream, tmp_path, {"common/fit.cpp": fit_line_edit(5, "// someone else")}, "their fix"
    )
    result = subprocess.run(
        ["git", "-C", str(wt), "am", str(theirs)],
        capture_output=True,
        env={**os.environ, **GIT_ENV},
    )
    assert (
        result.returncode != 0 and (wt / ".git/rebase-apply").is_dir()
    )  # stopped: the patch conflicts
    all_patches(ignoring)
    refused = kz("sync", "r")
    assert refused.code == 4 and "a git am in progress" in refused.err
    assert json.loads(kz("status", "r", "--json").out)["worktree"]["state"] == "git am in progress"
    assert (wt / ".git/rebase-apply").is_dir()


# --- a sync killed mid-apply ---

HOOK = """#!/bin/sh
# test only: count the patches git am has reached; at the {k}th, say so and wait to be killed
n=$(( $(cat '{count}' 2>/dev/null || echo 0) + 1 ))
echo $n > '{count}'
if [ $n -eq {k} ]; then touch '{reached}'; sleep 60; fi
"""


def kill_sync_in_hook(project, tmp_path: Path, hook: str, k: int) -> None:
    """Run ``python -m kzbuild sync r`` and kill -9 its process group when git am runs ``hook`` for
    the k-th patch."""
    wt = worktree(project)
    reached = tmp_path / "reached"
    script = wt / ".git/hooks" / hook
    script.parent.mkdir(exist_ok=True)
    script.write_text(HOOK.format(k=k, count=tmp_path / "count", reached=reached))
    script.chmod(0o755)
    argv = [
        sys.executable,
        "-m",
        "kzbuild",
        "--project",
        str(project.root),
        "--cache-dir",
        str(project.cache),
        "--work-dir",
        str(project.work),
        "sync",
        "r",
    ]
    child = subprocess.Popen(
        argv,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **GIT_ENV},
    )
    try:
        deadline = time.monotonic() + 30
        while not reached.exists():
            assert child.poll() is None, "sync finished before the hook was reached"
            assert time.monotonic() < deadline, "the hook was never reached"
            time.sleep(0.02)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    script.unlink()


def uninterrupted_lock(project, tmp_path: Path) -> bytes:
    """The lock the same inputs give on a machine where nothing was killed."""
    other = tmp_path / "other-project"
    shutil.copytree(project.root, other)
    code = main(
        [
            "--project",
            str(other),
            "--cache-dir",
            str(tmp_path / "c2"),
            "--work-dir",
            str(tmp_path / "w2"),
            "sync",
            "r",
        ]
    )
    assert code == 0
    return (other / "recipes/r.lock.json").read_bytes()


@pytest.mark.parametrize(
    ("hook", "k", "leftover"),
    [
        (
            "pre-applypatch",
            3,
            "dirty",
        ),  # patch 3 applied to the tree, not committed: dirt sync made
        ("post-applypatch", 2, "commit"),  # patch 2 committed, before sync could record the commit
    ],
)
def test_a_killed_sync_is_picked_up_by_the_next(ignoring, tmp_path, kz, hook, k, leftover):
    assert kz("sync", "r").code == 0
    wt = worktree(ignoring)
    write_files(wt, BUILD_OUTPUTS)
    all_patches(ignoring)
    expected = uninterrupted_lock(ignoring, tmp_path)

    kill_sync_in_hook(ignoring, tmp_path, hook, k)
    assert (wt / ".git/rebase-apply").is_dir()
    (wt / ".git/index.lock").touch()  # what git leaves when killed while it writes the index
    status = json.loads(kz("status", "r", "--json").out)["worktree"]
    assert status["state"] == "interrupted sync" and status["unexported"] == []
    assert bool(status["dirty"]) == (leftover == "dirty")
    human = kz("status", "r").out
    assert "interrupted" in human and "unsaved" not in human
    assert (
        kz("patches", "export", "r").code == 4
    )  # the series is half applied: exporting it would drop patches

    result = kz("sync", "r")  # no --force
    assert result.code == 0, result.err
    assert "interrupted" in result.out
    assert (ignoring.root / "recipes/r.lock.json").read_bytes() == expected
    assert git(wt, "rev-parse", "HEAD") == json.loads(expected)["head"]
    assert not (wt / ".git/rebase-apply").exists()
    assert git(wt, "status", "--porcelain") == "" and discarded_refs(wt) == []
    assert json.loads(kz("status", "r", "--json").out)["worktree"]["state"] == "clean"
    assert_nothing_lost(wt, BUILD_OUTPUTS)


def test_user_commits_after_a_killed_sync_still_block(ignoring, tmp_path, kz):
    assert kz("sync", "r").code == 0
    wt = worktree(ignoring)
    all_patches(ignoring)
    kill_sync_in_hook(ignoring, tmp_path, "post-applypatch", 2)
    git(wt, "am", "--quit")
    write_files(wt, {"mine.c": "int mine;\n"})
    git(wt, "add", "mine.c")
    git(wt, "commit", "-q", "-m", "my local work")
    result = kz("sync", "r")
    assert result.code == 4 and "my local work" in result.err
    assert "fix 2" not in result.err  # the killed sync's commits are its own
    assert_nothing_lost(wt, {}, ("my local work",))
