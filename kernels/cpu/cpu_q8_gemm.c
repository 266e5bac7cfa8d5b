/* Prompt-sized products with Q8_0 weights on AVX-512 VNNI (cpu_q8_gemm.h).
 *
 * A panel of weight rows is packed 64 rows at a time; for each block of 32 columns the packed
 * block holds the 64 rows' scales (f32), -128 times each row's sum of the block's int8 weights,
 * and the int8 weights in 8 groups of 4 columns, each group one 64-byte vector of 16 rows' 4
 * bytes x 4. vpdpbusd multiplies unsigned by signed bytes, so x goes in offset by 128 and each
 * integer accumulator starts at the correction, which leaves exactly the signed sum. A tile of
 * three x rows by 64 weight rows keeps 12 integer accumulators for the block and 12 f32 ones
 * for the whole row in registers; after each block the integer sums are converted and added
 * times both scales. Only x86-64 builds have the kernels (elsewhere dsc_cpu_q8_gemm_available is
 * false and cpu_linear.c never calls them). */
#include <stdlib.h>
#include <string.h>

#include "dsc/tensor.h"
#include "kernels/cpu/cpu_q8_dot.h"
#include "kernels/cpu/cpu_q8_gemm.h"

#if defined(__x86_64__)
#define DSC_Q8_GEMM_X86 1
#include <immintrin.h>
#endif

enum {
    Q8_BLOCK = 32,
    Q8_BLOCK_BYTES = 34, /* a weight block: f16 scale + 32 int8 */
    BLOCK_ROWS = 64,
    TILE_X_ROWS = 3,
    GROUPS = Q8_BLOCK / 4,
    /* One packed block of 32 columns: scales, corrections, then the 8 groups of weights. */
    PACKED_SCALES = 0,
    PACKED_CORRECTIONS = BLOCK_ROWS * 4,
    PACKED_WEIGHTS = 2 * BLOCK_ROWS * 4,
    PACKED_BLOCK_BYTES = PACKED_WEIGHTS + GROUPS * BLOCK_ROWS * 4,
};

bool dsc_cpu_q8_gemm_available(void) {
    return strcmp(dsc_cpu_q8_dot_level(), "avx512vnni") == 0;
}

#ifdef DSC_Q8_GEMM_X86 /* the kernels (cpu_q8_gemm.h) */

/* x's rows padded to whole tiles (the padding zero, its products never stored). */
static int64_t padded_rows(int64_t n) {
    return (n + TILE_X_ROWS - 1) / TILE_X_ROWS * TILE_X_ROWS;
}

size_t dsc_cpu_q8_gemm_x_bytes(int64_t n, int64_t c) {
    return (size_t)padded_rows(n) * dsc_cpu_q8_act_row_bytes(c);
}

size_t dsc_cpu_q8_gemm_pack_bytes(int64_t rows, int64_t c) {
    int64_t blocks = (rows + BLOCK_ROWS - 1) / BLOCK_ROWS;
    return (size_t)blocks * (size_t)(c / Q8_BLOCK) * PACKED_BLOCK_BYTES;
}

void dsc_cpu_q8_gemm_prepare_x(void *xu, const float *x, int64_t n, int64_t c) {
    const size_t xrb = dsc_cpu_q8_act_row_bytes(c);
    memset((uint8_t *)xu + (size_t)n * xrb, 0, (size_t)(padded_rows(n) - n) * xrb);
    dsc_cpu_q8_quantize_rows(xu, x, n, c);
    for (int64_t i = 0; i < n; i++) {
        uint8_t *q = (uint8_t *)xu + (size_t)i * xrb;
        for (int64_t j = 0; j < c; j++) /* int8 v as the byte v + 128 */
            q[j] ^= 0x80;
    }
}

/* Rows [r0, r0 + rows) (at most BLOCK_ROWS) of W packed as the header says; rows past `rows` are 0. */
static void pack_block(uint8_t *dst, const uint8_t *w, int64_t c, int64_t r0, int64_t rows) {
    const int64_t blocks = c / Q8_BLOCK;
    const size_t rb = (size_t)blocks * Q8_BLOCK_BYTES;
    memset(dst, 0, (size_t)blocks * PACKED_BLOCK_BYTES);
    for (int64_t j = 0; j < rows; j++) {
        const uint8_t *row = w + (size_t)(r0 + j) * rb;
        for (int64_t b = 0; b < blocks; b++) {
            const uint8_t *blk = row + b * Q8_BLOCK_BYTES;
            uint8_t *pb = dst + b * PACKED_BLOCK_BYTES;
            uint16_t dh;
            memcpy(&dh, blk, sizeof dh);
            float d = dsc_f16_to_f32(dh);
            int32_t sum = 0;
            for (int k = 0; k < Q8_BLOCK; k++)
                sum += (int8_t)blk[2 + k];
            int32_t correction = -128 * sum;
            memcpy(pb + PACKED_SCALES + 4 * j, &d, sizeof d);
            memcpy(pb + PACKED_CORRECTIONS + 4 * j, &correction, sizeof correction);
            for (int g = 0; g < GROUPS; g++)
                memcpy(pb + PACKED_WEIGHTS + (size_t)(g * BLOCK_ROWS + j) * 4, blk + 2 + 4 * g, 4);
        }
    }
}

#define VNNI512 __attribute__((target("avx512f,avx512vl,avx512vnni")))

/* M (constant once inlined) x rows against the block's 64 rows; the first `rows` of them stored. */
VNNI512 __attribute__((always_inline)) static inline void tile(float *y, int64_t ldy, const uint8_t *xu,
                                                               size_t xrb, int64_t c, const uint8_t *pk,
                                                               int64_t cols, int64_t rows, const int M) {
    __m512 acc[TILE_X_ROWS][4];
    for (int i = 0; i < M; i++)
        for (int u = 0; u < 4; u++)
            acc[i][u] = _mm512_setzero_ps();
    for (int64_t b = 0; b < c / Q8_BLOCK; b++) {
        const uint8_t *pb = pk + b * PACKED_BLOCK_BYTES;
        __m512i sum[TILE_X_ROWS][4];
        for (int u = 0; u < 4; u++) {
            __m512i correction = _mm512_loadu_si512(pb + PACKED_CORRECTIONS + 64 * u);
            for (int i = 0; i < M; i++)
                sum[i][u] = correction;
        }
        for (int g = 0; g < GROUPS; g++) {
            __m512i wv[4];
            for (int u = 0; u < 4; u++)
                wv[u] = _mm512_loadu_si512(pb + PACKED_WEIGHTS + g * BLOCK_ROWS * 4 + 64 * u);
            for (int i = 0; i < M; i++) {
                int32_t four;
                memcpy(&four, xu + (size_t)i * xrb + b * Q8_BLOCK + 4 * g, sizeof four);
                __m512i xv = _mm512_set1_epi32(four);
                for (int u = 0; u < 4; u++)
                    sum[i][u] = _mm512_dpbusd_epi32(sum[i][u], xv, wv[u]);
            }
        }
        for (int i = 0; i < M; i++) {
            float dx;
            memcpy(&dx, xu + (size_t)i * xrb + c + 4 * b, sizeof dx);
            __m512 dxv = _mm512_set1_ps(dx);
            for (int u = 0; u < 4; u++) {
                __m512 scale = _mm512_mul_ps(_mm512_loadu_ps((const float *)(pb + PACKED_SCALES) + 16 * u), dxv);
                acc[i][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[i][u]), scale, acc[i][u]);
            }
        }
    }
    for (int u = 0; u < 4; u++) {
        int64_t left = cols - 16 * u;
        __mmask16 lanes = left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
        for (int i = 0; i < M && i < rows; i++)
            _mm512_mask_storeu_ps(y + i * ldy + 16 * u, lanes, acc[i][u]);
    }
}

VNNI512 static void block_vnni(float *y, int64_t ldy, const uint8_t *xu, size_t xrb, int64_t c, int64_t n,
                               const uint8_t *pk, int64_t cols) {
    for (int64_t i = 0; i < n; i += TILE_X_ROWS) /* the last tile reads x's padding rows */
        tile(y + i * ldy, ldy, xu + (size_t)i * xrb, xrb, c, pk, cols, n - i, TILE_X_ROWS);
}

void dsc_cpu_q8_gemm_panel(float *y, int64_t ldy, const void *xu, int64_t n, const void *w, int64_t c, int64_t r0,
                           int64_t rows, void *pack) {
    const size_t xrb = dsc_cpu_q8_act_row_bytes(c), block_bytes = (size_t)(c / Q8_BLOCK) * PACKED_BLOCK_BYTES;
    for (int64_t b = 0; b * BLOCK_ROWS < rows; b++) {
        const int64_t br0 = b * BLOCK_ROWS, cols = rows - br0 < BLOCK_ROWS ? rows - br0 : BLOCK_ROWS;
        uint8_t *pk = (uint8_t *)pack + (size_t)b * block_bytes;
        pack_block(pk, w, c, r0 + br0, cols);
        block_vnni(y + r0 + br0, ldy, xu, xrb, c, n, pk, cols);
    }
}
#endif
