"""The GDN patch's decision, the pin's and the patched one, side by side on the host.

ggml-hexagon decides where a GATED_DELTA_NET op runs in two functions of ggml-hexagon.cpp:
``ggml_hexagon_supported_gated_delta_net`` (supports_op: NPU or CPU) and
``ggml_hexagon_precompute_gated_delta_net_params`` (which kernel: HMX chunked or HVX recurrent).
The test cuts both functions out of each tree's ggml-hexagon.cpp, the pin's own and the patched
one, and compiles each pair into kernels/gdn/host/gdn_supports_harness.cpp with the host
compiler, against the tree's own headers and the session's libggml-base (the op is built by
ggml_gated_delta_net). Both harnesses run the same cases; what differs is what the patch changes.

Qwen3.5-4B's gated delta net, from the tree's loader (src/models/qwen35.cpp) and converter
(conversion/qwen.py): S_v = head_v_dim = ssm.state_size = 128, H = linear_num_value_heads = 32
(q/k: 16 key heads, broadcast), a scalar gate per head and K = 1. The head counts are the model's
published config; the tree has no 4B config.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
from dataclasses import dataclass, fields
from pathlib import Path

import pytest

from kzbuild.model.build import BuildResult
from tests.conftest import REPO_ROOT
from tests.fixtures_gdn import HEXAGON_CPP, function_definition

pytestmark = pytest.mark.slow

HOST = REPO_ROOT / "kernels" / "gdn" / "host"
KiB = 1024
MiB = 1024 * KiB
PAD3_VTCM = (
    8 * MiB
)  # what the session gets on Pad3, and ggml-hexagon's default when the hardware query fails
QWEN35_4B = {"S_v": 128, "H": 32}
DECISION_FUNCTIONS = (
    "ggml_hexagon_supported_gated_delta_net",
    "ggml_hexagon_precompute_gated_delta_net_params",
)


@dataclass(frozen=True)
class Case:
    S_v: int
    H: int
    n_tokens: int
    n_seqs: int = 1
    K: int = 1
    kda: bool = False
    gdn_select: int = 2
    n_hmx: int = 1
    n_threads: int = 8
    budget: int = PAD3_VTCM

    def line(self) -> str:
        return " ".join(str(int(getattr(self, f.name))) for f in fields(self))

    @property
    def hmx_eligible(self) -> bool:
        """What the HMX kernel takes, from ggml-hexagon.cpp at the pin (before any VTCM check)."""
        return (
            self.gdn_select >= 2
            and self.n_hmx > 0
            and self.S_v % 64 == 0
            and self.n_tokens >= 8
            and not self.kda
            and self.K == 1
        )


@dataclass(frozen=True)
class Decision:
    path: str  # cpu (supports_op refused) | hvx | hmx (the kernel the precompute chose)
    n_threads: int
    n_heads_batch: int
    vtcm_bytes: int


def compile_decision(tree: Path, libdir: Path, out: Path) -> Path:
    """The harness with ``tree``'s own two decision functions."""
    if shutil.which("g++") is None:
        pytest.fail("g++ is not installed (scripts/setup installs it)")
    source = (tree / HEXAGON_CPP).read_text()
    decision = out.with_suffix(".inc")
    decision.write_text("".join(function_definition(source, name) for name in DECISION_FUNCTIONS))
    argv = [
        "g++",
        "-std=c++17",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-Wno-unused-function",  # ggml-impl.h's unused static helpers
        "-include",
        str(HOST / "hexagon-host-compat.h"),
        f'-DKZ_GDN_DECISION_SOURCE="{decision}"',
        "-I",
        str(tree / "ggml/include"),
        "-I",
        str(tree / "ggml/src"),
        "-I",
        str(tree / "ggml/src/ggml-hexagon"),
        str(HOST / "gdn_supports_harness.cpp"),
        "-L",
        str(libdir),
        "-lggml-base",
        f"-Wl,-rpath,{libdir}",
        "-o",
        str(out),
    ]
    result = subprocess.run(argv, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(argv)}\n{result.stderr}"
    return out


@pytest.fixture(scope="module")
def harnesses(
    gdn_trees, real_host_build: BuildResult, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:  # noqa: F811
    out = tmp_path_factory.mktemp("gdn-harness")
    libdir = real_host_build.artifact.path / "lib"
    return {side: compile_decision(tree, libdir, out / side) for side, tree in gdn_trees.items()}


def decide(harness: Path, cases: list[Case]) -> list[Decision]:
    result = subprocess.run(
        [harness],
        input="".join(c.line() + "\n" for c in cases),
        capture_output=True,
        text=True,
        check=True,
    )
    lines = result.stdout.splitlines()
    assert len(lines) == len(cases), result.stdout[-2000:]
    decisions = []
    for case, line in zip(cases, lines, strict=True):
        words = line.split()
        assert words[:10] == case.line().split(), line
        path, threads, batch, vtcm = words[10:]
        decisions.append(Decision(path, int(threads), int(batch), int(vtcm)))
    return decisions


def side_by_side(
    harnesses: dict[str, Path], cases: list[Case]
) -> list[tuple[Case, Decision, Decision]]:
    return list(
        zip(
            cases, decide(harnesses["pin"], cases), decide(harnesses["patched"], cases), strict=True
        )
    )


def wide_grid() -> list[Case]:
    """Shapes, session settings and VTCM budgets from 64 KiB to 8 MiB."""
    budgets = [kib * KiB for kib in range(64, 1025, 16)] + [b * MiB for b in (2, 4, 8)]
    return [
        Case(
            S_v=s_v,
            H=32,
            n_tokens=t,
            n_seqs=s,
            K=k,
            kda=kda,
            gdn_select=g,
            n_hmx=hmx,
            n_threads=th,
            budget=b,
        )
        for s_v, t, s, k, kda, g, hmx, th, b in itertools.product(
            (64, 96, 128),
            (1, 7, 8, 512),
            (1, 4),
            (1, 2),
            (False, True),
            (0, 1, 2),
            (0, 1),
            range(1, 9),
            budgets,
        )
    ]


def test_the_patch_moves_ops_from_cpu_to_hvx_only_where_hmx_does_not_fit(harnesses):
    """Where pin and patch differ: the pin said CPU, the patch says HVX; they agree on every other
    case.

    They differ exactly for ops the HMX kernel would take whose HMX layout does not fit the budget
    while the HVX layout does: the pin's supports_op refused those, its precompute chose HVX.
    """
    compared = side_by_side(harnesses, wide_grid())
    differ = [(case, pin, patched) for case, pin, patched in compared if pin != patched]
    assert differ, "the patch changes no decision"
    assert {(pin.path, patched.path) for _, pin, patched in differ} == {("cpu", "hvx")}
    assert all(case.hmx_eligible for case, _, _ in differ)
    assert all(
        0 < patched.vtcm_bytes <= case.budget and patched.n_heads_batch == 1
        for case, _, patched in differ
    )
    assert {case.S_v for case, _, _ in differ} == {64, 128}  # S_v 96 never takes HMX
    assert max(case.budget for case, _, _ in differ) < 1 * MiB


def test_at_pad3s_8_mib_the_patch_changes_nothing(harnesses):
    """Qwen3.5-4B on Pad3 (8 MiB of VTCM): both trees decide alike, for every thread count and
    setting."""
    cases = [
        Case(**QWEN35_4B, n_tokens=t, n_seqs=s, gdn_select=g, n_threads=th)
        for t, s, g, th in itertools.product(
            (1, 7, 8, 64, 512, 2048), (1, 4), (0, 1, 2), range(1, 9)
        )
    ]
    compared = side_by_side(harnesses, cases)
    assert all(pin == patched for _, pin, patched in compared)
    for case, _, patched in compared:
        if case.gdn_select == 0:
            assert patched.path == "cpu"
        elif case.gdn_select == 2 and case.n_tokens >= 8 and case.n_threads == 8:
            # prefill: chunked on HMX, 8 heads per batch, in 7,690,240 bytes of VTCM
            assert (patched.path, patched.n_heads_batch, patched.vtcm_bytes) == (
                "hmx",
                8,
                7_690_240,
            ), case
        elif case.n_tokens < 8 and case.n_threads == 8:
            assert (patched.path, patched.vtcm_bytes) == ("hvx", 8 * 128 * KiB), (
                case
            )  # decode: recurrent on HVX


@pytest.mark.parametrize(
    ("s_v", "hvx_kib_per_thread", "hmx_base_kib"),
    [(128, 128, 806), (64, 32, 390)],
    ids=["S_v=128", "S_v=64"],
)
def test_where_they_differ_by_threads_and_budget(harnesses, s_v, hvx_kib_per_thread, hmx_base_kib):
    """The HVX kernel needs a fixed VTCM per thread; the HMX layout fits from base + 8 x threads
    KiB.

    Pin and patch differ exactly in between, to the KiB: for S_v 128 (Qwen3.5) that exists only
    with 6 threads or fewer and ends below 854 KiB, for S_v 64 with every thread count.
    """
    cases = [
        Case(S_v=s_v, H=32, n_tokens=512, n_threads=th, budget=kib * KiB)
        for th in range(1, 9)
        for kib in range(16, 1025)
    ]
    differ = {
        (case.n_threads, case.budget // KiB)
        for case, pin, patched in side_by_side(harnesses, cases)
        if pin != patched
    }
    expected = {
        (th, kib)
        for th in range(1, 9)
        for kib in range(hvx_kib_per_thread * th, hmx_base_kib + 8 * th)
    }
    assert differ == expected
    if s_v == 128:
        assert {th for th, _ in differ} == set(range(1, 7)) and max(kib for _, kib in differ) == 853
        (d,) = decide(
            harnesses["patched"], [Case(**QWEN35_4B, n_tokens=512, n_threads=6, budget=768 * KiB)]
        )
        assert d == Decision("hvx", 6, 1, 768 * KiB)
