"""``kzbuild patches upstream`` claims only what it compiled (issue 30): each build step lists the
touched files it compiled, for which target (the host build from ninja's recorded deps, Hexagon
sources through the v79 check); a touched file no build compiled is listed as such; the mbox has
the ``---`` separator and a real author, never a placeholder."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kzbuild.source.stack.patchfile import real_author
from tests.conftest import REPO_ROOT, git
from tests.fixtures_build import TINY_CMAKE, TINY_MAIN, Tiny, install_toolchains
from tests.fixtures_stack import add_patch, file_source, fit, flat, make_patch
from tests.test_patch_upstream_submit import needs_build_tools
from tests.test_v79check import HEXAGON, HTP, tiny_tree

GGML_C = '#include "tiny.h"\nint ggml_answer(void) { return TINY; }\n'


@needs_build_tools
def test_each_build_step_lists_what_it_compiled_and_for_which_target(project, upstream, kz):
    pytest.importorskip("ziglang", reason="the v79 check needs the 'ziglang' package")
    tree = tiny_tree(project.root.parent / "hx-src")
    files = {p.relative_to(tree).as_posix(): p.read_text() for p in tree.rglob("*") if p.is_file()}
    files |= {"CMakeLists.txt": TINY_CMAKE, "tools/main.c": TINY_MAIN, "ggml/src/ggml.c": GGML_C}
    commit = upstream.commit(files, "tiny build with a tiny ggml-hexagon")
    install_toolchains(project)
    shutil.copytree(REPO_ROOT / "kernels" / "hexagon-sdk", project.root / "kernels" / "hexagon-sdk")
    project.recipe(
        "hxt",
        commit=commit,
        sources=[f"path: {upstream.path}"],
        extra="build:\n  targets: [host]\n",
    )
    hexagon_cpp = files[f"{HEXAGON}/ggml-hexagon.cpp"]
    Tiny(project, upstream, commit).add_patch(
        "gdn.patch",
        {
            "ggml/src/ggml.c": GGML_C.replace("TINY;", "TINY + 1;"),
            "ggml/src/tiny.h": "#pragma once\n#define TINY 4\n",
            f"{HEXAGON}/ggml-hexagon.cpp": hexagon_cpp + "int tiny_more() { return TINY; }\n",
            f"{HTP}/tiny.c": files[f"{HTP}/tiny.c"] + "int tiny_more(void) { return TINY; }\n",
            "ggml/src/ggml-metal/ggml-metal.m": "int metal_answer(void) { return 1; }\n",
            "README.md": "documented\n",
        },
        "ggml: touch every side",
    )

    result = kz("patches", "upstream", "gdn.patch", "--recipe", "hxt", "--json")
    assert result.code == 0, result.err
    steps = [
        (s["kind"], s["status"], s["label"].split(",")[0], s["files"])
        for s in json.loads(result.out)["steps"]
    ]
    assert steps == [
        ("apply", "pass", "apply alone at the pin " + commit[:12], []),
        ("build", "pass", "build for host", ["ggml/src/ggml.c", "ggml/src/tiny.h"]),
        (
            "build",
            "pass",
            "compile for v79-check",
            [f"{HEXAGON}/ggml-hexagon.cpp", f"{HTP}/tiny.c"],
        ),
        ("compile", "skipped", "compile every touched file", ["ggml/src/ggml-metal/ggml-metal.m"]),
    ]
    text = flat(
        kz(
            "patches",
            "upstream",
            "gdn.patch",
            "--recipe",
            "hxt",
            "-o",
            str(project.root / "o.patch"),
        ).out
    )
    assert "compiled for host: ggml/src/ggml.c, ggml/src/tiny.h" in text
    assert f"compiled for v79-check: {HEXAGON}/ggml-hexagon.cpp, {HTP}/tiny.c" in text
    assert "no build here compiled: ggml/src/ggml-metal/ggml-metal.m" in text
    assert "does not apply" not in text


def without_separator(text: str) -> str:
    """The team's patch files: no ``---`` line (and no diffstat) between message and diff."""
    return re.sub(r"\n---\n.*?\n\ndiff --git ", "\n\ndiff --git ", text, count=1, flags=re.S)


PLACEHOLDER = "kzbuild team <team@kzbuild.invalid>"


@pytest.mark.parametrize(
    ("trailers", "env", "author"),
    [
        (
            ("Signed-off-by: Ann Dev <ann@kz.dev>", "Upstream-Status: Pending"),
            {},
            "Ann Dev <ann@kz.dev>",
        ),
        (
            ("Upstream-Status: Pending",),
            {"GIT_AUTHOR_NAME": "Bo Git", "GIT_AUTHOR_EMAIL": "bo@kz.dev"},
            "Bo Git <bo@kz.dev>",
        ),
    ],
)
def test_a_placeholder_author_is_replaced_and_the_separator_added(
    project, upstream, kz, tmp_path, monkeypatch, trailers, env, author
):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    base = upstream.head()
    text = make_patch(
        upstream,
        base,
        {"common/fit.cpp": fit(line5="fixed 5")},
        "common: fix 5",
        body="Why.",
        trailers=trailers,
        author=PLACEHOLDER,
    )
    add_patch(project, "fix.patch", without_separator(text))
    project.recipe("r", commit=base, sources=[file_source(upstream)])
    out = tmp_path / "fix.upstream.patch"
    result = kz("patches", "upstream", "fix.patch", "--recipe", "r", "--no-build", "-o", str(out))
    assert result.code == 0, result.err
    mbox = out.read_text()
    assert "kzbuild.invalid" not in mbox and f"From: {author}\n" in mbox
    assert "\n---\ndiff --git a/common/fit.cpp" in mbox
    clone = tmp_path / "maintainer"
    git(tmp_path, "clone", "-q", str(upstream.path), str(clone))
    git(clone, "checkout", "-q", "--detach", base)
    git(clone, "am", "-q", str(out), env={"GIT_COMMITTER_NAME": "M", "GIT_COMMITTER_EMAIL": "m@x"})
    assert git(clone, "log", "-1", "--format=%an <%ae>|%s") == f"{author}|common: fix 5"
    assert "Upstream-Status" not in git(clone, "log", "-1", "--format=%b")


def test_no_author_anywhere_is_a_config_error_not_a_placeholder(project, upstream, kz, monkeypatch):
    monkeypatch.setenv("GIT_AUTHOR_NAME", "Nobody")
    monkeypatch.setenv("GIT_AUTHOR_EMAIL", "nobody@localhost")
    base = upstream.head()
    text = make_patch(
        upstream,
        base,
        {"common/fit.cpp": fit(line5="fixed 5")},
        "common: fix 5",
        trailers=("Upstream-Status: Pending",),
        author=PLACEHOLDER,
    )
    add_patch(project, "fix.patch", text)
    project.recipe("r", commit=base, sources=[file_source(upstream)])
    result = kz("patches", "upstream", "fix.patch", "--recipe", "r", "--no-build")
    assert result.code != 0 and "Traceback" not in result.err
    assert (
        "fix.patch" in flat(result.err) and "placeholder" in flat(result.err) and result.out == ""
    )


@given(st.text(max_size=60))
def test_an_author_is_a_name_and_a_real_address_or_none(value: str):
    found = real_author(value)
    if found is not None:
        name, email = re.fullmatch(r"(.+) <(\S+@\S+)>", found).groups()  # type: ignore[union-attr]
        domain = email.rsplit("@", 1)[1].lower()
        assert name.strip() and not domain.endswith((".invalid", "localhost", ".test", "(none)"))


def test_placeholders_are_refused_and_people_kept():
    assert real_author(PLACEHOLDER) is None and real_author("kzbuild <kzbuild@localhost>") is None
    assert real_author("root <root@box.(none)>") is None and real_author("<a@b.org>") is None
    assert real_author("A Person <a@example.com>") is None
    assert real_author("Ann Dev <ann@kz.dev> 1733270000 +0000") == "Ann Dev <ann@kz.dev>"
