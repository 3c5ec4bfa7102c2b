"""Every kzbuild command README.md shows runs, and exits as README says (0 unless its comment
says "exit N").

The fast tier runs them in README's order on a stand-in for the built-in default: a tiny
llama.cpp-shaped upstream (a real cmake build in seconds, whose llama-bench prints llama-bench
JSON) under the recipe name demo-host, with one patch in its stack, and the `local` device. The
commands that need a real llama.cpp build (kz-profile) run in the slow tier on the real
demo-host build instead.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from kzbuild.measure.tinymodel import write_tiny_model
from kzbuild.model.build import BuildResult
from tests.ab.conftest import SPEED, make_bench_tiny
from tests.conftest import REPO_ROOT, Project, UpstreamRepo
from tests.fixtures_build import Tiny

NEEDS_LLAMA = ("profile",)  # kz-profile is built from llama.cpp's own libraries: the slow tier


@dataclass(frozen=True)
class Shown:
    line: int
    program: str  # kzbuild, or scripts/kzbuild (the wrapper)
    argv: tuple[str, ...]
    exit_code: int

    def __str__(self) -> str:
        return f"README.md:{self.line}: {self.program} {shlex.join(self.argv)}"


def shown_commands(text: str) -> list[Shown]:
    """The kzbuild lines of README's ```sh blocks, with the exit code each comment names."""
    commands, in_block = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            in_block = line == "```sh" and not in_block
            continue
        if in_block and line.startswith(("kzbuild ", "scripts/kzbuild ")):
            command, _, comment = line.partition("  #")
            expected = re.search(r"\bexit (\d+)\b", comment)
            program, *argv = shlex.split(command)
            commands.append(
                Shown(number, program, tuple(argv), int(expected[1]) if expected else 0)
            )
    return commands


README = shown_commands((REPO_ROOT / "README.md").read_text(encoding="utf-8"))


def test_readme_shows_the_everyday_commands():
    shown = {command.argv[0] for command in README}
    everyday = {
        "sync",
        "status",
        "patches",
        "build",
        "deploy",
        "models",
        "run",
        "bench",
        "results",
        "ab",
        "profile",
    }
    assert everyday <= shown, everyday - shown


def test_the_parser_reads_commands_their_exit_codes_and_nothing_outside_sh_blocks():
    text = (
        "```sh\nkzbuild a  # ok\nkzbuild b x  # exit 5 today\n```\nkzbuild c\n```text\nkzbuild "
        "d\n```\n"
    )
    text += "```sh\nscripts/kzbuild e\n```\n"
    shown = [(c.program, c.argv, c.exit_code) for c in shown_commands(text)]
    assert shown == [
        ("kzbuild", ("a",), 0),
        ("kzbuild", ("b", "x"), 5),
        ("scripts/kzbuild", ("e",), 0),
    ]


def test_every_relative_link_of_the_readme_and_docs_names_a_file():
    pages = [REPO_ROOT / "README.md", REPO_ROOT / "benchmarks" / "README.md"]
    pages += sorted((REPO_ROOT / "docs").glob("*.md"))
    broken = [
        f"{page.relative_to(REPO_ROOT)}: {target}"
        for page in pages
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8"))
        if not (page.parent / target).exists()
    ]
    assert not broken, broken


@pytest.fixture
def demo_stand_in(project: Project, upstream: UpstreamRepo) -> Tiny:
    tiny = make_bench_tiny(project, upstream, recipe="demo-host", extra="device: local\n")
    faster = SPEED.replace("100.0", "120.0")
    trailers = "\n\nUpstream-Status: Pending\nKz-Test: tests/test_readme.py"
    tiny.add_patch("faster.patch", {"ggml/src/ggml.c": faster}, "ggml: faster" + trailers)
    return tiny


def test_every_command_readme_shows_exits_as_readme_says(kz, demo_stand_in, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # files the commands name (tiny.gguf, plot.png) land here
    project = demo_stand_in.project
    wrapper_env = {**os.environ, "KZ_VENV": sys.prefix, "KZ_PROJECT": str(project.root)}
    wrapper_env |= {"KZ_CACHE_DIR": str(project.cache), "KZ_WORK_DIR": str(project.work)}
    ran = []
    for command in README:
        if command.argv[0] in NEEDS_LLAMA:
            continue
        if command.program == "scripts/kzbuild":
            wrapper = [str(REPO_ROOT / command.program), *command.argv]
            done = subprocess.run(
                wrapper, env=wrapper_env, capture_output=True, text=True, timeout=300
            )
            code, err = done.returncode, done.stderr
        else:
            result = kz(*command.argv)
            code, err = result.code, result.err
        assert code == command.exit_code, f"{command}: exit {code}\n{err}"
        ran.append(command.program)
    assert "scripts/kzbuild" in ran and (tmp_path / "plot.png").is_file()


@pytest.mark.slow
def test_readme_s_commands_that_need_llama_cpp_run_on_the_real_build(
    kz, real_host_build: BuildResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    slow = [command for command in README if command.argv[0] in NEEDS_LLAMA]
    assert slow
    # what README's earlier commands did: the build on the local device, the tiny model pushed
    assert (
        kz("deploy", "--device", "local", "--artifact", str(real_host_build.artifact.path)).code
        == 0
    )
    write_tiny_model(tmp_path / "tiny.gguf", arch="qwen35", ftype="q4_0")
    assert kz("models", "push", "tiny.gguf", "--device", "local").code == 0
    for command in slow:
        result = kz(*command.argv)
        assert result.code == command.exit_code, f"{command}: exit {result.code}\n{result.err}"
