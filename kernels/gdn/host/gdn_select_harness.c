// Host harness for htp_gdn_plan_build (gated-delta-net-select.h) and the upstream VTCM layout
// builders it uses (htp/gated-delta-net-ops.h), compiled with the host compiler.
//
// stdin: one case per line, ten integers:
//   S_v H n_tokens n_seqs K kda gdn_select has_hmx n_threads vtcm_budget
// stdout: one line per case, the case and then the decision and the reference facts:
//   ... path n_threads n_heads_batch pipeline vtcm_bytes hmx_fits hvx_fits
// where path is cpu|hvx|hmx, and hmx_fits / hvx_fits come straight from the upstream layout
// builders (not from the decision function), so a test can check the decision against them.
#include <stdio.h>

#include "gated-delta-net-select.h"

static const char * path_name(enum htp_gdn_path path) {
    switch (path) {
        case HTP_GDN_PATH_HMX_CHUNKED:   return "hmx";
        case HTP_GDN_PATH_HVX_RECURRENT: return "hvx";
        default:                         return "cpu";
    }
}

int main(void) {
    unsigned S_v, H, n_tokens, n_seqs, K, kda, has_hmx, n_threads;
    int gdn_select;
    unsigned long long budget;
    while (scanf("%u %u %u %u %u %u %d %u %u %llu", &S_v, &H, &n_tokens, &n_seqs, &K, &kda, &gdn_select,
                 &has_hmx, &n_threads, &budget) == 10) {
        const struct htp_gdn_shape shape = { S_v, H, n_tokens, n_seqs, K, kda != 0 };
        const struct htp_gdn_resources res = { gdn_select, has_hmx != 0, n_threads, (size_t) budget };
        struct htp_gdn_plan plan;
        const enum htp_gdn_path path = htp_gdn_plan_build(&plan, &shape, &res);

        // The reference facts, computed the way upstream's two copies of the decision do.
        const uint32_t total_rows = H * n_seqs;
        const uint32_t threads    = n_threads < total_rows ? n_threads : total_rows;
        struct htp_gdn_hmx_vtcm_layout hmx;
        uint32_t n_heads_batch = 0;
        const int hmx_fits = total_rows > 0 && S_v > 0 &&
            htp_gdn_hmx_solve_layout(&hmx, S_v, HTP_GDN_CHUNK_SIZE, total_rows, (size_t) budget, threads, true, &n_heads_batch);
        struct htp_gdn_vtcm_layout hvx;
        htp_gdn_vtcm_layout_build(&hvx, S_v, threads);
        const int hvx_fits = hvx.total_bytes <= budget;

        printf("%u %u %u %u %u %u %d %u %u %llu %s %u %u %d %zu %d %d\n", S_v, H, n_tokens, n_seqs, K, kda,
               gdn_select, has_hmx, n_threads, budget, path_name(path), plan.n_threads, plan.n_heads_batch,
               path == HTP_GDN_PATH_HMX_CHUNKED && plan.hmx.pipeline, plan.vtcm_bytes, hmx_fits, hvx_fits);
    }
    return 0;
}
