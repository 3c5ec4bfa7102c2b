"""Upstream sources: get the pinned commit into the shared object cache.

The cache is one bare, shallow git repo (``Settings.mirror``) shared by all recipes and
worktrees. Sources are tried in the recipe's order; a commit already in the cache is never
fetched again, and an sdist already downloaded is never downloaded again.

Source kinds:
- ``git``: ``git fetch --depth 1 URL SHA`` (only the pinned commit). When the server
  refuses a want for an unadvertised sha, fall back to a partial fetch (``--filter=blob:none``)
  of its branches to find which one holds the commit and how deep, then a shallow fetch of
  that branch down to exactly the commit.
- ``pypi-sdist``: the sdist of ``llama-cpp-python==X`` from the indexes pip is configured with
  (``pipindex``: pip's configuration applies, nothing is built), then fetch from the shallow
  git data the sdist vendors under ``.git/modules/``.
- ``path``: a local repo or ``file://`` URL, fetched like ``git``.
"""

from __future__ import annotations

import logging
import re
import tarfile
import tempfile
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from kzbuild.adapters.filelock import locked
from kzbuild.adapters.gitcmd import Git, unset_in_config_file
from kzbuild.adapters.proc import Progress
from kzbuild.adapters.settings import Settings
from kzbuild.errors import CommandFailed, KzError, SourceError
from kzbuild.model.recipe import Source

log = logging.getLogger(__name__)

REFUSED_WANT = re.compile(
    r"not our ref|unadvertised object|no such remote ref|couldn't find remote ref", re.I
)


@dataclass(frozen=True)
class FetchOutcome:
    commit: str
    tree: str
    source: str | None  # label of the source that provided it; None when the cache had it


class ObjectCache:
    """The bare mirror that holds every upstream commit kzbuild has fetched."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.path = settings.mirror
        self.git = Git(self.path)

    def lock(self) -> AbstractContextManager[None]:
        return locked(
            self.settings.locks / "upstream.git.lock", what=f"the object cache {self.path}"
        )

    def init(self) -> None:
        if (self.path / "HEAD").is_file():
            return
        self.path.mkdir(parents=True, exist_ok=True)
        self.git.init_bare()
        self.git(
            "config", "gc.auto", "0"
        )  # pins are kept by refs; never repack behind a worktree's back

    def pin_ref(self, sha: str) -> str:
        return f"refs/kz/pins/{sha}"

    def has(self, sha: str) -> bool:
        return (self.path / "HEAD").is_file() and self.git.has_commit(sha)

    def shallow_commits(self) -> list[str]:
        shallow = self.path / "shallow"
        return shallow.read_text().split() if shallow.is_file() else []

    def ensure(
        self, sha: str, sources: tuple[Source, ...], *, progress: Progress | None = None
    ) -> FetchOutcome:
        """Make ``sha`` available in the cache, trying ``sources`` in order."""
        with self.lock():
            self.init()
            if self.has(sha):
                return FetchOutcome(sha, self.git.tree_of(sha), None)
            failures: list[str] = []
            for index, source in enumerate(sources):
                following = sources[index + 1].label if index + 1 < len(sources) else None
                try:
                    self._fetch_from(source, sha, progress)
                except KzError as exc:
                    failures.append(f"{source.label}: {_first_line(exc.message)}")
                    log.warning(
                        "source %s failed: %s; %s",
                        source.label,
                        _first_line(exc.message),
                        f"trying {following} next" if following else "no sources left",
                    )
                    continue
                if not self.has(sha):
                    failures.append(f"{source.label}: fetched, but commit {sha} is not there")
                    log.warning("source %s does not have %s", source.label, sha)
                    continue
                self.git("update-ref", self.pin_ref(sha), sha)
                return FetchOutcome(sha, self.git.tree_of(sha), source.label)
            raise SourceError(
                f"no source could provide upstream commit {sha}:\n  "
                + "\n  ".join(failures or ["no sources configured"]),
                hint="check the recipe's upstream.sources, or your network and pip configuration",
            )

    # --- source kinds ---
    def _fetch_from(self, source: Source, sha: str, progress: Progress | None) -> None:
        if source.kind == "pypi-sdist":
            self._fetch_from_sdist(source.location, sha, progress)
        elif source.kind == "path":
            location = source.location
            if not location.startswith("file://") and not Path(location).exists():
                raise SourceError(f"local mirror {location} does not exist")
            self._fetch_git(location, sha, progress)
        else:
            self._fetch_git(source.location, sha, progress)

    def _fetch_git(self, url: str, sha: str, progress: Progress | None) -> None:
        try:
            self.git.fetch("--depth", "1", url, f"{sha}:{self.pin_ref(sha)}", progress=progress)
            return
        except CommandFailed as exc:
            if not REFUSED_WANT.search(exc.stderr):
                raise SourceError(
                    f"fetch from {url} failed: {_first_line(exc.stderr) or exc.message}"
                ) from exc
            log.info("%s refuses a want for %s; falling back to a partial fetch", url, sha)
        self._fetch_by_branch(url, sha, progress)

    def _fetch_by_branch(self, url: str, sha: str, progress: Progress | None) -> None:
        """For servers that only serve advertised refs: locate the commit, then fetch to its depth.

        The blob-less look-around happens in a throwaway repo: in the cache it would leave
        commits without their blobs, and the full fetch would then skip them.
        """
        with tempfile.TemporaryDirectory(prefix="kz-partial-", dir=self.settings.cache) as tmp:
            scout = Git(Path(tmp))
            scout("init", "-q", "--bare")
            scout.fetch("--filter=blob:none", url, "+refs/heads/*:refs/heads/*", progress=progress)
            containing = scout(
                "for-each-ref", f"--contains={sha}", "--format=%(refname)", "refs/heads/"
            ).split()
            if not containing:
                raise SourceError(f"{url} has no branch that contains {sha}")
            branch = containing[0]
            depth = int(scout("rev-list", "--count", f"{sha}..{branch}")) + 1
        log.info("fetching %s from %s to depth %d", branch, url, depth)
        self.git.fetch(
            "--depth", str(depth), url, f"+{branch}:refs/kz/partial/tip", progress=progress
        )
        self.git("update-ref", "-d", "refs/kz/partial/tip")

    def _fetch_from_sdist(self, requirement: str, sha: str, progress: Progress | None) -> None:
        sdist = self.download_sdist(requirement, progress)
        with tempfile.TemporaryDirectory(prefix="kz-sdist-", dir=self.settings.cache) as tmp:
            gitdirs = extract_vendored_gitdirs(sdist, Path(tmp))
            if not gitdirs:
                raise SourceError(f"{sdist.name} vendors no git data (no .git/modules/ inside)")
            for gitdir in gitdirs:
                if Git(gitdir).has_commit(sha):
                    self.git.fetch(
                        "--depth", "1", str(gitdir), f"{sha}:{self.pin_ref(sha)}", progress=progress
                    )
                    return
            heads = ", ".join(Git(g)("rev-parse", "HEAD") for g in gitdirs)
            raise SourceError(f"{sdist.name} vendors commit {heads}, not {sha}")

    def download_sdist(self, requirement: str, progress: Progress | None = None) -> Path:
        """The cached sdist for ``package==version``; when missing, fetched from pip's indexes
        (pipindex)."""
        package, version = requirement.split("==", 1)
        stem = f"{re.sub(r'[-_.]+', '_', package).lower()}-{version}"
        self.settings.sdists.mkdir(parents=True, exist_ok=True)
        for suffix in (".tar.gz", ".zip"):
            cached = self.settings.sdists / f"{stem}{suffix}"
            if cached.is_file():
                return cached
        from kzbuild.source import pipindex  # only a download needs it (start-up time)

        client = pipindex.Client(pipindex.read_pip_config())
        link = pipindex.find_sdist(client, package, version)
        target = (
            self.settings.sdists
            / f"{stem}{'.zip' if link.filename.endswith('.zip') else '.tar.gz'}"
        )
        with tempfile.TemporaryDirectory(
            prefix=".kz-download-", dir=self.settings.sdists
        ) as tmp:  # same file system: an atomic rename
            partial = Path(tmp) / target.name
            client.download(link, partial, progress)
            partial.replace(target)  # only a complete, verified file enters the cache
        return target


def extract_vendored_gitdirs(sdist: Path, into: Path) -> list[Path]:
    """Extract only the vendored submodule git dirs (``*/.git/modules/...``) of an sdist."""
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if "/.git/modules/" in m.name]
        archive.extractall(into, members=members, filter="data")
    gitdirs = sorted(
        head.parent
        for head in into.glob("*/.git/modules/**/HEAD")
        if (head.parent / "objects").is_dir()
    )
    for gitdir in gitdirs:
        # Its core.worktree names the submodule folder, which we did not extract; git
        # would chdir there.
        unset_in_config_file(gitdir / "config", "core.worktree")
    return gitdirs


def _first_line(text: str) -> str:
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()
    return ""
