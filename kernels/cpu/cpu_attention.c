/* Causal grouped-query attention on the CPU, flash-attention style: each
 * query row streams over key blocks with an online softmax, accumulating into
 * its own output row, so neither pass ever holds more than one block of
 * scores (a stack array). The backward recomputes scores from the saved
 * log-sum-exp instead of storing probabilities.
 *
 * Layout: q, out, dq (B, T, NH, HS); k, v, dk, dv (B, T, NKV, HS); lse (B, NH, T).
 * Forward is parallel over (b, query head); backward over (b, key/value head),
 * so the thread that owns a kv head owns its dk, dv and the dq of every query
 * head that reads it: no atomics and no scratch. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"

#define KEY_BLOCK 64

static inline float dot(const float *a, const float *b, int64_t n) {
    float s = 0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static inline void axpy(float *y, float a, const float *x, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static inline void scale(float *y, float a, int64_t n) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) y[i] *= a;
}

/* One query row against keys [0, t]: out row (HS) and its log-sum-exp. */
static float attend_row(float *o, const float *qr, const float *k, const float *v, int64_t t, int64_t kv_stride,
                        int64_t hs, float scale_qk) {
    memset(o, 0, (size_t)hs * sizeof *o);
    float m = -INFINITY, l = 0;
    for (int64_t j0 = 0; j0 <= t; j0 += KEY_BLOCK) {
        int64_t len = t + 1 - j0 < KEY_BLOCK ? t + 1 - j0 : KEY_BLOCK;
        float s[KEY_BLOCK]; /* scores of this key block */
        float block_max = -INFINITY;
        for (int64_t j = 0; j < len; j++) {
            s[j] = dot(qr, k + (j0 + j) * kv_stride, hs) * scale_qk;
            block_max = s[j] > block_max ? s[j] : block_max;
        }
        if (block_max > m) { /* rescale what was accumulated under the old maximum */
            float corr = expf(m - block_max);
            l *= corr;
            scale(o, corr, hs);
            m = block_max;
        }
        for (int64_t j = 0; j < len; j++) {
            float p = expf(s[j] - m);
            l += p;
            axpy(o, p, v + (j0 + j) * kv_stride, hs);
        }
    }
    scale(o, 1.0f / l, hs);
    return m + logf(l);
}

dsc_status dsc_cpu_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v,
                                     int64_t b, int64_t t, int64_t nh, int64_t nkv, int64_t hs) {
    int nt = dsc_kernels_get_num_threads();
    int64_t group = nh / nkv, q_stride = nh * hs, kv_stride = nkv * hs;
    float scale_qk = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) num_threads(nt) if (b * nh * t * t * hs > DSC_CPU_PARALLEL_MIN) \
    schedule(static)
    for (int64_t bi = 0; bi < b; bi++) {
        for (int64_t h = 0; h < nh; h++) {
            const float *kb = k + bi * t * kv_stride + (h / group) * hs; /* key row 0 of this head */
            const float *vb = v + bi * t * kv_stride + (h / group) * hs;
            for (int64_t i = 0; i < t; i++) {
                int64_t row = (bi * t + i) * q_stride + h * hs;
                lse[(bi * nh + h) * t + i] = attend_row(out + row, q + row, kb, vb, i, kv_stride, hs, scale_qk);
            }
        }
    }
    return NULL;
}

dsc_status dsc_cpu_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q,
                                      const float *k, const float *v, const float *out, const float *lse, int64_t b,
                                      int64_t t, int64_t nh, int64_t nkv, int64_t hs) {
    int nt = dsc_kernels_get_num_threads();
    int64_t group = nh / nkv, q_stride = nh * hs, kv_stride = nkv * hs;
    float scale_qk = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) num_threads(nt) if (b * nh * t * t * hs > DSC_CPU_PARALLEL_MIN) \
    schedule(static)
    for (int64_t bi = 0; bi < b; bi++) {
        for (int64_t kvh = 0; kvh < nkv; kvh++) {
            int64_t kv0 = bi * t * kv_stride + kvh * hs; /* row 0 of this kv head */
            for (int64_t j = 0; j < t; j++) {
                memset(dk + kv0 + j * kv_stride, 0, (size_t)hs * sizeof *dk);
                memset(dv + kv0 + j * kv_stride, 0, (size_t)hs * sizeof *dv);
            }
            for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
                for (int64_t i = 0; i < t; i++) {
                    int64_t row = (bi * t + i) * q_stride + h * hs;
                    const float *qi = q + row, *doi = dout + row;
                    float *dqi = dq + row;
                    float lse_i = lse[(bi * nh + h) * t + i];
                    float d_i = dot(doi, out + row, hs); /* sum_j p_ij dp_ij */
                    memset(dqi, 0, (size_t)hs * sizeof *dqi);
                    for (int64_t j = 0; j <= i; j++) {
                        const float *kj = k + kv0 + j * kv_stride, *vj = v + kv0 + j * kv_stride;
                        float p = expf(dot(qi, kj, hs) * scale_qk - lse_i);
                        float ds = p * (dot(doi, vj, hs) - d_i) * scale_qk;
                        axpy(dqi, ds, kj, hs);
                        axpy(dk + kv0 + j * kv_stride, ds, qi, hs);
                        axpy(dv + kv0 + j * kv_stride, p, doi, hs);
                    }
                }
            }
        }
    }
    return NULL;
}
