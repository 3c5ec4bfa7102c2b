"""Checking a device's content store: each content against its name, each release against its
manifest.json, and the damage markers ``kzbuild run`` and ``kzbuild bench`` honour.

All hashing runs on the device (``sha256sum``, batched to the argv budget), so a check costs one
round trip per ~60 kB of paths however many files there are. Repairs never write into a
damaged file: a verified content is renamed over ``objects/<sha>`` and every release holding it
gets a new link to it (of the store's kind: a hard link, or a symlink on Android), made under a
temporary name and renamed over the old one.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kzbuild.device.base import RemoteResult
from kzbuild.device.modelsplit import check_links
from kzbuild.device.steps import Step
from kzbuild.device.store import (
    ARGV_BUDGET,
    HARD,
    NAME_HEX,
    SHELL_FUNCTIONS,
    SYMBOLIC,
    Layout,
    Remote,
    device_sha256,
    object_link,
    read_state,
    sections,
)
from kzbuild.model.artifact import MANIFEST, SHA256_RE, ArtifactFile, parse_files
from kzbuild.model.integrity import MISSING, Damage, DamageKind, StoreReport

MODEL_SUFFIX = ".gguf"
CHUNK_NAME_RE = re.compile(rf"^[0-9a-f]{{{NAME_HEX}}}$")
RELEASE_MARK = "--kz-release "  # cannot start a line of JSON
# $1 = the releases dir. Per release: a RELEASE_MARK line with its name, then its manifest.json.
MANIFESTS_SCRIPT = (
    'cd "$1" || exit 1; for r in *; do [ -d "$r" ] || continue; '
    'printf "\\n%s\\n" "--kz-release $r"; cat "$r/manifest.json" 2>/dev/null; done; true'
)
# $1 = objects, $2 = models, $3 = chunks. Their names, separated by "/" lines.
LISTING_SCRIPT = (
    'ls -1 "$1" || exit 1; echo /; ls -1 "$2" 2>/dev/null; echo /; ls -1 "$3" 2>/dev/null; true'
)
# $1 = the link kind (store.HARD or store.SYMBOLIC), then pairs of (object path or symlink target,
# release path): a link under a temporary name, renamed over the path.
RELINK_SCRIPT = (
    'k=$1; shift; while [ "$#" -gt 1 ]; do t="$2.kz-relink"; mkdir -p "$(dirname "$2")" && '
    f'rm -f "$t" && if [ "$k" = {HARD} ]; then ln "$1" "$t"; else ln -s "$1" "$t"; fi && '
    'mv -f "$t" "$2" || exit 1; shift 2; done'
)
# $1 = ROOT, then pairs (a release's file, the object it must be). Prints each file that is not
# that object's inode (another file, or none): [ -ef ] is the shell's own, and follows a symlink.
UNLINKED_SCRIPT = (
    'cd "$1" || exit 1; shift; while [ "$#" -gt 1 ]; do [ "$1" -ef "$2" ] || echo "$1"; '
    "shift 2; done"
)

# $1 = objects/, $2 = a scratch path prefix, then content names (none: nothing to do, and stdin is
# left to the steps that follow). Exit 0 when each of them hashes to
# its name (sha256sum prints them in order, so the sums must equal those lines byte for byte), 9
# when one does not or is missing.
OBJECTS_CHECK_SCRIPT = (
    'cd "$1" || exit 1; s=$2; shift 2; [ "$#" -gt 0 ] || exit 0; '
    'sha256sum "$@" > "$s.sums" 2>/dev/null; '
    'for a; do echo "$a  $a"; done > "$s.want" || exit 1; '
    'cmp -s "$s.sums" "$s.want"; rc=$?; rm -f "$s.sums" "$s.want"; [ "$rc" = 0 ] || exit 9'
)


# $1 = objects/, $2 = the result file, $3 = a token, $4 = a release dir, then content names. Unless
# the release dir exists (then the release is likely there whole: nothing to start), starts, in the
# background, sha256sum of those of the contents objects/ holds, and prints its pid and how many
# it hashes (none: "0 0", nothing started). When the sums are in, the job writes "ok TOKEN" to the
# result file if each content hashed to its name, else "bad TOKEN". It ignores SIGHUP and keeps no
# stream of the command open, so the command ends at once and the hashing goes on while the host
# sends the rest.
KEPT_HASH_SCRIPT = SHELL_FUNCTIONS + (
    '[ ! -d "$4" ] && cd "$1" || { echo "0 0"; exit 0; }; r=$2 k=$3; shift 4; set -f; c=$#; '
    'for a; do [ -f "$a" ] && set -- "$@" "$a"; done; shift "$c"; '
    '[ "$#" -gt 0 ] || { echo "0 0"; exit 0; }; '
    "( trap '' HUP; s=$(sha256sum \"$@\" 2>/dev/null); g=0; d=; for w in $s; do "
    'if [ -z "$d" ]; then d=$w; else [ "$d" = "$w" ] && g=$((g + 1)); d=; fi; done; '
    'v=bad; [ "$g" = "$#" ] && v=ok; kz_put "$v $k" > "$r" ) < /dev/null > /dev/null 2>&1 & '
    'echo "$! $#"'
)
# $1 = the result file, $2 = the token, $3 = the pid of KEPT_HASH_SCRIPT's job. Waits for the
# job's result (a sleep of 20 ms per look while it runs); exit 0 when it says ok, 9 otherwise (no
# result from a job that ended: its sums are not known).
KEPT_WAIT_SCRIPT = (
    "v=; t=; while :; do "
    'read -r v t 2>/dev/null < "$1"; [ "$t" = "$2" ] && break; '
    'if ! kill -0 "$3" 2>/dev/null; then read -r v t 2>/dev/null < "$1"; break; fi; '
    "sleep 0.02; done; "
    '[ "$t" = "$2" ] && [ "$v" = ok ] || exit 9'
)


@dataclass(frozen=True)
class KeptCheck:
    """A background sha256sum of stored contents (:func:`kept_hash_step`), started in one command
    and waited for in a later one (:meth:`wait_step`)."""

    layout: Layout
    token: str

    @property
    def result(self) -> str:
        return self.layout.join(".switch", ".kz-kept")

    def wait_step(self, started: RemoteResult) -> tuple[Step, int] | None:
        """The step that waits for the job ``started`` (its start step's result) and fails unless
        every content matched, with how many it hashes; None when no job was started."""
        fields = started.text().split()
        if not started.ok or len(fields) != 2 or not all(f.isdigit() for f in fields):
            return None
        pid, count = (int(field) for field in fields)
        if not count:
            return None
        step = Step(
            KEPT_WAIT_SCRIPT, (self.result, self.token, str(pid)), "checking stored contents"
        )
        return step, count


def kept_hash_step(
    layout: Layout, release: str, names: Sequence[str]
) -> tuple[Step, KeptCheck] | None:
    """The step that starts hashing those of ``names`` that objects/ holds, in the background on
    the device, unless releases/``release`` exists; None when the names would take more than half
    of a command's arguments."""
    if sum(len(name) + 3 for name in names) > ARGV_BUDGET // 2:
        return None
    kept = KeptCheck(layout, secrets.token_hex(8))
    step = Step(
        KEPT_HASH_SCRIPT,
        (layout.objects, kept.result, kept.token, layout.release(release), *names),
        "hashing stored contents",
    )
    return step, kept


@dataclass(frozen=True)
class Expected:
    """A device file that must hash to ``sha256``."""

    kind: DamageKind
    name: str
    path: str  # relative to the device root
    sha256: str


def manifest_files(text: str) -> tuple[ArtifactFile, ...] | None:
    """The files a deployed manifest.json lists; None when it is unreadable or malformed."""
    try:
        return parse_files(json.loads(text).get("files"))
    except (ValueError, AttributeError):
        return None


# every release's files as its manifest.json lists them (None: no readable manifest)
Manifests = Mapping[str, tuple[ArtifactFile, ...] | None]


def release_files(remote: Remote, layout: Layout) -> dict[str, tuple[ArtifactFile, ...] | None]:
    """Every release's files as its manifest.json lists them (None: no readable manifest), in one
    round trip."""
    step = manifests_step(layout)
    return parse_manifests(remote.run(step.argv, what=step.what))


def manifests_step(layout: Layout) -> Step:
    return Step(MANIFESTS_SCRIPT, (layout.releases,), "reading the release manifests")


def parse_manifests(result: RemoteResult) -> dict[str, tuple[ArtifactFile, ...] | None]:
    chunks: dict[str, list[str]] = {}
    lines: list[str] = []
    for line in result.text().split("\n"):
        if line.startswith(RELEASE_MARK):
            lines = chunks.setdefault(line.removeprefix(RELEASE_MARK), [])
        else:
            lines.append(line)
    return {name: manifest_files("\n".join(body)) for name, body in chunks.items()}


def unused_objects(manifests: Manifests, objects: Iterable[str]) -> list[str]:
    """The names among ``objects`` (objects/) that no release's manifest lists. On Android a
    release links its contents by symlink, which counts nothing on the object, so its manifest is
    what says what it holds; while a release has no readable manifest, what it holds is not known
    and none is unused (``kzbuild device verify`` names that release)."""
    if any(files is None for files in manifests.values()):
        return []
    used = {entry.sha256 for files in manifests.values() if files for entry in files}
    return [name for name in objects if name not in used]


def release_expectations(release: str, files: Iterable[ArtifactFile]) -> list[Expected]:
    return [
        Expected("release", release, f"releases/{release}/{entry.path}", entry.sha256)
        for entry in files
    ]


def check(remote: Remote, layout: Layout, expected: Sequence[Expected]) -> list[Damage]:
    """What of ``expected`` is missing or hashes to something else on the device (a chunk's name is
    the start of its sha256)."""
    found = device_sha256(remote, [layout.join(item.path) for item in expected])
    damage = []
    for item in expected:
        digest = found.get(layout.join(item.path), MISSING)
        if digest[: len(item.sha256)] != item.sha256:
            damage.append(Damage(item.kind, item.name, item.path, item.sha256, digest))
    return damage


def unlinked(remote: Remote, layout: Layout, expected: Sequence[Expected]) -> set[str]:
    """The paths of ``expected`` (release files) that are not their object's inode: only those
    need hashing, as a release's link reads what its object holds."""
    pairs = [path for item in expected for path in (item.path, f"objects/{item.sha256}")]
    results = remote.batched(
        ["sh", "-c", UNLINKED_SCRIPT, "kz", layout.root],
        pairs,
        group=2,
        what="checking the releases' links",
    )
    return {line for result in results for line in result.text().splitlines() if line}


def objects_check_step(layout: Layout, names: Sequence[str]) -> Step | None:
    """The step that hashes ``objects/NAME`` for each name and fails (exit 9) unless each matches;
    None when the names are more than one command's arguments hold (check them another way)."""
    scratch = layout.join("incoming", f".kz-check-{secrets.token_hex(4)}")
    if sum(len(name) + 3 for name in names) + len(scratch) > ARGV_BUDGET:
        return None
    return Step(OBJECTS_CHECK_SCRIPT, (layout.objects, scratch, *names), "checking stored contents")


def relink(
    remote: Remote,
    layout: Layout,
    files_by_release: Mapping[str, Iterable[ArtifactFile]],
    *,
    hard: bool,
) -> tuple[str, ...]:
    """Point each listed release file at its (verified) object again, by a hard link with
    ``hard``, else a symlink; returns the paths, relative to the root."""
    pairs: list[str] = []
    relinked: list[str] = []
    for release, files in sorted(files_by_release.items()):
        for entry in files:
            path = f"releases/{release}/{entry.path}"
            target = (
                layout.join("objects", entry.sha256)
                if hard
                else object_link(entry.path, entry.sha256)
            )
            pairs += [target, layout.join(path)]
            relinked.append(path)
    remote.batched(
        ["sh", "-c", RELINK_SCRIPT, "kz-relink", HARD if hard else SYMBOLIC],
        pairs,
        group=2,
        what="relinking repaired contents",
    )
    return tuple(relinked)


def update_markers(
    remote: Remote,
    layout: Layout,
    marked: frozenset[str],
    *,
    damaged: Iterable[str] = (),
    intact: Iterable[str] = (),
) -> None:
    """Mark ``damaged`` releases, unmark ``intact`` ones; ``marked`` is what the device has marked
    now
    (so nothing runs when nothing changes)."""
    add = [layout.damage_marker(name) for name in damaged if name not in marked]
    drop = [layout.damage_marker(name) for name in intact if name in marked]
    remote.batched(["touch"], add, what="marking damaged releases")
    remote.batched(["rm", "-f"], drop, what="clearing damage markers")


def verify_store(remote: Remote, layout: Layout) -> StoreReport:
    """Check every object against its name, every release against its manifest.json, every
    models/<sha256>.gguf (a model or a split) and every chunk against its name, and that each
    split model's links are its splits; mark damaged releases and unmark intact
    ones; remove damaged chunks (deploy sends a chunk the device lacks). Each content is hashed
    once: a release's file that is its object (a hard link to it, or a symlink) shares the
    object's verdict, and only the others are hashed themselves."""
    state = read_state(remote, layout)
    listing = (
        remote.script(
            LISTING_SCRIPT,
            [layout.objects, layout.models, layout.chunks],
            what="listing the content store",
        )
        .text()
        .split("\n")
    )
    object_names, model_names, chunk_names = sections(listing, 3, what="listing the content store")
    objects = [name for name in object_names if SHA256_RE.match(name)]
    split_models, splits, damage = check_links(remote, layout)
    models = [
        name
        for name in model_names
        if name.endswith(MODEL_SUFFIX)
        and SHA256_RE.match(name.removesuffix(MODEL_SUFFIX))
        and name.removesuffix(MODEL_SUFFIX) not in split_models  # a link to its first split
    ]
    chunks = [name for name in chunk_names if CHUNK_NAME_RE.match(name)]
    expected = [Expected("object", name, f"objects/{name}", name) for name in objects]
    expected += [Expected("chunk", name, f"chunks/{name}", name) for name in chunks]
    expected += [
        Expected("model", name, f"models/{name}", name.removesuffix(MODEL_SUFFIX))
        for name in models
    ]
    manifests = release_files(remote, layout)
    linked: list[Expected] = []
    for release, files in sorted(manifests.items()):
        if files is None:
            damage.append(
                Damage(
                    "release",
                    release,
                    f"releases/{release}/{MANIFEST}",
                    "a manifest listing the release's files",
                    "missing or unreadable",
                )
            )
        else:
            linked += release_expectations(release, files)
    if state.current is not None and state.current not in manifests:
        damage.append(
            Damage("release", state.current, "current", f"releases/{state.current}", MISSING)
        )
    # a release's file that is its object's inode is checked by hashing the object, once
    loose = unlinked(remote, layout, linked)
    expected += [item for item in linked if item.path in loose]
    damage += check(remote, layout, expected)
    objects_found = {entry.name: entry.found for entry in damage if entry.kind == "object"}
    damage += [
        Damage("release", item.name, item.path, item.sha256, objects_found[item.sha256])
        for item in linked
        if item.path not in loose and item.sha256 in objects_found
    ]
    remote.batched(
        ["rm", "-f"],
        [layout.join(entry.path) for entry in damage if entry.kind == "chunk"],
        what="removing damaged chunks",
    )
    damaged = {entry.name for entry in damage if entry.kind == "release"}
    update_markers(
        remote,
        layout,
        state.damaged,
        damaged=damaged,
        intact=(set(manifests) | state.damaged) - damaged,
    )
    return StoreReport(
        device=remote.address,
        root=layout.root,
        objects=len(objects),
        releases=len(manifests),
        models=len(split_models)
        + sum(name.removesuffix(MODEL_SUFFIX) not in splits for name in models),
        damage=tuple(damage),
        chunks=len(chunks),
    )
