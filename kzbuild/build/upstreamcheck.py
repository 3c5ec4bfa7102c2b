"""``kzbuild patches upstream``: one patch as upstream would receive it, and whether it stands alone.

From ``Upstream-Status: Pending`` to ``Submitted``: the patch without kzbuild's trailers, applied
alone (without the rest of the stack) at the pin and at ``--against`` targets in the scratch repo
of ``patches check``, and built for the host from the pin plus this patch alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from kzbuild.adapters.files import write_atomic
from kzbuild.adapters.settings import Settings
from kzbuild.build import builder
from kzbuild.errors import BuildFailed
from kzbuild.model.patch import Patch
from kzbuild.model.recipe import Recipe
from kzbuild.model.stackcheck import StepStatus, Target, UpstreamCheck, UpstreamStep
from kzbuild.source.sources import Progress
from kzbuild.source.stack.apply import apply, failed_hunks
from kzbuild.source.stack.check import Scratch, fetch_target, resolve_target
from kzbuild.source.stack.patchfile import read_patch, require_entry, without_kz_trailers
from kzbuild.source.stack.series import read_series

HOST_TARGET = "host"


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
    pin and at each ``against`` target, and (with ``build``) build the pin plus it for the host."""
    entry = require_entry(read_series(recipe.series), name)
    patch = read_patch(entry.path, entry.name)
    text = without_kz_trailers(patch)
    pin = recipe.upstream.commit
    targets = [Target(pin, recipe.upstream.sources, f"the pin {pin[:12]}")]
    targets += [resolve_target(settings, recipe, ref, progress) for ref in against]
    steps = [_applies_alone(settings, recipe, patch, text, target, progress) for target in targets]
    if not build:
        steps.append(UpstreamStep("build", f"build for {HOST_TARGET}", StepStatus.SKIPPED, detail="--no-build"))
    elif steps[0].status is StepStatus.FAILED:
        steps.append(UpstreamStep("build", f"build for {HOST_TARGET}", StepStatus.SKIPPED, detail="it does not apply at the pin"))
    else:
        steps.append(_builds_alone(settings, recipe, patch.name, text, environ))
    return UpstreamCheck(patch.name, text, tuple(steps))


def _applies_alone(settings: Settings, recipe: Recipe, patch: Patch, text: str, target: Target, progress: Progress | None) -> UpstreamStep:
    """``git apply --cached`` of the stripped patch on the target's tree: what ``git am`` does to the tree."""
    fetch_target(settings, recipe, target, progress)
    scratch = Scratch(settings, recipe)
    with scratch.lock():
        scratch.prepare()
        scratch.load(target.commit)
        result = apply(scratch.git, patch, text=text)
    label = f"apply alone at {target.label}" if target.commit == recipe.upstream.commit else f"apply alone at {target.label} ({target.commit[:12]})"
    if result.ok:
        return UpstreamStep("apply", label, StepStatus.PASSED)
    files = tuple(dict.fromkeys(failure[0] for failure in failed_hunks(patch, result.stderr)))
    return UpstreamStep("apply", label, StepStatus.FAILED, files=files, detail=result.stderr.strip())


def _builds_alone(settings: Settings, recipe: Recipe, name: str, text: str, environ: Mapping[str, str]) -> UpstreamStep:
    """Build the pin plus this patch alone, with a one-patch series in a scratch work dir of its own
    (its worktree, lock and artifacts stay out of the project; ccache is shared, so it stays cheap)."""
    root = settings.work / "alone" / recipe.name.replace("/", "--")  # not under scratch/, which holds one repo per recipe name
    series = root / "patches" / "series"
    series.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(series.parent / name, text.encode("utf-8"))
    write_atomic(series, f"{name}\n".encode())
    alone = replace(recipe, path=root / recipe.path.name, series=series)
    scratch_settings = replace(settings, work=root / "work")
    label = f"build for {HOST_TARGET}, the pin plus this patch alone"
    try:
        builder.build(builder.prepare(scratch_settings, alone, HOST_TARGET, environ=environ))
    except BuildFailed as exc:
        return UpstreamStep("build", label, StepStatus.FAILED, detail="\n".join(filter(None, (exc.message, exc.hint))))
    return UpstreamStep("build", label, StepStatus.PASSED)
