"""Memory of a measured run: kz-peakrss's peak and the buffer sizes in llama.cpp's own log.

``kz-peakrss`` (built with the artifact from ``kernels/peakrss/``) runs the tool, waits for it
with ``wait4()`` and prints one line on stderr when it has ended::

    kz-peakrss: format 1 peak_rss_kib 320624 status 0

llama.cpp logs each buffer it allocates (llama-bench only with ``-v``)::

    load_tensors:   CPU_REPACK model buffer size =     0.09 MiB
    llama_kv_cache:        CPU KV buffer size =     0.03 MiB
    llama_memory_recurrent:        CPU RS buffer size =     0.03 MiB
    sched_reserve:        CPU compute buffer size =     0.06 MiB
    llama_context:        CPU  output buffer size =     0.00 MiB

The parser is written for the format strings in :data:`EXPECTED_FORMATS`, which are checked
against the sources of the synced tree (:func:`check_tree_formats`): a tree that prints these
lines differently is refused (LogFormatChanged, exit 16) rather than misread. A log line that
names ``buffer size =`` but does not have the expected shape is refused too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

from kzbuild.adapters.gitcmd import Git
from kzbuild.adapters.settings import Settings
from kzbuild.device.run import synced_head
from kzbuild.errors import LogFormatChanged
from kzbuild.model.memory import BUFFER_KINDS, BufferSize, MemoryInfo, MemoryLimits

log = logging.getLogger(__name__)

PEAKRSS = "kz-peakrss"
PEAKRSS_RE = re.compile(r"^kz-peakrss: format 1 peak_rss_kib (\d+) status (\d+)$")
# The format strings, as written in the C sources (so "\n" is a backslash and an n), at upstream
# 0c1e57098.
EXPECTED_FORMATS: Mapping[str, frozenset[str]] = {
    "src/llama-model.cpp": frozenset({r"%s: %12s model buffer size = %8.2f MiB\n"}),
    "src/llama-kv-cache.cpp": frozenset({r"%s: %10s KV buffer size = %8.2f MiB\n"}),
    "src/llama-memory-recurrent.cpp": frozenset({r"%s: %10s RS buffer size = %8.2f MiB\n"}),
    "src/llama-context.cpp": frozenset(
        {
            r"%s: %10s  output buffer size = %8.2f MiB\n",
            r"%s: %10s compute buffer size = %8.2f MiB\n",
        }
    ),
}
FORMAT_LITERAL_RE = re.compile(r'"((?:[^"\\\n]|\\.)*buffer size = (?:[^"\\\n]|\\.)*)"')
# The tools built on common/ (llama-completion, llama-cli, llama-perplexity, ...) log through
# common/log.cpp, which may put the time since start and the level before each line
# ("0.00.052.713 I load_tensors: ..."); llama-bench logs without them. Its format strings, at
# 0c1e57098, must be in the tree too.
PREFIX_FORMATS: Mapping[str, frozenset[str]] = {
    "common/log.cpp": frozenset({r"%s%d.%02d.%03d.%03d%s ", r"%sI %s", r"%sD %s"})
}
ANY_LITERAL_RE = re.compile(r'"((?:[^"\\\n]|\\.)*)"')
MARK = " buffer size = "
BUFFER_RE = re.compile(
    r"^(?:\d+\.\d\d\.\d{3}\.\d{3} )?(?:[ID] )?"  # common/log.cpp's prefix, when it is on
    r"\w+: +(?P<buffer>\S+) +(?P<kind>model|KV|RS|compute|output)"
    r" buffer size = +(?P<mib>\d+\.\d\d) MiB$"
)
UPDATE_HINT = (
    "update kzbuild.measure.memory (EXPECTED_FORMATS, PREFIX_FORMATS and BUFFER_RE) for this "
    "llama.cpp"
)
KINDS = {"model": "model", "KV": "kv", "RS": "rs", "compute": "compute", "output": "output"}


def check_tree_formats(sources: Mapping[str, str], where: str) -> None:
    """Refuse a tree whose buffer-size format strings are not the ones the parser reads."""
    problems = []
    for path, expected in EXPECTED_FORMATS.items():
        found = set(FORMAT_LITERAL_RE.findall(sources.get(path, "")))
        problems += [
            f"  {path}: expected, not in the tree: {fmt}" for fmt in sorted(expected - found)
        ]
        problems += [
            f"  {path}: in the tree, unknown here: {fmt}" for fmt in sorted(found - expected)
        ]
    for path, expected in PREFIX_FORMATS.items():
        literals = set(ANY_LITERAL_RE.findall(sources.get(path, "")))
        problems += [
            f"  {path}: expected, not in the tree: {fmt}" for fmt in sorted(expected - literals)
        ]
    if problems:
        raise LogFormatChanged(
            f"{where}: llama.cpp's buffer size lines differ from the ones kzbuild's parser reads:\n"
            + "\n".join(problems),
            hint=UPDATE_HINT,
        )


def check_recipe_formats(settings: Settings, recipe: str | None) -> bool:
    """Check the formats of the recipe's synced tree; False (with a warning) when it is not
    synced here.
    Lines of another shape are refused either way."""
    head = synced_head(settings, recipe) if recipe else None
    if recipe is None or head is None:
        log.warning(
            "cannot check llama.cpp's buffer size log format: recipe %s is not synced here; "
            "lines of another shape are still refused",
            recipe,
        )
        return False
    git = Git(settings.worktree(recipe))
    sources = {}
    for path in [*EXPECTED_FORMATS, *PREFIX_FORMATS]:
        shown = git.run("show", f"{head}:{path}", check=False)
        if shown.returncode == 0:
            sources[path] = shown.stdout
    if not sources:  # not llama.cpp's layout (a test's tiny upstream): nothing to check against
        log.warning(
            "cannot check llama.cpp's buffer size log format: recipe %s's tree has none of %s",
            recipe,
            ", ".join(EXPECTED_FORMATS),
        )
        return False
    check_tree_formats(sources, f"recipe {recipe} at {head[:12]}")
    return True


def parse_buffers(text: str, *, source: str) -> tuple[BufferSize, ...]:
    """Each (buffer type, kind) with the largest size any context of the log gave it."""
    largest: dict[tuple[str, str], float] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if MARK not in line:
            continue
        found = BUFFER_RE.match(line.strip())
        if found is None:
            raise LogFormatChanged(
                f"{source}:{number}: a buffer size line kzbuild does not read: "
                f"{line.strip()[:200]!r}",
                hint=UPDATE_HINT,
            )
        key = (found["buffer"], KINDS[found["kind"]])
        largest[key] = max(largest.get(key, 0.0), float(found["mib"]))
    ordered = sorted(largest.items(), key=lambda item: (item[0][0], BUFFER_KINDS.index(item[0][1])))
    return tuple(BufferSize(buffer, kind, mib) for (buffer, kind), mib in ordered)


def parse_peak(text: str) -> int | None:
    """kz-peakrss's peak resident memory in KiB: its last line; None when it printed none."""
    for line in reversed(text.splitlines()):
        found = PEAKRSS_RE.match(line.strip())
        if found:
            return int(found[1])
    return None


def memory_of(log_text: str, *, source: str, measured: bool, limits: MemoryLimits) -> MemoryInfo:
    """The memory of one run from its stderr log. ``measured``: it ran under kz-peakrss, whose line
    must then be there."""
    peak = parse_peak(log_text) if measured else None
    if measured and peak is None:
        raise LogFormatChanged(
            f"{source}: the run went through {PEAKRSS} "
            f"but its log has no '{PEAKRSS}: format 1 ...' line"
        )
    return MemoryInfo(
        peak_rss_kib=peak, buffers=parse_buffers(log_text, source=source), limits=limits
    )
