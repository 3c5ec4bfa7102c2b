"""``kzbuild build demo-host --target v79-check`` on the real pinned tree (slow: it syncs 0c1e57098
with the stack and compiles every Hexagon source; ccache makes later runs seconds).

Breakage is made the way a contributor would: edit the synced worktree, ``kzbuild patches new``,
then check. Each test has its own project and work dir (tests.fixtures_trees.private_project);
the object cache and ccache are the shared test caches.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from kzbuild.build.v79check import HOST_SOURCES, HTP, PROVES, load_stand_ins
from kzbuild.cli import main
from tests.conftest import CliResult, Project
from tests.fixtures_trees import private_project

pytestmark = pytest.mark.slow

EM_HEXAGON, EM_AARCH64 = 164, 183


@pytest.fixture
def real(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[Project, Callable[..., CliResult]]:
    pytest.importorskip("ziglang", reason="the v79 check needs the 'ziglang' package")
    project = private_project(tmp_path)

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        code = main(
            [
                "--project",
                str(project.root),
                "--cache-dir",
                str(project.cache),
                "--work-dir",
                str(project.work),
                *args,
            ]
        )
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return project, run


def e_machine(path: Path) -> int:
    data = path.read_bytes()
    assert data[:4] == b"\x7fELF", path
    return int.from_bytes(data[18:20], "little")


def squashed(text: str) -> str:
    """``text`` without any whitespace: rich folds long lines, and may drop the space it folds
    at."""
    return re.sub(r"\s+", "", text)


def says(err: str, text: str) -> bool:
    return squashed(text) in squashed(err)


def named_patches(err: str) -> str:
    """The patches a failed check names, comma-separated, without spaces."""
    return squashed(err).split("patchesofthestackthatchangethesefiles:")[1].split("ggml/")[0]


def break_file(
    project: Project, run: Callable[..., CliResult], relpath: str, code: str, name: str
) -> None:
    """Append ``code`` to ``relpath`` of the synced demo-host tree and make that the patch
    ``name``."""
    assert run("sync", "demo-host").code == 0
    path = project.work / "src" / "demo-host" / relpath
    path.write_text(path.read_text() + "\n" + code + "\n")
    result = run(
        "patches",
        "new",
        name,
        "demo-host",
        "-m",
        f"test: break {Path(relpath).name}",
        "--test",
        "tests/test_v79check_real.py",
    )
    assert result.code == 0, result.err


def test_the_pinned_tree_with_the_stack_compiles(real):
    project, run = real
    result = run("build", "demo-host", "--target", "v79-check", "--json")
    assert result.code == 0, result.err
    out = json.loads(result.out)
    assert out["proves"] == PROVES and "nothing linked, nothing run" in PROVES
    artifact = Path(out["artifact"])
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["target"] == "v79-check" and manifest["build_id"] == out["build_id"].strip()
    assert re.fullmatch(r"v79-check-[0-9a-f]{16}", manifest["build_id"])
    tree = project.work / "src" / "demo-host"
    sources = sorted(p.name for p in (tree / HTP).glob("*.c"))
    assert len(sources) > 25
    compiled = {c["source"]: c for c in manifest["compiles"]}
    assert set(compiled) == {f"{HTP}/{s}" for s in sources} | {
        f"ggml/src/ggml-hexagon/{s}" for s in HOST_SOURCES
    }
    for source in sources:
        assert e_machine(artifact / "objects" / "htp" / source.replace(".c", ".o")) == EM_HEXAGON
    for source in HOST_SOURCES:
        assert e_machine(artifact / "objects" / "host" / source.replace(".cpp", ".o")) == EM_AARCH64
    assert {"-Wall", "-Werror"} <= set(compiled[f"{HTP}/main.c"]["argv"])
    # HMX asm became nop in the scratch copy only: the worktree is untouched
    assert "ggml/src/ggml-hexagon/htp/hmx-utils.h" in manifest["asm_no_ops"]
    assert "mxmem" in (tree / HTP / "hmx-utils.h").read_text()
    assert (
        subprocess.run(
            ["git", "-C", str(tree), "status", "--porcelain"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        == ""
    )

    again = run("build", "demo-host", "--target", "v79-check", "--json")
    assert again.code == 0 and json.loads(again.out)["reused"] is True
    text = run("build", "demo-host", "--target", "v79-check")
    assert "compilation only" in text.out and "nothing linked" in text.out


def test_a_patch_breaking_one_hvx_file_fails_naming_the_file_and_the_patch(real):
    project, run = real
    break_file(
        project,
        run,
        f"{HTP}/binary-ops.c",
        "int kz_broken(void) { HVX_Vector v = Q6_V_vzero(); return v; }",
        "break-binary-ops",
    )
    result = run("build", "demo-host", "--target", "v79-check")
    assert result.code == 7, result.err
    err = result.err
    assert says(err, f"{HTP}/binary-ops.c (dsp side) does not compile"), err
    # the compiler's diagnostic, with the line of the patched file
    assert says(
        err,
        "error: returning 'HEXAGON_Vect1024' (vector of 32 'long' values) from a function with "
        "incompatible result type 'int'",
    ), err
    assert says(err, "| int kz_broken(void) { HVX_Vector v = Q6_V_vzero(); return v; }"), err
    assert named_patches(err) == "break-binary-ops.patch", err


def test_a_patch_breaking_ggml_hexagon_cpp_fails_the_host_side(real):
    project, run = real
    break_file(
        project,
        run,
        "ggml/src/ggml-hexagon/ggml-hexagon.cpp",
        "static int kz_broken() { return not_declared_anywhere; }",
        "break-host",
    )
    result = run("build", "demo-host", "--target", "v79-check")
    assert result.code == 7, result.err
    err = result.err
    assert says(err, "failed on the host side (1 file(s))"), err
    assert says(err, "ggml/src/ggml-hexagon/ggml-hexagon.cpp (host side) does not compile"), err
    assert says(err, "use of undeclared identifier 'not_declared_anywhere'"), err
    # the GDN patch changes ggml-hexagon.cpp too: both are named, in series order
    assert (
        named_patches(err)
        == "ggml-hexagon-accept-gated_delta_net-when-its-hvx-kernel-fits.patch,break-host.patch"
    ), err


def test_a_new_sdk_header_or_name_the_stand_ins_lack_is_named(real):
    project, run = real
    assert run("sync", "demo-host").code == 0
    tree = project.work / "src" / "demo-host"
    pad = tree / HTP / "pad-ops.c"
    pad.write_text("#include <HAP_vtcm_mgr.h>\n" + pad.read_text())
    fill = tree / HTP / "fill-ops.c"
    fill.write_text(fill.read_text() + "\nint kz_new(void) { return qurt_new_sdk_call(1); }\n")
    assert (
        run(
            "patches", "new", "new-sdk-use", "demo-host", "-m", "test: new SDK use", "--test", "x"
        ).code
        == 0
    )
    result = run("build", "demo-host", "--target", "v79-check")
    assert result.code == 6, result.err
    err = result.err
    assert says(
        err,
        "the Hexagon SDK stand-ins lack name 'qurt_new_sdk_call' (used at "
        "ggml/src/ggml-hexagon/htp/fill-ops.c:",
    ), err
    assert says(
        err, "; header <HAP_vtcm_mgr.h> (included at ggml/src/ggml-hexagon/htp/pad-ops.c:1:10)"
    ), err


def test_the_stand_ins_are_minimal_every_declared_name_is_used_by_the_tree(real):
    project, run = real
    assert run("sync", "demo-host").code == 0
    hexagon = project.work / "src" / "demo-host" / "ggml/src/ggml-hexagon"
    used = "\n".join(
        p.read_text() for p in hexagon.rglob("*") if p.suffix in (".c", ".h", ".cpp", ".idl")
    )
    stand_ins = load_stand_ins(project.root)
    for header, names in stand_ins.headers.items():
        text = (stand_ins.include / header).read_text()
        for name in names:
            assert re.search(rf"\b{re.escape(name)}\b", text), f"{header} does not declare {name}"
            assert re.search(rf"\b{re.escape(name)}\b", used), (
                f"{header}: {name} is declared but the tree never uses it"
            )
        if header not in ("qurt-libc.h", "htp_iface.h", "AEEStdDef.h"):
            assert re.search(rf"#\s*include\s*[<\"]{re.escape(header)}[>\"]", used), (
                f"the tree never includes {header}"
            )
