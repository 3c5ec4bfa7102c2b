"""``kzbuild roll``: candidates newest first, who broke a patch, would-drop, --write on a branch,
exit codes.

Upstreams are synthetic git histories (served by a real git daemon, or as file:// repos); pypi
candidates come from a PEP 503 index folder the test writes, read by the real ``pip index
versions``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from kzbuild.errors import OverMemoryBudget, RegressionFound, WrongOutput
from kzbuild.measure import roll
from kzbuild.model.quality import QualityLimits
from kzbuild.model.roll import Outcome, pr_number
from kzbuild.source.recipes import load_recipe
from tests.conftest import REPO_ROOT, UpstreamRepo, git
from tests.fixtures_build import install_toolchains
from tests.fixtures_git import free_port, serve
from tests.fixtures_stack import add_patch, file_source, fit, make_patch
from tests.test_quality import record as quality_record

FAST = ("--no-build", "--no-tests", "--plan-target", "none")
JANE = {"GIT_AUTHOR_NAME": "Jane Upstream", "GIT_AUTHOR_EMAIL": "jane@upstream.example"}


def commit_as(
    upstream: UpstreamRepo, files: dict[str, str], message: str, env: dict[str, str]
) -> str:
    """upstream.commit, then the same commit with another author (and the same dates)."""
    sha = upstream.commit(files, message)
    date = git(upstream.path, "log", "-1", "--format=%ad", "--date=raw")
    git(
        upstream.path,
        "commit",
        "-q",
        "--amend",
        "--no-edit",
        "--reset-author",
        env={**env, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date},
    )
    assert sha != upstream.head()
    return upstream.head()


def filler(upstream: UpstreamRepo, start: int, count: int) -> None:
    for i in range(start, start + count):
        upstream.commit({f"src/f{i}.c": f"int f{i};\n"}, f"src: f{i}")


def test_pr_number_is_read_from_the_end_of_the_subject():
    assert pr_number("ggml : fix the hexagon build (#12345)") == 12345
    assert pr_number("revert (#12) the other thing") is None
    assert pr_number("no number") is None


def test_a_conflict_names_the_commit_pr_author_and_date(
    project, upstream, git_daemon, kz, tmp_path, monkeypatch
):
    base = upstream.head()
    add_patch(
        project,
        "fix.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line5="fixed 5")}, "common: fix 5"),
    )
    filler(upstream, 0, 6)
    culprit = commit_as(
        upstream, {"common/fit.cpp": fit(line5="upstream 5")}, "common: rework line 5 (#1234)", JANE
    )
    when = git(upstream.path, "log", "-1", "--format=%aI", culprit)
    filler(upstream, 6, 3)
    served, port = git_daemon
    serve(upstream, served, allow_sha_want=True)
    project.recipe("r", commit=base, sources=[f"git: git://127.0.0.1:{port}/llama.cpp.git"])
    report_md = tmp_path / "roll.md"
    step_summary = tmp_path / "step-summary.md"
    step_summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))

    result = kz("roll", "r", *FAST, "--json", "--report", str(report_md))
    assert result.code == 5, result.err
    report = json.loads(result.out)
    assert report["rollable"] is None
    (candidate,) = report["candidates"]
    assert (candidate["label"], candidate["origin"], candidate["outcome"]) == (
        "master",
        "default branch",
        "conflict",
    )
    assert candidate["commit"] == upstream.head() and candidate["commits_between"] == 10
    (found,) = candidate["bisect"]
    assert found["patch"] == "fix.patch" and found["pr"] == 1234
    assert found["culprit"] == {
        "sha": culprit,
        "subject": "common: rework line 5 (#1234)",
        "author": "Jane Upstream <jane@upstream.example>",
        "date": when,
    }
    text = report_md.read_text()
    assert (
        f'broken by {culprit[:12]} "common: rework line 5 (#1234)" (PR #1234, Jane Upstream '
        f"<jane@upstream.example>, {when})" in text
    )
    assert "| fix.patch | conflict |" in text
    assert step_summary.read_text() == "earlier step\n" + text
    assert "no candidate is rollable" in result.err
    assert "the report names the upstream commit that broke each" in " ".join(result.err.split())


def test_upstreamed_under_another_subject_is_proven_by_patch_id_and_would_drop(
    project, upstream, kz
):
    base = upstream.head()
    add_patch(
        project,
        "taken.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line10="fixed 10")}, "common: fix 10"),
    )
    add_patch(
        project,
        "kept.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line30="ours 30")}, "common: ours 30"),
    )
    project.recipe("r", commit=base, sources=[file_source(upstream)])
    filler(upstream, 0, 2)
    taken = upstream.commit(
        {"common/fit.cpp": fit(line10="fixed 10")},
        "common: take the line 10 fix from downstream (#77)",
    )
    upstream.commit({"common/fit.cpp": fit(line10="fixed 10", line12="drift 12")}, "common: drift")

    result = kz("roll", "r", *FAST, "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["rollable"]["label"] == "master" and report["would_drop"] == ["taken.patch"]
    (candidate,) = report["candidates"]
    verdicts = {p["patch"]: (p["verdict"], p["proof"]) for p in candidate["patches"]}
    assert verdicts["kept.patch"] == ("clean", None)
    verdict, proof = verdicts["taken.patch"]
    assert verdict == "upstreamed" and proof["kind"] == "patch-id" and proof["commit"] == taken
    shown = kz("roll", "r", *FAST)
    assert "would drop as upstreamed: taken.patch (patch-id:" in " ".join(shown.out.split())


def two_candidates(project, upstream):
    """Tags v0 (the pin), v1 (the stack holds) and master (a conflict); returns (pin, v1,
    master)."""
    base = upstream.head()
    git(upstream.path, "tag", "v0")
    add_patch(
        project,
        "fix.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line5="fixed 5")}, "common: fix 5"),
    )
    add_patch(
        project,
        "taken.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line20="fixed 20")}, "common: fix 20"),
    )
    project.recipe("r", commit=base, sources=[file_source(upstream)])
    upstream.commit({"common/fit.cpp": fit(line8="drift 8")}, "common: drift (3-way still works)")
    v1 = upstream.commit(
        {"common/fit.cpp": fit(line8="drift 8", line20="fixed 20")}, "common: fix 20 upstream (#50)"
    )
    git(upstream.path, "tag", "-a", "v1", "-m", "release v1")
    filler(upstream, 0, 3)
    master = commit_as(
        upstream,
        {"common/fit.cpp": fit(line5="upstream 5", line8="drift 8", line20="fixed 20")},
        "common: rework line 5 (#99)",
        JANE,
    )
    return base, v1, master


def test_rollable_is_the_newest_candidate_that_holds(project, upstream, kz):
    base, v1, master = two_candidates(project, upstream)
    result = kz("roll", "r", *FAST, "--json")
    assert result.code == 0, result.err  # an older candidate rolls: not a failure
    report = json.loads(result.out)
    assert [(c["label"], c["commit"], c["outcome"]) for c in report["candidates"]] == [
        ("master", master, "conflict"),
        ("v1", v1, "rollable"),
    ]
    assert report["rollable"]["label"] == "v1" and report["would_drop"] == ["taken.patch"]
    assert report["candidates"][0]["bisect"][0]["pr"] == 99
    # --to takes bump's forms; candidates given are tried newest first too
    given = json.loads(kz("roll", "r", *FAST, "--json", "--to", v1[:12], "--to", "master").out)
    assert [(c["label"], c["origin"]) for c in given["candidates"]] == [
        ("master", "--to"),
        (v1[:12], "--to"),
    ]
    assert kz("roll", "r", *FAST, "--to", "master").code == 5


def git_project(project) -> None:
    git(project.root, "init", "-q", "-b", "main")
    git(project.root, "add", "-A")
    git(project.root, "commit", "-q", "-m", "the project")


def snapshot(project) -> dict[str, object]:
    root = project.root
    files = {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }
    return {
        "files": files,
        "head": git(root, "rev-parse", "HEAD"),
        "branch": git(root, "symbolic-ref", "HEAD"),
        "status": git(root, "status", "--porcelain", "--untracked-files=all"),
        "worktrees": git(root, "worktree", "list", "--porcelain"),
        "stash": git(root, "stash", "list"),
    }


def test_write_puts_the_roll_on_a_branch_and_changes_nothing_else(project, upstream, kz):
    base, v1, master = two_candidates(project, upstream)
    install_toolchains(project)  # the v79 plan is made (and shows the NDK missing)
    git_project(project)
    assert kz("sync", "r").code == 0
    git(project.root, "add", "recipes/r.lock.json")
    git(project.root, "commit", "-q", "-m", "lock")
    user_worktree = project.settings.worktree("r")
    synced_head = git(user_worktree, "rev-parse", "HEAD")
    branches = git(project.root, "branch", "--format=%(refname)")
    hooks = project.root / ".git" / "hooks"
    for hook in (
        "post-checkout",
        "pre-commit",
        "commit-msg",
    ):  # the user's hooks stay out of the roll
        (hooks / hook).write_text(f"#!/bin/sh\necho ran >> {project.root.parent / hook}\nexit 1\n")
        (hooks / hook).chmod(0o755)
    before = snapshot(project)

    result = kz("roll", "r", "--no-build", "--no-tests", "--write", "--json")
    assert result.code == 0, result.out
    report = json.loads(result.out)
    branch = f"kz/roll/{v1[:7]}"
    assert report["branch"] == branch
    assert snapshot(project) == before  # the user's files, HEAD, branch, status and worktrees
    assert git(user_worktree, "rev-parse", "HEAD") == synced_head
    assert not [
        hook
        for hook in ("post-checkout", "pre-commit", "commit-msg")
        if (project.root.parent / hook).exists()
    ]
    assert git(project.root, "branch", "--format=%(refname)").splitlines() == sorted(
        [*branches.splitlines(), f"refs/heads/{branch}"]
    )

    made = report["commit"]
    assert git(project.root, "rev-parse", branch) == made
    assert git(project.root, "rev-parse", f"{branch}^") == before["head"]
    changed = git(project.root, "diff", "--name-status", before["head"], branch).splitlines()
    assert sorted(changed) == [
        "A\tpatches/DROPPED.yaml",
        "D\tpatches/taken.patch",
        "M\tpatches/series",
        "M\trecipes/r.lock.json",
        "M\trecipes/r.yaml",
    ]
    assert f"commit: {v1}" in git(project.root, "show", f"{branch}:recipes/r.yaml")
    lock = json.loads(git(project.root, "show", f"{branch}:recipes/r.lock.json"))
    assert lock["upstream"]["commit"] == v1 and [p["file"] for p in lock["patches"]] == [
        "fix.patch"
    ]
    assert "patch: taken.patch" in git(project.root, "show", f"{branch}:patches/DROPPED.yaml")
    message = git(project.root, "log", "-1", "--format=%B", branch)
    assert message.startswith(f"r: roll upstream {base[:12]} -> {v1[:12]} (v1)")
    assert (
        f"- master ({master[:12]}): conflict" in message
        and "fix.patch: broken by" in message
        and "(PR #99," in message
    )
    assert "would drop as upstreamed: taken.patch" in message
    # the same roll again: the branch holds it already, and is reused
    again = kz("roll", "r", "--no-build", "--no-tests", "--write", "--json")
    assert again.code == 0, again.err
    assert (json.loads(again.out)["branch"], json.loads(again.out)["commit"]) == (branch, made)
    notes = " ".join(json.loads(again.out)["notes"])
    assert f"the branch {branch} already holds this roll" in notes
    assert snapshot(project) == before and git(project.root, "rev-parse", branch) == made
    # the branch with other content: left alone, exit 4 (documented), the report still written
    git(project.root, "branch", "-f", branch, before["head"])
    report_md = project.root.parent / "roll.md"
    other = kz("roll", "r", "--no-build", "--no-tests", "--write", "--report", str(report_md))
    assert other.code == 4
    assert f"the branch {branch} exists with other content" in " ".join(other.err.split())
    assert "exists with other content" in report_md.read_text()
    assert git(project.root, "rev-parse", branch) == before["head"]
    assert snapshot(project) == before


def test_write_changes_nothing_when_no_candidate_rolls(project, upstream, kz, tmp_path):
    base, v1, master = two_candidates(project, upstream)
    git_project(project)
    branches = git(project.root, "branch", "--format=%(refname)")
    before = snapshot(project)
    result = kz("roll", "r", *FAST, "--write", "--to", "master", "--report", str(tmp_path / "r.md"))
    assert result.code == 5
    assert "not rollable; master" in (tmp_path / "r.md").read_text()
    assert (
        snapshot(project) == before
        and git(project.root, "branch", "--format=%(refname)") == branches
    )


def test_write_refuses_uncommitted_recipes_or_patches(project, upstream, kz):
    two_candidates(project, upstream)
    git_project(project)
    (project.root / "patches" / "series").write_text("fix.patch\n")
    report_md = project.root.parent / "roll.md"
    result = kz("roll", "r", *FAST, "--write", "--report", str(report_md))
    assert result.code == 4 and "patches/series" in result.err
    # the report, as always
    assert "not written: --write: the project has uncommitted changes" in report_md.read_text()


def test_write_needs_a_git_project(project, upstream, kz):
    two_candidates(project, upstream)
    result = kz("roll", "r", *FAST, "--write")
    assert result.code == 4 and "to be a git repository" in " ".join(result.err.split())


# --- pypi candidates: a PEP 503 index folder, and sdists that vendor upstream's shallow git data
# ---


def fake_sdist(upstream: UpstreamRepo, commit: str, version: str, folder: Path) -> Path:
    """An sdist laid out like llama-cpp-python's: vendor/llama.cpp's git dir, shallow at
    ``commit``."""
    top = f"llama_cpp_python-{version}"
    gitdir = folder / "build" / version / top / ".git" / "modules" / "vendor" / "llama.cpp"
    git(folder, "init", "-q", "--bare", str(gitdir))
    git(gitdir, "fetch", "-q", "--depth", "1", f"file://{upstream.path}", commit)
    (gitdir / "HEAD").write_text(commit + "\n")
    sdist = folder / f"{top}.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        archive.add(gitdir.parents[3], arcname=top)
    return sdist


def pypi_index(tmp_path: Path, sdists: list[Path]) -> str:
    page = tmp_path / "index" / "simple" / "llama-cpp-python"
    page.mkdir(parents=True)
    links = "".join(f'<a href="file://{s}">{s.name}</a>\n' for s in sdists)
    (page / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    return f"file://{tmp_path / 'index' / 'simple'}"


def test_pypi_candidates_come_from_pip_index_versions(project, upstream, kz, tmp_path, monkeypatch):
    git(upstream.path, "config", "uploadpack.allowAnySHA1InWant", "true")
    base = upstream.head()
    add_patch(
        project,
        "fix.patch",
        make_patch(upstream, base, {"common/fit.cpp": fit(line5="fixed 5")}, "common: fix 5"),
    )
    old = upstream.commit(
        {"src/old.c": "int old;\n"}, "src: old"
    )  # 0.3.30 vendors it, and it is older: not a candidate
    holds = upstream.commit({"common/fit.cpp": fit(line8="drift 8")}, "common: drift")
    filler(upstream, 0, 3)
    breaks = upstream.commit(
        {"common/fit.cpp": fit(line5="upstream 5", line8="drift 8")},
        "common: rework line 5 (#4321)",
    )
    made = tmp_path / "sdists"
    made.mkdir()
    sdists = [
        fake_sdist(upstream, sha, v, made)
        for sha, v in ((base, "0.3.36"), (old, "0.3.30"), (holds, "0.3.37"), (breaks, "0.3.40"))
    ]
    # pip itself is asked (its configuration kept, the index pointed here); the sdists are in
    # kzbuild's cache already
    index = pypi_index(tmp_path, sdists)
    monkeypatch.setenv("PIP_INDEX_URL", index)
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", index)
    (project.cache / "sdists").mkdir(parents=True)
    for sdist in sdists:
        (project.cache / "sdists" / sdist.name).write_bytes(sdist.read_bytes())
    project.recipe("r", commit=base, sources=["pypi-sdist: llama-cpp-python==0.3.36"])

    result = kz("roll", "r", *FAST, "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    labels = [(c["label"], c["commit"], c["outcome"]) for c in report["candidates"]]
    assert labels == [
        ("pypi:llama-cpp-python==0.3.40", breaks, "conflict"),
        ("pypi:llama-cpp-python==0.3.37", holds, "rollable"),
    ]
    (found,) = report["candidates"][0]["bisect"]
    assert found["culprit"] is None and found["reason"].startswith("history missing")
    assert report["candidates"][0]["history"].startswith("missing")
    assert any("history missing" in note for note in report["candidates"][0]["notes"])
    assert "pip" not in " ".join(report["notes"])  # pip answered
    # blocked there: the exit-5 hint promises no breaking commit the missing history could not give
    blocked = kz("roll", "r", *FAST, "--to", "pypi:llama-cpp-python==0.3.40")
    assert blocked.code == 5
    hint = " ".join(blocked.err.split())
    assert "no breaking commit was found for fix.patch" in hint
    assert "names the upstream commit that broke" not in hint


# --- a rolled candidate: real host build (the tiny upstream), Kz-Test, v79 plan, bench A/B ---

KZ_TEST_FILE = """\
import json
from pathlib import Path


def test_the_rolled_lock_keeps_the_patch():
    lock = json.loads(Path("recipes/tiny.lock.json").read_text())
    assert [p["file"] for p in lock["patches"]] == ["answer.patch"]
"""


class AnswerRunner:
    """Runs each variant's tiny llama-bench from its artifact, in the order given; its metric is the
    number the binary prints (ggml_answer), so a candidate that lowers it is a measured
    regression."""

    metric = "answer"
    quality: tuple[object, ...] = ()  # no quality check
    memory_over: dict[str, list[str]] = {}  # no memory limits

    def __init__(self) -> None:
        self.ran: list[str] = []

    def run(self, variants, order, seed):
        samples: dict[str, list[float]] = {name: [] for name in variants}
        for block in order:
            for name in block:
                out = subprocess.run(
                    [str(Path(variants[name]) / "bin" / "llama-bench")],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                samples[name].append(float(out.split("answer=")[1]))
                self.ran.append(name)
        return samples


def tiny_answer(value: int) -> dict[str, str]:
    return {"ggml/src/ggml.c": f"int ggml_answer(void) {{ return {value}; }}\n"}


@pytest.fixture
def rolled_tiny(tiny):
    tiny.project.write("tests/test_answer.py", KZ_TEST_FILE)
    tiny.add_patch(
        "answer.patch",
        {"README.md": "llama.cpp (synthetic, patched)\n"},
        "docs: patched\n\nUpstream-Status: Pending\nKz-Test: tests/test_answer.py",
    )
    text = (tiny.project.root / "recipes" / "tiny.yaml").read_text()
    (tiny.project.root / "recipes" / "tiny.yaml").write_text(
        text.replace(f"path: {tiny.upstream.path}", file_source(tiny.upstream))
    )
    return tiny


def test_a_rolled_candidate_is_built_tested_planned_and_benched(rolled_tiny):
    tiny = rolled_tiny
    tiny.upstream.commit(tiny_answer(40), "ggml: answer 40 (#5)")
    recipe = load_recipe(tiny.project.root, "tiny")
    runner = AnswerRunner()
    report = roll.roll(
        tiny.settings, recipe, bench=runner, blocks=3, seed=1, environ=tiny.environ()
    )
    (result,) = report.results
    steps = {s.kind: s for s in result.steps}
    assert [s.kind for s in result.steps] == ["sync", "build", "tests", "plan", "bench"]
    assert all(s.status.value == "pass" for s in result.steps), result.steps
    assert "1 passed" in steps["tests"].detail and "tests/test_answer.py" in steps["tests"].label
    assert (
        "toolchains not available here" in steps["plan"].detail
    )  # v79: no NDK here, the plan still shows
    assert (
        result.bench is not None
        and result.bench.pin == (42.0,) * 3
        and result.bench.candidate == (40.0,) * 3
    )
    assert (
        round(result.bench.effect.delta_pct, 2) == -4.76 and not result.bench.regressed
    )  # within the 5% threshold
    assert (
        sorted(runner.ran[:2]) == ["candidate", "pin"] and len(runner.ran) == 6
    )  # each block runs both
    assert result.outcome is Outcome.ROLLABLE and report.rollable is result
    assert not (tiny.settings.work / "roll" / "tiny" / "project").exists()  # the stage is gone
    assert not tiny.settings.worktree("tiny").exists()  # the user's sync worktree was never made


def test_a_bench_regression_blocks_the_roll_with_exit_9(rolled_tiny):
    from kzbuild.cli.roll import _exit

    tiny = rolled_tiny
    tiny.upstream.commit(tiny_answer(30), "ggml: answer 30 (#6)")
    report = roll.roll(
        tiny.settings,
        load_recipe(tiny.project.root, "tiny"),
        bench=AnswerRunner(),
        blocks=2,
        plan_target=None,
        environ=tiny.environ(),
    )
    (result,) = report.results
    assert (
        result.outcome is Outcome.REGRESSED and result.bench is not None and result.bench.regressed
    )
    assert "answer: -28.6%" in roll.markdown(report)
    with pytest.raises(RegressionFound) as raised:
        _exit(report)
    assert raised.value.exit_code == 9


def roll_one(tiny, runner, answer: int, why: str):  # type: ignore[no-untyped-def]
    """Roll to a new upstream commit whose ggml answers ``answer``, benched by ``runner``."""
    tiny.upstream.commit(tiny_answer(answer), f"ggml: answer {answer}, {why}")
    report = roll.roll(
        tiny.settings,
        load_recipe(tiny.project.root, "tiny"),
        bench=runner,
        blocks=2,
        plan_target=None,
        environ=tiny.environ(),
    )
    (result,) = report.results
    return report, result


class JudgingRunner(AnswerRunner):
    """AnswerRunner plus what a plan's quality check would leave: the candidate's output drifts from
    the pin's by its answer's difference (mean KLD 0.1 per unit), against max_kld 0.01."""

    def run(self, variants, order, seed):
        samples = super().run(variants, order, seed)
        limits = QualityLimits(max_kld=0.01)
        drift = abs(samples["candidate"][0] - samples["pin"][0]) / 10
        self.quality = (
            quality_record("pin", 0.0, 100, limits),
            quality_record("candidate", drift, 100, limits),
        )
        return samples


def test_a_faster_candidate_whose_output_is_wrong_blocks_the_roll_with_exit_17(rolled_tiny):
    from kzbuild.cli.roll import _exit

    report, result = roll_one(rolled_tiny, JudgingRunner(), 43, "faster but wrong (#7)")
    assert (
        result.bench is not None
        and result.bench.effect.delta_pct > 0
        and not result.bench.regressed
    )  # faster
    assert (
        result.bench.wrong
        and result.outcome is Outcome.WRONG
        and result.steps[-1].status.value == "fail"
    )
    text = roll.markdown(report)
    assert (
        "candidate output: mean KLD 0.100000" in text
        and "wrong (mean KLD 0.100000 > max_kld 0.01)" in text
    )
    assert report.to_dict()["candidates"][0]["bench"]["wrong"] is True
    with pytest.raises(WrongOutput) as raised:
        _exit(report)
    assert raised.value.exit_code == 17


class OverBudgetRunner(AnswerRunner):
    """AnswerRunner plus what a plan's memory_budget would leave: the candidate's runs over it."""

    def run(self, variants, order, seed):
        samples = super().run(variants, order, seed)
        self.memory_over = {"pin": [], "candidate": ["memory_budget"]}
        return samples


def test_a_candidate_over_the_memory_budget_blocks_the_roll_with_exit_15(rolled_tiny):
    from kzbuild.cli.roll import _exit

    report, result = roll_one(rolled_tiny, OverBudgetRunner(), 43, "faster but bigger (#8)")
    assert result.bench is not None and not result.bench.regressed  # faster
    assert result.outcome is Outcome.OVER_BUDGET and result.steps[-1].status.value == "fail"
    assert "candidate over memory_budget" in roll.markdown(report)
    assert report.to_dict()["candidates"][0]["bench"]["memory_over"] == ["memory_budget"]
    with pytest.raises(OverMemoryBudget) as raised:
        _exit(report)
    assert raised.value.exit_code == 15


def test_a_failing_kz_test_blocks_the_candidate(rolled_tiny, kz, monkeypatch):
    tiny = rolled_tiny
    tiny.project.write(
        "tests/test_answer.py", KZ_TEST_FILE.replace('["answer.patch"]', '["another.patch"]')
    )
    tiny.upstream.commit(tiny_answer(41), "ggml: answer 41")
    monkeypatch.setattr(os, "environ", {**os.environ, **tiny.environ()})
    result = kz("roll", "tiny", "--plan-target", "none", "--json")
    assert result.code == 5
    (candidate,) = json.loads(result.out)["candidates"]
    assert candidate["outcome"] == "tests failed"
    assert "1 failed" in candidate["steps"][-1]["detail"]


def test_without_a_build_the_bench_is_skipped_and_says_why(rolled_tiny):
    tiny = rolled_tiny
    tiny.upstream.commit(tiny_answer(41), "ggml: answer 41")
    runner = AnswerRunner()
    report = roll.roll(
        tiny.settings,
        load_recipe(tiny.project.root, "tiny"),
        build=False,
        bench=runner,
        plan_target=None,
        environ=tiny.environ(),
    )
    (result,) = report.results
    bench = result.steps[-1]
    assert (bench.kind, bench.status.value, bench.detail) == (
        "bench",
        "skipped",
        "no host build to bench (--no-build)",
    )
    assert runner.ran == [] and result.bench is None and result.outcome is Outcome.ROLLABLE


def test_device_and_plan_go_together(project, upstream, kz, tmp_path):
    project.recipe("r", commit=upstream.head(), sources=[file_source(upstream)])
    device = kz("roll", "r", "--device", f"local:{tmp_path / 'device'}")
    assert device.code == 2 and "go together" in " ".join(device.err.split())
    plan = kz("roll", "r", "--plan", "plans/x.yaml")
    assert plan.code == 2 and "go together" in " ".join(plan.err.split())
    assert kz("roll", "r", "--to", " ").code == 2


def test_nothing_newer_is_exit_0(project, upstream, kz):
    project.recipe("r", commit=upstream.head(), sources=[file_source(upstream)])
    result = kz("roll", "r", *FAST)
    assert result.code == 0 and f"nothing newer than the pin {upstream.head()[:12]}" in " ".join(
        result.out.split()
    )


def test_a_roll_without_a_device_loads_no_device_or_bench_module():
    """What `kzbuild roll` loads before --device is looked at: the command and
    kzbuild.measure.roll."""
    code = (
        "import sys, kzbuild.cli.roll, kzbuild.measure.roll; print(sorted(m for m in sys.modules "
        "if m.startswith('kzbuild.')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    for module in (
        "kzbuild.measure.rolldevice",
        "kzbuild.device.deploy",
        "kzbuild.measure.interleave",
        "kzbuild.measure.bench",
        "kzbuild.device.run",
        "kzbuild.measure.resultsdb",
        "kzbuild.measure.plans",
        "kzbuild.cli.connect",
        "kzbuild.device.devicelock",
        "kzbuild.device.store",
    ):
        assert f"'{module}'" not in loaded, module


def test_an_unreachable_source_is_said_and_exits_3(project, upstream, kz, tmp_path):
    url = f"git://127.0.0.1:{free_port()}/llama.cpp"  # nothing listens there
    project.recipe("r", commit=upstream.head(), sources=[file_source(upstream), f"git: {url}"])
    result = kz("roll", "r", *FAST, "--report", str(tmp_path / "report.md"))
    assert result.code == 3, result.err
    out, err = " ".join(result.out.split()), " ".join(result.err.split())
    pin = upstream.head()[:12]
    assert f"roll r: could not check git:{url}; nothing newer than the pin {pin} in the rest" in out
    listing = f"could not check git:{url}: cannot list its branches and tags"
    assert f"- {listing}: unable to connect" in out
    assert f"error: could not check git:{url}: cannot list its branches and tags" in err
    assert "Connection refused" in err and "newer upstream may be there" in err
    assert f"could not check git:{url}" in (tmp_path / "report.md").read_text()
    report = json.loads(kz("roll", "r", *FAST, "--json").out)
    (unchecked,) = report["unchecked"]
    assert unchecked["source"] == f"git:{url}" and "Connection refused" in unchecked["why"]


def test_a_second_roll_of_the_recipe_exits_10_naming_the_holder(project, upstream, kz):
    """Another kzbuild (a real process) holds the stage of recipe r: this roll never shares it."""
    two_candidates(project, upstream)
    lock = project.work / "roll" / "r.lock"
    script = (
        "import sys, time; from pathlib import Path; from kzbuild.adapters.filelock import locked\n"
        "with locked(Path(sys.argv[1]), what='x'):\n    print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(lock)], stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        result = kz("roll", "r", *FAST)
        assert result.code == 10, result.err
        err = " ".join(result.err.split())
        assert f"pid {holder.pid}" in err and "roll stage" in err
        assert not (project.work / "roll" / "r" / "project").exists()  # never touched
    finally:
        holder.kill()
        holder.wait()
    assert kz("roll", "r", *FAST).code == 0  # the lock went with its holder
