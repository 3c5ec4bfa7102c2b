"""Fixtures for the ab tests: a tiny upstream whose llama-bench prints llama-bench JSON with a speed its patches change."""

from __future__ import annotations

import pytest

from tests.conftest import Project, UpstreamRepo
from tests.fixtures_build import TINY_CMAKE, Tiny, install_toolchains

# llama-bench -o json shaped output: one pp32 test whose throughput comes from ggml (patches change it)
BENCH_MAIN = r"""
#include <stdio.h>
double ggml_speed(void);
int main(void) {
    double s = ggml_speed();
    printf("[{\"build_commit\":\"%s\",\"model_type\":\"tiny\",\"model_size\":1000,\"n_prompt\":32,\"n_gen\":0,\"n_depth\":0,"
           "\"n_threads\":1,\"avg_ts\":%.3f,\"stddev_ts\":1.0,\"samples_ts\":[%.3f,%.3f,%.3f]}]\n",
           LLAMA_BUILD_COMMIT, s, s * 0.99, s, s * 1.01);
    return 0;
}
"""
SPEED = "double ggml_speed(void) {\n    return 100.0;\n}\n"


@pytest.fixture
def bench_tiny(project: Project, upstream: UpstreamRepo) -> Tiny:
    return make_bench_tiny(project, upstream)


def make_bench_tiny(
    project: Project, upstream: UpstreamRepo, recipe: str = "tiny", extra: str = ""
) -> Tiny:
    """The recipe ``recipe`` builds, for the host, a tiny upstream whose llama-bench prints JSON."""
    commit = upstream.commit(
        {"CMakeLists.txt": TINY_CMAKE, "tools/main.c": BENCH_MAIN, "ggml/src/ggml.c": SPEED},
        "tiny llama.cpp-shaped build whose llama-bench prints JSON",
    )
    install_toolchains(project)
    build = "build:\n  targets: [host]\n"
    project.recipe(recipe, commit=commit, sources=[f"path: {upstream.path}"], extra=build + extra)
    return Tiny(project, upstream, commit)
