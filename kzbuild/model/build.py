"""Builds: targets, build options and the plan of one build.

A build leaves an artifact, ``<artifacts>/<build-id>/`` with ``bin/``, ``lib/`` and
``manifest.json``: see :mod:`kzbuild.model.artifact` (read it with
``kzbuild.build.builder.load_manifest``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kzbuild.model.artifact import Artifact
from kzbuild.model.remotecache import RemoteOutcome

MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class BuildTarget:
    """What a build is for: the toolchains it needs and the cmake options it adds."""

    name: str
    description: str
    toolchains: tuple[str, ...]  # default toolchain per role, looked up in toolchains/
    optional: tuple[str, ...] = ()  # used when present (an OpenCL SDK), never required
    cmake: tuple[tuple[str, str], ...] = ()
    extra_libs: tuple[str, ...] = ()  # globs in the build dir, besides bin/lib*.so
    required_libs: tuple[str, ...] = ()  # the artifact is incomplete without these


@dataclass(frozen=True)
class BuildOptions:
    """How to build, beyond the recipe and the target; none of it enters the build id except through
    what it selects."""

    jobs: int | None = None  # default: the number of CPUs
    overrides: tuple[str, ...] = ()  # toolchains that replace the target's ones of the same role
    extra_tools: tuple[str, ...] = ()  # tools built besides the recipe's
    artifacts: Path | None = None  # default: Settings.artifacts


@dataclass(frozen=True)
class BuildStep:
    """One command of a build, exactly as it runs."""

    name: str  # configure | build
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()  # added to the environment
    cwd: Path | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "argv": list(self.argv),
            "env": dict(self.env),
            "cwd": str(self.cwd) if self.cwd else None,
        }


@dataclass(frozen=True)
class BuildPlan:
    """Everything a build will do, computed before anything runs (``--dry-run`` prints it)."""

    recipe: str
    target: str
    build_id: str
    build_commit: str  # what the binaries report (LLAMA_BUILD_COMMIT)
    lock_sha256: (
        str  # sha256 of the recipe's lock (recipes/<recipe>.lock.json) the tree was synced to
    )
    inputs: Mapping[str, Any]  # everything hashed into the build id
    source: Path
    build_dir: Path
    artifact_dir: Path
    log: Path
    steps: tuple[BuildStep, ...]
    tools: tuple[str, ...]
    lib_globs: tuple[str, ...]
    required_libs: tuple[str, ...]
    toolchains: Mapping[str, Mapping[str, object]]  # name -> what was found (version, proof, ...)
    missing: tuple[str, ...] = ()  # problems of required toolchains that were not found
    runner: tuple[str, ...] = ()  # prefix to run the built tools on this machine (qemu)

    def step(self, name: str) -> BuildStep:
        return next(s for s in self.steps if s.name == name)

    def to_dict(self) -> dict[str, object]:
        return {
            "recipe": self.recipe,
            "target": self.target,
            "build_id": self.build_id,
            "build_commit": self.build_commit,
            "lock_sha256": self.lock_sha256,
            "source": str(self.source),
            "build_dir": str(self.build_dir),
            "artifact": str(self.artifact_dir),
            "log": str(self.log),
            "steps": [s.to_dict() for s in self.steps],
            "tools": list(self.tools),
            "toolchains": dict(self.toolchains),
            "missing": list(self.missing),
            "runner": list(self.runner),
            "inputs": dict(self.inputs),
        }


@dataclass(frozen=True)
class BuildEvent:
    stage: str  # sync | configure | build | collect
    line: str = ""
    done: int | None = None
    total: int | None = None


@dataclass(frozen=True)
class CcacheStats:
    hits: int
    misses: int
    remote_hits: int = 0  # of the hits, those ccache's remote storage served
    remote_errors: int = (
        0  # compiles whose remote lookup failed or timed out (they went on locally)
    )

    @property
    def hit_rate(self) -> float | None:
        calls = self.hits + self.misses
        return self.hits / calls if calls else None

    def to_dict(self) -> dict[str, object]:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "hit_rate": self.hit_rate,
            "local_hits": self.hits - self.remote_hits,
            "remote_hits": self.remote_hits,
            "remote_errors": self.remote_errors,
        }


@dataclass(frozen=True)
class BuildResult:
    plan: BuildPlan
    artifact: Artifact
    reused: bool
    synced: bool  # the sync before the build changed the tree
    ccache: CcacheStats | None = None
    times: Mapping[str, float] = field(default_factory=dict)
    remote: RemoteOutcome | None = None  # what the remote cache did (None: none configured)


# The v79 compile check (kzbuild.build.v79check), named here so the CLI can describe it without
# loading it.
V79_CHECK_TARGET = "v79-check"
V79_CHECK_DESCRIPTION = (
    "compile every Hexagon source (HTP for hexagonv79 + HVX 128B, host backend for aarch64) "
    "without the SDK: compilation only"
)
V79_CHECK_PROVES = (
    "compilation only: every HTP source compiled for hexagonv79 (HVX 128B) and the host backend "
    "for aarch64; nothing linked, nothing run"
)
