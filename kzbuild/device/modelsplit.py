"""``models push --split``: a model kept on the device as GGUF splits (:mod:`ggufsplit`), each
split once, so quant variants that share tensors share their files.

Layout added under ``ROOT/models`` (see :mod:`kzbuild.device.modelpush` for the rest)::

    <split-sha256>.gguf                 each split, named by its content (verify checks it)
    .pieces/<split-sha256>              its pieces: a later push copies shared tensors out of it
    .splits/<sha256>                    the model's splits in order, one "sha256 size" line each
    <sha256>-0000i-of-0000N.gguf        symlinks to the splits: what llama.cpp opens
    <sha256>.gguf -> <sha256>-00001-of-0000N.gguf, and <name> -> <sha256>.gguf as for any model

The model's pieces that hold data of a split the device lacks travel as models push sends any
model's pieces: those the device lacks go over the cable, the rest is copied on the device out of
the files it holds, every piece is checked against its sha256, and the checked pieces make the part
in the work dir. Then one device command (:data:`STORE_SCRIPT`, a few processes however many
splits) cuts from the part each split the device lacks (from the last to the first, shortening the
part behind it, so the work dir holds at most the part plus one split): the split's header, sent
from the host in one tar, and the split's tensor data, its range of the part; the splits are
checked against the sha256s the host computed before they are stored. A split the device holds
already is linked, not written again. The first split's link is made last: the model is stored
when it exists. Each split the device lacks costs two processes there (``truncate``, ``tail -c``),
the rest a few in all.
"""

from __future__ import annotations

import io
import json
import logging
import posixpath
import re
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Protocol

from kzbuild.adapters.files import TextCache
from kzbuild.device.base import ByteSource, RemoteResult
from kzbuild.device.ggufcut import GgufLayoutError
from kzbuild.device.ggufsplit import plan, split_name, split_pieces
from kzbuild.device.steps import Step
from kzbuild.device.store import Layout, Remote
from kzbuild.errors import ConfigError, DeviceError
from kzbuild.model.gguflayout import GgufSplit
from kzbuild.model.integrity import MISSING, Damage

log = logging.getLogger(__name__)

SPLITS_DIR = ".splits"
BAD_SPLIT = 3
CACHE_LIMIT = 200
FIRST_SPLIT_RE = re.compile(r"^[0-9a-f]{64}-00001-of-[0-9]{5}\.gguf$")
SPLIT_LINK_RE = re.compile(r"^[0-9a-f]{64}-[0-9]{5}-of-[0-9]{5}\.gguf$")

# $1 = the work dir, $2 = the models dir, $3 = the model's sha256, $4 = the model's size ("-":
# no part, every split the device lacks is a header alone). bundle.tar in the work dir holds
# new/SHA.gguf (the header of each split to store), lists/SHA (its pieces), "splits" (a "SHA END
# SIZE" line per split with tensor data, the last first: its data are the SIZE bytes of the part
# that end at byte END), "manifest" and links.tar (the model's names, the first split's last).
# The part is cut behind each split (so the work dir holds at most the model plus one split) and
# "done" goes first: a resumed push checks the model into the part again (copying what it can out
# of the splits stored). The splits are checked with one sha256sum; those that match are stored.
# Exit 3: the part has the wrong size ("size N") or a split did not match its sha256 ("bad SHA",
# it is removed).
STORE_SCRIPT = (
    'w=$1 m=$2 sha=$3 size=$4; cd "$w" || exit 1; umask 022; tar -x -f bundle.tar || exit 1; '
    'if [ "$size" != - ]; then s=$(stat -c %s part) || exit 1; '
    '[ "$s" = "$size" ] || { echo "size $s"; exit 3; }; rm -f done || exit 1; fi; '
    'while read -r d at n; do truncate -s "$at" part && tail -c "$n" part >> "new/$d.gguf" '
    '|| exit 1; done < splits; cd new || exit 1; set -- *; if [ -e "$1" ]; then '
    'sha256sum -- "$@" > ../sums || exit 1; bad=; while read -r h f; do '
    '[ "$h.gguf" = "$f" ] || { rm -f "$f"; echo "bad ${f%.gguf}"; bad=1; }; done < ../sums; '
    'set -- *; [ ! -e "$1" ] || mv -f -- "$@" "$m/" || exit 1; fi; cd ../lists || exit 1; '
    'set -- *; if [ -e "$1" ]; then mv -f -- "$@" "$m/.pieces/" || exit 1; fi; cd .. || exit 1; '
    '[ -z "$bad" ] || exit 3; mkdir -p "$m/.splits" && mv -f manifest "$m/.splits/$sha" && '
    'tar -x -f links.tar -C "$m" && cd .. && rm -rf "$w"'
)


# $1 = the models dir. For each split model: "= SHA", then for each of its splits "- SPLIT", and
# "LINK SPLIT" when its link is not the same file as SPLIT.gguf (missing, or another file).
LINKS_SCRIPT = (
    'cd "$1" || exit 1; for f in .splits/*; do [ -f "$f" ] || continue; s=${f##*/}; '
    'echo "= $s"; n=$(wc -l < "$f"); i=0; while read -r d size; do i=$((i+1)); echo "- $d"; '
    'l=$(printf "%s-%05d-of-%05d.gguf" "$s" "$i" "$n"); '
    '[ "$l" -ef "$d.gguf" ] || echo "$l $d"; done < "$f"; done; true'
)


def check_split_name(name: str) -> None:
    """Refuse a readable name that is a split model's link (the store's own)."""
    if SPLIT_LINK_RE.match(name):
        raise ConfigError(
            f"bad model name '{name}': names of the form <sha256>-0000i-of-0000N.gguf are the "
            "store's own"
        )


def holds_splits(stored: Collection[str]) -> bool:
    """Whether the models dir (its file names) holds a model stored as splits."""
    return any(FIRST_SPLIT_RE.match(name) for name in stored)


def check_links(remote: Remote, layout: Layout) -> tuple[set[str], set[str], list[Damage]]:
    """The split models on the device, their splits, and each of their links that is not its
    split (the splits are checked as any models/<sha256>.gguf is, against its name)."""
    text = remote.script(LINKS_SCRIPT, [layout.models], what="checking the split models' links")
    models: set[str] = set()
    splits: set[str] = set()
    damage = []
    model = ""
    for line in text.text().splitlines():
        if line.startswith("= "):
            model = line[2:]
            models.add(model)
        elif line.startswith("- "):
            splits.add(line[2:])
        elif model and " " in line:
            link, split = line.split(" ", 1)
            damage.append(
                Damage(
                    "model",
                    f"{model}.gguf",
                    f"models/{link}",
                    f"the same file as models/{split}.gguf",
                    f"{MISSING} or another file",
                )
            )
    return models, splits, damage


class WorkDir(Protocol):
    """Where a model is put together on the device (models push's transfer)."""

    remote: Remote
    layout: Layout
    work: str  # the work dir in incoming/
    sent: int  # bytes sent so far

    @property
    def run_check(self) -> Callable[[Step, ByteSource | None], RemoteResult]:
        """Runs a step, renewing the device lock."""
        ...


class SplitModel:
    """A model cut into splits on the host: each split's sha256 and pieces (from one read of the
    model, kept in a cache by the file's stat data like the model's own digests)."""

    def __init__(
        self,
        model: Path,
        sha256: str,
        splits: Sequence[GgufSplit],
        digests: Sequence[tuple[str, list[tuple[str, int]]]],
        forget: Callable[[], None],
    ) -> None:
        self.model = model
        self.sha256 = sha256
        self.splits = tuple(splits)
        self.digests = tuple(digests)
        self.forget = forget  # drops the cached digests

    @property
    def names(self) -> list[str]:
        return [
            split_name(self.sha256, index, len(self.splits)) for index in range(len(self.splits))
        ]

    def lacking(self, stored: Collection[str]) -> list[int]:
        """The indexes of the splits ``stored`` (the models dir's file names) lacks."""
        have = set(stored)
        return [i for i, (sha, _) in enumerate(self.digests) if f"{sha}.gguf" not in have]

    def present(self, stored: Collection[str]) -> bool:
        """Whether the device stores this model already (whole, or its first split's link)."""
        return f"{self.sha256}.gguf" in stored or self.names[0] in stored

    def needs_part(self, stored: Collection[str]) -> bool:
        """Whether a split the device lacks holds tensor data (which travels as the model)."""
        return any(self.splits[i].size for i in self.lacking(stored))

    def needed(self, pieces: Sequence[tuple[int, int]], stored: Collection[str]) -> list[int]:
        """Which of the model's ``pieces`` (offset, size) hold data of a split the device lacks:
        only those go into the part."""
        ranges = [(self.splits[i].offset, self.splits[i].size) for i in self.lacking(stored)]
        return [
            index
            for index, (offset, size) in enumerate(pieces)
            if any(start < offset + size and offset < start + length for start, length in ranges)
        ]

    def _bundle(self, path: Path, lacking: Sequence[int], part: Sequence[tuple[int, int]]) -> None:
        """The tar :data:`STORE_SCRIPT` unpacks for the splits ``lacking``."""
        now = int(time.time())
        names = self.names
        links = io.BytesIO()
        with tarfile.open(fileobj=links, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            entries = [(f"{self.sha256}.gguf", names[0])]
            entries += [
                (name, f"{sha}.gguf") for name, (sha, _) in zip(names, self.digests, strict=True)
            ][1:]
            entries.append((names[0], f"{self.digests[0][0]}.gguf"))
            for name, target in entries:
                _add(tar, name, b"", now, kind=tarfile.SYMTYPE, target=target)
        lines = [
            f"{self.digests[i][0]} {_in_part(part, self.splits[i].offset + self.splits[i].size)} "
            f"{self.splits[i].size}\n"
            for i in reversed(lacking)
            if self.splits[i].size
        ]
        sizes = [len(split.header) + split.size for split in self.splits]
        manifest = [f"{sha} {size}\n" for (sha, _), size in zip(self.digests, sizes, strict=True)]
        with tarfile.open(path, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for dir_name in ("new", "lists"):
                _add(tar, dir_name, b"", now, kind=tarfile.DIRTYPE)
            for index in lacking:
                sha, pieces = self.digests[index]
                _add(tar, f"new/{sha}.gguf", self.splits[index].header, now)
                _add(tar, f"lists/{sha}", "".join(f"{d} {s}\n" for d, s in pieces).encode(), now)
            _add(tar, "splits", "".join(lines).encode(), now)
            _add(tar, "manifest", "".join(manifest).encode(), now)
            _add(tar, "links.tar", links.getvalue(), now)

    def store(
        self,
        work: WorkDir,
        stored: Collection[str],
        *,
        part: Sequence[tuple[int, int]] = (),
        sha256: str | None = None,
    ) -> None:
        """Send the headers and lists, cut the splits the device lacks out of the work dir's part
        (which holds ``part``, the model's pieces (offset, size) one after the other; none: no
        part) and store them, the manifest and the links. ``sha256``: the model's, as the
        transfer found it."""
        remote = work.remote
        if sha256 not in (None, self.sha256):
            self.forget()
            raise DeviceError(
                f"{self.model} changed while it was being pushed", hint="push it again"
            )
        bundle = Path(tempfile.mkdtemp(prefix="kz-splits-")) / "bundle.tar"
        try:
            self._bundle(bundle, self.lacking(stored), part)
            remote.transport.push(bundle, posixpath.join(work.work, bundle.name))
            work.sent += bundle.stat().st_size
        finally:
            shutil.rmtree(bundle.parent, ignore_errors=True)
        size = str(sum(length for _, length in part)) if part else "-"
        step = Step(
            STORE_SCRIPT,
            (work.work, work.layout.models, self.sha256, size),
            "storing the model's splits",
        )
        result = work.run_check(step, None)
        if result.returncode == BAD_SPLIT:
            self.forget()
            raise DeviceError(
                f"{remote.address}: a split of {self.model.name} did not check out on the device "
                f"({result.text().strip()})",
                hint="rerun: the pieces that checked out are kept",
            )
        remote.checked([step], [result])


def _in_part(part: Sequence[tuple[int, int]], end: int) -> int:
    """Where byte ``end`` of the model (the end of a split's data) is in the part, which holds the
    model's pieces ``part`` (offset, size) one after the other."""
    at = 0
    for offset, size in part:
        if offset < end <= offset + size:
            return at + end - offset
        at += size
    raise ValueError(f"byte {end} of the model is not in the part")


def _add(
    tar: tarfile.TarFile,
    name: str,
    data: bytes,
    now: int,
    *,
    kind: bytes = tarfile.REGTYPE,
    target: str = "",
) -> None:
    entry = tarfile.TarInfo(name)
    entry.type, entry.linkname, entry.mtime = kind, target, now
    entry.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    entry.size = len(data) if kind == tarfile.REGTYPE else 0
    tar.addfile(entry, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def split_model(
    model: Path, sha256: str, key: str, cache: Path | None, *, small: int, largest: int
) -> SplitModel | None:
    """``model`` cut into splits with their digests (None, and a log line, when it cannot be cut:
    it is then stored whole). ``key``: the file's stat data, the cache's key."""
    try:
        splits = plan(model)
    except GgufLayoutError as exc:
        log.warning("%s cannot be split (%s): it is stored whole", model, exc)
        return None
    texts = TextCache(cache, limit=CACHE_LIMIT) if cache else None
    entry = f"{key}:{small}:{largest}:{sha256}"
    digests = _cached(texts.get(entry) if texts else None, len(splits))
    if digests is None:
        digests = [
            split_pieces(model, split, split_cuts(split), small=small, largest=largest)
            for split in splits
        ]
        if texts:
            texts.put(entry, json.dumps(digests))

    def forget() -> None:
        if texts:
            texts.put(entry, "")

    return SplitModel(model, sha256, splits, digests, forget)


def split_cuts(split: GgufSplit) -> list[int]:
    """Where a split's pieces may start: after its header, and at each of its tensors."""
    return sorted({len(split.header), *(len(split.header) + at for at in split.starts)})


def _cached(text: str | None, count: int) -> list[tuple[str, list[tuple[str, int]]]] | None:
    try:
        found = json.loads(text) if text else None
        if not isinstance(found, list) or len(found) != count:
            return None
        return [(str(sha), [(str(d), int(s)) for d, s in pieces]) for sha, pieces in found]
    except (ValueError, TypeError):
        return None
