// Host harness: ggml-hexagon's GATED_DELTA_NET placement decision, run on this machine.
//
// The test cuts ggml_hexagon_supported_gated_delta_net and ggml_hexagon_precompute_gated_delta_net_params
// out of one tree's ggml-hexagon.cpp into a file it names with -DKZ_GDN_DECISION_SOURCE, so
// the same harness runs the pin's decision and the patched one. Everything those functions
// read is real: the op is built by ggml_gated_delta_net (libggml-base), the VTCM layouts
// come from the tree's htp/gated-delta-net-ops.h. Only the session is a stand-in, holding the
// three fields the decision reads.
//
// stdin: one case per line, ten integers:
//   S_v H n_tokens n_seqs K kda gdn_select n_hmx n_threads vtcm_budget
// stdout: one line per case: the case, then  path n_threads n_heads_batch vtcm_bytes
// where path is cpu (supports_op refused the op) or the kernel the precompute chose: hvx | hmx.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "ggml.h"
#include "ggml-impl.h"
#include "htp/gated-delta-net-ops.h"

struct ggml_hexagon_session {
    uint32_t n_threads;
    uint32_t n_hmx;
    uint64_t vtcm_size;
};

static int opt_gdn_select = 2;
#define HEX_VERBOSE(...) ((void) 0)

static void ggml_hexagon_precompute_gated_delta_net_params(const struct ggml_hexagon_session * sess,
                                                           const struct ggml_tensor * op,
                                                           struct htp_gdn_kernel_params * kparams);

#include KZ_GDN_DECISION_SOURCE

int main(void) {
    struct ggml_init_params params = { 1024 * 1024, nullptr, true };  // tensor metadata only
    long long S_v, H, n_tokens, n_seqs, K, kda, gdn_select, n_hmx, n_threads, budget;
    while (scanf("%lld %lld %lld %lld %lld %lld %lld %lld %lld %lld", &S_v, &H, &n_tokens, &n_seqs, &K, &kda,
                 &gdn_select, &n_hmx, &n_threads, &budget) == 10) {
        struct ggml_context * ctx = ggml_init(params);
        struct ggml_tensor * q     = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, S_v, H, n_tokens, n_seqs);
        struct ggml_tensor * k     = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, S_v, H, n_tokens, n_seqs);
        struct ggml_tensor * v     = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, S_v, H, n_tokens, n_seqs);
        struct ggml_tensor * g     = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, kda ? S_v : 1, H, n_tokens, n_seqs);
        struct ggml_tensor * beta  = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, 1, H, n_tokens, n_seqs);
        struct ggml_tensor * state = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, S_v, S_v, H, n_seqs);
        struct ggml_tensor * op    = ggml_gated_delta_net(ctx, q, k, v, g, beta, state, K);

        const struct ggml_hexagon_session sess = { (uint32_t) n_threads, (uint32_t) n_hmx, (uint64_t) budget };
        opt_gdn_select = (int) gdn_select;

        const char * path = "cpu";
        struct htp_gdn_kernel_params kparams;
        memset(&kparams, 0, sizeof(kparams));
        if (ggml_hexagon_supported_gated_delta_net(&sess, op)) {
            ggml_hexagon_precompute_gated_delta_net_params(&sess, op, &kparams);
            path = kparams.kernel_type == HTP_GDN_KERNEL_HMX_CHUNKED ? "hmx" : "hvx";
        }
        printf("%lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %s %u %u %u\n", S_v, H, n_tokens, n_seqs, K, kda,
               gdn_select, n_hmx, n_threads, budget, path, kparams.n_threads, (unsigned) kparams.n_heads_batch,
               kparams.vtcm_size);
        ggml_free(ctx);
    }
    return 0;
}
