"""Where kzbuild keeps things: the project, the shared cache and the per-project work dir.

Precedence: built-in default < environment (KZ_PROJECT, KZ_CACHE_DIR, KZ_WORK_DIR,
KZ_RESULTS_DIR, XDG_CACHE_HOME) < command-line flag. The environment is passed in, never read
globally.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kzbuild.errors import ConfigError


@dataclass(frozen=True)
class Settings:
    project: Path
    cache: Path
    work: Path
    results_dir: Path | None = None  # default: PROJECT/results

    @classmethod
    def resolve(
        cls,
        environ: Mapping[str, str],
        *,
        cwd: Path,
        project: Path | None = None,
        cache: Path | None = None,
        work: Path | None = None,
        results: Path | None = None,
    ) -> Settings:
        try:
            return cls._resolve(
                environ, cwd=cwd, project=project, cache=cache, work=work, results=results
            )
        except OSError as exc:  # a path too long, a loop of symlinks: the user's to fix
            shown = os.fsdecode(exc.filename) if exc.filename is not None else "a folder"
            raise ConfigError(
                f"cannot use {shown[:200]}: {exc.strerror}",
                hint="check --project, --cache-dir, --work-dir, --results-dir and their KZ_* "
                "variables",
            ) from None

    @classmethod
    def _resolve(
        cls,
        environ: Mapping[str, str],
        *,
        cwd: Path,
        project: Path | None,
        cache: Path | None,
        work: Path | None,
        results: Path | None,
    ) -> Settings:
        project = project or _env_path(environ, "KZ_PROJECT") or find_project(cwd)
        project = project.resolve()
        if cache is None:
            cache = _env_path(environ, "KZ_CACHE_DIR")
        if cache is None:
            xdg = (
                _env_path(environ, "XDG_CACHE_HOME")
                or Path(environ.get("HOME", "~")).expanduser() / ".cache"
            )
            cache = xdg / "kzbuild"
        work = work or _env_path(environ, "KZ_WORK_DIR") or project / ".kz"
        results = results or _env_path(environ, "KZ_RESULTS_DIR")
        if not project.is_dir():
            raise ConfigError(
                f"the project {project} is not a folder",
                hint="pass --project / set KZ_PROJECT to the folder that holds recipes/",
            )
        folders = (
            ("--project / KZ_PROJECT", project),
            ("--cache-dir / KZ_CACHE_DIR", cache),
            ("--work-dir / KZ_WORK_DIR", work),
            ("--results-dir / KZ_RESULTS_DIR", results),
        )
        for option, folder in folders:
            if folder is not None and not _is_utf8(folder):
                raise ConfigError(
                    f"{option}: {os.fsencode(folder)!r} is not a UTF-8 path (kzbuild writes "
                    "its paths into JSON manifests and cmake's files)",
                    hint="choose a folder whose path is UTF-8",
                )
            if folder is not None and folder.exists() and not folder.is_dir():
                raise ConfigError(f"{option}: {folder} is not a folder")
        return cls(
            project=project,
            cache=cache.resolve(),
            work=work.resolve(),
            results_dir=results.resolve() if results else None,
        )

    # --- the shared cache (one per machine, shared by all projects) ---
    @property
    def mirror(self) -> Path:
        """The bare git repo holding every upstream object kzbuild has fetched."""
        return self.cache / "upstream.git"

    @property
    def sdists(self) -> Path:
        return self.cache / "sdists"

    @property
    def ccache(self) -> Path:
        """ccache's local cache (CCACHE_DIR of every build)."""
        return self.cache / "ccache"

    @property
    def locks(self) -> Path:
        return self.cache / "locks"

    @property
    def parsed_yaml(self) -> Path:
        """Config files already parsed, by content (yamlconf.ParsedDocuments)."""
        return self.cache / "parsed-yaml.json"

    @property
    def toolchain_versions(self) -> Path:
        """What toolchain programs' version commands printed, by binary
        (toolchains.VersionOutputs)."""
        return self.cache / "toolchain-versions.json"

    @property
    def model_digests(self) -> Path:
        """Models' sha256 and pieces by their file's stat data (modelpush.DigestCache)."""
        return self.cache / "model-digests.json"

    # --- the project ---
    @property
    def recipes(self) -> Path:
        return self.project / "recipes"

    @property
    def patches(self) -> Path:
        return self.project / "patches"

    @property
    def results(self) -> Path:
        return self.results_dir or self.project / "results"

    # --- the per-project work dir (git-ignored) ---
    def worktree(self, recipe_name: str) -> Path:
        return self.work / "src" / recipe_name.replace("/", "--")

    @property
    def artifacts(self) -> Path:
        return self.work / "artifacts"

    @property
    def scratch(self) -> Path:
        return self.work / "scratch"


def _is_utf8(path: Path) -> bool:
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:  # a byte that is not UTF-8, kept by Python as a lone surrogate
        return False
    return True


def _env_path(environ: Mapping[str, str], name: str) -> Path | None:
    value = environ.get(name)
    return Path(value).expanduser() if value else None


def find_project(start: Path) -> Path:
    """The nearest directory at or above ``start`` that holds a ``recipes/`` folder."""
    for candidate in [start, *start.parents]:
        if (candidate / "recipes").is_dir():
            return candidate
    raise ConfigError(
        f"no kzbuild project found at or above {start} (looked for a recipes/ folder)",
        hint="run inside the kzbuild repo, or pass --project / set KZ_PROJECT",
    )
