/* The Q8_0 x Q8_0 loops of cpu_q8_dot.c, included once per instruction set
 * (no include guard): the includer defines Q8_NAME(s) (the functions'
 * names), Q8_TARGET (their target attribute) and Q8_PROD(aw, sx) (eight
 * int32 sums of four |w| * sign-applied x byte products each). */

/* One weight row against M x rows, M a constant once inlined: M f32
 * accumulators in registers; per block of 32 the weight block is loaded and
 * made unsigned once for all M x rows, and each product of two blocks is
 * scaled once by both scales. One weight row at a time, not a few: the
 * hardware prefetcher follows one sequential stream of weight bytes, and
 * several rows read side by side (816 bytes apart at C 768) ran at a third of
 * the read rate out of cache (the loops are far from their compute limit);
 * the stream is prefetched Q8_PREFETCH_BYTES ahead (past the row's end into
 * the next row's: a prefetch never faults). */
Q8_TARGET __attribute__((always_inline)) static inline void
Q8_NAME(row)(float *y, int64_t ldy, const int8_t *xq, size_t xrb, const uint8_t *row, int64_t c, const int M) {
    __m256 acc[DSC_CPU_GEMV_MAX_ROWS];
    for (int i = 0; i < M; i++)
        acc[i] = _mm256_setzero_ps();
    for (int64_t b = 0; b < c / Q8_BLOCK; b++) {
        const uint8_t *blk = row + b * Q8_BLOCK_BYTES;
        if ((b & 1) == 0)
            _mm_prefetch((const char *)blk + Q8_PREFETCH_BYTES, _MM_HINT_T0); /* ~a line per 2 blocks */
        uint16_t dh;
        memcpy(&dh, blk, sizeof dh);
        __m256 dw = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(dh)));
        __m256i wq = _mm256_loadu_si256((const __m256i *)(blk + 2));
        __m256i aw = _mm256_sign_epi8(wq, wq); /* |w|, a u8 operand */
        for (int i = 0; i < M; i++) {
            const int8_t *xi = xq + (size_t)i * xrb;
            __m256i sx = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(xi + b * Q8_BLOCK)), wq);
            float dx;
            memcpy(&dx, xi + c + b * (int64_t)sizeof(float), sizeof dx);
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Q8_PROD(aw, sx)), _mm256_mul_ps(dw, _mm256_set1_ps(dx)),
                                     acc[i]);
        }
    }
    for (int i = 0; i < M; i++)
        y[i * ldy] = hsum8(acc[i]);
}

Q8_TARGET __attribute__((always_inline)) static inline void Q8_NAME(rows_m)(float *y, int64_t ldy,
                                                                            const int8_t *xq, const uint8_t *w,
                                                                            int64_t c, int64_t r0, int64_t r1,
                                                                            const int M) {
    const size_t rb = (size_t)(c / Q8_BLOCK) * Q8_BLOCK_BYTES, xrb = dsc_cpu_q8_act_row_bytes(c);
    for (int64_t r = r0; r < r1; r++)
        Q8_NAME(row)(y + r, ldy, xq, xrb, w + (size_t)r * rb, c, M);
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
