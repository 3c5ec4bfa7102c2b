"""``kzbuild patches export`` and ``patches new``: worktree commits back to patches/,
byte-stable."""

from __future__ import annotations

import json

import pytest

from kzbuild.source.stack.patchfile import lint_series
from tests.conftest import CONTRIBUTOR, git, write_git_config
from tests.fixtures_stack import add_patch, file_source, fit, flat, make_patch, tree_digest


@pytest.fixture
def synced(project, upstream, kz):
    """A recipe with two patches in foreign format (diffstat, signature, [PATCH]), synced."""
    base = upstream.head()
    project.write("patches/series", "# the stack\n\n# first: the fit fix\n")
    add_patch(
        project,
        "fit-fix.patch",
        make_patch(
            upstream,
            base,
            {"common/fit.cpp": fit(line5="fixed 5")},
            "common: fix 5",
            body="Because.",
        ),
    )
    add_patch(
        project,
        "ggml.patch",
        make_patch(
            upstream,
            base,
            {"ggml/src/ggml.c": "int ggml_answer(void) { return 7; }\n"},
            "ggml: answer 7",
        ),
    )
    project.recipe("r", commit=base, sources=[file_source(upstream)])
    assert kz("sync", "r").code == 0
    return project.settings.worktree("r")


def commit_all(worktree, message: str, *, amend: bool = False) -> str:
    git(worktree, "add", "-A")
    git(worktree, "commit", "-q", *(["--amend", "--no-edit"] if amend else ["-m", message]))
    return git(worktree, "rev-parse", "HEAD")


def test_reexport_is_byte_identical(project, kz, synced):
    first = kz("patches", "export", "r")
    assert first.code == 0, first.err
    assert "rewritten  fit-fix.patch (format normalized)" in first.out
    assert "rewritten  ggml.patch (format normalized)" in first.out
    patches = project.root / "patches"
    exported = tree_digest(patches)
    assert (
        b"\n-- \n" not in exported["fit-fix.patch"]
        and b"file changed" not in exported["fit-fix.patch"]
    )
    assert exported["fit-fix.patch"].startswith(b"From 0000000000000000000000000000000000000000 ")
    assert exported["series"] == b"# the stack\n\n# first: the fit fix\nfit-fix.patch\nggml.patch\n"

    again = kz("patches", "export", "r")
    assert "nothing to export: 2 patch(es) unchanged" in again.out
    assert tree_digest(patches) == exported

    # Round trip through git am: sync rebuilds the worktree from the exported files...
    synced_again = kz("sync", "r")
    assert synced_again.code == 0, synced_again.err
    assert (
        kz("status", "r", "--json").out
        and json.loads(kz("status", "r", "--json").out)["matches_lock"]
    )
    # ...and exporting that gives the same bytes.
    assert "nothing to export" in kz("patches", "export", "r").out
    assert tree_digest(patches) == exported
    assert lint_series(patches / "series")[1] == []


def test_only_changed_patches_are_rewritten(project, kz, synced):
    kz("patches", "export", "r")
    before = tree_digest(project.root / "patches")
    git(synced, "rebase", "-q", "--exec", "true", "HEAD~1")  # no-op rebase: new shas, same content
    (synced / "ggml" / "src" / "ggml.c").write_text("int ggml_answer(void) { return 8; }\n")
    commit_all(synced, "", amend=True)
    result = kz("patches", "export", "r")
    assert "rewritten  ggml.patch (changed)" in result.out
    after = tree_digest(project.root / "patches")
    assert after["fit-fix.patch"] == before["fit-fix.patch"]
    assert b"+int ggml_answer(void) { return 8; }" in after["ggml.patch"]


def test_reworded_commit_keeps_its_file_by_patch_id(project, kz, synced):
    git(
        synced,
        "commit",
        "-q",
        "--amend",
        "-m",
        "ggml: a better subject\n\nUpstream-Status: Pending\nKz-Test: t\n",
    )
    result = kz("patches", "export", "r")
    assert "rewritten  ggml.patch (changed)" in result.out
    assert not (project.root / "patches" / "ggml-a-better-subject.patch").exists()


def test_new_commit_becomes_a_new_patch_and_removed_commit_leaves(project, kz, synced):
    kz("patches", "export", "r")
    # Drop the first patch's commit, keep the second, add a new one.
    base = git(synced, "rev-parse", "refs/kz/base")
    git(synced, "rebase", "-q", "--onto", base, "HEAD~1")
    (synced / "README.md").write_text("patched readme\n")
    commit_all(
        synced,
        "docs: Explain the Hexagon build\n\nUpstream-Status: Inappropriate kzbuild only\nKz-Test: "
        "none needed",
    )
    result = kz("patches", "export", "r")
    assert result.code == 0, result.err
    assert "new        docs-explain-the-hexagon-build.patch" in result.out
    assert "removed    fit-fix.patch (its commit is gone)" in result.out
    patches = project.root / "patches"
    assert not (patches / "fit-fix.patch").exists()
    assert (
        (patches / "series").read_text()
        == "# the stack\n\nggml.patch\ndocs-explain-the-hexagon-build.patch\n"
    )  # its comment went with it
    assert kz("sync", "r").code == 0  # the new commit counts as exported: sync does not refuse


def test_reordered_commits_reorder_the_series(project, kz, synced):
    kz("patches", "export", "r")
    base = git(synced, "rev-parse", "refs/kz/base")
    first, second = git(synced, "rev-list", "--reverse", f"{base}..HEAD").split()
    git(synced, "reset", "-q", "--hard", base)
    git(synced, "cherry-pick", second)
    git(synced, "cherry-pick", first)
    kz("patches", "export", "r")
    # The comment written above fit-fix.patch moves with it.
    assert (
        project.root / "patches" / "series"
    ).read_text() == "# the stack\n\nggml.patch\n# first: the fit fix\nfit-fix.patch\n"


def test_overlay_commit_is_not_exported(project, upstream, kz):
    base = upstream.head()
    add_patch(
        project,
        "ggml.patch",
        make_patch(upstream, base, {"ggml/src/ggml.c": "int x;\n"}, "ggml: x"),
    )
    project.write("kernels/extra.c", "int extra;\n")
    project.recipe(
        "r",
        commit=base,
        sources=[file_source(upstream)],
        extra="overlays:\n  - src: kernels/extra.c\n    dest: ggml/src/extra.c\n",
    )
    assert kz("sync", "r").code == 0
    result = kz("patches", "export", "r")
    assert result.code == 0, result.err
    assert sorted(p.name for p in (project.root / "patches").glob("*.patch")) == ["ggml.patch"]


def test_export_refusals(project, kz, synced, upstream):
    (synced / "common" / "fit.cpp").write_text("dirty\n")
    dirty = kz("patches", "export", "r")
    assert dirty.code == 4
    assert "uncommitted changes" in flat(dirty.err) and "kzbuild patches new NAME r" in flat(
        dirty.err
    )
    git(synced, "checkout", "-q", "--", ".")

    # A teammate's newer version of a patch arrived (git pull): export must not overwrite it.
    (project.root / "patches" / "ggml.patch").write_text(
        make_patch(
            upstream,
            git(synced, "rev-parse", "refs/kz/base"),
            {"ggml/src/ggml.c": "int y;\n"},
            "ggml: y",
        )
    )
    stale = kz("patches", "export", "r")
    assert stale.code == 5
    assert (
        "changed since the worktree was synced or exported" in flat(stale.err)
        and "ggml.patch" in stale.err
    )
    assert kz("patches", "export", "r", "--force").code == 0


def test_export_needs_a_worktree_at_the_pin(project, upstream, kz):
    base = upstream.head()
    project.recipe("r", commit=base, sources=[file_source(upstream)])
    missing = kz("patches", "export", "r")
    assert missing.code == 4 and "run 'kzbuild sync r' first" in flat(missing.err)
    assert kz("sync", "r").code == 0
    newer = upstream.commit({"README.md": "new\n"}, "docs")
    project.recipe("r", commit=newer, sources=[file_source(upstream)])
    moved = kz("patches", "export", "r")
    assert moved.code == 4 and f"pins {newer[:12]}" in flat(moved.err)


def test_export_keeps_patches_sync_skipped_as_upstreamed(project, upstream, kz):
    base = upstream.head()
    add_patch(
        project,
        "done.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line10="fixed 10")}, "common: fix 10"),
    )
    add_patch(
        project,
        "ggml.patch",
        make_patch(upstream, base, {"ggml/src/ggml.c": "int x;\n"}, "ggml: x"),
    )
    new = upstream.commit({"common/fit.cpp": fit(line10="fixed 10")}, "upstream fix")
    project.recipe("r", commit=new, sources=[file_source(upstream)])
    assert kz("sync", "r").code == 0
    result = kz("patches", "export", "r")
    assert "kept done.patch: sync skipped it as upstreamed" in flat(result.out)
    assert (project.root / "patches" / "series").read_text() == "done.patch\nggml.patch\n"


def test_new_patch_from_uncommitted_changes(project, kz, synced):
    kz("patches", "export", "r")
    (synced / "common" / "fit.cpp").write_text(fit(line5="fixed 5", line40="new 40"))
    result = kz(
        "patches",
        "new",
        "fit-40",
        "r",
        "-m",
        "common: fix line 40",
        "--test",
        "tests/test_fit.py::test_40",
        "--upstream-pr",
        "https://github.com/ggml-org/llama.cpp/pull/9",
        "--author",
        "Ann Dev <ann@kz.example>",
    )
    assert result.code == 0, result.err
    assert "created patches/fit-40.patch" in result.out
    text = (project.root / "patches" / "fit-40.patch").read_text()
    assert "\nFrom: Ann Dev <ann@kz.example>\n" in text
    assert "Subject: common: fix line 40\n" in text
    assert (
        "Upstream-Status: Pending\nKz-Test: tests/test_fit.py::test_40\nUpstream-PR: "
        "https://github.com/ggml-org/llama.cpp/pull/9\n" in text
    )
    assert (project.root / "patches" / "series").read_text().endswith("ggml.patch\nfit-40.patch\n")
    assert lint_series(project.root / "patches" / "series")[1] == []
    assert kz("sync", "r").code == 0


def test_new_patch_author_is_the_users_git_identity_or_a_clear_error(
    project, kz, synced, monkeypatch, tmp_path
):
    (synced / "common" / "fit.cpp").write_text(fit(line40="new 40"))
    # no identity anywhere: a config without user.name, which forbids guessing one from the host
    nameless = write_git_config(tmp_path / "gitconfig", user={"useConfigOnly": "true"})
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(nameless))
    nobody = kz("patches", "new", "fit-40", "r", "-m", "common: fix 40", "--test", "t")
    assert nobody.code == 2, nobody.err
    assert flat(nobody.err) == (
        "error: no author for the new patch "
        "hint: pass --author 'Name <email>', or set your git user.name and user.email"
    )
    assert not (project.root / "patches" / "fit-40.patch").exists()
    monkeypatch.undo()  # the session's own git config: the contributor's identity
    made = kz("patches", "new", "fit-40", "r", "-m", "common: fix 40", "--test", "t")
    assert made.code == 0, made.err
    patch = (project.root / "patches" / "fit-40.patch").read_text()
    assert f"\nFrom: {CONTRIBUTOR[0]} <{CONTRIBUTOR[1]}>\n" in patch


def test_new_patch_errors(project, kz, synced):
    nothing = kz("patches", "new", "x", "r", "-m", "s", "--test", "t", "--author", "A <a@b>")
    assert nothing.code == 5 and "has no uncommitted changes" in flat(nothing.err)
    taken = kz("patches", "new", "ggml", "r", "-m", "s", "--test", "t")
    assert taken.code == 2 and "patches/ggml.patch already exists" in flat(taken.err)
    bad = kz("patches", "new", "x", "r", "-m", "s", "--test", "t", "--upstream-status", "Done")
    assert bad.code == 2 and "Upstream-Status 'Done' is not one of" in flat(bad.err)
