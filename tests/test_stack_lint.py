"""``kzbuild patches lint`` and ``list``: every lint error names the file and the line."""

from __future__ import annotations

import json

import pytest

from kzbuild.source.stack.patchfile import parse_patch, patch_file_name, read_patch
from tests.fixtures_stack import add_patch, file_source, fit, make_patch

# A real `git format-patch --full-index` of the `upstream` fixture (blob ids match its fit.cpp).
GOOD = """\
From 6851388d2f99d9c1e74fe753055a3b1986bb1c6e Mon Sep 17 00:00:00 2001
From: Kz Dev <dev@kz.example>
Date: Thu, 16 Nov 2023 02:00:00 +0000
Subject: [PATCH] common: fix 5

Why it matters.

Upstream-Status: Pending
Kz-Test: tests/test_fit.py::test_breakdown
---
 common/fit.cpp | 2 +-
 1 file changed, 1 insertion(+), 1 deletion(-)

diff --git a/common/fit.cpp b/common/fit.cpp
index 4897e14d4c5425cdc1ed04fdd766d746a9ba533a..2fbe3ffe75acb4406eeaa5af9ac97106fe946a0d 100644
--- a/common/fit.cpp
+++ b/common/fit.cpp
@@ -2,7 +2,7 @@
 // line 2
 // line 3
 // line 4
-// line 5
+fixed 5
 // line 6
 // line 7
 // line 8
--\x20
2.39.5
"""


def lint(kz, *args: str) -> tuple[int, list[str]]:
    result = kz("patches", "lint", *args, "--json")
    problems = json.loads(result.out)
    return result.code, [
        f"{p['file'].rsplit('/', 1)[-1]}:{p['line']}: {p['message']}" for p in problems
    ]


def with_trailers(*lines: str) -> str:
    return GOOD.replace(
        "Upstream-Status: Pending\nKz-Test: tests/test_fit.py::test_breakdown\n",
        "".join(f"{line}\n" for line in lines),
    )


def test_good_patch_parses_and_passes(project, kz):
    add_patch(project, "fix.patch", GOOD)
    patch = read_patch(project.root / "patches" / "fix.patch")
    assert patch.subject == "common: fix 5"  # [PATCH] is stripped, as git am does
    assert patch.author == "Kz Dev <dev@kz.example>"
    assert patch.upstream_status == "Pending"
    assert [(f.path, f.added, f.removed, f.full_index) for f in patch.files] == [
        ("common/fit.cpp", 1, 1, True)
    ]
    assert patch.files[0].hunks[0].line == 18
    code, problems = lint(kz)
    assert (code, problems) == (0, [])
    assert "ok: 1 patch(es), no problems" in kz("patches", "lint").out


@pytest.mark.parametrize(
    ("trailers", "expected"),
    [
        (("Upstream-Status: Pending",), ["fix.patch:8: missing trailer 'Kz-Test:'"]),
        (("Kz-Test: t",), ["fix.patch:8: missing trailer 'Upstream-Status:'"]),
        (
            ("Upstream-Status: Done", "Kz-Test: t"),
            [
                "fix.patch:8: Upstream-Status 'Done' is not one of Pending, Submitted, Backport, "
                "Inappropriate, Merged"
            ],
        ),
        (
            ("Upstream-Status: Pendng", "Kz-Test: t"),
            [
                "fix.patch:8: Upstream-Status 'Pendng' is not one of Pending, Submitted, Backport, "
                "Inappropriate, Merged; did you mean 'Pending'?"
            ],
        ),
        (
            ("Upstream-Status: Pending soon", "Kz-Test: t"),
            ["fix.patch:8: Upstream-Status Pending takes nothing after it (got 'soon')"],
        ),
        (
            ("Upstream-Status: Submitted PR 22424", "Kz-Test: t"),
            [
                "fix.patch:8: Upstream-Status Submitted needs the URL of the upstream PR or mail "
                "(got 'PR 22424')"
            ],
        ),
        (
            ("Upstream-Status: Backport soon", "Kz-Test: t"),
            ["fix.patch:8: Upstream-Status Backport needs an upstream sha or PR URL (got 'soon')"],
        ),
        (
            ("Upstream-Status: Merged yes", "Kz-Test: t"),
            [
                "fix.patch:8: Upstream-Status Merged needs the upstream commit sha (7 to 40 hex; "
                "got 'yes')"
            ],
        ),
        (
            ("Upstream-Status: Inappropriate", "Kz-Test: t"),
            ["fix.patch:8: Upstream-Status Inappropriate needs a reason after it"],
        ),
        (
            ("Upstream-Status: Pending", "Kz-Test: t", "Upstream-PR: #22424"),
            ["fix.patch:10: Upstream-PR needs a URL (got '#22424')"],
        ),
        (
            ("Upstream-Status: Pending", "Kz-Test: t", "Drop-When: next release"),
            [
                "fix.patch:10: Drop-When needs an upstream commit sha (7 to 40 hex; got 'next "
                "release')"
            ],
        ),
        (("Upstream-Status: Pending", "Kz-Test:"), ["fix.patch:9: Kz-Test is empty"]),
        (
            ("Upstream-Status: Pending", "Kz-Test: a", "Kz-Test: b"),
            ["fix.patch:10: Kz-Test is given twice (first on line 9)"],
        ),
        (
            ("Upstream-Stauts: Pending", "Kz-Test: t"),
            [
                "fix.patch:8: unknown trailer 'Upstream-Stauts'; did you mean 'Upstream-Status'?",
                "fix.patch:9: missing trailer 'Upstream-Status:'",
            ],
        ),
        (
            ("Upstream-Status: Pending", "kz-test: t"),
            [
                "fix.patch:9: unknown trailer 'kz-test'; did you mean 'Kz-Test'?",
                "fix.patch:9: missing trailer 'Kz-Test:'",
            ],
        ),
        (
            ("Upstream-Status: Pending", "Kz-Test: t", "this is prose"),
            ["fix.patch:10: line in the trailer block is not a 'Key: value' trailer"],
        ),
        (
            ("Upstream-Status: Pending", "Kz-Test: t", "Kz-Device-Test: /system/bin/sh -c x"),
            [
                "fix.patch:10: Kz-Device-Test '/system/bin/sh -c x' does not start with a tool of "
                "the release (e.g. 'test-backend-ops -o GATED_DELTA_NET -b HTP0')"
            ],
        ),
        (
            ("Upstream-Status: Pending", "Kz-Test: t", "Kz-Device-Test: test-backend-ops -o 'GDN"),
            [
                "fix.patch:10: Kz-Device-Test 'test-backend-ops -o 'GDN' cannot be split into "
                "arguments: No closing quotation"
            ],
        ),
        (
            ("Upstream-Status: Pending", "Kz-Test: t", "Kz-Device-Tset: test-backend-ops"),
            ["fix.patch:10: unknown trailer 'Kz-Device-Tset'; did you mean 'Kz-Device-Test'?"],
        ),
    ],
)
def test_trailer_errors(project, kz, trailers, expected):
    add_patch(project, "fix.patch", with_trailers(*trailers))
    code, problems = lint(kz)
    assert problems == expected
    assert code == 5


def test_other_trailers_and_continuations_are_fine(project, kz):
    add_patch(
        project,
        "fix.patch",
        with_trailers(
            "Upstream-Status: Submitted",
            "  https://github.com/ggml-org/llama.cpp/pull/1",
            "Signed-off-by: A <a@b>",
            "Kz-Test: t",
        ),
    )
    assert lint(kz) == (0, [])
    assert (
        read_patch(project.root / "patches" / "fix.patch").upstream_status
        == "Submitted https://github.com/ggml-org/llama.cpp/pull/1"
    )


def test_no_trailer_block(project, kz):
    add_patch(project, "fix.patch", with_trailers())
    code, problems = lint(kz)
    assert problems == [
        "fix.patch:None: missing trailer 'Upstream-Status:'",
        "fix.patch:None: missing trailer 'Kz-Test:'",
    ]
    text = kz("patches", "lint").out
    assert "patches/fix.patch: missing trailer 'Upstream-Status:'" in text


def test_series_and_files_must_match(project, kz):
    add_patch(project, "fix.patch", GOOD)
    project.write("patches/stray.patch", GOOD)
    series = project.root / "patches" / "series"
    series.write_text(series.read_text() + "gone.patch\nfix.patch\n../escape.patch\n")
    code, problems = lint(kz)
    assert problems == [
        "series:2: patch file 'gone.patch' does not exist",
        "series:3: 'fix.patch' is listed twice (first on line 1)",
        "series:4: '../escape.patch' lies outside the series folder",
        "stray.patch:None: patch file is not listed in any series file (series)",
    ]
    assert code == 5
    result = kz("patches", "lint")
    assert "lint found 4 problem(s)" in result.err


def test_a_patch_listed_by_another_series_file_is_not_stray(project, upstream, kz):
    add_patch(project, "fix.patch", GOOD)
    project.write("patches/old.patch", GOOD.replace("+fixed 5", "+old 5"))
    project.write("patches/archive.series", "# an archive recipe's own stack\nold.patch\n")
    assert lint(kz) == (0, [])
    project.recipe(
        "arch",
        commit=upstream.head(),
        sources=[file_source(upstream)],
        extra="patches: patches/archive.series\n",
    )
    assert (
        "ok: 1 patch(es), no problems" in kz("patches", "lint", "--recipe", "arch").out
    )  # its own series
    rows = json.loads(kz("patches", "list", "--recipe", "arch", "--json").out)
    assert [r["patch"] for r in rows] == ["old.patch"]
    project.write("patches/stray.patch", GOOD)
    assert lint(kz)[1] == [
        "stray.patch:None: patch file is not listed in any series file (archive.series, series)"
    ]


def test_crlf_damage(project, kz):
    add_patch(project, "fix.patch", GOOD.replace("\n", "\r\n"))
    code, problems = lint(kz)
    assert problems[-1].startswith("fix.patch:1: CRLF line ending and ")
    assert code == 5


def test_crlf_inside_hunk_content_is_not_damage(project, kz):
    add_patch(project, "fix.patch", GOOD.replace("+fixed 5\n", "+fixed 5\r\n"))
    assert lint(kz) == (0, [])


def test_abbreviated_index_line(project, kz):
    short = GOOD.replace(
        "4897e14d4c5425cdc1ed04fdd766d746a9ba533a..2fbe3ffe75acb4406eeaa5af9ac97106fe946a0d",
        "4897e14..2fbe3ff",
    )
    add_patch(project, "fix.patch", short)
    assert lint(kz)[1] == [
        "fix.patch:15: abbreviated index line: git am -3 needs full blob ids (format-patch "
        "--full-index)"
    ]


def test_no_diff(project, kz):
    add_patch(project, "fix.patch", GOOD.split("diff --git")[0])
    assert lint(kz)[1] == [
        "fix.patch:None: the patch changes nothing (no diff): git am refuses empty patches"
    ]


def test_not_an_mbox(project, kz):
    add_patch(project, "fix.patch", GOOD.split("\n", 1)[1])
    assert lint(kz)[1] == [
        "fix.patch:1: not a git format-patch mbox: the first line must be 'From <40-hex sha> "
        "<date>'"
    ]


def test_missing_subject_header(project, kz):
    add_patch(project, "fix.patch", GOOD.replace("Subject: [PATCH] common: fix 5\n", ""))
    assert lint(kz)[1] == ["fix.patch:1: the mail header has no 'Subject:' line"]


def test_two_patches_in_one_file(project, kz):
    add_patch(project, "fix.patch", GOOD + GOOD)
    assert lint(kz)[1] == ["fix.patch:29: a second patch starts here: keep one patch per file"]


def test_hunk_shorter_than_its_header(project, kz):
    add_patch(project, "fix.patch", GOOD.replace(" // line 7\n // line 8\n", ""))
    assert lint(kz)[1] == [
        "fix.patch:18: hunk ends early (at line 26): its @@ header counts more lines than follow"
    ]


def test_damaged_dropped_log(project, kz):
    add_patch(project, "fix.patch", GOOD)
    project.write(
        "patches/DROPPED.yaml",
        "dropped:\n  - patch: old.patch\n    date: 2026-01-01\n    reasn: typo\n",
    )
    assert lint(kz)[1] == ["DROPPED.yaml:4: reasn: unknown key in dropped patch"]


def test_fuzz_and_upstreamed_at_the_pin(project, upstream, kz):
    base = upstream.head()
    add_patch(
        project,
        "fuzzy.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line5="fixed 5")}, "common: fix 5"),
    )
    add_patch(
        project,
        "done.patch",
        make_patch(
            upstream,
            base,
            {"ggml/src/ggml.c": "int ggml_answer(void) { return 41; }\n"},
            "ggml: 41",
        ),
    )
    project.recipe("r", commit=base, sources=[file_source(upstream)])
    assert kz("sync", "r").code == 0  # the team synced the old pin once: its blobs are in the cache
    pin = upstream.commit(
        {
            "common/fit.cpp": fit(line7="drift 7"),
            "ggml/src/ggml.c": "int ggml_answer(void) { return 41; }\n",
        },
        "upstream",
    )
    project.recipe("r", commit=pin, sources=[file_source(upstream)])  # then moved the pin by hand
    assert lint(kz)[0] == 0  # without a recipe: only what the files say
    code, problems = lint(kz, "--recipe", "r")
    assert code == 5
    assert problems[0].startswith(
        f"fuzzy.patch:16: applies to {pin[:12]} (the pin of the recipe) only with fuzz (context "
        "reduced to 1 lines)"
    )
    assert problems[0].endswith("refresh it: kzbuild sync, then kzbuild patches export")
    assert problems[1] == (
        f"done.patch:None: is already upstream at {pin[:12]} (the pin of the recipe) "
        f"(reverse-apply: reverse-applies cleanly on {pin[:12]}); drop it: kzbuild patches drop "
        "done.patch --reason ..."
    )


def test_list_shows_status_files_and_counts(project, upstream, kz):
    base = upstream.head()
    add_patch(
        project,
        "fix.patch",
        make_patch(
            upstream,
            base,
            {"common/fit.cpp": fit(line5="a", line30="b"), "README.md": None},
            "common: two",
        ),
    )
    add_patch(project, "bad.patch", with_trailers("Upstream-Status: Pending"))
    project.recipe("r", commit=base, sources=[file_source(upstream)])
    rows = json.loads(kz("patches", "list", "--json").out)
    assert rows[0] == {
        "patch": "fix.patch",
        "subject": "common: two",
        "status": "ok",
        "upstream_status": "Pending",
        "files": ["README.md", "common/fit.cpp"],
        "added": 2,
        "removed": 3,
    }
    assert rows[1]["status"] == "1 lint problem(s)"
    kz("sync", "r")  # bad.patch does not apply: sync stops there, after fix.patch
    rows = json.loads(kz("patches", "list", "--recipe", "r", "--json").out)
    assert rows[0]["synced"] == "not in the lock"
    table = kz("patches", "list").out
    assert "fix.patch" in table and "+2 -3" in table


def test_parse_folded_and_encoded_subject(tmp_path):
    text = GOOD.replace(
        "Subject: [PATCH] common: fix 5\n",
        "Subject: [PATCH v2 1/3] =?UTF-8?q?common:=20caf=C3=A9?=\n and more\n",
    )
    patch = parse_patch(text, tmp_path / "x.patch")
    assert patch.subject == "common: café and more"


def test_patch_file_names_from_subjects():
    assert (
        patch_file_name("common: fix size_t underflow in memory breakdown!", set())
        == "common-fix-size_t-underflow-in-memory-breakdown.patch"
    )
    assert patch_file_name("x", {"x.patch"}) == "x-2.patch"
    assert patch_file_name("...", set()) == "patch.patch"
