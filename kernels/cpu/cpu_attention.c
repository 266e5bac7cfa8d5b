/* Causal grouped-query attention on the CPU, flash-attention style: queries
 * are processed in tiles of 64 rows against key blocks of 64, with an online
 * softmax, so nothing larger than one (64, 64) score tile (a stack array)
 * ever exists. The tile products are small single-threaded OpenBLAS GEMMs on
 * strided views of q, k, v (no copies); the exponentials in between are
 * vectorised (cpu_simd.c). The backward recomputes each tile's
 * probabilities from the saved log-sum-exp instead of storing them.
 *
 * Layout: q, out, dq (B, T, NH, HS); k, v, dk, dv (B, T, NKV, HS); lse (B, NH, T).
 * Forward is parallel over (b, query head); backward over (b, key/value head),
 * so the thread that owns a kv head owns its dk, dv and the dq of every query
 * head that reads it: no atomics, and results do not depend on the thread
 * count. OpenBLAS runs single-threaded (cpu_threads.c): OpenMP supplies the
 * parallelism.
 *
 * In bf16 or fp16 products (dsc_kernels_set_matmul_dtype: mixed-precision training) every
 * product's operands are rounded to the type and summed in f32, as a bf16 / fp16 flash attention
 * (PyTorch's CPU and FlashAttention-2 kernels) does: q, k, v (and the output gradient, at the loss
 * scale under fp16) are rounded copies, the exponentials of a tile
 * are rounded after their f32 row sum is taken and before they multiply v (unnormalised, against
 * the running maximum), the output is rounded once normalised (the tensor autocast's attention
 * returns); the backward rounds the recomputed probabilities before dv and the score
 * gradients dS = P (dP - D) before dq and dk, whose products then take the 1/sqrt(HS) scale. */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu_gemm.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_round.h"
#include "kernels/cpu/cpu_simd.h"

#define TILE 64

/* One (b, head) slice: row r of a tensor is at base + r * stride. */
typedef struct attn_slice {
    const float *q, *k, *v, *dout, *out;
    float *o, *dq, *dk, *dv;
    float *lse; /* (T) */
    int64_t t, hs, q_stride, kv_stride;
    float scale;
    dsc_dtype products; /* bf16 / fp16: round the probabilities and score gradients to it (q, k, v are) */
} attn_slice;

/* q, k, v and the output gradient rounded for a bf16 / fp16 attention, kept by each calling thread */
static _Thread_local dsc_cpu_kept rounded_q, rounded_k, rounded_v, rounded_dout;

static inline int64_t min64(int64_t a, int64_t b) {
    return a < b ? a : b;
}

static void round_in_place(const attn_slice *A, float *x, int64_t n) {
    if (A->products != DSC_DTYPE_F32) dsc_cpu_round_span(x, x, n, A->products);
}

/* s (ni, nj), leading dimension TILE = alpha * A[a0:a0+ni] @ B[b0:b0+nj]^T over hs columns. */
static void tile_nt(float *s, float alpha, const float *a, int64_t a_stride, const float *b, int64_t b_stride,
                    int64_t ni, int64_t nj, int64_t hs) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)ni, (int)nj, (int)hs, alpha, a, (int)a_stride, b,
                (int)b_stride, 0.0f, s, TILE);
}

/* The slice of query head at q0 and kv head at kv0 (element offsets into q and k/v); the caller fills in
 * the output / gradient pointers its pass needs. */
static attn_slice slice_at(const float *q, const float *k, const float *v, float *lse, int64_t q0, int64_t kv0,
                           int64_t t, int64_t hs, int64_t q_stride, int64_t kv_stride, dsc_dtype products) {
    return (attn_slice){.q = q + q0,
                        .k = k + kv0,
                        .v = v + kv0,
                        .lse = lse,
                        .t = t,
                        .hs = hs,
                        .q_stride = q_stride,
                        .kv_stride = kv_stride,
                        .scale = 1.0f / sqrtf((float)hs),
                        .products = products};
}

static void attend_tile(const attn_slice *A, int64_t i0) {
    int64_t ni = min64(TILE, A->t - i0);
    float m[TILE], l[TILE];
    float s[TILE * TILE]; /* scores, then probabilities, of one (query tile, key block) */
    for (int64_t r = 0; r < ni; r++) {
        m[r] = -INFINITY, l[r] = 0;
        memset(A->o + (i0 + r) * A->q_stride, 0, (size_t)A->hs * sizeof(float));
    }
    /* Tiles are aligned, so every key block j0 <= i0 holds at least key j0 <= i for each row. */
    for (int64_t j0 = 0; j0 <= i0; j0 += TILE) {
        int64_t nj = min64(TILE, i0 + ni - j0);
        tile_nt(s, A->scale, A->q + i0 * A->q_stride, A->q_stride, A->k + j0 * A->kv_stride, A->kv_stride, ni, nj,
                A->hs);
        for (int64_t r = 0; r < ni; r++) {
            float *sr = s + r * TILE;
            int64_t keys = min64(nj, i0 + r - j0 + 1); /* causal: keys j <= i */
            float block_max = -INFINITY;
#pragma omp simd reduction(max : block_max)
            for (int64_t c = 0; c < keys; c++)
                block_max = sr[c] > block_max ? sr[c] : block_max;
            float m_new = block_max > m[r] ? block_max : m[r], corr = expf(m[r] - m_new);
            float sum = dsc_cpu_exp_shift_sum(sr, keys, m_new);
            round_in_place(A, sr, keys);
            for (int64_t c = keys; c < nj; c++)
                sr[c] = 0.0f;
            l[r] = l[r] * corr + sum;
            m[r] = m_new;
            if (corr != 1.0f) {
                float *orow = A->o + (i0 + r) * A->q_stride;
                for (int64_t d = 0; d < A->hs; d++)
                    orow[d] *= corr;
            }
        }
        /* out tile (ni, HS) += p (ni, nj) @ v block (nj, HS) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)ni, (int)A->hs, (int)nj, 1.0f, s, TILE,
                    A->v + j0 * A->kv_stride, (int)A->kv_stride, 1.0f, A->o + i0 * A->q_stride, (int)A->q_stride);
    }
    for (int64_t r = 0; r < ni; r++) {
        float *orow = A->o + (i0 + r) * A->q_stride, inv = 1.0f / l[r];
        for (int64_t d = 0; d < A->hs; d++)
            orow[d] *= inv;
        round_in_place(A, orow, A->hs);
        A->lse[i0 + r] = m[r] + logf(l[r]);
    }
}

/* Gradients of one query tile against all its key blocks: dq rows (overwritten
 * here) and dk, dv rows (accumulated; zeroed by the caller). */
static void attend_tile_backward(const attn_slice *A, int64_t i0) {
    int64_t ni = min64(TILE, A->t - i0), hs = A->hs;
    float d_row[TILE];     /* D_i = dout_i . out_i = sum_j p_ij dp_ij */
    float p[TILE * TILE];  /* probabilities of one (query tile, key block) */
    float ds[TILE * TILE]; /* dp, then the score gradient */
    for (int64_t r = 0; r < ni; r++) {
        const float *dor = A->dout + (i0 + r) * A->q_stride, *orow = A->out + (i0 + r) * A->q_stride;
        float acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t d = 0; d < hs; d++)
            acc += dor[d] * orow[d];
        d_row[r] = acc;
        memset(A->dq + (i0 + r) * A->q_stride, 0, (size_t)hs * sizeof(float));
    }
    for (int64_t j0 = 0; j0 <= i0; j0 += TILE) {
        int64_t nj = min64(TILE, i0 + ni - j0);
        const float *kb = A->k + j0 * A->kv_stride, *vb = A->v + j0 * A->kv_stride;
        const float *qt = A->q + i0 * A->q_stride, *dot = A->dout + i0 * A->q_stride;
        tile_nt(p, A->scale, qt, A->q_stride, kb, A->kv_stride, ni, nj, hs);
        tile_nt(ds, 1.0f, dot, A->q_stride, vb, A->kv_stride, ni, nj, hs);
        for (int64_t r = 0; r < ni; r++) {
            int64_t keys = min64(nj, i0 + r - j0 + 1);
            float *pr = p + r * TILE, *dsr = ds + r * TILE, lse = A->lse[i0 + r];
            dsc_cpu_exp_shift_sum(pr, keys, lse);
            for (int64_t c = keys; c < nj; c++)
                pr[c] = 0.0f;
            for (int64_t c = 0; c < nj; c++)
                dsr[c] = pr[c] * (dsr[c] - d_row[r]);
            round_in_place(A, pr, nj);
            round_in_place(A, dsr, nj);
        }
        /* dq tile += scale ds @ k block; dk block += scale ds^T @ q tile; dv block += p^T @ dout tile */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)ni, (int)hs, (int)nj, A->scale, ds, TILE, kb,
                    (int)A->kv_stride, 1.0f, A->dq + i0 * A->q_stride, (int)A->q_stride);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nj, (int)hs, (int)ni, A->scale, ds, TILE, qt,
                    (int)A->q_stride, 1.0f, A->dk + j0 * A->kv_stride, (int)A->kv_stride);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)nj, (int)hs, (int)ni, 1.0f, p, TILE, dot,
                    (int)A->q_stride, 1.0f, A->dv + j0 * A->kv_stride, (int)A->kv_stride);
    }
}

/* q, k, v (and *dout when given) replaced by rounded copies: rows (B T) of q_stride and kv_stride. */
static dsc_status round_operands(const float **q, const float **k, const float **v, const float **dout,
                                 int64_t rows, int64_t q_stride, int64_t kv_stride, dsc_dtype products) {
    *q = dsc_cpu_rounded_copy(&rounded_q, *q, rows * q_stride, products);
    *k = dsc_cpu_rounded_copy(&rounded_k, *k, rows * kv_stride, products);
    *v = dsc_cpu_rounded_copy(&rounded_v, *v, rows * kv_stride, products);
    if (dout) *dout = dsc_cpu_rounded_copy(&rounded_dout, *dout, rows * q_stride, products);
    DSC_CHECK(*q && *k && *v && (!dout || *dout), DSC_ERR_NOMEM,
              "attention: %s copies of q, k, v%s (%lld rows of %lld and %lld floats)", dsc_dtype_name(products),
              dout ? ", dout" : "", (long long)rows, (long long)q_stride, (long long)kv_stride);
    return NULL;
}

dsc_status dsc_cpu_attention_forward(const dsc_backend *backend, float *out, float *lse, const float *q,
                                     const float *k, const float *v, int64_t b, int64_t t, int64_t nh, int64_t nkv,
                                     int64_t hs) {
    (void)backend;
    int nt = dsc_kernels_get_num_threads();
    int64_t group = nh / nkv, q_stride = nh * hs, kv_stride = nkv * hs;
    const dsc_dtype products = dsc_kernels_get_matmul_dtype();
    if (products != DSC_DTYPE_F32) DSC_TRY(round_operands(&q, &k, &v, NULL, b * t, q_stride, kv_stride, products));
#pragma omp parallel for collapse(2) num_threads(nt) if (dsc_cpu_parallel(b * nh * t * t * hs)) schedule(static)
    for (int64_t bi = 0; bi < b; bi++) {
        for (int64_t h = 0; h < nh; h++) {
            int64_t kv0 = bi * t * kv_stride + (h / group) * hs, q0 = bi * t * q_stride + h * hs;
            attn_slice A =
                slice_at(q, k, v, lse + (bi * nh + h) * t, q0, kv0, t, hs, q_stride, kv_stride, products);
            A.o = out + q0;
            for (int64_t i0 = 0; i0 < t; i0 += TILE)
                attend_tile(&A, i0);
        }
    }
    return NULL;
}

dsc_status dsc_cpu_attention_backward(const dsc_backend *backend, float *dq, float *dk, float *dv,
                                      const float *dout, const float *q, const float *k, const float *v,
                                      const float *out, const float *lse, int64_t b, int64_t t, int64_t nh,
                                      int64_t nkv, int64_t hs) {
    (void)backend;
    int nt = dsc_kernels_get_num_threads();
    int64_t group = nh / nkv, q_stride = nh * hs, kv_stride = nkv * hs;
    const dsc_dtype products = dsc_kernels_get_matmul_dtype();
    if (products != DSC_DTYPE_F32)
        DSC_TRY(round_operands(&q, &k, &v, &dout, b * t, q_stride, kv_stride, products));
#pragma omp parallel for collapse(2) num_threads(nt) if (dsc_cpu_parallel(b * nh * t * t * hs)) schedule(static)
    for (int64_t bi = 0; bi < b; bi++) {
        for (int64_t kvh = 0; kvh < nkv; kvh++) {
            int64_t kv0 = bi * t * kv_stride + kvh * hs;
            for (int64_t j = 0; j < t; j++) {
                memset(dk + kv0 + j * kv_stride, 0, (size_t)hs * sizeof *dk);
                memset(dv + kv0 + j * kv_stride, 0, (size_t)hs * sizeof *dv);
            }
            for (int64_t h = kvh * group; h < (kvh + 1) * group; h++) {
                int64_t q0 = bi * t * q_stride + h * hs;
                attn_slice A = slice_at(q, k, v, (float *)lse + (bi * nh + h) * t, q0, kv0, t, hs, q_stride,
                                        kv_stride, products);
                A.dout = dout + q0, A.out = out + q0;
                A.dq = dq + q0, A.dk = dk + kv0, A.dv = dv + kv0;
                for (int64_t i0 = 0; i0 < t; i0 += TILE)
                    attend_tile_backward(&A, i0);
            }
        }
    }
    return NULL;
}
