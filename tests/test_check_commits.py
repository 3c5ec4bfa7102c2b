"""scripts/check-commits: subjects of commits after the rule's start are at most 72 characters."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import REPO_ROOT

IDENTITY = ["-c", "user.name=Kz Test", "-c", "user.email=kz@example.invalid"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *IDENTITY, *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()


def check(subject: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """check-commits in a repo whose rule starts at a first commit with a long subject, and
    whose HEAD then gains one commit with SUBJECT."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    script = repo / "scripts" / "check-commits"
    script.write_bytes((REPO_ROOT / "scripts" / "check-commits").read_bytes())
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "before the rule: " + "o" * 80)
    start = git(repo, "rev-parse", "HEAD")
    git(repo, "commit", "-q", "--allow-empty", "-m", subject, "-m", "why")
    return subprocess.run(
        ["bash", str(script)],
        capture_output=True,
        text=True,
        env={**os.environ, "KZ_COMMITS_FROM": start},
    )


def test_a_subject_of_72_characters_passes(tmp_path):
    assert check("s" * 72, tmp_path).returncode == 0


def test_a_subject_of_73_characters_fails_and_is_named(tmp_path):
    ran = check("s" * 73, tmp_path)
    assert ran.returncode == 1
    assert "s" * 73 in ran.stderr
    assert "longer than 72 characters" in ran.stderr
    assert "o" * 80 not in ran.stderr  # the commit the rule starts at is not checked


def test_the_repos_own_subjects_pass():
    ran = subprocess.run(
        ["bash", str(REPO_ROOT / "scripts" / "check-commits")], capture_output=True, text=True
    )
    assert ran.returncode == 0, ran.stderr
