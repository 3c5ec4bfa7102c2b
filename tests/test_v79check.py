"""The v79 compile check's parts, on small trees shaped like ggml-hexagon (fast tier).

The real tree is checked in tests/test_v79check_real.py (slow). Here: the HMX-to-nop rewrite of
the scratch copy, stand-ins.yaml and its errors, the naming of stand-in gaps and of the patches
involved in a failure, and real compiles with zig's clang of a tiny HTP source and host source
against the real stand-ins.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kzbuild.adapters.settings import Settings
from kzbuild.build.artifacts import find_artifact
from kzbuild.build.v79check import (
    HEXAGON,
    HTP,
    Compile,
    CompileOutcome,
    ccache_env,
    failure,
    involved_patches,
    load_stand_ins,
    make_scratch,
    neutralise_asm,
    plan_compiles,
    run_compile,
    stand_in_gaps,
    zig_version,
)
from kzbuild.errors import BuildFailed, ConfigError, ToolchainMissing
from kzbuild.source.recipes import load_recipe
from tests.conftest import REPO_ROOT

HMX_PATTERNS = [r"\bmxmem2?\b", r"\bmxclracc\b", r"\bupmucnt\d\b"]
HMX_HEADER = """#pragma once
#define HMX_LOAD(act, wt, range)              \\
    "{\\n"                                    \\
    "    activation.hf = mxmem(" act ", " range ")\\n" \\
    "    weight.hf = mxmem(" wt ", " range ")\\n"      \\
    "}\\n"
#define HMX_CLR() "mxclracc.hf\\n"
#define NOT_HMX "syncht"
static inline unsigned pmu(void) { unsigned v; asm volatile("%0 = upmucnt0" : "=r"(v)); return v; }
static inline void fence(void) { asm volatile("syncht" ::: "memory"); }
"""


def test_hmx_macros_and_literals_become_nop_and_lines_stay():
    text, changed = neutralise_asm(HMX_HEADER, HMX_PATTERNS)
    assert changed == 3
    assert text.count("\n") == HMX_HEADER.count("\n")
    assert "mxmem" not in text and "mxclracc" not in text and "upmucnt" not in text
    assert '#define HMX_LOAD(act, wt, range) "nop\\n" \\' in text
    assert '#define HMX_CLR() "nop\\n"' in text
    assert 'asm volatile("nop\\n" : "=r"(v))' in text
    assert '#define NOT_HMX "syncht"' in text and 'asm volatile("syncht" ::: "memory")' in text


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.sampled_from(HMX_HEADER.splitlines() + ["", "int x;", '"mxmem"', "#define A \\", "  1"]),
        max_size=30,
    )
)
def test_the_rewrite_keeps_line_numbers_and_leaves_no_hmx(lines):
    source = "\n".join(lines)
    text, _ = neutralise_asm(source, HMX_PATTERNS)
    assert text.count("\n") == source.count("\n")
    assert not re.search("|".join(HMX_PATTERNS), text)


def test_the_repo_stand_ins_are_declared_and_load():
    stand_ins = load_stand_ins(REPO_ROOT)
    assert set(stand_ins.headers) == {p.name for p in stand_ins.include.iterdir()}
    assert "qurt.h" in stand_ins.headers and "FARF" in stand_ins.headers["HAP_farf.h"]
    for header, names in stand_ins.headers.items():
        text = (stand_ins.include / header).read_text()
        assert names, header
        for name in names:
            assert re.search(rf"\b{re.escape(name)}\b", text), f"{header} does not declare {name}"
    assert stand_ins.is_sdk_name("qurt_new") and not stand_ins.is_sdk_name("hvx_vec_splat")


def copy_kernels(tmp_path: Path) -> Path:
    shutil.copytree(REPO_ROOT / "kernels", tmp_path / "kernels")
    return tmp_path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda t: t.replace("  HAP_ps.h:", "  HAP_nothere.h:"),
            r"stand-ins.yaml:\d+: HAP_nothere.h: no such stand-in header",
        ),
        (
            lambda t: t.replace("  HAP_ps.h: [HAP_setFARFRuntimeLoggingParams]\n", ""),
            r"headers: the stand-in HAP_ps.h is not declared",
        ),
        (
            lambda t: t.replace("[HAP_setFARFRuntimeLoggingParams]", "[[nested]]"),
            r"stand-ins.yaml:\d+: HAP_ps.h.*must be a string",
        ),
        (
            lambda t: t.replace(r"'\bmxclracc\b'", "'(unclosed'"),
            r"stand-ins.yaml:\d+: pattern: not a regular expression",
        ),
        (lambda t: t.replace("asm_no_ops:", "asm_no_opz:"), r"asm_no_opz"),
    ],
)
def test_bad_stand_ins_yaml_names_file_line_and_key(tmp_path, edit, message):
    root = copy_kernels(tmp_path)
    path = root / "kernels/hexagon-sdk/stand-ins.yaml"
    path.write_text(edit(path.read_text()))
    with pytest.raises(ConfigError, match=message):
        load_stand_ins(root)


def outcome(source: str, diagnostics: str, side: str = "dsp") -> CompileOutcome:
    return CompileOutcome(Compile(side, source, (), "objects/x.o"), False, False, diagnostics, 0.1)


def test_stand_in_gaps_are_sdk_headers_and_names_only():
    stand_ins = load_stand_ins(REPO_ROOT)
    failed = [
        outcome(
            f"{HTP}/a.c",
            f"{HTP}/a.c:3:10: fatal error: 'HAP_vtcm_mgr.h' file not found\n    3 | #include "
            "<HAP_vtcm_mgr.h>\n",
        ),
        outcome(
            f"{HTP}/d.c",
            f"{HTP}/d.c:2:10: fatal error: 'deleted-by-a-patch.h' file not found\n    2 | #include "
            '"deleted-by-a-patch.h"\n',
        ),
        outcome(
            f"{HTP}/b.c",
            f"{HTP}/b.c:9:12: error: call to undeclared function 'qurt_new_call'; ISO C99 ...\n"
            f"{HTP}/b.c:10:1: error: use of undeclared identifier 'my_typo'\n",
        ),
    ]
    assert stand_in_gaps(failed, stand_ins) == [
        f"header <HAP_vtcm_mgr.h> (included at {HTP}/a.c:3:10)",
        f"name 'qurt_new_call' (used at {HTP}/b.c:9:12)",
    ]
    assert isinstance(failure(failed, {}, stand_ins, "r"), ToolchainMissing)


def test_a_failure_names_the_patches_that_change_the_files_in_the_diagnostic():
    stand_ins = load_stand_ins(REPO_ROOT)
    failed = [
        outcome(
            f"{HTP}/c.c",
            f"In file included from {HTP}/c.c:4:\n{HTP}/hvx-base.h:12:5: error: expected ';'\n",
        )
    ]
    patches = {
        "one.patch": frozenset({f"{HTP}/hvx-base.h"}),
        "two.patch": frozenset({"common/fit.cpp"}),
        "three.patch": frozenset({f"{HTP}/c.c"}),
    }
    assert involved_patches(patches, failed) == ["one.patch", "three.patch"]
    error = failure(failed, patches, stand_ins, "demo")
    assert isinstance(error, BuildFailed) and error.exit_code == 7
    assert "patches of the stack that change these files: one.patch, three.patch" in error.message
    assert (
        f"{HTP}/c.c (dsp side) does not compile" in error.message
        and "expected ';'" in error.message
    )
    upstream = failure(failed, {"two.patch": frozenset({"common/fit.cpp"})}, stand_ins, "demo")
    assert "no patch of the stack changes these files" in upstream.message


# --- real compiles of a tiny tree ----------------------------------------------------------

HTP_SOURCE = """#include <HAP_farf.h>
#include <qurt.h>
#include <hexagon_types.h>
#include <hexagon_protos.h>
#include "hmx.h"
#include "tiny.h"
int tiny_add(void) {
    HVX_Vector a = Q6_V_vsplat_R(1);
    HVX_Vector b = Q6_Vsf_vadd_VsfVsf(a, a);
    asm volatile(HMX_CLR());
    FARF(HIGH, "compiled out %d", 1);
    return qurt_thread_get_id() + (int) sizeof(b) + TINY;
}
"""
HOST_SOURCE = """#include <AEEStdErr.h>
#include <dspqueue.h>
#include <rpcmem.h>
#include "htp_iface.h"
#include "tiny.h"
int tiny_host() { void * p = rpcmem_alloc(RPCMEM_HEAP_ID_SYSTEM, RPCMEM_DEFAULT_FLAGS, TINY); return p ? AEE_SUCCESS : 1; }
"""


def tiny_tree(root: Path, htp_source: str = HTP_SOURCE, host_source: str = HOST_SOURCE) -> Path:
    for rel, text in {
        "ggml/include/ggml.h": "#pragma once\n",
        "ggml/src/tiny.h": "#pragma once\n#define TINY 3\n",
        f"{HTP}/hmx.h": HMX_HEADER,
        f"{HTP}/tiny.c": htp_source,
        f"{HEXAGON}/ggml-hexagon.cpp": host_source,
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


@pytest.fixture
def compiled(tmp_path: Path):
    pytest.importorskip("ziglang", reason="the v79 check needs the 'ziglang' package")
    stand_ins = load_stand_ins(REPO_ROOT)
    env = ccache_env(
        Settings(project=REPO_ROOT, cache=tmp_path / "cache", work=tmp_path), f"zig {zig_version()}"
    )

    def run(tree: Path) -> list[CompileOutcome]:
        scratch = tmp_path / "scratch"
        make_scratch(tree, scratch, stand_ins)
        return [
            run_compile(item, scratch, tmp_path / "out", env)
            for item in plan_compiles(scratch, stand_ins)
        ]

    return run


def test_a_tiny_htp_and_host_source_compile_to_hexagon_and_aarch64_objects(compiled, tmp_path):
    tree = tiny_tree(tmp_path / "tree")
    outcomes = compiled(tree)
    assert [(o.compile.side, o.compile.source, o.ok, o.cached) for o in outcomes] == [
        ("dsp", f"{HTP}/tiny.c", True, False),
        ("host", f"{HEXAGON}/ggml-hexagon.cpp", True, False),
    ]
    machines = [
        int.from_bytes((tmp_path / "out" / o.compile.object).read_bytes()[18:20], "little")
        for o in outcomes
    ]
    assert machines == [164, 183]  # EM_HEXAGON, EM_AARCH64
    assert "mxclracc" in (tree / HTP / "hmx.h").read_text()  # only the scratch copy was rewritten
    again = compiled(tree)
    assert all(o.ok and o.cached for o in again)


def test_werror_fails_the_dsp_side_with_the_compiler_diagnostic(compiled, tmp_path):
    tree = tiny_tree(
        tmp_path / "tree",
        HTP_SOURCE.replace("int tiny_add(void) {", "int tiny_add(void) {\n    int unused_here;"),
    )
    dsp, host = compiled(tree)
    assert not dsp.ok and host.ok
    assert (
        f"{HTP}/tiny.c:8:9: error: unused variable 'unused_here' [-Werror,-Wunused-variable]"
        in dsp.diagnostics
    )


# --- through the CLI, on a tiny upstream shaped like ggml-hexagon -----------------------------


@pytest.fixture
def hexagon_recipe(upstream, project):
    """Recipe 'hx': the synthetic upstream with a tiny ggml-hexagon; the project has the repo's
    stand-ins."""
    pytest.importorskip("ziglang", reason="the v79 check needs the 'ziglang' package")
    tree = tiny_tree(project.root.parent / "tiny-src")
    files = {p.relative_to(tree).as_posix(): p.read_text() for p in tree.rglob("*") if p.is_file()}
    commit = upstream.commit(files, "ggml-hexagon (synthetic)")
    shutil.copytree(REPO_ROOT / "kernels" / "hexagon-sdk", project.root / "kernels" / "hexagon-sdk")
    project.recipe("hx", commit=commit, sources=[f"path: {upstream.path}"])
    return project


def test_build_and_ci_run_the_check_and_record_it_like_a_build(hexagon_recipe, kz):
    result = kz("build", "hx", "--target", "v79-check", "--json")
    assert result.code == 0, result.err
    out = json.loads(result.out)
    assert (
        out["proves"].startswith("compilation only") and out["compiled"] == 2 and not out["reused"]
    )
    manifest = json.loads((Path(out["artifact"]) / "manifest.json").read_text())
    assert manifest["target"] == "v79-check" and manifest["build_id"] == out["build_id"]
    assert sorted(manifest["files"]) == ["objects/host/ggml-hexagon.o", "objects/htp/tiny.o"]
    assert manifest["asm_no_ops"] == {f"{HTP}/hmx.h": 3}
    text = kz("build", "hx", "--target", "v79-check")
    assert (
        "up to date" in text.out
        and "compilation only" in text.out
        and "nothing linked, nothing run" in text.out
    )
    ci = kz("ci", "hx", "--target", "v79-check")
    assert ci.code == 0, ci.err
    (step,) = [s for s in json.loads(ci.out)["steps"] if s["step"] == "build:v79-check"]
    assert (
        step["status"] == "ok"
        and step["build_id"] == out["build_id"]
        and "compilation only" in step["detail"]
    )
    with pytest.raises(ConfigError, match="no artifact of recipe hx"):  # nothing of it to deploy
        find_artifact(hexagon_recipe.settings, None, load_recipe(hexagon_recipe.root, "hx"))
    plan = json.loads(kz("build", "hx", "--target", "v79-check", "--dry-run", "--json").out)
    assert plan["build_id"] == out["build_id"] and "-Werror" in plan["dsp_flags"]


def test_a_patch_that_breaks_an_htp_file_exits_7_naming_file_and_patch(hexagon_recipe, kz):
    assert kz("sync", "hx").code == 0
    source = hexagon_recipe.work / "src" / "hx" / HTP / "tiny.c"
    source.write_text(source.read_text() + "int kz_broken(void) { return missing_thing; }\n")
    assert (
        kz("patches", "new", "break-tiny", "hx", "-m", "htp: break tiny", "--test", "t").code == 0
    )
    result = kz("build", "hx", "--target", "v79-check")
    assert result.code == 7, result.err
    err = " ".join(result.err.split())
    assert f"{HTP}/tiny.c (dsp side) does not compile" in err
    assert "use of undeclared identifier 'missing_thing'" in err
    assert "patches of the stack that change these files: break-tiny.patch" in err
    ci = kz("ci", "hx", "--target", "v79-check")
    assert ci.code == 7
