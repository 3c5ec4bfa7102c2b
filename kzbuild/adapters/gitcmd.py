"""git through the process runner, isolated from the user's git configuration.

kzbuild's own git operations (fetching pins, applying the stack, committing overlays) must
give the same objects on every machine, so they ignore global and system config and commit
with a fixed identity.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from kzbuild.adapters import proc

KZ_NAME = "kzbuild"
KZ_EMAIL = "kzbuild@localhost"
ISOLATED_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_ASKPASS": "true",
    "LC_ALL": "C",
    # Every commit kzbuild makes has this committer (git am keeps the patch's author).
    "GIT_COMMITTER_NAME": KZ_NAME,
    "GIT_COMMITTER_EMAIL": KZ_EMAIL,
}
KZ_AUTHOR = {"GIT_AUTHOR_NAME": KZ_NAME, "GIT_AUTHOR_EMAIL": KZ_EMAIL}


class Git:
    """Run git in one repository (``git -C repo``)."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo

    def run(
        self,
        *args: str,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
        timeout: float | None = None,
    ) -> proc.Result:
        return proc.run(
            ["git", "-C", str(self.repo), *args],
            env=env,
            quiet_env=ISOLATED_ENV,
            check=check,
            input=input,
            timeout=timeout,
        )

    def run_bytes(self, *args: str, input: bytes | None = None) -> proc.BytesResult:
        """run() for blobs: stdin and stdout as bytes."""
        return proc.run_bytes(
            ["git", "-C", str(self.repo), *args], quiet_env=ISOLATED_ENV, input=input
        )

    def __call__(
        self, *args: str, env: Mapping[str, str] | None = None, input: str | None = None
    ) -> str:
        """Run and return stdout without the trailing newline."""
        return self.run(*args, env=env, input=input).stdout.rstrip("\n")

    def fetch(self, *args: str, progress: Callable[[str], None] | None = None) -> None:
        """``git fetch --no-tags --progress ARGS``, handing each progress line to ``progress``."""
        proc.stream(
            ["git", "-C", str(self.repo), "fetch", "--no-tags", "--progress", *args],
            quiet_env=ISOLATED_ENV,
            on_line=progress,
        )

    def init_bare(self) -> None:
        proc.run(["git", "init", "-q", "--bare", str(self.repo)], quiet_env=ISOLATED_ENV)

    def user_ident(self) -> str | None:
        """The user's own ``Name <email> time zone`` for this repository: read with their git
        config on purpose (a patch the user writes carries their name), unlike every other call."""
        result = proc.run(["git", "-C", str(self.repo), "var", "GIT_AUTHOR_IDENT"], check=False)
        return result.stdout.strip() if result.ok else None

    def resolve(self, rev: str) -> str | None:
        """Full sha of ``rev`` as a commit, or None when it does not exist here."""
        result = self.run("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
        return result.stdout.strip() if result.ok else None

    def resolve_all(self, *revs: str) -> tuple[str | None, ...]:
        """resolve() of each rev, in one git call when all of them exist."""
        result = self.run(
            "rev-parse", "--revs-only", *(f"{rev}^{{commit}}" for rev in revs), check=False
        )
        shas = result.stdout.split()
        if result.ok and len(shas) == len(revs):
            return tuple(shas)
        return tuple(
            self.resolve(rev) for rev in revs
        )  # --revs-only drops a missing one: which, only one call each tells

    def has_commit(self, sha: str) -> bool:
        return self.run("cat-file", "-e", f"{sha}^{{commit}}", check=False).ok

    def tree_of(self, rev: str) -> str:
        return self("rev-parse", f"{rev}^{{tree}}")

    def commit_date(self, rev: str) -> str:
        """Committer date in git's raw format (``epoch +zone``), for reproducible commits."""
        return self("log", "-1", "--format=%cd", "--date=raw", rev)


def ls_remote(url: str, *refs: str, options: Sequence[str] = ()) -> proc.Result:
    """``git ls-remote OPTIONS URL REFS`` (no repository needed); check the result's ``ok``.
    (Options go before the URL: after it, git takes them for patterns.)"""
    return proc.run(["git", "ls-remote", *options, url, *refs], quiet_env=ISOLATED_ENV, check=False)


def remote_failure(result: proc.Result) -> str:
    """Why git could not talk to a remote, in git's words: its first message, with the line it
    continues (``unable to connect to HOST:`` / ``errno=Connection refused``)."""
    lines = [line.strip().removeprefix("fatal: ") for line in result.stderr.splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return f"git exited with {result.returncode}"
    return f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]


def unset_in_config_file(config: Path, key: str) -> None:
    """Remove every ``key`` from one git config file (a gitdir outside any worktree)."""
    proc.run(
        ["git", "config", "--file", str(config), "--unset-all", key],
        quiet_env=ISOLATED_ENV,
        check=False,
    )
