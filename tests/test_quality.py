"""The quality check's parts: llama-perplexity's KL divergence output read (hypothesis), its format
checked against a tree, the plan's quality: section, the verdicts, and the quality store."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kzbuild.device.local import LocalTransport
from kzbuild.errors import BadRecord, ConfigError, DeviceError, OutputFormatChanged, ResultsError
from kzbuild.measure import plans
from kzbuild.measure.quality import (
    CORPORA,
    EXPECTED_FORMATS,
    check_tree_formats,
    parse_kld_output,
    patch_quality,
    push_corpus,
    quality_store,
)
from kzbuild.model.device import Device
from kzbuild.model.quality import (
    CorpusInfo,
    KldStats,
    QualityLimits,
    QualityRecord,
    QualityReference,
)
from kzbuild.model.result import BuildInfo, DeviceInfo, ModelInfo
from tests.ab.conftest import PERPLEXITY_CPP

FIGURES = (
    "ppl",
    "ppl_base",
    "ppl_ratio",
    "kld_mean",
    "kld_mean_unc",
    "kld_p99",
    "kld_median",
    "kld_max",
    "top1_pct",
    "top1_unc_pct",
)


def render(stats: KldStats, noise: tuple[str, ...] = ()) -> str:
    """What upstream's printf calls print for these figures (its own format strings, C's %lf as
    %f)."""
    values = {
        "Mean PPL(Q)": (stats.ppl, 0.5),
        "Mean PPL(base)": (stats.ppl_base, 0.5),
        "Mean PPL(Q)/PPL(base)": (stats.ppl_ratio, 0.01),
        "Mean    KLD": (stats.kld_mean, stats.kld_mean_unc),
        "Maximum KLD": (stats.kld_max,),
        "99.0%   KLD": (stats.kld_p99,),
        "Median  KLD": (stats.kld_median,),
        "Same top p": (stats.top1_pct, stats.top1_unc_pct),
    }
    lines = [
        "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence           "
        "   Δp RMS            Same top p",
        *noise,
    ]
    for label, fmt in EXPECTED_FORMATS.items():
        lines.append((fmt.replace("lf", "f").removesuffix(r"\n")) % values[label])
    lines.insert(5, "99.9%   KLD:   0.123456")
    lines.append("RMS Δp    :  0.000 ± 0.000 %")
    return "\n".join(lines) + "\n"


numbers = st.floats(min_value=0, max_value=1e4, allow_nan=False)
stats_strategy = st.builds(
    KldStats,
    **{
        name: st.floats(min_value=0, max_value=100, allow_nan=False)
        if name.startswith("top1")
        else numbers
        for name in FIGURES
    },
)
noise_lines = st.lists(
    st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=60).filter(
        lambda t: ":" not in t
    ),
    max_size=5,
)


@settings(max_examples=200, deadline=None)
@given(stats_strategy, noise_lines)
def test_every_figure_printed_in_upstreams_formats_is_read_back(stats, noise):
    parsed = parse_kld_output(render(stats, tuple(noise)), source="out.log")
    for name in FIGURES:
        decimals = 3 if name.startswith("top1") else 6
        assert math.isclose(
            getattr(parsed, name), getattr(stats, name), abs_tol=0.6 * 10**-decimals
        ), name


@settings(max_examples=100, deadline=None)
@given(
    stats_strategy,
    st.sampled_from(sorted(EXPECTED_FORMATS)),
    st.sampled_from(["n/a", "1.0 ±", "12 %", "-", "1.0 1.0"]),
)
def test_a_known_line_of_another_shape_is_refused_naming_its_line(stats, label, junk):
    text = render(stats)
    lines = text.splitlines()
    number = next(
        i
        for i, line in enumerate(lines, start=1)
        if line.startswith(label + ":") or line.startswith(label + " ")
    )
    lines[number - 1] = f"{label}: {junk}"
    with pytest.raises(BadRecord, match=rf"out.log:{number}: "):
        parse_kld_output("\n".join(lines), source="out.log")


def test_output_without_the_statistics_names_what_is_missing_and_how_to_get_it():
    with pytest.raises(ResultsError, match="printed no 'Mean PPL") as found:
        parse_kld_output("kl_divergence: computing over 1 chunks, n_ctx=64\n", source="out.log")
    assert "100 or more scored tokens" in (found.value.hint or "")


def test_nan_logits_are_refused():
    text = render(KldStats(*(1.0,) * 10)).replace(
        "Mean    KLD:   1.000000", "Mean    KLD:        nan"
    )
    with pytest.raises(BadRecord, match="not numbers"):
        parse_kld_output(text, source="out.log")


def test_the_tree_format_check_accepts_upstreams_lines_and_refuses_a_changed_one():
    check_tree_formats(PERPLEXITY_CPP, "tiny's perplexity.cpp")
    changed = PERPLEXITY_CPP.replace(
        '"Same top p: %6.3lf ± %5.3lf %%\\n"', '"Top-1 agreement: %6.3lf%%\\n"'
    )
    assert changed != PERPLEXITY_CPP
    with pytest.raises(
        OutputFormatChanged, match=r"expected, not in the tree: Same top p"
    ) as found:
        check_tree_formats(changed, "tiny's perplexity.cpp")
    assert found.value.exit_code == 13


PLAN = """\
model: {name: q.gguf, sha256: null}
runs:
  - name: one
    options: {p: 32, n: 0}
quality:
%s
"""


def write_plan(tmp_path: Path, quality: str) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(PLAN % quality)
    return path


def test_a_plans_quality_section_is_read():
    plan = plans.load_plan(Path(__file__).parent.parent / "plans" / "gdn-prefill-pad3.yaml")
    assert (
        plan.quality is not None
        and plan.quality.limits.max_kld is not None
        and plan.quality.limits.min_top1 is not None
    )
    assert dict(plan.quality.options)["dev"] == "HTP0" and plan.quality.reference == "upstream"


@pytest.mark.parametrize(
    ("quality", "said"),
    [
        ("  corpus: fr-atelier", "a quality check needs a limit"),
        ("  max_kld: -1", "max_kld: must be a number from 0 to inf"),
        ("  min_top1: 101", "min_top1: must be a number from 0 to 100"),
        ("  max_kld: 0.1\n  corpus: en-nothing", "there is no corpus 'en-nothing'"),
        ("  max_kld: 0.1\n  context: 16\n  chunks: 1", "scores 7 tokens"),
        ("  max_kld: 0.1\n  options: {p: 5}", "unknown llama-perplexity option 'p'"),
        ("  max_kld: 0.1\n  options: {t: '8 -x'}", "t: must be one value"),
        ("  max_kld: 0.1\n  colour: red", "colour"),
    ],
)
def test_a_bad_quality_section_names_the_plans_line(tmp_path, quality, said):
    with pytest.raises(ConfigError, match="plan.yaml:") as found:
        plans.load_plan(write_plan(tmp_path, quality))
    assert said in found.value.message


def record(variant: str, kld: float, top1: float, limits: QualityLimits) -> QualityRecord:
    stats = KldStats(
        ppl=10.0,
        ppl_base=10.0,
        ppl_ratio=1.0,
        kld_mean=kld,
        kld_mean_unc=0.0,
        kld_p99=kld * 3,
        kld_median=kld,
        kld_max=kld * 5,
        top1_pct=top1,
        top1_unc_pct=0.1,
    )
    problems = limits.problems(stats)
    return QualityRecord(
        run_id="r1",
        host_time="2026-12-04T00:00:00+00:00",
        variant=variant,
        build=BuildInfo("host-1"),
        device=DeviceInfo("box"),
        model=ModelInfo(path="models/q.gguf", sha256="a" * 64),
        corpus=CorpusInfo("fr-atelier", "b" * 64),
        reference=QualityReference("upstream", "host-0", {"dev": "none"}),
        config={"context": 512},
        stats=stats,
        limits=limits,
        verdict="wrong" if problems else "right",
        problems=problems,
        argv=("llama-perplexity",),
    )


def test_verdicts_per_variant_and_per_patch():
    limits = QualityLimits(max_kld=0.01, min_top1=95)
    records = [
        record("full", 0.05, 90, limits),
        record("minus:a.patch", 0.05, 90, limits),
        record("minus:b.patch", -0.000001, 100, limits),
        record("minus:c.patch", 0.03, 92, limits),
        record("upstream", 0.0, 100, limits),
    ]
    assert [r.verdict for r in records] == ["wrong", "wrong", "right", "wrong", "right"]
    assert records[0].problems == (
        "mean KLD 0.050000 > max_kld 0.01",
        "top-1 agreement 90.000% < min_top1 95%",
    )
    judged = {
        p.patch: p
        for p in patch_quality(
            records,
            {
                "minus:a.patch": "a.patch",
                "minus:b.patch": "b.patch",
                "minus:c.patch": "c.patch",
                "upstream": None,
            },
            "full",
            limits,
        )
    }
    assert judged["a.patch"].verdict == "right"  # as wrong without it: it changes speed only
    assert judged["b.patch"].verdict == "wrong" and "right without it" in judged["b.patch"].why
    assert (
        judged["c.patch"].verdict == "wrong" and "adds 0.020000" in judged["c.patch"].why
    )  # its own share is past max_kld
    assert judged[None].verdict == "wrong"


def test_quality_records_are_stored_and_read_back(tmp_path):
    store = quality_store(tmp_path / "results")
    first = record("full", -0.000001, 100, QualityLimits(max_kld=0.01))
    store.add(first)
    store.add(record("upstream", 0.02, 100, QualityLimits(max_kld=0.01)))
    assert store.records()[0] == first and store.records()[1].verdict == "wrong"
    (tmp_path / "results" / "quality.jsonl").write_text(
        (tmp_path / "results" / "quality.jsonl")
        .read_text()
        .replace('"verdict":"right"', '"verdict":"fine"')
    )
    with pytest.raises(BadRecord, match="quality.jsonl:1: verdict"):
        store.records()


def test_the_corpus_reaches_the_device_whole_after_a_killed_push_or_damage(tmp_path):
    root = tmp_path / "device"
    device = Device(name="box", transport="local", root=str(root))
    transport = LocalTransport(str(root))
    local = CORPORA / "fr-atelier.txt"
    sha = hashlib.sha256(local.read_bytes()).hexdigest()
    (root / "quality").mkdir(parents=True)
    (root / "quality" / f"{sha}.txt.part").write_bytes(
        local.read_bytes()[:100]
    )  # a push killed halfway
    info, remote = push_corpus(transport, device, "fr-atelier")
    assert (info.sha256, remote) == (sha, f"{root}/quality/{sha}.txt")
    assert Path(remote).read_bytes() == local.read_bytes() and not list(
        (root / "quality").glob("*.part")
    )
    Path(remote).write_bytes(b"damaged")  # other bytes under the corpus's name are replaced
    push_corpus(transport, device, "fr-atelier")
    assert Path(remote).read_bytes() == local.read_bytes()


def test_a_device_that_cannot_hold_the_corpus_is_a_device_error_naming_the_path(tmp_path):
    root = tmp_path / "device"
    root.mkdir()
    (root / "quality").write_text("a file where the folder goes")
    with pytest.raises(
        DeviceError, match=r"quality/[0-9a-f]{64}\.txt\.part failed after 0 bytes: Not a directory"
    ) as found:
        push_corpus(
            LocalTransport(str(root)),
            Device(name="box", transport="local", root=str(root)),
            "fr-atelier",
        )
    assert found.value.exit_code == 8
