"""Shared fixtures: real git repos in temp dirs, a temp kzbuild project, the CLI in-process."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kzbuild.adapters import yamlconf
from kzbuild.adapters.settings import Settings
from kzbuild.cli import main
from tests.cachedir import persistent_cache_root

# Fixture modules are plugins, registered once here: a session fixture (real_host_build, sshd,
# adb_server, pin_tree) then starts once per session, where importing it into each test module
# would start it once per module. Test modules import only helpers from them, never fixtures.
pytest_plugins = (
    "tests.fixtures_build",
    "tests.fixtures_git",
    "tests.fixtures_gdn",
    "tests.fixtures_index",
    "tests.fixtures_ssh",
    "tests.fixtures_cache",
    "tests.fixtures_trees",
    "tests.adbdevice.fixtures",
    "tests.heartbeat",  # a line at least once a minute while a test (a cold host build) runs long
)

REPO_ROOT = Path(__file__).resolve().parent.parent
PIN_0_3_36 = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
PIN_0_3_24 = "af6528e6df5d798f7f1363ec1141699be0f638e2"
PIN_0_3_21 = "f53577432541bb9edc1588c4ef45c66bf07e4468"

GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "Upstream Dev",
    "GIT_AUTHOR_EMAIL": "dev@upstream.example",
    "GIT_COMMITTER_NAME": "Upstream Dev",
    "GIT_COMMITTER_EMAIL": "dev@upstream.example",
}


def git(repo: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Plain git for building test fixtures (kzbuild's own calls go through
    kzbuild.adapters.proc)."""
    result = subprocess.run(
        ["git", "-C", str(repo), *args],
        env={**os.environ, **GIT_ENV, **(env or {})},
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed: {result.stderr}")
    return result.stdout.strip()


class UpstreamRepo:
    """A synthetic upstream llama.cpp: a real git repo with deterministic commits."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._tick = 0
        path.mkdir(parents=True)
        git(path, "init", "-q", "-b", "master")

    def commit(self, files: dict[str, str | None], message: str) -> str:
        """Write (or, with None, delete) files and commit them with a deterministic date."""
        for name, content in files.items():
            target = self.path / name
            if content is None:
                target.unlink()
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content)
        git(self.path, "add", "-A")
        self._tick += 1
        date = f"{1_700_000_000 + self._tick * 60} +0000"
        git(
            self.path,
            "commit",
            "-q",
            "-m",
            message,
            env={"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date},
        )
        return git(self.path, "rev-parse", "HEAD")

    def head(self) -> str:
        return git(self.path, "rev-parse", "HEAD")


@pytest.fixture
def upstream(tmp_path: Path) -> UpstreamRepo:
    repo = UpstreamRepo(tmp_path / "upstream")
    repo.commit(
        {
            "README.md": "llama.cpp (synthetic)\n",
            "common/fit.cpp": "".join(f"// line {i}\n" for i in range(1, 41)),
            "ggml/src/ggml.c": "int ggml_answer(void) { return 42; }\n",
        },
        "initial import",
    )
    return repo


# The identity a contributor running kzbuild has in these tests: ``patches new`` without
# --author reads it from the user's git config, here the session's own (see own_git_config).
CONTRIBUTOR = ("Kz Contributor", "contributor@kzbuild.example")
MACHINE_GIT_ENV = (
    "GIT_AUTHOR_NAME",
    "GIT_AUTHOR_EMAIL",
    "GIT_COMMITTER_NAME",
    "GIT_COMMITTER_EMAIL",
    "EMAIL",
)


def write_git_config(path: Path, **sections: dict[str, str]) -> Path:
    """A git config file with ``sections`` ({"user": {"name": ...}}), for GIT_CONFIG_GLOBAL."""
    path.write_text(
        "".join(
            f"[{name}]\n" + "".join(f"\t{k} = {v}\n" for k, v in keys.items())
            for name, keys in sections.items()
        )
    )
    return path


@pytest.fixture(scope="session", autouse=True)
def own_git_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Every git in the session, kzbuild's and the fixtures', reads this session's config, never the
    machine's: a global config file the session wrote (user.useConfigOnly: no identity guessed from
    the host name), no system config, and no identity from the environment."""
    config = write_git_config(
        tmp_path_factory.mktemp("git-home") / "gitconfig",
        user={"name": CONTRIBUTOR[0], "email": CONTRIBUTOR[1], "useConfigOnly": "true"},
        init={"defaultBranch": "master"},
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GIT_CONFIG_GLOBAL", str(config))
        patch.setenv("GIT_CONFIG_NOSYSTEM", "1")
        for name in MACHINE_GIT_ENV:
            patch.delenv(name, raising=False)
        yield config


@pytest.fixture(autouse=True)
def parse_yaml_afresh() -> Iterator[None]:
    """The CLI keeps parsed YAML in its settings' cache dir for the rest of the process: each test
    starts without."""
    yield
    yamlconf.remember_parsed_in(None)


@dataclass
class Project:
    """A kzbuild project in a temp dir, with its own cache and work dirs."""

    root: Path
    cache: Path
    work: Path

    @property
    def settings(self) -> Settings:
        return Settings(project=self.root, cache=self.cache, work=self.work)

    def write(self, relpath: str, text: str) -> Path:
        path = self.root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def recipe(self, name: str, *, commit: str, sources: list[str], extra: str = "") -> Path:
        """Write recipes/NAME.yaml; ``sources`` are YAML lines like ``git: file:///x``."""
        lines = [
            f"description: test recipe {name}",
            "upstream:",
            "  remote: https://example.invalid/llama.cpp",
            f"  commit: {commit}",
            "  sources:",
            *[f"    - {source}" for source in sources],
        ]
        return self.write(f"recipes/{name}.yaml", "\n".join(lines) + "\n" + extra)

    def series(self, *names: str) -> Path:
        return self.write("patches/series", "# test series\n" + "".join(f"{n}\n" for n in names))


@pytest.fixture
def project(tmp_path: Path) -> Project:
    root = tmp_path / "project"
    for folder in ("recipes", "patches", "kernels"):
        (root / folder).mkdir(parents=True)
    (root / "patches" / "series").write_text("")
    return Project(root=root, cache=tmp_path / "cache", work=tmp_path / "work")


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def kz(project: Project, capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    """Run the kzbuild CLI in-process against the temp project."""

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        code = main(
            [
                "--project",
                str(project.root),
                "--cache-dir",
                str(project.cache),
                "--work-dir",
                str(project.work),
                *args,
            ]
        )
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


def persistent_test_cache() -> Path:
    """A cache kept between test runs for downloads (sdists): CI downloads each once per machine."""
    path = persistent_cache_root()
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def shared_cache() -> Path:
    return persistent_test_cache()


def have(program: str) -> bool:
    return shutil.which(program) is not None
