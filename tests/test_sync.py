"""kzbuild sync and status against real git repos: synthetic upstreams, served over file:// and
git://."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from kzbuild.adapters.filelock import locked
from kzbuild.errors import Busy
from tests.conftest import UpstreamRepo, git
from tests.fixtures_git import free_port, serve


def make_patch(upstream: UpstreamRepo, tmp_path: Path, files: dict[str, str], subject: str) -> Path:
    """A git format-patch file of ``files`` on top of upstream HEAD (upstream is left unchanged)."""
    scratch = tmp_path / f"scratch-{abs(hash(subject))}"
    git(upstream.path, "worktree", "add", "-q", "--detach", str(scratch), "HEAD")
    for name, content in files.items():
        (scratch / name).parent.mkdir(parents=True, exist_ok=True)
        (scratch / name).write_text(content)
    git(scratch, "add", "-A")
    date = "1700001000 +0000"
    git(
        scratch,
        "commit",
        "-q",
        "-m",
        subject,
        env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date},
    )
    out = git(
        scratch, "format-patch", "-1", "--stdout", "--full-index", "--zero-commit", "--no-signature"
    )
    git(upstream.path, "worktree", "remove", "--force", str(scratch))
    path = tmp_path / f"{subject.replace(' ', '-')}.patch"
    path.write_text(out + "\n")
    return path


def fit_line_edit(line: int, text: str) -> str:
    lines = [f"// line {i}\n" for i in range(1, 41)]
    lines[line - 1] = text + "\n"
    return "".join(lines)


@pytest.fixture
def stacked(project, upstream, tmp_path):
    """A project whose recipe pins upstream HEAD with two patches and one overlay."""
    first = make_patch(
        upstream, tmp_path, {"common/fit.cpp": fit_line_edit(5, "// kz: fix 1")}, "fix one"
    )
    second = make_patch(
        upstream, tmp_path, {"ggml/src/ggml.c": "int ggml_answer(void) { return 43; }\n"}, "fix two"
    )
    shutil.copy(first, project.root / "patches" / "fix-one.patch")
    shutil.copy(second, project.root / "patches" / "fix-two.patch")
    project.series("fix-one.patch", "fix-two.patch")
    project.write("kernels/gdn/select.h", "#pragma once\n")
    extra = "overlays:\n  - src: kernels/gdn/select.h\n    dest: ggml/src/gdn-select.h\n"
    project.recipe("r", commit=upstream.head(), sources=[f"path: {upstream.path}"], extra=extra)
    return project


def worktree(project) -> Path:
    return project.work / "src" / "r"


def test_sync_applies_series_as_commits_and_overlays(stacked, upstream, kz):
    result = kz("sync", "r")
    assert result.code == 0, result.err
    wt = worktree(stacked)
    subjects = git(wt, "log", "--format=%s", f"{upstream.head()}..HEAD").splitlines()
    assert subjects == ["kz: kernel overlays for r", "fix two", "fix one"]
    authors = git(wt, "log", "--format=%an <%ae> | %cn", f"{upstream.head()}..HEAD").splitlines()
    assert (
        authors
        == ["kzbuild <kzbuild@localhost> | kzbuild"]
        + ["Upstream Dev <dev@upstream.example> | kzbuild"] * 2
    )
    assert git(wt, "rev-parse", "refs/kz/base") == upstream.head()
    assert git(wt, "symbolic-ref", "HEAD") == "refs/heads/kz/r"
    assert (wt / "ggml/src/gdn-select.h").read_text() == "#pragma once\n"
    assert git(wt, "status", "--porcelain") == ""
    lock = json.loads((stacked.root / "recipes/r.lock.json").read_text())
    assert lock["upstream"]["commit"] == upstream.head()
    assert lock["upstream"]["fetched_from"] == f"path:{upstream.path}"
    assert [p["file"] for p in lock["patches"]] == ["fix-one.patch", "fix-two.patch"]
    assert lock["head"] == git(wt, "rev-parse", "HEAD")


def test_second_sync_is_a_no_op(stacked, kz):
    assert kz("sync", "r").code == 0
    lock_before = (stacked.root / "recipes/r.lock.json").read_bytes()
    result = kz("sync", "r")
    assert result.code == 0
    assert "up to date" in result.out
    assert (stacked.root / "recipes/r.lock.json").read_bytes() == lock_before


def test_two_machines_give_identical_locks_and_shas(stacked, upstream, tmp_path, kz):
    assert kz("sync", "r").code == 0
    first_lock = (stacked.root / "recipes/r.lock.json").read_bytes()
    # A second "machine": a copy of the project with its own cache and work dir, a day later.
    other = tmp_path / "other-project"
    shutil.copytree(stacked.root, other)
    (other / "recipes/r.lock.json").unlink()
    time.sleep(1.1)  # commit dates must not depend on the clock
    from kzbuild.cli import main

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
    assert (other / "recipes/r.lock.json").read_bytes() == first_lock


def test_pin_fetch_is_shallow(stacked, upstream, kz):
    upstream.commit({"README.md": "newer\n"}, "later upstream work")  # the pin is no longer the tip
    assert kz("sync", "r").code == 0
    mirror = stacked.cache / "upstream.git"
    assert git(mirror, "rev-list", "--count", "--all") == "1"
    assert (mirror / "shallow").read_text().split() == [git(upstream.path, "rev-parse", "HEAD~1")]


def test_dirty_worktree_blocks_sync_until_forced(stacked, kz):
    assert kz("sync", "r").code == 0
    (worktree(stacked) / "common/fit.cpp").write_text("local edit\n")
    stacked.write("patches/series", "fix-one.patch\n")  # inputs changed: sync has work to do
    result = kz("sync", "r")
    assert result.code == 4
    assert "uncommitted changes" in result.err and "common/fit.cpp" in result.err
    assert (worktree(stacked) / "common/fit.cpp").read_text() == "local edit\n"
    assert kz("sync", "r", "--force").code == 0
    assert (worktree(stacked) / "common/fit.cpp").read_text() == fit_line_edit(5, "// kz: fix 1")


def test_unexported_commit_blocks_sync(stacked, kz):
    assert kz("sync", "r").code == 0
    wt = worktree(stacked)
    (wt / "new.c").write_text("int x;\n")
    git(wt, "add", "new.c")
    git(wt, "commit", "-q", "-m", "my local work")
    result = kz("sync", "r")
    assert result.code == 4
    assert "commits that are not in patches/" in result.err and "my local work" in result.err
    status = kz("status", "r", "--json")
    data = json.loads(status.out)
    assert data["worktree"]["state"] == "unexported commits"
    assert data["matches_lock"] is False


def test_conflicting_patch_aborts_cleanly_at_last_good_state(stacked, upstream, tmp_path, kz):
    bad = make_patch(
        upstream,
        tmp_path,
        {"common/fit.cpp": fit_line_edit(5, "// someone else")},
        "conflicting fix",
    )
    shutil.copy(bad, stacked.root / "patches/conflicting.patch")
    stacked.write("patches/series", "fix-one.patch\nconflicting.patch\nfix-two.patch\n")
    result = kz("sync", "r")
    assert result.code == 5
    err = " ".join(result.err.split())
    assert "patch conflicting.patch does not apply to upstream" in err
    assert "after fix-one.patch" in err
    assert "common/fit.cpp" in err
    wt = worktree(stacked)
    assert git(wt, "log", "-1", "--format=%s") == "fix one"
    assert not (wt / ".git" / "rebase-apply").exists()
    assert git(wt, "status", "--porcelain") == ""


def test_status_reports_pin_source_patches(stacked, upstream, kz):
    before = json.loads(kz("status", "r", "--json").out)
    assert before["worktree"]["state"] == "missing" and before["matches_lock"] is False
    assert kz("sync", "r").code == 0
    data = json.loads(kz("status", "r", "--json").out)
    assert data["pin"] == upstream.head()
    assert data["source"] == f"path:{upstream.path}"
    assert [p["file"] for p in data["patches"]] == ["fix-one.patch", "fix-two.patch"]
    assert data["worktree"]["state"] == "clean" and data["matches_lock"] is True
    human = kz("status", "r")
    assert "fix-two.patch" in human.out and "clean" in human.out


def test_changed_patch_resyncs(stacked, kz):
    assert kz("sync", "r").code == 0
    before = json.loads((stacked.root / "recipes/r.lock.json").read_text())["head"]
    stacked.write("patches/series", "fix-two.patch\n")
    result = kz("sync", "r")
    assert result.code == 0 and "synced r" in result.out
    after = json.loads((stacked.root / "recipes/r.lock.json").read_text())
    assert [p["file"] for p in after["patches"]] == ["fix-two.patch"] and after["head"] != before


def test_missing_commit_in_source_is_an_error(project, upstream, kz):
    project.recipe("r", commit="b" * 40, sources=[f"path: {upstream.path}"])
    result = kz("sync", "r")
    assert result.code == 3
    assert "no source could provide upstream commit " + "b" * 40 in " ".join(result.err.split())


# --- served remotes ---


def long_history(upstream: UpstreamRepo, count: int) -> list[str]:
    return [
        upstream.commit(
            {"ggml/src/ggml.c": f"int ggml_answer(void) {{ return {i}; }}\n"}, f"upstream {i}"
        )
        for i in range(count)
    ]


def test_sha_only_fetch_from_git_daemon(project, upstream, git_daemon, kz):
    base, port = git_daemon
    shas = long_history(upstream, 20)
    pin = shas[9]
    serve(upstream, base, allow_sha_want=True)
    project.recipe("r", commit=pin, sources=[f"git: git://127.0.0.1:{port}/llama.cpp.git"])
    result = kz("sync", "r")
    assert result.code == 0, result.err
    mirror = project.cache / "upstream.git"
    assert git(mirror, "rev-list", "--count", "--all") == "1"  # only the pinned commit came over
    assert git(project.work / "src/r", "rev-parse", "HEAD") == pin


def test_server_refusing_sha_want_falls_back_to_partial_fetch(
    project, upstream, git_daemon, kz, monkeypatch
):
    base, port = git_daemon
    shas = long_history(upstream, 20)
    pin = shas[9]
    serve(upstream, base, allow_sha_want=False)
    # Protocol v0 is what such servers speak; v2 servers always serve reachable shas.
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", "'protocol.version=0'")
    project.recipe("r", commit=pin, sources=[f"git: git://127.0.0.1:{port}/llama.cpp.git"])
    result = kz("-v", "sync", "r")
    assert result.code == 0, result.err
    assert "refuses a want" in result.err
    wt = project.work / "src/r"
    assert git(wt, "rev-parse", "HEAD") == pin
    assert (wt / "ggml/src/ggml.c").read_text() == "int ggml_answer(void) { return 9; }\n"
    assert git(wt, "status", "--porcelain") == ""
    mirror = project.cache / "upstream.git"
    # Only the pin and the ten commits above it on its branch: never a full clone.
    assert int(git(mirror, "rev-list", "--count", pin)) == 1


def test_unreachable_remote_falls_back_to_next_source(project, upstream, kz):
    dead_port = free_port()  # nothing listens there
    project.recipe(
        "r",
        commit=upstream.head(),
        sources=[
            f"git: git://127.0.0.1:{dead_port}/llama.cpp.git",
            f"path: file://{upstream.path}",
        ],
    )
    result = kz("sync", "r")
    assert result.code == 0, result.err
    err = "".join(result.err.split())  # the log wraps long lines
    assert f"sourcegit:git://127.0.0.1:{dead_port}/llama.cpp.gitfailed" in err
    assert f"tryingpath:file://{upstream.path}next" in err
    lock = json.loads((project.root / "recipes/r.lock.json").read_text())
    assert lock["upstream"]["fetched_from"] == f"path:file://{upstream.path}"


def test_cache_is_shared_and_never_refetched(project, upstream, kz):
    project.recipe("r", commit=upstream.head(), sources=[f"path: {upstream.path}"])
    project.recipe("r2", commit=upstream.head(), sources=["git: git://127.0.0.1:1/gone.git"])
    assert kz("sync", "r").code == 0
    result = kz("sync", "r2")  # its only source is dead, but the cache already has the pin
    assert result.code == 0, result.err
    assert "failed" not in result.err


def test_lock_busy_gives_clear_message(tmp_path):
    lock_file = tmp_path / "x.lock"
    holder = subprocess.Popen(
        [
            "python",
            "-c",
            f"import fcntl,os,time; fd=os.open({str(lock_file)!r}, os.O_RDWR|os.O_CREAT); "
            "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'4242'); print('held', flush=True); "
            "time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
    )
    assert holder.stdout.readline().strip() == b"held"
    try:
        with pytest.raises(Busy) as info:
            with locked(lock_file, what="the worktree X", wait=0.3):
                pass
        assert (
            "the worktree X is in use by another kzbuild process (pid 4242)" in info.value.message
        )
    finally:
        holder.kill()
        holder.wait()
    with locked(lock_file, what="the worktree X", wait=0.3):
        pass


def test_after_a_conflict_the_applied_patches_are_not_taken_for_local_work(
    stacked, upstream, tmp_path, kz
):
    bad = make_patch(
        upstream,
        tmp_path,
        {"common/fit.cpp": fit_line_edit(5, "// someone else")},
        "conflicting fix",
    )
    shutil.copy(bad, stacked.root / "patches/conflicting.patch")
    stacked.write("patches/series", "fix-one.patch\nconflicting.patch\n")
    assert kz("sync", "r").code == 5
    assert json.loads(kz("status", "r", "--json").out)["worktree"]["state"] == "clean"
    stacked.write(
        "patches/series", "fix-one.patch\nfix-two.patch\n"
    )  # the conflicting patch is dropped
    result = kz("sync", "r")
    assert result.code == 0, result.err
    assert git(worktree(stacked), "log", "-1", "--format=%s", "HEAD~1") == "fix two"


def test_status_and_sync_print_plain_whole_lines_and_never_read_names_as_markup(
    stacked, upstream, tmp_path, capsys, monkeypatch
):
    """In a pipe: no styles, no wrapping or cutting; data that looks like rich markup is printed as
    it is."""
    from kzbuild.cli import main

    long_name = "a-patch-name-far-longer-than-any-terminal-is-wide-" + "x" * 80 + ".patch"
    shutil.move(stacked.root / "patches" / "fix-two.patch", stacked.root / "patches" / long_name)
    stacked.series("fix-one.patch", long_name)
    work = tmp_path / "work [/red] [bold]"  # '[/red]' alone made rich raise a MarkupError

    def run(*args: str) -> str:
        capsys.readouterr()
        code = main(
            [
                "--project",
                str(stacked.root),
                "--cache-dir",
                str(stacked.cache),
                "--work-dir",
                str(work),
                *args,
            ]
        )
        out = capsys.readouterr().out
        assert code == 0, out
        return out

    synced = run("sync", "r")
    assert f"synced r -> {work / 'src' / 'r'}" in synced.splitlines()
    assert f"  applied {long_name} as " in synced
    status = run("status", "r")
    assert "\x1b[" not in synced + status
    rows = dict(
        line.split(None, 1)
        for line in status.splitlines()
        if line.startswith(("recipe", "patch", "worktree"))
    )
    assert rows["worktree"].strip() == f"{work / 'src' / 'r'} (clean)"
    assert any(line.startswith("patch") and long_name in line for line in status.splitlines())

    monkeypatch.setenv("FORCE_COLOR", "1")
    assert run("sync", "r").startswith("\x1b[32mr\x1b[0m is up to date at ")
    monkeypatch.setenv("NO_COLOR", "1")
    assert "\x1b[" not in run("status", "r")


def test_on_a_terminal_control_characters_in_data_cannot_restyle_it(capsys, monkeypatch):
    from kzbuild.cli.ui import say, styled

    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.delenv("NO_COLOR", raising=False)
    say(styled("green", "ok"), " patch-\x1b[2J\x1b]0;owned\x07name\tnext")
    assert capsys.readouterr().out == "\x1b[32mok\x1b[0m patch-?[2J?]0;owned?name\tnext\n"
    monkeypatch.delenv("FORCE_COLOR")
    say("a\x1bb")  # a pipe gets the bytes as they are
    assert capsys.readouterr().out == "a\x1bb\n"
