"""``kzbuild patches upstream``: a patch without kzbuild's trailers, applied alone and built
alone."""

from __future__ import annotations

import json

import pytest

from tests.conftest import git, have
from tests.fixtures_stack import add_patch, file_source, fit, flat, make_patch

KZ_AND_SIGNED = (
    "Signed-off-by: Kz Dev <dev@kz.example>",
    "Upstream-Status: Pending",
    "Upstream-PR: https://github.com/ggml-org/llama.cpp/pull/1",
    "Drop-When: 0123456789abcdef",
    "Kz-Test: tests/test_fit.py::test_breakdown",
)
needs_build_tools = pytest.mark.skipif(
    not (have("cmake") and have("ninja") and have("ccache") and have("gcc")),
    reason="needs cmake, ninja, ccache, gcc",
)


def steps(result) -> list[tuple[str, str]]:
    return [(s["kind"], s["status"]) for s in json.loads(result.out)["steps"]]


def test_kz_trailers_are_stripped_and_git_am_takes_the_rest(project, upstream, kz, tmp_path):
    base = upstream.head()
    text = make_patch(
        upstream,
        base,
        {"common/fit.cpp": fit(line5="fixed 5")},
        "common: fix 5",
        body="Why: line 5 was wrong.",
        trailers=KZ_AND_SIGNED,
    )
    add_patch(project, "fix.patch", text)
    project.recipe("r", commit=base, sources=[file_source(upstream)])
    out = tmp_path / "fix.upstream.patch"

    result = kz("patches", "upstream", "fix.patch", "--recipe", "r", "--no-build", "-o", str(out))
    assert result.code == 0, result.err
    stripped = out.read_text()
    for key in ("Upstream-Status:", "Upstream-PR:", "Drop-When:", "Kz-Test:"):
        assert key not in stripped
    assert "Signed-off-by: Kz Dev <dev@kz.example>\n---\n" in stripped
    assert stripped.split("\n---\n")[1:] == text.split("\n---\n")[1:]  # the diff byte for byte
    assert "pass apply alone at the pin" in flat(result.out)
    assert "skipped build for host" in flat(result.out) and "--no-build" in result.out

    clone = tmp_path / "maintainer"
    git(tmp_path, "clone", "-q", str(upstream.path), str(clone))
    git(clone, "checkout", "-q", "--detach", base)
    git(clone, "am", "-q", str(out), env={"GIT_COMMITTER_NAME": "M", "GIT_COMMITTER_EMAIL": "m@x"})
    assert (
        git(clone, "log", "-1", "--format=%an <%ae>|%ad|%s", "--date=raw")
        == "Kz Dev <dev@kz.example>|1700100000 +0000|common: fix 5"
    )
    assert (
        git(clone, "log", "-1", "--format=%b").strip()
        == "Why: line 5 was wrong.\n\nSigned-off-by: Kz Dev <dev@kz.example>"
    )

    # without -o the mbox alone is on stdout (the checks go to stderr), ready to pipe into git am
    piped = kz("patches", "upstream", "fix", "--recipe", "r", "--no-build")
    assert piped.code == 0 and piped.out == stripped
    assert "apply alone" in piped.err


def test_a_patch_needing_an_earlier_one_fails_applied_alone(project, upstream, kz):
    base = upstream.head()
    add_patch(
        project,
        "first.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line5="first 5")}, "common: first"),
    )
    add_patch(
        project,
        "second.patch",
        make_patch(upstream, "HEAD", {"common/fit.cpp": fit(line5="second 5")}, "common: second"),
    )
    project.recipe("r", commit=base, sources=[file_source(upstream)])

    result = kz("patches", "upstream", "second.patch", "--recipe", "r", "--no-build", "--json")
    assert result.code == 5
    assert steps(result) == [("apply", "fail"), ("build", "skipped")]
    assert json.loads(result.out)["steps"][0]["files"] == ["common/fit.cpp"]
    assert f"second.patch: cannot apply alone at the pin {base[:12]}: common/fit.cpp" in flat(
        result.err
    )


def test_against_a_target_where_it_conflicts(project, upstream, kz):
    base = upstream.head()
    add_patch(
        project,
        "fix.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line5="fixed 5")}, "common: fix 5"),
    )
    newer = upstream.commit(
        {"common/fit.cpp": fit(line5="upstream 5")}, "common: upstream rewrites 5"
    )
    project.recipe("r", commit=base, sources=[file_source(upstream)])

    result = kz(
        "patches",
        "upstream",
        "fix.patch",
        "--recipe",
        "r",
        "--no-build",
        "--against",
        newer,
        "--json",
    )
    assert result.code == 5
    assert steps(result) == [("apply", "pass"), ("apply", "fail"), ("build", "skipped")]
    failed = json.loads(result.out)["steps"][1]
    assert newer[:12] in failed["label"] and failed["files"] == ["common/fit.cpp"]


def test_unknown_name_is_a_config_error_naming_the_series(project, upstream, kz):
    base = upstream.head()
    add_patch(
        project,
        "fix.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line5="fixed 5")}, "common: fix 5"),
    )
    project.recipe("r", commit=base, sources=[file_source(upstream)])
    result = kz("patches", "upstream", "nope.patch", "--recipe", "r", "--no-build")
    assert result.code == 2
    assert f"'nope.patch' is not in {project.root / 'patches' / 'series'}" in result.err.replace(
        "\n", ""
    )


@needs_build_tools
def test_builds_alone_for_the_host(tiny, kz):  # noqa: F811
    tiny.add_patch(
        "answer.patch",
        {"ggml/src/ggml.c": "int ggml_answer(void) { return 43; }\n"},
        "ggml: another answer",
    )
    result = kz("patches", "upstream", "answer.patch", "--recipe", "tiny", "--json")
    assert result.code == 0, result.err
    assert steps(result) == [("apply", "pass"), ("build", "pass")]
    artifacts = tiny.project.work / "alone" / "tiny" / "work" / "artifacts"
    built = next(a for a in artifacts.glob("host-*") if a.is_dir())
    assert (built / "lib" / "libggml.so").is_file()
    assert not (tiny.project.work / "src").exists()  # the user's worktree is not touched
    assert not (tiny.project.root / "recipes" / "tiny.lock.json").exists()


@needs_build_tools
def test_a_patch_that_breaks_the_build_exits_7_with_the_compiler_message(tiny, kz):  # noqa: F811
    tiny.add_patch(
        "broken.patch",
        {"ggml/src/ggml.c": "int ggml_answer(void) { return nope; }\n"},
        "ggml: break it",
    )
    result = kz(
        "patches",
        "upstream",
        "broken.patch",
        "--recipe",
        "tiny",
        "-o",
        str(tiny.project.root / "out.patch"),
    )
    assert result.code == 7
    out = flat(result.out)
    assert "pass apply alone at the pin" in out and "fail build for host" in out
    assert "ggml.c:1:32: error:" in out and "nope" in out and "full log:" in out
    assert "broken.patch: cannot build for host" in flat(result.err)
