"""``models push``'s transfer: a model travels in pieces cut at its tensors, the device checks and
appends each piece while the next ones are on the way, and keeps only the finished file.

Layout added under the device root (see :mod:`kzbuild.device.store` for the rest)::

    models/.pieces/<sha256>     the pieces of models/<sha256>.gguf in order, one "sha256 size" line
                                each: what a later push may copy out of that file
    incoming/.kzm-<key>/        one model on its way (<key>: its size and first piece): pieces
                                named by their sha256, ``part`` (the checked pieces so far, in
                                order) and ``done`` (their lines)

Pieces (:mod:`kzbuild.device.ggufcut`): every metadata entry and every tensor starts a piece,
so a quant variant that changes one tensor leaves every other piece as it was; a file that is
not a GGUF this reader knows is cut every :data:`LARGEST` bytes.

One pass over the file on the host reads each piece, hashes it (sha256, and the whole file's
sha256, the model's name) and stages the pieces the device lacks into a memory dir, a batch of
about :data:`BATCH` bytes at a time. Over adb a batch is one ``adb push`` (the sync protocol,
as fast as ``adb push`` of the file), and while the next batch is pushed the device checks the
previous one: for each piece in order it takes the piece that arrived, or copies it out of a
model it holds (``tail -c | head -c``: tail seeks), checks its ``sha256sum``, and appends it to
``part``; a piece that does not match stops the batch. The last command renames ``part`` into
the store. Nothing is hashed twice on either side.

Trust: every byte of a stored model was checked on the device as part of its piece, against the
sha256 the host computed from the same read that gave the model's sha256. The device does not
hash the whole file again: the concatenation of checked pieces is the file the host read.
(Pieces were checked with sha1 for a while, for speed on the adb test device, whose Debian
toybox hashed sha256 at a fifth of ``adb push``'s speed; Android builds toybox with libcrypto,
where both run alike, and so does the test device now.)

A cut push resumes: ``part`` and the pieces that arrived whole stay, and a repeated push sends
only what is missing.

Host cache: the sha256 and the pieces of a model file are kept in the cache dir by the file's
device, inode, size, mtime and ctime (as git's index keeps a file's stat data), so pushing the
same file again reads it only to send what the device lacks. A file rewritten in place with the
same size and times (ctime cannot be set back by a program; a clock set back or a write within
the timestamp's grain can) would be sent with its old digests; like git, an entry whose file was
modified within :data:`RACY_SECONDS` of being hashed is not trusted, and the device's check of
every piece catches the rest: the push fails, the entry is dropped, and the push runs again from
a fresh read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import queue
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from kzbuild.adapters.files import TextCache
from kzbuild.device.base import RemoteResult, Transport, TreePush
from kzbuild.device.chunkstore import MEMORY_STAGE, STAGE_PREFIX, sweep_stages
from kzbuild.device.devicelock import device_lock
from kzbuild.device.ggufcut import GgufLayoutError, boundaries, spans
from kzbuild.device.modelsplit import SplitModel, check_split_name, holds_splits, split_model
from kzbuild.device.steps import Step
from kzbuild.device.store import (
    VERIFY_TIMEOUT,
    Layout,
    ProgressCallback,
    Remote,
    TransferProgress,
    point,
    sections,
    sizes_of,
    state_step,
)
from kzbuild.errors import ConfigError, DeviceError
from kzbuild.model.artifact import SHA256_RE
from kzbuild.model.deploy import ModelPushResult
from kzbuild.model.device import Device

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"

SMALL = 1 << 20  # spans below this are merged with their neighbours
LARGEST = 16 << 20  # no piece is bigger (a cut push resends at most one piece per batch in flight)
BATCH = 64 << 20  # bytes staged and pushed at a time (two batches are in memory at most)
# bump when the cutting or the piece digest changes: cached pieces of another kind are not used
PLAN_VERSION = 2
RACY_SECONDS = 2.0
CACHE_LIMIT = 200
PIECES_DIR = ".pieces"
WORK_PREFIX = ".kzm-"

# $1 = ROOT, $2 = the work dir's name in incoming/. Prints "size name" of every stored model,
# "/", then each stored model's piece list after a "= SHA" line, "/", "size name" of what the
# work dir holds, "/", and the pieces already checked into its part (its "done").
PROLOGUE_SCRIPT = (
    'cd "$1" || exit 1; mkdir -p "models/.pieces" "incoming/$2" || exit 1; '
    "ls -ln models | while read -r p l u g s rest; do case $p in -*) ;; *) continue ;; esac; "
    'n=${rest##* }; case $n in *.gguf) echo "$s $n" ;; esac; done; echo /; '
    'for f in models/.pieces/*; do [ -f "$f" ] && [ -f "models/${f##*/}.gguf" ] || continue; '
    'echo "= ${f##*/}"; cat "$f"; done; echo /; '
    'cd "incoming/$2" && ls -ln | while read -r p l u g s rest; do '
    'case $p in -*) echo "$s ${rest##* }" ;; esac; done; echo /; cat done 2>/dev/null; true'
)
# $1 = the work dir, $2 = a plan in it, $3 = the models dir. Each plan line: "p SHA SIZE" (the
# piece arrived as the file SHA, its sha256) or "c SHA SIZE FROM BACK AT" (copy SIZE bytes that
# start BACK bytes before the end of FROM, a model SHA or "part" itself, to byte AT of the part).
# Each piece is checked against its name with sha256sum and appended to part, a copy in one pass
# (tee); its line goes to done. A piece that does not match is removed (a copy: cut off the part
# again) and named on a "bad SHA" line (exit 3); the pieces after it are not appended. A plan of
# arrived pieces only is checked with one sha256sum and appended with one cat (a process per
# piece costs more than hashing it on a busy device).
CHECK_SCRIPT = (
    'cd "$1" || exit 1; if ! grep -q "^c " "$2"; then cut -d " " -f 2 "$2" > "$2.n" '
    '&& xargs sha256sum < "$2.n" > "$2.s" || exit 1; '
    'while read -r h d; do [ "$h" = "$d" ] || { rm -f "$d"; echo "bad $d"; exit 3; }; '
    'done < "$2.s"; xargs cat < "$2.n" >> part && cut -d " " -f 2,3 "$2" >> done '
    '&& xargs rm -f < "$2.n" && rm -f "$2" "$2.n" "$2.s"; exit; fi; '
    "while read -r op d s src back at; do "
    'if [ "$op" = c ]; then if [ "$src" = part ]; then f=part; else f="$3/$src.gguf"; fi; '
    'h=$(tail -c "$back" "$f" | head -c "$s" | tee -a part | sha256sum) || exit 1; '
    'if [ "${h%% *}" != "$d" ]; then truncate -s "$at" part; echo "bad $d"; exit 3; fi; '
    'else h=$(sha256sum < "$d") || exit 1; '
    'if [ "${h%% *}" != "$d" ]; then rm -f "$d"; echo "bad $d"; exit 3; fi; '
    'cat "$d" >> part && rm -f "$d" || exit 1; fi; echo "$d $s" >> done || exit 1; '
    'done < "$2" && rm -f "$2"'
)
# $1 = the work dir, $2 = bytes, $3 = lines: cut the part to its first $2 bytes and done to its
# first $3 lines (what a cut push or another file left beyond the pieces that are this model's).
TRIM_SCRIPT = (
    'cd "$1" && truncate -s "$2" part && head -n "$3" done > done.kz 2>/dev/null; '
    "mv -f done.kz done"
)
# $1 = the work dir, $2 = the model's size, $3 = the models dir, $4 = SHA256. Stores the part
# as models/SHA256.gguf and its pieces' list, if it has the size; removes the work dir.
STORE_SCRIPT = (
    'cd "$1" || exit 1; [ "$(stat -c %s part)" = "$2" ] || { echo "size $(stat -c %s part)"; '
    'exit 3; }; chmod 644 part && mv -f done "$3/.pieces/$4" && mv -f part "$3/$4.gguf" '
    '&& cd .. && rm -rf "$1"'
)
BAD_PIECE = 3  # CHECK_SCRIPT's and STORE_SCRIPT's exit code for content that did not check out


@dataclass(frozen=True)
class ModelPiece:
    """A model's piece, cut at its tensors: where it lies and the sha256 the device checks."""

    offset: int
    size: int
    digest: str  # the piece's sha256


@dataclass(frozen=True)
class ModelDigests:
    sha256: str
    pieces: tuple[ModelPiece, ...]


class PieceMismatch(DeviceError):
    """A piece did not match its sha256 on the device (it was removed; what checked out before it
    stays in the part)."""


def cut(model: Path) -> list[tuple[int, int]]:
    """(offset, size) of each piece of ``model``: at its tensors, else every LARGEST bytes."""
    size = model.stat().st_size
    try:
        cuts = boundaries(model)
    except GgufLayoutError as exc:
        log.info("%s: cut at fixed sizes (%s)", model, exc)
        cuts = []
    return spans(cuts, size, small=SMALL, largest=LARGEST)


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


def model_digests(model: Path) -> ModelDigests:
    """The sha256 and pieces of ``model`` from one read."""
    whole = hashlib.sha256()
    pieces = []
    for piece, data in digest_pieces(model, cut(model)):
        whole.update(data)
        pieces.append(piece)
    return ModelDigests(whole.hexdigest(), tuple(pieces))


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
            return ModelDigests(
                entry["sha256"],
                tuple(ModelPiece(int(o), int(s), str(d)) for o, s, d in entry["pieces"]),
            )
        except (ValueError, KeyError, TypeError):
            return None

    def put(self, model: Path, found: ModelDigests, at: float) -> None:
        pieces = [[piece.offset, piece.size, piece.digest] for piece in found.pieces]
        self.texts.put(
            self.key(model), json.dumps({"sha256": found.sha256, "pieces": pieces, "at": at})
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
    sources: dict[
        str, tuple[str, int, int]
    ]  # piece piece sha256 -> (model sha256, offset, model size)
    arrived: dict[str, int]  # work dir file -> size
    done: tuple[tuple[str, int], ...]  # pieces checked into the part, in order


def prologue_step(layout: Layout, work: str) -> Step:
    return Step(PROLOGUE_SCRIPT, (layout.root, work), "listing the device's models")


def parse_prologue(result: RemoteResult) -> DeviceModels:
    stored, lists, arrived, done = sections(
        result.text().splitlines(), 4, what="listing the device's models"
    )
    sizes = sizes_of(stored)
    sources: dict[str, tuple[str, int, int]] = {}
    model, offset = "", 0
    for line in lists:
        if line.startswith("= "):
            model, offset = line[2:], 0
            continue
        digest, _, size = line.partition(" ")
        if size.isdigit() and f"{model}.gguf" in sizes:
            sources.setdefault(digest, (model, offset, sizes[f"{model}.gguf"]))
            offset += int(size)
    checked = tuple(
        (digest, int(size)) for digest, _, size in (line.partition(" ") for line in done) if size
    )
    return DeviceModels(sizes, sources, sizes_of(arrived), checked)


@dataclass
class Transfer:
    """The state of one model's transfer while its batches go out."""

    remote: Remote
    layout: Layout
    work: str  # the device work dir
    run_check: Callable[[Step], RemoteResult]  # runs a step (renewing the device lock)
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
) -> ModelDigests:
    """Send what the device lacks of ``model`` (cut as ``layout`` says) into the work dir and
    check it into its part; returns the model's digests (``known``, or read now).

    PieceMismatch: a piece did not check out (what did before it stays in the part)."""
    transfer.stop, transfer.checks = threading.Event(), []  # a second pass starts afresh
    pieces = list(known.pieces) if known else None
    done = list(device.done)
    prefix = _checked_prefix(done, pieces, model, layout) if done else 0
    done = done[:prefix]
    part_size = sum(size for _, size in done)
    if prefix < len(device.done) or device.arrived.get("part", 0) != part_size:
        # another file's pieces, or bytes a cut left between appending a piece and listing it
        transfer.remote.script(
            TRIM_SCRIPT,
            [transfer.work, str(part_size), str(prefix)],
            what="trimming a partial model to its checked pieces",
        )
    transfer.resumed = part_size
    batches: queue.Queue[tuple[Path, list[str], int] | BaseException | None] = queue.Queue(1)
    result: list[ModelDigests] = []
    producer = threading.Thread(
        target=_produce,
        args=(model, layout, pieces, prefix, device, reuse, transfer, batches, result),
        daemon=True,
    )
    producer.start()
    pipelined = isinstance(transfer.remote.transport, TreePush)
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


def _checked_prefix(
    done: list[tuple[str, int]],
    pieces: list[ModelPiece] | None,
    model: Path,
    layout: list[tuple[int, int]],
) -> int:
    """How many of the part's pieces are this model's first pieces."""
    if pieces is None:
        pieces = [piece for piece, _ in _limited(digest_pieces(model, layout), len(done))]
    count = 0
    for (digest, size), piece in zip(done, pieces, strict=False):
        if (digest, size) != (piece.digest, piece.size):
            break
        count += 1
    return count


def _limited(
    items: Iterator[tuple[ModelPiece, bytes]], count: int
) -> Iterator[tuple[ModelPiece, bytes]]:
    for index, item in enumerate(items):
        if index >= count:
            return
        yield item


def _produce(
    model: Path,
    layout: list[tuple[int, int]],
    pieces: list[ModelPiece] | None,
    prefix: int,
    device: DeviceModels,
    reuse: bool,
    transfer: Transfer,
    batches: queue.Queue[tuple[Path, list[str], int] | BaseException | None],
    result: list[ModelDigests],
) -> None:
    """Hash (unless ``pieces`` are known) and stage the pieces after the first ``prefix``, a
    batch at a time; the last item is None, or the exception that stopped it."""
    try:
        where = MEMORY_STAGE if os.access(MEMORY_STAGE, os.W_OK) else Path(tempfile.gettempdir())
        sweep_stages(where)
        whole = hashlib.sha256() if pieces is None else None
        found: list[ModelPiece] = []
        in_part: dict[
            str, int
        ] = {}  # piece sha256 -> offset in the part (pieces checked in already)
        offset = 0
        staged: Path | None = None
        plan: list[str] = []
        batch_bytes = 0
        number = 0
        for index, (piece, data) in enumerate(_pieces(model, layout, pieces)):
            if transfer.stop.is_set():
                return
            found.append(piece)
            if whole is not None:
                whole.update(data)
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
            in_part.setdefault(piece.digest, offset)
            offset += piece.size
            if staged is not None and (batch_bytes >= BATCH or len(plan) >= 4096):
                number += 1
                batches.put(_close_batch(staged, plan, number, batch_bytes))
                staged, plan, batch_bytes = None, [], 0
        if staged is not None:
            number += 1
            batches.put(_close_batch(staged, plan, number, batch_bytes))
        sha256 = whole.hexdigest() if whole is not None else ""
        result.append(ModelDigests(sha256, tuple(found)))
        batches.put(None)
    except BaseException as exc:  # handed to the sending thread, which raises it
        batches.put(exc)


def _pieces(
    model: Path, layout: list[tuple[int, int]], pieces: list[ModelPiece] | None
) -> Iterator[tuple[ModelPiece, bytes]]:
    """Pieces with their bytes: hashed now, or known (then no bytes: read when staged)."""
    if pieces is None:
        yield from digest_pieces(model, layout)
        return
    for piece in pieces:
        yield piece, b""


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
        return f"c {name} part {offset - in_part[piece.digest]} {offset}", 0
    if reuse and piece.digest in device.sources:
        model_sha, at, model_size = device.sources[piece.digest]
        transfer.reused += piece.size
        return f"c {name} {model_sha} {model_size - at} {offset}", 0
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
    if isinstance(transport, TreePush):
        transport.push_tree(staged, transfer.work)
        return
    for name in names:
        transport.push(staged / name, posixpath.join(transfer.work, name))


def _check(transfer: Transfer, step: Step) -> None:
    result = transfer.run_check(step)
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
    """Store a GGUF model as models/<sha256>.gguf (sending only the pieces the device lacks) and
    point models/<name> at it (waiting for the device lock like deploy).

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
            lambda step: lock.refresh_then([step], timeout=VERIFY_TIMEOUT)[0],
            on_progress,
            model.name,
            size,
        )
        sha = known.sha256 if known else ""
        present = splits.present(found.sizes) if splits else f"{sha}.gguf" in found.sizes
        if not present:
            sha = _send_model(transfer, model, pieces, found, known, digests, splits)
        link = posixpath.join(layout.models, name)
        if name != f"{sha}.gguf":
            point(remote, layout, link, f"{sha}.gguf")
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
    """Send the pieces the device lacks, check them into the part, store it (or its splits); the
    model's sha256.

    A piece that fails its check on the device (a damaged transfer, a damaged model a piece was
    copied from, a model file that changed since its digests were cached) makes a second pass
    that reads the file afresh and copies nothing out of other models."""
    if splits and not splits.needs_part(found.sizes):
        splits.store(transfer, found.sizes)
        return splits.sha256
    if splits and known:  # the part holds only the pieces of the splits the device lacks
        wanted = splits.needed([(p.offset, p.size) for p in known.pieces], found.sizes)
        known = ModelDigests(known.sha256, tuple(known.pieces[i] for i in wanted))
        transfer.total = sum(piece.size for piece in known.pieces)
    at = time.time()
    try:
        got = push_pieces(transfer, model, pieces, found, known, reuse=True)
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
    step = store_step(transfer.layout, transfer.work, transfer.total, sha)
    result = transfer.run_check(step)
    if result.returncode == BAD_PIECE:
        raise DeviceError(
            f"{transfer.remote.address}: {model.name} has the wrong size on the device after all "
            f"its pieces checked out ({result.text().strip()}, expected {transfer.total})",
            hint="rerun: the pieces that checked out are kept",
        )
    transfer.remote.checked([step], [result])
    return sha


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
