"""``kzbuild build``: build llama.cpp for a target into a content-addressed artifact.

The build id is a hash of everything that decides the binaries: the upstream tree, the
patch and overlay digests, the recipe's build section, the target, the toolchains' names and
versions and kzbuild's version. An artifact whose id exists is reused without running cmake.

Planning (:func:`prepare`, :func:`plan_build`) is separate from building (:func:`build`):
``--dry-run``
prints the plan, which holds every command and environment variable exactly as they would
run. Nothing is ever written into the source tree: every option is on cmake's command line
and the build dir lives under the work dir.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from kzbuild import __version__
from kzbuild.adapters import proc
from kzbuild.adapters.filelock import locked
from kzbuild.adapters.files import sha256_file
from kzbuild.adapters.settings import Settings
from kzbuild.build import kztools, remotecache
from kzbuild.build.artifacts import (
    existing_artifact,
    load_artifact,
    manifest_json,
    publish,
    recorded_manifests,
    staged,
)
from kzbuild.build.toolchains import Detector
from kzbuild.errors import BuildFailed, ConfigError, ToolchainMissing, WorktreeError
from kzbuild.model.artifact import MANIFEST, Artifact
from kzbuild.model.build import (
    MANIFEST_FORMAT,
    V79_CHECK_TARGET,
    BuildEvent,
    BuildOptions,
    BuildPlan,
    BuildResult,
    BuildStep,
    BuildTarget,
    CcacheStats,
)
from kzbuild.model.recipe import Recipe
from kzbuild.model.remotecache import RemoteConfig
from kzbuild.model.sync import Lock, SyncResult
from kzbuild.model.toolchain import Found
from kzbuild.source.sync import Worktree, sync

__all__ = ["Artifact", "BuildOptions", "TARGETS", "build", "load_manifest", "plan_build", "prepare"]

log = logging.getLogger(__name__)

# Options every target gets. Shared libraries with an rpath of ../lib so bin/ runs from the
# artifact; unversioned sonames so lib/ holds one file per library; no network at build time.
COMMON_CMAKE: tuple[tuple[str, str], ...] = (
    ("CMAKE_BUILD_TYPE", "Release"),
    ("BUILD_SHARED_LIBS", "ON"),
    ("CMAKE_BUILD_WITH_INSTALL_RPATH", "ON"),
    ("CMAKE_INSTALL_RPATH", "$ORIGIN/../lib;$ORIGIN"),
    ("CMAKE_PLATFORM_NO_VERSIONED_SONAME", "ON"),
    ("GGML_OPENMP", "OFF"),
    ("GGML_CCACHE", "OFF"),  # kzbuild sets the compiler launcher itself
    ("LLAMA_BUILD_TESTS", "ON"),
    ("LLAMA_BUILD_TOOLS", "ON"),
    ("LLAMA_BUILD_EXAMPLES", "OFF"),
    ("LLAMA_BUILD_APP", "OFF"),
    ("LLAMA_OPENSSL", "OFF"),
)
SERVER_TOOLS = ("llama-cli", "llama-server")  # exist only with LLAMA_BUILD_SERVER=ON

# Upstream's arm64-android-snapdragon-release preset
# (docs/backend/snapdragon/CMakeUserPresets.json),
# passed on the command line instead of copying the presets file into the tree.
SNAPDRAGON_FLAGS = (
    "-march=armv8.7a+fp16+dotprod+i8mm -fvectorize -ffp-model=fast -fno-finite-math-only -flto "
    "-D_GNU_SOURCE"
)

TARGETS: dict[str, BuildTarget] = {
    "host": BuildTarget(
        name="host",
        description="this machine, CPU backend (tools run in place)",
        toolchains=("host-gcc", "cmake", "ninja", "ccache"),
        # Not -march=native: a build id names one binary on every machine, and native code from a
        # machine that advertises AMX or AVX-512 dies with SIGILL where they are missing or not
        # granted (seen on a VM). With NATIVE off, upstream enables SSE4.2/AVX/AVX2/BMI2/FMA/F16C.
        cmake=(("GGML_NATIVE", "OFF"),),
    ),
    "linux-arm64": BuildTarget(
        name="linux-arm64",
        description="aarch64 Linux, CPU backend (runs here under qemu-aarch64; a stand-in tablet)",
        toolchains=("aarch64-linux-gnu", "cmake", "ninja", "ccache"),
        cmake=(("GGML_NATIVE", "OFF"), ("GGML_CPU_ARM_ARCH", "armv8.2-a+dotprod+fp16+i8mm")),
    ),
    "v79": BuildTarget(
        name="v79",
        description="Android arm64 + Hexagon v79 NPU (Snapdragon 8 Elite), upstream's snapdragon "
        "preset",
        toolchains=("ndk-r27d", "hexagon-sdk-6.5", "cmake", "ninja", "ccache"),
        optional=("opencl-sdk",),
        cmake=(
            ("ANDROID_ABI", "arm64-v8a"),
            ("ANDROID_PLATFORM", "android-34"),
            ("CMAKE_C_FLAGS", SNAPDRAGON_FLAGS),
            ("CMAKE_CXX_FLAGS", SNAPDRAGON_FLAGS),
            ("CMAKE_C_FLAGS_RELEASE", "-O3 -DNDEBUG"),
            ("CMAKE_CXX_FLAGS_RELEASE", "-O3 -DNDEBUG"),
            ("PREBUILT_LIB_DIR", "android_aarch64"),
            ("GGML_OPENMP", "OFF"),
            ("GGML_LLAMAFILE", "OFF"),
            ("GGML_OPENCL", "OFF"),  # the opencl-sdk toolchain turns it on when present
            ("GGML_HEXAGON", "ON"),
            ("LLAMA_OPENSSL", "OFF"),
        ),
        # ggml-hexagon builds the skels for v73..v81 beside its own build dir.
        extra_libs=("ggml/src/ggml-hexagon/libggml-htp-v*.so",),
        required_libs=("libggml-hexagon.so", "libggml-htp-v79.so"),
    ),
}
BUILD_TOOL_ROLES = ("cmake", "ninja", "ccache")  # a container toolchain brings its own


# What `kzbuild build` and `kzbuild ci` take: the targets, and the compile check (build.v79check).
BUILD_TARGETS = (*TARGETS, V79_CHECK_TARGET)


def target(name: str) -> BuildTarget:
    try:
        return TARGETS[name]
    except KeyError:
        raise ConfigError(
            f"unknown target '{name}'", hint=f"targets: {', '.join(TARGETS)}"
        ) from None


def check_build_targets(names: Sequence[str]) -> None:
    """An unknown name among targets build and ci were given is a usage error, before any work."""
    for name in names:
        if name not in BUILD_TARGETS:
            hint = f"targets: {', '.join(BUILD_TARGETS)}"
            raise ConfigError(f"unknown target '{name}'", hint=hint)


def artifacts_root(settings: Settings, override: Path | None = None) -> Path:
    return (override or settings.artifacts).resolve()


def load_manifest(path: Path) -> Artifact:
    """Read an artifact from its folder or its ``manifest.json`` (every listed file must be
    there)."""
    return load_artifact(path if path.is_dir() else path.parent)


# --- toolchain selection ---------------------------------------------------------------


def select_toolchains(tgt: BuildTarget, overrides: Sequence[str], detector: Detector) -> list[str]:
    """The target's toolchains, with each override replacing the ones that fill the same roles."""
    chosen = list(tgt.toolchains)
    for name in overrides:
        spec = detector.spec(name)
        roles = set(spec.provides)
        replaced = [t for t in chosen if roles & set(detector.spec(t).provides)]
        if not replaced:
            raise ConfigError(
                f"toolchain '{name}' ({', '.join(spec.provides)}) replaces nothing target "
                f"{tgt.name} uses",
                hint=f"{tgt.name} uses: {', '.join(chosen)}",
            )
        chosen = [t for t in chosen if t not in replaced]
        chosen.insert(0, name)
        if spec.image is not None:  # the container brings cmake, ninja and ccache
            chosen = [
                t for t in chosen if not set(detector.spec(t).provides) & set(BUILD_TOOL_ROLES)
            ]
    return chosen


def detect_for(
    tgt: BuildTarget, overrides: Sequence[str], detector: Detector, needed_by: str
) -> tuple[list[Found], list[Found]]:
    required = [
        detector.find(name, needed_by=needed_by)
        for name in select_toolchains(tgt, overrides, detector)
    ]
    optional = [
        detector.find(name, needed_by=needed_by) for name in tgt.optional if name in detector.specs
    ]
    return required, optional


# --- the plan --------------------------------------------------------------------------


def stack_digest(lock: Lock) -> str:
    """One digest for the applied patches and overlays: what the binaries carry besides upstream."""
    digest = hashlib.sha256()
    for patch in lock.patches:
        digest.update(f"{patch.file}\0{patch.sha256}\n".encode())
    digest.update(f"overlays\0{lock.overlay_digest}\n".encode())
    return digest.hexdigest()


def lock_sha256(lock: Lock) -> str:
    """The sha256 of the lock file's bytes as sync wrote them."""
    return hashlib.sha256(lock.to_json().encode()).hexdigest()


# <work>/build/<recipe>/source -> the recipe's worktree; cmake -S goes through it
SOURCE_LINK = "source"


def recipe_build_dir(settings: Settings, recipe: Recipe) -> Path:
    """The work dir's folder for the builds of ``recipe`` (one subfolder per target)."""
    return settings.work / "build" / recipe.name.replace("/", "--")


def build_commit(lock: Lock, build_id: str | None = None) -> str:
    """What the binaries report as their commit (llama-bench's build_commit, every tool's
    --version): the upstream commit and the stack's digest, then ``+BUILD-ID`` when given."""
    commit = f"{lock.upstream_commit[:7]}-kz{stack_digest(lock)[:8]}"
    return f"{commit}+{build_id}" if build_id else commit


def effective_tools(recipe: Recipe, extra: Sequence[str]) -> tuple[str, ...]:
    tools = list(recipe.build.tools)
    tools += [t for t in extra if t not in tools]
    return tuple(tools)


def target_cmake(tgt: BuildTarget) -> dict[str, str]:
    """The cmake definitions every build of ``tgt`` starts from (hashed into its build id)."""
    return dict((*COMMON_CMAKE, *tgt.cmake))


def build_inputs(
    recipe: Recipe,
    lock: Lock,
    tgt: BuildTarget,
    tools: Sequence[str],
    toolchains: Sequence[Found],
    kz_tools: Mapping[str, str] | None = None,
) -> dict[str, object]:
    """Everything hashed into the build id. Paths never enter: the same inputs anywhere give the
    same id."""
    inputs: dict[str, object] = {
        **source_inputs(tgt.name, lock),
        # the target's own definitions too: a change to them is a different binary under any version
        "build": {
            "tools": list(tools),
            "cmake": dict(recipe.build.cmake),
            "target_cmake": target_cmake(tgt),
        },
        "toolchains": [found.identity() for found in sorted(toolchains, key=lambda f: f.name)],
    }
    if kz_tools:  # kzbuild's own tools (kztools.py) and the digests of their sources
        inputs["kz_tools"] = dict(kz_tools)
    return inputs


def source_inputs(target_name: str, lock: Lock) -> dict[str, object]:
    """What every build id hashes of the sources: kzbuild's version, the target, the upstream tree,
    the patches sync applied (one the pin already holds changes no source) and the overlays."""
    return {
        "kzbuild": __version__,
        "target": target_name,
        "upstream": {"commit": lock.upstream_commit, "tree": lock.upstream_tree},
        "patches": [[p.file, p.sha256] for p in lock.patches if p.commit is not None],
        "overlays": lock.overlay_digest,
    }


def build_id_of(target_name: str, inputs: Mapping[str, object]) -> str:
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return f"{target_name}-{hashlib.sha256(canonical.encode()).hexdigest()[:16]}"


def plan_build(
    settings: Settings,
    recipe: Recipe,
    synced: SyncResult,
    tgt: BuildTarget,
    toolchains: Sequence[Found],
    optional: Sequence[Found] = (),
    *,
    options: BuildOptions = BuildOptions(),
) -> BuildPlan:
    """The exact commands of a build. Runs nothing; reads only the sources of kzbuild's own tools
    (for their digest)."""
    present = [f for f in optional if f.ok]
    used = [*toolchains, *present]
    tools = effective_tools(recipe, options.extra_tools)
    llama_tools, own_tools = kztools.split_tools(tools)
    kernels = settings.project / "kernels"
    inputs = build_inputs(recipe, synced.lock, tgt, tools, used, kztools.inputs(kernels, own_tools))
    build_id = build_id_of(tgt.name, inputs)
    # not an input of the id: the binaries name the build they are
    commit = build_commit(synced.lock, build_id)
    root = artifacts_root(settings, options.artifacts)
    build_dir = recipe_build_dir(settings, recipe) / "+".join([tgt.name, *options.overrides])
    jobs = options.jobs or os.cpu_count() or 1
    container = next((f for f in toolchains if f.spec.image is not None), None)

    def program(key: str) -> str:
        if container is not None:
            return key  # found on the container's PATH
        for found in toolchains:
            value = dict(found.values).get(key)
            if value:
                return value
        return f"<{key}>"

    cmake_defs = target_cmake(tgt)
    for found in used:
        cmake_defs.update(found.cmake_options())
    cmake_defs["LLAMA_BUILD_SERVER"] = "ON" if set(tools) & set(SERVER_TOOLS) else "OFF"
    if cmake_defs["LLAMA_BUILD_SERVER"] == "ON":
        cmake_defs["LLAMA_USE_PREBUILT_UI"] = "OFF"  # it would download the web UI at build time
    cmake_defs["CMAKE_C_COMPILER_LAUNCHER"] = program("ccache")
    cmake_defs["CMAKE_CXX_COMPILER_LAUNCHER"] = program("ccache")
    cmake_defs["CMAKE_MAKE_PROGRAM"] = program("ninja")
    cmake_defs.update(recipe.build.cmake)
    cmake_defs["LLAMA_BUILD_COMMIT"] = commit  # last: the binaries always say what they are

    ccache_dir = settings.ccache
    env: dict[str, str] = {
        "CCACHE_DIR": str(ccache_dir),
        # Paths under the work dir hash as relative ones, so two work dirs share cache entries.
        "CCACHE_BASEDIR": str(settings.work),
        "CCACHE_NOHASHDIR": "1",
        "CCACHE_SLOPPINESS": "time_macros",
        "CCACHE_STATSLOG": str(build_dir / "ccache-stats.log"),
        "NINJA_STATUS": "[%f/%t] ",
    }
    for found in used:
        env.update(found.environment())
    source_dir = synced.worktree
    if container is None:
        # The compiler sees the tree as ../source from every build dir (a link next to them), and
        # ccache's base_dir makes that relative: one tree's objects hit the cache whatever the
        # work dir or recipe name (tests/test_roll_honest.py). The prefix maps keep the absolute
        # build dir out of debug info and __FILE__ too.
        source_dir = build_dir.parent / SOURCE_LINK
        maps = f"-ffile-prefix-map={build_dir}=. -ffile-prefix-map={source_dir}=../{SOURCE_LINK}"
        for flags in ("CFLAGS", "CXXFLAGS"):
            env[flags] = " ".join(filter(None, (env.get(flags), maps)))

    configure = [program("cmake"), "-S", str(source_dir), "-B", str(build_dir), "-G", "Ninja"]
    configure += [f"-D{key}={value}" for key, value in cmake_defs.items()]
    ninja = [program("ninja"), "-C", str(build_dir), "-j", str(jobs), *llama_tools]
    steps = [
        BuildStep("configure", tuple(configure), tuple(env.items())),
        BuildStep("build", tuple(ninja), tuple(env.items())),
    ]
    steps += kztools.steps(
        kernels,
        own_tools,
        cmake=program("cmake"),
        ninja=program("ninja"),
        cmake_defs=cmake_defs,
        source=synced.worktree,
        build_dir=build_dir,
        env=tuple(env.items()),
    )
    if container is not None:
        mounts = [synced.worktree, build_dir, ccache_dir, *([kernels] if own_tools else [])]
        steps = [_in_container(step, container, mounts) for step in steps]

    runner = next((tuple(f.runner()) for f in toolchains if f.spec.runner), ())
    return BuildPlan(
        recipe=recipe.name,
        target=tgt.name,
        build_id=build_id,
        build_commit=commit,
        lock_sha256=lock_sha256(synced.lock),
        inputs=inputs,
        source=synced.worktree,
        build_dir=build_dir,
        artifact_dir=root / build_id,
        log=root / f"{build_id}.log",
        steps=tuple(steps),
        tools=tools,
        lib_globs=("bin/lib*.so", *tgt.extra_libs),
        required_libs=tgt.required_libs,
        toolchains={f.name: f.to_dict() for f in used},
        missing=tuple(problem for f in toolchains if not f.ok for problem in f.problems[:1]),
        runner=runner,
    )


def _in_container(step: BuildStep, container: Found, mounts: Sequence[Path]) -> BuildStep:
    """The same command inside the toolchain image, with the folders it touches mounted at the same
    paths."""
    argv = [container.render("{docker}"), "run", "--rm", "--user", f"{os.getuid()}:{os.getgid()}"]
    for mount in mounts:
        argv += ["--volume", f"{mount}:{mount}"]
    argv += ["--workdir", str(mounts[0])]
    for key, value in step.env:
        argv += ["--env", f"{key}={value}"]
    argv += [container.render("{image}"), *step.argv]
    return BuildStep(step.name, tuple(argv), (), step.cwd)


# --- running ---------------------------------------------------------------------------


BuildProgress = Callable[[BuildEvent], None]


NINJA_PROGRESS = re.compile(r"^\[(\d+)/(\d+)\] (.*)$")
ERROR_LINE = re.compile(
    r"(\berror:|FAILED:|CMake Error|undefined reference|No such file or directory)", re.I
)


class _NinjaProgress:
    """Follows ninja's ``[n/N]`` lines; sub-builds (the HTP skels) print smaller totals and are
    ignored."""

    def __init__(self, progress: BuildProgress | None, stage: str) -> None:
        self.progress = progress
        self.stage = stage
        self.done = 0
        self.total = 0
        self.tail: deque[str] = deque(maxlen=200)

    def __call__(self, line: str) -> None:
        self.tail.append(line)
        match = NINJA_PROGRESS.match(line)
        if match:
            done, total = int(match.group(1)), int(match.group(2))
            if total > self.total:
                self.total, self.done = total, done
            elif total == self.total:
                self.done = max(self.done, done)
        if self.progress:
            self.progress(BuildEvent(self.stage, line, self.done or None, self.total or None))

    def errors(self) -> list[str]:
        lines = list(self.tail)
        interesting = [line for line in lines if ERROR_LINE.search(line)]
        return (interesting or lines)[-15:]


@dataclass(frozen=True)
class Prepared:
    """A synced tree and the plan of its build."""

    plan: BuildPlan
    synced: bool  # the sync changed the tree
    sync_seconds: float
    worktree: Worktree
    lock: Lock  # what the sync resolved: the plan (and its build id) was made from its head

    @property
    def head(self) -> str:
        return self.lock.head


def prepare(
    settings: Settings,
    recipe: Recipe,
    target_name: str,
    *,
    environ: Mapping[str, str],
    options: BuildOptions = BuildOptions(),
    progress: BuildProgress | None = None,
) -> Prepared:
    """Sync when needed, find the toolchains and plan the build (all ``--dry-run`` does)."""
    tgt = target(target_name)
    detector = Detector.for_settings(settings, environ)
    select_toolchains(tgt, options.overrides, detector)  # bad overrides fail before any work
    synced, sync_seconds = timed_sync(settings, recipe, progress)
    required, optional = detect_for(tgt, options.overrides, detector, f"recipe {recipe.name}")
    plan = plan_build(settings, recipe, synced, tgt, required, optional, options=options)
    return Prepared(plan, synced.changed, sync_seconds, Worktree(settings, recipe), synced.lock)


def timed_sync(
    settings: Settings, recipe: Recipe, progress: BuildProgress | None
) -> tuple[SyncResult, float]:
    """Sync ``recipe`` (its lines as "sync" events) and the seconds it took."""
    started = time.monotonic()
    synced = sync(
        settings,
        recipe,
        progress=(lambda line: progress(BuildEvent("sync", line))) if progress else None,
    )
    return synced, round(time.monotonic() - started, 3)


@dataclass(frozen=True)
class PreviousBuild:
    """The last build recorded for a target: what to expect of the next one."""

    build_id: str
    started: str  # UTC, ISO 8601
    seconds: float  # configure, ninja and collect: a build's time once its tree is synced


def previous_build(root: Path, target_name: str) -> PreviousBuild | None:
    """The most recently started build of ``target_name`` whose manifest is under ``root``."""
    latest: PreviousBuild | None = None
    for _, doc in recorded_manifests(root):
        times = doc.get("times")
        if (
            doc.get("target") != target_name
            or not isinstance(times, dict)
            or not isinstance(times.get("started"), str)
        ):
            continue
        seconds = sum(
            value
            for key in ("configure_s", "build_s", "collect_s")
            if isinstance(value := times.get(key), (int, float))
        )
        if latest is None or times["started"] > latest.started:
            latest = PreviousBuild(str(doc.get("build_id")), times["started"], round(seconds, 1))
    return latest


def missing_toolchains_error(plan: BuildPlan) -> ToolchainMissing:
    return ToolchainMissing(
        f"cannot build {plan.recipe} for {plan.target}:\n  " + "\n  ".join(plan.missing),
        hint=f"run 'kzbuild doctor --target {plan.target}' for every check; see "
        "toolchains/README.md",
    )


def build(
    prepared: Prepared,
    *,
    progress: BuildProgress | None = None,
    remote: RemoteConfig | None = None,
    on_no_artifact: Callable[[BuildPlan], None] | None = None,
) -> BuildResult:
    """Reuse the artifact of the plan's build id, or pull it from the remote cache, or run the plan:
    configure (when its command changed), ninja (with ccache's remote storage), then copy the
    outputs into the artifact and push it to the remote cache. ``on_no_artifact`` is called first
    when no artifact of the build id is here."""
    plan = prepared.plan
    cache_dir = prepared.worktree.settings.cache
    existing = existing_artifact(plan.artifact_dir.parent, plan.build_id)
    if existing is not None:
        remotecache.count_lookup(cache_dir, "local")
        return BuildResult(
            plan,
            existing,
            reused=True,
            synced=prepared.synced,
            times={"sync_s": prepared.sync_seconds},
        )
    if on_no_artifact is not None:
        on_no_artifact(plan)
    if plan.missing:
        raise missing_toolchains_error(plan)
    shared = remotecache.RemoteCache.open(remote) if remote is not None else None
    try:
        pulled = shared.pull(plan) if shared is not None else None
        if pulled is not None and shared is not None:
            remotecache.count_lookup(cache_dir, "pulled")
            return BuildResult(
                plan,
                pulled,
                reused=True,
                synced=prepared.synced,
                times={"sync_s": prepared.sync_seconds},
                remote=shared.outcome(),
            )
        result = _build_locked(
            prepared, progress, shared.ccache_env() if shared is not None else {}
        )
        if shared is not None and not result.reused:
            shared.push(result.artifact)
    finally:
        if shared is not None:
            shared.close()
    if result.ccache is not None and result.ccache.remote_errors:
        log.warning(
            "ccache's remote storage failed for %d of %d compiles (an error or no answer in time); "
            "they used the local cache",
            result.ccache.remote_errors,
            result.ccache.hits + result.ccache.misses,
        )
    remotecache.count_lookup(cache_dir, "local" if result.reused else "built")
    return replace(result, remote=shared.outcome()) if shared is not None else result


def _build_locked(
    prepared: Prepared, progress: BuildProgress | None, run_env: Mapping[str, str]
) -> BuildResult:
    plan = prepared.plan
    plan.build_dir.mkdir(parents=True, exist_ok=True)
    _link_source(plan.build_dir.parent / SOURCE_LINK, plan.source)
    with locked(
        plan.build_dir.with_name(plan.build_dir.name + ".lock"),
        what=f"the build dir {plan.build_dir}",
        wait=600,
    ):
        existing = existing_artifact(plan.artifact_dir.parent, plan.build_id)
        if existing is not None:  # another process built it while we waited
            return BuildResult(
                plan,
                existing,
                reused=True,
                synced=prepared.synced,
                times={"sync_s": prepared.sync_seconds},
            )
        # Compile only the tree the build id was computed from: no sync may move it meanwhile
        # (ccache would otherwise file objects of one tree under another's build).
        with prepared.worktree.lock(shared=True, wait=600):
            state = prepared.worktree.state()
            if state.head != prepared.head or state.dirty:
                raise WorktreeError(
                    f"the worktree {state.path} changed since the build of {plan.recipe} was "
                    "planned "
                    f"(head {(state.head or 'none')[:12]}, planned {prepared.head[:12]}"
                    + (", with uncommitted changes" if state.dirty else "")
                    + ")",
                    hint=f"run 'kzbuild sync {plan.recipe}' (or commit and export your changes), "
                    "then build again",
                )
            return _execute_locked(plan, progress, prepared.synced, prepared.sync_seconds, run_env)


def _execute_locked(
    plan: BuildPlan,
    progress: BuildProgress | None,
    synced: bool,
    sync_seconds: float,
    run_env: Mapping[str, str],
) -> BuildResult:
    started_at = datetime.now(timezone.utc)
    times: dict[str, float] = {"sync_s": sync_seconds}
    plan.log.parent.mkdir(parents=True, exist_ok=True)
    plan.log.write_text(
        f"# kzbuild {__version__}: {plan.recipe} for {plan.target}, build id {plan.build_id}\n"
    )

    configure, ninja = plan.step("configure"), plan.step("build")
    stamp = plan.build_dir / "kz-configure.json"
    wanted = json.dumps(configure.to_dict(), sort_keys=True)
    if _needs_configure(plan.build_dir, stamp, wanted):
        stamp.unlink(missing_ok=True)
        _forget_other_source(plan.build_dir, configure.argv[configure.argv.index("-S") + 1])
        times["configure_s"] = _run_step(plan, configure, progress)
        stamp.write_text(wanted)
    else:
        times["configure_s"] = 0.0
        if progress:
            progress(BuildEvent("configure", "configuration unchanged; cmake not run"))

    stats_log = Path(dict(ninja.env).get("CCACHE_STATSLOG", plan.build_dir / "ccache-stats.log"))
    stats_log.unlink(missing_ok=True)
    times["build_s"] = _run_step(plan, ninja, progress, run_env)
    for step in plan.steps[2:]:  # kzbuild's own tools, against the libraries just built
        times[f"{step.name}_s"] = _run_step(plan, step, progress, run_env)

    collect_started = time.monotonic()
    if progress:
        progress(BuildEvent("collect", f"copying into {plan.artifact_dir}"))
    ccache = read_ccache_log(stats_log)
    artifact = _collect(plan, ccache, times, started_at, collect_started)
    return BuildResult(
        plan,
        artifact,
        reused=False,
        synced=synced,
        ccache=ccache,
        times=dict(artifact.manifest["times"]),
    )


def _link_source(link: Path, source: Path) -> None:
    """Point the recipe's source link at its worktree (its targets' builds may race to make it)."""
    if link.is_symlink() and link.readlink() == source:
        return
    link.unlink(missing_ok=True)
    try:
        link.symlink_to(source, target_is_directory=True)
    except FileExistsError:
        if link.readlink() != source:
            raise


def _forget_other_source(build_dir: Path, source: str) -> None:
    """A build dir configured from another source path (before the source link) is configured
    afresh: cmake refuses a cache made for another source dir."""
    cache = build_dir / "CMakeCache.txt"
    try:
        text = cache.read_text(errors="replace")
    except FileNotFoundError:
        return
    home = next(
        (
            line.partition("=")[2]
            for line in text.splitlines()
            if line.startswith("CMAKE_HOME_DIRECTORY:")
        ),
        None,
    )
    if home is not None and home != source:
        cache.unlink()
        shutil.rmtree(build_dir / "CMakeFiles", ignore_errors=True)


def _needs_configure(build_dir: Path, stamp: Path, wanted: str) -> bool:
    if not (build_dir / "CMakeCache.txt").is_file() or not (build_dir / "build.ninja").is_file():
        return True
    try:
        return stamp.read_text() != wanted
    except FileNotFoundError:
        return True


def _run_step(
    plan: BuildPlan,
    step: BuildStep,
    progress: BuildProgress | None,
    run_env: Mapping[str, str] | None = None,
) -> float:
    """Run one step; ``run_env`` is added outside the plan (the remote cache: it changes no output,
    and may hold a password, so it never enters the manifest or the configure stamp)."""
    watcher = _NinjaProgress(progress, step.name)
    started = time.monotonic()
    code = proc.stream(
        list(step.argv),
        cwd=step.cwd,
        env={**dict(step.env), **(run_env or {})},
        on_line=watcher,
        log_file=plan.log,
        check=False,
    )
    if code != 0:
        what = "cmake configure" if step.name.endswith("configure") else "ninja"
        raise BuildFailed(
            f"{what} failed (exit {code}) building {plan.recipe} for {plan.target}:\n  "
            + "\n  ".join(watcher.errors()),
            hint=f"full log: {plan.log}",
        )
    return round(time.monotonic() - started, 3)


def read_ccache_log(path: Path) -> CcacheStats | None:
    """Hits and misses of one build from ccache's stats log (one result name per line, ``#`` starts
    a compile)."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return None
    hits = sum(1 for line in lines if line in ("direct_cache_hit", "preprocessed_cache_hit"))
    misses = sum(1 for line in lines if line == "cache_miss")
    remote_hits = sum(1 for line in lines if line == "remote_storage_hit")
    remote_errors = sum(
        1 for line in lines if line in ("remote_storage_error", "remote_storage_timeout")
    )
    return CcacheStats(hits, misses, remote_hits, remote_errors)


def _collect(
    plan: BuildPlan,
    ccache: CcacheStats | None,
    times: dict[str, float],
    started_at: datetime,
    collect_started: float,
) -> Artifact:
    """Copy tools and libraries into a fresh folder, write the manifest, then rename it into
    place."""
    root = plan.artifact_dir.parent
    with staged(root, plan.build_id) as staging:
        (staging / "bin").mkdir(parents=True)
        (staging / "lib").mkdir()
        for tool in plan.tools:
            built = plan.build_dir / "bin" / tool
            if not built.is_file():
                raise BuildFailed(
                    f"ninja finished but {built} is missing", hint=f"full log: {plan.log}"
                )
            shutil.copy2(built, staging / "bin" / tool)
        for pattern in plan.lib_globs:
            for built in sorted(plan.build_dir.glob(pattern)):
                shutil.copy2(built, staging / "lib" / built.name)
        missing = [lib for lib in plan.required_libs if not (staging / "lib" / lib).is_file()]
        if missing:
            raise BuildFailed(
                f"the build produced no {', '.join(missing)}", hint=f"full log: {plan.log}"
            )
        files = {rel: describe_file(staging / rel) for rel in _relative_files(staging)}
        times["collect_s"] = round(time.monotonic() - collect_started, 3)
        times["total_s"] = round(sum(times.values()), 3)
        manifest = {
            "format": MANIFEST_FORMAT,
            "build_id": plan.build_id,
            "recipe": plan.recipe,
            "target": plan.target,
            "build_commit": plan.build_commit,
            "lock_sha256": plan.lock_sha256,
            "kzbuild_version": __version__,
            "inputs": dict(plan.inputs),
            "toolchains": dict(plan.toolchains),
            "cmake": {step.name: list(step.argv) for step in plan.steps},
            "env": dict(plan.step("build").env),
            "runner": list(plan.runner),
            "ccache": ccache.to_dict() if ccache else None,
            "times": {"started": started_at.isoformat(timespec="seconds"), **times},
            "log": plan.log.name,
            "files": files,
        }
        return publish(staging, manifest_json(manifest), root, plan.build_id)


def _relative_files(folder: Path) -> list[str]:
    return sorted(
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and p.name != MANIFEST
    )


def describe_file(path: Path) -> dict[str, object]:
    stat = path.stat()
    return {
        "sha256": sha256_file(path),
        "size": stat.st_size,
        "mode": f"{stat.st_mode & 0o7777:04o}",
    }
