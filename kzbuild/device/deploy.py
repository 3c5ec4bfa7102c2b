"""Deploy: content-addressed, incremental and atomic releases on a device.

The device side (layout, verified resumable uploads, the one-rename switch) is in
:mod:`kzbuild.device.store`. A release is a directory of links into the device's content store
(hard links where the device allows them, else symlinks: Android lets nothing ``adb shell``
starts make a hard link), so only contents the device lacks are sent, and ``current`` moves only
after the whole release is there and verified.

Every operation that changes a device root (deploy, rollback, prune; models push in
:mod:`kzbuild.device.modelpush`) holds the
root's lock (:mod:`kzbuild.device.devicelock`) and refreshes it between its steps.
"""

from __future__ import annotations

import logging
import posixpath
import secrets
import shlex
import time
from collections.abc import Iterable
from dataclasses import replace
from functools import partial
from itertools import chain

from kzbuild.device.base import ByteSource, Member, RemoteResult, Transport
from kzbuild.device.chunkstore import (
    DIRECTORY,
    HARDLINK,
    SYMLINK,
    Carry,
    constant,
    deliver,
    tar_header,
    tar_stream,
)
from kzbuild.device.devicelock import DeviceLock, device_lock
from kzbuild.device.integrity import (
    KeptCheck,
    check,
    kept_hash_step,
    manifest_files,
    manifests_step,
    objects_check_step,
    parse_manifests,
    release_expectations,
    release_files,
    relink,
    unused_objects,
    update_markers,
)
from kzbuild.device.modelpush import WORK_PREFIX
from kzbuild.device.steps import Step, run_steps
from kzbuild.device.store import (
    CHUNK_GC_SCRIPT,
    COMMAND_TIMEOUT,
    PRUNE_SCRIPT,
    RELEASE_SCRIPT,
    SHELL_FUNCTIONS,
    STORE_DIRS,
    VERIFY_TIMEOUT,
    Layout,
    ProgressCallback,
    Remote,
    SendStats,
    StoreState,
    Upload,
    batches,
    by_recency,
    check_switch,
    damaged_history_lines,
    history_step,
    inventory_step,
    object_link,
    parse_history,
    parse_inventory,
    parse_state,
    pruned_releases,
    state_step,
    switch_step,
)
from kzbuild.errors import DeviceError
from kzbuild.model.artifact import MANIFEST, Artifact, ArtifactFile, files_digest
from kzbuild.model.deploy import DeployResult, RollbackResult
from kzbuild.model.device import Device

log = logging.getLogger(__name__)

# contents whose exec bit the release command checks, as its arguments (their names, 67 bytes
# each, share the command with a check of as many more); more are chmod-ed in commands of their own
EXEC_ARGS = 200

# $1 = a file that holds RELEASE_SCRIPT's stdin (removed once it is open), then RELEASE_SCRIPT's
# arguments: the release in the command whose stream brought that file (a Carry)
RELEASE_FROM_FILE = 'exec < "$1" && rm -f "$1" || exit 1; shift; ' + RELEASE_SCRIPT


# --- deploy, rollback, prune ---
def deploy(
    transport: Transport,
    device: Device,
    artifact: Artifact,
    *,
    keep: int | None = None,
    on_progress: ProgressCallback | None = None,
    wait: float = 0.0,
) -> DeployResult:
    """Make ``artifact`` the device's current release, sending only contents it lacks.

    Waits up to ``wait`` seconds for another writer to the device root, then raises Busy.

    Round trips: taking the lock, reading the state and listing the store are one; a first deploy
    then renews the lock, sends its contents (:func:`~kzbuild.device.chunkstore.deliver`: a tar
    stream that ends in the check and the move into the store, and carries the release's own tar
    as a file; over adb a push, with that command started beside it to hash each file as it
    lands), hashes the contents the release keeps,
    completes the release, switches and releases the lock, all in one command (the steps after
    the store run only when every content matched).
    """
    started = time.monotonic()
    layout = Layout(device.root)
    prologue, kept_job = _prologue(layout, artifact)
    with device_lock(
        transport, device.root, "deploy", wait=wait, then=prologue, make=STORE_DIRS
    ) as lock:
        return _deploy(
            transport,
            device,
            artifact,
            keep=keep,
            on_progress=on_progress,
            lock=lock,
            started=started,
            prologue=prologue,
            kept_job=kept_job,
        )


def _deploy(
    transport: Transport,
    device: Device,
    artifact: Artifact,
    *,
    keep: int | None,
    on_progress: ProgressCallback | None,
    lock: DeviceLock,
    started: float,
    prologue: list[Step],
    kept_job: KeptCheck | None,
) -> DeployResult:
    remote = Remote(transport)
    layout = Layout(device.root)
    state_result, inventory_result, *job = remote.checked(prologue, lock.then)
    state = parse_state(state_result)
    release, complete = _release_for(remote, layout, state, artifact)
    uploads: list[Upload] = []
    stats = SendStats()
    metadata = 0
    switch = switch_step(layout, release, "deploy") if state.current != release else None
    # what this deploy just sent was hashed on the device as it entered the store: not again
    verified: frozenset[str] = frozenset()
    if not complete:
        have = parse_inventory(inventory_result, layout.chunks)
        uploads = _plan_uploads(artifact, have.stored)
        verified = frozenset(up.sha256 for up in uploads)
        # the contents stored before are hashed (as objects/SHA) before the command that builds
        # the release switches to it: by the job the first command started in the background,
        # while the rest is sent (that command waits for it), else in that command; should one
        # not match, the sequence stops before the release and the release is built, checked and
        # repaired as below
        kept = sorted({entry.sha256 for entry in artifact.files} - verified)
        waiting = kept_job.wait_step(job[0]) if kept_job and job and kept else None
        check = (
            None
            if release in state.damaged
            else waiting[0]
            if waiting and waiting[1] == len(kept)
            else objects_check_step(layout, kept)
        )
        unlock = keep is None
        assembled: list[tuple[int, bool]] = []

        assemble = partial(
            _assemble,
            remote,
            layout,
            artifact,
            release,
            lock,
            stored=verified,
            hard=state.hard_links,
        )

        def store_then_release(
            receive: Step, carry: Carry | None, lead: ByteSource | None
        ) -> RemoteResult:
            """The check and store of what was sent, then all of the below, in one command."""
            size, passed, head = assemble(
                first=receive,
                carry=carry,
                first_input=lead,
                check=check,
                then=switch,
                unlock=unlock,
            )
            assert head is not None
            if head.ok:
                assembled.append((size, passed))
            return head

        stats = deliver(
            remote,
            layout,
            uploads,
            have.partial,
            on_progress,
            chunks_empty=have.other_empty,
            then=store_then_release,
        )
        metadata, checked = (
            assembled[0] if assembled else assemble(check=check, then=switch, unlock=unlock)[:2]
        )
        if checked:
            verified, switch = verified | set(kept), None
        elif check is not None:
            metadata, _, _ = assemble(check=None, then=None, unlock=False)
    repaired = _verify_release(remote, layout, state, artifact, release, on_progress, verified)
    if switch is not None:
        # renew the lock right before the switch; with nothing to prune, release it in the
        # same round trip
        results = lock.release_after([switch]) if keep is None else lock.refresh_then([switch])
        check_switch(remote, layout.current, switch, results[0])
    switched = state.current != release
    pruned: tuple[str, ...] = ()
    if keep is not None:
        pruned = prune(remote, layout, keep)
    sent = {up.sha256 for up in uploads}
    sent_files = [entry for entry in artifact.files if entry.sha256 in sent]
    return DeployResult(
        device=transport.address,
        build_id=artifact.build_id,
        release=release,
        previous=state.current,
        switched=switched,
        files_sent=len(sent_files),
        files_skipped=len(artifact.files) - len(sent_files),
        bytes_sent=stats.bytes_sent,
        bytes_skipped=max(artifact.total_size - stats.bytes_sent - stats.bytes_resumed, 0),
        bytes_resumed=stats.bytes_resumed,
        metadata_bytes=metadata,
        seconds=time.monotonic() - started,
        pruned=pruned,
        repaired=repaired,
    )


def _prologue(layout: Layout, artifact: Artifact) -> tuple[list[Step], KeptCheck | None]:
    """What deploy runs in the round trip that takes the lock: the state, the store's inventory,
    and the start of a background sha256sum of the artifact's contents the store holds already
    (:func:`~kzbuild.device.integrity.kept_hash_step`; not when the release is there)."""
    steps = [state_step(layout), inventory_step(layout, layout.objects, layout.chunks)]
    names = sorted({entry.sha256 for entry in artifact.files})
    started = kept_hash_step(layout, artifact.build_id, names)
    if started is None:
        return steps, None
    return [*steps, started[0]], started[1]


def _release_for(
    remote: Remote, layout: Layout, state: StoreState, artifact: Artifact
) -> tuple[str, bool]:
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
        log.warning(
            "%s: release %s on the device holds other files than this artifact",
            remote.address,
            name,
        )
    raise DeviceError(
        f"{remote.address}: releases {artifact.build_id}* on the device do not match the artifact"
    )


def _release_digest(remote: Remote, layout: Layout, name: str) -> str | None:
    text = remote.lines(
        ["cat", posixpath.join(layout.release(name), MANIFEST)], what="reading a release manifest"
    )
    files = manifest_files("\n".join(text)) if text is not None else None
    return files_digest(files) if files is not None else None


def _plan_uploads(artifact: Artifact, stored: frozenset[str]) -> list[Upload]:
    """One upload per content the device lacks; same content under two paths is sent once."""
    modes = _content_modes(artifact.files)
    uploads: dict[str, Upload] = {}
    for entry in artifact.files:
        if entry.sha256 in stored or entry.sha256 in uploads:
            continue
        uploads[entry.sha256] = Upload(
            local=f"{artifact.path}/{entry.path}",
            sha256=entry.sha256,
            size=entry.size,
            mode=modes[entry.sha256],
            name=entry.sha256,
            label=entry.path,
        )
    return list(uploads.values())


def _content_modes(entries: Iterable[ArtifactFile]) -> dict[str, int]:
    """The mode of each content's one inode: executable if any path of it must be."""
    modes: dict[str, int] = {}
    for entry in entries:
        modes[entry.sha256] = modes.get(entry.sha256, 0) | entry.mode
    return modes


def _verify_release(
    remote: Remote,
    layout: Layout,
    state: StoreState,
    artifact: Artifact,
    release: str,
    on_progress: ProgressCallback | None,
    verified: frozenset[str],
) -> tuple[str, ...]:
    """Hash every file of ``release`` on the device, except the contents in ``verified`` (checked as
    they entered the store, moments ago); repair what does not match the artifact.

    Returns the repaired files. A failed repair marks the release damaged (run and bench
    refuse it); a verified release loses its mark.
    """
    damage = check(
        remote,
        layout,
        release_expectations(
            release, [entry for entry in artifact.files if entry.sha256 not in verified]
        ),
    )
    repaired: tuple[str, ...] = ()
    if damage:
        log.warning(
            "%s: %d file(s) of release %s do not match, e.g. %s; repairing",
            remote.address,
            len(damage),
            release,
            damage[0].path,
        )
        try:
            repaired = _repair(
                remote,
                layout,
                artifact,
                release,
                {entry.expected for entry in damage},
                on_progress,
                hard=state.hard_links,
            )
        except DeviceError:
            update_markers(remote, layout, state.damaged, damaged=[release])
            raise
    update_markers(remote, layout, state.damaged, intact=[release])
    return repaired


def _repair(
    remote: Remote,
    layout: Layout,
    artifact: Artifact,
    release: str,
    contents: set[str],
    on_progress: ProgressCallback | None,
    *,
    hard: bool,
) -> tuple[str, ...]:
    """Re-send ``contents`` (verified, then renamed over their objects) and relink every release
    holding them (by hard links with ``hard``, else symlinks)."""
    holders: dict[str, tuple[ArtifactFile, ...] | None] = {
        **release_files(remote, layout),
        release: artifact.files,
    }
    held = {
        name: [entry for entry in files if entry.sha256 in contents]
        for name, files in holders.items()
        if files
    }
    modes = _content_modes(entry for entries in held.values() for entry in entries)
    uploads = [
        replace(up, mode=modes[up.sha256])
        for up in _plan_uploads(artifact, frozenset())
        if up.sha256 in contents
    ]
    deliver(remote, layout, uploads, {}, on_progress)
    repaired = relink(remote, layout, held, hard=hard)
    still = check(
        remote,
        layout,
        release_expectations(
            release, [entry for entry in artifact.files if entry.sha256 in contents]
        ),
    )
    if still:
        raise DeviceError(
            f"{remote.address}: {still[0].path} still does not match after a repair: expected "
            f"{still[0].expected}, found {still[0].found}",
            hint="the device's storage may be failing; run kzbuild device verify",
        )
    return repaired


def _assemble(
    remote: Remote,
    layout: Layout,
    artifact: Artifact,
    release: str,
    lock: DeviceLock,
    *,
    stored: frozenset[str],
    hard: bool,
    first: Step | None = None,
    carry: Carry | None = None,
    first_input: ByteSource | None = None,
    check: Step | None,
    then: Step | None,
    unlock: bool,
) -> tuple[int, bool, RemoteResult | None]:
    """Build a staging dir of links into the store (hard links with ``hard``, else symlinks), add
    the manifest, and rename it into place.

    With ``check`` (a content check, :func:`~kzbuild.device.integrity.objects_check_step`) it runs
    first, and the switch ``then`` (and the lock's release, with ``unlock``) follows the release,
    all in one command. Returns the manifest's size and whether the check passed and the rest ran
    (False: the check failed, nothing else ran). Without ``check``, only the release is built.
    Executables get their exec bit unless their content is in ``stored`` (stored by this deploy
    with its mode: nothing to do, and no process for it on the device). A step ``first`` runs
    before all of it, and the rest only if it succeeds; its result comes third (None without it).
    With ``carry`` (``first``'s stream, see :func:`~kzbuild.device.chunkstore.deliver`) the
    release's tar travels in that stream as a file, and the command's stdin is that stream; with
    ``first_input``, what ``first`` reads of the command's stdin comes before the release's tar.

    One command, which renews the lock first: a tar stream of the release's dirs, its manifest and
    its links (which tar makes without a process per file); the contents that must be
    executable go as arguments (the shell tests their exec bit: chmod runs only for one that lacks
    it), or, more than EXEC_ARGS of them, are chmod-ed first in commands of their own. The staging
    dir's name is unique (nothing is written through a hard link), and symlinks are relative
    (:func:`~kzbuild.device.store.object_link`), so the rename keeps them.
    """
    token = secrets.token_hex(4)
    staging = f"releases/.staging-{release}-{token}"
    manifest_bytes = artifact.manifest_path.read_bytes()
    modes = _content_modes(artifact.files)
    executables = sorted(sha for sha, mode in modes.items() if mode & 0o111 and sha not in stored)
    if len(executables) > EXEC_ARGS:
        remote.batched(
            ["chmod", "755"],
            [posixpath.join(layout.objects, sha) for sha in executables],
            what="making stored contents executable",
        )
        executables = []
    parents = {entry.path.rpartition("/")[0] for entry in artifact.files}  # paths are plain
    dirs = sorted({f"{staging}/{parent}" for parent in parents if parent} | {staging})
    headers = [tar_header(name, 0, kind=DIRECTORY, mode=0o755) for name in dirs]
    links = [
        tar_header(
            f"{staging}/{entry.path}",
            0,
            kind=HARDLINK,
            mode=modes[entry.sha256],  # toybox's tar gives a hard link's inode its mode
            linkname=f"objects/{entry.sha256}",
        )
        if hard
        else tar_header(
            f"{staging}/{entry.path}",
            0,
            kind=SYMLINK,
            mode=0o777,
            linkname=object_link(entry.path, entry.sha256),
        )
        for entry in artifact.files
    ]
    manifest = Member(f"{staging}/{MANIFEST}", len(manifest_bytes), constant(manifest_bytes))
    # the manifest last: a stream cut short at a block boundary (which tar may take for its end)
    # leaves no manifest, and RELEASE_SCRIPT then builds no release
    stream = chain((b"".join(headers + links),), tar_stream([manifest]))
    step = Step(
        RELEASE_SCRIPT,
        (layout.root, staging, f"releases/{release}", *executables),
        "completing the release",
    )
    data: ByteSource = stream if first_input is None else chain(first_input, stream)
    if carry is not None:
        data, path = carry(b"".join(stream))
        step = Step(RELEASE_FROM_FILE, (path, *step.args), step.what)
    lead = [first] if first else []
    size = len(manifest_bytes)
    timeout = VERIFY_TIMEOUT if first else COMMAND_TIMEOUT
    if check is None:
        results = lock.refresh_then([*lead, step], data=data, timeout=timeout)
        head = results[0] if first else None
        if head is None or head.ok:
            remote.checked([step], results[len(lead) :])
        return size, False, head
    steps = [*lead, check, step, *([then] if then else [])]
    if unlock and then:
        results = lock.release_after(steps, data=data, timeout=timeout)
    else:
        results = lock.refresh_then(steps, data=data, timeout=timeout)
    head = results[0] if first else None
    results = results[len(lead) :]
    if (head is not None and not head.ok) or not results[0].ok:
        return size, False, head
    remote.checked([step], results[1:2])
    if then:
        check_switch(remote, layout.current, then, results[2])
    return size, True, head


def rollback(
    transport: Transport, device: Device, *, keep: int | None = None, wait: float = 0.0
) -> RollbackResult:
    """Switch ``current`` back to the release that was current before it (waiting for the device
    lock like deploy)."""
    layout = Layout(device.root)
    with device_lock(
        transport,
        device.root,
        "rollback",
        wait=wait,
        then=[state_step(layout), history_step(layout)],
    ) as lock:
        return _rollback(transport, device, keep=keep, lock=lock)


def _rollback(
    transport: Transport, device: Device, *, keep: int | None, lock: DeviceLock
) -> RollbackResult:
    remote = Remote(transport)
    layout = Layout(device.root)
    state_result, history_result = remote.checked(
        [state_step(layout), history_step(layout)], lock.then
    )
    state = parse_state(state_result)
    if state.current is None:
        raise DeviceError(f"{transport.address}: nothing is deployed under {device.root}")
    if damaged := damaged_history_lines(history_result):
        lines = ", ".join(map(str, damaged[:5])) + (" ..." if len(damaged) > 5 else "")
        raise DeviceError(
            f"{transport.address}: the deploy log {layout.history} is damaged (line {lines}), "
            "so the release current was switched from is not known; nothing was switched",
            hint="fix or remove those lines, or deploy the release wanted with --artifact",
        )
    history = parse_history(history_result)
    target = next((name for name in by_recency(state, history) if name != state.current), None)
    if target is None:
        raise DeviceError(
            f"{transport.address}: no earlier release to roll back to (only {state.current} is on "
            "the device)",
        )
    switch = switch_step(layout, target, "rollback")
    results = lock.release_after([switch]) if keep is None else lock.refresh_then([switch])
    check_switch(remote, layout.current, switch, results[0])
    pruned = prune(remote, layout, keep) if keep is not None else ()
    return RollbackResult(
        device=transport.address, release=target, previous=state.current, pruned=pruned
    )


# A cut models push whose work dir nothing touched for this long is given up by prune (it runs
# under the device lock, so no push is using it): longer than a lunch break with the cable out.
CUT_PUSH_MINUTES = 24 * 60
# find's tests for those work dirs, in incoming/
STALE_PUSHES = shlex.join(
    ("-maxdepth", "1", "-name", f"{WORK_PREFIX}*", "-type", "d", "-mmin", f"+{CUT_PUSH_MINUTES}")
)
# $1 = a dir; prints its names, one a line
NAMES_SCRIPT = SHELL_FUNCTIONS + 'cd "$1" || exit 1; kz_ls *'
# $1 = incoming/
CUT_PUSHES_SCRIPT = f'cd "$1" 2>/dev/null || exit 0; find . {STALE_PUSHES} -exec rm -rf {{}} +'


def prune(remote: Remote, layout: Layout, keep: int) -> tuple[str, ...]:
    """Keep the ``keep`` most recently switched-to releases (always the current one); drop unused
    contents, and the work dirs of model pushes cut :data:`CUT_PUSH_MINUTES` ago or more."""
    if keep < 1:
        raise ValueError("keep must be at least 1")
    steps = [state_step(layout), history_step(layout)]
    state_result, history_result = remote.checked(
        steps, run_steps(remote.transport, steps, timeout=COMMAND_TIMEOUT)
    )
    state = parse_state(state_result)
    doomed = pruned_releases(state, by_recency(state, parse_history(history_result)), keep)
    for batch in list(batches(doomed)) or [[]]:  # stale staging dirs go even when no release does
        remote.script(PRUNE_SCRIPT, [layout.root, *batch], what="removing old releases")
    steps = [manifests_step(layout), Step(NAMES_SCRIPT, (layout.objects,), "listing contents")]
    manifests_result, objects_result = remote.checked(
        steps, run_steps(remote.transport, steps, timeout=COMMAND_TIMEOUT)
    )
    manifests = parse_manifests(manifests_result)
    if unreadable := sorted(name for name, files in manifests.items() if files is None):
        log.warning(
            "%s: release %s has no readable manifest, so no content was removed (run kzbuild "
            "device verify)",
            remote.address,
            ", ".join(unreadable),
        )
    unused = unused_objects(manifests, objects_result.text().splitlines())
    remote.batched(
        ["rm", "-f"],
        [posixpath.join(layout.objects, name) for name in unused],
        what="removing unused contents",
    )
    steps = [
        Step(CHUNK_GC_SCRIPT, (layout.root,), "removing unused chunks"),
        Step(CUT_PUSHES_SCRIPT, (layout.incoming,), "removing model pushes cut a day ago or more"),
    ]
    remote.checked(steps, run_steps(remote.transport, steps, timeout=COMMAND_TIMEOUT))
    return tuple(doomed)
