/* Token rows to expert slots and back: the sparse dispatch / combine of
 * DeepSpeed's MoE (index lists from the gate, never an (S, E, Cap) mask),
 * their gradients, the two layouts of the expert rows (padded to the
 * capacity for training's all-to-all, packed for serving's dropless
 * all-to-all-v), and the axis swap that turns the first all-to-all's
 * (source rank, local expert) blocks into one block per local expert.
 *
 * The row movement itself is the kernels' (dsc_kernel_moe_*: vectorised,
 * parallel over tokens on the caller's pool or OpenMP, a CUDA version for
 * device buffers); this file turns (expert, slot) routes into the kernels'
 * destination rows once per layout.
 *
 * Not here: the all-to-alls themselves and the experts (moe/layer.c,
 * moe/dropless.c). */
#include <string.h>

#include "dsc/kernels.h"
#include "moe/moe_internal.h"

/* r->dest[i] = row0[expert] + slot for kept routes, -1 for dropped ones. */
static dsc_status fill_dest(dsc_moe_gate_result *r, const int64_t *row0) {
    const int64_t n = r->num_tokens * r->k;
    DSC_CHECK(row0[r->num_experts] <= INT32_MAX, DSC_ERR_INVALID,
              "moe dispatch: %lld expert rows exceed the int32 route row", (long long)row0[r->num_experts]);
    for (int64_t i = 0; i < n; i++)
        r->dest[i] = r->slot[i] < 0 ? -1 : (int32_t)(row0[r->expert[i]] + r->slot[i]);
    return NULL;
}

dsc_status moe_rows_padded(dsc_moe_gate_result *r, int64_t *row0) {
    for (int64_t e = 0; e <= r->num_experts; e++)
        row0[e] = e * r->capacity;
    return fill_dest(r, row0);
}

dsc_status moe_rows_packed(dsc_moe_gate_result *r, int64_t *row0) {
    row0[0] = 0;
    for (int64_t e = 0; e < r->num_experts; e++)
        row0[e + 1] = row0[e] + r->kept_counts[e];
    return fill_dest(r, row0);
}

/* Views of one call: token rows (S, M), expert rows (R, M), routes (S, K) and weights (S, K). */
typedef struct moe_views {
    dsc_tensor tokens, rows, dest, weight;
} moe_views;

static moe_views views(const dsc_moe_gate_result *r, const int64_t *row0, const float *tokens, const float *rows,
                       int64_t M) {
    const int64_t S = r->num_tokens, K = r->k, R = row0[r->num_experts];
    return (moe_views){
        .tokens = dsc_tensor_view((float *)tokens, DSC_DTYPE_F32, 2, (int64_t[]){S, M}, DSC_CPU),
        .rows = dsc_tensor_view((float *)rows, DSC_DTYPE_F32, 2, (int64_t[]){R, M}, DSC_CPU),
        .dest = dsc_tensor_view(r->dest, DSC_DTYPE_I32, 2, (int64_t[]){S, K}, DSC_CPU),
        .weight = dsc_tensor_view(r->weight, DSC_DTYPE_F32, 2, (int64_t[]){S, K}, DSC_CPU),
    };
}

/* Zeroes each expert's rows after its kept routes (slots kept_counts[e] .. of its block; none when packed). */
static dsc_status zero_padding(const dsc_moe_gate_result *r, const int64_t *row0, float *rows, int64_t M) {
    for (int64_t e = 0; e < r->num_experts; e++) {
        const int64_t n = (row0[e + 1] - row0[e] - r->kept_counts[e]) * M;
        if (n <= 0) continue;
        dsc_tensor pad = dsc_tensor_view(rows + (row0[e] + r->kept_counts[e]) * M, DSC_DTYPE_F32, 1, &n, DSC_CPU);
        DSC_TRY(dsc_kernel_zero(&pad));
    }
    return NULL;
}

dsc_status moe_dispatch(const dsc_moe_gate_result *r, const int64_t *row0, const float *x, int64_t M, float *buf) {
    moe_views v = views(r, row0, x, buf, M);
    DSC_TRY(zero_padding(r, row0, buf, M));
    return dsc_kernel_moe_scatter(&v.rows, &v.tokens, &v.dest);
}

dsc_status moe_combine(const dsc_moe_gate_result *r, const int64_t *row0, const float *y, int64_t M, float *out) {
    moe_views v = views(r, row0, out, y, M);
    return dsc_kernel_moe_gather(&v.tokens, &v.rows, &v.dest, &v.weight, false);
}

dsc_status moe_combine_backward(const dsc_moe_gate_result *r, const int64_t *row0, const float *dout,
                                const float *y, int64_t M, float *dy, float *d_weight) {
    moe_views v = views(r, row0, dout, y, M);
    dsc_tensor dyv = dsc_tensor_view(dy, DSC_DTYPE_F32, 2, v.rows.shape, DSC_CPU);
    dsc_tensor dw = dsc_tensor_view(d_weight, DSC_DTYPE_F32, 2, v.dest.shape, DSC_CPU);
    DSC_TRY(zero_padding(r, row0, dy, M));
    return dsc_kernel_moe_combine_backward(&dyv, &dw, &v.tokens, &v.rows, &v.dest, &v.weight);
}

dsc_status moe_dispatch_backward(const dsc_moe_gate_result *r, const int64_t *row0, const float *dbuf, int64_t M,
                                 float *dx, bool accumulate) {
    moe_views v = views(r, row0, dx, dbuf, M);
    return dsc_kernel_moe_gather(&v.tokens, &v.rows, &v.dest, NULL, accumulate);
}

void moe_swap_axes_v(const float *src, float *dst, const int64_t *rows, int64_t a, int64_t b, int64_t inner) {
    int64_t at = 0;
    for (int64_t j = 0; j < b; j++) {
        int64_t from = 0; /* rows of the blocks before (i, j): running over i, plus j's row-major offset */
        for (int64_t k = 0; k < j; k++)
            from += rows[k];
        for (int64_t i = 0; i < a; i++) {
            memcpy(dst + at * inner, src + from * inner, (size_t)(rows[i * b + j] * inner) * sizeof *src);
            at += rows[i * b + j];
            for (int64_t k = i * b + j; k < (i + 1) * b + j && i + 1 < a; k++)
                from += rows[k];
        }
    }
}
