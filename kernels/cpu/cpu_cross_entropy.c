/* Fused softmax + cross-entropy on the CPU, parallel over rows. The backward
 * recomputes each row's log-sum-exp rather than keeping probabilities, so
 * dlogits may overwrite logits in place. A negative target ignores its row.
 *
 * A row (the vocabulary, 50257 floats for GPT-2: 200 KB, cache-resident) is
 * read once for its maximum, then once through the vectorised exponential
 * (dsc_cpu_exp_shift_sum, AVX2 where the CPU has it) a chunk at a time; the
 * backward writes exp(x - max) into dlogits in that pass and scales it in a
 * last one. Logits stored in 2 bytes (mixed precision's head) are widened a
 * chunk at a time into the same passes, so their losses are those of the f32
 * logits of the same values, bit for bit, and their gradients those rounded;
 * the backward then takes the exponentials twice, as a 2-byte row cannot hold
 * them. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_round.h"
#include "kernels/cpu/cpu_simd.h"

enum { EXP_CHUNK = 1024 }; /* floats staged on the stack, which leaves logits unchanged */

/* One row of logits as stored: f32, or 2-byte values of `type` (bf16 / f16). */
typedef struct logits_row {
    const void *p;
    dsc_dtype type;
} logits_row;

static int64_t chunk_len(int64_t v, int64_t j0) {
    return v - j0 < EXP_CHUNK ? v - j0 : EXP_CHUNK;
}

/* buf[0, n) = the row's values from column j0, in f32. */
static void load_chunk(float *buf, logits_row row, int64_t j0, int64_t n) {
    if (row.type == DSC_DTYPE_F32)
        memcpy(buf, (const float *)row.p + j0, (size_t)n * sizeof *buf);
    else
        dsc_cpu_widen_rows(buf, (const uint16_t *)row.p + j0,
                           row.type == DSC_DTYPE_BF16 ? DSC_WEIGHT_BF16 : DSC_WEIGHT_F16, n, 0, 1);
}

static float value_at(logits_row row, int64_t j) {
    float x;
    load_chunk(&x, row, j, 1);
    return x;
}

static float max_of(const float *x, int64_t v) {
    float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < v; j++)
        mx = x[j] > mx ? x[j] : mx;
    return mx;
}

static float row_max(logits_row row, int64_t v) {
    if (row.type == DSC_DTYPE_F32) return max_of(row.p, v);
    float buf[EXP_CHUNK], mx = -INFINITY;
    for (int64_t j0 = 0; j0 < v; j0 += EXP_CHUNK) {
        const int64_t n = chunk_len(v, j0);
        load_chunk(buf, row, j0, n);
        const float m = max_of(buf, n);
        mx = m > mx ? m : mx;
    }
    return mx;
}

/* Sum of exp(x - shift) over a row without changing it, a chunk's sum at a time. */
static float exp_sum(logits_row row, int64_t v, float shift) {
    float buf[EXP_CHUNK], sum = 0.0f;
    for (int64_t j0 = 0; j0 < v; j0 += EXP_CHUNK) {
        const int64_t n = chunk_len(v, j0);
        load_chunk(buf, row, j0, n);
        sum += dsc_cpu_exp_shift_sum(buf, n, shift);
    }
    return sum;
}

static dsc_status forward_rows(float *losses, const void *logits, dsc_dtype type, const int32_t *targets,
                               int64_t n, int64_t v) {
    DSC_TRY(dsc_cpu_check_ids(targets, n, v, true, "target"));
    const int64_t row_bytes = v * (int64_t)dsc_dtype_size(type);
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for num_threads(nt) if (dsc_cpu_parallel(n * v)) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        if (targets[i] < 0) {
            losses[i] = 0.0f;
            continue;
        }
        const logits_row row = {(const char *)logits + i * row_bytes, type}; /* (V) */
        float mx = row_max(row, v);
        losses[i] = logf(exp_sum(row, v, mx)) + mx - value_at(row, targets[i]);
    }
    return NULL;
}

dsc_status dsc_cpu_cross_entropy_forward(const dsc_backend *backend, float *losses, const float *logits,
                                         const int32_t *targets, int64_t n, int64_t v) {
    (void)backend;
    return forward_rows(losses, logits, DSC_DTYPE_F32, targets, n, v);
}

dsc_status dsc_cpu_cross_entropy_forward_narrow(const dsc_backend *backend, float *losses, const void *logits,
                                                dsc_dtype type, const int32_t *targets, int64_t n, int64_t v) {
    (void)backend;
    return forward_rows(losses, logits, type, targets, n, v);
}

dsc_status dsc_cpu_cross_entropy_backward(const dsc_backend *backend, float *dlogits, const float *logits,
                                          const int32_t *targets, int64_t n, int64_t v, float dloss) {
    (void)backend;
    DSC_TRY(dsc_cpu_check_ids(targets, n, v, true, "target"));
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for num_threads(nt) if (dsc_cpu_parallel(n * v)) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const float *row = logits + i * v; /* (V), may alias d */
        float *d = dlogits + i * v;
        if (targets[i] < 0) {
            memset(d, 0, (size_t)v * sizeof *d);
            continue;
        }
        float mx = max_of(row, v), sum = 0.0f;
        if (d != row) memmove(d, row, (size_t)v * sizeof *d);
        for (int64_t j0 = 0; j0 < v; j0 += EXP_CHUNK) /* the forward's chunks: the same sum */
            sum += dsc_cpu_exp_shift_sum(d + j0, chunk_len(v, j0), mx);
        float inv = dloss / sum;
#pragma omp simd
        for (int64_t j = 0; j < v; j++)
            d[j] *= inv;
        d[targets[i]] -= dloss;
    }
    return NULL;
}

dsc_status dsc_cpu_cross_entropy_backward_narrow(const dsc_backend *backend, void *dlogits, const void *logits,
                                                 dsc_dtype type, const int32_t *targets, int64_t n, int64_t v,
                                                 float dloss) {
    (void)backend;
    DSC_TRY(dsc_cpu_check_ids(targets, n, v, true, "target"));
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for num_threads(nt) if (dsc_cpu_parallel(n * v)) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const logits_row row = {(const uint16_t *)logits + i * v, type}; /* (V), may alias d */
        uint16_t *d = (uint16_t *)dlogits + i * v;
        if (targets[i] < 0) {
            memset(d, 0, (size_t)v * sizeof *d); /* +0 in bf16 and f16 */
            continue;
        }
        const float mx = row_max(row, v), inv = dloss / exp_sum(row, v, mx);
        float buf[EXP_CHUNK];
        for (int64_t j0 = 0; j0 < v; j0 += EXP_CHUNK) { /* each chunk read before it is written */
            const int64_t len = chunk_len(v, j0);
            load_chunk(buf, row, j0, len);
            dsc_cpu_exp_shift_sum(buf, len, mx);
            for (int64_t j = 0; j < len; j++)
                buf[j] *= inv;
            if (targets[i] >= j0 && targets[i] < j0 + len) buf[targets[i] - j0] -= dloss;
            dsc_cpu_pack_span(d + j0, buf, len, type);
        }
    }
    return NULL;
}
