/* MoE row movement on the CPU: dispatch (scatter of token rows into the
 * experts' buffer), combine (weighted gather back, fused multiply-adds over
 * whole rows) and the combine's backward, each route a row index of the
 * expert buffer (-1 dropped). Rows are copied with memcpy; the weighted
 * row loops are AVX2 + FMA where dsc_cpu_simd() allows, portable loops
 * otherwise. Threads split tokens: on the context's pool inside the pool
 * scope (the inference forward), OpenMP above DSC_CPU_PARALLEL_MIN
 * otherwise. No two routes share a row, so the scatters never collide; rows
 * no route names are not touched (the caller zeroes padding). */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_simd.h"

#define AVX2 __attribute__((target("avx2,fma")))

/* Tokens per parallel chunk: enough rows that a chunk outweighs its claim. */
static int64_t chunk_tokens(int64_t k, int64_t m) {
    int64_t per = (int64_t)8192 / (k * m > 0 ? k * m : 1);
    return per < 1 ? 1 : per;
}

AVX2 static void scale_row_avx2(float *o, float w, const float *x, int64_t m) {
    const __m256 vw = _mm256_set1_ps(w);
    int64_t c = 0;
    for (; c + 8 <= m; c += 8)
        _mm256_storeu_ps(o + c, _mm256_mul_ps(vw, _mm256_loadu_ps(x + c)));
    for (; c < m; c++)
        o[c] = w * x[c];
}

AVX2 static void axpy_row_avx2(float *o, float w, const float *x, int64_t m) {
    const __m256 vw = _mm256_set1_ps(w);
    int64_t c = 0;
    for (; c + 8 <= m; c += 8)
        _mm256_storeu_ps(o + c, _mm256_fmadd_ps(vw, _mm256_loadu_ps(x + c), _mm256_loadu_ps(o + c)));
    for (; c < m; c++)
        o[c] += w * x[c];
}

/* dot in double, as the host loop it replaces: four lanes widened per step. */
AVX2 static double dot_row_avx2(const float *a, const float *b, int64_t m) {
    __m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
    int64_t c = 0;
    for (; c + 8 <= m; c += 8) {
        acc0 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(a + c)), _mm256_cvtps_pd(_mm_loadu_ps(b + c)), acc0);
        acc1 = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(a + c + 4)), _mm256_cvtps_pd(_mm_loadu_ps(b + c + 4)),
                               acc1);
    }
    double lane[4];
    _mm256_storeu_pd(lane, _mm256_add_pd(acc0, acc1));
    double dot = (lane[0] + lane[1]) + (lane[2] + lane[3]);
    for (; c < m; c++)
        dot += (double)a[c] * b[c];
    return dot;
}

static void scale_row(float *o, float w, const float *x, int64_t m) {
    if (dsc_cpu_simd()) return scale_row_avx2(o, w, x, m);
    for (int64_t c = 0; c < m; c++)
        o[c] = w * x[c];
}

static void axpy_row(float *o, float w, const float *x, int64_t m) {
    if (dsc_cpu_simd()) return axpy_row_avx2(o, w, x, m);
    for (int64_t c = 0; c < m; c++)
        o[c] += w * x[c];
}

static double dot_row(const float *a, const float *b, int64_t m) {
    if (dsc_cpu_simd()) return dot_row_avx2(a, b, m);
    double dot = 0;
    for (int64_t c = 0; c < m; c++)
        dot += (double)a[c] * b[c];
    return dot;
}

/* One job over token chunks. */
typedef struct moe_job {
    float *out, *dy, *dw;
    const float *x, *y, *w;
    const int32_t *dest;
    int64_t s, k, m, chunk;
    bool accumulate;
    void (*fn)(const struct moe_job *j, int64_t s0, int64_t s1);
} moe_job;

static void scatter_tokens(const moe_job *j, int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; s++)
        for (int64_t r = 0; r < j->k; r++) {
            const int32_t d = j->dest[s * j->k + r];
            if (d >= 0) memcpy(j->out + d * j->m, j->x + s * j->m, (size_t)j->m * sizeof(float));
        }
}

static void gather_tokens(const moe_job *j, int64_t s0, int64_t s1) {
    const int64_t k = j->k, m = j->m;
    for (int64_t s = s0; s < s1; s++) {
        float *o = j->out + s * m;
        bool first = !j->accumulate;
        for (int64_t r = 0; r < k; r++) {
            const int32_t d = j->dest[s * k + r];
            if (d < 0) continue;
            const float w = j->w ? j->w[s * k + r] : 1.0f, *row = j->y + d * m;
            if (first)
                scale_row(o, w, row, m);
            else
                axpy_row(o, w, row, m);
            first = false;
        }
        if (first) memset(o, 0, (size_t)m * sizeof *o);
    }
}

static void combine_backward_tokens(const moe_job *j, int64_t s0, int64_t s1) {
    const int64_t k = j->k, m = j->m;
    for (int64_t s = s0; s < s1; s++) {
        const float *g = j->x + s * m;
        for (int64_t r = 0; r < k; r++) {
            const int32_t d = j->dest[s * k + r];
            j->dw[s * k + r] = 0.0f;
            if (d < 0) continue;
            scale_row(j->dy + d * m, j->w[s * k + r], g, m);
            j->dw[s * k + r] = (float)dot_row(g, j->y + d * m, m);
        }
    }
}

static void pool_chunk(void *arg, int64_t i) {
    const moe_job *j = arg;
    int64_t s0 = i * j->chunk, s1 = s0 + j->chunk < j->s ? s0 + j->chunk : j->s;
    j->fn(j, s0, s1);
}

/* Runs j->fn over the tokens in chunks: on the pool inside the pool scope, else OpenMP above the threshold. */
static void run_job(moe_job *j) {
    j->chunk = chunk_tokens(j->k, j->m);
    const int64_t chunks = (j->s + j->chunk - 1) / j->chunk;
    if (chunks <= 0) return;
    if (dsc_cpu_pool_scope()) {
        dsc_cpu_pool_run(pool_chunk, j, chunks);
        return;
    }
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for num_threads(nt) if (dsc_cpu_parallel(j->s * j->k * j->m)) schedule(static)
    for (int64_t i = 0; i < chunks; i++)
        pool_chunk(j, i);
}

/* A job over the routes dest (s, k) of rows of m floats, checked against the `rows` of the expert buffer. */
static moe_job job(void (*fn)(const moe_job *, int64_t, int64_t), const int32_t *dest, int64_t s, int64_t k,
                   int64_t m) {
    return (moe_job){.fn = fn, .dest = dest, .s = s, .k = k, .m = m};
}

static dsc_status start(moe_job *j, int64_t rows) {
    DSC_TRY(dsc_cpu_check_ids(j->dest, j->s * j->k, rows, true, "route row"));
    run_job(j);
    return NULL;
}

dsc_status dsc_cpu_moe_scatter(const dsc_backend *backend, float *buf, int64_t rows, const float *x,
                               const int32_t *dest, int64_t s, int64_t k, int64_t m) {
    (void)backend;
    moe_job j = job(scatter_tokens, dest, s, k, m);
    j.out = buf;
    j.x = x;
    return start(&j, rows);
}

dsc_status dsc_cpu_moe_gather(const dsc_backend *backend, float *out, const float *y, int64_t rows,
                              const int32_t *dest, const float *w, int64_t s, int64_t k, int64_t m,
                              bool accumulate) {
    (void)backend;
    moe_job j = job(gather_tokens, dest, s, k, m);
    j.out = out;
    j.y = y;
    j.w = w;
    j.accumulate = accumulate;
    return start(&j, rows);
}

dsc_status dsc_cpu_moe_combine_backward(const dsc_backend *backend, float *dy, float *dw, int64_t rows,
                                        const float *dout, const float *y, const int32_t *dest, const float *w,
                                        int64_t s, int64_t k, int64_t m) {
    (void)backend;
    moe_job j = job(combine_backward_tokens, dest, s, k, m);
    j.dy = dy;
    j.dw = dw;
    j.x = dout;
    j.y = y;
    j.w = w;
    return start(&j, rows);
}
