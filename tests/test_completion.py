"""Shell completion: scripts for bash, zsh and fish, and completions of commands, recipes,
devices and run ids that work in a real bash."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from kzbuild.measure.resultfiles import DEMO_RESULTS
from kzbuild.measure.resultsdb import ResultsStore
from tests.bench.benchkit import record

KZBUILD = Path(sys.prefix) / "bin" / "kzbuild"

pytestmark = pytest.mark.skipif(
    not KZBUILD.is_file(), reason="needs the installed kzbuild entry point"
)


def show_completion(shell: str, cwd: Path) -> str:
    """The script ``--show-completion`` prints in ``shell`` (typer's switch stands in for running it
    from that shell)."""
    env = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    shown = subprocess.run(
        [str(KZBUILD), "--show-completion", shell],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


@pytest.mark.parametrize(
    ("shell", "marker"),
    [
        ("bash", "complete -o default -F _kzbuild_completion kzbuild"),
        ("zsh", "#compdef kzbuild"),
        ("fish", "complete --command kzbuild"),
    ],
)
def test_a_completion_script_is_generated_for_each_shell(project, shell, marker):
    assert marker in show_completion(shell, project.root)


def bash_complete(project: Path, *words: str) -> list[str]:
    """COMPREPLY after the bash completion function ran for ``kzbuild WORDS...`` (the last word is
    the one being completed)."""
    script = show_completion("bash", project)
    line = " ".join(shlex.quote(word) for word in ("kzbuild", *words))
    driver = (
        f"{script}\nCOMP_WORDS=({line})\nCOMP_CWORD={len(words)}\n_kzbuild_completion "
        'kzbuild\nprintf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    env = {**os.environ, "PATH": f"{KZBUILD.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for name in ("KZ_PROJECT", "KZ_RESULTS_DIR", "KZ_WORK_DIR"):
        env.pop(name, None)
    ran = subprocess.run(
        ["bash", "-c", driver], cwd=project, env=env, capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0 and not ran.stderr, ran.stderr
    return [line for line in ran.stdout.splitlines() if line]


def test_bash_completes_commands_recipes_devices_and_run_ids(project):
    project.recipe("demo-host", commit="a" * 40, sources=["path: /nowhere"])
    project.recipe("pad3-v79", commit="a" * 40, sources=["path: /nowhere"])
    project.write(
        "recipes/devices.yaml",
        "devices:\n  pad3:\n    transport: adb\n    serial: X1\n  pad4:\n    transport: adb\n    "
        "serial: X2\n",
    )
    with ResultsStore(project.root / "results") as store:
        store.add(
            [
                record(run_id="20261203T104512Z-3f9a2c"),
                record(run_id="20261204T090000Z-77aa00", host_time="2026-12-04T09:00:00+00:00"),
            ]
        )
    assert bash_complete(project.root, "res") == ["results"]
    assert bash_complete(project.root, "sync", "pad") == ["pad3-v79"]
    assert bash_complete(project.root, "deploy", "--device", "pad") == ["pad3", "pad4"]
    assert bash_complete(project.root, "bench", "--device", "lo") == ["local"]
    assert bash_complete(project.root, "results", "show", "2026120") == [
        "20261203T104512Z-3f9a2c",
        "20261204T090000Z-77aa00",
    ]
    assert bash_complete(project.root, "results", "compare", "20261203T104512Z-3f9a2c", "la") == [
        "latest"
    ]


def test_run_ids_come_from_the_dir_results_show_reads_the_demo_s_when_results_has_none(project):
    with ResultsStore(project.root / ".kz" / DEMO_RESULTS) as store:
        store.add([record(run_id="20261203T104512Z-3f9a2c")])
    assert bash_complete(project.root, "results", "show", "2026") == ["20261203T104512Z-3f9a2c"]


def test_outside_a_project_completion_offers_nothing_and_prints_no_error(tmp_path):
    assert bash_complete(tmp_path, "sync", "") == []


def test_completion_reads_the_project_and_dirs_given_on_the_command_line(project, tmp_path):
    project.recipe("demo-host", commit="a" * 40, sources=["path: /nowhere"])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    words = (
        "--project",
        str(project.root),
        "--cache-dir",
        str(tmp_path / "cache"),
        "--work-dir",
        str(tmp_path / "work"),
        "sync",
        "demo",
    )
    assert bash_complete(elsewhere, *words) == ["demo-host"]


def test_bash_completes_build_targets_the_compile_check_included(project):
    targets = bash_complete(project.root, "build", "--target", "")
    assert targets == ["host", "linux-arm64", "v79", "v79-check"]
    assert bash_complete(project.root, "ci", "-t", "v79") == ["v79", "v79-check"]


def test_completing_a_command_name_loads_no_command_module(project):
    """`kzbuild <TAB>` offers every command from the table: it imports none of their modules
    (it imported all of them, with rich, paramiko and the results store, for their help lines)."""
    from kzbuild.cli import COMMANDS

    report = "print(json.dumps(list(sys.modules)), file=sys.stderr)"
    code = f"import atexit, json, sys\natexit.register(lambda: {report})\n"
    code += "from kzbuild.cli import main\nmain()"
    env = {**os.environ, "_KZBUILD_COMPLETE": "complete_bash", "COMP_WORDS": "kzbuild "}
    env["COMP_CWORD"] = "1"
    ran = subprocess.run(
        [sys.executable, "-c", code],
        cwd=project.root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.stdout.split() == list(COMMANDS)
    loaded = set(json.loads(ran.stderr))
    assert not loaded & {module for module, _ in COMMANDS.values()}
    assert "rich" not in loaded and "paramiko" not in loaded
