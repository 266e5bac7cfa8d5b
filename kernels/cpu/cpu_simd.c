/* The narrow-weight dot products, weight widening, vector exponential, row max, SwiGLU and GELU
 * of cpu_simd.h. The AVX2 versions are compiled for that target only (function
 * attributes), so the library still builds and runs for any x86-64 (or
 * other) CPU; __builtin_cpu_supports picks them at run time. Weights stay
 * narrow in memory: a bf16 value becomes f32 by a 16-bit shift, an f16 one
 * by F16C's vcvtph2ps, a Q8_0 block is 32 int8 widened and scaled once per
 * block. The scalar versions are the reference the tests hold the others to. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu_simd.h"

#if defined(__x86_64__) || defined(__i386__)
#define DSC_HAVE_AVX2_BUILD 1
#include <cpuid.h>
#include <immintrin.h>
#endif

enum { SIMD_UNKNOWN, SIMD_SCALAR, SIMD_AVX2, SIMD_AVX512VL, SIMD_AVX512 };
static _Atomic int simd_state;

static bool cpu_has_avx2(void) {
#ifdef DSC_HAVE_AVX2_BUILD
    __builtin_cpu_init();
    /* clang's __builtin_cpu_supports knows no "f16c": read CPUID leaf 1's ECX bit for it */
    unsigned eax, ebx, ecx, edx;
    bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#else
    return false;
#endif
}

static bool cpu_has_avx512vl(void) {
#ifdef DSC_HAVE_AVX2_BUILD
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
#else
    return false;
#endif
}

/* The best level the CPU has, lowered by DSC_CPU_SIMD (scalar, avx2, avx512vl; avx512 is the best). */
static int simd_level(void) {
    int s = atomic_load(&simd_state);
    if (!s) {
        const char *env = getenv("DSC_CPU_SIMD");
        s = !cpu_has_avx2() ? SIMD_SCALAR : !cpu_has_avx512vl() ? SIMD_AVX2 : SIMD_AVX512;
        int cap = !env                           ? SIMD_AVX512
                  : strcmp(env, "scalar") == 0   ? SIMD_SCALAR
                  : strcmp(env, "avx2") == 0     ? SIMD_AVX2
                  : strcmp(env, "avx512vl") == 0 ? SIMD_AVX512VL
                                                 : SIMD_AVX512;
        s = s < cap ? s : cap;
        atomic_store(&simd_state, s);
    }
    return s;
}

bool dsc_cpu_simd(void) {
    return simd_level() >= SIMD_AVX2;
}

bool dsc_cpu_simd_avx512(void) {
    return simd_level() == SIMD_AVX512;
}

/* ---- scalar reference ---------------------------------------------------------------------- */

enum { Q8_BLOCK = 32, Q8_BLOCK_BYTES = 34 }; /* f16 scale + 32 int8 */

static inline float widen_one(const void *row, dsc_weight_format f, int64_t j) {
    switch (f) {
    case DSC_WEIGHT_BF16:
        return dsc_bf16_to_f32(((const uint16_t *)row)[j]);
    case DSC_WEIGHT_F16:
        return dsc_f16_to_f32(((const uint16_t *)row)[j]);
    case DSC_WEIGHT_Q8_0: {
        const uint8_t *b = (const uint8_t *)row + (j / Q8_BLOCK) * Q8_BLOCK_BYTES;
        uint16_t d;
        memcpy(&d, b, sizeof d);
        return dsc_f16_to_f32(d) * (float)((const int8_t *)(b + 2))[j % Q8_BLOCK];
    }
    default:
        return ((const float *)row)[j];
    }
}

/* x[j0..c) . row[j0..c): the columns a vector loop's steps leave over. */
static inline float tail_dot(const float *x, const void *row, dsc_weight_format f, int64_t j0, int64_t c) {
    float sum = 0.0f;
    for (int64_t j = j0; j < c; j++)
        sum += x[j] * widen_one(row, f, j);
    return sum;
}

static void dot_rows_scalar(float *y, int64_t ldy, const float *x, int64_t m, const void *w, dsc_weight_format f,
                            int64_t c, int64_t r0, int64_t r1) {
    size_t rb = dsc_cpu_row_bytes(f, c);
    for (int64_t r = r0; r < r1; r++) {
        const void *row = (const uint8_t *)w + (size_t)r * rb;
        float acc[DSC_CPU_GEMV_MAX_ROWS] = {0};
        for (int64_t j = 0; j < c; j++) {
            float wj = widen_one(row, f, j);
            for (int64_t i = 0; i < m; i++)
                acc[i] += x[i * c + j] * wj;
        }
        for (int64_t i = 0; i < m; i++)
            y[i * ldy + r] = acc[i];
    }
}

static float max_scalar(const float *x, int64_t n) {
    float best = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        best = x[i] > best ? x[i] : best;
    return best;
}

static void swiglu_scalar(float *out, const float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

/* s = sigmoid(g): dup = dout g s, dgate = dout up s (1 + g (1 - s)), silu's derivative. */
static void swiglu_grad_scalar(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                               int64_t n) {
    for (int64_t i = 0; i < n; i++) { /* both inputs read before either output is written: in place */
        float g = gate[i], u = up[i], d = dout[i], s = 1.0f / (1.0f + expf(-g));
        dup[i] = d * g * s;
        dgate[i] = d * u * s * (1.0f + g * (1.0f - s));
    }
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_CUBIC 0.044715f

/* tanh through expf, which glibc computes several times faster than tanhf; saturates correctly
 * at both ends (exp overflow gives -1, underflow +1). The vector loops use the same form. */
static inline float fast_tanh(float u) {
    return 2.0f / (1.0f + expf(-2.0f * u)) - 1.0f;
}

static void gelu_scalar(float *out, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        out[i] = 0.5f * xi * (1.0f + fast_tanh(GELU_SCALE * (xi + GELU_CUBIC * xi * xi * xi)));
    }
}

static void gelu_grad_scalar(float *dx, const float *dout, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        float th = fast_tanh(GELU_SCALE * (xi + GELU_CUBIC * xi * xi * xi));
        float sech2 = 1.0f - th * th;
        float grad = 0.5f * (1.0f + th) + 0.5f * xi * sech2 * GELU_SCALE * (1.0f + 3.0f * GELU_CUBIC * xi * xi);
        dx[i] = grad * dout[i];
    }
}

static float exp_shift_sum_scalar(float *x, int64_t n, float shift) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++)
        sum += x[i] = expf(x[i] - shift);
    return sum;
}

/* ---- AVX2 + FMA + F16C ----------------------------------------------------------------------- */
#ifdef DSC_HAVE_AVX2_BUILD
#define AVX2 __attribute__((target("avx2,fma,f16c")))

/* Eight weights of a bf16, f16 or f32 row from column j, widened to f32. */
AVX2 __attribute__((always_inline)) static inline __m256 load8(const void *row, dsc_weight_format f, int64_t j) {
    if (f == DSC_WEIGHT_BF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + j))), 16));
    if (f == DSC_WEIGHT_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)row + j)));
    return _mm256_loadu_ps((const float *)row + j);
}

AVX2 static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* One weight row against M x rows, U vectors of 8 columns a step (U and M
 * constants once inlined): U * M accumulators that stay in registers (a
 * runtime M kept them in memory, and each FMA waited on a store), each
 * weight vector loaded and widened once for all M x rows. One row at a
 * time, so each thread reads one sequential stream: four rows side by side
 * (four streams a row apart) read at half the rate (12-16 against 23-28
 * GB/s, two threads, f32 rows of 768). */
AVX2 __attribute__((always_inline)) static inline void dot_row(float *y, int64_t ldy, const float *x,
                                                               const uint8_t *row, dsc_weight_format f, int64_t c,
                                                               int64_t r, const int U, const int M) {
    __m256 acc[4][DSC_CPU_GEMV_MAX_ROWS];
    for (int u = 0; u < U; u++)
        for (int i = 0; i < M; i++)
            acc[u][i] = _mm256_setzero_ps();
    int64_t j = 0;
    for (; j + 8 * U <= c; j += 8 * U) {
        __m256 wv[4];
        for (int u = 0; u < U; u++)
            wv[u] = load8(row, f, j + 8 * u);
        for (int i = 0; i < M; i++)
            for (int u = 0; u < U; u++)
                acc[u][i] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * c + j + 8 * u), wv[u], acc[u][i]);
    }
    for (; j + 8 <= c; j += 8) {
        __m256 wv = load8(row, f, j);
        for (int i = 0; i < M; i++)
            acc[0][i] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i * c + j), wv, acc[0][i]);
    }
    for (int i = 0; i < M; i++) {
        for (int u = 1; u < U; u++)
            acc[0][i] = _mm256_add_ps(acc[0][i], acc[u][i]);
        y[i * ldy + r] = hsum(acc[0][i]) + tail_dot(x + i * c, row, f, j, c);
    }
}

/* Rows [r0, r1) against M x rows: four vectors a step for one or two x rows, two for more with
 * AVX2's 16 registers; four for any M where AVX-512VL gives 32 (WIDE). */
AVX2 __attribute__((always_inline)) static inline void dot_rows_m(float *y, int64_t ldy, const float *x,
                                                                  const void *w, dsc_weight_format f, int64_t c,
                                                                  int64_t r0, int64_t r1, const int M,
                                                                  const bool WIDE) {
    const size_t rb = dsc_cpu_row_bytes(f, c);
    const int U = M <= 2 || WIDE ? 4 : 2;
    for (int64_t r = r0; r < r1; r++)
        dot_row(y, ldy, x, (const uint8_t *)w + (size_t)r * rb, f, c, r, U, M);
}

AVX2 __attribute__((always_inline)) static inline void dot_rows_avx2_fmt(float *y, int64_t ldy, const float *x,
                                                                         int64_t m, const void *w,
                                                                         dsc_weight_format f, int64_t c,
                                                                         int64_t r0, int64_t r1, const bool WIDE) {
    switch (m) {
    case 1:
        dot_rows_m(y, ldy, x, w, f, c, r0, r1, 1, WIDE);
        break;
    case 2:
        dot_rows_m(y, ldy, x, w, f, c, r0, r1, 2, WIDE);
        break;
    case 3:
        dot_rows_m(y, ldy, x, w, f, c, r0, r1, 3, WIDE);
        break;
    default:
        dot_rows_m(y, ldy, x, w, f, c, r0, r1, 4, WIDE);
        break;
    }
}

/* Q8_0, R rows against M x rows: per block of 32 the int8 products are
 * summed unscaled, then scaled once; the x block is loaded once for all R rows. */
AVX2 __attribute__((always_inline)) static inline void q8_block(float *y, int64_t ldy, const float *x,
                                                                const uint8_t *w, size_t rb, int64_t c, int64_t r,
                                                                const int R, const int M) {
    __m256 acc[2][DSC_CPU_GEMV_MAX_ROWS];
    for (int k = 0; k < R; k++)
        for (int i = 0; i < M; i++)
            acc[k][i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < c / Q8_BLOCK; b++) {
        __m256 d[2], wv[2][4];
        for (int k = 0; k < R; k++) {
            const uint8_t *blk = w + (size_t)(r + k) * rb + b * Q8_BLOCK_BYTES;
            uint16_t dh;
            memcpy(&dh, blk, sizeof dh);
            d[k] = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(dh)));
            for (int g = 0; g < 4; g++)
                wv[k][g] =
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * g))));
        }
        for (int i = 0; i < M; i++) {
            const float *xb = x + i * c + b * Q8_BLOCK;
            __m256 x0 = _mm256_loadu_ps(xb), x1 = _mm256_loadu_ps(xb + 8), x2 = _mm256_loadu_ps(xb + 16),
                   x3 = _mm256_loadu_ps(xb + 24);
            for (int k = 0; k < R; k++) {
                __m256 s = _mm256_mul_ps(x0, wv[k][0]);
                s = _mm256_fmadd_ps(x1, wv[k][1], s);
                s = _mm256_fmadd_ps(x2, wv[k][2], s);
                s = _mm256_fmadd_ps(x3, wv[k][3], s);
                acc[k][i] = _mm256_fmadd_ps(s, d[k], acc[k][i]);
            }
        }
    }
    for (int k = 0; k < R; k++)
        for (int i = 0; i < M; i++)
            y[i * ldy + r + k] = hsum(acc[k][i]);
}

AVX2 __attribute__((always_inline)) static inline void q8_rows_m(float *y, int64_t ldy, const float *x,
                                                                 const void *w, int64_t c, int64_t r0, int64_t r1,
                                                                 const int M, const bool WIDE) {
    const size_t rb = dsc_cpu_row_bytes(DSC_WEIGHT_Q8_0, c);
    const int R = M <= 2 || WIDE ? 2 : 1;
    int64_t r = r0;
    for (; r + R <= r1; r += R)
        q8_block(y, ldy, x, w, rb, c, r, R, M);
    for (; r < r1; r++)
        q8_block(y, ldy, x, w, rb, c, r, 1, M);
}

AVX2 __attribute__((always_inline)) static inline void dot_rows_avx2_q8(float *y, int64_t ldy, const float *x,
                                                                        int64_t m, const void *w, int64_t c,
                                                                        int64_t r0, int64_t r1, const bool WIDE) {
    switch (m) {
    case 1:
        q8_rows_m(y, ldy, x, w, c, r0, r1, 1, WIDE);
        break;
    case 2:
        q8_rows_m(y, ldy, x, w, c, r0, r1, 2, WIDE);
        break;
    case 3:
        q8_rows_m(y, ldy, x, w, c, r0, r1, 3, WIDE);
        break;
    default:
        q8_rows_m(y, ldy, x, w, c, r0, r1, 4, WIDE);
        break;
    }
}

AVX2 __attribute__((always_inline)) static inline void dot_rows_any(float *y, int64_t ldy, const float *x,
                                                                    int64_t m, const void *w, dsc_weight_format f,
                                                                    int64_t c, int64_t r0, int64_t r1,
                                                                    const bool WIDE) {
    /* One call per format, so each loop is compiled with its widening inlined. */
    switch (f) {
    case DSC_WEIGHT_BF16:
        dot_rows_avx2_fmt(y, ldy, x, m, w, DSC_WEIGHT_BF16, c, r0, r1, WIDE);
        break;
    case DSC_WEIGHT_F16:
        dot_rows_avx2_fmt(y, ldy, x, m, w, DSC_WEIGHT_F16, c, r0, r1, WIDE);
        break;
    case DSC_WEIGHT_Q8_0:
        dot_rows_avx2_q8(y, ldy, x, m, w, c, r0, r1, WIDE);
        break;
    default:
        dot_rows_avx2_fmt(y, ldy, x, m, w, DSC_WEIGHT_F32, c, r0, r1, WIDE);
        break;
    }
}

AVX2 static void dot_rows_avx2(float *y, int64_t ldy, const float *x, int64_t m, const void *w,
                               dsc_weight_format f, int64_t c, int64_t r0, int64_t r1) {
    dot_rows_any(y, ldy, x, m, w, f, c, r0, r1, false);
}

/* The same 256-bit loops compiled with AVX-512VL's 32 vector registers, where the
 * wider register blocks (four weight rows for four x rows: 16 accumulators) fit. */
__attribute__((target("avx2,fma,f16c,avx512f,avx512vl"))) static void
dot_rows_avx512vl(float *y, int64_t ldy, const float *x, int64_t m, const void *w, dsc_weight_format f, int64_t c,
                  int64_t r0, int64_t r1) {
    dot_rows_any(y, ldy, x, m, w, f, c, r0, r1, true);
}

/* ---- AVX-512F: 512-bit GEMV loops for decode (one to four x rows) ------------------------------------ */
#define AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512vl")))
enum { ZMM_COLS = 32, ZMM_X_MAX = 8192 }; /* columns per step; most x floats permuted on the stack */
/* How far ahead the 2-byte weight streams are prefetched (one or two x rows): 2 KB took bf16's
 * GEMV from 21-22 to 25 GB/s on two threads (Sapphire Rapids); 4 KB took it from 29.0 to 30.5
 * GB/s on Emerald Rapids (six alternations, medians; 6 and 8 KB no better, 1 KB worse) and
 * bf16 decode from 0.75-0.85 to 0.89-0.94 of its roofline; f32 gained nothing from one (1, 2 or
 * 4 KB ahead), so it goes without. */
enum { ZMM_PREFETCH_BYTES = 4096 };

/* Whether the cores are Intel's, where the 512-bit loops were tuned (Sapphire Rapids). Elsewhere
 * two of their choices are undone, each measured on AMD Zen 4 (three or more interleaved pairs):
 * the 2-byte streams' prefetches, which took f16's GEMV from 28-37 down to 26-27 GB/s and bf16's
 * from 40 to 30 (its hardware prefetcher already follows each row, and the extra loads take issue
 * slots); and 512-bit f16, whose vcvtph2ps streams at 0.85 of the read rate where the 256-bit
 * loops with 32 registers reach 0.92-0.96. */
static bool intel_cores(void) {
    static _Atomic int state; /* 0 unknown, 1 no, 2 yes */
    int s = atomic_load(&state);
    if (!s) {
        __builtin_cpu_init();
        s = __builtin_cpu_is("intel") ? 2 : 1;
        atomic_store(&state, s);
    }
    return s == 2;
}

/* 32 weights of a row from column j as two f32 vectors: columns j..j+15 and j+16..j+31 (f32, f16),
 * or for bf16 the even and the odd columns, each widened by one instruction (a shift, a mask) from
 * one 64-byte load; x is permuted to match (bf16_perm_x). */
AVX512 __attribute__((always_inline)) static inline void load32(const void *row, dsc_weight_format f, int64_t j,
                                                                __m512 *lo, __m512 *hi) {
    if (f == DSC_WEIGHT_BF16) {
        __m512i v = _mm512_loadu_si512((const uint16_t *)row + j);
        *lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        *hi = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32((int)0xFFFF0000u)));
    } else if (f == DSC_WEIGHT_F16) {
        *lo = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + j)));
        *hi = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)row + j + 16)));
    } else {
        *lo = _mm512_loadu_ps((const float *)row + j);
        *hi = _mm512_loadu_ps((const float *)row + j + 16);
    }
}

/* xp: each block of 32 x values as its 16 even then its 16 odd ones (the order load32 widens bf16 in). */
AVX512 static void bf16_perm_x(float *xp, const float *x, int64_t c32) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for (int64_t j = 0; j < c32; j += ZMM_COLS) {
        __m512 a = _mm512_loadu_ps(x + j), b = _mm512_loadu_ps(x + j + 16);
        _mm512_storeu_ps(xp + j, _mm512_permutex2var_ps(a, even, b));
        _mm512_storeu_ps(xp + j + 16, _mm512_permutex2var_ps(a, odd, b));
    }
}

/* One weight row against M x rows (xs: x, permuted for bf16; ldx its row stride): for one or two
 * x rows 64 columns a step in four accumulators per x row, then 32 in two (for three or four x rows
 * only 32: the wider step ran at two thirds of the rate for f16); one row at a time as dot_row,
 * for the same reason. */
AVX512 __attribute__((always_inline)) static inline void zmm_row(float *y, int64_t ldy, const float *xs,
                                                                 int64_t ldx, const float *x, const uint8_t *row,
                                                                 dsc_weight_format f, int64_t c, int64_t r,
                                                                 const int M, bool prefetch) {
    __m512 acc[4][DSC_CPU_GEMV_MAX_ROWS];
    for (int u = 0; u < 4; u++)
        for (int i = 0; i < M; i++)
            acc[u][i] = _mm512_setzero_ps();
    int64_t j = 0;
    for (; M <= 2 && j + 2 * ZMM_COLS <= c; j += 2 * ZMM_COLS) {
        __m512 wv[4];
        if (f != DSC_WEIGHT_F32 && prefetch) { /* the step's 128 bytes, ZMM_PREFETCH_BYTES ahead */
            const char *p = (const char *)row + j * 2 + ZMM_PREFETCH_BYTES;
            _mm_prefetch(p, _MM_HINT_T0);
            _mm_prefetch(p + 64, _MM_HINT_T0);
        }
        load32(row, f, j, &wv[0], &wv[1]);
        load32(row, f, j + ZMM_COLS, &wv[2], &wv[3]);
        for (int i = 0; i < M; i++)
            for (int u = 0; u < 4; u++)
                acc[u][i] = _mm512_fmadd_ps(_mm512_loadu_ps(xs + i * ldx + j + 16 * u), wv[u], acc[u][i]);
    }
    for (; j + ZMM_COLS <= c; j += ZMM_COLS) {
        __m512 lo, hi;
        load32(row, f, j, &lo, &hi);
        for (int i = 0; i < M; i++) {
            acc[0][i] = _mm512_fmadd_ps(_mm512_loadu_ps(xs + i * ldx + j), lo, acc[0][i]);
            acc[1][i] = _mm512_fmadd_ps(_mm512_loadu_ps(xs + i * ldx + j + 16), hi, acc[1][i]);
        }
    }
    for (int i = 0; i < M; i++) {
        __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[0][i], acc[1][i]), _mm512_add_ps(acc[2][i], acc[3][i]));
        y[i * ldy + r] = _mm512_reduce_add_ps(sum) + tail_dot(x + i * c, row, f, j, c);
    }
}

AVX512 __attribute__((always_inline)) static inline void zmm_rows_m(float *y, int64_t ldy, const float *xs,
                                                                    int64_t ldx, const float *x, const void *w,
                                                                    dsc_weight_format f, int64_t c, int64_t r0,
                                                                    int64_t r1, const int M) {
    const size_t rb = dsc_cpu_row_bytes(f, c);
    const bool prefetch = intel_cores();
    for (int64_t r = r0; r < r1; r++)
        zmm_row(y, ldy, xs, ldx, x, (const uint8_t *)w + (size_t)r * rb, f, c, r, M, prefetch);
}

AVX512 __attribute__((always_inline)) static inline void zmm_rows_fmt(float *y, int64_t ldy, const float *xs,
                                                                      int64_t ldx, const float *x, int64_t m,
                                                                      const void *w, dsc_weight_format f,
                                                                      int64_t c, int64_t r0, int64_t r1) {
    switch (m) {
    case 1:
        zmm_rows_m(y, ldy, xs, ldx, x, w, f, c, r0, r1, 1);
        break;
    case 2:
        zmm_rows_m(y, ldy, xs, ldx, x, w, f, c, r0, r1, 2);
        break;
    case 3:
        zmm_rows_m(y, ldy, xs, ldx, x, w, f, c, r0, r1, 3);
        break;
    default:
        zmm_rows_m(y, ldy, xs, ldx, x, w, f, c, r0, r1, 4);
        break;
    }
}

/* f32, bf16 and f16 weights with 512-bit vectors; false (nothing done) where this path does not
 * apply: Q8_0 (cpu_q8_dot.c), f16 on other cores than Intel's (intel_cores), or a bf16 x too wide
 * for the permuted copy on the stack. */
AVX512 static bool dot_rows_avx512(float *y, int64_t ldy, const float *x, int64_t m, const void *w,
                                   dsc_weight_format f, int64_t c, int64_t r0, int64_t r1) {
    switch (f) {
    case DSC_WEIGHT_F32:
        zmm_rows_fmt(y, ldy, x, c, x, m, w, DSC_WEIGHT_F32, c, r0, r1);
        return true;
    case DSC_WEIGHT_F16:
        if (!intel_cores()) return false;
        zmm_rows_fmt(y, ldy, x, c, x, m, w, DSC_WEIGHT_F16, c, r0, r1);
        return true;
    case DSC_WEIGHT_BF16: {
        const int64_t c32 = c / ZMM_COLS * ZMM_COLS;
        if (c32 * m > ZMM_X_MAX) return false;
        _Alignas(64) float xp[ZMM_X_MAX];
        for (int64_t i = 0; i < m; i++)
            bf16_perm_x(xp + i * c32, x + i * c, c32);
        zmm_rows_fmt(y, ldy, xp, c32, x, m, w, DSC_WEIGHT_BF16, c, r0, r1);
        return true;
    }
    default:
        return false;
    }
}

/* exp(x) for x <= 88.3 (Cephes' polynomial after reducing by multiples of
 * ln 2, relative error ~2e-7); 0 below -87.3, where expf underflows too. */
AVX2 static inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), _mm256_set1_ps(88.3f));
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

AVX2 static float exp_shift_sum_avx2(float *x, int64_t n, float shift) {
    __m256 s = _mm256_set1_ps(shift), acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), s));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float sum = hsum(acc);
    for (; i < n; i++)
        sum += x[i] = expf(x[i] - shift);
    return sum;
}

/* exp8 sixteen lanes at a time; lanes past n of the last step are masked off. */
AVX512 static inline __m512 exp16(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.3f);
    __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, lo), _mm512_set1_ps(88.3f));
    __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, x, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mul_ps((__mmask16)~under, p, _mm512_castsi512_ps(e));
}

AVX512 static float exp_shift_sum_avx512(float *x, int64_t n, float shift) {
    __m512 s = _mm512_set1_ps(shift), acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 lanes = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, x + i), s));
        _mm512_mask_storeu_ps(x + i, lanes, e);
        acc = _mm512_mask_add_ps(acc, lanes, acc, e);
    }
    return _mm512_reduce_add_ps(acc);
}

AVX2 static float max_avx2(const float *x, int64_t n) {
    __m256 acc[4];
    for (int a = 0; a < 4; a++)
        acc[a] = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) /* four chains: one max_ps each waits for its own */
        for (int a = 0; a < 4; a++)
            acc[a] = _mm256_max_ps(_mm256_loadu_ps(x + i + 8 * a), acc[a]); /* a NaN x keeps acc, as max_scalar */
    for (; i + 8 <= n; i += 8)
        acc[0] = _mm256_max_ps(_mm256_loadu_ps(x + i), acc[0]);
    __m256 m = _mm256_max_ps(_mm256_max_ps(acc[0], acc[1]), _mm256_max_ps(acc[2], acc[3]));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    float best = _mm_cvtss_f32(h);
    float rest = max_scalar(x + i, n - i);
    return rest > best ? rest : best;
}

AVX2 static void swiglu_avx2(float *out, const float *gate, const float *up, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i);
        __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g)); /* gate * sigmoid(gate) = gate / (1 + e^-gate) */
        _mm256_storeu_ps(out + i, _mm256_div_ps(_mm256_mul_ps(g, _mm256_loadu_ps(up + i)), _mm256_add_ps(one, e)));
    }
    swiglu_scalar(out + i, gate + i, up + i, n - i);
}

AVX2 static void swiglu_grad_avx2(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                                  int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 g = _mm256_loadu_ps(gate + i), u = _mm256_loadu_ps(up + i), d = _mm256_loadu_ps(dout + i);
        __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), g))));
        __m256 ds = _mm256_mul_ps(d, s);
        _mm256_storeu_ps(dup + i, _mm256_mul_ps(ds, g));
        __m256 slope = _mm256_add_ps(one, _mm256_mul_ps(g, _mm256_sub_ps(one, s)));
        _mm256_storeu_ps(dgate + i, _mm256_mul_ps(_mm256_mul_ps(ds, u), slope));
    }
    swiglu_grad_scalar(dgate + i, dup + i, dout + i, gate + i, up + i, n - i);
}

/* tanh(u) = 2 / (1 + e^-2u) - 1, the scalar loops' form; exp8's clamp keeps both ends finite
 * (-1 below u = -44, +1 above 43.6), and a NaN x still reaches the output through the x factor. */
AVX2 static inline __m256 gelu_tanh8(__m256 x) {
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    __m256 u = _mm256_mul_ps(_mm256_set1_ps(GELU_SCALE), _mm256_fmadd_ps(_mm256_set1_ps(GELU_CUBIC), x3, x));
    __m256 e = exp8(_mm256_mul_ps(_mm256_set1_ps(-2.0f), u));
    return _mm256_sub_ps(_mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(one, e)), one);
}

AVX2 static void gelu_avx2(float *out, const float *x, int64_t n) {
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i);
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, gelu_tanh8(v))));
    }
    gelu_scalar(out + i, x + i, n - i);
}

AVX2 static void gelu_grad_avx2(float *dx, const float *dout, const float *x, int64_t n) {
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    const __m256 slope = _mm256_set1_ps(3.0f * GELU_CUBIC), scale = _mm256_set1_ps(0.5f * GELU_SCALE);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i), th = gelu_tanh8(v);
        __m256 sech2 = _mm256_fnmadd_ps(th, th, one);
        /* 0.5 (1 + th) + 0.5 x sech^2 sqrt(2/pi) (1 + 3 c x^2) */
        __m256 inner = _mm256_mul_ps(_mm256_mul_ps(scale, v), _mm256_fmadd_ps(slope, _mm256_mul_ps(v, v), one));
        __m256 grad = _mm256_fmadd_ps(inner, sech2, _mm256_mul_ps(half, _mm256_add_ps(one, th)));
        _mm256_storeu_ps(dx + i, _mm256_mul_ps(grad, _mm256_loadu_ps(dout + i)));
    }
    gelu_grad_scalar(dx + i, dout + i, x + i, n - i);
}

/* Rows [r0, r1) of a narrow weight widened into dst (r1 - r0, c), as widen_rows_scalar: a Q8_0 block
 * is sign-extended and multiplied by its scale, the columns a vector step leaves over go one by one.
 * A prompt widens its narrow weights this way once per 128-row panel (cpu_linear.c: all f16, and
 * bf16 and Q8_0 where their dots do not run), so the per-value conversion call it replaces cost
 * f16 and Q8_0 a tenth of their prefill. */
AVX2 static void widen_rows_avx2(float *dst, const void *w, dsc_weight_format f, int64_t c, int64_t r0,
                                 int64_t r1) {
    const size_t rb = dsc_cpu_row_bytes(f, c);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w + (size_t)r * rb;
        float *out = dst + (r - r0) * c;
        int64_t j = 0;
        if (f == DSC_WEIGHT_Q8_0) {
            for (; j + Q8_BLOCK <= c; j += Q8_BLOCK) {
                const uint8_t *blk = row + (j / Q8_BLOCK) * Q8_BLOCK_BYTES;
                uint16_t dh;
                memcpy(&dh, blk, sizeof dh);
                __m256 d = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(dh)));
                for (int g = 0; g < 4; g++) {
                    __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * g)));
                    _mm256_storeu_ps(out + j + 8 * g, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
                }
            }
        } else {
            for (; j + 8 <= c; j += 8)
                _mm256_storeu_ps(out + j, load8(row, f, j));
        }
        for (; f != DSC_WEIGHT_Q8_0 && j < c; j++) /* Q8_0 rows are whole blocks */
            out[j] = widen_one(row, f, j);
    }
}
#endif

/* ---- dispatch ---------------------------------------------------------------------------------- */

void dsc_cpu_dot_rows(float *y, int64_t ldy, const float *x, int64_t m, const void *w, dsc_weight_format format,
                      int64_t c, int64_t r0, int64_t r1) {
#ifdef DSC_HAVE_AVX2_BUILD
    int level = simd_level();
    if (level == SIMD_AVX512 && dot_rows_avx512(y, ldy, x, m, w, format, c, r0, r1)) return;
    if (level >= SIMD_AVX512VL) {
        dot_rows_avx512vl(y, ldy, x, m, w, format, c, r0, r1);
        return;
    }
    if (level == SIMD_AVX2) {
        dot_rows_avx2(y, ldy, x, m, w, format, c, r0, r1);
        return;
    }
#endif
    dot_rows_scalar(y, ldy, x, m, w, format, c, r0, r1);
}

static void widen_rows_scalar(float *dst, const void *w, dsc_weight_format format, int64_t c, int64_t r0,
                              int64_t r1) {
    size_t rb = dsc_cpu_row_bytes(format, c);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w + (size_t)r * rb;
        float *out = dst + (r - r0) * c;
        if (format == DSC_WEIGHT_BF16) {
            const uint16_t *h = (const uint16_t *)row;
            for (int64_t j = 0; j < c; j++) { /* the shift vectorises */
                uint32_t u = (uint32_t)h[j] << 16;
                memcpy(out + j, &u, sizeof u);
            }
        } else if (format == DSC_WEIGHT_Q8_0) {
            for (int64_t b = 0; b < c / Q8_BLOCK; b++) {
                uint16_t dh;
                memcpy(&dh, row + b * Q8_BLOCK_BYTES, sizeof dh);
                float d = dsc_f16_to_f32(dh);
                const int8_t *q = (const int8_t *)(row + b * Q8_BLOCK_BYTES + 2);
                for (int j = 0; j < Q8_BLOCK; j++)
                    out[b * Q8_BLOCK + j] = d * (float)q[j];
            }
        } else {
            for (int64_t j = 0; j < c; j++)
                out[j] = widen_one(row, format, j);
        }
    }
}

void dsc_cpu_widen_rows(float *dst, const void *w, dsc_weight_format format, int64_t c, int64_t r0, int64_t r1) {
#ifdef DSC_HAVE_AVX2_BUILD
    if (dsc_cpu_simd()) { /* memory-bound: 512-bit vectors gain nothing here */
        widen_rows_avx2(dst, w, format, c, r0, r1);
        return;
    }
#endif
    widen_rows_scalar(dst, w, format, c, r0, r1);
}

float dsc_cpu_exp_shift_sum(float *x, int64_t n, float shift) {
#ifdef DSC_HAVE_AVX2_BUILD
    if (simd_level() == SIMD_AVX512) return exp_shift_sum_avx512(x, n, shift);
    if (dsc_cpu_simd()) return exp_shift_sum_avx2(x, n, shift);
#endif
    return exp_shift_sum_scalar(x, n, shift);
}

void dsc_cpu_swiglu_rows(float *out, const float *gate, const float *up, int64_t n) {
#ifdef DSC_HAVE_AVX2_BUILD
    if (dsc_cpu_simd()) {
        swiglu_avx2(out, gate, up, n);
        return;
    }
#endif
    swiglu_scalar(out, gate, up, n);
}

void dsc_cpu_swiglu_grad_rows(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                              int64_t n) {
#ifdef DSC_HAVE_AVX2_BUILD
    if (dsc_cpu_simd()) {
        swiglu_grad_avx2(dgate, dup, dout, gate, up, n);
        return;
    }
#endif
    swiglu_grad_scalar(dgate, dup, dout, gate, up, n);
}

void dsc_cpu_gelu_rows(float *out, const float *x, int64_t n) {
#ifdef DSC_HAVE_AVX2_BUILD
    if (dsc_cpu_simd()) {
        gelu_avx2(out, x, n);
        return;
    }
#endif
    gelu_scalar(out, x, n);
}

void dsc_cpu_gelu_grad_rows(float *dx, const float *dout, const float *x, int64_t n) {
#ifdef DSC_HAVE_AVX2_BUILD
    if (dsc_cpu_simd()) {
        gelu_grad_avx2(dx, dout, x, n);
        return;
    }
#endif
    gelu_grad_scalar(dx, dout, x, n);
}

float dsc_cpu_max(const float *x, int64_t n) {
#ifdef DSC_HAVE_AVX2_BUILD
    if (dsc_cpu_simd()) return max_avx2(x, n);
#endif
    return max_scalar(x, n);
}
