"""Patch files of the stack: parse them, check their trailers, lint the stack, and edit it.

Each patch is a ``git format-patch`` mbox with full index lines and a trailer block from a
fixed vocabulary (see ``kzbuild.model.patch``). Edits of the series (drop, move) keep its
comments and write it atomically; dropped patches are recorded in ``DROPPED.yaml``.
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timezone
from email.header import decode_header, make_header
from pathlib import Path

import yaml

from kzbuild.adapters import yamlconf
from kzbuild.adapters.files import write_atomic
from kzbuild.adapters.gitcmd import KZ_EMAIL
from kzbuild.errors import ConfigError
from kzbuild.model.devicetest import DeviceTest
from kzbuild.model.patch import (
    DROP_WHEN,
    KZ_DEVICE_TEST,
    KZ_EXPECT,
    KZ_TRAILERS,
    REPEATABLE_TRAILERS,
    REQUIRED_TRAILERS,
    STATUS_KINDS,
    UPSTREAM_PR,
    UPSTREAM_STATUS,
    DropRecord,
    Expectation,
    FileChange,
    Hunk,
    Patch,
    Trailer,
)
from kzbuild.model.stack import Problem, Series, SeriesEntry
from kzbuild.source.stack.series import (
    parse_series,
    read_series,
    reorder_series,
    series_files,
    unlisted_patches,
)

DROPPED_LOG = "DROPPED.yaml"
# Every diff kzbuild writes or compares is made with these, whatever the local git config says,
# so exported patches and patch-ids are the same on every machine.
DIFF_OPTIONS = (
    "--diff-algorithm=myers",
    "--find-renames=50%",
    "--unified=3",
    "--inter-hunk-context=0",
    "--indent-heuristic",
    "--full-index",
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--src-prefix=a/",
    "--dst-prefix=b/",
)
DROP_KEYS = ("patch", "subject", "date", "reason", "upstream", "upstream_status")
DROP_REQUIRED = ("patch", "date", "reason")

# --- patch files ---

MBOX_FROM = re.compile(r"^From [0-9a-f]{40} ")
TRAILER = re.compile(r"^([A-Za-z0-9][A-Za-z0-9-]*):\s*(.*)$")
HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
FULL_INDEX = re.compile(r"^index ([0-9a-f]{40})\.\.([0-9a-f]{40})( \d+)?$")
SHA = re.compile(r"^[0-9a-f]{7,40}$")
URL = re.compile(r"^https?://\S+$")
PATCH_PREFIX = re.compile(r"^\[[^\]]*PATCH[^\]]*\]\s*")  # what git am strips from a subject


def is_patch_start(line: str) -> bool:
    """Where git mailinfo ends the message: a ``---`` line or the first diff header."""
    return line.rstrip() == "---" or line.startswith(("diff --git ", "Index: "))


@dataclass
class _PatchReader:
    """One pass over a format-patch file, collecting its parts and its problems."""

    path: Path
    lines: list[str]
    problems: list[Problem] = field(default_factory=list)
    crlf: list[int] = field(default_factory=list)

    def problem(self, line: int | None, message: str) -> None:
        self.problems.append(Problem(self.path, line, message))

    def text(self, number: int) -> str:
        """Line ``number`` (1-based) without its line ending, noting CRLF damage outside hunks."""
        raw = self.lines[number - 1]
        if raw.endswith("\r"):
            self.crlf.append(number)
            return raw[:-1]
        return raw


def read_patch(path: Path, name: str | None = None) -> Patch:
    """Parse a patch file; what makes it malformed (bytes that are not UTF-8 too) is listed in
    ``Patch.problems``."""
    data = yamlconf.read_bytes(path)
    patch = parse_patch(data.decode("utf-8", errors="replace"), path, name)
    not_utf8 = yamlconf.utf8_error(data, path)
    if not_utf8 is None:
        return patch
    return replace(patch, problems=patch.problems + (problem_from(not_utf8, path),))


def parse_patch(raw: str, path: Path, name: str | None = None) -> Patch:
    """Parse the text of a patch file (``path`` names it in problems)."""
    lines = raw.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    reader = _PatchReader(path, lines)
    number = 1
    if not lines or not MBOX_FROM.match(reader.text(1)):
        reader.problem(
            1, "not a git format-patch mbox: the first line must be 'From <40-hex sha> <date>'"
        )
    else:
        number = 2
    headers, number = _read_headers(reader, number)
    for key in ("From", "Subject"):
        if key not in headers:
            reader.problem(1, f"the mail header has no '{key}:' line")
    body_start = number
    while number <= len(lines) and not is_patch_start(reader.text(number)):
        number += 1
    body = [reader.text(n) for n in range(body_start, number)]
    trailers = _read_trailers(reader, body, body_start)
    files = _read_diff(reader, number)
    if not files:
        reader.problem(None, "the patch changes nothing (no diff): git am refuses empty patches")
    if reader.crlf:
        more = f" and {len(reader.crlf) - 1} more" if len(reader.crlf) > 1 else ""
        reader.problem(
            reader.crlf[0],
            f"CRLF line ending{more} outside the diff's content: the file was damaged; convert it "
            "back to LF",
        )
    return Patch(
        name=name or path.name,
        path=path,
        author=headers.get("From", ""),
        date=headers.get("Date", ""),
        subject=PATCH_PREFIX.sub("", headers.get("Subject", "")),
        body="\n".join(body).strip("\n"),
        trailers=tuple(trailers),
        files=tuple(files),
        problems=tuple(reader.problems),
    )


def _read_headers(reader: _PatchReader, number: int) -> tuple[dict[str, str], int]:
    headers: dict[str, str] = {}
    header_lines: dict[str, int] = {}
    key = None
    while number <= len(reader.lines):
        line = reader.text(number)
        number += 1
        if not line:
            break
        if line[0] in " \t" and key:
            headers[key] += " " + line.strip()
        elif ":" in line:
            key, value = line.split(":", 1)
            headers[key], header_lines[key] = value.strip(), number - 1
    decoded = {}
    for key, value in headers.items():
        try:
            decoded[key] = str(make_header(decode_header(value)))
        except (
            LookupError,
            UnicodeError,
            ValueError,
        ) as exc:  # an unknown charset, a broken =?..?= word
            reader.problem(
                header_lines[key],
                f"the '{key}:' header cannot be decoded ({exc}); it is shown as written",
            )
            decoded[key] = value
    return decoded, number


def _read_trailers(reader: _PatchReader, body: list[str], first_line: int) -> list[Trailer]:
    """The trailer block: the message's last paragraph, when it holds ``Key: value`` lines."""
    end = len(body)
    while end and not body[end - 1].strip():
        end -= 1
    start = end
    while start and body[start - 1].strip():
        start -= 1
    block = list(range(start, end))
    if not any(TRAILER.match(body[i]) for i in block):
        return []
    trailers: list[Trailer] = []
    for i in block:
        line, number = body[i], first_line + i
        match = TRAILER.match(line)
        if match:
            trailers.append(Trailer(match.group(1), match.group(2).strip(), number))
        elif line[:1] in (" ", "\t") and trailers:
            last = trailers[-1]
            trailers[-1] = Trailer(last.key, f"{last.value} {line.strip()}", last.line)
        else:
            reader.problem(number, "line in the trailer block is not a 'Key: value' trailer")
    return trailers


def _read_diff(reader: _PatchReader, number: int) -> list[FileChange]:
    lines = reader.lines
    files: list[FileChange] = []
    signed = False  # past the "-- " signature that ends format-patch output
    while number <= len(lines):
        line = reader.text(number)
        if MBOX_FROM.match(line):
            reader.problem(number, "a second patch starts here: keep one patch per file")
            break
        if line.startswith("diff --git ") and not signed:
            change, number = _read_file_change(reader, number)
            files.append(change)
            continue
        signed = signed or line == "-- "
        number += 1
    return files


def _read_file_change(reader: _PatchReader, start: int) -> tuple[FileChange, int]:
    lines = reader.lines
    header = reader.text(start)
    parts = header[len("diff --git ") :].split(" b/", 1)
    path = parts[1] if len(parts) == 2 else header.split()[-1]
    old_path: str | None = None
    index_line: int | None = None
    full_index = True
    preimage: str | None = None
    binary = False
    deleted = False
    number = start + 1
    hunks: list[Hunk] = []
    while number <= len(lines):
        line = reader.text(number)  # hunk content is read by _read_hunk; this is header text
        if line.startswith("diff --git ") or line == "-- " or MBOX_FROM.match(line):
            break
        if line.startswith("index "):
            index_line = number
            full = FULL_INDEX.match(line)
            full_index = bool(full)
            preimage = full.group(1) if full and full.group(1).strip("0") else None
        elif line.startswith(("rename from ", "copy from ")):
            old_path = line.split(" ", 2)[2]
        elif line.startswith(("rename to ", "copy to ")):
            path = line.split(" ", 2)[2]
        elif line.startswith("deleted file mode"):
            deleted = True
        elif line.startswith("--- ") and deleted and line[4:] != "/dev/null":
            path = line[4:].removeprefix("a/")
        elif line.startswith("+++ ") and line[4:] != "/dev/null":
            path = line[4:].removeprefix("b/")
        elif line.startswith(("Binary files ", "GIT binary patch")):
            binary = True
        elif match := HUNK.match(line):
            hunk, number = _read_hunk(reader, number, match)
            hunks.append(hunk)
            continue
        number += 1
    if index_line is not None and not full_index:
        reader.problem(
            index_line,
            "abbreviated index line: git am -3 needs full blob ids (format-patch --full-index)",
        )
    return FileChange(
        path, old_path, start, index_line, full_index, preimage, binary, tuple(hunks)
    ), number


def _read_hunk(reader: _PatchReader, number: int, match: re.Match[str]) -> tuple[Hunk, int]:
    old_start, old_count = int(match.group(1)), int(match.group(2) or "1")
    new_start, new_count = int(match.group(3)), int(match.group(4) or "1")
    header_line = number
    number += 1
    old_left, new_left = old_count, new_count
    added: list[str] = []
    removed: list[str] = []
    lines = reader.lines
    while number <= len(lines) and (
        old_left > 0 or new_left > 0 or lines[number - 1].startswith("\\")
    ):
        line = lines[number - 1]
        marker, content = line[:1], line[1:]
        if marker == " " or (line == "" and old_left and new_left):
            old_left, new_left = old_left - 1, new_left - 1
        elif marker == "-":
            removed.append(content)
            old_left -= 1
        elif marker == "+":
            added.append(content)
            new_left -= 1
        elif marker != "\\":
            reader.problem(
                header_line,
                f"hunk ends early (at line {number}): its @@ header counts more lines than follow",
            )
            break
        number += 1
    return Hunk(
        old_start,
        old_count,
        new_start,
        new_count,
        header_line,
        number - 1,
        tuple(added),
        tuple(removed),
    ), number


def hunk_text(patch: Patch, change: FileChange, hunk: Hunk) -> str:
    """A patch holding only ``hunk`` of ``change`` (its file header plus that hunk)."""
    lines = patch.path.read_bytes().decode("utf-8", errors="replace").split("\n")
    header = lines[change.line - 1 : change.hunks[0].line - 1]
    return "\n".join(header + lines[hunk.line - 1 : hunk.end]) + "\n"


def without_kz_trailers(patch: Patch) -> str:
    """The patch file as upstream would receive it: kzbuild's trailers removed, everything else
    (headers, message, other trailers such as Signed-off-by, the diff) byte for byte."""
    lines = patch.path.read_bytes().decode("utf-8", errors="replace").split("\n")
    drop = set()
    for trailer in patch.trailers:
        if trailer.key in KZ_TRAILERS:
            number = trailer.line
            drop.add(number)
            while number < len(lines) and lines[number][:1] in (
                " ",
                "\t",
            ):  # its continuation lines
                number += 1
                drop.add(number)
    kept = [line for number, line in enumerate(lines, 1) if number not in drop]
    # A trailer block left empty would leave blank lines before the "---" that ends the message;
    # the blank line that ends the mail headers stays.
    headers_end = next((i for i, line in enumerate(kept) if not line.strip()), len(kept))
    end = next(
        (i for i, line in enumerate(kept) if i > headers_end and is_patch_start(line.rstrip("\r"))),
        len(kept),
    )
    message_end = end
    while message_end > headers_end + 1 and not kept[message_end - 1].strip():
        message_end -= 1
    return "\n".join(kept[:message_end] + kept[end:])


MAILBOX = re.compile(r"^(.*?)\s*<([^<>\s]+@[^<>\s]+)>")
# reserved for examples and documentation (RFC 2606, 6761), and what git makes up without a config
PLACEHOLDER_DOMAIN = re.compile(
    r"(?:^|\.)(?:invalid|localhost|test|example\.(?:com|org|net))$|\(none\)$", re.IGNORECASE
)


def real_author(value: str) -> str | None:
    """``Name <email>`` of ``value`` when it names someone; None for a placeholder address."""
    match = MAILBOX.match(value.strip())
    if not match or not match.group(1).strip() or match.group(2) == KZ_EMAIL:
        return None
    if PLACEHOLDER_DOMAIN.search(match.group(2).rsplit("@", 1)[1]):
        return None
    return f"{match.group(1).strip()} <{match.group(2)}>"


def upstream_mbox(patch: Patch, user_ident: Callable[[], str | None]) -> str:
    """:func:`without_kz_trailers`, as ``git am`` wants it: the ``---`` line between message and
    diff, and the author from the patch's From:, else its Signed-off-by, else the user's git
    identity (``user_ident``); a placeholder address is never sent (ConfigError)."""
    signers = (t.value for t in patch.trailers if t.key == "Signed-off-by")
    author = (
        real_author(patch.author)
        or next(filter(None, map(real_author, signers)), None)
        or real_author(user_ident() or "")
    )
    if author is None:
        raise ConfigError(
            f"{patch.name}: its author '{patch.author}' is a placeholder "
            "and git config names no one",
            path=patch.path,
            hint="set From: in the patch, or git config user.name and user.email",
        )
    lines = without_kz_trailers(patch).split("\n")
    headers_end = next((i for i, line in enumerate(lines) if not line.strip()), len(lines))
    start = next(
        (
            i
            for i, line in enumerate(lines)
            if i > headers_end and is_patch_start(line.rstrip("\r"))
        ),
        len(lines),
    )
    if start < len(lines) and lines[start].rstrip("\r").rstrip() != "---":
        lines[start:start] = ["---"]
    header = next((i for i in range(headers_end) if lines[i].startswith("From: ")), None)
    if author != real_author(patch.author):  # else its own From: line stays byte for byte
        if header is None:
            lines.insert(1 if lines and lines[0].startswith("From ") else 0, f"From: {author}")
        else:
            lines[header] = f"From: {author}"
    return "\n".join(lines)


# --- trailers and lint ---


def trailer_problems(patch: Patch) -> list[Problem]:
    """Missing, duplicated, misspelt or malformed trailers of the agreed vocabulary."""
    problems: list[Problem] = []
    seen: dict[str, Trailer] = {}
    last_line = max((t.line for t in patch.trailers), default=None)
    for trailer in patch.trailers:
        if trailer.key in KZ_TRAILERS:
            if trailer.key in seen and trailer.key not in REPEATABLE_TRAILERS:
                problems.append(
                    Problem(
                        patch.path,
                        trailer.line,
                        f"{trailer.key} is given twice (first on line {seen[trailer.key].line})",
                    )
                )
                continue
            seen[trailer.key] = trailer
            message = trailer_value_problem(trailer.key, trailer.value)
            if message:
                problems.append(Problem(patch.path, trailer.line, message))
            continue
        close = difflib.get_close_matches(trailer.key, KZ_TRAILERS, n=1, cutoff=0.75)
        lowered = {k.lower(): k for k in KZ_TRAILERS}
        guess = lowered.get(trailer.key.lower()) or (close[0] if close else None)
        if guess or trailer.key.lower().startswith(("upstream-", "kz-", "drop-")):
            hint = f"; did you mean '{guess}'?" if guess else f"; known: {', '.join(KZ_TRAILERS)}"
            problems.append(
                Problem(patch.path, trailer.line, f"unknown trailer '{trailer.key}'{hint}")
            )
    for key in REQUIRED_TRAILERS:
        if key not in seen:
            problems.append(Problem(patch.path, last_line, f"missing trailer '{key}:'"))
    return problems


def trailer_value_problem(key: str, value: str) -> str | None:
    """What is wrong with one trailer of the vocabulary, or None."""
    if not value:
        return f"{key} is empty"
    if key == UPSTREAM_STATUS:
        kind, _, rest = value.partition(" ")
        rest = rest.strip()
        expected = STATUS_KINDS.get(kind)
        if expected is None:
            close = difflib.get_close_matches(kind, STATUS_KINDS, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            return f"Upstream-Status '{kind}' is not one of {', '.join(STATUS_KINDS)}{hint}"
        if expected == "nothing" and rest:
            return f"Upstream-Status {kind} takes nothing after it (got '{rest}')"
        if expected == "url" and not URL.match(rest):
            return f"Upstream-Status {kind} needs the URL of the upstream PR or mail (got '{rest}')"
        if expected == "sha" and not SHA.match(rest):
            return (
                f"Upstream-Status {kind} needs the upstream commit sha (7 to 40 hex; got '{rest}')"
            )
        if expected == "sha-or-url" and not (SHA.match(rest) or URL.match(rest)):
            return f"Upstream-Status {kind} needs an upstream sha or PR URL (got '{rest}')"
        if expected == "text" and not rest:
            return f"Upstream-Status {kind} needs a reason after it"
    elif key == UPSTREAM_PR and not URL.match(value):
        return f"Upstream-PR needs a URL (got '{value}')"
    elif key == DROP_WHEN and not SHA.match(value):
        return f"Drop-When needs an upstream commit sha (7 to 40 hex; got '{value}')"
    elif key == KZ_EXPECT:
        return expect_problem(value)
    elif key == KZ_DEVICE_TEST:
        return device_test_problem(value)
    return None


EXPECT = re.compile(
    r"^((?:pp\d+|tg\d+|pp\d+\+tg\d+)(?:@d\d+)?)\s+([+-]\d+(?:\.\d+)?)%\s+on\s+([A-Za-z0-9][A-Za-z0-9._-]*)$",
    re.ASCII,
)


def expect_problem(value: str) -> str | None:
    match = EXPECT.match(value.strip())
    if match is None:
        return (
            f"Kz-Expect '{value}' is not METRIC +N% on DEVICE (e.g. 'pp512 +10% on pad3', 'tg64 "
            "-2.5% on pad3')"
        )
    if float(match[2]) == 0:
        return (
            f"Kz-Expect '{value}': an expected change of 0% can never be contradicted; give the "
            "effect the patch is for"
        )
    return None


def expectations(patch: Patch) -> tuple[Expectation, ...]:
    """The patch's well-formed Kz-Expect trailers (lint reports the others)."""
    found = []
    for trailer in patch.trailers:
        match = EXPECT.match(trailer.value.strip()) if trailer.key == KZ_EXPECT else None
        if match and float(match[2]):
            found.append(
                Expectation(
                    patch=patch.name,
                    metric=match[1],
                    pct=float(match[2]),
                    device=match[3],
                    line=trailer.line,
                )
            )
    return tuple(found)


TOOL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def device_test_problem(value: str) -> str | None:
    """A Kz-Device-Test is a tool of the release (no path) and its arguments, split as a shell
    would."""
    try:
        words = shlex.split(value)
    except ValueError as exc:
        return f"Kz-Device-Test '{value}' cannot be split into arguments: {exc}"
    if not words or not TOOL_NAME.match(words[0]):
        return (
            f"Kz-Device-Test '{value}' does not start with a tool of the release (e.g. "
            "'test-backend-ops -o GATED_DELTA_NET -b HTP0')"
        )
    return None


def device_tests(patch: Patch) -> tuple[DeviceTest, ...]:
    """The patch's well-formed Kz-Device-Test trailers (lint reports the others)."""
    found = []
    for trailer in patch.trailers:
        if trailer.key == KZ_DEVICE_TEST and device_test_problem(trailer.value) is None:
            tool, *args = shlex.split(trailer.value)
            found.append(
                DeviceTest(patch=patch.name, tool=tool, args=tuple(args), line=trailer.line)
            )
    return tuple(found)


def lint_series(series_path: Path) -> tuple[list[Patch], list[Problem]]:
    """Everything lint finds without an upstream tree: series, files, format, trailers."""
    series, problems = parse_series(series_path)
    files = ", ".join(p.name for p in series_files(series.directory))
    problems += [
        Problem(path, None, f"patch file is not listed in any series file ({files})")
        for path in unlisted_patches(series.directory)
    ]
    patches = [read_patch(entry.path, entry.name) for entry in series.entries]
    for patch in patches:
        problems += list(patch.problems) + trailer_problems(patch)
    problems += dropped_log_problems(series.directory / DROPPED_LOG)
    return patches, problems


# --- the dropped-patch log ---


def read_dropped(path: Path) -> list[DropRecord]:
    """The records of the dropped-patch log; a damaged log is a ConfigError naming its line."""
    if not path.is_file():
        return []
    doc = yamlconf.load(path)
    doc.check_keys(("dropped",), context="dropped-patch log")
    entries = doc.get_list("dropped")
    records = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, yamlconf.Mapping):
            raise entries.error(index, "each dropped patch is a mapping", key="dropped")
        entry.check_keys(DROP_KEYS, required=DROP_REQUIRED, context="dropped patch")
        for key in DROP_REQUIRED:
            if not entry.get_str(key):
                raise entry.error(key, "must not be empty")
        records.append(
            DropRecord(
                patch=entry.get_str("patch") or "",
                subject=entry.get_str("subject", "") or "",
                date=entry.get_str("date") or "",
                reason=entry.get_str("reason") or "",
                upstream=entry.get_str("upstream"),
                upstream_status=entry.get_str("upstream_status"),
            )
        )
    return records


def dropped_log_problems(path: Path) -> list[Problem]:
    try:
        read_dropped(path)
    except ConfigError as exc:
        return [problem_from(exc, path)]
    return []


def problem_from(exc: ConfigError, default_path: Path) -> Problem:
    """A ConfigError as a lint Problem (its message without the file:line prefix)."""
    message = exc.message
    if exc.path is not None:
        message = message.removeprefix(f"{exc.path}:{exc.line}: " if exc.line else f"{exc.path}: ")
    return Problem(exc.path or default_path, exc.line, message)


def record_drop(path: Path, record: DropRecord) -> None:
    """Append ``record`` to the committed log (created with a header when missing)."""
    if path.is_file():
        read_dropped(path)  # refuses to append to a damaged log
        text = path.read_text(encoding="utf-8")
    else:
        text = (
            "# Patches dropped from the stack: why, when, and the upstream commit that made them "
            "obsolete.\ndropped:\n"
        )
    if not text.endswith("\n"):
        text += "\n"
    if re.search(r"^dropped:\s*\[\]\s*$", text, re.M):
        text = re.sub(r"^dropped:\s*\[\]\s*$", "dropped:", text, flags=re.M)
    item = yaml.safe_dump([record.to_dict()], sort_keys=False, allow_unicode=True, width=100)
    text += "".join(f"  {line}\n" for line in item.splitlines())
    write_atomic(path, text.encode("utf-8"))


# --- editing the stack ---


def drop_patch(
    series_path: Path,
    name: str,
    *,
    reason: str,
    upstream: str | None = None,
    today: date | None = None,
) -> DropRecord:
    """Remove ``name`` from the series, delete its file (unless another series of the folder lists
    it) and log why (with its subject and upstream status)."""
    series = read_series(series_path)
    entry = require_entry(series, name)
    name = entry.name
    patch = read_patch(entry.path, name)
    record = DropRecord(
        patch=name,
        subject=patch.subject,
        date=(today or datetime.now(timezone.utc).date()).isoformat(),
        reason=reason,
        upstream=upstream,
        upstream_status=patch.upstream_status,
    )
    record_drop(series.directory / DROPPED_LOG, record)
    reorder_series(series_path, [n for n in series.names() if n != name])
    if not _listed_elsewhere(series, entry.path):
        entry.path.unlink()
    return record


def _listed_elsewhere(series: Series, patch: Path) -> bool:
    """Another series file of the folder still lists the patch (an archive recipe's stack shares
    files)."""
    for other in series_files(series.directory):
        if other.resolve() != series.path.resolve() and any(
            e.path == patch for e in parse_series(other)[0].entries
        ):
            return True
    return False


def move_patch(
    series_path: Path, name: str, *, before: str | None = None, after: str | None = None
) -> list[str]:
    """Move ``name`` before or after another entry. Returns the patches it now crosses that touch
    the same files."""
    if (before is None) == (after is None):
        raise ConfigError("say where to move it: --before OTHER or --after OTHER")
    series = read_series(series_path)
    name = require_entry(series, name).name
    other = require_entry(series, before or after or "").name
    if other == name:
        raise ConfigError(f"cannot move {name} relative to itself")
    names = series.names()
    old_index = names.index(name)
    names.remove(name)
    names.insert(names.index(other) + (1 if after is not None else 0), name)
    new_index = names.index(name)
    reorder_series(series_path, names)
    low, high = sorted((old_index, new_index))
    crossed = [n for n in series.names()[low : high + 1] if n != name]
    mine = {f.path for f in read_patch(series.directory / name).files}
    return [n for n in crossed if mine & {f.path for f in read_patch(series.directory / n).files}]


def require_entry(series: Series, name: str) -> SeriesEntry:
    entry = series.entry(name) or series.entry(f"{name}.patch")
    if entry is None:
        close = difflib.get_close_matches(name, series.names(), n=1)
        hint = (
            f"did you mean '{close[0]}'?"
            if close
            else f"the series lists: {', '.join(series.names()) or 'nothing'}"
        )
        raise ConfigError(f"'{name}' is not in {series.path}", hint=hint)
    return entry


def patch_file_name(subject: str, taken: set[str]) -> str:
    """A file name from a subject, like format-patch's but without a number; unique among
    ``taken``."""
    slug = (
        re.sub(r"[^A-Za-z0-9._]+", "-", subject).strip("-._").lower()[:64].rstrip("-._") or "patch"
    )
    name, counter = f"{slug}.patch", 2
    while name in taken:
        name, counter = f"{slug}-{counter}.patch", counter + 1
    return name
