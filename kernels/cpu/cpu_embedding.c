/* Token (+ position) embedding on the CPU: a gather forward and a race-free
 * scatter-add backward (threads own channel slices, so two tokens with the
 * same id never write the same float from two threads). Ids are checked
 * before anything is written, so a bad id leaves the outputs untouched. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_round.h"

dsc_status dsc_cpu_check_ids(const int32_t *ids, int64_t n, int64_t limit, bool allow_negative, const char *what) {
    for (int64_t i = 0; i < n; i++)
        DSC_CHECK(ids[i] < limit && (allow_negative || ids[i] >= 0), DSC_ERR_INVALID,
                  "%s id %d at position %lld is outside [0, %lld)", what, ids[i], (long long)i, (long long)limit);
    return NULL;
}

/* Under bf16 / fp16 products the gathered rows are read rounded, as a product reads its operands:
 * the tables need no rounded copy (a whole vocabulary's) for the few rows a batch reads. */
dsc_status dsc_cpu_embedding_forward(const dsc_backend *backend, float *out, const int32_t *tokens,
                                     const float *wte, const float *wpe, int64_t n, int64_t t, int64_t v,
                                     int64_t c) {
    (void)backend;
    DSC_TRY(dsc_cpu_check_ids(tokens, n, v, false, "token"));
    const dsc_dtype products = dsc_kernels_get_matmul_dtype(); /* the calling thread's setting */
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for num_threads(nt) if (dsc_cpu_parallel(n * c)) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float *o = out + i * c;                          /* (C) */
        const float *e = wte + tokens[i] * c;            /* (C) */
        const float *p = wpe ? wpe + (i % t) * c : NULL; /* (C) */
        dsc_cpu_round_span(o, e, c, products);
        for (int64_t j0 = 0; p && j0 < c; j0 += 256) {
            float pos[256];
            int64_t len = c - j0 < 256 ? c - j0 : 256;
            dsc_cpu_round_span(pos, p + j0, len, products);
            for (int64_t j = 0; j < len; j++)
                o[j0 + j] += pos[j];
        }
    }
    return NULL;
}

dsc_status dsc_cpu_embedding_backward(const dsc_backend *backend, float *dwte, float *dwpe, const float *dout,
                                      const int32_t *tokens, int64_t n, int64_t t, int64_t v, int64_t c) {
    (void)backend;
    DSC_TRY(dsc_cpu_check_ids(tokens, n, v, false, "token"));
    int nt = dsc_kernels_get_num_threads();
    /* Slices of 16 floats (a 64-byte line) keep threads off each other's cache lines. */
#pragma omp parallel for num_threads(nt) if (dsc_cpu_parallel(n * c)) schedule(static)
    for (int64_t c0 = 0; c0 < c; c0 += 16) {
        int64_t len = c - c0 < 16 ? c - c0 : 16;
        for (int64_t i = 0; i < n; i++) {
            const float *d = dout + i * c + c0;
            float *e = dwte + tokens[i] * c + c0;
            for (int64_t j = 0; j < len; j++)
                e[j] += d[j];
            if (!dwpe) continue;
            float *p = dwpe + (i % t) * c + c0;
            for (int64_t j = 0; j < len; j++)
                p[j] += d[j];
        }
    }
    return NULL;
}

/* A position and its token, sorted by token and then position: each token's positions together,
 * in the order the plain scatter adds them. */
typedef struct token_position {
    int32_t token;
    int64_t position;
} token_position;

static int by_token_then_position(const void *a, const void *b) {
    const token_position *x = a, *y = b;
    if (x->token != y->token) return x->token < y->token ? -1 : 1;
    return (x->position > y->position) - (x->position < y->position);
}

/* dst[0 .. len) += round(acc) (f32 sums of one row's contributions), acc zeroed for the next row. */
static void add_row_rounded(float *dst, float *acc, int64_t len, dsc_dtype dtype) {
    dsc_cpu_round_span(acc, acc, len, dtype);
    for (int64_t j = 0; j < len; j++) {
        dst[j] += acc[j];
        acc[j] = 0.0f;
    }
}

/* Each row's contributions are summed in f32 from 0, in the plain scatter's order, then rounded and
 * added: what the scatter into a zeroed table, rounded and added to the accumulator, gives. */
dsc_status dsc_cpu_embedding_backward_rounded(const dsc_backend *backend, float *dwte, float *dwpe,
                                              const float *dout, const int32_t *tokens, int64_t n, int64_t t,
                                              int64_t v, int64_t c, dsc_dtype dtype) {
    (void)backend;
    DSC_TRY(dsc_cpu_check_ids(tokens, n, v, false, "token"));
    token_position *order = malloc((size_t)(n > 0 ? n : 1) * sizeof *order);
    DSC_CHECK(order, DSC_ERR_NOMEM, "dsc_kernel_embedding_backward: the order of %lld positions", (long long)n);
    for (int64_t i = 0; i < n; i++)
        order[i] = (token_position){tokens[i], i};
    qsort(order, (size_t)n, sizeof *order, by_token_then_position);
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for num_threads(nt) if (dsc_cpu_parallel(n * c)) schedule(static)
    for (int64_t c0 = 0; c0 < c; c0 += 16) {
        int64_t len = c - c0 < 16 ? c - c0 : 16;
        float acc[16] = {0};
        for (int64_t i = 0; i < n; i++) {
            const float *d = dout + order[i].position * c + c0;
            for (int64_t j = 0; j < len; j++)
                acc[j] += d[j];
            if (i + 1 == n || order[i + 1].token != order[i].token)
                add_row_rounded(dwte + order[i].token * c + c0, acc, len, dtype);
        }
        for (int64_t p = 0; dwpe && p < t && p < n; p++) {
            for (int64_t i = p; i < n; i += t)
                for (int64_t j = 0; j < len; j++)
                    acc[j] += dout[i * c + c0 + j];
            add_row_rounded(dwpe + p * c + c0, acc, len, dtype);
        }
    }
    free(order);
    return NULL;
}
