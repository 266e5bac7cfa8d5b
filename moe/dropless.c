/* The dropless MoE feed-forward for serving (dsc/moe_dropless.h): gate
 * without capacity, dispatch packed by expert, the all-to-all-v exchange
 * over the expert-parallel group (per-expert counts all-gathered first, so
 * every rank knows every count and no capacity is agreed or padded), the
 * caller's experts, the mirror-image exchange back, combine, and the
 * all-gather of the token slices.
 *
 * Buffers, sized once for max_tokens: the gate result of one slice,
 * `packed` (slice routes, M) in expert order, `arrived` and `grouped`
 * (N * min(K, E_loc) routes at most: an expert gets one route per token),
 * laid out (source rank, local expert) and (local expert, source rank).
 * Not here: routing rules (gate*.c), row movement (dispatch.c), experts. */
#include <stdlib.h>
#include <string.h>

#include "dsc/memory.h"
#include "dsc/moe_dropless.h"
#include "moe/moe_internal.h"

struct dsc_moe_dropless {
    dsc_moe_dropless_options o;
    dsc_moe_gate_config gate;
    int ep_size, ep_rank;
    int32_t e0, E_loc;                 /* this rank's experts */
    int64_t max_slice, max_in;         /* routes: of one slice, arriving at this rank */
    dsc_moe_gate_result routes;        /* (slice, K) */
    int64_t *row0;                     /* (E + 1) packed rows of each expert in `packed` */
    int64_t *counts;                   /* (ep, E) every rank's routes per expert */
    int64_t *blocks, *blocks_t;        /* (ep, E_loc) and (E_loc, ep) rows of the arrived blocks */
    int64_t *send, *recv, *gather;     /* (ep) element counts of the exchanges and the slice gather */
    float *packed, *arrived, *grouped; /* DSC_MEM_ACTIVATIONS */
    size_t packed_bytes, in_bytes;
    int64_t *ran; /* (E) rows each local expert ran in the last forward */
};

void dsc_moe_split(int64_t total, int parts, int i, int64_t *first, int64_t *count) {
    int64_t base = total / parts, rem = total % parts;
    *first = i * base + (i < rem ? i : rem);
    *count = base + (i < rem);
}

void dsc_moe_expert_range(int32_t num_experts, int ep_size, int ep_rank, int32_t *first, int32_t *count) {
    int64_t f, c;
    dsc_moe_split(num_experts, ep_size, ep_rank, &f, &c);
    *first = (int32_t)f;
    *count = (int32_t)c;
}

void dsc_moe_dropless_destroy(dsc_moe_dropless *d) {
    if (!d) return;
    dsc_moe_gate_result_free(&d->routes);
    free(d->row0);
    free(d->counts);
    free(d->blocks);
    free(d->blocks_t);
    free(d->send);
    free(d->recv);
    free(d->gather);
    free(d->ran);
    if (d->packed) dsc_mem_free(d->packed, d->packed_bytes, DSC_MEM_ACTIVATIONS, DSC_CPU);
    if (d->arrived) dsc_mem_free(d->arrived, d->in_bytes, DSC_MEM_ACTIVATIONS, DSC_CPU);
    if (d->grouped) dsc_mem_free(d->grouped, d->in_bytes, DSC_MEM_ACTIVATIONS, DSC_CPU);
    free(d);
}

dsc_status dsc_moe_dropless_create(const dsc_moe_dropless_options *o, dsc_moe_dropless **out) {
    *out = NULL;
    const int ep = o->ep ? dsc_comm_size(o->ep) : 1;
    DSC_CHECK(o->num_experts >= ep && o->k >= 1 && o->k <= o->num_experts && o->width >= 1 && o->max_tokens >= 1,
              DSC_ERR_INVALID,
              "dropless MoE: need 1 <= k (%d) <= E (%d), E >= the expert-parallel size %d, width %lld >= 1 and "
              "max_tokens %lld >= 1",
              o->k, o->num_experts, ep, (long long)o->width, (long long)o->max_tokens);
    dsc_moe_dropless *d = calloc(1, sizeof *d);
    DSC_CHECK(d, DSC_ERR_NOMEM, "dropless MoE");
    d->o = *o;
    d->ep_size = ep;
    d->ep_rank = o->ep ? dsc_comm_rank(o->ep) : 0;
    dsc_moe_expert_range(o->num_experts, ep, d->ep_rank, &d->e0, &d->E_loc);
    /* Serving's gate: nothing dropped, nothing random, no losses wanted. */
    d->gate = dsc_moe_gate_config_default();
    d->gate.k = o->k;
    d->gate.weighting = o->weighting;
    d->gate.drop_tokens = false;
    d->gate.min_capacity = 0;
    d->gate.use_rts = d->gate.top2_2nd_expert_sampling = false;
    d->gate.aux_loss_coef = 0;
    int64_t first, slice, E = o->num_experts, M = o->width, K = o->k;
    dsc_moe_split(o->max_tokens, ep, 0, &first, &slice);
    d->max_slice = slice * K;
    d->max_in = o->max_tokens * (K < d->E_loc ? K : d->E_loc);
    dsc_status s = dsc_moe_gate_result_alloc(&d->routes, slice, E, o->k);
    d->row0 = calloc((size_t)E + 1, sizeof *d->row0);
    d->counts = calloc((size_t)(ep * E), sizeof *d->counts);
    d->blocks = calloc((size_t)(ep * d->E_loc), sizeof *d->blocks);
    d->blocks_t = calloc((size_t)(ep * d->E_loc), sizeof *d->blocks_t);
    d->send = calloc((size_t)ep, sizeof *d->send);
    d->recv = calloc((size_t)ep, sizeof *d->recv);
    d->gather = calloc((size_t)ep, sizeof *d->gather);
    d->ran = calloc((size_t)E, sizeof *d->ran);
    d->packed_bytes = (size_t)(d->max_slice * M) * sizeof(float);
    d->in_bytes = (size_t)(d->max_in * M) * sizeof(float);
    if (!s) s = dsc_mem_alloc((void **)&d->packed, d->packed_bytes, DSC_MEM_ACTIVATIONS, DSC_CPU);
    if (!s && ep > 1) s = dsc_mem_alloc((void **)&d->arrived, d->in_bytes, DSC_MEM_ACTIVATIONS, DSC_CPU);
    if (!s && ep > 1) s = dsc_mem_alloc((void **)&d->grouped, d->in_bytes, DSC_MEM_ACTIVATIONS, DSC_CPU);
    if (!s &&
        (!d->row0 || !d->counts || !d->blocks || !d->blocks_t || !d->send || !d->recv || !d->gather || !d->ran))
        s = dsc_error(DSC_ERR_NOMEM, "dropless MoE tables for %lld tokens, %d experts", (long long)o->max_tokens,
                      o->num_experts);
    if (s)
        s = dsc_error_wrap(s, "dropless MoE buffers for %lld tokens, width %lld", (long long)o->max_tokens,
                           (long long)M);
    if (s) {
        dsc_moe_dropless_destroy(d);
        return s;
    }
    *out = d;
    return NULL;
}

/* Gates tokens [lo, lo + S) into d->routes and packs their rows by expert. */
static dsc_status gate_and_pack(dsc_moe_dropless *d, const float *logits, const float *x, int64_t lo, int64_t S) {
    const int64_t E = d->o.num_experts, M = d->o.width;
    d->routes.num_tokens = S;
    if (S == 0) {
        memset(d->routes.kept_counts, 0, (size_t)E * sizeof *d->routes.kept_counts);
    } else {
        dsc_tensor z = dsc_tensor_view((float *)logits + lo * E, DSC_DTYPE_F32, 2, (int64_t[]){S, E}, DSC_CPU);
        DSC_TRY(dsc_moe_gate_forward(&d->gate, &z, false, NULL, NULL, &d->routes));
    }
    DSC_TRY(moe_rows_packed(&d->routes, d->row0));
    return S ? moe_dispatch(&d->routes, d->row0, x + lo * M, M, d->packed) : NULL;
}

/* Runs each local expert on its `rows` (E_loc blocks back to back, n[e] rows each). */
static dsc_status run_local(dsc_moe_dropless *d, float *rows, const int64_t *n, dsc_moe_expert_fn fn, void *user) {
    const int64_t M = d->o.width;
    for (int32_t e = 0; e < d->E_loc; e++) {
        d->ran[d->e0 + e] = n[e];
        if (n[e]) DSC_TRY(fn(user, d->e0 + e, n[e], rows));
        rows += n[e] * M;
    }
    return NULL;
}

/* The exchange: counts, rows to the experts' ranks, experts, rows back into d->packed. */
static dsc_status exchange(dsc_moe_dropless *d, dsc_moe_expert_fn fn, void *user) {
    const int ep = d->ep_size;
    const int64_t E = d->o.num_experts, M = d->o.width, L = d->E_loc;
    dsc_tensor mine = dsc_tensor_view(d->routes.kept_counts, DSC_DTYPE_I64, 1, &E, DSC_CPU);
    int64_t all_n = ep * E;
    dsc_tensor all = dsc_tensor_view(d->counts, DSC_DTYPE_I64, 1, &all_n, DSC_CPU);
    DSC_TRY(dsc_comm_allgather(d->o.ep, &mine, &all, NULL));
    int64_t sent = 0, arrived = 0;
    for (int j = 0; j < ep; j++) {
        int32_t f, c;
        dsc_moe_expert_range(d->o.num_experts, ep, j, &f, &c);
        d->send[j] = (d->row0[f + c] - d->row0[f]) * M;
        d->recv[j] = 0;
        for (int64_t e = 0; e < L; e++) {
            const int64_t n = d->counts[j * E + d->e0 + e];
            d->blocks[j * L + e] = d->blocks_t[e * ep + j] = n;
            d->recv[j] += n * M;
        }
        sent += d->send[j];
        arrived += d->recv[j];
    }
    DSC_CHECK(arrived <= d->max_in * M, DSC_ERR_INTERNAL, "dropless MoE: %lld rows arrive, %lld reserved",
              (long long)(arrived / M), (long long)d->max_in);
    dsc_tensor tx = dsc_tensor_view(d->packed, DSC_DTYPE_F32, 1, &sent, DSC_CPU);
    dsc_tensor rx = dsc_tensor_view(d->arrived, DSC_DTYPE_F32, 1, &arrived, DSC_CPU);
    DSC_TRY(dsc_comm_alltoallv(d->o.ep, &tx, d->send, &rx, d->recv));
    moe_swap_axes_v(d->arrived, d->grouped, d->blocks, ep, L, M); /* (ep, E_loc) -> (E_loc, ep) */
    for (int64_t e = 0; e < L; e++) {
        int64_t n = 0;
        for (int j = 0; j < ep; j++)
            n += d->blocks_t[e * ep + j];
        d->counts[e] = n; /* the gathered counts are spent: reuse the row as per-expert totals */
    }
    DSC_TRY(run_local(d, d->grouped, d->counts, fn, user));
    moe_swap_axes_v(d->grouped, d->arrived, d->blocks_t, L, ep, M);
    return dsc_comm_alltoallv(d->o.ep, &rx, d->recv, &tx, d->send);
}

dsc_status dsc_moe_dropless_forward(dsc_moe_dropless *d, const float *logits, const float *x, int64_t n,
                                    dsc_moe_expert_fn fn, void *user, float *out) {
    const int ep = d->ep_size;
    const int64_t E = d->o.num_experts, M = d->o.width;
    DSC_CHECK(n >= 0 && n <= d->o.max_tokens, DSC_ERR_INVALID, "dropless MoE: %lld tokens, at most %lld reserved",
              (long long)n, (long long)d->o.max_tokens);
    int64_t lo, S;
    dsc_moe_split(n, ep, d->ep_rank, &lo, &S);
    memset(d->ran, 0, (size_t)E * sizeof *d->ran);
    DSC_TRY(gate_and_pack(d, logits, x, lo, S));
    if (ep == 1) {
        int64_t *per = d->counts;
        for (int64_t e = 0; e < E; e++)
            per[e] = d->row0[e + 1] - d->row0[e];
        DSC_TRY(run_local(d, d->packed, per, fn, user));
    } else {
        DSC_TRY(exchange(d, fn, user));
    }
    if (S) DSC_TRY(moe_combine(&d->routes, d->row0, d->packed, M, out + lo * M));
    if (ep == 1) return NULL;
    for (int j = 0; j < ep; j++) {
        int64_t f, c;
        dsc_moe_split(n, ep, j, &f, &c);
        d->gather[j] = c * M;
    }
    int64_t mine = S * M, total = n * M;
    dsc_tensor piece = dsc_tensor_view(out + lo * M, DSC_DTYPE_F32, 1, &mine, DSC_CPU);
    dsc_tensor whole = dsc_tensor_view(out, DSC_DTYPE_F32, 1, &total, DSC_CPU);
    return dsc_comm_allgather(d->o.ep, &piece, &whole, d->gather);
}

void dsc_moe_dropless_expert_rows(const dsc_moe_dropless *d, int64_t *counts) {
    memcpy(counts, d->ran, (size_t)d->o.num_experts * sizeof *counts);
}
