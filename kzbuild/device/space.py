"""``kzbuild device status``: the space each release and model holds on a device, and what
``--keep N`` would free; one read-only round trip.

A release is a dir of links into ``objects/`` (hard links, or symlinks on Android) and its
manifest.json says which contents: a content that several releases share is one file, each
release's ``holds`` counts it, its ``own`` only when no other release holds it, and ``contents``
(objects/) counts every file once. ``chunks/`` holds the chunks of chunked contents again,
beside them, to send deltas. A model under several names is stored once; a model kept as splits
(``models push --split``) holds each split as one file that other models may hold too: each
model's ``size`` counts its files, its ``own`` only those no other model holds, and
``model_files`` every file once. What ``--keep N`` frees is what
:func:`~kzbuild.device.deploy.prune` removes: the releases it drops, the contents only they (or
nothing) hold, the chunks only those contents use, and cut model pushes nothing touched for a
day; models are never pruned.
"""

from __future__ import annotations

import posixpath
import re
from collections import defaultdict

from kzbuild.device.deploy import STALE_PUSHES
from kzbuild.device.integrity import Manifests, manifests_step, parse_manifests, unused_objects
from kzbuild.device.modelsplit import SPLIT_LINK_RE
from kzbuild.device.steps import Step, run_steps
from kzbuild.device.store import (
    COMMAND_TIMEOUT,
    HistoryEntry,
    Layout,
    Remote,
    StoreState,
    by_recency,
    history_step,
    parse_history,
    parse_state,
    pruned_releases,
    sections,
    state_step,
)
from kzbuild.model.devicespace import KeepSpace, ModelSpace, ReleaseSpace, SpaceReport

# $1 = ROOT. "INODE SIZE PATH" of every file under releases/, objects/, chunks/ and incoming/,
# "/", the models ("f INODE SIZE NAME" for a file, "l TARGET NAME" for a link), "/", every chunk
# list's lines as grep prints them ("chunklists/SHA:CHUNK SIZE"), "/", the split models'
# manifests' lines ("models/.splits/SHA:SPLIT SIZE"), "/", then the work dirs of cut model pushes
# that prune would give up ("incoming/.kzm-...").
STORED_RE = re.compile(r"^[0-9a-f]{64}\.gguf$")  # models/<sha256>.gguf: a model or a split
SPACE_SCRIPT = (
    'cd "$1" || exit 1; find releases objects chunks incoming -type f -exec stat -c "%i %s %n" '
    "{} + 2>/dev/null; echo /; for f in models/*; do n=${f#models/}; "
    'if [ -L "$f" ]; then echo "l $(readlink "$f") $n"; '
    'elif [ -f "$f" ]; then echo "f $(stat -c "%i %s" "$f") $n"; fi; done; echo /; '
    "grep -H '' chunklists/* 2>/dev/null; echo /; grep -H '' models/.splits/* 2>/dev/null; "
    f"echo /; find incoming {STALE_PUSHES} 2>/dev/null; true"
)


def space(remote: Remote, layout: Layout) -> SpaceReport:
    """What the store under ``layout`` holds (read only: no lock, nothing changes)."""
    steps = [
        state_step(layout),
        history_step(layout),
        manifests_step(layout),
        Step(SPACE_SCRIPT, (layout.root,), "listing the store's files"),
    ]
    state_result, history_result, manifests_result, files_result = remote.checked(
        steps, run_steps(remote.transport, steps, timeout=COMMAND_TIMEOUT)
    )
    files, models, lists, manifests, stale = sections(
        files_result.text().splitlines(), 5, what="listing the store's files"
    )
    return report(
        remote.address,
        layout.root,
        parse_state(state_result),
        parse_history(history_result),
        parse_manifests(manifests_result),
        files,
        models,
        lists,
        manifests,
        stale,
    )


def report(
    device: str,
    root: str,
    state: StoreState,
    history: list[HistoryEntry],
    releases_files: Manifests,
    files: list[str],
    models: list[str],
    lists: list[str],
    manifests: list[str],
    stale: list[str],
) -> SpaceReport:
    """The report from the listings of :data:`SPACE_SCRIPT` (a line it cannot read is skipped)."""
    sizes: dict[str, int] = {}  # inode -> bytes
    objects: dict[str, str] = {}  # sha256 -> inode
    linked: dict[str, set[str]] = defaultdict(set)  # release -> inodes
    chunks: dict[str, int] = {}
    incoming: dict[str, int] = {}  # inode -> bytes (a direct models push names its file twice)
    given_up: dict[str, int] = {}  # inode -> bytes, of the cut pushes prune gives up
    for line in files:
        inode, size, path = (line.split(" ", 2) + ["", ""])[:3]
        if not (inode.isdigit() and size.isdigit()):
            continue
        top, _, rest = path.partition("/")
        if top == "releases" and not rest.startswith(".staging-"):
            linked[rest.split("/", 1)[0]].add(inode)
        elif top == "objects":
            objects[rest] = inode
        elif top == "chunks":
            chunks[rest] = int(size)
            continue
        elif top == "incoming":
            incoming[inode] = int(size)
            if f"incoming/{rest.split('/', 1)[0]}" in stale:
                given_up[inode] = int(size)
            continue
        sizes[inode] = int(size)
    for release, listed in releases_files.items():
        linked[release] |= {
            objects[entry.sha256] for entry in listed or () if entry.sha256 in objects
        }
    recency = by_recency(state, history)
    holders: dict[str, set[str]] = defaultdict(set)  # inode -> releases
    for release in recency:
        for inode in linked[release]:
            holders[inode].add(release)
    releases = tuple(
        ReleaseSpace(
            name,
            name == state.current,
            sum(sizes[inode] for inode in linked[name]),
            sum(sizes[inode] for inode in linked[name] if holders[inode] == {name}),
        )
        for name in recency
    )
    uses: dict[str, set[str]] = defaultdict(set)  # object sha256 -> its chunks
    for line in lists:
        where, _, entry = line.partition(":")
        uses[posixpath.basename(where)].add(entry.split(" ", 1)[0])
    keeps = tuple(
        _keeping(
            keep,
            state,
            recency,
            releases_files,
            linked,
            holders,
            sizes,
            objects,
            uses,
            chunks,
            sum(given_up.values()),
        )
        for keep in range(1, max(len(recency), 1))
    )
    stored, model_files = _models(models, manifests)
    return SpaceReport(
        device,
        root,
        releases,
        sum(sizes[inode] for inode in set(objects.values())),
        sum(chunks.values()),
        stored,
        model_files,
        sum(incoming.values()),
        keeps,
        state.hard_links,
    )


def _keeping(
    keep: int,
    state: StoreState,
    recency: list[str],
    releases_files: Manifests,
    linked: dict[str, set[str]],
    holders: dict[str, set[str]],
    sizes: dict[str, int],
    objects: dict[str, str],
    uses: dict[str, set[str]],
    chunks: dict[str, int],
    given_up: int,
) -> KeepSpace:
    doomed = pruned_releases(state, recency, keep)
    kept = set(recency) - set(doomed)
    alive = {inode for inode, names in holders.items() if names & kept}
    # the doomed releases' own files (a manifest) and every content no kept release's manifest
    # lists (as prune decides)
    unused = unused_objects({name: releases_files.get(name) for name in kept}, objects)
    gone = {objects[sha] for sha in unused}
    gone |= {inode for name in doomed for inode in linked[name]} - alive - set(objects.values())
    needed = {chunk for sha in objects.keys() - set(unused) for chunk in uses[sha]}
    freed_chunks = sum(size for name, size in chunks.items() if name not in needed)
    freed = sum(sizes[inode] for inode in gone) + freed_chunks + given_up
    return KeepSpace(keep, tuple(doomed), freed)


def _models(lines: list[str], manifests: list[str]) -> tuple[tuple[ModelSpace, ...], int]:
    """Each model (whole, or the splits its manifest lists) and the bytes of models/, each file
    (inode) once."""
    files: dict[str, tuple[str, int]] = {}  # sha256 -> (inode, size) of models/SHA.gguf
    inodes: dict[str, int] = {}
    names: dict[str, list[str]] = defaultdict(list)
    for line in lines:
        kind, _, rest = line.partition(" ")
        if kind == "f":
            inode, size, name = (rest.split(" ", 2) + ["", ""])[:3]
            if inode.isdigit() and size.isdigit():
                inodes[inode] = int(size)
                if STORED_RE.match(name):
                    files[name.removesuffix(".gguf")] = (inode, int(size))
        elif kind == "l":
            target, _, name = rest.partition(" ")
            if not (STORED_RE.match(name) or SPLIT_LINK_RE.match(name)):  # the store's own
                names[posixpath.basename(target).removesuffix(".gguf")].append(name)
    held: dict[str, list[str]] = defaultdict(list)  # model -> its files' inodes
    for line in manifests:
        where, _, entry = line.partition(":")
        split = entry.split(" ", 1)[0]
        if split in files:
            held[posixpath.basename(where)].append(files[split][0])
    in_splits = {inode for found in held.values() for inode in found}
    for sha, (inode, _) in files.items():
        if inode not in in_splits:
            held[sha] = [inode]
    holders: dict[str, int] = defaultdict(int)
    for found in held.values():
        for inode in set(found):
            holders[inode] += 1
    models = [
        ModelSpace(
            sha,
            sum(inodes[inode] for inode in set(found)),
            tuple(sorted(names[sha])),
            sum(inodes[inode] for inode in set(found) if holders[inode] == 1),
            len(found),
        )
        for sha, found in held.items()
    ]
    return tuple(sorted(models, key=lambda model: (-model.size, model.sha256))), sum(
        inodes.values()
    )
