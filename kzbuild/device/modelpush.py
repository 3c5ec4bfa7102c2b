"""``models push``'s transfer: a model travels as the file itself, checked on the device while it
arrives, or, when the device holds much of it already, in pieces cut at its tensors.

Layout added under the device root (see :mod:`kzbuild.device.store` for the rest)::

    models/.pieces/<sha256>     the pieces of models/<sha256>.gguf in order, one "sha256 size" line
                                each: what a later push may copy out of that file
    incoming/.kzm-<key>/        one model on its way (<key>: its size and first piece): ``part``
                                (the model so far), ``done`` (the lines of its checked pieces, in
                                order), ``in`` (a direct push's file while adb writes it: ``part``
                                is a second name of it, or a copy once a cut push's ``in`` went),
                                ``follower`` (the token of the command
                                that checks a direct push) and pieces named by their sha256

Pieces (:mod:`kzbuild.device.ggufcut`): every metadata entry and every tensor starts a piece,
so a quant variant that changes one tensor leaves every other piece as it was; a file that is
not a GGUF this reader knows is cut every :data:`LARGEST` bytes.

**Direct push** (the device holds less than 1/:data:`REUSE_SHARE` of the model, and no checked
part of it; before the file was read, none of :data:`SAMPLES` pieces spread over it): the file
itself goes in one transfer (one ``adb push``, no copy staged on the host)
to ``in``, and one device command, started with it, checks it as it grows: it links ``in`` as
``part`` as soon as it appears (adbd removes a file whose transfer was cut; the second name
keeps what arrived; where the link is refused, as Android refuses it to adb shell, the command
holds ``in`` open and, once adbd removed it, copies what arrived out of it into ``part``), then
checks each *block* (pieces in a row, :data:`BLOCK` bytes or more)
once it has arrived, ``dd | sha256sum`` of its range (at the lowest priority: the transfer goes
first, the checks catch up after it on a busy device), and appends its pieces to ``done``. The
last block, at least 1/:data:`TAIL_SHARE` of the model, is hashed straight from the file once it
is complete (``sha256sum`` reading from the block's offset to the end: no pipe, about half the
CPU of a piped range), beside the blocks still being checked. Nothing is written twice on the
device. With its digests cached the host reads nothing; otherwise it hashes the file while it
travels and feeds each block's sha256 to the command as soon as it has it.

**Pieces** (a variant of a stored model, or a push resumed): one pass over the file reads each
piece, hashes it and stages the pieces the device lacks into a memory dir, a batch of about
:data:`BATCH` bytes at a time (or of :data:`PLANNED` bytes of the model, most of them copied on
the device, so that the device copies while the host reads on). Over adb a batch is one ``adb
push``, and while the next batch is pushed the device checks the previous one: for each piece in
order it checks the piece that arrived with ``sha256sum`` and appends it to ``part``, or appends
it to ``part`` out of a model it holds (``dd``, which seeks) and hashes it there (from its offset
to the end, no pipe); a piece that does not match stops the batch.

The last command renames ``part`` into the store. Nothing is hashed twice on either side.

Trust: every byte of a stored model was checked on the device as part of its piece or block,
against the sha256 the host computed from the same read that gave the model's sha256. The device
does not hash the whole file again: the concatenation of checked pieces is the file the host
read.

A cut push resumes: ``part`` stays (a direct push's under its second name, or copied), with the
pieces that arrived whole after its checked ones: the next push checks those where they lie, cuts
the part after the last that matches, and sends only the rest, in pieces. A push run again
while a cut push's checker still copies its file into ``part`` waits for that copy (the
checker's pid is in the work dir; the wait ends after :data:`STALLED_WAITS` looks that find the
copy no bigger). A direct push cut before the device linked or opened its file (the first tenth
of a second or so), or whose checker was killed with it (not a cable or an adb client: the
checker ignores the SIGHUP adbd sends when its connection goes), starts over.

Host cache: the sha256, pieces and blocks of a model file are kept in the cache dir by the file's
device, inode, size, mtime and ctime (as git's index keeps a file's stat data), so pushing the
same file again reads it only to send what the device lacks. A file rewritten in place with the
same size and times (ctime cannot be set back by a program; a clock set back or a write within
the timestamp's grain can) would be sent with its old digests; like git, an entry whose file was
modified within :data:`RACY_SECONDS` of being hashed is not trusted, and the device's check of
every byte catches the rest: the push fails, the entry is dropped, and the push runs again from
a fresh read.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import logging
import os
import posixpath
import queue
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from kzbuild.adapters.files import TextCache
from kzbuild.device.base import ByteSource, FilePush, Member, RemoteResult, Transport
from kzbuild.device.devicelock import device_lock, pid_alive
from kzbuild.device.ggufcut import GgufLayoutError, boundaries, spans
from kzbuild.device.modelsplit import SplitModel, check_split_name, holds_splits, split_model
from kzbuild.device.steps import Step
from kzbuild.device.store import (
    VERIFY_TIMEOUT,
    Layout,
    ProgressCallback,
    Remote,
    TransferProgress,
    check_switch,
    point_step,
    sections,
    sizes_of,
    state_step,
)
from kzbuild.errors import ConfigError, DeviceError, KzError
from kzbuild.model.artifact import SHA256_RE
from kzbuild.model.deploy import ModelPushResult
from kzbuild.model.device import Device

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"

SMALL = 1 << 20  # spans below this are merged with their neighbours
LARGEST = 16 << 20  # no piece is bigger (a cut push resends at most one piece per batch in flight)
BATCH = 64 << 20  # bytes staged and pushed at a time (two batches are in memory at most)
PLANNED = 4 * BATCH  # ... or bytes a batch's check copies on the device (checked meanwhile)
BLOCK = 64 << 20  # a direct push checks pieces in runs of this many bytes (a pipeline each)
TAIL_SHARE = 2  # ... and hashes its last 1/TAIL_SHARE straight from the file once it is there
REUSE_SHARE = 8  # the file itself goes unless the device holds 1/REUSE_SHARE of it or more
SAMPLES = 4  # pieces hashed to guess that share before the file was read
# bump when the cutting, the blocks or the digests change: cached digests of another kind are
# not used
PLAN_VERSION = 3
RACY_SECONDS = 2.0
CACHE_LIMIT = 200
PIECES_DIR = ".pieces"
WORK_PREFIX = ".kzm-"
# pieces are staged in memory when it can be written (else in the temp dir), each batch in a dir
# named by this prefix and kzbuild's pid, so a killed kzbuild's dirs can be told and removed
MEMORY_STAGE = Path("/dev/shm")
STAGE_PREFIX = "kz-stage-"
ARRIVING = "in"  # a direct push's file while it arrives (the device links it as part)
POLL = "0.05"  # seconds between the direct push checker's looks at the arriving file
# the checks of blocks that arrived yield to the transfer (a busy device catches up after it)
LOWER = "nice -n 19 "
STALLED_POLLS = 1200  # 2 minutes at least without a new byte: the checker gives up
STALLED_WAITS = 50  # 5 s at least without a byte copied: a push stops waiting for the checker

# $1 = ROOT, $2 = the work dir's name in incoming/. Stops a direct push's checker and waits while
# it lives (it may be copying a cut push's file into part: up to STALLED_WAITS looks in a row
# that find that copy no bigger), keeps what the push's file holds as the part (adb may not have
# removed it); prints "size name" of every stored model and "0 name" of each split model's
# first-split link (a symlink), "/", then each stored model's piece list after a "= SHA" line,
# "/", "size name" of what the work dir holds, "/", and the pieces already checked into its part
# (its "done").
PROLOGUE_SCRIPT = (
    'cd "$1" || exit 1; mkdir -p "models/.pieces" "incoming/$2" || exit 1; '
    "ls -ln models | while read -r p l u g s rest; do case $p in -*) ;; *) continue ;; esac; "
    'n=${rest##* }; case $n in *.gguf) echo "$s $n" ;; esac; done; '
    'for f in models/*-00001-of-*.gguf; do [ -L "$f" ] && [ -e "$f" ] && echo "0 ${f#models/}"; '
    "done; echo /; "
    'for f in models/.pieces/*; do [ -f "$f" ] && [ -f "models/${f##*/}.gguf" ] || continue; '
    'echo "= ${f##*/}"; cat "$f"; done; echo /; '
    'cd "incoming/$2" || exit 1; rm -f follower; w=0 was=-1; '
    'while { read -r c < checker; } 2>/dev/null && [ -n "${c##*[!0-9]*}" ] '
    '&& kill -0 "$c" 2>/dev/null; do '
    'z=$(stat -c %s part.kz 2>/dev/null) || z=0; if [ "$z" = "$was" ]; then w=$((w + 1)); '
    f'[ "$w" -lt {STALLED_WAITS} ] || break; else w=0 was=$z; fi; sleep 0.1; done; '
    "if [ -e checker ] || [ -e part.kz ]; then rm -f checker part.kz; fi; "
    f"if [ -e {ARRIVING} ]; then "
    f"if [ -e part ]; then rm -f {ARRIVING}; else mv -f {ARRIVING} part; fi || exit 1; fi; "
    "ls -ln | while read -r p l u g s rest; do "
    'case $p in -*) echo "$s ${rest##* }" ;; esac; done; echo /; cat done 2>/dev/null; true'
)
# $1 = the work dir, $2 = a plan in it, $3 = the models dir. Each plan line: "p SHA SIZE" (the
# piece arrived as the file SHA, its sha256) or "c SHA SIZE FROM SKIP AT" (copy the SIZE bytes
# at byte SKIP of FROM, a model SHA or "part" itself, to byte AT, the end, of the part). Each
# piece is checked against its name with sha256sum and appended to part (a copy is appended
# first, then hashed straight from the part: the range from AT to its end); its line goes to
# done. A piece that does not match is removed (a copy: cut off the part
# again) and named on a "bad SHA" line (exit 3); the pieces after it are not appended. A plan of
# arrived pieces only is checked with one sha256sum and appended with one cat (a process per
# piece costs more than hashing it on a busy device).
CHECK_SCRIPT = (
    'cd "$1" || exit 1; if ! grep -q "^c " "$2"; then cut -d " " -f 2 "$2" > "$2.n" '
    '&& xargs sha256sum < "$2.n" > "$2.s" || exit 1; '
    'while read -r h d; do [ "$h" = "$d" ] || { rm -f "$d"; echo "bad $d"; exit 3; }; '
    'done < "$2.s"; xargs cat < "$2.n" >> part && cut -d " " -f 2,3 "$2" >> done '
    '&& xargs rm -f < "$2.n" && rm -f "$2" "$2.n" "$2.s"; exit; fi; '
    "while read -r op d s src skip at; do "
    'if [ "$op" = c ]; then if [ "$src" = part ]; then f=part; else f="$3/$src.gguf"; fi; '
    'dd if="$f" bs=65536 skip="$skip" count="$s" iflag=skip_bytes,count_bytes 2>/dev/null '
    ">> part || exit 1; "
    'h=$({ dd bs=1 skip="$at" count=0 2>/dev/null; sha256sum; } < part) || exit 1; '
    'if [ "${h%% *}" != "$d" ]; then truncate -s "$at" part; echo "bad $d"; exit 3; fi; '
    'else h=$(sha256sum < "$d") || exit 1; '
    'if [ "${h%% *}" != "$d" ]; then rm -f "$d"; echo "bad $d"; exit 3; fi; '
    'cat "$d" >> part && rm -f "$d" || exit 1; fi; echo "$d $s" >> done || exit 1; '
    'done < "$2" && rm -f "$2"'
)


def _range_sum(prefix: str = "") -> str:
    """sh: ``range_sum AT SIZE`` sets $h to the sha256 of those bytes of the file $src (one pipe:
    sha256sum reads no range of a file by itself); ``prefix`` goes before each of its commands."""
    return (
        f'range_sum() {{ h=$({prefix}dd if="$src" bs=65536 skip="$1" count="$2" '
        f"iflag=skip_bytes,count_bytes 2>/dev/null | {prefix}sha256sum) || exit 1; "
        "h=${h%% *}; }; "
    )


# $1 = the work dir, $2 = bytes, $3 = lines: how much of part and done hold this model's checked
# pieces. stdin: "SHA SIZE" of the pieces that follow in the model. Cuts done to its first $3
# lines, checks each of those pieces that part holds whole, where it lies, appends those that
# match to done up to the first that does not, cuts part after them and prints its size.
RESUME_SCRIPT = (
    _range_sum() + 'cd "$1" || exit 1; src=part; head -n "$3" done > done.kz 2>/dev/null; '
    "mv -f done.kz done || exit 1; at=$2; n=$(stat -c %s part 2>/dev/null) || n=0; "
    'while read -r d s; do [ $((at + s)) -le "$n" ] || break; range_sum "$at" "$s"; '
    '[ "$h" = "$d" ] || break; echo "$d $s" >> done || exit 1; at=$((at + s)); done; '
    'truncate -s "$at" part && echo "$at"'
)
# $1 = the work dir, $2 = the model's size, $3 = where its last block starts, $4 = this checker's
# token. stdin: per block "b SHA SIZE N" (the last: "t ..."), then its N pieces' "SHA SIZE"
# lines. Links the arriving file as part (so what arrived stays when adbd removes a file whose
# push was cut), checks each block once the file holds it and appends its pieces to done. A device
# that refuses the link (Android's SELinux for adb shell) has the arriving file held open on fd 4
# and read as it is; once adbd removed it (a cut push: exit 4), what arrived is copied out of fd 4
# into part on the way out, unless a new push is arriving. SIGHUP (adbd's word that the host's
# connection went) is ignored, so that copy is made. The work dir's file "checker" holds this
# shell's own pid (from /proc/self/stat: in a step's subshell $$ is the parent's, which adbd's
# SIGHUP ends) until it ends: the next push's prologue waits for that copy. The last block is
# hashed from its start to the end of the file by a job of its own, started as soon as the file is
# complete, beside the blocks still being checked. Exits 3 ("bad SHA") for a block that does not
# match, 4 when the file stopped growing short of a block (or went), 5 when follower no longer
# holds the token (the host gave up on the push, or a later push started). Waits without a
# process where the shell can (mksh's read -t on a FIFO it holds).
FOLLOW_SCRIPT = (
    _range_sum(LOWER) + 'cd "$1" || exit 1; total=$2 last_at=$3 tok=$4 job= src=part; '
    "{ read -r me rest < /proc/self/stat; } 2>/dev/null || me=$$; "
    'echo "$tok" > follower && echo "$me" > checker || exit 1; rm -f part done tail.sum tick; '
    'if [ -n "$KSH_VERSION" ] && mkfifo tick && exec 3<>tick; then '
    'pause() { read -t "$1" -u3 x; }; else pause() { sleep "$1"; }; fi; '
    'held() { read -r t 2>/dev/null < follower && [ "$t" = "$tok" ]; }; '
    f'size() {{ if [ "$src" = {ARRIVING} ]; then [ -e {ARRIVING} ] || exit 4; '
    f"elif [ ! -e part ] && [ -e {ARRIVING} ]; then "
    f"ln {ARRIVING} part 2>link.err || {{ read -r e < link.err; "
    f'case $e in *"Permission denied") src={ARRIVING}; exec 4< {ARRIVING} ;; esac; }}; fi; '
    'z=$(stat -c %s "$src" 2>/dev/null) || z=0; }; '
    'last() { [ -z "$job" ] && [ "$z" -ge "$total" ] || return 0; '
    '{ dd bs=1 skip="$last_at" count=0 2>/dev/null; sha256sum; } < "$src" > tail.sum & job=$!; }; '
    "upto() { was=-1 idle=0; while :; do held || exit 5; size; last; "
    '[ "$z" -ge "$1" ] && return 0; if [ "$z" = "$was" ]; then idle=$((idle + 1)); '
    f'[ "$idle" -lt {STALLED_POLLS} ] || exit 4; else idle=0 was=$z; fi; pause {POLL}; done; }}; '
    'trap \'\' HUP; trap \'[ -n "$job" ] && kill "$job" 2>/dev/null; '
    f'[ "$src" != {ARRIVING} ] || [ -e {ARRIVING} ] || [ -e part ] || '
    f"{{ cat <&4 > part.kz && [ ! -e {ARRIVING} ] && [ ! -e part ] && mv -f part.kz part; }}; "
    "rm -f part.kz checker' EXIT; at=0; "
    "while read -r op d s n; do "
    'if [ "$op" = t ]; then upto "$total"; wait "$job" || exit 1; '
    "read -r h rest < tail.sum || exit 1; "
    'else upto $((at + s)); range_sum "$at" "$s"; size; last; fi; '
    '[ "$h" = "$d" ] || { echo "bad $d"; exit 3; }; '
    'while [ "$n" -gt 0 ]; do read -r p || exit 1; echo "$p" >> done || exit 1; n=$((n - 1)); '
    'done; [ "$op" = t ] && { rm -f follower tail.sum tick; exit 0; }; at=$((at + s)); done; '
    "exit 1"
)
# $1 = the work dir, $2 = the model's size, $3 = the models dir, $4 = SHA256. Stores the part (a
# direct push's file, where the device refused to link it as part) as models/SHA256.gguf and its
# pieces' list, if it has the size; removes the work dir.
STORE_SCRIPT = (
    f'cd "$1" || exit 1; [ -e part ] || mv -f {ARRIVING} part || exit 1; '
    '[ "$(stat -c %s part)" = "$2" ] || { echo "size $(stat -c %s part)"; '
    'exit 3; }; chmod 644 part && mv -f done "$3/.pieces/$4" && mv -f part "$3/$4.gguf" '
    '&& cd .. && rm -rf "$1"'
)
BAD_PIECE = 3  # the scripts' exit code for content that did not check out


@dataclass(frozen=True)
class ModelPiece:
    """A span of a model, a piece cut at its tensors or a block of pieces in a row, and its
    sha256 (what the device checks)."""

    offset: int
    size: int
    digest: str


@dataclass(frozen=True)
class ModelDigests:
    sha256: str
    pieces: tuple[ModelPiece, ...]
    blocks: tuple[ModelPiece, ...]  # what a direct push checks (see check_blocks)


class PieceMismatch(DeviceError):
    """A piece or block did not match its sha256 on the device (what checked out before it stays
    in the part)."""


def cut(model: Path) -> list[tuple[int, int]]:
    """(offset, size) of each piece of ``model``: at its tensors, else every LARGEST bytes."""
    size = model.stat().st_size
    try:
        cuts = boundaries(model)
    except GgufLayoutError as exc:
        log.info("%s: cut at fixed sizes (%s)", model, exc)
        cuts = []
    return spans(cuts, size, small=SMALL, largest=LARGEST)


def check_blocks(layout: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """(offset, size) of the blocks a direct push checks, each a run of whole pieces: the last
    is the shortest run at the end of the model with 1/TAIL_SHARE of its bytes or more (it is
    hashed straight from the file), the others hold BLOCK bytes or more (one pipeline each), but
    for the one before the last, which holds what is left."""
    total = sum(size for _, size in layout)
    tail = len(layout) - 1
    while tail > 0 and (total - layout[tail][0]) * TAIL_SHARE < total:
        tail -= 1
    blocks = []
    start = 0
    for index in range(tail):
        offset, size = layout[index]
        if offset + size - layout[start][0] >= BLOCK or index == tail - 1:
            blocks.append((layout[start][0], offset + size - layout[start][0]))
            start = index + 1
    return [*blocks, (layout[tail][0], total - layout[tail][0])]


def read_range(model: Path, offset: int, size: int) -> bytes:
    with open(model, "rb") as handle:
        handle.seek(offset)
        data = handle.read(size)
    if len(data) != size:
        raise DeviceError(f"{model} changed while it was being sent (it is shorter now)")
    return data


def digest_pieces(
    model: Path, layout: Sequence[tuple[int, int]]
) -> Iterator[tuple[ModelPiece, bytes]]:
    """Each piece with its bytes, in order, read once."""
    with open(model, "rb") as handle:
        for offset, size in layout:
            data = handle.read(size)
            if len(data) != size:
                raise DeviceError(f"{model} changed while it was being read (it is shorter now)")
            yield (
                ModelPiece(offset, size, hashlib.sha256(data).hexdigest()),
                data,
            )


class ModelRead:
    """One read of a model: iterating gives each piece with its bytes; on the way it hashes the
    check blocks (``blocks`` grows as each is complete) and the whole file (``digests`` once
    every piece was read)."""

    def __init__(self, model: Path, layout: Sequence[tuple[int, int]]) -> None:
        self.model = model
        self.layout = list(layout)
        self.blocks: list[ModelPiece] = []
        self.digests: ModelDigests | None = None

    def __iter__(self) -> Iterator[tuple[ModelPiece, bytes]]:
        whole, block = hashlib.sha256(), hashlib.sha256()
        ends = iter(check_blocks(self.layout))
        current = next(ends)
        pieces = []
        for piece, data in digest_pieces(self.model, self.layout):
            whole.update(data)
            block.update(data)
            pieces.append(piece)
            if piece.offset + piece.size == sum(current):
                self.blocks.append(ModelPiece(*current, block.hexdigest()))
                block = hashlib.sha256()
                current = next(ends, current)
            yield piece, data
        self.digests = ModelDigests(whole.hexdigest(), tuple(pieces), tuple(self.blocks))


def model_digests(model: Path) -> ModelDigests:
    """The sha256, pieces and check blocks of ``model`` from one read."""
    read = ModelRead(model, cut(model))
    for _ in read:
        pass
    assert read.digests is not None  # the loop ran to the end
    return read.digests


class DigestCache:
    """Models' digests by their file's stat data (see the module's docstring)."""

    def __init__(self, path: Path) -> None:
        self.texts = TextCache(path, limit=CACHE_LIMIT)

    @staticmethod
    def key(model: Path) -> str:
        st = model.stat()
        return (
            f"{PLAN_VERSION}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
        )

    def get(self, model: Path) -> ModelDigests | None:
        text = self.texts.get(self.key(model))
        try:
            entry = json.loads(text) if text else None
            if not entry or model.stat().st_mtime >= entry["at"] - RACY_SECONDS:
                return None
            found = ModelDigests(
                entry["sha256"],
                tuple(ModelPiece(int(o), int(s), str(d)) for o, s, d in entry["pieces"]),
                tuple(ModelPiece(int(o), int(s), str(d)) for o, s, d in entry["blocks"]),
            )
        except (ValueError, KeyError, TypeError):
            return None
        layout = [(piece.offset, piece.size) for piece in found.pieces]
        spans_of = [(block.offset, block.size) for block in found.blocks]
        return found if layout and spans_of == check_blocks(layout) else None

    def put(self, model: Path, found: ModelDigests, at: float) -> None:
        self.texts.put(
            self.key(model),
            json.dumps(
                {
                    "sha256": found.sha256,
                    "pieces": [[p.offset, p.size, p.digest] for p in found.pieces],
                    "blocks": [[b.offset, b.size, b.digest] for b in found.blocks],
                    "at": at,
                }
            ),
        )

    def drop(self, model: Path) -> None:
        self.texts.put(self.key(model), "")


def work_name(model: Path, layout: Sequence[tuple[int, int]]) -> str:
    """The work dir of a model in incoming/: its size and first piece, so that a push cut before
    the model's sha256 was known resumes into the same dir."""
    size = sum(length for _, length in layout)
    first = hashlib.sha256(read_range(model, *layout[0])).hexdigest()
    return f"{WORK_PREFIX}{size}-{first[:16]}"


@dataclass(frozen=True)
class DeviceModels:
    """What the prologue found."""

    sizes: dict[str, int]  # stored model file name -> size
    sources: dict[str, tuple[str, int]]  # piece sha256 -> (stored model's sha256, offset in it)
    arrived: dict[str, int]  # work dir file -> size
    done: tuple[tuple[str, int], ...]  # pieces checked into the part, in order


def prologue_step(layout: Layout, work: str) -> Step:
    return Step(PROLOGUE_SCRIPT, (layout.root, work), "listing the device's models")


def parse_prologue(result: RemoteResult) -> DeviceModels:
    stored, lists, arrived, done = sections(
        result.text().splitlines(), 4, what="listing the device's models"
    )
    sizes = sizes_of(stored)
    sources: dict[str, tuple[str, int]] = {}
    model, offset = "", 0
    for line in lists:
        if line.startswith("= "):
            model, offset = line[2:], 0
            continue
        digest, _, size = line.partition(" ")
        if size.isdigit() and f"{model}.gguf" in sizes:
            sources.setdefault(digest, (model, offset))
            offset += int(size)
    checked = tuple(
        (digest, int(size)) for digest, _, size in (line.partition(" ") for line in done) if size
    )
    return DeviceModels(sizes, sources, sizes_of(arrived), checked)


# runs a step with the given stdin (renewing the device lock)
CheckRunner = Callable[[Step, ByteSource | None], RemoteResult]


@dataclass
class Transfer:
    """The state of one model's transfer while it goes out."""

    remote: Remote
    layout: Layout
    work: str  # the device work dir
    run_check: CheckRunner
    on_progress: ProgressCallback | None
    label: str
    total: int
    sent: int = 0
    reused: int = 0
    resumed: int = 0
    checks: list[Future[None]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def progress(self, done: int, what: str = "") -> None:
        if self.on_progress:
            self.on_progress(TransferProgress(what or self.label, done, self.total))


def push_pieces(
    transfer: Transfer,
    model: Path,
    layout: list[tuple[int, int]],
    device: DeviceModels,
    known: ModelDigests | None,
    *,
    reuse: bool,
    direct: bool = True,
) -> ModelDigests:
    """Send what the device lacks of ``model`` (cut as ``layout`` says) into the work dir and
    check it into its part, directly or in pieces; returns the model's digests (``known``, or
    read now).

    PieceMismatch: a piece or block did not check out (what did before it stays in the part)."""
    transfer.stop, transfer.checks = threading.Event(), []  # a second pass starts afresh
    prefix, transfer.resumed = _resume(transfer, model, layout, device, known)
    if direct and prefix == 0 and _direct(model, layout, device, known, reuse=reuse):
        return _push_direct(transfer, model, layout, known)
    batches: queue.Queue[tuple[Path, list[str], int] | BaseException | None] = queue.Queue(1)
    result: list[ModelDigests] = []
    producer = threading.Thread(
        target=_produce,
        args=(model, layout, known, prefix, device, reuse, transfer, batches, result),
        daemon=True,
    )
    producer.start()
    pipelined = isinstance(transfer.remote.transport, FilePush)
    with ThreadPoolExecutor(max_workers=1) as checker:
        try:
            while (batch := batches.get()) is not None:
                if isinstance(batch, BaseException):
                    raise batch
                staged, names, size = batch
                try:
                    _push_batch(transfer, staged, names)
                finally:
                    shutil.rmtree(staged, ignore_errors=True)
                transfer.sent += size
                transfer.progress(transfer.sent + transfer.reused + transfer.resumed)
                step = Step(
                    CHECK_SCRIPT,
                    (transfer.work, names[-1], transfer.layout.models),
                    "checking pieces",
                )
                transfer.checks.append(checker.submit(_check, transfer, step))
                if not pipelined:
                    transfer.checks[-1].result()
                for check in [c for c in transfer.checks if c.done()]:
                    check.result()
        finally:
            transfer.stop.set()
            _drain(batches, producer)
        for check in transfer.checks:
            check.result()
    return result[0]


def _resume(
    transfer: Transfer,
    model: Path,
    layout: list[tuple[int, int]],
    device: DeviceModels,
    known: ModelDigests | None,
) -> tuple[int, int]:
    """Keep what earlier pushes left in the part that is this model's: the pieces its done lists,
    then those that arrived whole after them and match (the device checks them where they lie),
    and cut off the rest. Returns the pieces and bytes kept."""
    arrived = device.arrived.get("part", 0)
    done = list(device.done)
    if not done and not arrived:
        return 0, 0
    # the part holds known's pieces in turn (with splits, only some of the layout's)
    sizes = [piece.size for piece in known.pieces] if known else [size for _, size in layout]
    ends = list(itertools.accumulate(sizes))
    inside = bisect.bisect_right(ends, arrived)  # the pieces the part holds whole
    wanted = max(len(done), inside)
    pieces = (
        list(known.pieces[:wanted])
        if known
        else [piece for piece, _ in itertools.islice(digest_pieces(model, layout), wanted)]
    )
    prefix = 0
    for (digest, size), piece in zip(done, pieces[:inside], strict=False):
        if (digest, size) != (piece.digest, piece.size):
            break
        prefix += 1
    kept = ends[prefix - 1] if prefix else 0
    if prefix == len(done) == inside and arrived == kept:
        return prefix, kept
    step = Step(
        RESUME_SCRIPT,
        (transfer.work, str(kept), str(prefix)),
        "keeping the checked part of a partial model",
    )
    lines = "".join(f"{piece.digest} {piece.size}\n" for piece in pieces[prefix:inside])
    result = transfer.run_check(step, [lines.encode()])
    transfer.remote.checked([step], [result])
    now = result.text().strip()
    if not now.isdigit() or int(now) not in (kept, *ends[prefix:inside]):
        raise DeviceError(
            f"{transfer.remote.address}: keeping what arrived of {transfer.label} left a part of "
            f"{now!r} bytes, not a whole number of its pieces"
        )
    return bisect.bisect_right(ends, int(now)), int(now)


def _direct(
    model: Path,
    layout: list[tuple[int, int]],
    device: DeviceModels,
    known: ModelDigests | None,
    *,
    reuse: bool,
) -> bool:
    """Whether to send the file itself: the device holds less than 1/REUSE_SHARE of it, in its
    models or in pieces a cut push left. Without digests yet (a cold cache), SAMPLES pieces
    spread over the file stand for it: it goes itself unless a stored model holds one of them."""
    total = sum(size for _, size in layout)
    if known is None:
        return not (reuse and device.sources) or not any(
            hashlib.sha256(read_range(model, *layout[index])).hexdigest() in device.sources
            for index in _samples(layout)
        )
    held = sum(
        piece.size
        for piece in known.pieces
        if (reuse and piece.digest in device.sources)
        or device.arrived.get(piece.digest) == piece.size
    )
    return held * REUSE_SHARE < total


def _samples(layout: list[tuple[int, int]]) -> list[int]:
    """The pieces at 1/2n, 3/2n, ... of the file (n = SAMPLES)."""
    total = sum(size for _, size in layout)
    starts = [offset for offset, _ in layout]
    at = [total * (2 * k + 1) // (2 * SAMPLES) for k in range(SAMPLES)]
    return sorted({bisect.bisect_right(starts, offset) - 1 for offset in at})


def _push_direct(
    transfer: Transfer,
    model: Path,
    layout: list[tuple[int, int]],
    known: ModelDigests | None,
) -> ModelDigests:
    """Push the file itself into the work dir while one device command checks it as it arrives
    (see the module's docstring)."""
    blocks = check_blocks(layout)
    step = Step(
        FOLLOW_SCRIPT,
        (transfer.work, str(transfer.total), str(blocks[-1][0]), secrets.token_hex(8)),
        "checking the model as it arrives",
    )
    read: ModelRead | None = None
    if known is None:
        read = ModelRead(model, layout)
        lines = _read_lines(read, transfer.stop)
    else:
        lines = _block_lines(known)
    checked: list[RemoteResult | BaseException] = []

    def follow() -> None:
        try:
            checked.append(transfer.run_check(step, lines))
        except BaseException as exc:  # handed to the pushing thread
            checked.append(exc)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    progress = (lambda arrived: transfer.progress(arrived)) if transfer.on_progress else None
    try:
        transfer.remote.transport.push(
            model, posixpath.join(transfer.work, ARRIVING), progress=progress
        )
    except BaseException:
        transfer.stop.set()
        _stop_following(transfer, follower)
        raise
    transfer.sent += transfer.total
    follower.join()
    outcome = checked[0]
    if isinstance(outcome, BaseException):
        raise outcome
    if outcome.returncode == BAD_PIECE:
        raise PieceMismatch(
            f"{transfer.remote.address}: a block of {transfer.label} did not match its sha256 "
            f"on the device ({outcome.text().strip()})"
        )
    transfer.remote.checked([step], [outcome])
    found = known or (read.digests if read else None)
    assert found is not None  # the checker read every block's line: the read is complete
    return found


def _block_lines(known: ModelDigests) -> Iterator[bytes]:
    """The checker's input: each block's line, then its pieces' lines."""
    pieces = iter(known.pieces)
    for index, block in enumerate(known.blocks):
        members = [next(pieces)]
        while members[-1].offset + members[-1].size < block.offset + block.size:
            members.append(next(pieces))
        yield _block_text(block, members, last=index == len(known.blocks) - 1)


def _read_lines(read: ModelRead, stop: threading.Event) -> Iterator[bytes]:
    """The checker's input from a read of the model, each block's lines as soon as it was read."""
    members: list[ModelPiece] = []
    total = len(check_blocks(read.layout))
    for piece, _ in read:
        if stop.is_set():
            return
        members.append(piece)
        block = read.blocks[-1] if read.blocks else None
        if block and block.offset + block.size == piece.offset + piece.size:
            yield _block_text(block, members, last=len(read.blocks) == total)
            members = []


def _block_text(block: ModelPiece, pieces: Sequence[ModelPiece], *, last: bool) -> bytes:
    head = f"{'t' if last else 'b'} {block.digest} {block.size} {len(pieces)}\n"
    return (head + "".join(f"{piece.digest} {piece.size}\n" for piece in pieces)).encode()


def _stop_following(transfer: Transfer, follower: threading.Thread) -> None:
    """Tell a direct push's checker that its push failed (it ends at its next look) and let it
    end; a device out of reach ends it by itself (it stops when the file stops growing)."""
    try:
        transfer.remote.run(
            ["rm", "-f", posixpath.join(transfer.work, "follower")],
            what="stopping the check of a cut push",
        )
    except KzError as exc:
        log.info("%s", exc)
        return
    follower.join(timeout=10)


def _produce(
    model: Path,
    layout: list[tuple[int, int]],
    known: ModelDigests | None,
    prefix: int,
    device: DeviceModels,
    reuse: bool,
    transfer: Transfer,
    batches: queue.Queue[tuple[Path, list[str], int] | BaseException | None],
    result: list[ModelDigests],
) -> None:
    """Hash (unless the digests are ``known``) and stage the pieces after the first ``prefix``, a
    batch at a time; the last item is None, or the exception that stopped it."""
    try:
        where = MEMORY_STAGE if os.access(MEMORY_STAGE, os.W_OK) else Path(tempfile.gettempdir())
        sweep_stages(where)
        read: ModelRead | None = None
        items: Iterable[tuple[ModelPiece, bytes]]
        if known is None:
            read = items = ModelRead(model, layout)
        else:  # no bytes: read when staged
            items = ((piece, b"") for piece in known.pieces)
        in_part: dict[
            str, int
        ] = {}  # piece sha256 -> offset in the part (pieces checked in already)
        offset = 0
        staged: Path | None = None
        plan: list[str] = []
        batch_bytes = planned = 0
        number = 0
        for index, (piece, data) in enumerate(items):
            if transfer.stop.is_set():
                return
            if index >= prefix:
                if staged is None:
                    staged = Path(
                        tempfile.mkdtemp(prefix=f"{STAGE_PREFIX}{os.getpid()}-", dir=where)
                    )
                line, sent = _plan_line(
                    piece, offset, in_part, device, reuse, staged, model, data, transfer
                )
                plan.append(line)
                batch_bytes += sent
                planned += piece.size
            in_part.setdefault(piece.digest, offset)
            offset += piece.size
            if staged is not None and (
                batch_bytes >= BATCH or planned >= PLANNED or len(plan) >= 4096
            ):
                number += 1
                batches.put(_close_batch(staged, plan, number, batch_bytes))
                staged, plan, batch_bytes, planned = None, [], 0, 0
        if staged is not None:
            number += 1
            batches.put(_close_batch(staged, plan, number, batch_bytes))
        found = read.digests if read else known
        assert found is not None  # the read ran to its end
        result.append(found)
        batches.put(None)
    except BaseException as exc:  # handed to the sending thread, which raises it
        batches.put(exc)


def _plan_line(
    piece: ModelPiece,
    offset: int,
    in_part: dict[str, int],
    device: DeviceModels,
    reuse: bool,
    staged: Path,
    model: Path,
    data: bytes,
    transfer: Transfer,
) -> tuple[str, int]:
    """The check plan's line for ``piece`` (at ``offset`` in the model) and the bytes it sends."""
    name = f"{piece.digest} {piece.size}"
    if reuse and piece.digest in in_part:
        transfer.reused += piece.size
        return f"c {name} part {in_part[piece.digest]} {offset}", 0
    if reuse and piece.digest in device.sources:
        model_sha, at = device.sources[piece.digest]
        transfer.reused += piece.size
        return f"c {name} {model_sha} {at} {offset}", 0
    if device.arrived.get(piece.digest) == piece.size:
        transfer.resumed += piece.size
        return f"p {name}", 0
    (staged / piece.digest).write_bytes(data or read_range(model, piece.offset, piece.size))
    return f"p {name}", piece.size


def _close_batch(
    staged: Path, plan: list[str], number: int, size: int
) -> tuple[Path, list[str], int]:
    """The batch: its dir, the files to push in order (the pieces it holds, then its plan), and
    its bytes."""
    name = f"plan-{number}"
    (staged / name).write_text("".join(f"{line}\n" for line in plan))
    sent = [line.split()[1] for line in plan if line.startswith("p ")]
    pieces = [piece for piece in dict.fromkeys(sent) if (staged / piece).exists()]
    return staged, [*pieces, name], size


def _push_batch(transfer: Transfer, staged: Path, names: list[str]) -> None:
    transport = transfer.remote.transport
    if isinstance(transport, FilePush):
        files = [staged / name for name in names]
        members = [Member(f.name, f.stat().st_size, partial(_whole, f)) for f in files]
        transport.push_files(members, transfer.work)
        return
    for name in names:
        transport.push(staged / name, posixpath.join(transfer.work, name))


def _whole(path: Path) -> Iterator[bytes]:
    yield path.read_bytes()  # a staged piece: LARGEST bytes at most


def sweep_stages(parent: Path) -> None:
    """Remove the staging dirs under ``parent`` that a killed kzbuild of this user left (its pid
    is in the name and gone): in /dev/shm they would hold memory until a reboot."""
    for path in parent.glob(f"{STAGE_PREFIX}*-*"):
        pid = path.name.removeprefix(STAGE_PREFIX).split("-")[0]
        try:
            mine = path.lstat().st_uid == os.getuid()
        except OSError:
            continue
        if mine and pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _check(transfer: Transfer, step: Step) -> None:
    result = transfer.run_check(step, None)
    if result.returncode == BAD_PIECE:
        raise PieceMismatch(
            f"{transfer.remote.address}: a piece of {transfer.label} did not match its sha256 on "
            f"the device ({result.text().strip()})"
        )
    transfer.remote.checked([step], [result])


def _drain(
    batches: queue.Queue[tuple[Path, list[str], int] | BaseException | None],
    producer: threading.Thread,
) -> None:
    """Let a producer that is still running finish (its batches are dropped)."""
    while producer.is_alive() or not batches.empty():
        try:
            item = batches.get(timeout=0.1)
        except queue.Empty:
            continue
        if isinstance(item, tuple):
            shutil.rmtree(item[0], ignore_errors=True)


def store_step(layout: Layout, work: str, size: int, sha256: str) -> Step:
    return Step(STORE_SCRIPT, (work, str(size), layout.models, sha256), "storing the model")


# --- models push ---
def push_model(
    transport: Transport,
    device: Device,
    model: Path,
    *,
    name: str | None = None,
    on_progress: ProgressCallback | None = None,
    wait: float = 0.0,
    cache: Path | None = None,
    split: bool | None = None,
) -> ModelPushResult:
    """Store a GGUF model as models/<sha256>.gguf (sending the file, or only the pieces the device
    lacks when it holds much of it) and point models/<name> at it (waiting for the device lock
    like deploy).

    ``cache``: the file that keeps models' digests by their stat data
    (:class:`~kzbuild.device.modelpush.DigestCache`); None: read and hash the model every time.
    ``split``: store the model as GGUF splits, each once (:mod:`kzbuild.device.modelsplit`);
    None: when the device holds split models and one of them shares a tensor with it.
    """
    started = time.monotonic()
    name = name or model.name
    _check_model(model, name)
    check_split_name(name)
    digests = DigestCache(cache) if cache else None
    known = digests.get(model) if digests else None
    if known is None and _looks_stored(name):
        known = _hashed(model, digests)  # the name is refused unless it is the model's own
    if known and _looks_stored(name) and name != f"{known.sha256}.gguf":
        raise ConfigError(
            f"bad model name '{name}': names of the form <sha256>.gguf are the store's own"
        )
    splits = None
    if split:
        known = known or _hashed(model, digests)
        splits = _split(model, known, cache)
    pieces = [(piece.offset, piece.size) for piece in known.pieces] if known else cut(model)
    layout = Layout(device.root)
    work = posixpath.join(layout.incoming, work_name(model, pieces))
    steps = [state_step(layout), prologue_step(layout, posixpath.basename(work))]
    with device_lock(transport, device.root, "models push", wait=wait, then=steps) as lock:
        remote = Remote(transport)
        found = parse_prologue(remote.checked(steps, lock.then)[1])
        size = model.stat().st_size
        if known is None and size in found.sizes.values():
            known = _hashed(model, digests)  # it may be there already: nothing to send then
        if split is None and holds_splits(found.sizes):
            known = known or _hashed(model, digests)
            if any(p.digest in found.sources for p in known.pieces if p.size >= SMALL):
                splits = _split(model, known, cache)
        transfer = Transfer(
            remote,
            layout,
            work,
            lambda step, data: lock.refresh_then([step], data=data, timeout=VERIFY_TIMEOUT)[0],
            on_progress,
            model.name,
            size,
        )
        sha = known.sha256 if known else ""
        present = splits.present(found.sizes) if splits else f"{sha}.gguf" in found.sizes
        if not present:
            sha = _send_model(transfer, model, pieces, found, known, digests, splits)
        link = posixpath.join(layout.models, name)
        # storing, naming and releasing the lock: one round trip
        last = [] if present or splits else [store_step(layout, work, size, sha)]
        if name != f"{sha}.gguf":
            last.append(point_step(layout, link, f"{sha}.gguf"))
        if last:
            for step, result in zip(last, lock.release_after(last), strict=False):
                if step.script == STORE_SCRIPT:
                    _check_stored(transfer, step, result)
                else:
                    check_switch(remote, link, step, result)
    return ModelPushResult(
        device=transport.address,
        sha256=sha,
        path=posixpath.join(layout.models, f"{sha}.gguf"),
        link=link,
        bytes_sent=transfer.sent,
        bytes_resumed=transfer.resumed,
        bytes_reused=transfer.reused,
        already_there=present,
        seconds=time.monotonic() - started,
    )


def _split(model: Path, known: ModelDigests, cache: Path | None) -> SplitModel | None:
    split_cache = cache.with_name("model-splits.json") if cache else None
    key = DigestCache.key(model)
    return split_model(model, known.sha256, key, split_cache, small=SMALL, largest=LARGEST)


def _looks_stored(name: str) -> bool:
    return name.endswith(".gguf") and bool(SHA256_RE.match(name.removesuffix(".gguf")))


def _hashed(model: Path, cache: DigestCache | None) -> ModelDigests:
    at = time.time()
    found = model_digests(model)
    if cache:
        cache.put(model, found, at)
    return found


def _send_model(
    transfer: Transfer,
    model: Path,
    pieces: list[tuple[int, int]],
    found: DeviceModels,
    known: ModelDigests | None,
    cache: DigestCache | None,
    splits: SplitModel | None = None,
) -> str:
    """Send what the device lacks and check it into the part; the model's sha256. With
    ``splits``, the part holds only the pieces of the splits the device lacks (so it is not sent
    as the file itself), and the splits are stored from it.

    A piece or block that fails its check on the device (a damaged transfer, a damaged model a
    piece was copied from, a model file that changed since its digests were cached) makes a
    second pass that reads the file afresh and copies nothing out of other models."""
    if splits and not splits.needs_part(found.sizes):
        splits.store(transfer, found.sizes)
        return splits.sha256
    if splits and known:
        wanted = splits.needed([(p.offset, p.size) for p in known.pieces], found.sizes)
        known = replace(known, pieces=tuple(known.pieces[i] for i in wanted))
        transfer.total = sum(piece.size for piece in known.pieces)
    at = time.time()
    try:
        got = push_pieces(transfer, model, pieces, found, known, reuse=True, direct=splits is None)
    except PieceMismatch as exc:
        log.warning("%s; sending the rest again from a fresh read", exc.message)
        if cache:
            cache.drop(model)
        step = prologue_step(transfer.layout, posixpath.basename(transfer.work))
        found = parse_prologue(transfer.remote.run(step.argv, what=step.what))
        at, known = time.time(), None
        got = push_pieces(transfer, model, cut(model), found, None, reuse=False)
    sha = known.sha256 if known else got.sha256
    if cache and known is None:
        cache.put(model, got, at)
    if splits:
        in_part = [(p.offset, p.size) for p in (known or got).pieces]
        splits.store(transfer, found.sizes, part=in_part, sha256=sha)
    return sha


def _check_stored(transfer: Transfer, step: Step, result: RemoteResult) -> None:
    if result.returncode == BAD_PIECE:
        raise DeviceError(
            f"{transfer.remote.address}: {transfer.label} has the wrong size on the device after "
            f"all its pieces checked out ({result.text().strip()}, expected {transfer.total})",
            hint="rerun: the pieces that checked out are kept",
        )
    transfer.remote.checked([step], [result])


def _check_model(model: Path, name: str) -> None:
    if not model.is_file():
        raise ConfigError(f"no model file {model}")
    with open(model, "rb") as handle:
        if handle.read(4) != GGUF_MAGIC:
            raise ConfigError(f"{model} is not a GGUF model (it does not start with 'GGUF')")
    if "/" in name or name.startswith(".") or not name:
        raise ConfigError(
            f"bad model name '{name}': use a plain file name that does not start with '.'"
        )
