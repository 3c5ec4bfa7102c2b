"""ggml-hexagon.cpp compiles at the pin and with the stack (the wiring of the GDN patch).

ggml-hexagon.cpp is the CPU side of the Hexagon backend; on Pad3 it is built for aarch64
Android. The test compiles it, at the pin and patched, to an aarch64 object with the clang that
the ``ziglang`` PyPI package bundles. The Hexagon SDK is not available here:
kernels/hexagon-sdk/stand-ins/ declares the SDK names it uses (AEEStdErr.h, rpcmem.h, remote.h,
dspqueue.h) and the functions of htp_iface.h, which the real build generates from
htp/htp_iface.idl. Nothing is linked or run. The patched file must compile, and with no warning
the pin's file does not have.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.fixtures_gdn import HEXAGON_CPP

pytestmark = pytest.mark.slow

STAND_INS = REPO_ROOT / "kernels" / "hexagon-sdk" / "stand-ins"


def zig_cxx() -> list[str]:
    try:
        import ziglang  # noqa: F401
    except ImportError:
        pytest.skip(
            "compile check not available here: the 'ziglang' PyPI package (clang for aarch64) is "
            "not installed"
        )
    return [sys.executable, "-m", "ziglang", "c++", "-target", "aarch64-linux-gnu"]


def compile_hexagon_cpp(tree: Path, obj: Path) -> list[str]:
    """Compile ``tree``'s ggml-hexagon.cpp; return its warnings, without file positions."""
    ggml = tree / "ggml"
    argv = [
        *zig_cxx(),
        "-std=c++17",
        "-O0",
        "-Wall",
        "-Wextra",
        "-I",
        str(ggml / "include"),
        "-I",
        str(ggml / "src"),
        "-I",
        str(ggml / "src/ggml-hexagon"),
        "-I",
        str(ggml / "src/ggml-hexagon/htp"),
        "-I",
        str(STAND_INS),
        "-c",
        str(tree / HEXAGON_CPP),
        "-o",
        str(obj),
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"{' '.join(argv)}\n{result.stderr[-4000:]}"
    assert obj.read_bytes()[:4] == b"\x7fELF"
    return sorted(
        re.sub(r"^\S+:\d+:\d+: ", "", line)
        for line in result.stderr.splitlines()
        if ": warning: " in line
    )


def test_ggml_hexagon_cpp_compiles_at_the_pin_and_patched(gdn_trees, tmp_path: Path):  # noqa: F811
    pin_warnings = compile_hexagon_cpp(gdn_trees["pin"], tmp_path / "pin.o")
    patched_warnings = compile_hexagon_cpp(gdn_trees["patched"], tmp_path / "patched.o")
    assert set(patched_warnings) <= set(pin_warnings), sorted(
        set(patched_warnings) - set(pin_warnings)
    )
