"""v79 compile check of the patched HTP GDN sources (the kernel side of the GDN patch).

Compiles htp/gated-delta-net-ops.c of the synced demo-host tree (the pin, the stack and the
overlaid decision header) to a hexagonv79 object with HVX 128B, using the clang that the
``ziglang`` PyPI package bundles (it ships clang's Hexagon HVX intrinsic headers). The
Hexagon SDK is not available here: kernels/gdn/v79-stubs/ stands in for the few SDK headers
these sources include, and replaces the HMX inline assembly (which LLVM cannot assemble) with
nops in a scratch copy of hmx-utils.h. It proves the sources and the HVX code compile for
v79 with -Wall -Werror; it does not link or run anything.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.fixtures_trees import pin_tree  # noqa: F401

pytestmark = pytest.mark.slow

STUBS = REPO_ROOT / "kernels" / "gdn" / "v79-stubs"
V79_CPU = "hexagonv79+hvx_length128b+hvxv79+hvx_ieee_fp+hvx_qfloat"


def zig_cc() -> list[str]:
    try:
        import ziglang  # noqa: F401
    except ImportError:
        pytest.skip("v79 compile check not available here: the 'ziglang' PyPI package (clang for hexagon) is not installed")
    return [sys.executable, "-m", "ziglang", "cc", "-target", "hexagon-linux-musl", f"-mcpu={V79_CPU}"]


def scratch_htp(tree: Path, into: Path) -> Path:
    """A copy of the tree's htp/ whose hmx-utils.h ends by including the HMX asm stubs."""
    htp = into / "htp"
    shutil.copytree(tree / "ggml" / "src" / "ggml-hexagon" / "htp", htp)
    utils = htp / "hmx-utils.h"
    text = utils.read_text()
    guard_end = text.rindex("#endif")
    utils.write_text(text[:guard_end] + f'#include "{STUBS / "hmx-asm-stubs.h"}"\n' + text[guard_end:])
    return htp


def test_the_stubs_cover_every_hmx_asm_macro(pin_tree: Path):  # noqa: F811
    upstream = set(re.findall(r"#define (HMX_\w+)\(", (pin_tree / "ggml/src/ggml-hexagon/htp/hmx-utils.h").read_text()))
    stubbed = set(re.findall(r"#define (HMX_\w+)\(", (STUBS / "hmx-asm-stubs.h").read_text()))
    assert upstream and upstream == stubbed


def test_patched_gdn_sources_compile_for_v79(pin_tree: Path, tmp_path: Path):  # noqa: F811
    cc = zig_cc()
    htp = scratch_htp(pin_tree, tmp_path)
    obj = tmp_path / "gated-delta-net-ops.o"
    argv = [*cc, "-O2", "-Wall", "-Werror", "-Wno-unused-command-line-argument",
            "-I", str(htp), "-I", str(pin_tree / "ggml/include"), "-I", str(pin_tree / "ggml/src"), "-I", str(STUBS),
            "-c", str(htp / "gated-delta-net-ops.c"), "-o", str(obj)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{' '.join(argv)}\n{result.stderr[-4000:]}"
    header = obj.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == 164  # EM_QDSP6: Hexagon
    assert "gated-delta-net-select.h" in (htp / "gated-delta-net-ops.c").read_text()
