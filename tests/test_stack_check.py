"""``kzbuild patches check`` on synthetic upstream histories, and sync skipping upstreamed
patches."""

from __future__ import annotations

import json

from tests.conftest import git
from tests.fixtures_stack import GOOD_TRAILERS, add_patch, file_source, fit, make_patch


def check(kz, *args: str) -> tuple[int, dict]:
    result = kz("patches", "check", "r", *args, "--json")
    return result.code, json.loads(result.out)


def by_name(report: dict) -> dict[str, dict]:
    return {p["patch"]: p for p in report["patches"]}


def test_clean_at_the_pin(project, upstream, kz):
    base = upstream.head()
    add_patch(
        project,
        "fix.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line5="fixed 5")}, "common: fix 5"),
    )
    project.recipe("r", commit=base, sources=[file_source(upstream)])
    code, report = check(kz)
    assert code == 0
    assert report["target"] == base and report["since"] is None
    assert by_name(report)["fix.patch"]["verdict"] == "clean"


def test_verbatim_cherry_pick_is_found_by_patch_id(project, upstream, kz):
    base = upstream.head()
    add_patch(
        project,
        "fix.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line20="fixed 20")}, "common: fix 20"),
    )
    upstream.commit({"README.md": "unrelated\n"}, "docs: unrelated")
    picked = upstream.commit(
        {"common/fit.cpp": fit(line20="fixed 20")}, "common: fix line 20 (#123)"
    )
    # The next upstream commit changes the line right after ours, so reverse-applying fails as
    # written.
    new = upstream.commit(
        {"common/fit.cpp": fit(line20="fixed 20", line21="upstream 21")}, "common: touch 21"
    )
    project.recipe("r", commit=base, sources=[file_source(upstream)])

    code, report = check(kz, "--against", new, "--fetch-history")
    assert code == 0
    assert report["history"] == "complete" and report["commits_between"] == 3
    result = by_name(report)["fix.patch"]
    assert result["verdict"] == "upstreamed"
    assert result["proof"]["kind"] == "patch-id"
    assert result["proof"]["commit"] == picked
    assert "common: fix line 20 (#123)" in result["proof"]["detail"]


def test_without_history_reverse_apply_with_less_context_still_proves_it(project, upstream, kz):
    base = upstream.head()
    add_patch(
        project,
        "fix.patch",
        make_patch(
            upstream, base, {"common/fit.cpp": fit(line20="fixed line 20")}, "common: fix 20"
        ),
    )
    new = upstream.commit(
        {"common/fit.cpp": fit(line20="fixed line 20", line21="upstream 21")},
        "common: fix 20 and 21",
    )
    project.recipe("r", commit=base, sources=[file_source(upstream)])

    code, report = check(kz, "--against", new)
    assert code == 0
    assert report["history"].startswith("missing") and report["commits_between"] is None
    proof = by_name(report)["fix.patch"]["proof"]
    assert proof["kind"] == "reverse-apply"
    assert "context reduced to 0 line(s)" in proof["detail"]


def test_reduced_context_is_no_proof_for_a_common_line(project, upstream, kz):
    base = upstream.head()
    # The patch adds a line ("}") that upstream has elsewhere: finding it says nothing.
    add_patch(
        project,
        "brace.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line20="}")}, "common: brace"),
    )
    new = upstream.commit(
        {"common/fit.cpp": fit(line3="}", line20="// changed 20", line21="x")}, "common: rework"
    )
    project.recipe("r", commit=base, sources=[file_source(upstream)])
    code, report = check(kz, "--against", new)
    assert by_name(report)["brace.patch"]["verdict"] == "conflict"
    assert code == 5


def test_squashed_upstream_with_other_edits_reverse_applies(project, upstream, kz):
    base = upstream.head()
    add_patch(
        project,
        "fix.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line10="fixed 10")}, "common: fix 10"),
    )
    squashed = {
        "common/fit.cpp": fit(line10="fixed 10", line30="also 30"),
        "ggml/src/new.c": "int n;\n",
    }
    new = upstream.commit(squashed, "common: big rework including the fix")
    project.recipe("r", commit=base, sources=[file_source(upstream)])

    code, report = check(kz, "--against", new, "--fetch-history")
    assert code == 0
    result = by_name(report)["fix.patch"]
    assert result["verdict"] == "upstreamed"
    assert result["proof"]["kind"] == "reverse-apply"
    assert result["proof"]["detail"] == f"reverse-applies cleanly on {new[:12]}"


def test_context_drift_resolved_by_3way(project, upstream, kz):
    base = upstream.head()
    add_patch(
        project,
        "fix.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line5="fixed 5")}, "common: fix 5"),
    )
    new = upstream.commit({"common/fit.cpp": fit(line7="drift 7")}, "common: drift")
    project.recipe("r", commit=base, sources=[file_source(upstream)])

    code, report = check(kz, "--against", new)
    assert code == 0
    result = by_name(report)["fix.patch"]
    assert result["verdict"] == "3way"
    assert result["files"] == ["common/fit.cpp"]
    assert result["fuzz_context"] == 1  # it would also apply with fuzz: lint flags that at a pin


def test_three_way_needs_the_blobs_the_patch_was_made_from(project, upstream, kz):
    base = upstream.head()
    add_patch(
        project,
        "fix.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line5="fixed 5")}, "common: fix 5"),
    )
    pin = upstream.commit({"common/fit.cpp": fit(line7="drift 7")}, "common: drift")
    project.recipe("r", commit=pin, sources=[file_source(upstream)])  # the cache never saw `base`
    code, report = check(kz)
    result = by_name(report)["fix.patch"]
    assert result["verdict"] == "conflict" and code == 5
    assert (
        "no 3-way merge: the blobs the patch was made from are not in the cache" in result["note"]
    )
    assert result["fuzz_context"] == 1


def test_real_conflict_names_file_and_hunk(project, upstream, kz):
    base = upstream.head()
    two_hunks = fit(line5="fixed 5", line30="fixed 30")
    add_patch(
        project,
        "fix.patch",
        make_patch(upstream, base, {"common/fit.cpp": two_hunks}, "common: fix 5 and 30"),
    )
    new = upstream.commit({"common/fit.cpp": fit(line5="upstream 5")}, "common: own fix for 5")
    project.recipe("r", commit=base, sources=[file_source(upstream)])

    code, report = check(kz, "--against", new)
    assert code == 5
    result = by_name(report)["fix.patch"]
    assert result["verdict"] == "conflict"
    assert result["files"] == ["common/fit.cpp"]
    assert result["hunks"] == [
        "common/fit.cpp @@ -2,7 +2,7 @@ (patch line 16)"
    ]  # the hunk at 30 still applies

    table = kz("patches", "check", "r", "--against", new)
    assert table.code == 5
    assert "conflict" in table.out and "@@ -2,7 +2,7 @@" in table.out
    assert "1 patch(es) conflict" in table.err


def test_drop_when_ancestor_is_upstreamed(project, upstream, kz):
    base = upstream.head()
    fixed = upstream.commit(
        {"ggml/src/ggml.c": "int ggml_answer(void) { return 43; }\n"}, "ggml: other fix"
    )
    new = upstream.commit({"README.md": "later\n"}, "docs")
    trailers = (*GOOD_TRAILERS, f"Drop-When: {fixed[:10]}")
    add_patch(
        project,
        "fix.patch",
        make_patch(
            upstream,
            base,
            {"common/fit.cpp": fit(line5="fixed 5")},
            "common: fix 5",
            trailers=trailers,
        ),
    )
    project.recipe("r", commit=base, sources=[file_source(upstream)])

    code, report = check(kz, "--against", new)  # shallow: the Drop-When commit is not in the cache
    assert by_name(report)["fix.patch"]["verdict"] == "clean"
    assert "is not in the cache (history missing)" in by_name(report)["fix.patch"]["note"]

    code, report = check(kz, "--against", new, "--fetch-history")
    result = by_name(report)["fix.patch"]
    assert result["verdict"] == "upstreamed"
    assert result["proof"] == {
        "kind": "drop-when",
        "commit": fixed,
        "detail": f"Drop-When {fixed[:12]} is in the history of {new[:12]}",
    }


def test_false_merged_claim_is_reported(project, upstream, kz):
    base = upstream.head()
    other = upstream.commit({"README.md": "side\n"}, "docs: side")
    git(upstream.path, "reset", "-q", "--hard", base)
    new = upstream.commit({"ggml/src/ggml.c": "int x;\n"}, "ggml: main line")
    git(upstream.path, "branch", "side", other)
    trailers = (f"Upstream-Status: Merged {other}", "Kz-Test: t")
    add_patch(
        project,
        "fix.patch",
        make_patch(
            upstream,
            base,
            {"common/fit.cpp": fit(line5="fixed 5")},
            "common: fix 5",
            trailers=trailers,
        ),
    )
    project.recipe("r", commit=base, sources=[file_source(upstream)])
    kz("patches", "check", "r", "--against", other)  # brings the claimed commit into the cache
    code, report = check(kz, "--against", new, "--fetch-history")
    result = by_name(report)["fix.patch"]
    assert result["verdict"] == "clean"
    assert (
        f"claims Upstream-Status: Merged {other}, but that commit is not in the history of "
        f"{new[:12]}" in result["note"]
    )


def test_empty_patch(project, upstream, kz):
    base = upstream.head()
    add_patch(project, "nothing.patch", make_patch(upstream, base, {}, "nothing at all"))
    project.recipe("r", commit=base, sources=[file_source(upstream)])
    code, report = check(kz)
    assert by_name(report)["nothing.patch"]["verdict"] == "empty"
    assert code == 0


def test_three_patch_stack_in_order(project, upstream, kz):
    """Later patches apply on top of earlier ones; a conflicting one is skipped for the rest."""
    base = upstream.head()
    first = fit(line5="fixed 5")
    add_patch(project, "a.patch", make_patch(upstream, base, {"common/fit.cpp": first}, "a: fix 5"))
    add_patch(
        project,
        "b.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line5="fixed 5", line6="fixed 6")}, "b"),
    )
    add_patch(
        project,
        "c.patch",
        make_patch(
            upstream, base, {"ggml/src/ggml.c": "int ggml_answer(void) { return 7; }\n"}, "c: ggml"
        ),
    )
    project.recipe("r", commit=base, sources=[file_source(upstream)])
    code, report = check(kz)
    verdicts = [p["verdict"] for p in report["patches"]]
    assert verdicts[0] == "clean" and verdicts[2] == "clean"
    assert verdicts[1] == "conflict"  # b was made without a: it does not apply on top of it
    assert code == 5


def test_check_never_touches_the_worktree(project, upstream, kz):
    base = upstream.head()
    add_patch(
        project,
        "fix.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line5="fixed 5")}, "common: fix 5"),
    )
    new = upstream.commit({"common/fit.cpp": fit(line5="upstream 5")}, "conflicting")
    project.recipe("r", commit=base, sources=[file_source(upstream)])
    assert kz("sync", "r").code == 0
    worktree = project.settings.worktree("r")
    (worktree / "scratch-file").write_text("mine\n")
    head = git(worktree, "rev-parse", "HEAD")
    check(kz, "--against", new)
    assert git(worktree, "rev-parse", "HEAD") == head
    assert (worktree / "scratch-file").read_text() == "mine\n"
    assert (project.work / "scratch" / "r" / ".git").is_dir()


def test_unknown_against_ref(project, upstream, kz):
    base = upstream.head()
    project.recipe("r", commit=base, sources=[file_source(upstream)])
    result = kz("patches", "check", "r", "--against", "no-such-branch")
    assert result.code == 3
    assert "cannot resolve 'no-such-branch'" in result.err


def test_against_a_branch_of_the_remote(project, upstream, kz):
    base = upstream.head()
    add_patch(
        project,
        "fix.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line5="fixed 5")}, "common: fix 5"),
    )
    new = upstream.commit({"README.md": "new\n"}, "docs")
    project.recipe("r", commit=base, sources=[file_source(upstream)])
    code, report = check(kz, "--against", "master")
    assert report["target"] == new
    assert code == 0


# --- sync and upstreamed patches ---


def test_sync_skips_an_upstreamed_patch_and_records_the_proof(project, upstream, kz):
    base = upstream.head()
    add_patch(
        project,
        "fix.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line10="fixed 10")}, "common: fix 10"),
    )
    add_patch(
        project,
        "keep.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line30="ours 30")}, "common: ours 30"),
    )
    new = upstream.commit({"common/fit.cpp": fit(line10="fixed 10")}, "common: upstream fix 10")
    project.recipe("r", commit=new, sources=[file_source(upstream)])

    result = kz("sync", "r")
    assert result.code == 0, result.err
    assert (
        "skipped fix.patch: already upstream (reverse-apply: reverse-applies cleanly on"
        in result.out
    )
    lock = json.loads((project.root / "recipes" / "r.lock.json").read_text())
    fix, keep = lock["patches"]
    assert (
        fix["commit"] is None
        and fix["upstreamed"] == f"reverse-apply: reverse-applies cleanly on {new[:12]}"
    )
    assert keep["commit"] and "upstreamed" not in keep
    worktree = project.settings.worktree("r")
    assert git(worktree, "log", "--format=%s", f"{new}..HEAD") == "common: ours 30"

    again = kz("sync", "r")
    assert "is up to date" in again.out
    status = kz("status", "r")
    assert "skipped, upstreamed" in status.out


def test_sync_refusal_names_patches_export(project, upstream, kz):
    base = upstream.head()
    add_patch(
        project,
        "fix.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line10="fixed 10")}, "common: fix 10"),
    )
    project.recipe("r", commit=base, sources=[file_source(upstream)])
    assert kz("sync", "r").code == 0
    worktree = project.settings.worktree("r")
    (worktree / "common" / "fit.cpp").write_text("edited\n")
    project.write("patches/series", "")  # an input changed: sync has work to do
    (project.root / "patches" / "fix.patch").unlink()
    result = kz("sync", "r")
    assert result.code == 4
    assert "kzbuild patches export r" in result.err
    assert "kzbuild sync r --force" in result.err
