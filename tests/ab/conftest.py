"""Fixtures for the ab tests: a tiny upstream whose llama-bench prints llama-bench JSON with a speed
its patches change."""

from __future__ import annotations

import hashlib

import pytest

from tests.conftest import Project, UpstreamRepo
from tests.fixtures_build import TINY_CMAKE, Tiny, install_toolchains

# llama-bench -o json shaped output: one pp32 test whose throughput comes from ggml (patches
# change it)
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
STAND_IN = b"GGUF stand-in"  # the model file on the device: the tiny tools never read it
# a plan benching the tiny llama-bench's one test with that model
STAND_IN_PLAN = f"""\
model:
  path: models/q.gguf
  sha256: {hashlib.sha256(STAND_IN).hexdigest()}
repetitions: 1
runs:
  - name: prefill
    options: {{p: 32, n: 0, t: 1}}
"""


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


# A llama-perplexity shaped like upstream's: with --kl-divergence-base FILE alone it records the
# reference's log-probabilities over the scored positions of every chunk; with --kl-divergence too
# it
# compares its own against them and prints the statistics block in upstream's line formats. Its
# "logits" come from ggml (ggml_logit), so a patch of ggml perturbs the output as a kernel bug
# would.
PERPLEXITY_CPP = r"""
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
extern "C" float ggml_logit(int pos, int tok);
#define VOCAB 16
static int cmp(const void * a, const void * b) {
    double x = *(const double *) a, y = *(const double *) b;
    return x < y ? -1 : x > y;
}
static void log_softmax(int pos, double * out) {
    double top = -1e30, sum = 0;
    for (int t = 0; t < VOCAB; t++) { out[t] = ggml_logit(pos, t); if (out[t] > top) top = out[t]; }
    for (int t = 0; t < VOCAB; t++) sum += exp(out[t] - top);
    for (int t = 0; t < VOCAB; t++) out[t] = out[t] - top - log(sum);
}
static double pct(const double * sorted, int n, double f) {
    double p = f * (n - 1); int i = (int) p; p -= i;
    return (1 - p) * sorted[i] + p * sorted[i + 1 < n ? i + 1 : n - 1];
}
int main(int argc, char ** argv) {
    int ctx = 512, chunks = 4, compare = 0;
    const char * base = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-c") && i + 1 < argc) ctx = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--chunks") && i + 1 < argc) chunks = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--kl-divergence-base") && i + 1 < argc) base = argv[++i];
        else if (!strcmp(argv[i], "--kl-divergence")) compare = 1;
    }
    if (!base) { fprintf(stderr, "main: --kl-divergence-base is required here\n"); return 1; }
    int n = (ctx - 1 - ctx / 2) * chunks;
    double * lp = (double *) malloc(sizeof(double) * VOCAB), * ref = (double *) malloc(sizeof(double) * VOCAB);
    fprintf(stderr, "kl_divergence: computing over %d chunks, n_ctx=%d, batch_size=%d, n_seq=1\n", chunks, ctx, ctx);
    if (!compare) {
        FILE * f = fopen(base, "wb");
        if (!f) { fprintf(stderr, "perplexity: failed to open %s for writing\n", base); return 1; }
        double nll = 0;
        for (int i = 0; i < n; i++) { log_softmax(i, lp); fwrite(lp, sizeof(double), VOCAB, f); nll -= lp[(i * 7) % VOCAB]; }
        fclose(f);
        printf("Final estimate: PPL = %.4lf +/- %.5lf\n", exp(nll / n), 0.0);
        return 0;
    }
    FILE * f = fopen(base, "rb");
    if (!f) { fprintf(stderr, "kl_divergence: failed to open %s\n", base); return 1; }
    if (remove("lose-tail-once") == 0) {  // as upstream's asynchronous log can: exit 0, the last lines unwritten
        printf("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence\n");
        return 0;
    }
    double * kld = (double *) malloc(sizeof(double) * n);
    double nll = 0, nll_base = 0, sum = 0, sum2 = 0; int same = 0;
    for (int i = 0; i < n; i++) {
        if (fread(ref, sizeof(double), VOCAB, f) != VOCAB) { fprintf(stderr, "kl_divergence: short base\n"); return 1; }
        log_softmax(i, lp);
        double k = 0; int top = 0, top_ref = 0;
        for (int t = 0; t < VOCAB; t++) {
            k += exp(ref[t]) * (ref[t] - lp[t]);
            if (lp[t] > lp[top]) top = t;
            if (ref[t] > ref[top_ref]) top_ref = t;
        }
        kld[i] = k; sum += k; sum2 += k * k; same += top == top_ref;
        nll -= lp[(i * 7) % VOCAB]; nll_base -= ref[(i * 7) % VOCAB];
    }
    fclose(f);
    qsort(kld, n, sizeof(double), cmp);
    double mean = sum / n, unc = sqrt(fmax(sum2 / n - mean * mean, 0) / (n - 1));
    double ppl = exp(nll / n), ppl_base = exp(nll_base / n), top1 = (double) same / n;
    printf("====== Perplexity statistics ======\n");
    printf("Mean PPL(Q)                   : %10.6lf ± %10.6lf\n", ppl, 0.01 * ppl);
    printf("Mean PPL(base)                : %10.6lf ± %10.6lf\n", ppl_base, 0.01 * ppl_base);
    printf("Cor(ln(PPL(Q)), ln(PPL(base))): %6.2lf%%\n", 99.5);
    printf("Mean ln(PPL(Q)/PPL(base))     : %10.6lf ± %10.6lf\n", log(ppl / ppl_base), 0.0);
    printf("Mean PPL(Q)/PPL(base)         : %10.6lf ± %10.6lf\n", ppl / ppl_base, 0.0);
    printf("Mean PPL(Q)-PPL(base)         : %10.6lf ± %10.6lf\n", ppl - ppl_base, 0.0);
    printf("\n====== KL divergence statistics ======\n");
    printf("Mean    KLD: %10.6lf ± %10.6lf\n", mean, unc);
    printf("Maximum KLD: %10.6f\n", kld[n - 1]);
    printf("99.9%%   KLD: %10.6f\n", pct(kld, n, 0.999));
    printf("99.0%%   KLD: %10.6f\n", pct(kld, n, 0.990));
    printf("Median  KLD: %10.6f\n", pct(kld, n, 0.5));
    printf("Minimum KLD: %10.6f\n", kld[0]);
    printf("\n====== Token probability statistics ======\n");
    printf("Same top p: %6.3lf ± %5.3lf %%\n", 100.0 * top1, 100.0 * sqrt(top1 * (1 - top1) / (n - 1)));
    return 0;
}
"""
LOGIT = (
    "float ggml_logit(int pos, int tok) {\n    return (float) ((pos * 31 + tok * 17) % 23) / "
    "4.0f;\n}\n"
)
QUALITY_CMAKE = (
    TINY_CMAKE.replace("project(tinyllama C)", "project(tinyllama C CXX)")
    + "add_executable(llama-perplexity "
    "tools/perplexity/perplexity.cpp)\ntarget_link_libraries(llama-perplexity PRIVATE ggml m)\n"
)


@pytest.fixture
def quality_tiny(project: Project, upstream: UpstreamRepo) -> Tiny:
    """bench_tiny's upstream, plus a llama-perplexity whose logits a patch of ggml can perturb."""
    commit = upstream.commit(
        {
            "CMakeLists.txt": QUALITY_CMAKE,
            "tools/main.c": BENCH_MAIN,
            "tools/perplexity/perplexity.cpp": PERPLEXITY_CPP,
            "ggml/src/ggml.c": SPEED + LOGIT,
        },
        "tiny llama.cpp-shaped build with llama-bench JSON and llama-perplexity's KL divergence",
    )
    install_toolchains(project)
    tools = "  tools: [llama-bench, llama-completion, test-backend-ops, llama-perplexity]\n"
    project.recipe(
        "tiny",
        commit=commit,
        sources=[f"path: {upstream.path}"],
        extra="build:\n  targets: [host]\n" + tools,
    )
    return Tiny(project, upstream, commit)
