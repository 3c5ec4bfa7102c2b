"""Deploy's transfer of file contents: content-defined chunks, one tar stream per deploy, each
file assembled on the device from its chunks and verified before it enters the store.

Layout added under the device root (see :mod:`kzbuild.device.store` for the rest)::

    chunks/<name>                 a chunk of some object; <name> is the first 32 hex digits of its
    sha256
    chunklists/<sha256>           the chunks of objects/<sha256> in order, one "name size" line each
    signatures/<sha256>           the fine pieces of each of those chunks, for deltas (FINE_AVG)
    incoming/.lists-<token>/      the chunk lists of one deploy, until their objects are verified

A file is cut with FastCDC (:mod:`pyfastcdc`), so an edit moves only the chunks around it: the
device receives the chunks it lacks, and ``cat`` puts each file together from ``chunks/`` and
``incoming/``. A file under :data:`WHOLE_BELOW` travels whole, as before. At most two device
commands move a deploy's contents, however many files it has: the chunk lists go up and the
device answers which chunks it lacks (skipped while ``chunks/`` is empty: then it lacks all, and
each file is cut when the stream reaches it, so the host's cutting and hashing overlap the
transfer); one tar stream (``tar -x``, which toybox has) brings every missing chunk and whole
file, its control files last, and the same command assembles the files, runs ``sha256sum`` on
them and moves what checked out into the store (the device compares each sum with its file's
name, no answer from the host needed); the caller's steps may follow in that command, reading a
file the stream brought (deploy's release, see :data:`Carry`).

Over adb (:class:`~kzbuild.device.base.FilePush`) there is no stream and no chunk: the contents
the device lacks go in one transfer of adb's sync protocol (what ``adb push`` speaks; it moves
bytes several times faster than a shell's stdin), each under its sha256 name, read straight from
the artifact, whole, or in pieces of :data:`PUSH_PIECE` bytes when bigger; one command without
input then joins the pieces, runs ``sha256sum`` and moves what matched into the store
(:data:`PUSHED_SCRIPT`; it starts with the push and hashes as files land, see :func:`_push`). Each
file is written once and hashed once, and the device runs a dozen processes, not a few per file:
on the adb test device a process costs more than a round trip, and cutting files into chunks
made a first deploy about 20x ``adb push`` of the same files. A changed file travels whole, as
with ``adb push --sync``: bytes are what a cable has most of.

A chunk the device lacks may come as a delta instead: the stored object that shares the most
chunks with the new file is its base, and the new chunk is built on the device (``head -c``,
``tail -c``) from ranges of the base's chunks that the new file no longer uses, plus the bytes
found in none of them. The ranges are found by the pieces' hashes in the base's signature, so
the host needs no copy of the old version. Not over adb, which stores no signatures either: a
range costs a process or two on the device, and adb's sync protocol moves the bytes faster.

Trust: a file enters ``objects/`` only when its sha256 on the device matched. A chunk that
arrived enters ``chunks/`` only when a file built from it matched and the chunk has the size its
list says: the concatenation matched, every part had its length, so every part is the right
content. No chunk is hashed on its own, and no content is hashed twice. A stored chunk that rotted
makes its file fail the check; that file is then rebuilt from freshly sent chunks only, and the
fresh chunks replace the stored ones (a rename); the chunks its deltas read are removed. A
signature is a hint: a wrong one only makes a delta, then its file, fail the check. A cut
transfer resumes: chunks, pieces and whole files that had arrived complete in ``incoming/`` are
not sent again. Sent again is the piece being written when the link went (of at most
:data:`MAX_CHUNK` bytes in a stream, where a file that is one chunk travels whole; of at most
:data:`PUSH_PIECE` bytes over adb, whose adbd removes the file a cut push was writing), and over
ssh what sshd had received but not yet handed to the device's ``tar``: sshd drops it with the
connection, up to its channel window (2 MiB with OpenSSH), more than the piece when the device
is slow to write.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from kzbuild.device.base import (
    NO_SPACE,
    ByteSource,
    FilePush,
    Member,
    RemoteResult,
    device_full,
    lacks_space,
)
from kzbuild.device.steps import Step
from kzbuild.device.store import (
    COMMAND_TIMEOUT,
    NAME_HEX,
    VERIFY_TIMEOUT,
    Layout,
    ProgressCallback,
    Remote,
    SendStats,
    TransferProgress,
    Upload,
    batches,
    mismatch_error,
    parse_sha256sum,
    sections,
)
from kzbuild.errors import DeviceError
from kzbuild.model.artifact import SHA256_RE

if TYPE_CHECKING:
    from pyfastcdc import FastCDC

log = logging.getLogger(__name__)

# FastCDC parameters: chunks of 16-256 KiB, about 80 KiB on average (pyfastcdc's mean is avg + min),
# casync's and desync's defaults. Smaller chunks resend less around an edit, but every chunk is a
# file on the device, and creating files is what a first deploy spends its time on: measured with
# benchmarks/bench_deploy.py on a 15 MB llama.cpp build, 4 KiB chunks made 2,800 files and the
# first deploy took 2.75x scp's time; 64 KiB makes 180. What an edit costs around it is then
# cut down by deltas against the chunks it replaced (FINE_AVG below), not by smaller chunks.
MIN_CHUNK = 16 * 1024
AVG_CHUNK = 64 * 1024
MAX_CHUNK = 256 * 1024
WHOLE_BELOW = (
    64 * 1024
)  # smaller files travel whole: assembling one costs a process or two on the device
# Deltas: every chunked content up to SIGNED_MAX is stored with a signature, one line per chunk:
# its name, then for each fine piece FastCDC cuts the chunk into (about 2.5 KiB), the first
# FINE_HEX hex digits of the piece's sha256 and its size in 4 hex digits. When a new version of a
# content shares chunks with a stored one, the device sends the lines of the old chunks the new
# one lacks; the pieces of a missing chunk found there are copied from the old chunk on the
# device, the rest is sent. A range costs a process or two on the device: one is used only when
# it saves OP_COST bytes, and a chunk only when its delta is smaller than the chunk.
FINE_AVG = 2048
FINE_MIN = 512
FINE_MAX = 8192  # a piece's size fits 4 hex digits
FINE_HEX = 12  # 48 bits: a collision only makes a file fail its check, then it is sent whole
SIGNED_MAX = 64 << 20
OP_COST = 4096
MAX_BASED = 500  # contents a deploy looks for bases for (their names are arguments)
STREAM_PIECE = 256 * 1024  # bytes handed to the transport at a time
TAR_BLOCK = 512
USTAR = b"ustar\x0000"  # a ustar header's magic and version
REGULAR, HARDLINK, SYMLINK, DIRECTORY = b"0", b"1", b"2", b"5"  # ustar type flags

# $1 = ROOT, $2 = token, then the lists to look for delta bases for; stdin: a tar of chunk lists
# (one file per object). Unpacks them into incoming/.kz-<token>/lists/ and prints the name of every
# listed chunk chunks/ lacks, then a "/" line. Then for each list named that shares chunks with
# stored objects: the stored object with a signature that shares the most ("= NEW OLD"), then the
# signature lines of OLD's chunks that NEW's list lacks and chunks/ holds; the lines of those it
# has go to incoming/.kz-<token>/base/NEW, for SIGNATURE_SCRIPT.
PROBE_SCRIPT = (
    'd="$1/incoming/.kz-$2/lists"; rm -rf "$d" && mkdir -p "$d" && cd "$d" '
    "&& tar -x -f - || exit 1; "
    'cat * | while read -r c s; do [ -f "../../../chunks/$c" ] || echo "$c"; done; echo /; '
    'shift 2; r=../../..; for l in "$@"; do '
    'while read -r c s; do [ -f "$r/chunks/$c" ] && echo "$c"; done < "$l" > ../shared; '
    "[ -s ../shared ] || continue; "
    'o=$(grep -c -H -F -f ../shared "$r"/chunklists/* 2>/dev/null | LC_ALL=C sort -t : -k 2 -n -r '
    '| while IFS=: read -r f n; do [ "$n" -gt 0 ] || break; f=${f##*/}; '
    'if [ -f "$r/signatures/$f" ]; then echo "$f"; break; fi; done); [ -n "$o" ] || continue; '
    'echo "= $l $o"; cut -d " " -f 1 "$l" > ../names && mkdir -p ../base || exit 1; '
    'grep -F -f ../names "$r/signatures/$o" > "../base/$l"; '
    'grep -v -F -f ../names "$r/signatures/$o" | while read -r c p; do '
    '[ -f "$r/chunks/$c" ] && echo "$c $p"; done; done; true'
)
# In RECEIVE_SCRIPT, before the assembly: builds in incoming/ the chunks that came as deltas.
# $k/delta holds "= CHUNK" (start CHUNK), then its parts in order, each a byte range of a file
# (an old chunk, ../chunks/NAME, or the chunk's new bytes, $k/lit/CHUNK): "c FILE" (all of it),
# "h FILE SIZE" (its first SIZE bytes), "t FILE FROM" (from byte FROM, 1-based, to its end), "r
# FILE FROM SIZE". A part that fails leaves the chunk wrong: its file then fails the check.
DELTA_SCRIPT = (
    'if [ -f "$k/delta" ]; then while read -r op f a b; do '
    'if [ "$op" = "=" ]; then n=$f; : > "$n" || exit 1; continue; fi; case $op in '
    'c) cat "$f" ;; h) head -c "$a" "$f" ;; t) tail -c "+$a" "$f" ;; '
    'r) tail -c "+$a" "$f" | head -c "$b" ;; esac >> "$n"; done < "$k/delta"; fi'
)
# In RECEIVE_SCRIPT, for the chunked contents that checked out ($k/built): their signatures
# ($k/sigs/SHA, named in the sorted list $k/signed; with the lines PROBE_SCRIPT kept in $k/base/SHA
# added) move into signatures/.
SIGNATURE_SCRIPT = (
    'if [ -f "$k/signed" ]; then comm -12 "$k/built" "$k/signed" > "$k/sign" || exit 1; '
    'for f in "$k"/base/*; do [ -f "$f" ] && cat "$f" >> "$k/sigs/${f##*/}"; done; '
    'if [ -s "$k/sign" ]; then '
    '(cd "$k/sigs" && xargs sh -c \'mv -f "$@" ../../../signatures/\' kz < ../sign) || exit 1; '
    "fi; fi"
)
# $1 = incoming/, $2 = token, $3 = 1 to use only chunks sent now. stdin: a tar of the chunks and
# whole files, and of .kz-<token>/ ($k): "plan" (sorted by SHA; "a SHA": assemble from lists/SHA,
# "x SHA": the same for a list too long for one command line, "h SHA": arrived whole), lists/ (if
# no probe sent them), delta, lit/ and sigs/ (see DELTA_SCRIPT and SIGNATURE_SCRIPT), and sorted
# name lists: "chunked" (the assembled contents), mode/MODE (the contents of each mode).
# Assembles, runs sha256sum on every planned file and prints its lines (only when one did not
# match: for 10,000 small files they were 1.3 MB of output, a line at a time) and a "/" line. Then,
# with no answer from the host needed: the contents that matched get their mode and move into
# objects/; their chunk lists move into chunklists/; the chunks they were built from that arrived
# now (in incoming/, at the size their list says, and not taken from chunks/) move into chunks/.
# The rest stays in incoming/, and the script exits MISMATCH (so that no step that follows it
# runs; $k.release, a file such a step would have read, goes). Each step runs as few processes as
# it can (on a busy device every process waits for a core): shell loops pick the names, one tool
# takes them all.
RECEIVE_SCRIPT = (
    'cd "$1" || exit 1; tar -x -f - || exit 1; '
    'k=".kz-$2"; fresh=$3; '
    f"{DELTA_SCRIPT}; "
    'xargs rm -f < "$k/chunked" || exit 1; '
    'while read -r op o; do if [ "$op" = a ]; then set --; while read -r c s; do '
    'if [ "$fresh" = 0 ] && [ -f "../chunks/$c" ]; then set -- "$@" "../chunks/$c"; '
    'else set -- "$@" "$c"; fi; done < "$k/lists/$o"; cat "$@" > "$o"; '
    'elif [ "$op" = x ]; then while read -r c s; do '
    'if [ "$fresh" = 0 ] && [ -f "../chunks/$c" ]; then echo "../chunks/$c"; else echo "$c"; fi; '
    'done < "$k/lists/$o" | xargs cat > "$o"; fi; echo "$o"; '
    'done < "$k/plan" | xargs sha256sum > "$k/sums"; '
    'p=0; while read -r op o; do p=$((p + 1)); done < "$k/plan"; g=0; '
    'while read -r h o; do [ "$h" = "$o" ] || continue; echo "$o" >&3; '
    'g=$((g + 1)); if [ -f "$k/lists/$o" ]; then echo "$o" >&4; fi; '
    'done < "$k/sums" 3> "$k/good" 4> "$k/built" || exit 1; '
    'if [ "$g" != "$p" ]; then cat "$k/sums"; fi; echo /; '
    'if [ -s "$k/built" ]; then '
    '(cd "$k/lists" && xargs cat < ../built) | LC_ALL=C sort -u > "$k/want" || exit 1; '
    "LC_ALL=C ls -ln | while read -r p l u g s rest; do case $p in -*) ;; *) continue ;; esac; "
    'echo "${rest##* } $s"; done > "$k/have" || exit 1; '
    'comm -12 "$k/want" "$k/have" | cut -d " " -f 1 > "$k/proven" || exit 1; '
    'if [ "$fresh" = 0 ]; then LC_ALL=C ls -1 ../chunks | comm -13 - "$k/proven" > "$k/new" '
    '&& mv -f "$k/new" "$k/proven" || exit 1; fi; '
    'if [ -s "$k/proven" ]; then '
    'xargs sh -c \'mv -f "$@" ../chunks/\' kz < "$k/proven" || exit 1; fi; '
    '(cd "$k/lists" && xargs sh -c \'mv -f "$@" ../../../chunklists/\' kz < ../built) '
    f"|| exit 1; {SIGNATURE_SCRIPT}; fi; "
    'for f in "$k"/mode/*; do [ -f "$f" ] || continue; '
    'comm -12 "$k/good" "$f" > "$k/moving" || exit 1; [ -s "$k/moving" ] || continue; '
    'xargs sh -c \'chmod "$0" "$@" && mv -f "$@" ../objects/\' "${f##*/}" < "$k/moving" '
    '|| exit 1; done; rm -rf "$k"; [ "$g" = "$p" ] || { rm -f "$k.release"; exit 9; }'
)
# a content of more chunks than this is assembled through xargs ("x" in RECEIVE_SCRIPT's plan):
# its list of names stays under 128 KiB, the least a kernel allows a command line
ARGV_CHUNKS = 2000
# Over adb: a file bigger than this is pushed in pieces of this size ("SHA.0", "SHA.1", ...), so a
# cut push re-sends at most one piece (0.2 s of USB 2). Pieces are joined by a process on the
# device, so a release's libraries (a few MB each) travel whole.
PUSH_PIECE = 8 << 20
# $1 = incoming/, $2 = how many of the contents named next must be executable (they come first),
# $3 = those of them pushed in pieces ("NAME:P NAME:P ...": NAME.0 ... NAME.P-1), $4 = a file for
# the sums of the contents hashed as they arrive ("": none, see below), then the content names. A
# FilePush brought the contents, each with its mode (adbd gives the file it writes the mode the
# push names). The device runs sha256sum and mv, each once for all of them (plus a cat for each
# content in pieces, and a chmod only when a content that must be executable is not: one joined
# from pieces, say). With $4, the step runs while the push goes on: it reads lines of names from
# stdin, those of the contents pushed whole, as the device stores them, and hashes each line's into
# $4 at once, until a "/" line says the push is over (stdin ending first is a push that failed:
# exit 1); only the contents joined from pieces are hashed after it. Without $4 all of them are.
# Joins the pieces (and removes them), prints the sums (only when one did not match) and a "/"
# line. A content is named by its sha256, so it matched when its line is "SHA SHA" (the shell
# compares the words in pairs: no sed); there must be a pair for each content, and each match.
# Those that matched move into objects/, the rest stays in incoming/ (and the script exits
# MISMATCH, so that no step that follows it runs). The names go to the tools as "$@". Names and
# sums are hex, so they are split and echoed as they are.
PUSHED_SCRIPT = (
    'cd "$1" || exit 1; x=$2 j=$3 e=$4; shift 4; set -f; parts=; joined=; '
    'if [ -n "$e" ]; then : > "$e" || exit 1; g=; while read -r n; do '
    '[ "$n" = / ] && g=1 && break; [ -z "$n" ] || sha256sum $n >> "$e" 2>/dev/null; done; '
    '[ -n "$g" ] || exit 1; fi; '
    "for a in $j; do n=${a%%:*}; i=0; p=; "
    'while [ "$i" -lt "${a#*:}" ]; do p="$p $n.$i"; i=$((i + 1)); done; '
    'cat $p > "$n" || exit 1; parts="$parts$p"; joined="$joined $n"; done; '
    'if [ -z "$e" ]; then sums=$(sha256sum "$@"); else sums=$(<"$e"); '
    '[ -z "$joined" ] || sums="$sums\n$(sha256sum $joined)"; fi; '
    'if [ -n "$parts" ]; then rm -f $parts; fi; '
    'i=0; f=; for n; do [ "$i" -lt "$x" ] || break; i=$((i + 1)); [ -x "$n" ] || f="$f $n"; done; '
    'if [ -n "$f" ]; then chmod 755 $f || exit 1; fi; '
    'k=0; m=0; d=; for w in $sums; do if [ -z "$d" ]; then d=$w; '
    'else m=$((m + 1)); [ "$d" = "$w" ] && k=$((k + 1)); d=; fi; done; '
    'if [ "$k" = "$#" ] && [ "$m" = "$#" ]; then echo /; mv -f "$@" ../objects/; exit; fi; '
    'echo "$sums"; echo /; '
    'good=; d=; for w in $sums; do if [ -z "$d" ]; then d=$w; '
    'elif [ "$d" = "$w" ]; then good="$good $w"; d=; else d=; fi; done; '
    'if [ -n "$good" ]; then mv -f $good ../objects/ || exit 1; fi; exit 9'
)
MISMATCH = 9  # RECEIVE_SCRIPT's and PUSHED_SCRIPT's exit code when a content did not match
WHOLE_FILE_MAX = 64 << 20  # files up to this size are read once for all their chunks


# deliver's ``then`` (see there) is called with the step that checks and stores what was sent and,
# over a stream, a Carry: given the bytes of a file of the caller's, it returns the stream that
# brings that file too, and the file's path on the device (the caller's steps read it there); over
# a FilePush, maybe a lead: what that step reads of the command's stdin first (a Gate's lines; the
# caller's steps read theirs after it).
Carry = Callable[[bytes], tuple[ByteSource, str]]
Then = Callable[[Step, Carry | None, ByteSource | None], RemoteResult]
SUMS_FILE = ".kz-sums"  # in .switch/: PUSHED_SCRIPT's sums of the contents hashed as they arrived


class Gate:
    """The names of the contents a push has stored, as lines for PUSHED_SCRIPT's stdin while the
    push goes on: a line for what came since the last (ARGV_BUDGET of names at most), then "/"
    once the push is over. A push that failed ends the lines with the error, so the command's
    stdin is cut and the step stops."""

    def __init__(self) -> None:
        self._names: list[str] = []
        self._named: set[str] = set()
        self._pushed: bool | None = None  # None: the push goes on
        self._changed = threading.Condition()

    def stored(self, name: str) -> None:
        """``name`` arrived whole. Each name once: the device counts one line per content, so a
        name twice could stand in for one never hashed."""
        with self._changed:
            if name in self._named:
                raise ValueError(f"{name} was stored twice in one push")
            self._named.add(name)
            self._names.append(name)
            self._changed.notify()

    def close(self, *, pushed: bool) -> None:
        with self._changed:
            self._pushed = pushed
            self._changed.notify()

    def lines(self) -> Iterator[bytes]:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._names) or self._pushed is not None)
                names, self._names, pushed = self._names, [], self._pushed
            for batch in batches(names):
                yield (" ".join(batch) + "\n").encode()
            if pushed:
                yield b"/\n"
                return
            if pushed is not None:
                raise DeviceError("the push did not finish")


@cache
def _chunker() -> FastCDC:
    from pyfastcdc import (
        FastCDC,
    )  # loaded by a deploy's first cut, not by every command that imports deploy

    return FastCDC(AVG_CHUNK, min_size=MIN_CHUNK, max_size=MAX_CHUNK)


@cache
def _fine_chunker() -> FastCDC:
    from pyfastcdc import FastCDC

    return FastCDC(FINE_AVG, min_size=FINE_MIN, max_size=FINE_MAX)


@dataclass(frozen=True)
class Piece:
    """One chunk of a file."""

    name: str
    offset: int
    size: int


@dataclass(frozen=True)
class Content:
    """A file content the device lacks, with its chunks (none: it is one chunk and travels
    whole)."""

    upload: Upload
    pieces: tuple[Piece, ...]

    @property
    def sha256(self) -> str:
        return self.upload.sha256

    def chunk_list(self) -> bytes:
        return "".join(f"{piece.name} {piece.size}\n" for piece in self.pieces).encode()


def chunk_name(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()[:NAME_HEX]


def split(path: str | Path, size: int) -> tuple[Piece, ...]:
    """The chunks of a file; () when it travels whole (small, or a single chunk)."""
    if size < WHOLE_BELOW:
        return ()
    pieces = tuple(
        Piece(chunk_name(chunk.data), chunk.offset, chunk.length)
        for chunk in _chunker().cut_file(path)
    )
    return pieces if len(pieces) > 1 else ()


def signature(content: Content, data: bytes, only: Iterable[str] | None = None) -> bytes:
    """The signature of a chunked content (``data``, its bytes): a line per chunk (per chunk named
    in ``only``), see FINE_AVG."""
    view = memoryview(data)
    names = None if only is None else set(only)
    return "".join(
        f"{piece.name} "
        + "".join(
            f"{hashlib.sha256(part.data).hexdigest()[:FINE_HEX]}{part.length:04x}"
            for part in _fine_chunker().cut_buf(view[piece.offset : piece.offset + piece.size])
        )
        + "\n"
        for piece in content.pieces
        if names is None or piece.name in names
    ).encode()


@dataclass(frozen=True)
class Base:
    """The fine pieces of the old chunks that a new content lacks and the device holds."""

    pieces: dict[tuple[str, int], tuple[str, int]]  # (hash, size) -> (old chunk, offset in it)
    sizes: dict[str, int]  # old chunk -> its size


CHUNK_NAME = re.compile(f"[0-9a-f]{{{NAME_HEX}}}")
FINE_PIECES = re.compile(f"(?:[0-9a-f]{{{FINE_HEX + 4}}})+")


def parse_bases(lines: Iterable[str]) -> dict[str, Base]:
    """PROBE_SCRIPT's answer after its "/" line: a Base per new content (by sha256). The lines
    come from the device's files, so what does not parse is skipped: a wrong piece only makes a
    file fail its check."""
    bases: dict[str, Base] = {}
    base: Base | None = None
    for line in lines:
        fields = line.split()
        if len(fields) == 3 and fields[0] == "=":
            base = bases.setdefault(fields[1], Base({}, {})) if SHA256_RE.match(fields[1]) else None
            continue
        if base is None or len(fields) != 2 or not CHUNK_NAME.fullmatch(fields[0]):
            continue
        name, text = fields
        if name in base.sizes or not FINE_PIECES.fullmatch(text):
            continue
        offset = 0
        for at in range(0, len(text), FINE_HEX + 4):
            size = int(text[at + FINE_HEX : at + FINE_HEX + 4], 16)
            base.pieces.setdefault((text[at : at + FINE_HEX], size), (name, offset))
            offset += size
        base.sizes[name] = offset
    return bases


@dataclass(frozen=True)
class Delta:
    """How the device builds a chunk: DELTA_SCRIPT's lines, and the chunk's bytes found in no old
    chunk (sent as lit/<name>)."""

    recipe: str
    literal: bytes
    sources: frozenset[str]  # the old chunks it reads


def delta(name: str, data: memoryview, base: Base, literal_path: str) -> Delta | None:
    """Chunk ``name`` (``data``) as ranges of the old chunks in ``base`` and new bytes; None when
    sending it whole costs less (a range costs OP_COST bytes)."""
    runs: list[tuple[str, int, int, int]] = []  # (old chunk or "", offset in it, size, at in data)
    for part in _fine_chunker().cut_buf(data):
        found = base.pieces.get((hashlib.sha256(part.data).hexdigest()[:FINE_HEX], part.length))
        source, offset = found or ("", part.offset)
        if runs and runs[-1][0] == source and runs[-1][1] + runs[-1][2] == offset:
            last = runs.pop()
            runs.append((source, last[1], last[2] + part.length, last[3]))
        else:
            runs.append((source, offset, part.length, part.offset))
    kept: list[tuple[str, int, int, int]] = []  # short old ranges become new bytes
    for source, offset, size, at in runs:
        if source and size < OP_COST:
            source, offset = "", at
        if kept and not source and not kept[-1][0]:
            last = kept.pop()
            kept.append(("", last[1], last[2] + size, last[3]))
        else:
            kept.append((source, offset, size, at))
    literal = b"".join(data[at : at + size] for source, _, size, at in kept if not source)
    if len(literal) + OP_COST * len(kept) >= len(data):
        return None
    lines = [f"= {name}"]
    done = 0
    for source, offset, size, _ in kept:
        if source:
            lines.append(_range(f"../chunks/{source}", offset, size, base.sizes[source]))
        else:
            lines.append(_range(literal_path, done, size, len(literal)))
            done += size
    recipe = "".join(f"{line}\n" for line in lines)
    return Delta(recipe, literal, frozenset(source for source, *_ in kept if source))


def _range(path: str, offset: int, size: int, total: int) -> str:
    """DELTA_SCRIPT's line for ``size`` bytes at ``offset`` of the ``total`` bytes of ``path``."""
    if offset == 0:
        return f"c {path}" if size == total else f"h {path} {size}"
    if offset + size == total:
        return f"t {path} {offset + 1}"
    return f"r {path} {offset + 1} {size}"


def tar_header(
    name: str,
    size: int,
    *,
    kind: bytes = REGULAR,
    mode: int = 0o644,
    linkname: str = "",
    mtime: int = 0,
) -> bytes:
    """A ustar header; a path too long for ustar, or a size of 8 GiB or more, gets a pax header
    (tarfile writes those)."""
    raw_name, raw_link = name.encode(), linkname.encode()
    prefix = b""
    if len(raw_name) > 100 and b"/" in raw_name[-101:]:
        cut = raw_name.index(b"/", len(raw_name) - 101)
        prefix, raw_name = raw_name[:cut], raw_name[cut + 1 :]
    too_big = max(size, mtime) >= 8**11  # 11 octal digits
    if len(raw_name) > 100 or len(prefix) > 155 or len(raw_link) > 100 or too_big:
        import tarfile  # only long names need it

        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime, info.type, info.linkname = (
            size,
            mode,
            mtime,
            kind,
            linkname,
        )
        return info.tobuf(format=tarfile.PAX_FORMAT)
    # mode, uid, gid, size and mtime (bytes 100-148)
    fields = b"%07o\0%s%011o\0%011o\0" % (mode, b"0000000\0" * 2, size, mtime)
    # the checksum is the sum of the header's bytes, its own 8 counted as spaces; the zeros that
    # pad the other fields add nothing, so only what they hold is summed (summing all 512 bytes
    # was most of the header's cost, and a deploy makes two per file: content and release link)
    checksum = sum(raw_name) + sum(fields) + 8 * 32 + kind[0] + sum(raw_link) + sum(USTAR)
    return b"".join(
        (
            raw_name.ljust(100, b"\0"),
            fields,
            b"%06o\0 " % (checksum + sum(prefix)),
            kind,
            raw_link.ljust(100, b"\0"),
            USTAR,  # magic and version (bytes 257-265), then owner names and device numbers
            bytes(80),
            prefix.ljust(155, b"\0"),
            bytes(12),
        )
    )


def tar_stream(
    members: Iterable[Member],
    on_bytes: Callable[[Member, int], None] | None = None,
    on_end: Callable[[], None] | None = None,
    *,
    end: bool = True,
) -> Iterator[bytes]:
    """A ustar archive of ``members`` (mode 0644), in pieces of about STREAM_PIECE bytes.

    ``on_bytes(member, n)`` is told of every n content bytes as they go out, ``on_end`` when all
    went. Without ``end`` the archive's end blocks are left off (more entries follow).
    """
    buffer = bytearray()
    now = int(time.time())
    for member in members:
        buffer += tar_header(member.name, member.size, mtime=now)
        written = 0
        for data in member.read():
            buffer += data
            written += len(data)
            if len(buffer) >= STREAM_PIECE:
                yield bytes(buffer)
                buffer.clear()
        member.check(written)
        if on_bytes:
            on_bytes(member, written)
        buffer += bytes(-member.size % TAR_BLOCK)
    if end:
        buffer += bytes(2 * TAR_BLOCK)
    yield bytes(buffer)
    if on_end:
        on_end()


class Reader:
    """Reads the pieces of files, each file (up to WHOLE_FILE_MAX) once for all of its pieces."""

    def __init__(self) -> None:
        self._path: str | None = None
        self._data = b""

    def keep(self, path: str, data: bytes) -> None:
        """``data`` is the content of ``path`` (read already): its pieces are taken from it."""
        self._path, self._data = path, data

    def piece(
        self, path: str, file_size: int, offset: int, size: int
    ) -> Callable[[], Iterator[bytes]]:
        """``size`` bytes at ``offset`` of ``path``, a file of ``file_size`` bytes (its manifest's
        size, which the artifact's load checked: no stat here, it cost more than the read for
        thousands of small files; a file changed since fails Member.check or the device's check)."""

        def read() -> Iterator[bytes]:
            if file_size > WHOLE_FILE_MAX:
                yield from _file_range(path, offset, size)
                return
            if path != self._path:
                self._path, self._data = path, _read(path, file_size)
            yield self._data[offset : offset + size]

        return read


def _file_range(path: str, offset: int, size: int) -> Iterator[bytes]:
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            left = size
            while left > 0 and (data := handle.read(min(left, STREAM_PIECE))):
                left -= len(data)
                yield data
    except OSError as exc:
        raise DeviceError(f"cannot read {path}: {exc.strerror}") from exc


def constant(data: bytes) -> Callable[[], Iterator[bytes]]:
    return lambda: iter((data,))


def deliver(
    remote: Remote,
    layout: Layout,
    uploads: Sequence[Upload],
    partial: dict[str, int],
    on_progress: ProgressCallback | None,
    *,
    chunks_empty: bool = False,
    then: Then | None = None,
) -> SendStats:
    """Put every upload into ``objects/`` verified, sending only the chunks the device lacks.

    ``partial`` maps names in incoming/ to the bytes there (what a cut deploy left);
    ``chunks_empty`` says chunks/ holds nothing, so there is nothing to ask about. A file that
    fails its check is rebuilt once from chunks all sent anew; if it fails again, the
    DeviceError names it.

    ``then`` runs the step that checks and stores what was sent, when one step does it all (a
    stream; over adb, a push of contents of one mode), and returns its result: the caller puts
    the steps that follow it into the same command (they run only when every content matched),
    and over a stream may add a file to it (a Carry).
    """
    if not uploads:
        return SendStats()
    stats, bad, sources = _deliver(
        remote,
        layout,
        uploads,
        partial,
        on_progress,
        fresh=False,
        probe=not chunks_empty,
        then=then,
    )
    if bad:
        log.warning(
            "%s: %d file(s) did not match after assembly, e.g. %s; sending all their chunks again",
            remote.address,
            len(bad),
            bad[0][0].upload.label,
        )
        # an old chunk a delta read may have rotted: it goes (its object is whole in objects/)
        suspects = sorted({name for content, _ in bad for name in sources.get(content.sha256, ())})
        remote.batched(
            ["rm", "-f"],
            [posixpath.join(layout.chunks, name) for name in suspects],
            what="removing the chunks deltas were built from",
        )
        again, bad, _ = _deliver(
            remote,
            layout,
            [content.upload for content, _ in bad],
            {},
            on_progress,
            fresh=True,
            probe=False,
        )
        stats = SendStats(stats.bytes_sent + again.bytes_sent, stats.bytes_resumed)
    if bad:
        content, found = bad[0]
        names = [
            up
            for content, _ in bad
            for up in (content.sha256, *(piece.name for piece in content.pieces))
        ]
        remote.batched(
            ["rm", "-f"],
            [posixpath.join(layout.incoming, name) for name in names],
            what="removing corrupt uploads",
        )
        raise mismatch_error(remote, len(bad), content.upload, found)
    return stats


def _deliver(
    remote: Remote,
    layout: Layout,
    uploads: Sequence[Upload],
    partial: dict[str, int],
    on_progress: ProgressCallback | None,
    *,
    fresh: bool,
    probe: bool,
    then: Then | None = None,
) -> tuple[SendStats, list[tuple[Content, str]], dict[str, set[str]]]:
    """One pass: (lists up, the device answers which chunks it lacks), then one transfer of the
    missing chunks and whole files that ends in their assembly, check and store on the device.

    Without ``probe`` every chunk counts as missing, the lists travel in the stream, and each file
    is cut when the stream reaches it: the host's cutting and hashing overlap the transfer and
    the device's writing (a first deploy's case).
    Returns what was sent, the contents that did not match (with the sha256 found) and the old
    chunks each content's deltas read.
    """
    token = secrets.token_hex(4)
    transport = remote.transport
    sending = _Sending(f".kz-{token}", partial, deltas=not isinstance(transport, FilePush))
    if isinstance(transport, FilePush):
        pushed = [Content(up, ()) for up in uploads]
        sending.push_pieces = _push_pieces(pushed, partial)
        members = list(sending.members(pushed))
        sent, found = _push(
            remote, transport, layout, pushed, sending.push_pieces, members, on_progress, then
        )
    else:
        contents: Iterable[Content] = (Content(up, split(up.local, up.size)) for up in uploads)
        if probe:
            contents = list(contents)
            _probe(remote, layout, token, contents, sending)
        sent, found = _stream(
            remote,
            layout,
            token,
            uploads,
            contents,
            sending,
            on_progress,
            fresh=fresh,
            probe=probe,
            then=then,
        )
    if len(sending.contents) != len(uploads):  # the device answered before the stream's end
        raise DeviceError(
            f"{remote.address}: the device stopped reading after {len(sending.contents)} of "
            f"{len(uploads)} file(s)"
        )
    bad = [
        (content, found.get(content.sha256, "no checksum (is sha256sum installed?)"))
        for content in sending.contents
        if found.get(content.sha256) != content.sha256
    ]
    return SendStats(bytes_sent=sent, bytes_resumed=sending.resumed), bad, sending.sources


def _lists(contents: Iterable[Content], prefix: str = "") -> list[Member]:
    """The chunk lists of the chunked ``contents``, as tar members named prefix + sha256."""
    return [
        Member(f"{prefix}{content.sha256}", len(data), constant(data))
        for content in contents
        if content.pieces
        for data in [content.chunk_list()]
    ]


def _probe(
    remote: Remote, layout: Layout, token: str, contents: Sequence[Content], sending: _Sending
) -> None:
    """Send the chunk lists up; the device's answer sets which chunks it lacks and the bases
    for deltas in ``sending`` (nothing to ask when no content is chunked)."""
    chunked = [content for content in contents if content.pieces]
    if not chunked:
        return
    # a range of an old chunk costs processes on the device: over adb, bytes cost less, so no
    # deltas and no signatures for them
    look = _signed(chunked)[:MAX_BASED] if sending.deltas else []
    argv = ["sh", "-c", PROBE_SCRIPT, "kz", layout.root, token, *look]
    answer = remote.transport.run_input(argv, tar_stream(_lists(chunked)), timeout=COMMAND_TIMEOUT)
    if not answer.ok:
        raise remote.error(argv, answer, what="sending the chunk lists")
    names, base_lines = sections(answer.text().split("\n"), 2, what="sending the chunk lists")
    sending.missing = set(" ".join(names).split())
    sending.bases = parse_bases(base_lines)


class _Sending:
    """What one pass sends, worked out as its transfer goes: the contents planned so far, the
    chunks on their way, and the deltas, signatures and resumed bytes that come with them."""

    def __init__(self, control: str, partial: dict[str, int], *, deltas: bool) -> None:
        self.control = control  # the pass's dir in incoming/ (RECEIVE_SCRIPT's $k)
        self.partial = partial
        self.deltas = deltas  # whether contents get signatures and deltas (not over adb)
        self.missing: set[str] | None = None  # the chunks the device lacks; None: all of them
        self.bases: dict[str, Base] = {}
        self.push_pieces: dict[str, list[tuple[str, int, int]]] = {}  # over adb, see _push_pieces
        self.contents: list[Content] = []  # in the order they went
        self.wanted: set[str] = set()
        self.resumed = 0
        self.settled = 0  # content bytes dealt with unsent: resumed, sent once, built on the device
        self.recipes: list[str] = []
        self.signatures: dict[str, bytes] = {}
        self.unsigned: list[Content] = []  # contents whose signatures are still to make
        self.sources: dict[str, set[str]] = {}  # old chunks each content's deltas read
        self.reader = Reader()

    def parts(self, content: Content) -> list[tuple[str, int, int]]:
        """The chunks (name, offset, size) of ``content`` to deliver: those missing, or the whole
        file (in pieces over adb when it is big)."""
        if content.pieces:
            return [
                (piece.name, piece.offset, piece.size)
                for piece in content.pieces
                if self.missing is None or piece.name in self.missing
            ]
        up = content.upload
        return self.push_pieces.get(up.sha256, [(up.name, 0, up.size)])

    def members(self, contents: Iterable[Content]) -> Iterator[Member]:
        """The tar members that bring ``contents``: a member per missing chunk, whole file or
        delta's new bytes; none for what is there already (resumed) or on its way."""
        for content in contents:
            self.contents.append(content)
            up = content.upload
            data = _signed_data(content) if self.deltas else None
            base = self.bases.get(up.sha256) if data is not None else None
            if data is not None:
                self.reader.keep(up.local, data)
                if base is None:  # signed at the stream's end, while the device writes its chunks
                    self.unsigned.append(content)
                else:  # the device adds the lines of the chunks they share
                    self.signatures[up.sha256] = signature(content, data, self.missing)
            for name, offset, size in self.parts(content):
                if name in self.wanted:  # on its way already
                    self.settled += size
                    continue
                self.wanted.add(name)
                if size and self.partial.get(name) == size:
                    self.resumed += size  # arrived whole before a cut; checked with the rest
                    self.settled += size
                    continue
                if base is not None and data is not None:
                    literal_path = f"{self.control}/lit/{name}"
                    view = memoryview(data)[offset : offset + size]
                    built = delta(name, view, base, literal_path)
                    if built is not None:
                        self.recipes.append(built.recipe)
                        self.sources.setdefault(up.sha256, set()).update(built.sources)
                        self.settled += size - len(built.literal)
                        if built.literal:
                            literal = built.literal
                            yield Member(literal_path, len(literal), constant(literal), up.label)
                        continue
                yield Member(
                    name,
                    size,
                    self.reader.piece(up.local, up.size, offset, size),
                    up.label,
                    up.mode,
                )

    def control_members(self, lists: bool) -> list[Member]:
        """RECEIVE_SCRIPT's control files for the contents that went, with their chunk lists when
        no probe sent them: the stream's last members (the device reads them once tar is done)."""
        members = _control(self.control, self.contents)
        if lists:
            members += _lists(self.contents, f"{self.control}/lists/")
        for content in self.unsigned:
            up = content.upload
            self.signatures[content.sha256] = signature(content, _read(up.local, up.size))
        return members + _delta_control(self.control, self.recipes, self.signatures)


def _signed(contents: Iterable[Content]) -> list[str]:
    """The contents (sha256) that get a signature."""
    return [content.sha256 for content in contents if _gets_signature(content)]


def _gets_signature(content: Content) -> bool:
    """Whether ``content`` gets a signature: chunked, at most SIGNED_MAX bytes."""
    return bool(content.pieces) and content.upload.size <= SIGNED_MAX


def _signed_data(content: Content) -> bytes | None:
    """The bytes of a content that gets a signature."""
    return _read(content.upload.local, content.upload.size) if _gets_signature(content) else None


def _read(path: str, size: int) -> bytes:
    """The first ``size`` bytes of ``path`` (fewer if it is shorter). With os.read: a file
    object (open()) cost as much as the read itself for thousands of small files."""
    try:
        handle = os.open(path, os.O_RDONLY)
        try:
            parts = []
            while size > 0 and (data := os.read(handle, size)):
                parts.append(data)
                size -= len(data)
            return b"".join(parts)
        finally:
            os.close(handle)
    except OSError as exc:
        raise DeviceError(f"cannot read {path}: {exc.strerror}") from exc


def _delta_control(
    control: str, recipes: Sequence[str], signatures: dict[str, bytes]
) -> list[Member]:
    """DELTA_SCRIPT's recipe, and SIGNATURE_SCRIPT's signatures with their sorted list."""
    members = [
        Member(f"{control}/sigs/{sha}", len(data), constant(data))
        for sha, data in signatures.items()
    ]
    texts = {"delta": "".join(recipes), "signed": "".join(f"{sha}\n" for sha in sorted(signatures))}
    members += [
        Member(f"{control}/{name}", len(data), constant(data))
        for name, text in texts.items()
        if text
        for data in [text.encode()]
    ]
    return members


def _push_pieces(
    contents: Sequence[Content], partial: dict[str, int]
) -> dict[str, list[tuple[str, int, int]]]:
    """The pieces (name, offset, size) of each content bigger than PUSH_PIECE, for a FilePush;
    none for a content that arrived whole before (joined by a command that was cut)."""
    return {
        content.sha256: [
            (f"{up.name}.{index}", offset, min(PUSH_PIECE, up.size - offset))
            for index, offset in enumerate(range(0, up.size, PUSH_PIECE))
        ]
        for content in contents
        for up in [content.upload]
        if up.size > PUSH_PIECE and partial.get(up.name) != up.size
    }


def _control(control: str, contents: Sequence[Content]) -> list[Member]:
    """RECEIVE_SCRIPT's plan and its sorted name lists (what is assembled, the contents of each
    mode)."""
    ordered = sorted(contents, key=lambda content: content.sha256)
    lists = {
        "plan": "".join(f"{_assembly(content)} {content.sha256}\n" for content in ordered),
        "chunked": "".join(f"{content.sha256}\n" for content in ordered if content.pieces),
    }
    modes: dict[str, list[str]] = {}
    for content in ordered:
        modes.setdefault(f"mode/{content.upload.mode:o}", []).append(f"{content.sha256}\n")
    lists.update((key, "".join(names)) for key, names in modes.items())
    return [
        Member(f"{control}/{name}", len(data), constant(data))
        for name, text in lists.items()
        for data in [text.encode()]
    ]


def _assembly(content: Content) -> str:
    """RECEIVE_SCRIPT's plan letter for ``content``: how the device puts it together."""
    if not content.pieces:
        return "h"
    return "a" if len(content.pieces) <= ARGV_CHUNKS else "x"


def _stream(
    remote: Remote,
    layout: Layout,
    token: str,
    uploads: Sequence[Upload],
    contents: Iterable[Content],
    sending: _Sending,
    on_progress: ProgressCallback | None,
    *,
    fresh: bool,
    probe: bool,
    then: Then | None,
) -> tuple[int, dict[str, str]]:
    """Send what ``contents`` need into incoming/ in one tar stream, worked out as it goes (see
    :class:`_Sending`), its control files last; the device then assembles, hashes and stores what
    matched (``then`` runs that step, see :func:`deliver`).

    Returns the content bytes sent and the sha256 the device found by content name.
    """
    if sending.missing is None:
        total = sum(up.size for up in uploads)
    else:
        total = sum(size for content in contents for _, _, size in sending.parts(content))
    sent = count = 0

    def report(member: Member, written: int) -> None:
        nonlocal sent, count
        count += 1
        if member.label:
            sent += written
            if on_progress:
                on_progress(TransferProgress(member.label, sent + sending.settled, total))

    def verifying() -> None:
        if on_progress:
            message = "verifying sha256 on the device"
            on_progress(TransferProgress(message, sent + sending.settled, total))

    def stream(extra: Iterable[Member] = ()) -> ByteSource:
        def members() -> Iterator[Member]:  # the control files once the contents went
            yield from sending.members(contents)
            yield from sending.control_members(lists=not probe)
            yield from extra

        return tar_stream(members(), report, verifying)

    def carry(data: bytes) -> tuple[ByteSource, str]:
        name = f"{sending.control}.release"  # RECEIVE_SCRIPT's $k.release
        return stream([Member(name, len(data), constant(data))]), f"{layout.incoming}/{name}"

    # without a probe chunks/ was empty: nothing to look for there
    only_sent = fresh or not probe
    step = Step(
        RECEIVE_SCRIPT,
        (layout.incoming + "/", token, str(int(only_sent))),
        "receiving files and chunks",
    )
    if then is None:
        result = remote.transport.run_input(step.argv, stream(), timeout=VERIFY_TIMEOUT)
    else:
        result = then(step, carry, None)
    what = f"{count} file(s) and chunk(s)"
    names = [content.sha256 for content in sending.contents]
    return sent, _received(remote, layout, step.argv, result, names, what, MISMATCH)


def _push(
    remote: Remote,
    transport: FilePush,
    layout: Layout,
    contents: Sequence[Content],
    pieces: dict[str, list[tuple[str, int, int]]],
    members: Sequence[Member],
    on_progress: ProgressCallback | None,
    then: Then | None,
) -> tuple[int, dict[str, str]]:
    """Push ``members`` into incoming/ in one transfer, then have the device join, hash and store
    ``contents`` (one PUSHED_SCRIPT command per ARGV_BUDGET of their names; when one does it all,
    ``then`` runs it, see :func:`deliver`). Bigger files go first.

    When one command does it all and every content goes whole or in pieces (none arrived before),
    that command starts with the push and hashes each content pushed whole as the device stores
    it (a :class:`Gate` on its stdin): after the push, only the contents in pieces are hashed,
    and the round trip of the command is spent during the transfer.

    Returns the content bytes sent and the sha256 the device found by content name.
    """
    total = sum(member.size for member in members)
    whole = {content.sha256 for content in contents} - pieces.keys()
    sent_whole = {member.name for member in members} & whole
    # the contents that must be executable first; one command per ARGV_BUDGET of names
    # (PUSHED_SCRIPT takes them as "$@")
    ordered = sorted(contents, key=lambda content: not content.upload.mode & 0o111)
    executable = {content.sha256 for content in ordered if content.upload.mode & 0o111}
    names = list(batches([content.sha256 for content in ordered]))
    gate = Gate() if then is not None and len(names) == 1 and sent_whole == whole else None
    sums = layout.join(".switch", SUMS_FILE) if gate else ""
    checks: list[tuple[Step, list[str]]] = []
    for batch in names:
        joins = " ".join(f"{name}:{len(pieces[name])}" for name in batch if name in pieces)
        count = str(sum(1 for name in batch if name in executable))
        what = f"checking {len(batch)} file(s)"
        args = (layout.incoming + "/", count, joins, sums, *batch)
        checks.append((Step(PUSHED_SCRIPT, args, what), batch))
    done = 0

    def stored(member: Member) -> None:
        nonlocal done
        done += member.size
        if on_progress:
            on_progress(TransferProgress(member.label, done, total))
        if gate and member.name in whole:
            gate.stored(member.name)

    biggest_first = sorted(members, key=lambda member: -member.size)
    found: dict[str, str] = {}
    with ThreadPoolExecutor(max_workers=1) as pool:  # a thread only for the gated command
        command = (
            None
            if gate is None or then is None
            else pool.submit(then, checks[0][0], None, gate.lines())
        )
        pushed = False
        try:
            transport.push_files(biggest_first, layout.incoming, on_stored=stored)
            pushed = True
        finally:
            if gate is not None:
                gate.close(pushed=pushed)
        if on_progress:
            on_progress(TransferProgress("verifying sha256 on the device", done, total))
        for step, batch in checks:
            if command is not None:
                result = command.result()
            elif then is not None and len(checks) == 1:
                result = then(step, None, None)
            else:
                result = remote.transport.run(step.argv, timeout=VERIFY_TIMEOUT)
            found.update(_received(remote, layout, step.argv, result, batch, step.what, MISMATCH))
    return total, found


def _received(
    remote: Remote,
    layout: Layout,
    argv: Sequence[str],
    result: RemoteResult,
    names: Iterable[str],
    count: str,
    mismatch: int = 0,
) -> dict[str, str]:
    """The sha256 the device found by content name, from the output of a command that checked
    the contents ``names`` (``count`` received files): exit 0, every one matched (the device
    prints the sums only when some did not), or ``mismatch`` and the sums; the error (a full device
    named as such) when it failed."""
    # a full disk while assembling leaves files short: that is no corruption to retry, but
    # this error
    stderr = result.stderr.decode(errors="replace")
    what = f"receiving {count}"
    if result.returncode not in (0, mismatch) or NO_SPACE in stderr:
        if NO_SPACE not in stderr and lacks_space(
            remote.transport, layout.incoming, TAR_BLOCK * 16
        ):
            lines = stderr.strip().splitlines()
            raise device_full(
                remote.address,
                f"{what} into {layout.incoming}/ failed" + (f": {lines[0]}" if lines else ""),
            )
        raise remote.error(argv, result, what=what)
    sums, _ = sections(result.text().split("\n"), 2, what=what)
    if result.returncode == 0:
        return {name: name for name in names}
    return parse_sha256sum(sums)
