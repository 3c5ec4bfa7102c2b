"""Whether a variant's output stays right: upstream's own KL-divergence check, per variant.

The reference (by default bare upstream at the pin, on the CPU backend) records its logits over
the corpus with ``llama-perplexity --kl-divergence-base FILE``; each variant then runs
``llama-perplexity --kl-divergence-base FILE --kl-divergence`` with the same model, corpus,
context (``-c`` = ``-b``, one sequence per batch) and chunks, and prints the mean KL divergence,
its percentiles, the top-1 agreement ("Same top p") and the perplexity ratio. A variant past the
plan's ``max_kld`` or ``min_top1`` is **wrong**, whatever its speed.

The corpus is French prose the project wrote (``corpora/*.txt``), pushed to the device once as
``ROOT/quality/<sha256>.txt``. The parser reads the lines of :data:`EXPECTED_FORMATS`, which are
checked against ``tools/perplexity/perplexity.cpp`` of the tree that was built: a tree that prints
them differently is refused rather than misread.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from kzbuild.adapters.files import sha256_file
from kzbuild.adapters.gitcmd import Git
from kzbuild.adapters.settings import Settings
from kzbuild.device.base import Transport
from kzbuild.device.run import check_tool, invocation, release_named, run_logged
from kzbuild.errors import BadRecord, ConfigError, DeviceError, OutputFormatChanged, ResultsError
from kzbuild.measure.bench import device_model, new_run_id, probe
from kzbuild.measure.resultfiles import JsonlStore
from kzbuild.model.ab import FULL, VariantBuild
from kzbuild.model.device import Device
from kzbuild.model.quality import (
    OPTION_FLAGS,
    RIGHT,
    WRONG,
    CorpusInfo,
    KldStats,
    PatchQuality,
    QualityLimits,
    QualityRecord,
    QualityReference,
    QualitySpec,
)
from kzbuild.model.result import BuildInfo, DeviceInfo, ModelInfo
from kzbuild.model.run import Invocation, Release

log = logging.getLogger(__name__)

TOOL = "llama-perplexity"
PERPLEXITY_CPP = "tools/perplexity/perplexity.cpp"
CORPORA = Path(__file__).parent / "corpora"
QUALITY_FILE = "quality.jsonl"
DEVICE_DIR = "quality"  # ROOT/quality/: the corpus and the reference logits
MIN_TOKENS = 100  # llama-perplexity prints no statistics over fewer scored tokens
# llama-perplexity logs through a queue that a worker thread writes out; now and then (about one
# run in 10 to 20 on a loaded 2-core host, the same with stdout a file or a pipe) the process exits
# 0 with the queue's last lines unwritten. A variant whose output lacks the last line of the
# statistics is run again (its logits do not change), up to this many runs in all.
ATTEMPTS = 3
LAST_LINE_RE = re.compile(r"^Same top p:", re.MULTILINE)

# The printf formats of the lines kzbuild reads, as written in the C source (so "\n" is a
# backslash and an n), at upstream 0c1e57098; the label before the colon names the figure.
EXPECTED_FORMATS = {
    "Mean PPL(Q)": r"Mean PPL(Q)                   : %10.6lf ± %10.6lf\n",
    "Mean PPL(base)": r"Mean PPL(base)                : %10.6lf ± %10.6lf\n",
    "Mean PPL(Q)/PPL(base)": r"Mean PPL(Q)/PPL(base)         : %10.6lf ± %10.6lf\n",
    "Mean    KLD": r"Mean    KLD: %10.6lf ± %10.6lf\n",
    "Maximum KLD": r"Maximum KLD: %10.6f\n",
    "99.0%   KLD": r"99.0%%   KLD: %10.6f\n",
    "Median  KLD": r"Median  KLD: %10.6f\n",
    "Same top p": r"Same top p: %6.3lf ± %5.3lf %%\n",
}
NUMBER = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:inf|nan)"
LINE_RE = re.compile(
    rf"^(?P<label>[^:]+?)\s*:\s*(?P<value>{NUMBER})(?:\s*±\s*(?P<unc>{NUMBER}))?\s*(?P<pct>%)?\s*$",
    re.IGNORECASE,
)
FIGURES = {  # label -> (field, field of its uncertainty)
    "Mean PPL(Q)": ("ppl", None),
    "Mean PPL(base)": ("ppl_base", None),
    "Mean PPL(Q)/PPL(base)": ("ppl_ratio", None),
    "Mean    KLD": ("kld_mean", "kld_mean_unc"),
    "Maximum KLD": ("kld_max", None),
    "99.0%   KLD": ("kld_p99", None),
    "Median  KLD": ("kld_median", None),
    "Same top p": ("top1_pct", "top1_unc_pct"),
}


# --- the output ---
def parse_kld_output(text: str, *, source: str) -> KldStats:
    """The figures of ``llama-perplexity --kl-divergence``'s statistics. A line with a known label
    but another shape is refused naming ``source:line``; so is output without the statistics."""
    found: dict[str, float] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        label = line.split(":", 1)[0].rstrip() if ":" in line else ""
        if label not in FIGURES:
            continue
        match = LINE_RE.match(line)
        field, unc_field = FIGURES[label]
        fmt = EXPECTED_FORMATS[label]
        if (
            match is None
            or ("±" in fmt) != (match["unc"] is not None)
            or fmt.endswith(r"%%\n") != bool(match["pct"])
        ):
            raise BadRecord(
                f"{source}:{number}: '{line.strip()}' is not llama-perplexity's '{label}' line",
                hint=f"expected the format {EXPECTED_FORMATS[label]}",
            )
        values = {field: float(match["value"])} | (
            {unc_field: float(match["unc"])} if unc_field and match["unc"] else {}
        )
        for value in values.values():
            if not math.isfinite(value):
                raise BadRecord(
                    f"{source}:{number}: {label} is {value}: the run's logits are not numbers"
                )
        found.update(values)
    missing = [label for label, (name, _) in FIGURES.items() if name not in found]
    if missing:
        raise ResultsError(
            f"{source}: llama-perplexity printed no {missing[0]!r} (of its KL divergence "
            "statistics)",
            hint=f"it prints them only over {MIN_TOKENS} or more scored tokens: more chunks or a "
            "larger context, and a corpus of at least context x chunks tokens",
        )
    return KldStats(**found)


FORMAT_LITERAL_RE = re.compile(r'"((?:[^"\\\n]|\\.)*)"')


def check_tree_formats(source: str, where: str) -> None:
    """Refuse a perplexity.cpp that does not print the lines the parser reads, as it reads them."""
    literals = set(FORMAT_LITERAL_RE.findall(source))
    missing = [fmt for fmt in EXPECTED_FORMATS.values() if fmt not in literals]
    if missing:
        raise OutputFormatChanged(
            f"{where}: llama-perplexity's KL divergence statistics differ from the lines kzbuild's "
            "parser reads:\n" + "\n".join(f"  expected, not in the tree: {fmt}" for fmt in missing),
            hint="update kzbuild.measure.quality.EXPECTED_FORMATS (and its parser) to the new "
            "format",
        )


def check_worktree_formats(worktree: Path) -> None:
    """The committed perplexity.cpp at the worktree's HEAD (a synced recipe's tree)."""
    shown = Git(worktree).run("show", f"HEAD:{PERPLEXITY_CPP}", check=False)
    if shown.returncode != 0:
        raise OutputFormatChanged(
            f"{worktree}: the tree has no {PERPLEXITY_CPP}: it builds no llama-perplexity kzbuild "
            "can read"
        )
    check_tree_formats(shown.stdout, f"{worktree.name}'s {PERPLEXITY_CPP}")


# --- the plan's quality: section (read by kzbuild.measure.plans) ---
def check_quality_spec(spec: QualitySpec) -> None:
    scored = (spec.context - 1 - spec.context // 2) * spec.chunks
    if scored < MIN_TOKENS:
        raise ConfigError(
            f"context {spec.context} x {spec.chunks} chunks scores {scored} tokens; "
            f"llama-perplexity prints its statistics over {MIN_TOKENS} or more",
            hint="raise chunks or context",
        )


# --- the corpus ---
def corpus_path(name: str) -> Path:
    path = CORPORA / f"{name}.txt"
    if "/" in name or not path.is_file():
        known = ", ".join(sorted(p.stem for p in CORPORA.glob("*.txt")))
        raise ConfigError(f"there is no corpus '{name}'", hint=f"corpora: {known}")
    return path


def push_corpus(transport: Transport, device: Device, name: str) -> tuple[CorpusInfo, str]:
    """The corpus on the device, and its device path: sent as ``.part`` and renamed into place when
    the device lacks it or holds other bytes under its name (a killed or damaged copy)."""
    local = corpus_path(name)
    info = CorpusInfo(name=name, sha256=sha256_file(local))
    folder = f"{device.root}/{DEVICE_DIR}"
    remote = f"{folder}/{info.sha256}.txt"
    present = transport.run(["sha256sum", remote])
    if not (present.ok and present.text().split()[:1] == [info.sha256]):
        transport.run(["mkdir", "-p", folder])
        transport.push(local, remote + ".part")
        if not transport.run(["mv", "-f", remote + ".part", remote]).ok:
            raise DeviceError(f"{device.name}: cannot store the corpus as {remote}")
    return info, remote


# --- the runs ---
def perplexity_args(
    spec: QualitySpec,
    model: str,
    corpus: str,
    base: str,
    options: Sequence[tuple[str, str]],
    *,
    compare: bool,
) -> list[str]:
    """llama-perplexity's arguments: the same text, context (-c = -b) and chunks for the base and
    each variant."""
    args = [
        "-m",
        model,
        "-f",
        corpus,
        "-c",
        str(spec.context),
        "-b",
        str(spec.context),
        "--chunks",
        str(spec.chunks),
        "--kl-divergence-base",
        base,
    ]
    for name, value in options:
        args += [OPTION_FLAGS[name], value]
    return args + (["--kl-divergence"] if compare else [])


def run_perplexity(
    transport: Transport,
    device: Device,
    release_name: str,
    spec: QualitySpec,
    args: Sequence[str],
    logs: Path,
    stem: str,
) -> tuple[Release, Invocation, bytes]:
    """llama-perplexity of a deployed release with ``args`` and the spec's env; its stdout is kept
    in ``logs/STEM.log``, its stderr in ``logs/STEM.stderr.log``."""
    release = release_named(transport, device, release_name)
    check_tool(transport, device, release, TOOL)
    call = invocation(device, release, TOOL, args, dict(spec.env))
    return (
        release,
        call,
        run_logged(transport, call, logs, stem, timeout=spec.timeout, out_suffix=".log"),
    )


def record_reference(
    transport: Transport,
    device: Device,
    release_name: str,
    spec: QualitySpec,
    model: str,
    corpus: str,
    logs: Path,
) -> str:
    """The reference's logits over the corpus, as ROOT/quality/<run>.kld on the device; returns its
    path."""
    base = f"{device.root}/{DEVICE_DIR}/{logs.name}.kld"
    run_perplexity(
        transport,
        device,
        release_name,
        spec,
        perplexity_args(spec, model, corpus, base, spec.reference_options, compare=False),
        logs,
        "reference",
    )
    return base


def check_variant(
    transport: Transport,
    device: Device,
    variant: str,
    release_name: str,
    spec: QualitySpec,
    *,
    model: ModelInfo,
    corpus: tuple[CorpusInfo, str],
    base: str,
    reference: QualityReference,
    logs: Path,
    tool_model: str,
) -> QualityRecord:
    """One variant's llama-perplexity against the reference logits, judged by the spec's limits
    (``tool_model``: the model's path as the tool must be given it)."""
    args = perplexity_args(spec, tool_model, corpus[1], base, spec.options, compare=True)
    for attempt in range(1, ATTEMPTS + 1):
        stem = variant.replace(":", "-").replace("/", "--") + (
            f".try{attempt}" if attempt > 1 else ""
        )
        release, call, stdout = run_perplexity(
            transport, device, release_name, spec, args, logs, stem
        )
        text = stdout.decode("utf-8", errors="replace")
        if LAST_LINE_RE.search(text) or attempt == ATTEMPTS:
            break
        log.warning(
            "%s: llama-perplexity exited 0 but its output stops before its statistics (its "
            "asynchronous log lost its last lines at exit); running it again",
            logs / f"{stem}.log",
        )
    stats = parse_kld_output(text, source=str(logs / f"{stem}.log"))
    problems = spec.limits.problems(stats)
    state = probe(transport)
    return QualityRecord(
        run_id=logs.name,
        host_time=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        variant=variant,
        build=BuildInfo.of_release(release, None),
        device=DeviceInfo(device.name, device.address, dict(state.fingerprint)),
        model=model,
        corpus=corpus[0],
        reference=reference,
        config={
            "context": spec.context,
            "chunks": spec.chunks,
            **{f"option.{k}": v for k, v in spec.options},
        },
        stats=stats,
        limits=spec.limits,
        verdict=WRONG if problems else RIGHT,
        problems=problems,
        env=dict(call.env),
        argv=tuple(call.argv),
    )


def check_variants(
    transport: Transport,
    device: Device,
    releases: Mapping[str, str],
    spec: QualitySpec,
    model_path: str,
    store: JsonlStore[QualityRecord],
    logs_root: Path,
    *,
    on_variant: Callable[[str], None] | None = None,
) -> list[QualityRecord]:
    """Record the reference's logits, then check every variant (name -> its release) against them;
    each record is stored. The reference variant must be among them."""
    if spec.reference not in releases:
        raise ConfigError(
            f"the quality reference '{spec.reference}' is not a variant of this run",
            hint=f"variants: {', '.join(releases)}",
        )
    run_id = new_run_id(datetime.now(timezone.utc))
    logs = logs_root / run_id
    logs.mkdir(parents=True, exist_ok=True)
    on_device = device_model(transport, device, model_path)
    model = ModelInfo(path=model_path, sha256=on_device.sha256)
    tool_model = on_device.tool_path
    corpus = push_corpus(transport, device, spec.corpus)
    if on_variant:
        on_variant(f"reference {spec.reference}")
    base = record_reference(
        transport, device, releases[spec.reference], spec, tool_model, corpus[1], logs
    )
    reference_release = release_named(transport, device, releases[spec.reference])
    reference = QualityReference(
        spec.reference, reference_release.build_id, dict(spec.reference_options)
    )
    found = []
    try:
        for variant, release in releases.items():
            if on_variant:
                on_variant(variant)
            record = check_variant(
                transport,
                device,
                variant,
                release,
                spec,
                model=model,
                corpus=corpus,
                base=base,
                reference=reference,
                logs=logs,
                tool_model=tool_model,
            )
            store.add(record)
            found.append(record)
    finally:
        transport.run(["rm", "-f", base])
    return found


def check_tools(transport: Transport, device: Device, variants: Sequence[VariantBuild]) -> None:
    """Every deployed variant has llama-perplexity: checked before the bench, so a release without
    it fails in seconds rather than after the whole interleaved run."""
    for variant in variants:
        if variant.release is not None:
            check_tool(transport, device, release_named(transport, device, variant.release), TOOL)


def check_ab(
    settings: Settings,
    transport: Transport,
    device: Device,
    variants: Sequence[VariantBuild],
    spec: QualitySpec,
    model_path: str,
    *,
    on_variant: Callable[[str], None] | None = None,
) -> tuple[tuple[QualityRecord, ...], tuple[PatchQuality, ...]]:
    """kzbuild ab's quality check: every deployed variant against the reference, stored with the
    results, and what each patch does to the output."""
    deployed = [v for v in variants if v.release is not None]
    releases = {v.spec.name: v.release for v in deployed if v.release is not None}
    records = check_variants(
        transport,
        device,
        releases,
        spec,
        model_path,
        quality_store(settings.results),
        settings.work / "quality",
        on_variant=on_variant,
    )
    without = {v.spec.name: v.spec.without for v in deployed if v.spec.name != FULL}
    return tuple(records), tuple(patch_quality(records, without, FULL, spec.limits))


# --- what each patch does to the output ---
def patch_quality(
    records: Sequence[QualityRecord],
    without: Mapping[str, str | None],
    full: str,
    limits: QualityLimits,
) -> list[PatchQuality]:
    """For each variant besides ``full`` (its name -> the patch it leaves out, None for upstream):
    the full stack's output against the variant's. A patch is wrong when the full stack is wrong and
    the stack without it is right (it is what breaks the output), or when its own share of the mean
    KL divergence is past ``max_kld``; upstream's row is the whole stack's verdict."""
    by_variant = {r.variant: r for r in records}
    if full not in by_variant:
        return []
    top = by_variant[full]
    found = []
    for variant, patch in without.items():
        other = by_variant.get(variant)
        if other is None or variant == full:
            continue
        added = top.stats.kld_mean - other.stats.kld_mean
        if patch is None:
            wrong, why = top.verdict == WRONG, "; ".join(top.problems)
        elif top.verdict == WRONG and other.verdict == RIGHT:
            wrong, why = (
                True,
                f"the stack is wrong with it ({'; '.join(top.problems)}) and right without it",
            )
        elif limits.max_kld is not None and added > limits.max_kld:
            wrong, why = (
                True,
                f"it adds {added:.6f} to the mean KLD, more than max_kld {limits.max_kld:g}",
            )
        else:
            wrong, why = False, ""
        found.append(
            PatchQuality(
                variant=variant,
                patch=patch,
                full=top,
                without=other,
                verdict=WRONG if wrong else RIGHT,
                why=why,
            )
        )
    return found


def spec_with_limits(
    spec: QualitySpec | None, *, max_kld: float | None, min_top1: float | None
) -> QualitySpec | None:
    """The plan's quality check with the command line's limits over its own; the defaults when only
    the command line asks for one; None when neither does."""
    if max_kld is None and min_top1 is None:
        return spec
    base = spec or QualitySpec()
    limits = QualityLimits(
        max_kld=max_kld if max_kld is not None else base.limits.max_kld,
        min_top1=min_top1 if min_top1 is not None else base.limits.min_top1,
    )
    return replace(base, limits=limits)


def kld_change(judged: PatchQuality) -> str:
    return f"{judged.without.stats.kld_mean:.6f} -> {judged.full.stats.kld_mean:.6f}"


def markdown(records: Sequence[QualityRecord], patches: Sequence[PatchQuality]) -> str:
    """Each variant's output, and what each patch does to it, as markdown tables (empty without a
    check)."""
    if not records:
        return ""
    lines = [
        "",
        "| variant | mean KLD | 99% KLD | top-1 % | PPL ratio | output |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in records:
        s = r.stats
        verdict = f"**{r.verdict}** ({'; '.join(r.problems)})" if r.problems else r.verdict
        lines.append(
            f"| {r.variant} | {s.kld_mean:.6f} | {s.kld_p99:.6f} | {s.top1_pct:.3f} | "
            f"{s.ppl_ratio:.4f} | {verdict} |"
        )
    lines += ["", "| patch | mean KLD without -> full | output |", "|---|---|---|"]
    for judged in patches:
        verdict = f"**{judged.verdict}** ({judged.why})" if judged.why else judged.verdict
        lines.append(
            f"| {judged.patch or 'whole stack (vs upstream)'} | {kld_change(judged)} | {verdict} |"
        )
    return "\n".join(lines) + "\n"


# --- storage ---
def quality_store(folder: Path) -> JsonlStore[QualityRecord]:
    """``results/quality.jsonl``: one quality record per line, beside the bench records."""
    return JsonlStore(folder, QUALITY_FILE, QualityRecord.from_dict, "quality record")
