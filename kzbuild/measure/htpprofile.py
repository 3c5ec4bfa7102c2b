"""ggml-hexagon's own profiler lines (``GGML_HEXAGON_PROFILE=1``), read into per-op times.

With profiling on, ggml-hexagon logs (at debug level) one ``OPBATCH`` line per batch of ops the
NPU ran, then one line per op of the batch::

    ggml-hex: HTP0 profile-op OPBATCH|----|n-ops 3|----|----|----|usec 120 cycles 181440 start 5 mhz
    1512.0
    ggml-hex: HTP0 profile-op MUL_MAT|names|dims|types|strides|kparams|usec 40 cycles 60480 start 9
    mhz 1512.0

The parser is written for the format strings in :data:`EXPECTED_FORMATS`, which are checked
against the ``ggml-hexagon.cpp`` of the tree that was built (:func:`check_tree_formats`): a tree
that prints these lines differently is refused rather than misread. A line that names
``profile-op`` but does not have the expected shape is refused too, naming the file and line.

kz-profile's phase markers (``kz-profile: phase prefill plain rep 0 begin``) split the lines into
prefill and decode; only the ``plain`` repetitions count (the timed ones run every node alone).
A log without markers (from another tool) is one phase, ``all``.
"""

from __future__ import annotations

import re
from collections import defaultdict

from kzbuild.errors import BadRecord, ProfileFormatChanged
from kzbuild.model.profile import NO_LAYER, BatchTotals, HtpProfile, OpTime, PhaseProfile

HEXAGON_CPP = "ggml/src/ggml-hexagon/ggml-hexagon.cpp"
# The format strings of ggml_hexagon_dump_op_prof and ggml_hexagon_dump_batch_prof, as written in
# the C source (so "\n" is a backslash and an n), at upstream 0c1e57098.
OP_FORMAT = r"ggml-hex: %s profile-op %s|%s|%s|%s|%s|%s|usec %u cycles %u start %u mhz %.1f%s\n"
BATCH_FORMAT = (
    r"ggml-hex: %s profile-op OPBATCH|----|n-ops %u|%s|----|----|usec %u cycles %llu start %llu "
    r"mhz %.1f\n"
)
EXPECTED_FORMATS = frozenset({OP_FORMAT, BATCH_FORMAT})
FORMAT_LITERAL_RE = re.compile(r'"((?:[^"\\\n]|\\.)*profile-op(?:[^"\\\n]|\\.)*)"')

PREFIX = "ggml-hex: "
LINE_RE = re.compile(r"ggml-hex: (?P<session>\S+) profile-op (?P<body>.*)")
TIMES = r"usec (?P<usec>\d+) cycles (?P<cycles>\d+) start (?P<start>\d+) mhz (?P<mhz>\d+\.\d)"
OP_TAIL_RE = re.compile(TIMES + r"(?: pmu \[\d+(?:,\d+){7}\])?")
BATCH_RE = re.compile(
    r"OPBATCH\|----\|n-ops (?P<n_ops>\d+)\|(?P<events>[^|]*)\|----\|----\|" + TIMES
)
OP_FIELDS = 7  # op|names|dims|types|strides|kparams|times
MARKER_RE = re.compile(
    r"kz-profile: phase (?P<phase>\w+) (?P<mode>\w+) rep (?P<rep>\d+) (?P<edge>begin|end)\s*$"
)
LAYER_RE = re.compile(r"-(\d{1,9})$")  # llama.cpp names a layer's tensors NAME-IL
ALL = "all"
MAX_USEC = 2**32 - 1  # printed with %u


def check_tree_formats(source: str, where: str) -> None:
    """Refuse a ggml-hexagon.cpp whose profile-op format strings are not the ones the parser
    reads."""
    found = set(FORMAT_LITERAL_RE.findall(source))
    if found == EXPECTED_FORMATS:
        return
    if not found:
        raise ProfileFormatChanged(
            f"{where} prints no 'profile-op' lines: this tree's ggml-hexagon has no profiler "
            "kzbuild can read",
            hint="profile on the CPU (--dev none), or sync a recipe whose tree has "
            "GGML_HEXAGON_PROFILE",
        )
    lines = [f"  expected, not in the tree: {fmt}" for fmt in sorted(EXPECTED_FORMATS - found)]
    lines += [f"  in the tree, unknown here: {fmt}" for fmt in sorted(found - EXPECTED_FORMATS)]
    raise ProfileFormatChanged(
        f"{where}: ggml-hexagon's profile-op format differs from the one kzbuild's parser reads:\n"
        + "\n".join(lines),
        hint="kzbuild would misread these lines; update kzbuild/measure/htpprofile.py (its formats "
        "and parser) for this tree",
    )


def parse_htp_log(data: bytes, *, source: str) -> HtpProfile:
    """Per-op totals of the profile-op lines in a log; raises BadRecord naming source:line for a
    profile-op line of another shape."""
    text = data.decode("utf-8", errors="replace")
    lines_of = text.split(
        "\n"
    )  # not splitlines(): it also splits at \x1c-\x1e, \x85, \u2028, which a tensor name may hold
    has_markers = any(MARKER_RE.search(line) for line in lines_of if "kz-profile: phase" in line)
    phase: str | None = None if has_markers else ALL
    totals: dict[str, dict[tuple[str, str, int], list[float]]] = defaultdict(dict)
    batches: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    order: list[str] = []
    lines = 0
    for number, line in enumerate(lines_of, start=1):
        marker = MARKER_RE.search(line) if has_markers and "kz-profile: phase" in line else None
        if marker:
            counted = marker["mode"] == "plain" and marker["edge"] == "begin"
            phase = marker["phase"] if counted else None
            continue
        start = line.find(PREFIX)
        if start < 0 or " profile-op " not in line:
            continue
        lines += 1
        where = f"{source}:{number}"
        match = LINE_RE.fullmatch(line[start:].rstrip("\r"))
        if match is None:
            raise BadRecord(
                f"{where}: a profile-op line without 'ggml-hex: SESSION profile-op ...': "
                f"{_cut(line)}"
            )
        session, body = match["session"], match["body"]
        if body.startswith("OPBATCH|"):
            batch = BATCH_RE.fullmatch(body)
            if batch is None:
                raise BadRecord(
                    f"{where}: an OPBATCH line not of the form '{BATCH_FORMAT}': {_cut(line)}"
                )
            if phase is not None:
                sums = batches[phase]
                sums[0] += 1
                sums[1] += _unsigned(batch["n_ops"], "n-ops", where)
                sums[2] += _usec(batch["usec"], where)
            continue
        parts = body.split("|")
        tail = OP_TAIL_RE.fullmatch(parts[-1]) if len(parts) >= OP_FIELDS else None
        if tail is None or not parts[0].strip():
            raise BadRecord(
                f"{where}: a profile-op line not of the form '{OP_FORMAT}': {_cut(line)}"
            )
        if phase is None:
            continue
        if phase not in totals:
            order.append(phase)
        key = (parts[0], session, _layer(parts[1]))
        row = totals[phase].setdefault(key, [0, 0.0])
        row[0] += 1
        row[1] += _usec(tail["usec"], where)
    for name in batches:
        if name not in order:
            order.append(name)
    phases = tuple(
        PhaseProfile(
            phase=name,
            tokens=0,
            ops=tuple(
                OpTime(op=k[0], backend=k[1], layer=k[2], count=int(v[0]), usec=float(v[1]))
                for k, v in sorted(totals[name].items())
            ),
        )
        for name in order
    )
    return HtpProfile(phases, {name: BatchTotals(*sums) for name, sums in batches.items()}, lines)


def _usec(text: str, where: str) -> int:
    return _unsigned(text, "usec", where)


def _unsigned(text: str, what: str, where: str) -> int:
    """A number printed with %u; one of more digits than a %u has is refused before int()."""
    if len(text) > len(str(MAX_USEC)) or int(text) > MAX_USEC:
        raise BadRecord(f"{where}: {what} {_cut(text, 40)} is more than a %u can print")
    return int(text)


def _layer(names: str) -> int:
    """The layer of the op's result, from ``in0 x in1 -> dst`` (the dst name alone for no
    inputs)."""
    match = LAYER_RE.search(names.rsplit(" -> ", 1)[-1].strip())
    return int(match[1]) if match else NO_LAYER


def _cut(line: str, limit: int = 160) -> str:
    return line if len(line) <= limit else line[: limit - 3] + "..."
