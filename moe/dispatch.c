/* Token rows to expert slots and back: the sparse dispatch / combine of
 * DeepSpeed's MoE (index lists from the gate, never an (S, E, Cap) mask),
 * their gradients, the two layouts of the expert rows (padded to the
 * capacity for training's all-to-all, packed for serving's dropless
 * all-to-all-v), and the axis swap that turns the first all-to-all's
 * (source rank, local expert) blocks into one block per local expert.
 *
 * Not here: the all-to-alls themselves and the experts (moe/layer.c,
 * moe/dropless.c). */
#include <string.h>

#include "moe/moe_internal.h"

void moe_rows_padded(const dsc_moe_gate_result *r, int64_t *row0) {
    for (int64_t e = 0; e <= r->num_experts; e++)
        row0[e] = e * r->capacity;
}

void moe_rows_packed(const dsc_moe_gate_result *r, int64_t *row0) {
    row0[0] = 0;
    for (int64_t e = 0; e < r->num_experts; e++)
        row0[e + 1] = row0[e] + r->kept_counts[e];
}

void moe_dispatch(const dsc_moe_gate_result *r, const int64_t *row0, const float *x, int64_t M, float *buf) {
    const int64_t S = r->num_tokens, K = r->k;
    memset(buf, 0, (size_t)(row0[r->num_experts] * M) * sizeof *buf);
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < S; s++)
        for (int64_t j = 0; j < K; j++) {
            const int32_t slot = r->slot[s * K + j];
            if (slot < 0) continue;
            memcpy(buf + (row0[r->expert[s * K + j]] + slot) * M, x + s * M, (size_t)M * sizeof *x);
        }
}

void moe_combine(const dsc_moe_gate_result *r, const int64_t *row0, const float *y, int64_t M, float *out) {
    const int64_t S = r->num_tokens, K = r->k;
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < S; s++) {
        float *o = out + s * M;
        memset(o, 0, (size_t)M * sizeof *o);
        for (int64_t j = 0; j < K; j++) {
            const int32_t slot = r->slot[s * K + j];
            if (slot < 0) continue;
            const float w = r->weight[s * K + j], *row = y + (row0[r->expert[s * K + j]] + slot) * M;
            for (int64_t c = 0; c < M; c++)
                o[c] += w * row[c];
        }
    }
}

void moe_combine_backward(const dsc_moe_gate_result *r, const int64_t *row0, const float *dout, const float *y,
                          int64_t M, float *dy, float *d_weight) {
    const int64_t S = r->num_tokens, K = r->k;
    memset(dy, 0, (size_t)(row0[r->num_experts] * M) * sizeof *dy);
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < S; s++) {
        const float *g = dout + s * M;
        for (int64_t j = 0; j < K; j++) {
            const int32_t slot = r->slot[s * K + j];
            d_weight[s * K + j] = 0.0f;
            if (slot < 0) continue;
            const int64_t at = (row0[r->expert[s * K + j]] + slot) * M;
            const float w = r->weight[s * K + j];
            double dot = 0;
            for (int64_t c = 0; c < M; c++) {
                dy[at + c] = w * g[c];
                dot += (double)g[c] * y[at + c];
            }
            d_weight[s * K + j] = (float)dot;
        }
    }
}

void moe_dispatch_backward(const dsc_moe_gate_result *r, const int64_t *row0, const float *dbuf, int64_t M,
                           float *dx, bool accumulate) {
    const int64_t S = r->num_tokens, K = r->k;
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < S; s++) {
        float *d = dx + s * M;
        if (!accumulate) memset(d, 0, (size_t)M * sizeof *d);
        for (int64_t j = 0; j < K; j++) {
            const int32_t slot = r->slot[s * K + j];
            if (slot < 0) continue;
            const float *row = dbuf + (row0[r->expert[s * K + j]] + slot) * M;
            for (int64_t c = 0; c < M; c++)
                d[c] += row[c];
        }
    }
}

void moe_swap_axes(const float *src, float *dst, int64_t a, int64_t b, int64_t inner) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t i = 0; i < a; i++)
        for (int64_t j = 0; j < b; j++)
            memcpy(dst + (j * a + i) * inner, src + (i * b + j) * inner, (size_t)inner * sizeof *src);
}

void moe_swap_axes_v(const float *src, float *dst, const int64_t *rows, int64_t a, int64_t b, int64_t inner) {
    int64_t at = 0;
    for (int64_t j = 0; j < b; j++)
        for (int64_t i = 0; i < a; i++) {
            int64_t from = 0;
            for (int64_t k = 0; k < i * b + j; k++)
                from += rows[k];
            memcpy(dst + at * inner, src + from * inner, (size_t)(rows[i * b + j] * inner) * sizeof *src);
            at += rows[i * b + j];
        }
}
