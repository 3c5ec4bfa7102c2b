"""The GitHub workflows parse, and every kzbuild command they run exists with the options given.

The v79 workflow cannot run here (no container engine, no NDK); this checks what it would run.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import typer
import yaml

from kzbuild.build import builder, v79check
from kzbuild.cli import app
from tests.conftest import REPO_ROOT

WORKFLOWS = sorted((REPO_ROOT / ".github" / "workflows").glob("*.yml"))


def load(path: Path) -> dict:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict), path
    return doc


def run_lines(doc: dict) -> list[str]:
    lines = []
    for job in doc["jobs"].values():
        for step in job["steps"]:
            lines += [line.strip() for line in step.get("run", "").splitlines() if line.strip()]
    return lines


def kzbuild_argv(line: str) -> list[str] | None:
    words = shlex.split(line)
    if words[:1] == ["kzbuild"]:
        return words[1:]
    if words[:3] in (["python3", "-m", "kzbuild"], [".venv/bin/python", "-m", "kzbuild"]):
        return words[3:]
    return None


def check_kzbuild_command(args: list[str]) -> None:
    """Parse ``args`` with kzbuild's own CLI (without running it): unknown commands or options
    fail."""
    group = typer.main.get_command(app)
    root = group.make_context("kzbuild", list(args), resilient_parsing=False)
    # click keeps the subcommand's name apart from its arguments (a private field in newer clicks)
    remaining = [*getattr(root, "_protected_args", getattr(root, "protected_args", [])), *root.args]
    name, command, rest = group.resolve_command(root, remaining)
    assert name is not None and command is not None, f"no kzbuild command in {args}"
    sub = command.make_context(name, list(rest), parent=root)
    recipe = sub.params.get("recipe")
    if recipe:
        assert (REPO_ROOT / "recipes" / f"{recipe}.yaml").is_file(), f"no recipe {recipe}"
    for target in sub.params.get("target") or ():
        assert target in builder.TARGETS or target == v79check.TARGET, f"unknown target {target}"


def test_there_are_three_workflows():
    assert {p.name for p in WORKFLOWS} == {"tests.yml", "snapdragon-v79.yml", "roll.yml"}


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_parses_and_calls_real_kzbuild_commands(path):
    doc = load(path)
    assert doc.get("on", doc.get(True)), "no triggers"  # YAML 1.1 reads a bare `on` as true
    commands = [argv for argv in map(kzbuild_argv, run_lines(doc)) if argv is not None]
    assert commands, "the workflow runs no kzbuild command"
    for argv in commands:
        check_kzbuild_command(argv)


def test_the_checker_rejects_what_kzbuild_would_reject():
    with pytest.raises(Exception, match="No such option"):
        check_kzbuild_command(["build", "--targett", "v79"])
    with pytest.raises(AssertionError, match="unknown target"):
        check_kzbuild_command(["ci", "pad3-v79", "--target", "v80"])
    check_kzbuild_command(["ci", "pad3-v79", "--target", "v79-check"])
    with pytest.raises(AssertionError, match="no recipe"):
        check_kzbuild_command(["ci", "pad4-v79"])


def test_tests_workflow_runs_both_tiers():
    lines = run_lines(load(REPO_ROOT / ".github" / "workflows" / "tests.yml"))
    assert '.venv/bin/python -m pytest -m "not slow" -q' in lines
    assert ".venv/bin/python -m pytest -m slow -q" in lines


def test_v79_workflow_checks_every_push_and_builds_with_the_sdk_only_where_the_image_is_set():
    doc = load(REPO_ROOT / ".github" / "workflows" / "snapdragon-v79.yml")
    triggers = doc.get("on", doc.get(True))
    assert "push" in triggers and not triggers["push"], (
        "the check must run on every push (no branch or path filter)"
    )
    check, full = doc["jobs"]["v79-check"], doc["jobs"]["v79"]
    # the compile check: a plain runner, no container, no condition
    assert "container" not in check and "if" not in check
    assert run_lines({"jobs": {"c": check}})[-1] == "kzbuild ci pad3-v79 --target v79-check"
    assert "sudo apt-get install -y ccache" in run_lines({"jobs": {"c": check}})
    # the SDK build: only where KZ_SNAPDRAGON_IMAGE is set, inside that image, after the check
    assert full["if"].replace(" ", "") == "${{vars.KZ_SNAPDRAGON_IMAGE!=''}}"
    assert full["container"]["image"] == "${{ vars.KZ_SNAPDRAGON_IMAGE }}"
    assert full["needs"] == "v79-check"
    assert "kzbuild ci pad3-v79 --target v79" in run_lines({"jobs": {"f": full}})
    job = full
    upload = next(
        step
        for step in job["steps"]
        if str(step.get("uses", "")).startswith("actions/upload-artifact")
    )
    assert upload["with"]["path"] == ".kz/artifacts/"


def test_roll_workflow_runs_nightly_and_uploads_the_report_whatever_the_outcome():
    doc = load(REPO_ROOT / ".github" / "workflows" / "roll.yml")
    triggers = doc.get("on", doc.get(True))
    assert "workflow_dispatch" in triggers
    (cron,) = triggers["schedule"]
    assert len(cron["cron"].split()) == 5
    (job,) = doc["jobs"].values()
    steps = job["steps"]
    roll = next(step for step in steps if "kzbuild roll" in step.get("run", ""))
    argv = next(a for a in map(kzbuild_argv, roll["run"].splitlines()) if a)
    assert argv[:2] == ["roll", "pad3-v79"] and "--write" in argv
    report = argv[argv.index("--report") + 1]
    assert roll["run"].splitlines()[0] == "set +e"  # a conflict (exit 5) must not skip the upload
    upload = next(
        step for step in steps if str(step.get("uses", "")).startswith("actions/upload-artifact")
    )
    assert upload["if"] == "always()" and upload["with"]["path"] == report
    assert steps.index(upload) > steps.index(roll)
    fail = steps[-1]
    assert fail["if"] == "steps.roll.outputs.code != '0'" and "exit" in fail["run"]
    push = next(step for step in steps if "git push" in step.get("run", ""))
    assert push["if"] == "steps.roll.outputs.code == '0'" and "refs/heads/kz/roll/" in push["run"]
    assert doc["permissions"]["contents"] == "write"
