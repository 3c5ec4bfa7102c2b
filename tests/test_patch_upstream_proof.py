"""How ``kzbuild patches check`` proves a patch is upstream at the pin itself: without history
only by reverse-apply; with ``--fetch-history`` from a git source, by the ancestry of the commit
its Drop-When names, even when that commit is older than the pin (as the #22424 backport's is)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import git
from tests.fixtures_stack import GOOD_TRAILERS, add_patch, file_source, fit, make_patch


def check_at_pin(kz, *args: str) -> dict:
    result = kz("patches", "check", "r", *args, "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)


def backport_upstream_before_the_pin(
    project, upstream, *, drop_when_digits: int = 40
) -> tuple[str, str]:
    """Upstream fixes line 5, then moves on to the pin; the stack carries a backport whose Drop-When
    names the fix."""
    base = upstream.head()
    fixed = upstream.commit({"common/fit.cpp": fit(line5="fixed 5")}, "common: fix 5")
    pin = upstream.commit({"README.md": "later\n"}, "docs")
    trailers = (*GOOD_TRAILERS, f"Drop-When: {fixed[:drop_when_digits]}")
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
    project.recipe("r", commit=pin, sources=[file_source(upstream)])
    return fixed, pin


def test_without_history_the_proof_is_a_reverse_apply(project, upstream, kz):
    backport_upstream_before_the_pin(project, upstream)
    (result,) = check_at_pin(kz)["patches"]
    assert (result["verdict"], result["proof"]["kind"], result["proof"]["commit"]) == (
        "upstreamed",
        "reverse-apply",
        None,
    )


@pytest.mark.parametrize("digits", [40, 10], ids=["full-sha", "abbreviated-sha"])
def test_fetch_history_proves_drop_when_by_ancestry_at_the_pin(project, upstream, kz, digits):
    fixed, pin = backport_upstream_before_the_pin(project, upstream, drop_when_digits=digits)
    report = check_at_pin(kz, "--fetch-history")
    (result,) = report["patches"]
    assert result["verdict"] == "upstreamed"
    assert result["proof"] == {
        "kind": "drop-when",
        "commit": fixed,
        "detail": f"Drop-When {fixed[:12]} is in the history of {pin[:12]}",
    }
    assert len(report["notes"]) == 1 and report["notes"][0].startswith(
        f"fetched the history {fixed[:12]}..{pin[:12]} from "
    )


def test_fetch_history_says_when_the_drop_when_commit_is_not_upstream(project, upstream, kz):
    base = upstream.head()
    elsewhere = upstream.commit({"README.md": "side\n"}, "docs: side branch")
    git(upstream.path, "branch", "side", elsewhere)
    git(upstream.path, "reset", "-q", "--hard", base)
    upstream.commit({"common/fit.cpp": fit(line5="fixed 5")}, "common: fix 5")
    pin = upstream.commit({"README.md": "later\n"}, "docs")
    trailers = (*GOOD_TRAILERS, f"Drop-When: {elsewhere}")
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
    project.recipe("r", commit=pin, sources=[file_source(upstream)])
    report = check_at_pin(kz, "--fetch-history")
    (result,) = report["patches"]
    assert (
        result["proof"]["kind"] == "reverse-apply"
    )  # the named commit proves nothing; the tree still does
    (note,) = report["notes"]
    assert note.startswith(
        f"{elsewhere[:12]} is not in the history of {pin[:12]} ("
    ) and note.endswith("has all of it)")
