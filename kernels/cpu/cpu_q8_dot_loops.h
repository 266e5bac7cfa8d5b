/* The register-blocked Q8_0 x Q8_0 loops of cpu_q8_dot.c, included once per
 * instruction set (no include guard): the includer defines Q8_NAME(s) (the
 * functions' names), Q8_TARGET (their target attribute), Q8_PROD(aw, sx)
 * (eight int32 sums of four |w| * sign-applied x byte products each) and
 * Q8_R_FEW / Q8_R_MANY (weight rows per block for one or two x rows, and for
 * three or four: as many as the vector registers hold). */

/* R weight rows against M x rows, R and M constants once inlined: R * M
 * f32 accumulators in registers; per block of 32 each weight block is loaded
 * and made unsigned once for all M x rows, each x block loaded once for all R
 * weight rows, and each product of two blocks scaled once by both scales. */
Q8_TARGET __attribute__((always_inline)) static inline void Q8_NAME(block)(float *y, int64_t ldy, const int8_t *xq,
                                                                           size_t xrb, const uint8_t *w, size_t rb,
                                                                           int64_t c, int64_t r, const int R,
                                                                           const int M) {
    __m256 acc[4][DSC_CPU_GEMV_MAX_ROWS];
    for (int k = 0; k < R; k++)
        for (int i = 0; i < M; i++)
            acc[k][i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < c / Q8_BLOCK; b++) {
        __m256i wq[4], aw[4];
        __m256 dw[4];
        for (int k = 0; k < R; k++) {
            const uint8_t *blk = w + (size_t)(r + k) * rb + b * Q8_BLOCK_BYTES;
            uint16_t dh;
            memcpy(&dh, blk, sizeof dh);
            dw[k] = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(dh)));
            wq[k] = _mm256_loadu_si256((const __m256i *)(blk + 2));
            aw[k] = _mm256_sign_epi8(wq[k], wq[k]); /* |w|, a u8 operand */
        }
        for (int i = 0; i < M; i++) {
            const int8_t *xi = xq + (size_t)i * xrb;
            __m256i xv = _mm256_loadu_si256((const __m256i *)(xi + b * Q8_BLOCK));
            float dxs;
            memcpy(&dxs, xi + c + b * (int64_t)sizeof(float), sizeof dxs);
            __m256 dx = _mm256_set1_ps(dxs);
            for (int k = 0; k < R; k++) {
                __m256i p = Q8_PROD(aw[k], _mm256_sign_epi8(xv, wq[k]));
                acc[k][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dw[k], dx), acc[k][i]);
            }
        }
    }
    for (int k = 0; k < R; k++)
        for (int i = 0; i < M; i++)
            y[i * ldy + r + k] = hsum8(acc[k][i]);
}

Q8_TARGET __attribute__((always_inline)) static inline void Q8_NAME(rows_m)(float *y, int64_t ldy,
                                                                            const int8_t *xq, const uint8_t *w,
                                                                            int64_t c, int64_t r0, int64_t r1,
                                                                            const int M) {
    const size_t rb = (size_t)(c / Q8_BLOCK) * Q8_BLOCK_BYTES, xrb = dsc_cpu_q8_act_row_bytes(c);
    const int R = M <= 2 ? Q8_R_FEW : Q8_R_MANY;
    int64_t r = r0;
    for (; r + R <= r1; r += R)
        Q8_NAME(block)(y, ldy, xq, xrb, w, rb, c, r, R, M);
    for (; r < r1; r++)
        Q8_NAME(block)(y, ldy, xq, xrb, w, rb, c, r, 1, M);
}

Q8_TARGET static void Q8_NAME(rows)(float *y, int64_t ldy, const void *xq, int64_t m, const void *w, int64_t c,
                                    int64_t r0, int64_t r1) {
    switch (m) {
    case 1:
        Q8_NAME(rows_m)(y, ldy, xq, w, c, r0, r1, 1);
        break;
    case 2:
        Q8_NAME(rows_m)(y, ldy, xq, w, c, r0, r1, 2);
        break;
    case 3:
        Q8_NAME(rows_m)(y, ldy, xq, w, c, r0, r1, 3);
        break;
    default:
        Q8_NAME(rows_m)(y, ldy, xq, w, c, r0, r1, 4);
        break;
    }
}
