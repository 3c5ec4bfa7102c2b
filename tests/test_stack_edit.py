"""``kzbuild patches drop`` and ``move``: safe edits of the series, with a record of drops."""

from __future__ import annotations

from datetime import date, datetime, timezone

import yaml

from kzbuild.source.stack.patchfile import drop_patch, lint_series, read_dropped
from tests.fixtures_stack import add_patch, fit, flat, make_patch


def three(project, upstream):
    base = upstream.head()
    project.write("patches/series", "# stack header\n# b and c both touch fit.cpp\n")
    add_patch(
        project, "a.patch", make_patch(upstream, base, {"ggml/src/ggml.c": "int a;\n"}, "ggml: a")
    )
    add_patch(
        project,
        "b.patch",
        make_patch(
            upstream,
            base,
            {"common/fit.cpp": fit(line5="b")},
            "common: b",
            trailers=("Upstream-Status: Merged 63d93d173", "Kz-Test: t"),
        ),
    )
    add_patch(
        project,
        "c.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line30="c")}, "common: c"),
    )


def series(project) -> str:
    return (project.root / "patches" / "series").read_text()


def test_drop_records_why(project, upstream, kz):
    three(project, upstream)
    result = kz(
        "patches",
        "drop",
        "b.patch",
        "--reason",
        "fixed upstream by PR #22424",
        "--upstream",
        "63d93d173",
    )
    assert result.code == 0, result.err
    assert "dropped b.patch; recorded in patches/DROPPED.yaml" in result.out
    assert not (project.root / "patches" / "b.patch").exists()
    assert series(project) == "# stack header\n# b and c both touch fit.cpp\na.patch\nc.patch\n"
    (record,) = read_dropped(project.root / "patches" / "DROPPED.yaml")
    assert record.patch == "b.patch" and record.subject == "common: b"
    assert record.reason == "fixed upstream by PR #22424" and record.upstream == "63d93d173"
    assert record.upstream_status == "Merged 63d93d173"
    assert record.date == datetime.now(timezone.utc).date().isoformat()

    drop_patch(
        project.root / "patches" / "series", "a.patch", reason="not needed", today=date(2026, 5, 1)
    )
    log = yaml.safe_load((project.root / "patches" / "DROPPED.yaml").read_text())
    assert [r["patch"] for r in log["dropped"]] == ["b.patch", "a.patch"]
    assert log["dropped"][1]["date"] == "2026-05-01"
    assert lint_series(project.root / "patches" / "series")[1] == []


def test_drop_keeps_a_file_another_series_lists(project, upstream, kz):
    three(project, upstream)
    project.write("patches/archive.series", "b.patch\n")
    drop_patch(project.root / "patches" / "archive.series", "b.patch", reason="upstreamed")
    assert (project.root / "patches" / "archive.series").read_text() == ""
    assert (project.root / "patches" / "b.patch").exists()  # patches/series still applies it
    assert lint_series(project.root / "patches" / "series")[1] == []
    drop_patch(project.root / "patches" / "series", "b.patch", reason="upstreamed")
    assert not (project.root / "patches" / "b.patch").exists()


def test_drop_unknown_patch(project, upstream, kz):
    three(project, upstream)
    result = kz("patches", "drop", "bb.patch", "--reason", "x")
    assert result.code == 2  # a name the series lacks is a usage error
    assert "'bb.patch' is not in" in flat(result.err) and "did you mean 'b.patch'?" in flat(
        result.err
    )
    assert not (project.root / "patches" / "DROPPED.yaml").exists()


def test_drop_needs_a_reason(project, upstream, kz):
    three(project, upstream)
    result = kz("patches", "drop", "b.patch")
    assert result.code == 2 and "Missing option '--reason'" in flat(result.err)


def test_drop_refuses_a_damaged_log(project, upstream, kz):
    three(project, upstream)
    project.write("patches/DROPPED.yaml", "dropped: [oops\n")
    result = kz("patches", "drop", "b.patch", "--reason", "x")
    assert result.code == 2 and "DROPPED.yaml:2: invalid YAML" in result.err.replace("\n", "")
    assert (project.root / "patches" / "b.patch").exists()


def test_move_before_and_after(project, upstream, kz):
    three(project, upstream)
    result = kz("patches", "move", "a", "--after", "c")  # ".patch" may be left out
    assert result.code == 0, result.err
    assert (
        series(project)
        == "# stack header\n# b and c both touch fit.cpp\nb.patch\nc.patch\na.patch\n"
    )
    assert "warning" not in result.out  # a touches nothing b and c touch
    kz("patches", "move", "a.patch", "--before", "b.patch")
    assert (
        series(project)
        == "# stack header\n# b and c both touch fit.cpp\na.patch\nb.patch\nc.patch\n"
    )


def test_move_warns_when_crossing_a_patch_on_the_same_file(project, upstream, kz):
    three(project, upstream)
    result = kz("patches", "move", "c.patch", "--before", "b.patch")
    assert "warning: it now crosses b.patch, which touch the same files" in flat(result.out)
    assert series(project).endswith("a.patch\nc.patch\nb.patch\n")


def test_move_comments_travel_with_their_patch(project, upstream, kz):
    three(project, upstream)
    path = project.root / "patches" / "series"
    path.write_text("# header\n\na.patch\n# why b is here\nb.patch  # inline note\nc.patch\n")
    kz("patches", "move", "b.patch", "--after", "c.patch")
    assert (
        path.read_text()
        == "# header\n\na.patch\nc.patch\n# why b is here\nb.patch  # inline note\n"
    )


def test_move_errors(project, upstream, kz):
    three(project, upstream)
    neither = kz("patches", "move", "a.patch")
    assert neither.code == 2 and "--before OTHER or --after OTHER" in flat(neither.err)
    both = kz("patches", "move", "a.patch", "--before", "b.patch", "--after", "c.patch")
    assert both.code == 2
    unknown = kz("patches", "move", "a.patch", "--before", "z.patch")
    assert unknown.code == 2 and "'z.patch' is not in" in flat(unknown.err)
    itself = kz("patches", "move", "a.patch", "--before", "a.patch")
    assert itself.code == 2 and "relative to itself" in itself.err
