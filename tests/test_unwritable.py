"""Unwritable places: a read-only work, cache or results dir, and a work dir path that is not UTF-8,
give one error naming the path, with a documented exit code, never an internal error."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kzbuild.cli import main
from kzbuild.errors import ConfigError, Unwritable
from tests.conftest import have
from tests.fixtures_build import Tiny


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """An empty read-only tmpfs (root writes through permission bits); skipped where mounting is
    not permitted."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "kz-test", str(folder)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or 'mount failed'}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def kz(tiny: Tiny, capsys: pytest.CaptureFixture[str], *args: str, **dirs: Path) -> tuple[int, str]:
    project = tiny.project
    folders = {"cache": project.cache, "work": project.work, **dirs}
    capsys.readouterr()
    code = main(
        [
            "--project",
            str(project.root),
            "--cache-dir",
            str(folders["cache"]),
            "--work-dir",
            str(folders["work"]),
            *args,
        ]
    )
    return code, " ".join(capsys.readouterr().err.split())


pytestmark = pytest.mark.skipif(
    not (have("cmake") and have("ninja") and have("gcc")), reason="needs cmake, ninja, gcc"
)


@pytest.mark.parametrize("place", ["work", "cache", "work-inside", "cache-inside"])
def test_a_read_only_dir_is_one_error_naming_it_with_exit_14(tiny, capsys, read_only, place):
    folder = read_only / "kz" if place.endswith("inside") else read_only
    code, err = kz(tiny, capsys, "build", "tiny", **{place.removesuffix("-inside"): folder})
    assert code == Unwritable.exit_code == 14, err
    assert f"{read_only}" in err and "Read-only file system" in err and "internal error" not in err


def test_a_read_only_results_dir_is_one_error_naming_it(tiny, capsys, read_only):
    code, err = kz(tiny, capsys, "--results-dir", str(read_only), "results", "list")
    assert code in (Unwritable.exit_code, ConfigError.exit_code), err
    assert str(read_only) in err and "internal error" not in err


@pytest.mark.parametrize("option", ["--work-dir", "--cache-dir", "--results-dir"])
def test_a_path_that_is_not_utf8_is_refused_up_front_naming_it(tiny, capsys, tmp_path, option):
    odd = Path(os.fsdecode(bytes(tmp_path) + b"/not-utf8-\xff"))
    capsys.readouterr()
    project = tiny.project
    args = {
        "--work-dir": str(project.work),
        "--cache-dir": str(project.cache),
        "--results-dir": str(project.root / "results"),
    }
    args[option] = str(odd)
    code = main(
        ["--project", str(project.root), *(x for pair in args.items() for x in pair), "recipes"]
    )
    err = " ".join(capsys.readouterr().err.split())
    assert code == ConfigError.exit_code and "is not a UTF-8 path" in err and "\\xff" in err, err
    assert not os.path.exists(os.fsencode(odd))
