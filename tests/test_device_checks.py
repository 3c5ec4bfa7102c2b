"""``Kz-Device-Test`` trailers and ``kzbuild check RECIPE --device D``: a patch's per-op checks run
on the
device through kzbuild run's runner (tiny upstream, real builds and deploys to a local device), each
result stored with its provenance; a failing check exits 14."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kzbuild.measure.devicetest import device_test_store
from kzbuild.source.stack.patchfile import device_tests, parse_patch, read_patch, trailer_problems
from tests.conftest import REPO_ROOT, Project, UpstreamRepo
from tests.fixtures_build import TINY_CMAKE, TINY_MAIN, Tiny, install_toolchains
from tests.test_stack_lint import GOOD

# test-backend-ops shaped: checks each -o OP against ggml (which a patch can break), exits 1 on a
# failure
BACKEND_OPS = r"""
#include <stdio.h>
#include <string.h>
int ggml_op_ok(const char * op);
int main(int argc, char ** argv) {
    int failed = 0;
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "-o") == 0) {
            int ok = ggml_op_ok(argv[i + 1]);
            printf("  %s(type=f32): %s\n", argv[i + 1], ok ? "OK" : "FAIL");
            failed += !ok;
        }
    }
    printf("%s\n", failed ? "1/1 backends passed\nFAIL" : "1/1 backends passed\nOK");
    return failed != 0;
}
"""
GGML = (
    "int ggml_answer(void) { return 42; }\nint ggml_op_ok(const char * op) { (void) op; return 1; "
    "}\n"
)
CMAKE = TINY_CMAKE.replace("llama-completion test-backend-ops)", "llama-completion)") + (
    "add_executable(test-backend-ops "
    "tests/test-backend-ops.c)\ntarget_link_libraries(test-backend-ops PRIVATE ggml)\n"
)
TRAILERS = "\n\nUpstream-Status: Pending\nKz-Test: tests/test_device_checks.py"


@pytest.fixture
def ops_tiny(project: Project, upstream: UpstreamRepo, tmp_path: Path) -> Tiny:
    commit = upstream.commit(
        {
            "CMakeLists.txt": CMAKE,
            "tools/main.c": TINY_MAIN,
            "tests/test-backend-ops.c": BACKEND_OPS,
            "ggml/src/ggml.c": GGML,
        },
        "tiny llama.cpp-shaped build with a test-backend-ops",
    )
    install_toolchains(project)
    project.recipe(
        "tiny",
        commit=commit,
        sources=[f"path: {upstream.path}"],
        extra="build:\n  targets: [host]\n",
    )
    project.write(
        "recipes/devices.yaml",
        f"devices:\n  box:\n    transport: local\n    root: {tmp_path / 'device'}\n",
    )
    return Tiny(project, upstream, commit)


ARG = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=20)


@settings(max_examples=200, deadline=None)
@given(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True), st.lists(ARG, max_size=6))
def test_a_device_test_trailer_gives_back_its_tool_and_arguments(tool, args):
    value = shlex.join([tool, *args])
    text = GOOD.replace(
        "Kz-Test: tests/test_fit.py::test_breakdown", f"Kz-Test: t\nKz-Device-Test: {value}"
    )
    patch = parse_patch(text, Path("fix.patch"))
    assert trailer_problems(patch) == []
    (test,) = device_tests(patch)
    assert (test.tool, test.args, test.line) == (tool, tuple(args), 10)


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40))
def test_a_device_test_trailer_is_either_read_or_a_lint_problem_on_its_line(value):
    text = GOOD.replace(
        "Kz-Test: tests/test_fit.py::test_breakdown", f"Kz-Test: t\nKz-Device-Test: {value}"
    )
    patch = parse_patch(text, Path("fix.patch"))
    found = device_tests(patch)
    problems = [p for p in trailer_problems(patch) if "Kz-Device-Test" in p.message]
    assert (len(found), len(problems)) in ((1, 0), (0, 1))
    assert all(p.line == 10 for p in problems)


def test_the_gdn_patch_names_its_op():
    patch = read_patch(
        REPO_ROOT / "patches" / "ggml-hexagon-accept-gated_delta_net-when-its-hvx-kernel-fits.patch"
    )
    (test,) = device_tests(patch)
    assert (test.tool, test.args) == ("test-backend-ops", ("-o", "GATED_DELTA_NET", "-b", "HTP0"))


def test_check_runs_each_patchs_device_tests_on_the_device_and_stores_them(kz, ops_tiny, tmp_path):
    broken = GGML.replace(
        "(void) op; return 1;", 'return strcmp(op, "GATED_DELTA_NET") != 0;'
    ).replace("int ggml_answer", "#include <string.h>\nint ggml_answer")
    ops_tiny.add_patch(
        "gdn.patch",
        {"ggml/src/ggml.c": broken},
        "ggml: gdn" + TRAILERS + "\nKz-Device-Test: test-backend-ops -o GATED_DELTA_NET -b CPU",
    )
    ops_tiny.add_patch(
        "docs.patch",
        {"README.md": "documented\n"},
        "docs"
        + TRAILERS
        + "\nKz-Device-Test: test-backend-ops -o 'SOFT_MAX' -b CPU\nKz-Device-Test: "
        "llama-completion --version",
    )
    assert kz("build", "tiny").code == 0
    deployed = kz("deploy", "tiny", "--device", "box", "--json")
    assert deployed.code == 0, deployed.err
    result = kz("check", "tiny", "--device", "box", "--json")
    assert result.code == 17, result.err
    assert "gdn.patch: test-backend-ops -o GATED_DELTA_NET -b CPU failed (exit 1" in " ".join(
        result.err.split()
    )
    found = json.loads(result.out)["results"]
    assert [(r["patch"], r["command"], r["passed"], r["returncode"]) for r in found] == [
        ("gdn.patch", "test-backend-ops -o GATED_DELTA_NET -b CPU", False, 1),
        ("docs.patch", "test-backend-ops -o SOFT_MAX -b CPU", True, 0),
        ("docs.patch", "llama-completion --version", True, 0),
    ]
    first = found[0]
    release = json.loads(deployed.out)["release"]
    assert (
        first["argv"][0] == f"{tmp_path / 'device'}/releases/{release}/bin/test-backend-ops"
    )  # kzbuild run's runner: the release's tool
    assert first["argv"][1:] == ["-o", "GATED_DELTA_NET", "-b", "CPU"]
    assert (
        first["build"]["recipe"] == "tiny"
        and first["build"]["build_id"]
        and first["device"]["name"] == "box"
    )
    assert "GATED_DELTA_NET(type=f32): FAIL" in Path(first["logs"] + ".stdout.log").read_text()
    stored = device_test_store(ops_tiny.project.root / "results").records()
    assert [(r.command, r.passed) for r in stored] == [(r["command"], r["passed"]) for r in found]

    shown = kz("check", "tiny", "--device", "box")
    assert shown.code == 17 and "FAILED (exit 1)" in shown.out and "passed" in shown.out


def test_check_refuses_a_release_of_another_recipe_and_a_stack_without_device_tests(kz, ops_tiny):
    ops_tiny.add_patch("docs.patch", {"README.md": "documented\n"}, "docs" + TRAILERS)
    assert kz("build", "tiny").code == 0 and kz("deploy", "tiny", "--device", "box").code == 0
    none = kz("check", "tiny", "--device", "box")
    assert none.code == 2 and "no patch of tiny names a device check" in none.err
    ops_tiny.project.write(
        "recipes/other.yaml", (ops_tiny.project.root / "recipes" / "tiny.yaml").read_text()
    )
    ops_tiny.add_patch(
        "ops.patch",
        {"NOTES.md": "more\n"},
        "ops" + TRAILERS + "\nKz-Device-Test: test-backend-ops -o ADD",
    )
    other = kz("check", "other", "--device", "box")
    assert other.code == 2 and "is a build of tiny, not other" in " ".join(other.err.split())
