"""``kzbuild build RECIPE --target v79-check``: compile every Hexagon source of the synced tree,
without the SDK.

It proves compilation only: nothing is linked and nothing runs. Two sides, as upstream's
CMake builds them (ggml/src/ggml-hexagon/CMakeLists.txt, htp/CMakeLists.txt and
htp/cmake-toolchain.cmake):

- the DSP side: every ``htp/*.c`` (not qaic's htp_iface_skel.c, which only a real build generates)
for hexagonv79 with HVX 128B (and its IEEE-float and qfloat
  instructions), ``-O2 -Wall -Werror -DNDEBUG=1`` and the include dirs of htp/CMakeLists.txt, to
  objects, with the clang of the ``ziglang`` PyPI package (its musl headers stand in for QuRT's
  C library);
- the host side: ``ggml-hexagon.cpp`` and ``htp-drv.cpp`` for aarch64 (syntax and code
  generation, no link).

The SDK's headers are replaced by the declared stand-ins in ``kernels/hexagon-sdk/``
(``stand-ins.yaml`` lists what each one stands in for). Instructions LLVM's Hexagon assembler
lacks (HMX) become ``nop`` in a scratch copy of the sources; the worktree is never written.

Compiles go through ccache (the builds' cache, keyed on zig's version), so an unchanged tree
costs a few seconds. The result is an artifact like any build's:
``<artifacts>/<check-id>/`` holding the objects and ``manifest.json``.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from kzbuild import __version__
from kzbuild.adapters import proc, yamlconf
from kzbuild.adapters.filelock import locked
from kzbuild.adapters.files import folder_digest
from kzbuild.adapters.settings import Settings
from kzbuild.build.artifacts import existing_artifact, manifest_json, publish, staged
from kzbuild.build.builder import (
    BuildProgress,
    artifacts_root,
    build_commit,
    build_id_of,
    describe_file,
    lock_sha256,
    read_ccache_log,
    recipe_build_dir,
    source_inputs,
    timed_sync,
)
from kzbuild.errors import BuildFailed, ConfigError, ToolchainMissing, WorktreeError
from kzbuild.model.artifact import Artifact
from kzbuild.model.build import (
    MANIFEST_FORMAT,
    V79_CHECK_PROVES,
    V79_CHECK_TARGET,
    BuildEvent,
    BuildOptions,
)
from kzbuild.model.recipe import Recipe
from kzbuild.model.sync import Lock
from kzbuild.source.stack.patchfile import read_patch
from kzbuild.source.stack.series import read_series
from kzbuild.source.sync import Worktree

TARGET = V79_CHECK_TARGET
PROVES = V79_CHECK_PROVES

HEXAGON = "ggml/src/ggml-hexagon"
HTP = f"{HEXAGON}/htp"
HOST_SOURCES = (
    "ggml-hexagon.cpp",
    "htp-drv.cpp",
)  # ggml_add_backend_library(ggml-hexagon ...) in the CMakeLists
STAND_INS = Path("kernels/hexagon-sdk")
SCRATCH_STAND_INS = "hexagon-sdk-stand-ins"  # their copy in the scratch dir

# htp/cmake-toolchain.cmake: ARCH_FLAGS and COMMON_FLAGS with CMAKE_C_FLAGS_RELEASE, and
# htp/CMakeLists.txt's NDEBUG=1 (HEXAGON_HTP_DEBUG off). Not -flto: the objects are real code.
# -mhmx has no LLVM counterpart (HMX instructions are no-ops here, see asm_no_ops); -fvectorize is
# on at -O2 anyway, and zig's driver, which takes HVX from -mcpu, refuses it.
DSP_FLAGS = (
    "-target",
    "hexagon-linux-musl",
    "-mcpu=hexagonv79+hvxv79+hvx_length128b+hvx_ieee_fp+hvx_qfloat",
    "-O2",
    "-Wall",
    "-Werror",
    "-fno-zero-initialized-in-bss",
    "-G0",
    "-fdata-sections",
    "-fpic",
    "-DNDEBUG=1",
    # QuRT's libc headers do not define M_PI (rope-ops.c does) and define NULL as 0, which the
    # sources assign to uint64_t fields: musl in POSIX mode, without int-conversion errors.
    "-D_POSIX_C_SOURCE=200809L",
    "-Wno-int-conversion",
)
# ggml's backend library flags (ggml/src/CMakeLists.txt) for a release build, with the Snapdragon
# preset's -march=armv8.7a+fp16+dotprod+i8mm in zig's spelling.
HOST_FLAGS = (
    "-target",
    "aarch64-linux-gnu",
    "-mcpu=generic+v8_7a+fullfp16+dotprod+i8mm",
    "-std=c++17",
    "-O2",
    "-fPIC",
    "-Wall",
    "-Wextra",
    "-Wno-unused-function",
    "-DNDEBUG",
    "-D_GNU_SOURCE",
    "-DGGML_BACKEND_BUILD",
    "-DGGML_BACKEND_SHARED",
    "-DGGML_SHARED",
    "-DGGML_USE_HEXAGON",
)
UNDECLARED = re.compile(
    r"(?:call to undeclared (?:library )?function|use of undeclared identifier|unknown type name|"
    r"no member named \S+ in|incomplete definition of type|variable has incomplete type) "
    r"'(?:struct )?([A-Za-z_]\w*)'"
)
NOT_FOUND = re.compile(r"fatal error: '([^']+)' file not found")
INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)
DIAG_PATH = re.compile(r"^(?:In file included from )?([^\s:][^:]*):\d+:\d+")


@dataclass(frozen=True)
class StandIns:
    """kernels/hexagon-sdk/: the stand-in headers and what each stands in for (stand-ins.yaml)."""

    root: Path
    headers: Mapping[str, tuple[str, ...]]
    sdk_prefixes: tuple[str, ...]
    asm_no_ops: tuple[tuple[str, str], ...]  # (regex, what)

    @property
    def include(self) -> Path:
        return self.root / "stand-ins"

    def is_sdk_name(self, name: str) -> bool:
        return name.startswith(self.sdk_prefixes)


def load_stand_ins(project: Path) -> StandIns:
    root = project / STAND_INS
    path = root / "stand-ins.yaml"
    if not path.is_file():
        raise ToolchainMissing(
            f"the Hexagon SDK stand-ins are missing: {path}",
            hint="they are part of the kzbuild project (kernels/hexagon-sdk/)",
        )
    doc = yamlconf.load(path)
    doc.check_keys(
        ("sdk_prefixes", "headers", "asm_no_ops"),
        required=("sdk_prefixes", "headers", "asm_no_ops"),
    )
    headers_doc = doc.get_mapping("headers")
    headers: dict[str, tuple[str, ...]] = {}
    for name in headers_doc:
        if not (root / "stand-ins" / name).is_file():
            raise headers_doc.error(name, f"no such stand-in header in {root / 'stand-ins'}")
        headers[name] = headers_doc.get_str_list(name)
    for header in sorted(p.name for p in (root / "stand-ins").iterdir()):
        if header not in headers:
            raise doc.error(
                "headers", f"the stand-in {header} is not declared (list what it stands in for)"
            )
    no_ops = []
    items = doc.get_list("asm_no_ops")
    for index, item in enumerate(items):
        if not isinstance(item, yamlconf.Mapping):
            raise items.error(
                index, "must be a mapping with 'pattern' and 'what'", key="asm_no_ops"
            )
        item.check_keys(("pattern", "what"), required=("pattern", "what"))
        pattern = item.get_str("pattern") or ""
        try:
            re.compile(pattern)
        except re.error as exc:
            raise item.error("pattern", f"not a regular expression: {exc}") from None
        no_ops.append((pattern, item.get_str("what") or ""))
    return StandIns(root, headers, doc.get_str_list("sdk_prefixes"), tuple(no_ops))


# --- the scratch copy --------------------------------------------------------------------

STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')


def neutralise_asm(text: str, patterns: Sequence[str]) -> tuple[str, int]:
    """``text`` with every ``#define`` whose body holds one of ``patterns`` given the body
    ``"nop\\n"``,
    and every other string literal holding one replaced by ``"nop\\n"``. Line numbers stay."""
    unsupported = re.compile("|".join(f"(?:{p})" for p in patterns))
    lines = text.split("\n")
    changed = 0
    index = 0
    while index < len(lines):
        line = lines[index]
        if re.match(r"\s*#\s*define\b", line):
            end = index
            while lines[end].endswith("\\") and end + 1 < len(lines):
                end += 1
            block = lines[index : end + 1]
            if any(unsupported.search(s) for part in block for s in STRING.findall(part)):
                head = re.match(r"(\s*#\s*define\s+\w+(?:\([^)]*\))?)", block[0])
                assert head is not None
                lines[index] = f'{head.group(1)} "nop\\n"' + (" \\" if end > index else "")
                for blank in range(index + 1, end + 1):
                    lines[blank] = "" if blank == end else "\\"
                changed += 1
            index = end + 1
            continue
        replaced = STRING.sub(
            lambda m: '"nop\\n"' if unsupported.search(m.group(0)) else m.group(0), line
        )
        if replaced != line:
            lines[index] = replaced
            changed += 1
        index += 1
    return "\n".join(lines), changed


def make_scratch(tree: Path, scratch: Path, stand_ins: StandIns) -> dict[str, int]:
    """Copy what the compiles read (ggml/include, ggml/src's own headers, ggml-hexagon, the
    stand-ins) into ``scratch``
    and neutralise the assembly LLVM lacks there. Returns {relative path: lines changed}."""
    if scratch.exists():
        shutil.rmtree(scratch)
    (scratch / "ggml/src").mkdir(parents=True)
    shutil.copytree(tree / "ggml/include", scratch / "ggml/include")
    for header in (tree / "ggml/src").glob("*.h"):
        shutil.copy2(header, scratch / "ggml/src" / header.name)
    shutil.copytree(tree / HEXAGON, scratch / HEXAGON)
    shutil.copytree(
        stand_ins.include, scratch / SCRATCH_STAND_INS
    )  # every -I under the work dir: ccache hits from any project
    patterns = [p for p, _ in stand_ins.asm_no_ops]
    changed: dict[str, int] = {}
    for path in sorted((scratch / HTP).iterdir()):
        if path.suffix not in (".c", ".h"):
            continue
        text, count = neutralise_asm(
            path.read_text(encoding="utf-8", errors="surrogateescape"), patterns
        )
        if count:
            path.write_text(text, encoding="utf-8", errors="surrogateescape")
            changed[path.relative_to(scratch).as_posix()] = count
    return changed


# --- compiles ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Compile:
    side: str  # dsp | host
    source: str  # relative to the tree
    argv: tuple[str, ...]  # without -c SOURCE -o OBJECT
    object: str  # relative to the artifact: objects/<side>/<name>.o


@dataclass(frozen=True)
class CompileOutcome:
    compile: Compile
    ok: bool
    cached: bool
    diagnostics: str  # the compiler's stderr (paths relative to the tree)
    seconds: float


def zig() -> list[str]:
    """The zig of the ``ziglang`` package, run as ``python -m ziglang``."""
    try:
        import ziglang  # noqa: F401
    except ImportError:
        raise ToolchainMissing(
            "the v79 compile check needs the clang of the 'ziglang' PyPI package, which is not "
            "installed",
            hint="pip install ziglang (a dependency of kzbuild)",
        ) from None
    return [sys.executable, "-m", "ziglang"]


def zig_version() -> str:
    return proc.run([*zig(), "version"]).stdout.strip()


def plan_compiles(scratch: Path, stand_ins: StandIns) -> list[Compile]:
    """One compile per HTP C source and per host source of the scratch copy."""
    src = scratch / "ggml/src"
    htp = scratch / HTP
    if not htp.is_dir():
        raise ConfigError(f"the synced tree has no {HTP}/: nothing for the v79 check to compile")
    # htp/CMakeLists.txt's include_directories, with the stand-ins for ${HEXAGON_SDK_ROOT}/incs
    # and for the qaic output in ${CMAKE_CURRENT_BINARY_DIR}
    includes = [scratch / "ggml/include", src, scratch / HEXAGON, htp, scratch / SCRATCH_STAND_INS]
    dsp = [*zig(), "cc", *DSP_FLAGS, *(f"-I{p}" for p in includes), "-include", "qurt-libc.h"]
    host = [*zig(), "c++", *HOST_FLAGS, *(f"-I{p}" for p in includes)]
    compiles = [
        Compile("dsp", f"{HTP}/{p.name}", tuple(dsp), f"objects/htp/{p.stem}.o")
        for p in sorted(htp.glob("*.c"))
    ]
    for name in HOST_SOURCES:
        if (scratch / HEXAGON / name).is_file():
            compiles.append(
                Compile(
                    "host", f"{HEXAGON}/{name}", tuple(host), f"objects/host/{Path(name).stem}.o"
                )
            )
    if not any(c.side == "host" for c in compiles):
        raise ConfigError(
            f"the synced tree has no {HEXAGON}/ggml-hexagon.cpp: nothing for the host side to "
            "compile"
        )
    return compiles


def included_headers(tree: Path, sources: Iterable[str]) -> set[str]:
    """The tree's headers that ``sources`` include with ``#include "..."``, directly or through
    another such header, found next to the includer or in the check's include dirs; relative."""
    dirs = [tree / "ggml/include", tree / "ggml/src", tree / HEXAGON, tree / HTP]
    found: set[str] = set()
    todo = list(sources)
    while todo:
        path = tree / todo.pop()
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for name in INCLUDE.findall(text):
            hit = next((d / name for d in (path.parent, *dirs) if (d / name).is_file()), None)
            if hit is None or not hit.resolve().is_relative_to(tree.resolve()):
                continue  # a system header or one outside the tree
            relative = hit.resolve().relative_to(tree.resolve()).as_posix()
            if relative not in found:
                found.add(relative)
                todo.append(relative)
    return found


def run_compile(item: Compile, scratch: Path, out: Path, env: Mapping[str, str]) -> CompileOutcome:
    """Compile ``item`` through ccache (``env`` sets its cache dir and the compiler's identity)."""
    started = time.monotonic()
    target = out / item.object
    target.parent.mkdir(parents=True, exist_ok=True)
    stats = target.with_suffix(".ccache-log")
    result = proc.run(
        ["ccache", *item.argv, "-c", item.source, "-o", str(target)],
        cwd=scratch,
        check=False,
        env={**env, "CCACHE_STATSLOG": str(stats)},
    )
    diagnostics = _relative(result.stderr, scratch)
    ccache = read_ccache_log(stats)
    stats.unlink(missing_ok=True)
    ok = result.returncode == 0 and target.is_file()
    return CompileOutcome(
        item, ok, bool(ccache and ccache.hits), diagnostics, time.monotonic() - started
    )


def ccache_env(settings: Settings, identity: str) -> dict[str, str]:
    """The shared ccache of builds (``<cache>/ccache``), keyed on the zig version rather than on the
    python that runs it (``python -m ziglang`` is the compiler ccache sees)."""
    return {
        "CCACHE_DIR": str(settings.ccache),
        "CCACHE_BASEDIR": str(settings.work),
        "CCACHE_NOHASHDIR": "1",
        "CCACHE_COMPILERCHECK": f"string:{identity}",
        # the scratch copy is written just before it compiles: hash its files' contents,
        # not their times
        "CCACHE_SLOPPINESS": "include_file_mtime,include_file_ctime,time_macros",
    }


def _relative(stderr: str | bytes, scratch: Path) -> str:
    text = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
    return text.replace(f"{scratch}/", "")


# --- faults ------------------------------------------------------------------------------


def stand_in_gaps(outcomes: Iterable[CompileOutcome], stand_ins: StandIns) -> list[str]:
    """SDK headers and names the sources use that the stand-ins lack, each with where it is used."""
    gaps: dict[str, str] = {}
    for outcome in outcomes:
        for line in outcome.diagnostics.splitlines():
            where = line.split(": ", 1)[0]
            if (
                (found := NOT_FOUND.search(line))
                and found.group(1) not in gaps
                and _system_include(found.group(1), outcome.diagnostics)
            ):
                gaps[found.group(1)] = f"header <{found.group(1)}> (included at {where})"
            elif (
                (found := UNDECLARED.search(line))
                and stand_ins.is_sdk_name(found.group(1))
                and found.group(1) not in gaps
            ):
                gaps[found.group(1)] = f"name '{found.group(1)}' (used at {where})"
    return list(gaps.values())


def _system_include(header: str, diagnostics: str) -> bool:
    """Whether the diagnostic shows ``header`` included with <>, as SDK headers are (a missing
    "header" of the tree is the patch's fault, not the stand-ins')."""
    return re.search(rf"#\s*include\s*<{re.escape(header)}>", diagnostics) is not None


def involved_patches(
    patches: Mapping[str, frozenset[str]], outcomes: Iterable[CompileOutcome]
) -> list[str]:
    """The patches of the stack that change a file the failed compiles' diagnostics name."""
    files: set[str] = set()
    for outcome in outcomes:
        files.add(outcome.compile.source)
        for line in outcome.diagnostics.splitlines():
            if (found := DIAG_PATH.match(line)) is not None:
                files.add(found.group(1))
    return [name for name, touched in patches.items() if touched & files]


def stack_files(recipe: Recipe, lock: Lock) -> dict[str, frozenset[str]]:
    """{patch file: the paths it changes} for the patches the sync applied."""
    applied = {p.file for p in lock.patches if p.commit is not None}
    files: dict[str, frozenset[str]] = {}
    for entry in read_series(recipe.series).entries:
        if entry.name in applied:
            patch = read_patch(entry.path, entry.name)
            files[entry.name] = frozenset(
                {c.path for c in patch.files} | {c.old_path for c in patch.files if c.old_path}
            )
    return files


def failure(
    failed: Sequence[CompileOutcome],
    patches: Mapping[str, frozenset[str]],
    stand_ins: StandIns,
    recipe: str,
) -> BuildFailed | ToolchainMissing:
    blocks = []
    for outcome in failed:
        lines = [line for line in outcome.diagnostics.splitlines() if line.strip()]
        shown = "\n    ".join(lines[:40]) + (
            f"\n    ... ({len(lines) - 40} more lines)" if len(lines) > 40 else ""
        )
        blocks.append(
            f"{outcome.compile.source} ({outcome.compile.side} side) does not compile:\n    {shown}"
        )
    gaps = stand_in_gaps(failed, stand_ins)
    if gaps:
        return ToolchainMissing(
            f"v79 check of {recipe}: the Hexagon SDK stand-ins lack "
            + "; ".join(gaps)
            + "\n  "
            + "\n  ".join(blocks),
            hint=f"declare it in {stand_ins.include} and list it in "
            f"{stand_ins.root / 'stand-ins.yaml'}",
        )
    named = involved_patches(patches, failed)
    blame = (
        f"patches of the stack that change these files: {', '.join(named)}"
        if named
        else "no patch of the stack changes these files (upstream's own sources)"
    )
    sides = sorted({o.compile.side for o in failed})
    return BuildFailed(
        f"v79 check of {recipe} failed on the {' and '.join(sides)} side ({len(failed)} file(s)); "
        f"{blame}\n  " + "\n  ".join(blocks),
        hint="the check proves compilation only; fix the file(s) in the worktree and export the "
        "patch",
    )


# --- plan and run ------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckPlan:
    recipe: Recipe
    check_id: str
    build_commit: str
    lock_sha256: str
    inputs: Mapping[str, object]
    source: Path
    scratch: Path
    artifact_dir: Path
    ccache_env: Mapping[str, str]
    jobs: int
    patches: Mapping[str, frozenset[str]]
    stand_ins: StandIns
    worktree: Worktree
    head: str
    synced: bool
    sync_seconds: float

    def to_dict(self) -> dict[str, object]:
        return {
            "recipe": self.recipe.name,
            "target": TARGET,
            "build_id": self.check_id,
            "build_commit": self.build_commit,
            "proves": PROVES,
            "source": str(self.source),
            "scratch": str(self.scratch),
            "artifact": str(self.artifact_dir),
            "ccache": dict(self.ccache_env),
            "dsp_flags": list(DSP_FLAGS),
            "host_flags": list(HOST_FLAGS),
            "stand_ins": str(self.stand_ins.include),
            "asm_no_ops": [what for _, what in self.stand_ins.asm_no_ops],
            "inputs": dict(self.inputs),
        }


@dataclass(frozen=True)
class CheckResult:
    plan: CheckPlan
    artifact: Artifact
    reused: bool
    compiled: int = 0
    cached: int = 0
    warnings: int = 0  # host-side warnings (the DSP side has -Werror)
    times: Mapping[str, float] = field(default_factory=dict)


def prepare_check(
    settings: Settings,
    recipe: Recipe,
    *,
    options: BuildOptions = BuildOptions(),
    progress: BuildProgress | None = None,
) -> CheckPlan:
    """Sync when needed and compute the check id (what ``--dry-run`` shows)."""
    stand_ins = load_stand_ins(settings.project)
    if shutil.which("ccache") is None:
        raise ToolchainMissing(
            "the v79 compile check needs ccache, which is not on PATH",
            hint="Debian package 'ccache' (scripts/setup installs it)",
        )
    identity = zig_version()
    synced, sync_seconds = timed_sync(settings, recipe, progress)
    lock = synced.lock
    inputs: dict[str, object] = {
        **source_inputs(TARGET, lock),
        "stand_ins": folder_digest(stand_ins.root),
        "compiler": f"zig {identity}",
        "flags": {"dsp": list(DSP_FLAGS), "host": list(HOST_FLAGS)},
    }
    check_id = build_id_of(TARGET, inputs)
    root = artifacts_root(settings, options.artifacts)
    return CheckPlan(
        recipe=recipe,
        check_id=check_id,
        build_commit=build_commit(lock),
        lock_sha256=lock_sha256(lock),
        inputs=inputs,
        source=synced.worktree,
        scratch=recipe_build_dir(settings, recipe) / TARGET / "src",
        artifact_dir=root / check_id,
        ccache_env=ccache_env(settings, f"zig {identity}"),
        jobs=options.jobs or os.cpu_count() or 1,
        patches=stack_files(recipe, lock),
        stand_ins=stand_ins,
        worktree=Worktree(settings, recipe),
        head=lock.head,
        synced=synced.changed,
        sync_seconds=sync_seconds,
    )


def run_check(plan: CheckPlan, *, progress: BuildProgress | None = None) -> CheckResult:
    """Reuse the artifact of the check id, or compile every source (through ccache).

    Raises BuildFailed (exit 7) naming the files and the patches that change them, or
    ToolchainMissing (exit 6) naming an SDK header or name the stand-ins lack."""
    if (existing := existing_artifact(plan.artifact_dir.parent, plan.check_id)) is not None:
        return CheckResult(plan, existing, reused=True, times={"sync_s": plan.sync_seconds})
    plan.scratch.parent.mkdir(parents=True, exist_ok=True)
    with locked(
        plan.scratch.with_name("src.lock"),
        what=f"the v79 check dir {plan.scratch.parent}",
        wait=600,
    ):
        started_at = datetime.now(timezone.utc)
        times: dict[str, float] = {"sync_s": plan.sync_seconds}
        copy_started = time.monotonic()
        with plan.worktree.lock(shared=True, wait=600):
            state = plan.worktree.state()
            if state.head != plan.head or state.dirty:
                raise WorktreeError(
                    f"the worktree {state.path} changed since the v79 check of {plan.recipe.name} "
                    "was planned",
                    hint=f"run 'kzbuild sync {plan.recipe.name}' (or commit and export your "
                    "changes), then check again",
                )
            no_ops = make_scratch(plan.source, plan.scratch, plan.stand_ins)
        times["copy_s"] = round(time.monotonic() - copy_started, 3)
        compiles = plan_compiles(plan.scratch, plan.stand_ins)
        out = plan.scratch.parent / "out"
        shutil.rmtree(out, ignore_errors=True)
        compile_started = time.monotonic()
        outcomes = _compile_all(compiles, plan, out, progress)
        times["compile_s"] = round(time.monotonic() - compile_started, 3)
        failed = [o for o in outcomes if not o.ok]
        if failed:
            raise failure(failed, plan.patches, plan.stand_ins, plan.recipe.name)
        warnings = sum(
            o.diagnostics.count(": warning: ") for o in outcomes if o.compile.side == "host"
        )
        artifact = _collect(plan, outcomes, out, no_ops, warnings, times, started_at)
    cached = sum(1 for o in outcomes if o.cached)
    return CheckResult(
        plan,
        artifact,
        reused=False,
        compiled=len(outcomes) - cached,
        cached=cached,
        warnings=warnings,
        times=dict(artifact.manifest["times"]),
    )


def _compile_all(
    compiles: Sequence[Compile], plan: CheckPlan, out: Path, progress: BuildProgress | None
) -> list[CompileOutcome]:
    finished: list[CompileOutcome] = []
    guard = threading.Lock()

    def one(item: Compile) -> CompileOutcome:
        outcome = run_compile(item, plan.scratch, out, plan.ccache_env)
        with guard:
            finished.append(outcome)
            if progress:
                progress(
                    BuildEvent(
                        "build",
                        f"{item.source}{' (cached)' if outcome.cached else ''}",
                        len(finished),
                        len(compiles),
                    )
                )
        return outcome

    # host sources are the largest: start them first
    ordered = sorted(compiles, key=lambda c: c.side != "host")
    with ThreadPoolExecutor(max_workers=plan.jobs) as pool:
        outcomes = list(pool.map(one, ordered))
    return sorted(outcomes, key=lambda o: o.compile.source)


def _collect(
    plan: CheckPlan,
    outcomes: Sequence[CompileOutcome],
    out: Path,
    no_ops: Mapping[str, int],
    warnings: int,
    times: dict[str, float],
    started_at: datetime,
) -> Artifact:
    root = plan.artifact_dir.parent
    root.mkdir(parents=True, exist_ok=True)
    with staged(root, plan.check_id) as staging:
        shutil.copytree(out, staging)
        files = {o.compile.object: describe_file(staging / o.compile.object) for o in outcomes}
        times["total_s"] = round(sum(times.values()), 3)
        manifest = {
            "format": MANIFEST_FORMAT,
            "build_id": plan.check_id,
            "recipe": plan.recipe.name,
            "target": TARGET,
            "proves": PROVES,
            "build_commit": plan.build_commit,
            "lock_sha256": plan.lock_sha256,
            "kzbuild_version": __version__,
            "inputs": dict(plan.inputs),
            "compiles": [
                {
                    "side": o.compile.side,
                    "source": o.compile.source,
                    "object": o.compile.object,
                    "cached": o.cached,
                    "argv": [*o.compile.argv[3:], "-c", o.compile.source],
                }
                for o in outcomes
            ],
            "asm_no_ops": dict(no_ops),
            "host_warnings": warnings,
            "ccache": {
                "hits": sum(1 for o in outcomes if o.cached),
                "misses": sum(1 for o in outcomes if not o.cached),
            },
            "times": {"started": started_at.isoformat(timespec="seconds"), **times},
            "files": files,
        }
        return publish(staging, manifest_json(manifest), root, plan.check_id)
