"""Deploy: content-addressed, incremental and atomic releases on a device; models push.

Layout under the device root (ROOT)::

    objects/<sha256>            content store; a file enters only after sha256sum on the device matched
    incoming/<name>             uploads in progress: a cut upload resumes from what arrived
    releases/<release>/         one per build: hard links into objects/, plus manifest.json
    releases/.staging-<release> a release being assembled; renamed into place once complete
    current -> releases/<release>   switched by one rename
    deploys.log                 one line per switch (time, action, release): rollback and --keep read it
    models/<sha256>.gguf, models/<name> -> <sha256>.gguf
    .switch/                    new symlinks and the log are made here, then renamed into place

Only commands Android's toybox has are used (mkdir -p, ls -1, readlink, cat, stat -c,
sha256sum, chmod, ln, mv -f, rm, find -links). ``mv -T`` is avoided (older toybox lacks it):
a new symlink is made in ``.switch/`` and moved *into* the directory, which is one rename(2)
that replaces the old symlink (mv does not follow a symlink it replaces).
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
import shlex
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from kzbuild.devices.base import RemoteResult, Resumable, Transport
from kzbuild.errors import ConfigError, DeviceError
from kzbuild.model.artifact import MANIFEST, SHA256_RE, Artifact, files_digest, parse_files
from kzbuild.model.device import Device
from kzbuild.model.recipe import Recipe
from kzbuild.settings import Settings

log = logging.getLogger(__name__)

ARGV_BUDGET = 60_000  # bytes of arguments per remote command (Android's limit is far higher)
HISTORY_LINES = 500
VERIFY_TIMEOUT = 1800.0  # sha256sum of a multi-GB model on a phone takes a while
COMMAND_TIMEOUT = 120.0
GGUF_MAGIC = b"GGUF"
HASH_CHUNK = 1 << 20
# Constant scripts; the data goes in as positional arguments, quoted by remote_command, so
# nothing from a manifest or a file name is ever pasted into a shell string.
LINK_SCRIPT = 'while [ "$#" -gt 1 ]; do ln "$1" "$2" || exit 1; shift 2; done'
SWITCH_SCRIPT = 'rm -f "$1" && ln -s "$2" "$1" && mv -f "$1" "$3"'


# --- what deploy reports ---
@dataclass(frozen=True)
class TransferProgress:
    label: str  # the file being sent
    done: int  # bytes sent so far by this operation
    total: int  # bytes this operation will send


ProgressCallback = Callable[[TransferProgress], None]


@dataclass(frozen=True)
class DeployResult:
    device: str
    build_id: str
    release: str
    previous: str | None  # the release `current` pointed at before
    switched: bool
    files_sent: int
    files_skipped: int
    bytes_sent: int  # file contents sent
    bytes_skipped: int  # file contents the device already held
    bytes_resumed: int  # of bytes_sent's files, bytes an earlier cut upload had already delivered
    metadata_bytes: int  # manifest and deploy log
    seconds: float
    pruned: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class RollbackResult:
    device: str
    release: str
    previous: str
    pruned: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class ModelPushResult:
    device: str
    sha256: str
    path: str  # content-addressed file on the device
    link: str  # readable name pointing at it
    bytes_sent: int
    bytes_resumed: int
    already_there: bool
    seconds: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


# --- the device side ---
@dataclass(frozen=True)
class Layout:
    root: str

    def join(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    @property
    def objects(self) -> str:
        return self.join("objects")

    @property
    def incoming(self) -> str:
        return self.join("incoming")

    @property
    def releases(self) -> str:
        return self.join("releases")

    @property
    def models(self) -> str:
        return self.join("models")

    @property
    def switch(self) -> str:
        return self.join(".switch")

    @property
    def current(self) -> str:
        return self.join("current")

    @property
    def history(self) -> str:
        return self.join("deploys.log")

    def release(self, name: str) -> str:
        return posixpath.join(self.releases, name)


@dataclass(frozen=True)
class HistoryEntry:
    time: str
    action: str  # deploy | rollback
    release: str

    def line(self) -> str:
        return f"{self.time}\t{self.action}\t{self.release}\n"


@dataclass(frozen=True)
class DeviceState:
    current: str | None  # release name
    releases: frozenset[str]
    objects: frozenset[str]
    history: tuple[HistoryEntry, ...]

    def by_recency(self) -> list[str]:
        """Releases, most recently switched to first; those the log never saw come last."""
        order: list[str] = []
        for entry in reversed(self.history):
            if entry.release in self.releases and entry.release not in order:
                order.append(entry.release)
        return order + sorted(self.releases - set(order))

    def previous(self) -> str | None:
        return next((name for name in self.by_recency() if name != self.current), None)


class Remote:
    """Runs commands on a device for deploy; a failure becomes a DeviceError naming the device."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    @property
    def address(self) -> str:
        return self.transport.address

    def run(self, argv: Sequence[str], *, what: str, check: bool = True, timeout: float = COMMAND_TIMEOUT) -> RemoteResult:
        result = self.transport.run(argv, timeout=timeout)
        if check and not result.ok:
            stderr = result.stderr.decode(errors="replace").strip()
            raise DeviceError(
                f"{self.address}: {what} failed (exit {result.returncode}): {shlex.join(argv)}" + (f"\n{stderr}" if stderr else "")
            )
        return result

    def run_batched(self, command: Sequence[str], args: Sequence[str], *, what: str, group: int = 1, check: bool = True, timeout: float = COMMAND_TIMEOUT) -> list[RemoteResult]:
        """Run ``command + args`` in as few calls as the argv budget allows; ``group`` args stay together."""
        return [self.run([*command, *batch], what=what, check=check, timeout=timeout) for batch in batches(args, group)]

    def lines(self, argv: Sequence[str], *, what: str) -> list[str] | None:
        """stdout lines of argv, or None when it fails (a missing file or link)."""
        result = self.run(argv, what=what, check=False)
        return result.text().splitlines() if result.ok else None


def batches(args: Sequence[str], group: int = 1) -> Iterator[list[str]]:
    batch: list[str] = []
    size = 0
    for start in range(0, len(args), group):
        items = list(args[start : start + group])
        cost = sum(len(item) + 3 for item in items)
        if batch and size + cost > ARGV_BUDGET:
            yield batch
            batch, size = [], 0
        batch += items
        size += cost
    if batch:
        yield batch


def read_state(remote: Remote, layout: Layout) -> DeviceState:
    remote.run(["mkdir", "-p", layout.objects, layout.incoming, layout.releases, layout.switch], what="creating the device layout")
    link = remote.lines(["readlink", layout.current], what="reading current")
    current = posixpath.basename(link[0].rstrip("/")) if link else None
    releases = frozenset(remote.lines(["ls", "-1", layout.releases], what="listing releases") or ())
    objects = frozenset(remote.lines(["ls", "-1", layout.objects], what="listing objects") or ())
    history = []
    for line in remote.lines(["cat", layout.history], what="reading the deploy log") or ():
        parts = line.split("\t")
        if len(parts) == 3:
            history.append(HistoryEntry(*parts))
    return DeviceState(current, releases, objects, tuple(history))


# --- uploads: resume, verify on the device, then rename into the store ---
@dataclass(frozen=True)
class Upload:
    local: Path
    sha256: str
    size: int
    mode: int
    dest_dir: str  # objects/ or models/
    name: str  # final file name there (also its name in incoming/)
    label: str  # shown in progress


@dataclass(frozen=True)
class SendStats:
    bytes_sent: int = 0
    bytes_resumed: int = 0


def send(remote: Remote, layout: Layout, uploads: Sequence[Upload], on_progress: ProgressCallback | None) -> SendStats:
    """Upload to incoming/, check every sha256 on the device, then move the files into place."""
    if not uploads:
        return SendStats()
    arrived = _partial_sizes(remote, layout, uploads)
    offsets = {up.name: (arrived.get(up.name, 0) if arrived.get(up.name, 0) <= up.size else 0) for up in uploads}
    if not isinstance(remote.transport, Resumable):
        offsets = {name: 0 for name in offsets}
    total = sum(up.size - offsets[up.name] for up in uploads)
    done = 0
    for up in uploads:
        offset = offsets[up.name]
        if offset == up.size and up.size:
            continue  # fully arrived before a cut; verified below like the rest
        target = posixpath.join(layout.incoming, up.name)
        base = done

        def report(sent: int, label: str = up.label, base: int = base) -> None:
            if on_progress:
                on_progress(TransferProgress(label, base + sent, total))

        if offset:
            log.info("%s: resuming %s at byte %d", remote.address, up.label, offset)
            remote.transport.append(up.local, target, offset=offset, progress=report)  # type: ignore[attr-defined]
        else:
            remote.transport.push(up.local, target, progress=report)
        done += up.size - offset
        report(up.size - offset)
    found = _device_sha256(remote, layout, uploads)
    bad = [up for up in uploads if found.get(up.name) != up.sha256]
    _store(remote, layout, [up for up in uploads if up not in bad])
    if bad:
        remote.run_batched(["rm", "-f"], [posixpath.join(layout.incoming, up.name) for up in bad], what="removing corrupt uploads")
        raise DeviceError(
            f"{remote.address}: sha256 mismatch on the device for {len(bad)} file(s), e.g. {bad[0].label}: "
            f"expected {bad[0].sha256}, got {found.get(bad[0].name, 'no checksum (is sha256sum installed?)')}; "
            "the corrupt uploads were removed",
            hint=f"if {bad[0].local} changed after the manifest was written, rebuild; otherwise rerun",
        )
    return SendStats(bytes_sent=done, bytes_resumed=sum(offsets.values()))


def _store(remote: Remote, layout: Layout, verified: Sequence[Upload]) -> None:
    """Give verified uploads their mode and rename them from incoming/ into their store."""
    by_mode: dict[int, list[str]] = {}
    by_dest: dict[str, list[str]] = {}
    for up in verified:
        by_mode.setdefault(up.mode, []).append(posixpath.join(layout.incoming, up.name))
        by_dest.setdefault(up.dest_dir, []).append(posixpath.join(layout.incoming, up.name))
    for mode, paths in by_mode.items():
        remote.run_batched(["chmod", f"{mode:o}"], paths, what="setting file modes")
    for dest, paths in by_dest.items():
        for batch in batches(paths):
            remote.run(["mv", "-f", *batch, dest + "/"], what="moving verified files into the store")


def _partial_sizes(remote: Remote, layout: Layout, uploads: Sequence[Upload]) -> dict[str, int]:
    """Sizes of uploads a cut deploy left in incoming/ (missing files are simply absent)."""
    existing = set(remote.lines(["ls", "-1", layout.incoming], what="listing incoming") or ())
    paths = [posixpath.join(layout.incoming, up.name) for up in uploads if up.name in existing]
    sizes: dict[str, int] = {}
    for result in remote.run_batched(["stat", "-c", "%s %n"], paths, what="sizing partial uploads", check=False):
        for line in result.text().splitlines():
            size, _, path = line.partition(" ")
            if size.isdigit():
                sizes[posixpath.basename(path)] = int(size)
    return sizes


def _device_sha256(remote: Remote, layout: Layout, uploads: Sequence[Upload]) -> dict[str, str]:
    """sha256 of each upload as the device computes it, by name (absent when unreadable)."""
    found: dict[str, str] = {}
    paths = [posixpath.join(layout.incoming, up.name) for up in uploads]
    for result in remote.run_batched(["sha256sum"], paths, what="checking sha256 on the device", check=False, timeout=VERIFY_TIMEOUT):
        for line in result.text().splitlines():
            digest, _, path = line.partition("  ")
            found[posixpath.basename(path)] = digest
    return found


def _point(remote: Remote, layout: Layout, link: str, target: str) -> None:
    """Make the symlink ``link`` point at ``target`` with one rename (see the module doc)."""
    staged = posixpath.join(layout.switch, posixpath.basename(link))
    remote.run(["sh", "-c", SWITCH_SCRIPT, "kz-switch", staged, target, posixpath.dirname(link) + "/"], what=f"switching {link}")
    now = remote.lines(["readlink", link], what=f"checking {link}")
    if not now or now[0] != target:
        raise DeviceError(f"{remote.address}: {link} points at {now[0] if now else 'nothing'} after the switch, not {target}")


def _record(remote: Remote, layout: Layout, state: DeviceState, action: str, release: str) -> int:
    """Append to the deploy log (written whole and renamed into place). Returns the bytes sent."""
    entry = HistoryEntry(datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), action, release)
    lines = [e.line() for e in (*state.history, entry)][-HISTORY_LINES:]
    with tempfile.TemporaryDirectory(prefix="kz-deploy-") as tmp:
        local = Path(tmp) / "deploys.log"
        local.write_text("".join(lines), encoding="utf-8")
        staged = posixpath.join(layout.switch, "deploys.log")
        remote.transport.push(local, staged)
        remote.run(["mv", "-f", staged, layout.root + "/"], what="writing the deploy log")
        return local.stat().st_size


# --- deploy, rollback, prune ---
def deploy(
    transport: Transport,
    device: Device,
    artifact: Artifact,
    *,
    keep: int | None = None,
    on_progress: ProgressCallback | None = None,
) -> DeployResult:
    """Make ``artifact`` the device's current release, sending only contents it lacks."""
    started = time.monotonic()
    remote = Remote(transport)
    layout = Layout(device.root)
    state = read_state(remote, layout)
    release, complete = _release_for(remote, layout, state, artifact)
    uploads = [] if complete else _plan_uploads(artifact, state.objects, layout)
    stats = send(remote, layout, uploads, on_progress)
    metadata = 0
    if not complete:
        metadata += _assemble(remote, layout, artifact, release)
    switched = state.current != release
    if switched:
        _point(remote, layout, layout.current, posixpath.join("releases", release))
        metadata += _record(remote, layout, state, "deploy", release)
    pruned: tuple[str, ...] = ()
    if keep is not None:
        pruned = prune(remote, layout, keep)
    sent_shas = {up.sha256 for up in uploads}
    sent_files = [entry for entry in artifact.files if entry.sha256 in sent_shas]
    return DeployResult(
        device=transport.address,
        build_id=artifact.build_id,
        release=release,
        previous=state.current,
        switched=switched,
        files_sent=len(sent_files),
        files_skipped=len(artifact.files) - len(sent_files),
        bytes_sent=stats.bytes_sent,
        bytes_skipped=artifact.total_size - sum(entry.size for entry in sent_files),
        bytes_resumed=stats.bytes_resumed,
        metadata_bytes=metadata,
        seconds=time.monotonic() - started,
        pruned=pruned,
    )


def _release_for(remote: Remote, layout: Layout, state: DeviceState, artifact: Artifact) -> tuple[str, bool]:
    """The release dir name for ``artifact`` and whether the device already holds it complete.

    Normally the build id. Should the device hold a release of that id with other files (a
    non-reproducible rebuild), the new one is named ``<build-id>-<files digest>`` so the
    release ``current`` may point at is never modified in place.
    """
    digest = artifact.files_digest
    for name in (artifact.build_id, f"{artifact.build_id}-{digest[:12]}"):
        if name not in state.releases:
            return name, False
        if _release_digest(remote, layout, name) == digest:
            return name, True
        log.warning("%s: release %s on the device holds other files than this artifact", remote.address, name)
    raise DeviceError(f"{remote.address}: releases {artifact.build_id}* on the device do not match the artifact")


def _release_digest(remote: Remote, layout: Layout, name: str) -> str | None:
    text = remote.lines(["cat", posixpath.join(layout.release(name), MANIFEST)], what="reading a release manifest")
    if text is None:
        return None
    try:
        return files_digest(parse_files(json.loads("\n".join(text)).get("files")))
    except (ValueError, AttributeError):
        return None


def _plan_uploads(artifact: Artifact, stored: frozenset[str], layout: Layout) -> list[Upload]:
    """One upload per content the device lacks; same content under two paths is sent once."""
    modes: dict[str, int] = {}
    for entry in artifact.files:
        modes[entry.sha256] = modes.get(entry.sha256, 0) | entry.mode  # one inode per content
    uploads: dict[str, Upload] = {}
    for entry in artifact.files:
        if entry.sha256 in stored or entry.sha256 in uploads:
            continue
        uploads[entry.sha256] = Upload(
            local=artifact.directory / entry.path,
            sha256=entry.sha256,
            size=entry.size,
            mode=modes[entry.sha256],
            dest_dir=layout.objects,
            name=entry.sha256,
            label=entry.path,
        )
    return list(uploads.values())


def _assemble(remote: Remote, layout: Layout, artifact: Artifact, release: str) -> int:
    """Build releases/.staging-<release> from hard links into the store and rename it into place."""
    staging = layout.release(f".staging-{release}")
    remote.run(["rm", "-rf", staging], what="clearing an unfinished release")
    dirs = sorted({posixpath.dirname(posixpath.join(staging, entry.path)) for entry in artifact.files} | {staging})
    remote.run_batched(["mkdir", "-p"], dirs, what="creating release directories")
    pairs: list[str] = []
    for entry in artifact.files:
        pairs += [posixpath.join(layout.objects, entry.sha256), posixpath.join(staging, entry.path)]
    remote.run_batched(["sh", "-c", LINK_SCRIPT, "kz-link"], pairs, group=2, what="linking the release")
    remote.transport.push(artifact.manifest_path, posixpath.join(staging, MANIFEST))
    remote.run(["mv", "-f", staging, layout.release(release)], what="completing the release")
    return artifact.manifest_path.stat().st_size


def rollback(transport: Transport, device: Device, *, keep: int | None = None) -> RollbackResult:
    """Switch ``current`` back to the release that was current before it."""
    remote = Remote(transport)
    layout = Layout(device.root)
    state = read_state(remote, layout)
    if state.current is None:
        raise DeviceError(f"{transport.address}: nothing is deployed under {device.root}")
    target = state.previous()
    if target is None:
        raise DeviceError(
            f"{transport.address}: no earlier release to roll back to (only {state.current} is on the device)",
        )
    _point(remote, layout, layout.current, posixpath.join("releases", target))
    _record(remote, layout, state, "rollback", target)
    pruned = prune(remote, layout, keep) if keep is not None else ()
    return RollbackResult(device=transport.address, release=target, previous=state.current, pruned=pruned)


def prune(remote: Remote, layout: Layout, keep: int) -> tuple[str, ...]:
    """Keep the ``keep`` most recently switched-to releases (always the current one); drop unused contents."""
    if keep < 1:
        raise ValueError("keep must be at least 1")
    state = read_state(remote, layout)
    kept = set(state.by_recency()[:keep]) | ({state.current} if state.current else set())
    doomed = [name for name in state.by_recency() if name not in kept]
    remote.run_batched(["rm", "-rf"], [layout.release(name) for name in doomed], what="removing old releases")
    unused = remote.lines(["find", layout.objects, "-type", "f", "-links", "1"], what="finding unused contents") or []
    remote.run_batched(["rm", "-f"], unused, what="removing unused contents")
    return tuple(doomed)


# --- artifacts on this machine ---
def find_artifact(settings: Settings, ref: str | None, recipe: Recipe | None) -> Artifact:
    """``ref`` is a build id under the artifacts dir or a path; without it, the recipe's newest artifact."""
    if ref is not None:
        candidates = [Path(ref).expanduser(), settings.artifacts / ref]
        for candidate in candidates:
            if (candidate / MANIFEST).is_file():
                return load_artifact(candidate)
        raise ConfigError(
            f"no artifact '{ref}': neither a directory with {MANIFEST} nor a build id in {settings.artifacts}",
            hint="run kzbuild build, or pass --artifact with a build id or an artifact directory",
        )
    assert recipe is not None, "a recipe or an artifact reference is needed"
    newest: tuple[float, Path] | None = None
    for manifest in settings.artifacts.glob(f"*/{MANIFEST}"):
        try:
            doc = json.loads(manifest.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("recipe") == recipe.name:
            stamp = manifest.stat().st_mtime
            if newest is None or stamp > newest[0]:
                newest = (stamp, manifest.parent)
    if newest is None:
        raise ConfigError(
            f"no artifact of recipe {recipe.name} in {settings.artifacts}",
            hint=f"run kzbuild build {recipe.name}, or pass --artifact BUILD_ID|PATH",
        )
    return load_artifact(newest[1])


def load_artifact(directory: Path) -> Artifact:
    """Read and check an artifact's manifest; every listed file must be there with its size."""
    directory = directory.resolve()
    path = directory / MANIFEST
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read the manifest: {exc.strerror}", path=path) from exc
    except ValueError as exc:
        raise ConfigError(f"the manifest is not valid JSON: {exc}", path=path) from exc
    if not isinstance(doc, dict):
        raise ConfigError("the manifest must be a JSON object", path=path)
    build_id = doc.get("build_id")
    if not isinstance(build_id, str) or not build_id or "/" in build_id or build_id.startswith("."):
        raise ConfigError("must be a non-empty name without '/' that does not start with '.'", path=path, key="build_id")
    try:
        files = parse_files(doc.get("files"))
    except ValueError as exc:
        raise ConfigError(str(exc), path=path) from exc
    for entry in files:
        local = directory / entry.path
        if not local.is_file():
            raise ConfigError(f"files: '{entry.path}' is listed but missing from {directory}", path=path)
        if local.stat().st_size != entry.size:
            raise ConfigError(
                f"files: '{entry.path}' is {local.stat().st_size} bytes on disk but {entry.size} in the manifest",
                path=path,
                hint="the artifact changed after it was built; rebuild it",
            )
    recipe = doc.get("recipe")
    return Artifact(build_id=build_id, directory=directory, files=files, recipe=recipe if isinstance(recipe, str) else None)


# --- models ---
def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def push_model(
    transport: Transport,
    device: Device,
    model: Path,
    *,
    name: str | None = None,
    on_progress: ProgressCallback | None = None,
) -> ModelPushResult:
    """Store a GGUF model as models/<sha256>.gguf (sent only if absent) and point models/<name> at it."""
    started = time.monotonic()
    name = name or model.name
    _check_model(model, name)
    sha = sha256_file(model)
    stored_name = f"{sha}.gguf"
    if name != stored_name and name.endswith(".gguf") and SHA256_RE.match(name.removesuffix(".gguf")):
        raise ConfigError(f"bad model name '{name}': names of the form <sha256>.gguf are the store's own")
    remote = Remote(transport)
    layout = Layout(device.root)
    remote.run(["mkdir", "-p", layout.models, layout.incoming, layout.switch], what="creating the device layout")
    present = stored_name in set(remote.lines(["ls", "-1", layout.models], what="listing models") or ())
    stats = SendStats()
    if not present:
        upload = Upload(model, sha, model.stat().st_size, 0o644, layout.models, stored_name, model.name)
        stats = send(remote, layout, [upload], on_progress)
    link = posixpath.join(layout.models, name)
    if name != stored_name and remote.lines(["readlink", link], what="reading the model link") != [stored_name]:
        _point(remote, layout, link, stored_name)
    return ModelPushResult(
        device=transport.address,
        sha256=sha,
        path=posixpath.join(layout.models, stored_name),
        link=link,
        bytes_sent=stats.bytes_sent,
        bytes_resumed=stats.bytes_resumed,
        already_there=present,
        seconds=time.monotonic() - started,
    )


def _check_model(model: Path, name: str) -> None:
    if not model.is_file():
        raise ConfigError(f"no model file {model}")
    with open(model, "rb") as handle:
        if handle.read(4) != GGUF_MAGIC:
            raise ConfigError(f"{model} is not a GGUF model (it does not start with 'GGUF')")
    if "/" in name or name.startswith(".") or not name:
        raise ConfigError(f"bad model name '{name}': use a plain file name that does not start with '.'")
