/* Prompt-sized products with bf16 weights on AVX-512 BF16 (cpu_bf16_gemm.h).
 *
 * A panel of weight rows is packed 64 rows at a time into pair-interleaved blocks: for each pair
 * of columns (2k, 2k + 1), the 64 rows' two bf16 values as one 32-bit word each, one 64-byte
 * vector per pair. A tile of six x rows by 64 weight rows then keeps its 24 f32 accumulators in
 * registers; each step loads four weight vectors, broadcasts each x row's pair (one 32-bit
 * load), and vdpbf16ps adds both products of a pair to every lane. The packed block (96 KB at
 * c 768) stays in L2 while every tile of x passes over it. Only x86-64 builds have the kernels
 * (elsewhere dsc_cpu_bf16_gemm_available is false and cpu_linear.c never calls them). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/tensor.h"
#include "kernels/cpu/cpu_bf16_gemm.h"

#if defined(__x86_64__)
#define DSC_BF16_X86 1
#include <immintrin.h>
#endif

enum { BLOCK_ROWS = 64, TILE_X_ROWS = 6 };

bool dsc_cpu_bf16_gemm_available(void) {
    static _Atomic int state; /* 0 unknown, 1 no, 2 yes */
    int s = atomic_load(&state);
    if (!s) {
        s = 1;
#ifdef DSC_BF16_X86
        const char *env = getenv("DSC_CPU_SIMD");
        __builtin_cpu_init();
        bool cpu = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
        /* The dot pays where vdpbf16ps issues as often as an f32 FMA, so that it does twice the
         * work: AMD's Zen 4 runs one of either a cycle (2048^3 in bf16 products 386 GFLOP/s against
         * sgemm's 189, 2 cores). Intel's cores without AMX issue it on one port where FMAs take two:
         * the same peak as sgemm, and the packing on top (an Emerald Rapids, 2 cores: the dot
         * 111-154 GFLOP/s, sgemm over rounded copies 160-243; a GPT-2 bf16 training step 1.37x and a
         * bf16-weight prefill 1.34x faster without the dot). */
        bool pays = __builtin_cpu_is("amd");
        if (cpu && (env ? strcmp(env, "avx512bf16") == 0 : pays)) s = 2;
#endif
        atomic_store(&state, s);
    }
    return s == 2;
}

#ifdef DSC_BF16_X86 /* the kernels (cpu_bf16_gemm.h) */
static int64_t even(int64_t c) {
    return c + (c & 1);
}

/* x's rows padded to whole tiles (the padding zero, its products never stored). */
static int64_t padded_rows(int64_t n) {
    return (n + TILE_X_ROWS - 1) / TILE_X_ROWS * TILE_X_ROWS;
}

size_t dsc_cpu_bf16_x_bytes(int64_t n, int64_t c) {
    return (size_t)padded_rows(n) * (size_t)even(c) * sizeof(uint16_t);
}

size_t dsc_cpu_bf16_pack_bytes(int64_t rows, int64_t c) {
    int64_t blocks = (rows + BLOCK_ROWS - 1) / BLOCK_ROWS;
    return (size_t)blocks * BLOCK_ROWS * (size_t)(even(c) / 2) * sizeof(uint32_t);
}

/* Rows [r0, r0 + rows) (at most BLOCK_ROWS) of W as one block: dst[k * BLOCK_ROWS + j] holds row
 * r0 + j's columns 2k (low half) and 2k + 1; rows past `rows` and the column after an odd c are 0. */
static void pack_block(uint32_t *dst, const uint16_t *w, int64_t c, int64_t r0, int64_t rows) {
    const int64_t pairs = even(c) / 2, whole = c / 2;
    for (int64_t j = 0; j < BLOCK_ROWS; j++) {
        if (j >= rows) {
            for (int64_t k = 0; k < pairs; k++)
                dst[k * BLOCK_ROWS + j] = 0;
            continue;
        }
        const uint16_t *row = w + (size_t)(r0 + j) * (size_t)c;
        for (int64_t k = 0; k < whole; k++)
            memcpy(dst + k * BLOCK_ROWS + j, row + 2 * k, sizeof(uint32_t));
        if (pairs > whole) dst[whole * BLOCK_ROWS + j] = row[c - 1];
    }
}

#define BF16DOT __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

/* M (constant once inlined) x rows against the block's 64 rows: 4 * M accumulators; the first
 * `rows` of them stored. */
BF16DOT __attribute__((always_inline)) static inline void tile(float *y, int64_t ldy, const uint16_t *xb,
                                                               int64_t c2, const uint32_t *pk, int64_t cols,
                                                               int64_t rows, const int M, float alpha, bool add) {
    __m512 acc[TILE_X_ROWS][4];
    for (int i = 0; i < M; i++)
        for (int u = 0; u < 4; u++)
            acc[i][u] = _mm512_setzero_ps();
    for (int64_t k = 0; k < c2 / 2; k++) {
        __m512bh b[4];
        for (int u = 0; u < 4; u++)
            b[u] = (__m512bh)_mm512_loadu_si512(pk + k * BLOCK_ROWS + 16 * u);
        for (int i = 0; i < M; i++) {
            int32_t pair;
            memcpy(&pair, xb + i * c2 + 2 * k, sizeof pair);
            __m512bh a = (__m512bh)_mm512_set1_epi32(pair);
            for (int u = 0; u < 4; u++)
                acc[i][u] = _mm512_dpbf16_ps(acc[i][u], a, b[u]);
        }
    }
    for (int u = 0; u < 4; u++) {
        int64_t left = cols - 16 * u;
        __mmask16 lanes = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
        for (int i = 0; i < M && i < rows; i++) {
            float *at = y + i * ldy + 16 * u;
            __m512 v = alpha == 1.0f ? acc[i][u] : _mm512_mul_ps(acc[i][u], _mm512_set1_ps(alpha));
            if (add) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(lanes, at));
            _mm512_mask_storeu_ps(at, lanes, v);
        }
    }
}

/* y = alpha * xb . block (+ y when `add`) for n x rows and the block's first `cols` rows. */
BF16DOT static void block_avx512(float *y, int64_t ldy, const uint16_t *xb, int64_t c2, int64_t n,
                                 const uint32_t *pk, int64_t cols, float alpha, bool add) {
    for (int64_t i = 0; i < n; i += TILE_X_ROWS) /* the last tile reads x's padding rows */
        tile(y + i * ldy, ldy, xb + i * c2, c2, pk, cols, n - i, TILE_X_ROWS, alpha, add);
}

/* Sixteen floats rounded to bf16 as dsc_f32_to_bf16 (nearest even; a NaN stays a quiet NaN). */
BF16DOT static inline __m256i round16(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __mmask16 nan =
        _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

/* r[t] element j = r[j] element t before, for 32-bit elements: two rounds of unpacks within the
 * 128-bit lanes (each lane then holds four rows of one column), two of lane shuffles across them. */
BF16DOT static void transpose16(__m512i r[16]) {
    __m512i t[16], u[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* u[4i + q], lane L: rows 4i .. 4i + 3 of column 4L + q */
    for (int q = 0; q < 4; q++) {
        __m512i w0 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0x88), w1 = _mm512_shuffle_i32x4(u[q], u[4 + q], 0xdd);
        __m512i w2 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0x88);
        __m512i w3 = _mm512_shuffle_i32x4(u[8 + q], u[12 + q], 0xdd);
        r[q] = _mm512_shuffle_i32x4(w0, w2, 0x88);
        r[4 + q] = _mm512_shuffle_i32x4(w1, w3, 0x88);
        r[8 + q] = _mm512_shuffle_i32x4(w0, w2, 0xdd);
        r[12 + q] = _mm512_shuffle_i32x4(w1, w3, 0xdd);
    }
}

/* A transposed x (rs 1): rows [i, i + 16) by columns [j, j + 16), each column one load, rounded,
 * transposed in registers and stored a row at a time. */
BF16DOT static void round_x_transposed16(uint16_t *xb, const float *x, int64_t cs, int64_t c2, int64_t i,
                                         int64_t j) {
    __m512i r[16];
    for (int jj = 0; jj < 16; jj++)
        r[jj] = _mm512_cvtepu16_epi32(round16(_mm512_loadu_ps(x + (j + jj) * cs + i)));
    transpose16(r);
    for (int t = 0; t < 16; t++)
        _mm256_storeu_si256((__m256i *)(xb + (i + t) * c2 + j), _mm512_cvtepi32_epi16(r[t]));
}

/* Rows [i0, i1) of xb from x's element (i, j) at x[i * rs + j * cs]: contiguous rows (cs 1) a
 * vector at a time; a transposed x (rs 1) sixteen rows by sixteen columns at a time, transposed
 * in registers; any other layout value by value. */
BF16DOT void dsc_cpu_bf16_round_x_rows(uint16_t *xb, const float *x, int64_t rs, int64_t cs, int64_t c, int64_t i0,
                                       int64_t i1) {
    const int64_t c2 = even(c);
    int64_t i = i0;
    if (rs == 1 && cs != 1) {
        /* the row blocks innermost, so that each column's rows of the range are read as one run
         * (a column is a row of the stored matrix, cs floats from the next): 16.6-19.6 against
         * 25-31 ms for GPT-2's head gradient (50257 x 512) on one thread */
        const int64_t whole = i0 + (i1 - i0) / 16 * 16;
        int64_t j = 0;
        for (; j + 16 <= c; j += 16)
            for (int64_t b = i0; b < whole; b += 16)
                round_x_transposed16(xb, x, cs, c2, b, j);
        for (; j < c; j++)
            for (int64_t b = i0; b < whole; b += 16) {
                uint16_t v[16];
                _mm256_storeu_si256((__m256i *)v, round16(_mm512_loadu_ps(x + j * cs + b)));
                for (int t = 0; t < 16; t++)
                    xb[(b + t) * c2 + j] = v[t];
            }
        i = whole;
    }
    for (; i < i1; i++) {
        int64_t j = 0;
        for (; cs == 1 && j + 16 <= c; j += 16)
            _mm256_storeu_si256((__m256i *)(xb + i * c2 + j), round16(_mm512_loadu_ps(x + i * rs + j)));
        for (; j < c; j++)
            xb[i * c2 + j] = dsc_f32_to_bf16(x[i * rs + j * cs]);
    }
    for (i = i0; c2 != c && i < i1; i++)
        xb[i * c2 + c] = 0;
}

void dsc_cpu_bf16_round_x(uint16_t *xb, const float *x, int64_t n, int64_t c) {
    dsc_cpu_bf16_pad_x(xb, n, c);
    dsc_cpu_bf16_round_x_rows(xb, x, c, 1, c, 0, n);
}

void dsc_cpu_bf16_pad_x(uint16_t *xb, int64_t n, int64_t c) {
    memset(xb + n * even(c), 0, (size_t)((padded_rows(n) - n) * even(c)) * sizeof *xb);
}

/* pack_block's layout from an f32 W, each value rounded to bf16: W's element (r, k) at
 * w[r * rs + k * ks]. A transposed W (rs 1) packs sixteen rows of a pair of columns per step, two
 * vectors widened and interleaved into one; rows along k (ks 1) round 32 columns of a row at a
 * time into 16 pairs, stored one word each; any other layout value by value. */
BF16DOT void dsc_cpu_bf16_pack_f32(uint32_t *dst, const float *w, int64_t rs, int64_t ks, int64_t c, int64_t r0,
                                   int64_t rows) {
    const int64_t pairs = even(c) / 2, whole = c / 2;
    if (rs == 1 && ks != 1) {
        for (int64_t k = 0; k < pairs; k++)
            for (int u = 0; u < 4; u++) {
                int64_t left = rows - 16 * u;
                __mmask16 lanes = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
                const float *lo = w + 2 * k * ks + r0 + 16 * u;
                __m512i a = _mm512_cvtepu16_epi32(round16(_mm512_maskz_loadu_ps(lanes, lo)));
                __m512i b = k < whole ? _mm512_cvtepu16_epi32(round16(_mm512_maskz_loadu_ps(lanes, lo + ks)))
                                      : _mm512_setzero_si512();
                _mm512_storeu_si512(dst + k * BLOCK_ROWS + 16 * u, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
            }
        return;
    }
    int64_t first = 0; /* the pairs before it are packed */
    for (; ks == 1 && first + 16 <= whole; first += 16)
        for (int64_t j0 = 0; j0 < BLOCK_ROWS; j0 += 16) {
            /* 16 rows by 16 pairs: each row's 32 columns rounded into 16 words, transposed so that
             * each pair's 16 rows are one store */
            __m512i r[16];
            for (int j = 0; j < 16; j++) {
                r[j] = _mm512_setzero_si512();
                if (j0 + j >= rows) continue;
                const float *row = w + (r0 + j0 + j) * rs + 2 * first;
                r[j] = _mm512_inserti64x4(_mm512_castsi256_si512(round16(_mm512_loadu_ps(row))),
                                          round16(_mm512_loadu_ps(row + 16)), 1);
            }
            transpose16(r);
            for (int t = 0; t < 16; t++)
                _mm512_storeu_si512(dst + (first + t) * BLOCK_ROWS + j0, r[t]);
        }
    for (int64_t j = 0; j < BLOCK_ROWS; j++) {
        if (j >= rows) {
            for (int64_t k = first; k < pairs; k++)
                dst[k * BLOCK_ROWS + j] = 0;
            continue;
        }
        const float *row = w + (r0 + j) * rs;
        for (int64_t k = first; k < pairs; k++) {
            uint32_t lo = dsc_f32_to_bf16(row[2 * k * ks]);
            uint32_t hi = 2 * k + 1 < c ? dsc_f32_to_bf16(row[(2 * k + 1) * ks]) : 0;
            dst[k * BLOCK_ROWS + j] = lo | hi << 16;
        }
    }
}

void dsc_cpu_bf16_multiply(float *y, int64_t ldy, const uint16_t *xb, int64_t n, const uint32_t *pack, int64_t c,
                           int64_t r0, int64_t rows, float alpha, bool add) {
    block_avx512(y + r0, ldy, xb, even(c), n, pack, rows, alpha, add);
}

void dsc_cpu_bf16_gemm_panel(float *y, int64_t ldy, const uint16_t *xb, int64_t n, const uint16_t *w, int64_t c,
                             int64_t r0, int64_t rows, uint32_t *pack) {
    const int64_t c2 = even(c), block_words = BLOCK_ROWS * (c2 / 2);
    for (int64_t b = 0; b * BLOCK_ROWS < rows; b++) {
        const int64_t br0 = b * BLOCK_ROWS, cols = rows - br0 < BLOCK_ROWS ? rows - br0 : BLOCK_ROWS;
        uint32_t *pk = pack + b * block_words;
        pack_block(pk, w, c, r0 + br0, cols);
        block_avx512(y + r0 + br0, ldy, xb, c2, n, pk, cols, 1.0f, false);
    }
}
#endif
