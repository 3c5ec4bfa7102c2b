"""The device side of deploy: a content store under the device root, verified resumable uploads,
and symlinks switched with one rename.

Layout under the device root (ROOT)::

    objects/<sha256>              content store; a file enters only after sha256sum on the device
    matched
    chunks/, chunklists/          the chunks deploy builds objects from (kzbuild.device.chunkstore)
    signatures/                   what deltas against an object's chunks are cut from (the same)
    incoming/<name>               uploads in progress: a cut upload resumes from what arrived
    releases/<release>/           one per build: hard links into objects/ where the device
                                  allows them, else symlinks (.kz-links says which), plus
                                  manifest.json (which says what the release holds: prune and
                                  status count from it)
    releases/.staging-<release>-<random>/  a release being assembled; renamed into place once
    complete
    damaged/<release>             marker: that release failed verification (run and bench refuse it)
    current -> releases/<release>
    deploys.log                   one line per switch of current (time, action, release)
    models/<sha256>.gguf, models/<name> -> <sha256>.gguf
    .switch/                      new symlinks are made here, then renamed into place
    .switch/.kz-kept              the verdict of deploy's background sha256sum of the contents a
                                  release keeps (kzbuild.device.integrity.KeptCheck)
    .lock/owner                   the one writer's lock (kzbuild.device.devicelock)

Nothing is ever written through a link: every write goes to a fresh name (incoming/, a staging
dir, .switch/) and is renamed into place, so a content in objects/ and the releases linking it
change only by a rename that replaces a whole file.

Only commands Android's toybox has are used (sh, mkdir -p, ls -1 -ln, readlink, cat, stat -c, tar
-x, xargs, sha256sum, chmod, ln -s, mv -f, rm, find, dirname, head -n -c, tail -c, cut, sort,
comm, grep -F, sed -n), and the store needs no hard link: Android's SELinux policy forbids every
process ``adb shell`` starts to hard-link a file (AOSP system/sepolicy, public/shell.te), so there
releases are symlinks and models push does without. ``mv -T`` is
avoided (older toybox lacks it):
a new symlink is made in ``.switch/`` and moved *into* its directory, which is one rename(2)
that replaces the old symlink (mv does not follow a symlink it replaces).

Every device command is a round trip (a new ssh channel or ``adb shell``, and a shell on the
device), so related steps run as one ``sh -c`` with a constant script, and scripts that follow
each other run as one command (:mod:`kzbuild.device.steps`; the ``*_step`` functions here). The data
(paths, names) always goes in as positional arguments quoted by
``remote_command``; nothing from a manifest or a file name is pasted into a script.
"""

from __future__ import annotations

import logging
import posixpath
import re
import shlex
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from kzbuild.device.base import (
    NO_SPACE,
    RemoteResult,
    Transport,
    device_full,
)
from kzbuild.device.steps import Step
from kzbuild.errors import DeviceError

log = logging.getLogger(__name__)

NAME_HEX = (
    32  # a chunk's name: 128 bits of its sha256 (a collision only makes a file fail its check)
)

GNU_ESCAPE = re.compile(r"\\(.)")
ARGV_BUDGET = 60_000  # bytes of arguments per remote command (Android allows far more)
COMMAND_TIMEOUT = 120.0
VERIFY_TIMEOUT = 1800.0  # sha256sum of a multi-GB model on a phone takes a while

# the dirs of the store; models/ last: it may be a link to a bigger partition, which STATE_SCRIPT
# leaves as it is (the rest it replaces when they are not dirs)
STORE_DIRS = (
    "objects",
    "chunks",
    "chunklists",
    "signatures",
    "incoming",
    "releases",
    ".switch",
    "damaged",
    "models",
)
# Shell functions the scripts below share, builtins only (on the adb test device, as on Android,
# a process costs more than a round trip; mksh has no printf builtin, and its echo reads
# backslashes): kz_put prints its argument as it is, with a newline (mksh's print, else printf,
# which dash and bash have built in); kz_ls prints its arguments one a line, nothing for a glob
# that matched nothing (an ``ls -1`` of the current dir, without the process).
SHELL_FUNCTIONS = (
    'if [ -n "${KSH_VERSION-}" ]; then kz_put() { print -r -- "$1"; }; '
    'else kz_put() { printf "%s\\n" "$1"; }; fi; '
    'kz_ls() { { [ -e "$1" ] || [ -L "$1" ] || [ "$#" -gt 1 ]; } || return 0; '
    "IFS='\n'; kz_put \"$*\"; unset IFS; }; "
)
# how a release links its contents in objects/, found once per store (in LINK_KIND): hard links
# where the device allows them (cheap: no inode each, and $ORIGIN is the release's), else symlinks
# (Android forbids adb shell to hard-link)
LINK_KIND = ".kz-links"
HARD, SYMBOLIC = "hard", "symbolic"
# $1 = ROOT. Makes the layout, repairing what a person would have to: a store dir that is a
# symlink (incoming/ pointing out of the root would have chunks written there) or not a dir is
# replaced (models/ may be a link to a bigger partition: it is left as it is), and an entry
# of objects/ or chunks/ that is not a regular file (a directory, a symlink) is removed, so
# deploy sends its content again. Prints where the current link points on the first line (the
# release it is the same dir as, found by ``test -ef``; readlink only when it points at none),
# then the release names, a "/" line, the releases marked damaged, a "/" line and the store's link
# kind (tried with a hard link, and written to LINK_KIND, the first time). Only what is missing is
# made, and the listings are the shell's globs: every tool run is a process, which costs the most
# on a device.
STATE_SCRIPT = SHELL_FUNCTIONS + (
    '{ [ -d "$1" ] || mkdir -p "$1"; } && cd "$1" || exit 1; new=; '
    f"for d in {' '.join(STORE_DIRS[:-1])}; do "
    'if [ -L "$d" ] || { [ -e "$d" ] && [ ! -d "$d" ]; }; then rm -f "$d" || exit 1; fi; '
    '[ -d "$d" ] || new="$new $d"; done; [ -d models ] || new="$new models"; '
    'if [ -n "$new" ]; then mkdir -p $new || exit 1; fi; '
    "for f in objects/* chunks/*; do "
    'if [ -L "$f" ] || { [ -e "$f" ] && [ ! -f "$f" ]; }; then rm -rf "$f" || exit 1; fi; done; '
    "t=; if [ -L current ]; then for r in releases/*; do "
    'if [ current -ef "$r" ]; then t=$r; break; fi; done; '
    '[ -n "$t" ] || t=$(readlink current); fi; kz_put "$t"; '
    "cd releases && kz_ls * && echo / && cd ../damaged && kz_ls * && echo / && cd .. || exit 1; "
    f"k=; read -r k 2>/dev/null < {LINK_KIND}; case $k in {HARD}|{SYMBOLIC}) ;; *) "
    # the probe's names are this shell's own: device status reads the state without the lock
    'p="incoming/.kz-lp.$$"; : > "$p" || exit 1; '
    f'if ln "$p" "$p.2" 2>/dev/null; then k={HARD}; else k={SYMBOLIC}; fi; '
    f'rm -f "$p" "$p.2"; kz_put "$k" > {LINK_KIND} || exit 1 ;; esac; '
    'kz_put "$k"'
)
# $1 = a store dir, $2 = incoming, optionally $3 = another dir. Prints the store's names, a "/"
# line,
# then "size name" per partial upload (from one ls -ln); with $3, a "/" line and the first name in
# $3.
# A partial upload with other hard links is removed: appending to it would write through them.
# The shell's globs, not ls, list the store and look into an empty incoming/ and into $3: a
# process less each.
INVENTORY_SCRIPT = SHELL_FUNCTIONS + (
    'cd "$1" || exit 1; kz_ls *; echo /; other=$3; cd "$2" || exit 1; set -- *; '
    'if [ -e "$1" ] || [ -L "$1" ]; then ls -ln | while read -r p l u g s rest; do '
    'case $p in -*) ;; *) continue ;; esac; n=${rest##* }; if [ "$l" -gt 1 ]; then rm -f "$n"; '
    'else echo "$s $n"; fi; done; fi; '
    'if [ -n "$other" ]; then echo /; for f in "$other"/*; do '
    '{ [ -e "$f" ] || [ -L "$f" ]; } && echo "${f##*/}"; break; done; fi; true'
)
# $1 = ROOT, $2 = the staging dir, $3 = the release dir, which must not exist (both relative to
# ROOT), then the contents (names in objects/) that must be executable; stdin: a tar of the
# staging dir: its dirs, its links into objects/ and, last, its manifest.json (no manifest:
# the stream was cut, so no release). A content stored before without an exec bit gains it (the
# shell tests each; chmod runs only for those that lack it).
RELEASE_SCRIPT = (
    'cd "$1" || exit 1; staging=$2 release=$3; shift 3; set -f; '
    '{ [ ! -e "$staging" ] || rm -rf "$staging"; } && tar -x -f - '
    '&& [ -f "$staging/manifest.json" ] || exit 1; '
    'x=; for o; do [ -x "objects/$o" ] || x="$x objects/$o"; done; '
    'if [ -n "$x" ]; then chmod 755 $x || exit 1; fi; '
    '[ ! -e "$release" ] && mv "$staging" "$release"'
)
# $1 = ROOT, then releases to remove (with their damage markers); what cut deploys left behind
# goes too.
PRUNE_SCRIPT = (
    'cd "$1" || exit 1; shift; for r in "$@"; do rm -rf "releases/$r" "damaged/$r" || exit 1; '
    "done; "
    "rm -rf releases/.staging-* incoming/manifest.json-* incoming/.kz-* "
    # the last three: what older kzbuilds left
    "incoming/.lists-* incoming/.plan-* incoming/.store-*"
)
# $1 = ROOT. Drops the chunk lists and signatures of objects that are gone, then the chunks no list
# names.
CHUNK_GC_SCRIPT = (
    'cd "$1" || exit 1; for l in chunklists/* signatures/*; do [ -f "$l" ] '
    '&& [ ! -e "objects/${l##*/}" ] && rm -f "$l"; done; '
    "cat chunklists/* 2>/dev/null | cut -d ' ' -f 1 | LC_ALL=C sort -u > incoming/.keep && ls -1 "
    "chunks | LC_ALL=C sort > incoming/.have "
    "&& comm -23 incoming/.have incoming/.keep | (cd chunks && xargs rm -f) && rm -f "
    "incoming/.keep incoming/.have"
)
# $1 = ROOT. Prints where current points, then "damaged" when that release carries a damage marker.
CURRENT_SCRIPT = (
    't=$(readlink "$1/current") || exit 1; printf "%s\\n" "$t"; if [ -e "$1/damaged/${t##*/}" ]; '
    "then echo damaged; fi; true"
)
DAMAGED = "damaged"  # CURRENT_SCRIPT's word for a marked release
# $1 = the deploy log; prints it, or nothing when there is none yet.
HISTORY_SCRIPT = 'cat "$1" 2>/dev/null; true'
# $1 = staged link, $2 = target, $3 = the link's dir, $4 = the link; then optionally
# $5 = a log file and $6 = a line to append to it (a HistoryEntry line: no backslash, so echo
# writes it as it is). Prints where the link now points: the target when the link reaches the same
# file as it (``test -ef``, no process), else what readlink says.
SWITCH_SCRIPT = SHELL_FUNCTIONS + (
    '{ { [ ! -e "$1" ] && [ ! -L "$1" ]; } || rm -f "$1"; } && ln -s "$2" "$1" && mv -f "$1" "$3" '
    '|| exit 1; if [ -n "$5" ]; then echo "$6" >> "$5" || exit 1; fi; '
    "case $2 in /*) p=$2 ;; *) p=$3$2 ;; esac; "
    'if [ -e "$p" ] && [ "$4" -ef "$p" ]; then kz_put "$2"; else readlink "$4"; fi'
)


@dataclass(frozen=True)
class TransferProgress:
    label: str  # the file being sent
    done: int  # bytes sent so far by this operation
    total: int  # bytes this operation will send


ProgressCallback = Callable[[TransferProgress], None]


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
    def chunks(self) -> str:
        return self.join("chunks")

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
    def lock(self) -> str:
        return self.join(".lock")

    @property
    def history(self) -> str:
        return self.join("deploys.log")

    @property
    def damaged(self) -> str:
        return self.join("damaged")

    def damage_marker(self, release: str) -> str:
        return posixpath.join(self.damaged, release)

    def release(self, name: str) -> str:
        return posixpath.join(self.releases, name)


class Remote:
    """Runs commands on a device for deploy; a failure becomes a DeviceError naming the device."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    @property
    def address(self) -> str:
        return self.transport.address

    def run(
        self,
        argv: Sequence[str],
        *,
        what: str,
        check: bool = True,
        timeout: float = COMMAND_TIMEOUT,
    ) -> RemoteResult:
        result = self.transport.run(argv, timeout=timeout)
        if check and not result.ok:
            raise self.error(argv, result, what=what)
        return result

    def error(self, argv: Sequence[str], result: RemoteResult, *, what: str) -> DeviceError:
        """The DeviceError for a failed command; a full disk is named as such."""
        stderr = result.stderr.decode(errors="replace").strip()
        detail = f"{what} failed (exit {result.returncode}): {shlex.join(argv)}" + (
            f"\n{stderr}" if stderr else ""
        )
        if NO_SPACE in stderr:
            return device_full(self.address, detail)
        return DeviceError(f"{self.address}: {detail}")

    def checked(self, steps: Sequence[Step], results: Sequence[RemoteResult]) -> list[RemoteResult]:
        """``results`` of :func:`~kzbuild.device.steps.run_steps`, or the error of the step that
        failed."""
        for step, result in zip(steps, results, strict=False):  # results stop at the first failure
            if not result.ok:
                raise self.error(step.argv, result, what=step.what)
        return list(results)

    def script(
        self,
        script: str,
        args: Sequence[str],
        *,
        what: str,
        check: bool = True,
        timeout: float = COMMAND_TIMEOUT,
    ) -> RemoteResult:
        return self.run(
            Step(script, tuple(args), what).argv, what=what, check=check, timeout=timeout
        )

    def batched(
        self,
        command: Sequence[str],
        args: Sequence[str],
        *,
        what: str,
        group: int = 1,
        check: bool = True,
        timeout: float = COMMAND_TIMEOUT,
    ) -> list[RemoteResult]:
        """Run ``command + args`` in as few calls as the argv budget allows; ``group`` args stay
        together."""
        return [
            self.run([*command, *batch], what=what, check=check, timeout=timeout)
            for batch in batches(args, group)
        ]

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


def object_link(path: str, sha256: str) -> str:
    """What ``releases/<release>/<path>`` points at where it is a symlink: ``objects/<sha256>``,
    relative, so that a release keeps its links when it is renamed from its staging dir or the
    root moves."""
    return "../" * (path.count("/") + 2) + f"objects/{sha256}"


# --- releases and their history ---
@dataclass(frozen=True)
class StoreState:
    current: str | None  # release name
    releases: frozenset[str]
    damaged: frozenset[str]  # releases with a damage marker
    hard_links: bool = False  # whether releases hard-link their contents (else symlinks)


@dataclass(frozen=True)
class HistoryEntry:
    time: str
    action: str  # deploy | rollback
    release: str

    def line(self) -> str:
        return f"{self.time}\t{self.action}\t{self.release}"


def read_state(remote: Remote, layout: Layout) -> StoreState:
    """Create the layout if needed; where current points and which releases exist (one round
    trip)."""
    step = state_step(layout)
    return parse_state(remote.run(step.argv, what=step.what))


def state_step(layout: Layout) -> Step:
    return Step(STATE_SCRIPT, (layout.root,), "reading the device state")


def sections(lines: list[str], count: int, *, what: str) -> list[list[str]]:
    """A device script's listing cut at its "/" lines (no file name is "/") into ``count`` parts;
    fewer "/" lines than that means the answer was cut short, which is an error, not a listing."""
    parts: list[list[str]] = [[]]
    for line in lines:
        if line == "/" and len(parts) < count:
            parts.append([])
        else:
            parts[-1].append(line)
    if len(parts) < count:
        raise DeviceError(
            f"{what}: the device's answer was cut short (it holds {len(parts) - 1} of {count - 1} "
            "'/' lines)"
        )
    return parts


def parse_state(result: RemoteResult) -> StoreState:
    lines = result.text().splitlines()
    link = lines[0].rstrip("/") if lines else ""
    releases, marked, kind = sections(lines[1:], 3, what="reading the device state")
    return StoreState(
        posixpath.basename(link) or None,
        frozenset(releases),
        frozenset(marked),
        hard_links=kind == [HARD],
    )


def history_step(layout: Layout) -> Step:
    return Step(HISTORY_SCRIPT, (layout.history,), "reading the deploy log")


def parse_history(result: RemoteResult) -> list[HistoryEntry]:
    """The deploy log's entries; a damaged line is left out (see :func:`damaged_history_lines`)."""
    return [HistoryEntry(*parts) for parts in _history_fields(result) if _is_entry(parts)]


def damaged_history_lines(result: RemoteResult) -> list[int]:
    """The numbers of the deploy log's lines that are not ``time<TAB>action<TAB>release``."""
    fields = enumerate(_history_fields(result), 1)
    return [number for number, parts in fields if not _is_entry(parts)]


def _history_fields(result: RemoteResult) -> list[list[str]]:
    return [line.split("\t") for line in result.text().splitlines()]


def _is_entry(parts: list[str]) -> bool:
    if len(parts) != 3 or parts[1] not in ("deploy", "rollback"):
        return False
    return bool(parts[2]) and parts[2].isprintable()


def by_recency(state: StoreState, history: Sequence[HistoryEntry]) -> list[str]:
    """Releases, most recently switched to first; those the log never saw come last."""
    order: list[str] = []
    for entry in reversed(history):
        if entry.release in state.releases and entry.release not in order:
            order.append(entry.release)
    return order + sorted(state.releases - set(order))


def pruned_releases(state: StoreState, recency: Sequence[str], keep: int) -> list[str]:
    """The releases ``--keep keep`` removes: all but the ``keep`` most recent (``recency``, from
    :func:`by_recency`) and the current one."""
    kept = set(recency[:keep]) | ({state.current} if state.current else set())
    return [name for name in recency if name not in kept]


def switch_step(layout: Layout, release: str, action: str) -> Step:
    """The step that points current at releases/<release> and logs it (see :func:`check_switch`)."""
    entry = HistoryEntry(datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), action, release)
    return point_step(
        layout, layout.current, posixpath.join("releases", release), log_line=entry.line()
    )


def point(
    remote: Remote, layout: Layout, link: str, target: str, *, log_line: str | None = None
) -> None:
    """Make the symlink ``link`` point at ``target`` with one rename; append ``log_line`` to the
    deploy log."""
    step = point_step(layout, link, target, log_line=log_line)
    check_switch(remote, link, step, remote.run(step.argv, what=step.what))


def point_step(layout: Layout, link: str, target: str, *, log_line: str | None = None) -> Step:
    staged = posixpath.join(layout.switch, posixpath.basename(link))
    args = [staged, target, posixpath.dirname(link) + "/", link]
    if log_line is not None:
        args += [layout.history, log_line]
    return Step(SWITCH_SCRIPT, tuple(args), f"switching {link}")


def check_switch(remote: Remote, link: str, step: Step, result: RemoteResult) -> None:
    """That the switch ran and ``link`` now points at the step's target."""
    remote.checked([step], [result])
    target = step.args[1]
    now = result.text().strip()
    if now != target:
        raise DeviceError(
            f"{remote.address}: {link} points at {now or 'nothing'} after the switch, not {target}"
        )


# --- uploads: resume, verify on the device, then rename into the store ---
@dataclass(frozen=True)
class Upload:
    local: str  # the file's path (a string: a Path each costs more than its read, for thousands)
    sha256: str
    size: int
    mode: int
    name: str  # file name in incoming/ and in the store
    label: str  # shown in progress


@dataclass(frozen=True)
class Inventory:
    stored: frozenset[str]  # names in the store dir
    partial: dict[str, int]  # name -> bytes already in incoming/
    other_empty: bool = True  # whether the other dir asked about is empty


@dataclass(frozen=True)
class SendStats:
    bytes_sent: int = 0
    bytes_resumed: int = 0


def inventory(remote: Remote, layout: Layout, store_dir: str, other: str = "") -> Inventory:
    """What ``store_dir`` holds, what a cut upload left in incoming/, and whether ``other`` is
    empty."""
    step = inventory_step(layout, store_dir, other)
    return parse_inventory(remote.run(step.argv, what=step.what), other)


def inventory_step(layout: Layout, store_dir: str, other: str = "") -> Step:
    return Step(INVENTORY_SCRIPT, (store_dir, layout.incoming, other), "listing the content store")


def parse_inventory(result: RemoteResult, other: str = "") -> Inventory:
    stored, partial, *rest = sections(
        result.text().splitlines(), 3 if other else 2, what="listing the content store"
    )
    return Inventory(frozenset(stored), sizes_of(partial), not any(rest[0]) if rest else True)


def sizes_of(lines: list[str]) -> dict[str, int]:
    """``SIZE NAME`` lines (a ``wc -c``-like listing) as name -> bytes."""
    sizes = {}
    for line in lines:
        size, _, name = line.partition(" ")
        if size.isdigit():
            sizes[name] = int(size)
    return sizes


def mismatch_error(remote: Remote, count: int, example: Upload, found: str) -> DeviceError:
    """The error for uploads whose sha256 on the device did not match (they were removed)."""
    return DeviceError(
        f"{remote.address}: sha256 mismatch on the device for {count} file(s), e.g. "
        f"{example.label}: "
        f"expected {example.sha256}, got {found}; the corrupt uploads were removed",
        hint=f"if {example.local} changed after the manifest was written, rebuild; otherwise rerun",
    )


def device_sha256(remote: Remote, paths: Sequence[str]) -> dict[str, str]:
    """sha256 of each device path as the device computes it, in as few calls as the argv budget
    allows; a path that is missing or unreadable is absent from the result."""
    found: dict[str, str] = {}
    for result in remote.batched(
        ["sha256sum"],
        paths,
        what="checking sha256 on the device",
        check=False,
        timeout=VERIFY_TIMEOUT,
    ):
        found.update(parse_sha256sum(result.text().split("\n")))
    return found


def parse_sha256sum(lines: Iterable[str]) -> dict[str, str]:
    """``sha256sum`` output: the digest by file name (a line without a name is skipped)."""
    found: dict[str, str] = {}
    for line in lines:
        if line.startswith("\\"):  # GNU sha256sum escapes a name holding a backslash or newline
            line = GNU_ESCAPE.sub(lambda match: "\n" if match[1] == "n" else match[1], line[1:])
        digest, _, path = line.partition("  ")
        if path:
            found[path] = digest
    return found


# $1 = the device root. Makes a file there (before the first deploy: in its parent), a symlink to
# it and its exec bit, and removes both: exit 0 when all worked, 1 when the symlink was refused, 3
# when the file cannot be executable (a noexec mount), 2 when no file can be made there.
STORE_PROBE_SCRIPT = (
    'd=$1; [ -d "$d" ] || d=${d%/*}; t="$d/.kz-probe.$$"; : > "$t" || exit 2; s=0; '
    'ln -s "${t##*/}" "$t.l" 2>/dev/null || s=1; '
    '[ "$s" = 1 ] || { chmod 755 "$t" && [ -x "$t" ]; } || s=3; rm -f "$t" "$t.l"; exit "$s"'
)
STORE_PROBLEMS = {
    1: "it does not allow symlinks there",
    3: "files there cannot be executable (a noexec mount)",
}


def store_problem(transport: Transport, root: str) -> str | None:
    """Why kzbuild's store cannot work under ``root`` on the device (``current`` is a symlink, and
    on Android so are a release's files, which must run), or None: it can, or nothing can be
    written there to tell."""
    result = transport.run(["sh", "-c", STORE_PROBE_SCRIPT, "kz-store-probe", root])
    return STORE_PROBLEMS.get(result.returncode)
