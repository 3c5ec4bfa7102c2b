#ifndef HTP_GATED_DELTA_NET_SELECT_H
#define HTP_GATED_DELTA_NET_SELECT_H

// Where one GATED_DELTA_NET op runs: HMX chunked, HVX recurrent, or not on the NPU (CPU).
//
// One pure function makes the choice so that the host's supports_op check and its kernel
// parameter precompute cannot disagree. Upstream wrote the choice twice: when the HMX VTCM
// layout did not fit, supports_op refused the op (sending prefill to the CPU) while the
// precompute fell back to the HVX recurrent kernel, which would have run it.
//
// Pure C, no HTP intrinsics: it builds for the host (tests), the CPU side and the DSP.

#include <string.h>

#include "gated-delta-net-ops.h"

// GGML_HEXAGON_GDN_SELECT: 0 = never on the NPU, 1 = HVX only, >= 2 = HMX first, then HVX.
#define HTP_GDN_SELECT_CPU 0
#define HTP_GDN_SELECT_HVX 1
#define HTP_GDN_SELECT_HMX 2

enum htp_gdn_path {
    HTP_GDN_PATH_CPU           = 0,
    HTP_GDN_PATH_HVX_RECURRENT = 1,
    HTP_GDN_PATH_HMX_CHUNKED   = 2,
};

// The op's shape: v is [S_v, H, n_tokens, n_seqs]; K is op param 0 (state snapshots).
struct htp_gdn_shape {
    uint32_t S_v;
    uint32_t H;
    uint32_t n_tokens;
    uint32_t n_seqs;
    uint32_t K;
    bool     kda;  // per-channel gate (g->ne[0] == S_v) rather than one scalar per head
};

// What the session offers.
struct htp_gdn_resources {
    int      gdn_select;   // GGML_HEXAGON_GDN_SELECT
    bool     has_hmx;      // the session may use HMX
    uint32_t n_threads;    // HVX threads of the session
    size_t   vtcm_budget;  // VTCM bytes of the session
};

struct htp_gdn_plan {
    enum htp_gdn_path path;
    uint32_t n_threads;                  // min(session threads, H * n_seqs), at least 1
    uint32_t n_heads_batch;              // heads per HMX batch; 1 for HVX
    size_t   vtcm_bytes;                 // VTCM the chosen kernel needs; 0 for CPU
    struct htp_gdn_hmx_vtcm_layout hmx;  // valid when path is HMX_CHUNKED
    struct htp_gdn_vtcm_layout     hvx;  // valid when path is HVX_RECURRENT
};

static inline bool htp_gdn_shape_supported(const struct htp_gdn_shape * s) {
    return s->S_v > 0 && s->S_v <= HTP_GDN_MAX_SV && s->H > 0 && s->n_tokens > 0 && s->n_seqs > 0;
}

// The chunked HMX kernel handles a scalar gate, one state snapshot, S_v a multiple of 64 and
// at least HTP_GDN_MIN_TOKENS tokens; whether its layout fits VTCM is checked separately.
static inline bool htp_gdn_hmx_eligible(const struct htp_gdn_shape * s, const struct htp_gdn_resources * r) {
    return r->gdn_select >= HTP_GDN_SELECT_HMX && r->has_hmx && (s->S_v % 64) == 0 &&
           s->n_tokens >= HTP_GDN_MIN_TOKENS && !s->kda && s->K == 1;
}

// Choose the kernel and its VTCM layout. Never CPU when the HVX layout fits and
// gdn_select >= 1: an op the HMX kernel cannot take stays on the NPU.
static inline enum htp_gdn_path htp_gdn_plan_build(
    struct htp_gdn_plan * plan,
    const struct htp_gdn_shape * s,
    const struct htp_gdn_resources * r
) {
    memset(plan, 0, sizeof(*plan));
    plan->path = HTP_GDN_PATH_CPU;
    if (r->gdn_select < HTP_GDN_SELECT_HVX || !htp_gdn_shape_supported(s)) {
        return plan->path;
    }

    const uint32_t total_rows = s->H * s->n_seqs;
    plan->n_threads = r->n_threads < total_rows ? r->n_threads : total_rows;
    if (plan->n_threads == 0) {
        plan->n_threads = 1;
    }

    uint32_t n_heads_batch = 0;
    if (htp_gdn_hmx_eligible(s, r) &&
        htp_gdn_hmx_solve_layout(&plan->hmx, s->S_v, HTP_GDN_CHUNK_SIZE, total_rows, r->vtcm_budget,
                                 plan->n_threads, true, &n_heads_batch)) {
        plan->path          = HTP_GDN_PATH_HMX_CHUNKED;
        plan->n_heads_batch = n_heads_batch;
        plan->vtcm_bytes    = plan->hmx.total_bytes;
        return plan->path;
    }

    htp_gdn_vtcm_layout_build(&plan->hvx, s->S_v, plan->n_threads);
    if (plan->hvx.total_bytes <= r->vtcm_budget) {
        plan->path          = HTP_GDN_PATH_HVX_RECURRENT;
        plan->n_heads_batch = 1;
        plan->vtcm_bytes    = plan->hvx.total_bytes;
    }
    return plan->path;
}

// Fill the kernel-selection fields of the kernel parameters from an NPU plan.
static inline void htp_gdn_kernel_params_set_plan(
    struct htp_gdn_kernel_params * kp,
    const struct htp_gdn_plan * plan,
    uint32_t n_tokens
) {
    kp->n_threads = plan->n_threads;
    if (plan->path == HTP_GDN_PATH_HMX_CHUNKED) {
        kp->kernel_type     = HTP_GDN_KERNEL_HMX_CHUNKED;
        kp->pipeline        = plan->hmx.pipeline ? 1 : 0;
        kp->chunk_size      = HTP_GDN_CHUNK_SIZE;
        kp->n_chunks        = (uint16_t) ((n_tokens + HTP_GDN_CHUNK_SIZE - 1) / HTP_GDN_CHUNK_SIZE);
        kp->n_heads_batch   = (uint16_t) plan->n_heads_batch;
        kp->vtcm_size       = (uint32_t) plan->hmx.total_bytes;
        kp->state_aligned   = (uint32_t) plan->hmx.state_f32_bytes;
        kp->vtcm_per_thread = (uint32_t) (plan->hmx.total_bytes / plan->n_threads);
    } else {
        kp->kernel_type     = HTP_GDN_KERNEL_HVX_RECURRENT;
        kp->pipeline        = 0;
        kp->n_heads_batch   = 1;
        kp->vtcm_size       = (uint32_t) plan->hvx.total_bytes;
        kp->state_aligned   = (uint32_t) plan->hvx.state_aligned;
        kp->vtcm_per_thread = (uint32_t) plan->hvx.bytes_per_thread;
    }
}

#endif // HTP_GATED_DELTA_NET_SELECT_H
