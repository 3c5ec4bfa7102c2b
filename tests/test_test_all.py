"""scripts/test-all runs the tests as on a fresh machine: an empty HOME and no git identity, with
this machine's caches and pip configuration kept where they are."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.conftest import REPO_ROOT
from tests.test_setup_script import stub

SEEN = (
    "HOME",
    "XDG_CACHE_HOME",
    "KZ_TEST_CACHE",
    "CCACHE_DIR",
    "PIP_CONFIG_FILE",
    "PIP_FIND_LINKS",
    "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_NOSYSTEM",
    "GIT_AUTHOR_NAME",
    "EMAIL",
)


def run_test_all(
    tmp_path: Path, env: dict[str, str]
) -> tuple[subprocess.CompletedProcess[str], list[dict[str, str]]]:
    """scripts/test-all in a copy of the repo's layout, whose setup does nothing and whose venv
    python
    records, for each pytest tier, the environment it ran in (and whether HOME was empty)."""
    (tmp_path / "repo" / "scripts").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "scripts" / "test-all", tmp_path / "repo" / "scripts" / "test-all")
    stub(tmp_path / "repo" / "scripts" / "setup", "exit 0\n")
    stub(tmp_path / "repo" / "scripts" / "check-commits", "exit 0\n")
    record = tmp_path / "tiers"
    lines = " ".join(f'"{name}=${{{name}-<unset>}}"' for name in SEEN)
    stub(
        tmp_path / "venv" / "bin" / "python",
        f'[ "$2" = pytest ] || exit 0\n{{ printf "%s\\t" {lines} "home_files=$(ls -A "$HOME" | wc '
        f'-l)"; echo; }} >> {record}\n',
    )
    ran = subprocess.run(
        ["bash", str(tmp_path / "repo" / "scripts" / "test-all")],
        env={**env, "KZ_VENV": str(tmp_path / "venv")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    tiers = [
        dict(item.split("=", 1) for item in line.rstrip("\t").split("\t"))
        for line in record.read_text().splitlines()
    ]
    return ran, tiers


def test_tests_run_with_an_empty_home_no_git_identity_and_the_machines_caches(tmp_path):
    home = tmp_path / "home"
    (home / ".config" / "pip").mkdir(parents=True)
    (home / ".config" / "pip" / "pip.conf").write_text("[global]\nfind-links = /somewhere\n")
    (home / ".gitconfig").write_text("[user]\n\tname = The Machine\n")
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(home),
        "GIT_AUTHOR_NAME": "The Machine",
        "EMAIL": "m@x",
        "PIP_FIND_LINKS": "/opt/wheels",
    }
    ran, tiers = run_test_all(tmp_path, env)
    assert ran.returncode == 0, ran.stderr
    assert len(tiers) == 2 and tiers[0] == tiers[1]  # the fast tier, then the slow one, alike
    seen = tiers[0]
    assert seen["HOME"] != str(home) and seen["home_files"] == "0"
    assert not Path(seen["HOME"]).exists()  # removed after the run
    assert seen["XDG_CACHE_HOME"] == f"{home}/.cache"
    assert seen["KZ_TEST_CACHE"] == f"{home}/.cache/kzbuild-test"
    assert seen["CCACHE_DIR"] == f"{home}/.cache/ccache"
    assert (
        seen["PIP_CONFIG_FILE"] == f"{home}/.config/pip/pip.conf"
        and seen["PIP_FIND_LINKS"] == "/opt/wheels"
    )
    assert (seen["GIT_CONFIG_GLOBAL"], seen["GIT_CONFIG_NOSYSTEM"]) == ("/dev/null", "1")
    assert (seen["GIT_AUTHOR_NAME"], seen["EMAIL"]) == ("<unset>", "<unset>")


def test_caches_and_pip_config_set_by_the_caller_are_kept(tmp_path):
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path / "home"),
        "XDG_CACHE_HOME": str(tmp_path / "xdg"),
        "KZ_TEST_CACHE": str(tmp_path / "kzt"),
        "PIP_CONFIG_FILE": os.devnull,
    }
    ran, tiers = run_test_all(tmp_path, env)
    assert ran.returncode == 0, ran.stderr
    seen = tiers[0]
    assert (seen["XDG_CACHE_HOME"], seen["KZ_TEST_CACHE"]) == (
        str(tmp_path / "xdg"),
        str(tmp_path / "kzt"),
    )
    assert (
        seen["CCACHE_DIR"] == f"{tmp_path / 'xdg'}/ccache" and seen["PIP_CONFIG_FILE"] == os.devnull
    )
