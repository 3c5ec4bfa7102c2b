"""scripts/setup says each step in one line; a step's own output shows only when it fails."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

from tests.conftest import REPO_ROOT


def stub(path: Path, script: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run_setup(tmp_path: Path, pip_script: str) -> subprocess.CompletedProcess[str]:
    """scripts/setup in a copy of the repo's layout, with every apt package installed, a venv
    python that runs ``pip_script`` and an npm that says it installed a package."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO_ROOT / "scripts" / "setup", tmp_path / "scripts" / "setup")
    stub(tmp_path / "bin" / "dpkg-query", "printf 'install ok installed'\n")
    stub(tmp_path / "venv" / "bin" / "python", pip_script)
    stub(tmp_path / "bin" / "npm", "echo 'added 1 package in 0.4s'\n")
    env = {
        **os.environ,
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "KZ_VENV": str(tmp_path / "venv"),
    }
    return subprocess.run(
        ["bash", str(tmp_path / "scripts" / "setup")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_setup_says_each_step_and_nothing_of_their_output_when_every_step_succeeds(tmp_path):
    ran = run_setup(tmp_path, "echo 'Collecting typer'\necho 'WARNING: Location ignored' >&2\n")
    assert (ran.returncode, ran.stdout) == (0, "")
    lines = ran.stderr.splitlines()
    assert all(line.startswith("setup: ") for line in lines), lines
    assert [line.split(":")[1].strip() for line in lines] == [
        "apt",
        "venv",
        "pip",
        "toybox",
        "npm",
        "done",
    ]
    assert all(said not in ran.stderr for said in ("Collecting", "WARNING", "added"))


def test_setup_prints_the_failing_step_and_its_output(tmp_path):
    ran = run_setup(
        tmp_path,
        "echo 'Collecting nosuchpkg'\necho 'ERROR: No matching distribution found for nosuchpkg' "
        ">&2\nexit 1\n",
    )
    assert ran.returncode == 1 and ran.stdout == ""
    venv_python = tmp_path / "venv" / "bin" / "python"
    assert [line for line in ran.stderr.splitlines() if not line.startswith("setup: ")] == [
        f"scripts/setup: this step failed: {venv_python} -m pip install -q "
        "--disable-pip-version-check -e .[test]",
        "Collecting nosuchpkg",
        "ERROR: No matching distribution found for nosuchpkg",
    ]
