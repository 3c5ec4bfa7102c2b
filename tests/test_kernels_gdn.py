"""The GDN kernel decision (kernels/gdn/gated-delta-net-select.h) on the host, against the real tree.

The harness kernels/gdn/host/gdn_select_harness.c is compiled with the host compiler against
the demo-host tree that kzbuild synced: the pin's own htp/gated-delta-net-ops.h (VTCM layout
builders) plus the overlaid decision header. For each case it prints the decision and, from
the upstream layout builders directly, whether the HMX and the HVX layouts fit.

Qwen3.5-4B's gated delta net, from the tree's loader (src/models/qwen35.cpp) and converter
(conversion/qwen.py): S_v = head_v_dim = ssm.state_size = linear_value_head_dim = 128,
H = ssm.time_step_rank = linear_num_value_heads = 32 (q/k: linear_num_key_heads = 16, broadcast),
a scalar gate per head and K = 1; 24 of its 32 layers are GDN (full_attention_interval 4).
The head counts are the model's published config (hidden 2560, 32 layers); the tree has no 4B config.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.fixtures_trees import pin_tree  # noqa: F401

pytestmark = pytest.mark.slow

GDN_DIR = REPO_ROOT / "kernels" / "gdn"
MiB = 1024 * 1024
QWEN35_4B = {"S_v": 128, "H": 32}
N_TOKENS = (1, 7, 8, 64, 512, 2048)
N_SEQS = (1, 4)
BUDGETS = (8 * MiB, 4 * MiB, 2 * MiB, 1 * MiB)
SELECTS = (0, 1, 2)
THREADS = (4, 6, 8)  # HVX threads of a session; 8 is ggml-hexagon's default when hwinfo fails


@dataclass(frozen=True)
class Case:
    S_v: int
    H: int
    n_tokens: int
    n_seqs: int = 1
    K: int = 1
    kda: bool = False
    gdn_select: int = 2
    has_hmx: bool = True
    n_threads: int = 8
    budget: int = 8 * MiB

    def line(self) -> str:
        return " ".join(str(int(v)) for v in (self.S_v, self.H, self.n_tokens, self.n_seqs, self.K, self.kda,
                                               self.gdn_select, self.has_hmx, self.n_threads, self.budget))


@dataclass(frozen=True)
class Decision:
    case: Case
    path: str  # cpu | hvx | hmx
    n_threads: int
    n_heads_batch: int
    pipeline: bool
    vtcm_bytes: int
    hmx_fits: bool  # straight from upstream's htp_gdn_hmx_solve_layout
    hvx_fits: bool  # straight from upstream's htp_gdn_vtcm_layout_build


def compile_harness(tree: Path, out: Path, *, cxx: bool = False) -> Path:
    htp = tree / "ggml" / "src" / "ggml-hexagon" / "htp"
    compiler = "g++" if cxx else "gcc"
    if shutil.which(compiler) is None:
        pytest.fail(f"{compiler} is not installed (scripts/setup installs it)")
    language = ["-x", "c++", "-std=c++17"] if cxx else ["-std=c11"]
    argv = [compiler, *language, "-Wall", "-Wextra", "-Werror", "-include", str(GDN_DIR / "host" / "hexagon-host-compat.h"),
            "-I", str(htp), str(GDN_DIR / "host" / "gdn_select_harness.c"), "-o", str(out)]
    result = subprocess.run(argv, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(argv)}\n{result.stderr}"
    return out


@pytest.fixture(scope="module")
def harness(pin_tree: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:  # noqa: F811
    return compile_harness(pin_tree, tmp_path_factory.mktemp("gdn") / "gdn_select_harness")


def decide(harness: Path, cases: list[Case]) -> list[Decision]:
    result = subprocess.run([harness], input="".join(c.line() + "\n" for c in cases), capture_output=True, text=True, check=True)
    lines = result.stdout.splitlines()
    assert len(lines) == len(cases), result.stdout
    decisions = []
    for case, line in zip(cases, lines, strict=True):
        path, threads, batch, pipeline, vtcm, hmx_fits, hvx_fits = line.split()[10:]
        decisions.append(Decision(case, path, int(threads), int(batch), pipeline == "1", int(vtcm), hmx_fits == "1", hvx_fits == "1"))
    return decisions


def qwen_grid() -> list[Case]:
    return [Case(**QWEN35_4B, n_tokens=t, n_seqs=s, budget=b, gdn_select=g, n_threads=th)
            for t, s, b, g, th in itertools.product(N_TOKENS, N_SEQS, BUDGETS, SELECTS, THREADS)]


def test_never_cpu_when_hvx_fits(harness):
    decisions = decide(harness, qwen_grid())
    assert len(decisions) == len(N_TOKENS) * len(N_SEQS) * len(BUDGETS) * len(SELECTS) * len(THREADS)
    checked = 0
    for d in decisions:
        if d.case.gdn_select >= 1 and d.hvx_fits:
            checked += 1
            assert d.path != "cpu", d
    assert checked > 0
    for d in decisions:
        if d.path != "cpu":
            assert 0 < d.vtcm_bytes <= d.case.budget, d


def test_gdn_select_0_keeps_the_op_off_the_npu(harness):
    assert {d.path for d in decide(harness, qwen_grid()) if d.case.gdn_select == 0} == {"cpu"}


def test_hmx_exactly_when_selected_eligible_and_its_layout_fits(harness):
    for d in decide(harness, qwen_grid()):
        expect_hmx = d.case.gdn_select >= 2 and d.case.n_tokens >= 8 and d.hmx_fits
        assert (d.path == "hmx") == expect_hmx, d
        if d.path == "hvx":
            assert d.n_heads_batch == 1 and not d.pipeline


def test_qwen35_4b_prefill_on_v79_with_8_mib_is_hmx_chunked(harness):
    """The finding: at 8 MiB (and down to 1 MiB) the HMX layout always fits for Qwen3.5-4B.

    Prefill (n_tokens >= 8) runs chunked on HMX, 8 heads per batch, double-buffered, in
    7,690,240 bytes of VTCM with 8 threads; decode and n_tokens < 8 run the HVX recurrent kernel.
    The patch therefore changes nothing for this model at these budgets: it guards smaller
    budgets and other shapes (test_upstream_gap_is_closed).
    """
    cases = [Case(**QWEN35_4B, n_tokens=t, n_seqs=s) for t in N_TOKENS for s in N_SEQS]
    for d in decide(harness, cases):
        if d.case.n_tokens >= 8:
            assert (d.path, d.n_heads_batch, d.pipeline, d.vtcm_bytes) == ("hmx", 8, True, 7_690_240), d
        else:
            assert (d.path, d.vtcm_bytes) == ("hvx", 8 * 128 * 1024), d
    smallest = decide(harness, [Case(**QWEN35_4B, n_tokens=512, budget=b, n_threads=th) for b in BUDGETS for th in THREADS])
    assert all(d.path == "hmx" and d.hmx_fits for d in smallest)


def test_upstream_gap_is_closed(harness):
    """Where upstream's two copies disagreed: HMX eligible, no HMX layout fits, the HVX layout does.

    Upstream's supports_op refused these (the op went to the CPU) while its precompute chose HVX.
    """
    cases = [Case(S_v=s_v, H=32, n_tokens=512, n_threads=th, budget=kib * 1024)
             for s_v in (64, 128) for th in (1, 2, 4, 6, 8) for kib in (128, 256, 384, 512, 640, 768, 896)]
    gap = [d for d in decide(harness, cases) if not d.hmx_fits and d.hvx_fits]
    assert len(gap) >= 10
    assert {d.case.S_v for d in gap} == {64, 128}
    assert all(d.path == "hvx" for d in gap), [d for d in gap if d.path != "hvx"]
    # Qwen3.5-4B's own shape meets the gap just below 1 MiB, e.g. 6 threads with 768 KiB
    assert any(d.case.S_v == 128 and d.case.n_threads == 6 and d.case.budget == 768 * 1024 for d in gap)


def test_shapes_hmx_cannot_take_stay_on_hvx(harness):
    cases = [
        Case(**QWEN35_4B, n_tokens=512, kda=True),  # per-channel gate
        Case(**QWEN35_4B, n_tokens=512, K=2),  # state snapshots
        Case(S_v=96, H=32, n_tokens=512),  # S_v not a multiple of 64
        Case(**QWEN35_4B, n_tokens=512, has_hmx=False),  # GGML_HEXAGON_NHMX=0
        Case(**QWEN35_4B, n_tokens=512, gdn_select=1),  # HVX only
    ]
    assert [d.path for d in decide(harness, cases)] == ["hvx"] * len(cases)


def test_unsupported_shapes_and_no_room_go_to_the_cpu(harness):
    cases = [
        Case(S_v=256, H=32, n_tokens=512),  # above HTP_GDN_MAX_SV
        Case(S_v=128, H=32, n_tokens=512, budget=64 * 1024),  # neither layout fits
    ]
    assert [d.path for d in decide(harness, cases)] == ["cpu", "cpu"]


def test_threads_follow_the_rows(harness):
    d, = decide(harness, [Case(S_v=128, H=2, n_tokens=1, n_seqs=1, n_threads=8)])
    assert (d.path, d.n_threads, d.vtcm_bytes) == ("hvx", 2, 2 * 128 * 1024)


def test_the_header_also_compiles_as_cpp(pin_tree: Path, tmp_path: Path):  # noqa: F811
    """ggml-hexagon.cpp includes it as C++; the harness must build and agree in that language too."""
    cpp = compile_harness(pin_tree, tmp_path / "harness-cpp", cxx=True)
    cases = qwen_grid()[:48]
    c = compile_harness(pin_tree, tmp_path / "harness-c")
    assert decide(cpp, cases) == decide(c, cases)


def test_the_patched_tree_decides_in_one_place(pin_tree: Path):  # noqa: F811
    """No copy of the decision is left in ggml-hexagon.cpp or in the kernel-side fallback."""
    hexagon = (pin_tree / "ggml/src/ggml-hexagon/ggml-hexagon.cpp").read_text()
    kernel = (pin_tree / "ggml/src/ggml-hexagon/htp/gated-delta-net-ops.c").read_text()
    for source in (hexagon, kernel):
        assert "htp_gdn_hmx_solve_layout" not in source
        assert "htp_gdn_plan_build" in source
        assert '#include "htp/gated-delta-net-select.h"' in source or '#include "gated-delta-net-select.h"' in source
    supported = re.search(r"static bool ggml_hexagon_supported_gated_delta_net\([^;{]*\)\s*\{.*?\n}\n", hexagon, re.S)
    precompute = re.search(r"static void ggml_hexagon_precompute_gated_delta_net_params\([^;{]*\)\s*\{.*?\n}\n", hexagon, re.S)
    assert supported and "ggml_hexagon_plan_gated_delta_net" in supported.group(0)
    assert precompute and "ggml_hexagon_plan_gated_delta_net" in precompute.group(0)
    assert (pin_tree / "ggml/src/ggml-hexagon/htp/gated-delta-net-select.h").read_bytes() == (GDN_DIR / "gated-delta-net-select.h").read_bytes()
