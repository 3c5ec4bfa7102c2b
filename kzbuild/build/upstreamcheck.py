"""``kzbuild patches upstream``: one patch as upstream would receive it, and whether it stands
alone.

From ``Upstream-Status: Pending`` to ``Submitted``: the patch without kzbuild's trailers, applied
alone (without the rest of the stack) at the pin and at ``--against`` targets in the scratch repo
of ``patches check``, and built from the pin plus this patch alone: for the host, and, when it
touches ggml-hexagon's sources, through the v79 compile check. Each build step lists the touched
files it compiled (a source compiled, or a header one of its compiles read: ninja's recorded
deps, the v79 check's compile list); a touched code file no step compiled is listed as such,
never counted as built.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from kzbuild.adapters import proc
from kzbuild.adapters.files import write_atomic
from kzbuild.adapters.gitcmd import Git
from kzbuild.adapters.proc import Progress
from kzbuild.adapters.settings import Settings
from kzbuild.build import builder, v79check
from kzbuild.errors import BuildFailed, ToolchainMissing
from kzbuild.model.patch import Patch
from kzbuild.model.recipe import Recipe
from kzbuild.model.stackcheck import StepStatus, Target, UpstreamCheck, UpstreamStep
from kzbuild.source.stack.apply import apply, failed_hunks
from kzbuild.source.stack.check import Scratch, fetch_target, resolve_target
from kzbuild.source.stack.patchfile import read_patch, require_entry, upstream_mbox
from kzbuild.source.stack.series import read_series

HOST_TARGET = "host"
CODE_SUFFIXES = (
    ".c",
    ".cc",
    ".cpp",
    ".cxx",
    ".h",
    ".hh",
    ".hpp",
    ".inc",
    ".cu",
    ".cuh",
    ".m",
    ".mm",
    ".metal",
    ".comp",
    ".glsl",
    ".S",
)


def check_upstream(
    settings: Settings,
    recipe: Recipe,
    name: str,
    *,
    against: tuple[str, ...] = (),
    build: bool = True,
    environ: Mapping[str, str],
    progress: Progress | None = None,
) -> UpstreamCheck:
    """Strip kzbuild's trailers from patch ``name`` of the recipe's series, apply it alone at the
    pin and at each ``against`` target, and (with ``build``) build the pin plus it for the host
    and, for ggml-hexagon's sources, the v79 check. The mbox takes its author from the patch or
    the user's git config, never a placeholder (ConfigError when neither has one)."""
    entry = require_entry(read_series(recipe.series), name)
    patch = read_patch(entry.path, entry.name)
    text = upstream_mbox(patch, Git(settings.project).user_ident)
    pin = recipe.upstream.commit
    targets = [Target(pin, recipe.upstream.sources, f"the pin {pin[:12]}")]
    targets += [resolve_target(settings, recipe, ref, progress) for ref in against]
    steps = [_applies_alone(settings, recipe, patch, text, target, progress) for target in targets]
    if not build:
        steps.append(
            UpstreamStep(
                "build", f"build for {HOST_TARGET}", StepStatus.SKIPPED, detail="--no-build"
            )
        )
    elif steps[0].status is StepStatus.FAILED:
        steps.append(
            UpstreamStep(
                "build",
                f"build for {HOST_TARGET}",
                StepStatus.SKIPPED,
                detail="it does not apply at the pin",
            )
        )
    else:
        steps += _builds_alone(settings, recipe, patch, text, environ)
    return UpstreamCheck(patch.name, text, tuple(steps))


def _applies_alone(
    settings: Settings,
    recipe: Recipe,
    patch: Patch,
    text: str,
    target: Target,
    progress: Progress | None,
) -> UpstreamStep:
    """``git apply --cached`` of the stripped patch on the target's tree: what ``git am`` does to
    the tree."""
    fetch_target(settings, recipe, target, progress)
    scratch = Scratch(settings, recipe)
    with scratch.lock():
        scratch.prepare()
        scratch.load(target.commit)
        result = apply(scratch.git, patch, text=text)
    label = (
        f"apply alone at {target.label}"
        if target.commit == recipe.upstream.commit
        else f"apply alone at {target.label} ({target.commit[:12]})"
    )
    if result.ok:
        return UpstreamStep("apply", label, StepStatus.PASSED)
    files = tuple(dict.fromkeys(failure[0] for failure in failed_hunks(patch, result.stderr)))
    return UpstreamStep(
        "apply", label, StepStatus.FAILED, files=files, detail=result.stderr.strip()
    )


def _builds_alone(
    settings: Settings, recipe: Recipe, patch: Patch, text: str, environ: Mapping[str, str]
) -> list[UpstreamStep]:
    """Build the pin plus this patch alone, with a one-patch series in a scratch work dir of its own
    (its worktree, lock and artifacts stay out of the project; ccache is shared, so it stays cheap):
    for the host, then the v79 check when it touches ggml-hexagon; then any touched code file
    neither compiled."""
    name = patch.name
    root = (
        settings.work / "alone" / recipe.name.replace("/", "--")
    )  # not under scratch/, which holds one repo per recipe name
    series = root / "patches" / "series"
    series.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(series.parent / name, text.encode("utf-8"))
    write_atomic(series, f"{name}\n".encode())
    alone = replace(recipe, path=root / recipe.path.name, series=series)
    scratch_settings = replace(settings, work=root / "work")
    touched = [f.path for f in patch.files if f.path.endswith(CODE_SUFFIXES)]
    label = f"build for {HOST_TARGET}, the pin plus this patch alone"
    try:
        prepared = builder.prepare(scratch_settings, alone, HOST_TARGET, environ=environ)
        builder.build(prepared)
    except BuildFailed as exc:
        return [
            UpstreamStep(
                "build",
                label,
                StepStatus.FAILED,
                detail="\n".join(filter(None, (exc.message, exc.hint))),
            )
        ]
    host = ninja_compiled(
        prepared.plan.step("build").argv[0], prepared.plan.build_dir, prepared.plan.source
    )
    steps = [_compiled_step(label, [path for path in touched if path in host], HOST_TARGET)]
    hexagon = [path for path in touched if path.startswith(v79check.HEXAGON + "/")]
    if hexagon:
        steps.append(_v79_step(scratch_settings, alone, hexagon))
    done = {path for step in steps for path in step.files}
    missed = [path for path in touched if path not in done]
    if missed:
        steps.append(
            UpstreamStep(
                "compile",
                "compile every touched file",
                StepStatus.SKIPPED,
                files=tuple(missed),
                detail=f"no build here compiled: {', '.join(missed)}",
            )
        )
    return steps


def _compiled_step(label: str, files: list[str], target: str) -> UpstreamStep:
    detail = (
        f"compiled for {target}: {', '.join(files)}"
        if files
        else f"compiled for {target}: none of the touched files"
    )
    return UpstreamStep("build", label, StepStatus.PASSED, files=tuple(files), detail=detail)


def _v79_step(settings: Settings, recipe: Recipe, hexagon: list[str]) -> UpstreamStep:
    """The v79 compile check of the pin plus this patch: which touched Hexagon files it compiled
    (a source in its compile list, or a header a compiled source of the tree includes by name)."""
    label = f"compile for {v79check.TARGET}, the pin plus this patch alone"
    try:
        result = v79check.run_check(v79check.prepare_check(settings, recipe))
    except (BuildFailed, ToolchainMissing) as exc:
        return UpstreamStep(
            "build",
            label,
            StepStatus.FAILED,
            detail="\n".join(filter(None, (exc.message, exc.hint))),
        )
    sources = {
        str(c["source"])
        for c in result.artifact.manifest.get("compiles", [])
        if isinstance(c, dict)
    }
    included = v79check.included_headers(result.plan.source, sources)
    return _compiled_step(
        label, [path for path in hexagon if path in sources or path in included], v79check.TARGET
    )


def ninja_compiled(ninja: str, build_dir: Path, source: Path) -> set[str]:
    """The files under ``source`` that a build in ``build_dir`` compiled: each object's deps
    (``ninja -t deps``: its source and every header it read), relative to ``source``."""
    result = proc.run([ninja, "-C", str(build_dir), "-t", "deps"], check=False)
    root = source.resolve()
    found = set()
    for line in result.stdout.splitlines() if result.ok else ():
        if not line.startswith(" ") or not line.strip():
            continue
        path = Path(line.strip())
        try:
            found.add(
                (path if path.is_absolute() else build_dir / path)
                .resolve()
                .relative_to(root)
                .as_posix()
            )
        except ValueError:
            continue  # a system header or a generated file
    return found
