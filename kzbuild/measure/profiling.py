"""``kzbuild profile``: where prefill and decode time goes, per op type and backend, on a device.

The release's ``kz-profile`` (built with the artifact from ``kernels/profile/``) runs the prompt
and the decode on two contexts, one with ggml-backend's eval callback timing every node and one
without, and prints JSON: per phase, the wall times of both and the (op, backend, layer) totals
of the timed one. On a Hexagon build, unless ``--dev none``, ggml-hexagon's own profiler is on
too (``GGML_HEXAGON_PROFILE=1``) and its lines in kz-profile's stderr become the ``npu`` phases
(:mod:`kzbuild.measure.htpprofile`), after the tree's format strings were checked.

One statistic everywhere: kz-profile keeps every node's time per repetition, and a report shows
the repetition whose timed wall time is the median, its ops and its walls (so the sum of the ops
is that run's graph time, never above its wall), with each op's spread over the repetitions. A
phase whose repetitions' timed walls are further apart than ``--max-spread`` (15%) gets no
ranking: one preempted repetition would reorder it.

Runs are stored like bench results, with the same provenance, one line each in
``results/profiles.jsonl``; logs and the raw output go to ``WORK/profile/<run-id>/``.
"""

from __future__ import annotations

import logging
import stat
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path

from kzbuild.adapters.gitcmd import Git
from kzbuild.adapters.settings import Settings
from kzbuild.device.base import ByteSink, Transport
from kzbuild.device.run import (
    check_seconds,
    check_tool,
    current_release,
    env_warnings,
    invocation,
    run_logged,
    synced_head,
)
from kzbuild.errors import BadRecord, ConfigError, ResultsError
from kzbuild.measure.bench import device_model, new_run_id, probe
from kzbuild.measure.htpprofile import HEXAGON_CPP, check_tree_formats, parse_htp_log
from kzbuild.measure.resultfiles import append_to_jsonl, checked_line, jsonl_objects
from kzbuild.measure.resultplot import save_png
from kzbuild.measure.resultsdb import LATEST
from kzbuild.model.device import Device
from kzbuild.model.jsonfields import Fields, tool_json
from kzbuild.model.profile import (
    MAX_ROWS,
    NO_LAYER,
    ComparedOp,
    OpSummary,
    OpTime,
    PhaseProfile,
    ProfileRecord,
    ProfileRun,
    ProfileSpec,
)
from kzbuild.model.result import BuildInfo, DeviceInfo, ModelInfo
from kzbuild.model.result import summarize as summarize_samples
from kzbuild.model.run import Release

log = logging.getLogger(__name__)

KZ_PROFILE = "kz-profile"
TOOL_FORMAT = 2  # 2: a node's "us" is a list, one time per repetition
PROFILES_FILE = "profiles.jsonl"
PROFILE_ENV = "GGML_HEXAGON_PROFILE"
HEXAGON_LIB = "lib/libggml-hexagon.so"  # in a release's manifest: a build with the NPU backend
PHASES = ("prefill", "decode")
SOURCE_NAMES = {"graph": "kz-profile timer", "npu": "ggml-hexagon profiler"}
MAX_TOKENS = 2**31 - 1
MAX_LOG = 1 << 30  # bytes of a saved log read by profile --from-log
MAX_SPREAD_PCT = 15.0  # repetitions' timed walls further apart than this: no ranking


def check_spec(spec: ProfileSpec) -> None:
    if not spec.model.strip() or spec.model.startswith("-"):
        raise ConfigError(
            f"--model '{spec.model}' is not a model path", hint="e.g. -m models/tiny.gguf"
        )
    if spec.dev is not None and (
        not spec.dev.strip() or spec.dev.startswith("-") or "," in spec.dev
    ):
        raise ConfigError(
            f"--dev '{spec.dev}' is not one device list (e.g. HTP0, HTP0/HTP1 or none)"
        )
    for name, value, low in (
        ("-p", spec.n_prompt, 1),
        ("-n", spec.n_gen, 0),
        ("--ub", spec.n_ubatch, 1),
        ("-t", spec.threads, 1),
        ("--ngl", spec.ngl, 0),
        ("-r", spec.reps, 1),
    ):
        if value is not None and not low <= value <= MAX_TOKENS:
            raise ConfigError(f"{name} {value}: give a whole number from {low} to {MAX_TOKENS}")
    check_seconds("--timeout", spec.timeout)


def tool_args(spec: ProfileSpec, model: str, *, verbose: bool) -> list[str]:
    """llama-bench's arguments (``model``: spec.model as the tool must be given it)."""
    args = ["-m", model, "-p", str(spec.n_prompt), "-n", str(spec.n_gen), "-r", str(spec.reps)]
    for flag, value in (
        ("-ub", spec.n_ubatch),
        ("-t", spec.threads),
        ("-ngl", spec.ngl),
        ("-dev", spec.dev),
    ):
        if value is not None:
            args += [flag, str(value)]
    return args + (["-v"] if verbose else [])


# --- kz-profile's output ---
def parse_tool_output(
    stdout: bytes, *, source: str
) -> tuple[dict[str, int], tuple[PhaseProfile, ...]]:
    """kz-profile's JSON: its configuration and one phase per prefill/decode, every field
    checked."""
    fields = Fields(tool_json(stdout, source=source, tool=KZ_PROFILE), source)
    if fields.text("tool") != KZ_PROFILE or fields.count("format") != TOOL_FORMAT:
        raise BadRecord(f"{source}: not kz-profile output of format {TOOL_FORMAT}")
    config = {
        key: fields.count(key) for key in ("n_prompt", "n_gen", "n_ubatch", "n_threads", "reps")
    }
    items = fields.data.get("phases")
    if not isinstance(items, list) or not items or len(items) > len(PHASES):
        raise fields.error("phases", "a list of prefill and decode")
    phases = []
    for index, item in enumerate(items):
        where = f"{source}: phases[{index}]"
        phase = Fields(item, where)
        nodes = phase.data.get("nodes")
        if not isinstance(nodes, list) or len(nodes) > MAX_ROWS:
            raise phase.error("nodes", f"a list of at most {MAX_ROWS} rows")
        ops = []
        for number, node in enumerate(nodes):
            row = Fields(node, f"{where}: nodes[{number}]")
            layer = row.data.get("layer")
            if isinstance(layer, bool) or not isinstance(layer, int) or layer < NO_LAYER:
                raise row.error("layer", f"an integer >= {NO_LAYER}")
            times = row.numbers("us", max_items=config["reps"], zero_ok=True)
            per_rep = tuple(float(x) for x in times)
            if len(per_rep) != config["reps"]:
                raise row.error("us", f"a list of {config['reps']} times, one per repetition")
            count = row.count("count", minimum=1)
            op, backend = row.text("op"), row.text("backend")
            ops.append(OpTime(op, backend, layer, count, sum(per_rep), per_rep))
        phases.append(
            PhaseProfile(
                phase=phase.choice("phase", PHASES),
                tokens=phase.count("tokens", minimum=1, maximum=MAX_TOKENS),
                ops=tuple(ops),
                wall_us_plain=tuple(
                    float(x) for x in phase.numbers("wall_us_plain", max_items=config["reps"])
                ),
                wall_us_timed=tuple(
                    float(x) for x in phase.numbers("wall_us_timed", max_items=config["reps"])
                ),
            )
        )
    return config, tuple(phases)


# --- the pinned tree's profiler format ---
def hexagon_source(settings: Settings, recipe: str) -> str | None:
    """ggml-hexagon.cpp at the recipe's synced head (committed, not the worktree's edits); None when
    not synced."""
    head = synced_head(settings, recipe)
    if head is None:
        return None
    shown = Git(settings.worktree(recipe)).run("show", f"{head}:{HEXAGON_CPP}", check=False)
    return shown.stdout if shown.returncode == 0 else ""


def check_recipe_formats(settings: Settings, recipe: str) -> bool:
    """Check the recipe's tree's profile-op formats; False (with a warning) when it is not synced
    here."""
    source = hexagon_source(settings, recipe)
    if source is None:
        log.warning(
            "cannot check ggml-hexagon's profile-op format: recipe %s is not synced here (kzbuild "
            "sync %s); "
            "lines of another shape are still refused",
            recipe,
            recipe,
        )
        return False
    check_tree_formats(source, f"{recipe}'s {HEXAGON_CPP}")
    return True


# --- a run on a device ---
def profile(
    settings: Settings,
    transport: Transport,
    device: Device,
    spec: ProfileSpec,
    store: ProfileStore,
    *,
    on_stderr: ByteSink | None = None,
) -> ProfileRun:
    """Run kz-profile of the current release and store its record."""
    check_spec(spec)
    release = current_release(transport, device)
    check_tool(transport, device, release, KZ_PROFILE)
    npu, env = run_env(release, spec)
    if npu:  # before the run: a tree whose profiler prints another format is refused, not misread
        recipe = release.manifest.get("recipe")
        if isinstance(recipe, str):
            check_recipe_formats(settings, recipe)
        else:
            log.warning(
                "cannot check ggml-hexagon's profile-op format: release %s names no recipe",
                release.build_id,
            )
    for warning in env_warnings(settings, release, env):
        log.warning("%s", warning)
    model = device_model(transport, device, spec.model)
    state = probe(transport)
    call = invocation(
        device, release, KZ_PROFILE, tool_args(spec, model.tool_path, verbose=npu), env
    )
    run_id = new_run_id(datetime.now(timezone.utc))
    host_time = datetime.now(timezone.utc).isoformat(timespec="seconds")
    logs = settings.work / "profile" / run_id
    logs.mkdir(parents=True, exist_ok=True)
    stdout = run_logged(
        transport, call, logs, KZ_PROFILE, timeout=spec.timeout, on_stderr=on_stderr
    )
    stderr_log = logs / f"{KZ_PROFILE}.stderr.log"
    config, graph = parse_tool_output(stdout, source=str(logs / f"{KZ_PROFILE}.json"))
    npu_phases: tuple[PhaseProfile, ...] = ()
    if npu and env.get(PROFILE_ENV, "0") not in ("", "0"):
        tokens = {phase.phase: phase.tokens for phase in graph}
        parsed = parse_htp_log(stderr_log.read_bytes(), source=str(stderr_log))
        npu_phases = tuple(
            PhaseProfile(
                p.phase,
                tokens.get(p.phase, 0),
                p.ops,
                wall_us_plain=next((g.wall_us_plain for g in graph if g.phase == p.phase), ()),
            )
            for p in parsed.phases
        )
    record = ProfileRecord(
        run_id=run_id,
        host_time=host_time,
        build=BuildInfo.of_release(release, release.manifest.get("build_commit")),
        device=DeviceInfo(
            name=device.name, address=device.address, fingerprint=dict(state.fingerprint)
        ),
        model=ModelInfo(path=spec.model, sha256=model.sha256),
        config={
            **config,
            **({"dev": spec.dev} if spec.dev else {}),
            **({"ngl": spec.ngl} if spec.ngl is not None else {}),
        },
        graph=graph,
        npu=npu_phases,
        env=dict(call.env),
        argv=tuple(call.argv),
        cwd=call.cwd,
        conditions=dict(state.conditions),
    )
    store.add(record)
    return ProfileRun(record, logs)


def run_env(release: Release, spec: ProfileSpec) -> tuple[bool, dict[str, str]]:
    """Whether ggml-hexagon's profiler runs (a Hexagon build, and not --dev none), and the env
    kz-profile gets on top of the device's: --env, plus GGML_HEXAGON_PROFILE=1 unless --env set
    it."""
    env = dict(spec.env)
    files = release.manifest.get("files")
    npu = isinstance(files, Mapping) and HEXAGON_LIB in files and spec.dev != "none"
    if npu:
        env.setdefault(PROFILE_ENV, "1")
    return npu, env


# --- storage ---
class ProfileStore:
    """``results/profiles.jsonl``: one profile run per line, sorted keys, appended under the
    folder's lock."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / PROFILES_FILE

    def add(self, record: ProfileRecord) -> None:
        stored = checked_line(record, ProfileRecord.from_dict, f"profile run {record.run_id!r}")
        append_to_jsonl(self.folder, PROFILES_FILE, stored, what="profiles")

    def records(self) -> list[ProfileRecord]:
        if not self.path.exists():
            return []
        return [
            ProfileRecord.from_dict(data, where=where) for where, data in jsonl_objects(self.path)
        ]

    def select(self, selector: str) -> ProfileRecord:
        """The run whose id is or starts with ``selector``, or the newest for ``latest``."""
        found = self.records()
        if not found:
            raise ResultsError(
                f"no profile runs in {self.path}", hint="run kzbuild profile --device D -m MODEL"
            )
        if selector == LATEST:
            return max(found, key=lambda r: (r.host_time, r.run_id))
        chosen = [r for r in found if r.run_id.startswith(selector)]
        if len(chosen) != 1:
            listed = ", ".join(r.run_id for r in chosen[:5])
            problem = (
                f"matches {len(chosen)} profile runs ({listed})"
                if chosen
                else "matches no profile run"
            )
            raise ResultsError(f"'{selector}' {problem}", hint=f"run ids are in {self.path}")
        return chosen[0]


# --- reading a profile ---
def median_rep(phase: PhaseProfile) -> int | None:
    """The repetition whose timed wall is the median (the lower middle of an even count), whose
    ops and walls a report shows; None for a phase without per-repetition op times."""
    if not phase.per_rep:
        return None
    order = sorted(range(len(phase.wall_us_timed)), key=lambda rep: (phase.wall_us_timed[rep], rep))
    return order[(len(order) - 1) // 2]


def wall_spread_pct(phase: PhaseProfile) -> float | None:
    """(max - min) / median of the repetitions' timed walls, in percent; None under two."""
    return summarize_samples(phase.wall_us_timed).spread_pct


def disagrees(phase: PhaseProfile, max_spread_pct: float = MAX_SPREAD_PCT) -> bool:
    """The repetitions' timed walls are further apart than ``max_spread_pct``: no ranking holds."""
    spread = wall_spread_pct(phase)
    return spread is not None and spread > max_spread_pct


def phase_times(phase: PhaseProfile, reps: int) -> tuple[float, float | None, float | None]:
    """Graph time (the sum of the ops), plain and timed wall: all of the median repetition; for
    a phase without per-repetition times (an NPU log), the ops' mean and the walls' medians."""
    rep = median_rep(phase)
    if rep is None:
        return (
            phase.op_usec / max(reps, 1),
            median(phase.wall_us_plain),
            median(phase.wall_us_timed),
        )
    plain = phase.wall_us_plain[rep] if rep < len(phase.wall_us_plain) else None
    return phase.rep_usec(rep), plain, phase.wall_us_timed[rep]


def summarize(phase: PhaseProfile, *, reps: int = 1, by: str = "op") -> list[OpSummary]:
    """Per op type (``by="op"``) or per layer and op type (``by="layer"``), most time first: the
    times of the median repetition with their spread over all repetitions (:func:`median_rep`);
    for a phase without per-repetition times, the mean per repetition."""
    if by not in ("op", "layer"):
        raise ConfigError(f"--by '{by}': give op or layer")
    grouped: dict[tuple[int | None, str], list[OpTime]] = defaultdict(list)
    for row in phase.ops:
        grouped[(row.layer if by == "layer" else None, row.op)].append(row)
    rep = median_rep(phase)
    runs = len(phase.wall_us_timed) if rep is not None else max(reps, 1)
    total = phase_times(phase, reps)[0]
    rows = []
    for (layer, op), items in grouped.items():
        usec = sum(r.usec_in(rep, runs) for r in items)
        per_rep = (
            [sum(r.usec_reps[i] for r in items) for i in range(runs)] if rep is not None else []
        )
        rows.append(
            OpSummary(
                layer=layer,
                op=op,
                backends=tuple(sorted({r.backend for r in items})),
                count=sum(r.count for r in items) // runs,
                usec=usec,
                share=usec / total if total else 0.0,
                spread_pct=summarize_samples(per_rep).spread_pct if per_rep else None,
            )
        )
    key = (
        (lambda s: (s.layer if s.layer is not None else 10**9, -s.usec, s.op))
        if by == "layer"
        else (lambda s: (-s.usec, s.op))
    )
    return sorted(rows, key=key)


def reps_of(record: ProfileRecord) -> int:
    reps = record.config.get("reps", 1)
    return reps if isinstance(reps, int) and not isinstance(reps, bool) and reps > 0 else 1


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def describe_walls(phase: PhaseProfile) -> str:
    walls = ", ".join(f"{w:.0f}" for w in phase.wall_us_timed)
    return f"timed walls {walls} us, spread {wall_spread_pct(phase) or 0.0:.0f}%"


# --- comparing two runs ---
def compare(
    a: ProfileRecord,
    b: ProfileRecord,
    *,
    source: str = "graph",
    max_spread_pct: float = MAX_SPREAD_PCT,
) -> list[ComparedOp]:
    """Per phase and op type, B's time against A's (per repetition). Runs of different models or
    token counts are refused: their op times say nothing about each other; so are phases whose
    repetitions disagree (:func:`disagrees`)."""
    if a.model.sha256 != b.model.sha256:
        raise ResultsError(
            f"profile runs {a.run_id} and {b.run_id} ran different models "
            f"({_short(a.model.sha256)} vs {_short(b.model.sha256)})"
        )
    phases_a, phases_b = _phases_of(a, source), _phases_of(b, source)
    rows = []
    for name in [p for p in phases_a if p in phases_b]:
        pa, pb = phases_a[name], phases_b[name]
        if pa.tokens != pb.tokens:
            raise ResultsError(
                f"{name}: {a.run_id} ran {pa.tokens} tokens, {b.run_id} ran {pb.tokens}; per-op "
                "times of different token counts are not compared"
            )
        for run, phase in ((a, pa), (b, pb)):
            if disagrees(phase, max_spread_pct):
                raise ResultsError(
                    f"{name}: the repetitions of {run.run_id} disagree ({describe_walls(phase)}); "
                    "per-op deltas would be noise",
                    hint="profile again with more repetitions on a quieter device, "
                    f"or --max-spread above {max_spread_pct:g}",
                )
        sa = {s.op: s for s in summarize(pa, reps=reps_of(a))}
        sb = {s.op: s for s in summarize(pb, reps=reps_of(b))}
        for op in sorted(
            sa.keys() | sb.keys(),
            key=lambda o: -max(sa[o].usec if o in sa else 0.0, sb[o].usec if o in sb else 0.0),
        ):
            rows.append(
                ComparedOp(
                    name,
                    op,
                    sa[op].usec if op in sa else None,
                    sb[op].usec if op in sb else None,
                    sa[op].backends if op in sa else (),
                    sb[op].backends if op in sb else (),
                )
            )
    if not rows:
        raise ResultsError(
            f"profile runs {a.run_id} and {b.run_id} share no phase with {SOURCE_NAMES[source]} "
            "times"
        )
    return rows


def phases_of(record: ProfileRecord, source: str) -> tuple[PhaseProfile, ...]:
    """The run's kz-profile timer phases (``graph``) or its NPU profiler phases (``npu``);
    ResultsError when it has none."""
    phases = record.npu if source == "npu" else record.graph
    if not phases:
        hint = (
            "the NPU profiler runs on Hexagon builds unless --dev none" if source == "npu" else None
        )
        raise ResultsError(
            f"profile run {record.run_id} has no {SOURCE_NAMES[source]} times", hint=hint
        )
    return phases


def _phases_of(record: ProfileRecord, source: str) -> dict[str, PhaseProfile]:
    return {p.phase: p for p in phases_of(record, source)}


def _short(sha: str | None) -> str:
    return sha[:12] if sha else "unknown"


# --- plotting ---
TOP_OPS = 15


def plot(record: ProfileRecord, out: Path, *, source: str = "graph") -> Path:
    """A PNG: per phase, one bar per op type (the most expensive ones), stacked by the backend it
    ran on."""
    phases = phases_of(record, source)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, panels = plt.subplots(
        len(phases), 1, figsize=(10, 5 * len(phases)), squeeze=False, layout="constrained"
    )
    reps = reps_of(record)
    for axes, phase in zip((row[0] for row in panels), phases, strict=True):
        ops = [s.op for s in summarize(phase, reps=reps)][:TOP_OPS]
        rep = median_rep(phase)
        per_backend: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        for row in phase.ops:
            if row.op in ops:
                per_backend[row.backend][row.op] += row.usec_in(rep, reps) / 1000.0
        bottom = [0.0] * len(ops)
        for backend in sorted(per_backend):
            heights = [per_backend[backend].get(op, 0.0) for op in ops]
            axes.bar(range(len(ops)), heights, bottom=bottom, label=backend)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        axes.set_xticks(range(len(ops)), ops, rotation=40, ha="right", fontsize=8)
        axes.set_ylabel("ms per run")
        axes.set_title(
            f"{phase.phase} ({phase.tokens} tokens): {SOURCE_NAMES[source]} time per op type, by "
            "backend"
        )
        axes.grid(True, axis="y", alpha=0.3)
        axes.legend(fontsize=8)
    figure.suptitle(
        f"profile {record.run_id}: {record.device.name}, build "
        f"{(record.build.build_id or '?')[:24]}",
        fontsize=9,
    )
    return save_png(figure, out, option="--plot")


def read_log(path: Path) -> bytes:
    """A saved log: a regular file (not a FIFO or a device like /dev/zero) of at most MAX_LOG
    bytes."""
    try:
        info = path.stat()  # before opening: opening a FIFO blocks
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError("is not a regular file (a saved log is)", path=path)
        if info.st_size > MAX_LOG:
            message = f"is {info.st_size} bytes, more than the {MAX_LOG} a saved log may have"
            raise ConfigError(message, path=path)
        with open(path, "rb") as handle:
            data = handle.read(MAX_LOG + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read the log: {exc.strerror}", path=path) from None
    if len(data) > MAX_LOG:  # it grew since the stat
        raise ConfigError(f"is more than the {MAX_LOG} bytes a saved log may have", path=path)
    return data


def from_log(settings: Settings, path: Path, *, recipe: str | None) -> tuple[PhaseProfile, ...]:
    """The per-op NPU times of a saved log; the recipe's tree (when given and synced) must print the
    format the parser reads."""
    if recipe is not None:
        check_recipe_formats(settings, recipe)
    parsed = parse_htp_log(read_log(path), source=str(path))
    if not parsed.lines:
        raise ResultsError(
            f"{path} holds no 'ggml-hex: ... profile-op' lines",
            hint=f"run with {PROFILE_ENV}=1 and debug logging (-v)",
        )
    return parsed.phases
