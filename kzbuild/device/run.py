"""``kzbuild run``: a tool of the device's current release, with the device env and nothing hidden.

The device layout (written by deploy): ``ROOT/releases/<build-id>/{bin,lib,manifest.json}``
and ``ROOT/current``, a symlink to the active release. A run resolves ``current`` once and
uses that release dir for the tool and its env, so a deploy during a run cannot mix builds.
Tools run in ROOT, so ``models/x.gguf`` names a pushed model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

from kzbuild.adapters.gitcmd import Git
from kzbuild.adapters.settings import Settings
from kzbuild.device.base import ByteSink, Transport, check_env_name
from kzbuild.device.registry import device_env
from kzbuild.device.store import CURRENT_SCRIPT, DAMAGED
from kzbuild.errors import CommandFailed, ConfigError, DeviceError
from kzbuild.model.artifact import MANIFEST
from kzbuild.model.device import Device
from kzbuild.model.memory import MemoryLimits
from kzbuild.model.run import Invocation, Release
from kzbuild.source.sync import read_lock

log = logging.getLogger(__name__)

HEXAGON_ENV_PREFIX = "GGML_HEXAGON_"
HEXAGON_SOURCES = "ggml/src/ggml-hexagon"
GETENV_RE = re.compile(r'getenv\("(GGML_HEXAGON_[A-Z0-9_]+)"\)')


def current_release(transport: Transport, device: Device) -> Release:
    link = f"{device.root}/current"
    target = transport.run(["sh", "-c", CURRENT_SCRIPT, "kz", device.root])
    lines = target.text().splitlines()
    if not target.ok or not lines or not lines[0].strip():
        raise DeviceError(
            f"{device.name}: no release is deployed ({link} is not a symlink to a release)",
            hint=f"deploy one first: kzbuild deploy --device {device.name}",
        )
    path = PurePosixPath(lines[0].strip())
    if DAMAGED in lines[1:]:
        raise DeviceError(
            f"{device.name}: the current release {path.name} is damaged: files of it do not match "
            "its manifest",
            hint=f"kzbuild deploy --device {device.name} of that build repairs it; kzbuild device "
            "verify shows what is damaged",
        )
    release_dir = str(path if path.is_absolute() else PurePosixPath(device.root) / path)
    return load_release(transport, device, release_dir)


# $1 = the device root, $2 = a release name: fails when the release is not there, says "damaged"
# when marked
NAMED_RELEASE_SCRIPT = (
    '[ -d "$1/releases/$2" ] || exit 1; if [ -e "$1/damaged/$2" ]; then echo damaged; fi; true'
)


def release_named(transport: Transport, device: Device, name: str) -> Release:
    """A deployed release by its name (``DeployResult.release``), whether or not ``current`` points
    at it:
    kzbuild ab and roll bench several releases without switching ``current`` between runs."""
    found = (
        None
        if "/" in name or name in ("", ".", "..")
        else transport.run(["sh", "-c", NAMED_RELEASE_SCRIPT, "kz", device.root, name])
    )
    if found is None or not found.ok:
        raise DeviceError(
            f"{device.name}: no release {name!r} is deployed (under {device.root}/releases)",
            hint=f"deploy it first: kzbuild deploy --device {device.name}",
        )
    if DAMAGED in found.text().split():
        raise DeviceError(
            f"{device.name}: the release {name} is damaged: files of it do not match its manifest",
            hint=f"kzbuild deploy --device {device.name} of that build repairs it; kzbuild device "
            "verify shows what is damaged",
        )
    return load_release(transport, device, f"{device.root}/releases/{name}")


def load_release(transport: Transport, device: Device, release_dir: str) -> Release:
    """The release in ``release_dir`` (an absolute device path) with its manifest, when it has
    one."""
    manifest: Mapping[str, Any] = {}
    digest = None
    text = transport.run(["cat", f"{release_dir}/{MANIFEST}"])
    if text.ok:
        digest = hashlib.sha256(text.stdout).hexdigest()
        try:
            parsed = json.loads(text.stdout)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            manifest = parsed
        else:
            log.warning(
                "%s: %s/%s is not a JSON object; provenance will lack it",
                device.name,
                release_dir,
                MANIFEST,
            )
    else:
        log.warning(
            "%s: release %s has no %s; provenance will lack build inputs",
            device.name,
            release_dir,
            MANIFEST,
        )
    # deploy names a release after its build id (plus a digest when two artifacts share an id)
    build_id = manifest.get("build_id")
    return Release(
        build_id=build_id if isinstance(build_id, str) else PurePosixPath(release_dir).name,
        dir=release_dir,
        manifest=manifest,
        manifest_sha256=digest,
    )


def check_seconds(option: str, value: float | None, *, zero_ok: bool = False) -> None:
    """A duration given on the command line: a finite number of seconds, above zero (or zero, when
    allowed)."""
    if value is None:
        return
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        wanted = "zero or more" if zero_ok else "more than zero"
        raise ConfigError(f"{option} {value:g}: give {wanted} seconds")


def parse_env_assignments(items: Sequence[str]) -> dict[str, str]:
    """``K=V`` strings from the command line; values are kept byte for byte."""
    env: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--env '{item}' is not NAME=VALUE")
        try:
            env[check_env_name(name)] = value
        except ValueError as exc:
            raise ConfigError(f"--env '{item}': {exc}") from None
    return env


def invocation(
    device: Device, release: Release, tool: str, args: Sequence[str], env: Mapping[str, str]
) -> Invocation:
    """The device's runner prefix, the release's tool, the device env plus ``env``; nothing else."""
    if not tool or "/" in tool or tool in (".", ".."):
        raise ConfigError(
            f"'{tool}' is not a tool name",
            hint="name a program of the release's bin/, e.g. llama-bench",
        )
    return Invocation(
        argv=(*device.runner_prefix, f"{release.dir}/bin/{tool}", *args),
        env=with_release_libs({**device_env(device, release.dir), **env}, release.dir),
        cwd=device.root,
    )


def with_release_libs(env: Mapping[str, str], release_dir: str) -> dict[str, str]:
    """``env`` with the release's lib/ on LD_LIBRARY_PATH, first unless it is there already. On
    Android a release's files are symlinks into the device's store, and the loader takes
    ``$ORIGIN`` (the builds' rpath ``$ORIGIN/../lib``) from a program's real path, in the store:
    only LD_LIBRARY_PATH leads it to the release's libraries, whatever a device's own env says."""
    lib = f"{release_dir}/lib"
    paths = [path for path in env.get("LD_LIBRARY_PATH", "").split(":") if path]
    if lib in paths:
        return dict(env)
    return {**env, "LD_LIBRARY_PATH": ":".join([lib, *paths])}


# kzbuild's own tool that runs another and prints its process's peak resident memory
# (kernels/peakrss/)
PEAKRSS = "kz-peakrss"
NO_PEAKRSS = "%s: release %s has no %s: peak memory is not measured (rebuild with it)"


def has_tool(transport: Transport, release: Release, tool: str) -> bool:
    return transport.run(["test", "-x", f"{release.dir}/bin/{tool}"]).ok


def under_peakrss(call: Invocation, release: Release, device: Device) -> Invocation:
    """``call`` run by the release's kz-peakrss, which prints the process's peak memory on
    stderr when it ends. A device's runner (qemu) runs kz-peakrss too, which then runs the
    call as it was, runner and all."""
    return replace(call, argv=(*device.runner_prefix, f"{release.dir}/bin/{PEAKRSS}", *call.argv))


def run_logged(
    transport: Transport,
    call: Invocation,
    logs: Path,
    stem: str,
    *,
    timeout: float | None,
    on_stderr: ByteSink | None = None,
    out_suffix: str = ".json",
) -> bytes:
    """Run ``call``, keeping its stderr in ``logs/STEM.stderr.log`` (as it comes) and its stdout in
    ``logs/STEM`` + ``out_suffix``; returns stdout. A failure is CommandFailed naming the log."""
    stderr_log = logs / f"{stem}.stderr.log"
    with open(stderr_log, "wb") as sink:

        def tee(chunk: bytes) -> None:
            sink.write(chunk)
            if on_stderr:
                on_stderr(chunk)

        result = transport.run(
            call.argv, cwd=call.cwd, env=call.env, timeout=timeout, on_stderr=tee
        )
    (logs / f"{stem}{out_suffix}").write_bytes(result.stdout)
    if not result.ok:
        raise CommandFailed(
            call.argv,
            result.returncode,
            stderr_log.read_text(errors="replace")[-4000:],
            hint=f"full log: {stderr_log}",
        )
    return result.stdout


def check_tool(transport: Transport, device: Device, release: Release, tool: str) -> None:
    if has_tool(transport, release, tool):
        return
    listing = transport.run(["ls", f"{release.dir}/bin"])
    tools = " ".join(listing.text().split()) if listing.ok else "none"
    raise ConfigError(
        f"{device.name}: release {release.build_id} has no tool '{tool}'",
        hint=f"its tools: {tools}",
    )


def memory_measured(
    transport: Transport, device: Device, release: Release, limits: MemoryLimits
) -> bool:
    """Whether the release's kz-peakrss can measure its runs' peak memory; without it a
    memory_budget cannot be checked (ConfigError), else the runs carry no peak (a warning)."""
    if has_tool(transport, release, PEAKRSS):
        return True
    if limits.budget_bytes is not None:
        raise ConfigError(
            f"{device.name}: release {release.build_id} has no {PEAKRSS}, "
            "so the memory_budget cannot be checked",
            hint=f"build with {PEAKRSS} in the recipe's build: tools: and deploy that build",
        )
    log.warning(NO_PEAKRSS, device.name, release.build_id, PEAKRSS)
    return False


def run_in_release(
    settings: Settings,
    transport: Transport,
    device: Device,
    release: Release,
    tool: str,
    args: Sequence[str],
    *,
    env: Mapping[str, str],
    measured: bool,
    timeout: float | None = None,
    on_stdout: ByteSink,
    on_stderr: ByteSink,
) -> tuple[Invocation, int]:
    """Run ``tool`` of ``release`` (kzbuild run: the current one), streaming its output; returns
    what ran and its exit code. ``measured``: under kz-peakrss (see memory_measured), whose line is
    then the last of its stderr."""
    for warning in env_warnings(settings, release, env):
        log.warning("%s", warning)
    call = invocation(device, release, tool, args, env)
    check_tool(transport, device, release, tool)
    if measured:
        call = under_peakrss(call, release, device)
    result = transport.run(
        call.argv,
        cwd=call.cwd,
        env=call.env,
        timeout=timeout,
        on_stdout=on_stdout,
        on_stderr=on_stderr,
    )
    return call, result.returncode


# --- env names the pinned tree reads ---
def hexagon_env_names(settings: Settings, recipe: str) -> frozenset[str] | None:
    """GGML_HEXAGON_* names that ggml-hexagon reads at the recipe's synced commit.

    Scans the committed tree (``git grep`` at the lock's head), so local edits don't count.
    None when the recipe is not synced on this machine.
    """
    head = synced_head(settings, recipe)
    if head is None:
        return None
    found = Git(settings.worktree(recipe)).run(
        "grep",
        "-h",
        "-o",
        "-E",
        r'getenv\("GGML_HEXAGON_[A-Z0-9_]+"\)',
        head,
        "--",
        HEXAGON_SOURCES,
        check=False,
    )
    return frozenset(GETENV_RE.findall(found.stdout))


def synced_head(settings: Settings, recipe: str) -> str | None:
    """The commit the recipe's worktree was synced to (its lock's head), when it is there; else
    None."""
    lock = read_lock(settings.recipes / f"{recipe}.lock.json")
    worktree = settings.worktree(recipe)
    if lock is None or not (worktree / ".git").exists() or not Git(worktree).has_commit(lock.head):
        return None
    return lock.head


def unknown_env(env: Mapping[str, str], known: frozenset[str] | None) -> list[str]:
    """GGML_HEXAGON_* names in ``env`` that the tree does not read."""
    if known is None:
        return []
    return sorted(name for name in env if name.startswith(HEXAGON_ENV_PREFIX) and name not in known)


def env_warnings(settings: Settings, release: Release, env: Mapping[str, str]) -> list[str]:
    """Warnings for GGML_HEXAGON_* names the release's recipe tree does not read."""
    if not any(name.startswith(HEXAGON_ENV_PREFIX) for name in env):
        return []
    recipe = release.manifest.get("recipe")
    if not isinstance(recipe, str):
        return [f"cannot check GGML_HEXAGON_* names: release {release.build_id} names no recipe"]
    known = hexagon_env_names(settings, recipe)
    if known is None:
        return [
            f"cannot check GGML_HEXAGON_* names: recipe {recipe} is not synced here (kzbuild sync "
            f"{recipe})"
        ]
    return [
        f"{name} is not read by ggml-hexagon at {recipe}'s pinned tree (known: "
        f"{', '.join(sorted(known)) or 'none'})"
        for name in unknown_env(env, known)
    ]
