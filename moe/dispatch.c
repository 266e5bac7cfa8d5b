/* Token rows to expert slots and back: the sparse dispatch / combine of
 * DeepSpeed's MoE (index lists from the gate, never an (S, E, Cap) mask),
 * their gradients, and the axis swap that turns the first all-to-all's
 * (source rank, local expert) blocks into one block per local expert.
 *
 * Not here: the all-to-alls themselves and the experts (moe/layer.c). */
#include <string.h>

#include "moe/moe_internal.h"

void moe_dispatch(const dsc_moe_gate_result *r, const float *x, int64_t M, float *buf) {
    const int64_t S = r->num_tokens, K = r->k, Cap = r->capacity;
    memset(buf, 0, (size_t)(r->num_experts * Cap * M) * sizeof *buf);
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < S; s++)
        for (int64_t j = 0; j < K; j++) {
            const int32_t slot = r->slot[s * K + j];
            if (slot < 0) continue;
            memcpy(buf + ((int64_t)r->expert[s * K + j] * Cap + slot) * M, x + s * M, (size_t)M * sizeof *x);
        }
}

void moe_combine(const dsc_moe_gate_result *r, const float *y, int64_t M, float *out) {
    const int64_t S = r->num_tokens, K = r->k, Cap = r->capacity;
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < S; s++) {
        float *o = out + s * M;
        memset(o, 0, (size_t)M * sizeof *o);
        for (int64_t j = 0; j < K; j++) {
            const int32_t slot = r->slot[s * K + j];
            if (slot < 0) continue;
            const float w = r->weight[s * K + j], *row = y + ((int64_t)r->expert[s * K + j] * Cap + slot) * M;
            for (int64_t c = 0; c < M; c++)
                o[c] += w * row[c];
        }
    }
}

void moe_combine_backward(const dsc_moe_gate_result *r, const float *dout, const float *y, int64_t M, float *dy,
                          float *d_weight) {
    const int64_t S = r->num_tokens, K = r->k, Cap = r->capacity;
    memset(dy, 0, (size_t)(r->num_experts * Cap * M) * sizeof *dy);
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < S; s++) {
        const float *g = dout + s * M;
        for (int64_t j = 0; j < K; j++) {
            const int32_t slot = r->slot[s * K + j];
            d_weight[s * K + j] = 0.0f;
            if (slot < 0) continue;
            const int64_t at = ((int64_t)r->expert[s * K + j] * Cap + slot) * M;
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

void moe_dispatch_backward(const dsc_moe_gate_result *r, const float *dbuf, int64_t M, float *dx,
                           bool accumulate) {
    const int64_t S = r->num_tokens, K = r->k, Cap = r->capacity;
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < S; s++) {
        float *d = dx + s * M;
        if (!accumulate) memset(d, 0, (size_t)M * sizeof *d);
        for (int64_t j = 0; j < K; j++) {
            const int32_t slot = r->slot[s * K + j];
            if (slot < 0) continue;
            const float *row = dbuf + ((int64_t)r->expert[s * K + j] * Cap + slot) * M;
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
