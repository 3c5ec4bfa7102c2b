"""The backported "unaccounted" fix (upstream PR #22424), proven on the arithmetic it changes.

The Hexagon device reports total = free = 0, so before the fix common_memory_breakdown_print
showed -self wrapped to size_t: the team saw "unaccounted 17592186042685" MiB, 2^44 - 1731,
for 1731 MiB of HTP buffers. The test cuts the two statements that compute and print the
device row's unaccounted figure out of common/fit.cpp, compiles them into a host program and
feeds them that device. It runs them from the archive recipe's tree before the patch (its
base), after it, and from the pin, where upstream has the fix.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from kzbuild.source.sync import BASE_REF
from tests.conftest import git

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
TEAM_SELF_MIB = 1731  # the team's HTP0 buffers: 2^44 - 1731 = 17592186042685
PROGRAM = """\
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

// One device row of common_memory_breakdown_print: the statements below are cut from common/fit.cpp.
int main(int argc, char ** argv) {
    (void) argc;
    constexpr size_t MiB = 1024 * 1024;
    const size_t total = std::stoull(argv[1]);
    const size_t free  = std::stoull(argv[2]);
    struct { size_t model, context, compute; } mb = { std::stoull(argv[3]), 0, 0 };
    %(statements)s
    std::puts(std::to_string(%(printed)s).c_str());
    return 0;
}
"""


def unaccounted_program(fit_cpp: str, out: Path) -> Path:
    """Compile the device-row arithmetic of a common/fit.cpp into a program: total free self ->
    printed."""
    self_stmt = re.search(
        r"^\s*(const size_t self = mb\.model \+ mb\.context \+ mb\.compute;)$", fit_cpp, re.M
    )
    unaccounted_stmt = re.search(r"^\s*(const \w+ unaccounted = [^;]+;)$", fit_cpp, re.M)
    printed = re.search(r"std::to_string\((unaccounted / [^;]*?)\)\}\);", fit_cpp)
    assert self_stmt and unaccounted_stmt and printed, (
        "common/fit.cpp no longer has the device row's unaccounted arithmetic"
    )
    source = out.with_suffix(".cpp")
    source.write_text(
        PROGRAM
        % {
            "statements": f"{self_stmt.group(1)}\n    {unaccounted_stmt.group(1)}",
            "printed": printed.group(1),
        }
    )
    result = subprocess.run(
        ["g++", "-std=c++17", "-Wall", "-Werror", str(source), "-o", str(out)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    return out


def printed_unaccounted(program: Path, *, total: int, free: int, self_bytes: int) -> int:
    result = subprocess.run(
        [program, str(total), str(free), str(self_bytes)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(result.stdout)


def test_unaccounted_prints_negative_not_2_pow_44(archive_tree: Path, tmp_path: Path):  # noqa: F811
    before = unaccounted_program(
        git(archive_tree, "show", f"{BASE_REF}:common/fit.cpp"), tmp_path / "before"
    )
    after = unaccounted_program(
        (archive_tree / "common" / "fit.cpp").read_text(), tmp_path / "after"
    )
    hexagon = {"total": 0, "free": 0, "self_bytes": TEAM_SELF_MIB * MiB}
    assert printed_unaccounted(before, **hexagon) == 17_592_186_042_685 == 2**44 - TEAM_SELF_MIB
    assert printed_unaccounted(after, **hexagon) == -TEAM_SELF_MIB
    # a device that does report its memory prints the same before and after
    gpu = {"total": 16269 * MiB, "free": 15935 * MiB, "self_bytes": 200 * MiB}
    assert printed_unaccounted(before, **gpu) == printed_unaccounted(after, **gpu) == 134


def test_the_pin_already_has_the_fix(pin_tree: Path, tmp_path: Path):  # noqa: F811
    program = unaccounted_program((pin_tree / "common" / "fit.cpp").read_text(), tmp_path / "pin")
    assert (
        printed_unaccounted(program, total=0, free=0, self_bytes=TEAM_SELF_MIB * MiB)
        == -TEAM_SELF_MIB
    )


def test_the_archive_recipe_applies_the_backport(archive_tree: Path):  # noqa: F811
    subjects = git(archive_tree, "log", "--format=%s", f"{BASE_REF}..HEAD").splitlines()
    assert subjects == ["common: signed unaccounted memory (backport #22424)"]
