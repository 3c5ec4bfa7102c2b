"""``models push --split``: a model kept on the device as GGUF splits (:mod:`ggufsplit`), each
split once, so quant variants that share tensors share their files.

Layout added under ``ROOT/models`` (see :mod:`kzbuild.device.modelpush` for the rest)::

    <split-sha256>.gguf                 each split, named by its content (verify checks it)
    .pieces/<split-sha256>              its pieces: a later push copies shared tensors out of it
    .splits/<sha256>                    the model's splits in order, one "sha256 size" line each
    <sha256>-0000i-of-0000N.gguf        hard links to the splits: what llama.cpp opens
    <sha256>.gguf -> <sha256>-00001-of-0000N.gguf, and <name> -> <sha256>.gguf as for any model

The model travels as models push sends any model: its pieces the device lacks go over the cable,
the rest is copied on the device out of the splits it holds, every piece is checked against its
sha256, and the checked pieces make the model's file in the work dir. Then one device command
cuts from that file each split the device lacks (from the last to the first, shortening the file
behind it, so the work dir holds at most one model plus one split): the split's header, sent
from the host, and the split's tensor data, its range of the file; the split is checked against
the sha256 the host computed before it is stored. A split the device holds already is linked,
not written again. The first split's hard link is made last: the model is stored when it exists.
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
import shutil
import tempfile
from collections.abc import Callable, Collection, Sequence
from pathlib import Path, PurePosixPath
from typing import Protocol

from kzbuild.adapters.files import TextCache
from kzbuild.device.base import RemoteResult, Transport, TreePush
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
# no part: every split with tensor data is on the device), $5 = the first split's name. The work
# dir holds "splits" (a "SHA END SIZE" line per split to store, the last first: its header h-SHA,
# then the SIZE bytes of the part that end at byte END), each split's piece list l-SHA,
# "manifest" and "links" ("SHA NAME" lines, the first split's last). Exit 3: the part has the
# wrong size ("size N") or a split did not match its sha256 ("bad SHA").
STORE_SCRIPT = (
    'cd "$1" || exit 1; m=$2; if [ "$4" != - ]; then s=$(stat -c %s part) || exit 1; '
    '[ "$s" = "$4" ] || { echo "size $s"; exit 3; }; fi; '
    'while read -r d at n; do [ -f "$m/$d.gguf" ] && continue; '
    'if [ "$n" = 0 ]; then h=$(tee s.kz < "h-$d" | sha256sum) || exit 1; '
    'else truncate -s "$at" part && h=$( { cat "h-$d"; tail -c "$n" part; } | tee s.kz | '
    "sha256sum) || exit 1; fi; "
    '[ "${h%% *}" = "$d" ] || { rm -f s.kz; echo "bad $d"; exit 3; }; '
    'chmod 644 s.kz && mv -f "l-$d" "$m/.pieces/$d" && mv -f s.kz "$m/$d.gguf" || exit 1; '
    "done < splits; "
    'mkdir -p "$m/.splits" && mv -f manifest "$m/.splits/$3" && '
    'ln -sf "$5" "$m/.kz-$3.gguf" && mv -f "$m/.kz-$3.gguf" "$m/$3.gguf" || exit 1; '
    'while read -r d n; do ln -f "$m/$d.gguf" "$m/.kz-$n" && mv -f "$m/.kz-$n" "$m/$n" '
    '|| exit 1; done < links; cd .. && rm -rf "$1"'
)


# $1 = the models dir. For each split model: "= SHA", then "LINK SPLIT" for each of its split
# links that is not the same file as its split SPLIT.gguf (missing, or another file).
LINKS_SCRIPT = (
    'cd "$1" || exit 1; for f in .splits/*; do [ -f "$f" ] || continue; s=${f##*/}; '
    'echo "= $s"; n=$(wc -l < "$f"); i=0; while read -r d size; do i=$((i+1)); '
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


def check_links(remote: Remote, layout: Layout) -> tuple[set[str], list[Damage]]:
    """The split models on the device, and each of their links that is not its split (their
    splits are checked as any models/<sha256>.gguf is, against its name)."""
    text = remote.script(LINKS_SCRIPT, [layout.models], what="checking the split models' links")
    models: set[str] = set()
    damage = []
    model = ""
    for line in text.text().splitlines():
        if line.startswith("= "):
            model = line[2:]
            models.add(model)
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
    return models, damage


class WorkDir(Protocol):
    """Where a model is put together on the device (models push's transfer)."""

    remote: Remote
    layout: Layout
    work: str  # the work dir in incoming/

    @property
    def run_check(self) -> Callable[[Step], RemoteResult]:
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

    def store(
        self, work: WorkDir, stored: Collection[str], *, part: bool, sha256: str | None = None
    ) -> None:
        """Send the headers and lists, cut the splits the device lacks out of the work dir's part
        (``part``: it holds the model, whose sha256 the transfer found to be ``sha256``) and store
        them, the manifest and the links."""
        remote = work.remote
        if sha256 not in (None, self.sha256):
            self.forget()
            raise DeviceError(
                f"{self.model} changed while it was being pushed", hint="push it again"
            )
        lacking = self.lacking(stored)
        staged = Path(tempfile.mkdtemp(prefix="kz-splits-"))
        try:
            lines = []
            for index in reversed(lacking):
                split = self.splits[index]
                sha, pieces = self.digests[index]
                (staged / f"h-{sha}").write_bytes(split.header)
                (staged / f"l-{sha}").write_text("".join(f"{d} {s}\n" for d, s in pieces))
                lines.append(f"{sha} {split.offset + split.size} {split.size}\n")
            (staged / "splits").write_text("".join(lines))
            sizes = [len(split.header) + split.size for split in self.splits]
            (staged / "manifest").write_text(
                "".join(
                    f"{sha} {size}\n" for (sha, _), size in zip(self.digests, sizes, strict=True)
                )
            )
            links = [
                f"{sha} {name}\n" for (sha, _), name in zip(self.digests, self.names, strict=True)
            ]
            (staged / "links").write_text("".join(links[1:] + links[:1]))
            _push_dir(remote, staged, work.work)
        finally:
            shutil.rmtree(staged, ignore_errors=True)
        size = str(self.model.stat().st_size) if part else "-"
        step = Step(
            STORE_SCRIPT,
            (work.work, work.layout.models, self.sha256, size, self.names[0]),
            "storing the model's splits",
        )
        result = work.run_check(step)
        if result.returncode == BAD_SPLIT:
            self.forget()
            raise DeviceError(
                f"{remote.address}: a split of {self.model.name} did not check out on the device "
                f"({result.text().strip()})",
                hint="rerun: the pieces that checked out are kept",
            )
        remote.checked([step], [result])


def _push_dir(remote: Remote, staged: Path, work: str) -> None:
    transport = remote.transport
    if isinstance(transport, TreePush):
        transport.push_tree(staged, work)
        return
    for path in sorted(staged.iterdir()):
        transport.push(path, posixpath.join(work, path.name))


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
    return [len(split.header), *(len(split.header) + at for at in split.starts)]


def _cached(text: str | None, count: int) -> list[tuple[str, list[tuple[str, int]]]] | None:
    try:
        found = json.loads(text) if text else None
        if not isinstance(found, list) or len(found) != count:
            return None
        return [(str(sha), [(str(d), int(s)) for d, s in pieces]) for sha, pieces in found]
    except (ValueError, TypeError):
        return None


def tool_path(transport: Transport, root: str, model: str) -> str:
    """The path to give llama.cpp's tools for ``model`` (relative to the device ``root``): a
    model stored as splits is opened by its first split's own name, from which llama.cpp finds
    the others; any other path is given as it is."""
    resolved = transport.run(["readlink", "-f", model], cwd=root)
    path = resolved.text().strip()
    return path if resolved.ok and FIRST_SPLIT_RE.match(PurePosixPath(path).name) else model
