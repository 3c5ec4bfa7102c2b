"""The Kz-Expect trailer: parsed into expectations, checked by patches lint, stripped for
upstream."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kzbuild.model.patch import Expectation
from kzbuild.source.stack.patchfile import (
    expectations,
    parse_patch,
    trailer_problems,
    trailer_value_problem,
    without_kz_trailers,
)
from tests.fixtures_stack import add_patch
from tests.test_stack_lint import lint, with_trailers


def test_expectations_are_read_from_the_trailers_and_may_repeat(project):
    text = with_trailers(
        "Upstream-Status: Pending",
        "Kz-Test: tests/x.py",
        "Kz-Expect: pp512 +10% on pad3",
        "Kz-Expect: tg64 -2.5% on pad3",
    )
    path = add_patch(project, "fast.patch", text)
    patch = parse_patch(text, path, "fast.patch")
    assert expectations(patch) == (
        Expectation(patch="fast.patch", metric="pp512", pct=10.0, device="pad3", line=10),
        Expectation(patch="fast.patch", metric="tg64", pct=-2.5, device="pad3", line=11),
    )
    assert trailer_problems(patch) == []  # given twice is fine for Kz-Expect
    assert expectations(patch)[0].describe() == "pp512 +10% on pad3"
    assert "Kz-Expect" not in without_kz_trailers(patch) and "Kz-Test" not in without_kz_trailers(
        patch
    )


@pytest.mark.parametrize(
    "value",
    [
        "pp512 +10% on pad3",
        "tg64 -3% on pad3",
        "pp512+tg128 +1.5% on arm64-qemu",
        "pp512@d4096 +4% on pad3",
    ],
)
def test_good_values(value):
    assert trailer_value_problem("Kz-Expect", value) is None


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("pp512 10% on pad3", "is not METRIC +N% on DEVICE"),
        ("pp512 +10 on pad3", "is not METRIC +N% on DEVICE"),
        ("pp512 +10%", "is not METRIC +N% on DEVICE"),
        ("prefill +10% on pad3", "is not METRIC +N% on DEVICE"),
        ("pp512 +10% on pad3 please", "is not METRIC +N% on DEVICE"),
        ("pp512 +0% on pad3", "can never be contradicted"),
        ("pp\u0665\u0661\u0662 +10% on pad3", "is not METRIC +N% on DEVICE"),
        ("", "Kz-Expect is empty"),
    ],
)
def test_bad_values_are_lint_problems(value, said):
    assert said in (trailer_value_problem("Kz-Expect", value) or "")


def test_lint_names_the_line_of_a_bad_kz_expect(project, kz):
    add_patch(
        project,
        "fast.patch",
        with_trailers(
            "Upstream-Status: Pending", "Kz-Test: tests/x.py", "Kz-Expect: pp512 faster on pad3"
        ),
    )
    code, problems = lint(kz)
    assert code != 0
    assert any(
        p.startswith("fast.patch:10: Kz-Expect 'pp512 faster on pad3' is not METRIC +N% on DEVICE")
        for p in problems
    ), problems
    assert (
        expectations(
            parse_patch(
                (project.root / "patches" / "fast.patch").read_text(),
                project.root / "patches" / "fast.patch",
            )
        )
        == ()
    )


@given(st.text(max_size=40))
def test_any_value_is_either_a_lint_problem_or_an_expectation(value):
    from pathlib import Path

    from kzbuild.model.patch import Patch, Trailer

    patch = Patch(
        name="p.patch",
        path=Path("p.patch"),
        author="a",
        date="d",
        subject="s",
        body="",
        trailers=(Trailer("Kz-Expect", value, 7),),
        files=(),
    )
    problem = trailer_value_problem("Kz-Expect", value)
    found = expectations(patch)
    assert (problem is None) == (len(found) == 1), (value, problem, found)
    for expectation in found:
        assert expectation.pct != 0 and expectation.describe().split()[0] == expectation.metric
