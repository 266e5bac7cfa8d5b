/* Private to the CPU kernels: the Q8_0 x Q8_0 dot products of decode, as
 * llama.cpp computes them. The rows of x are quantised once per linear
 * layer to blocks of 32 int8 with one scale each (llama.cpp's
 * quantize_row_q8_0: d = max|x| / 127, q = round(x / d), d kept as f16),
 * and each block of a weight row is an integer dot product scaled once by
 * both blocks' scales: AVX2 multiplies |w| by x with w's sign applied
 * (vpmaddubsw, vpmaddwd), AVX-512 VNNI in one vpdpbusd. The portable loops
 * are the reference; DSC_CPU_SIMD=scalar / avx2 force them or the AVX2 ones,
 * as for cpu_simd.h. Not here: threading (cpu_linear.c splits the rows). */
#ifndef DSC_KERNELS_CPU_Q8_DOT_H
#define DSC_KERNELS_CPU_Q8_DOT_H

#include <stddef.h>
#include <stdint.h>

/* A quantised x row of c values (c % 32 == 0): c int8, then c / 32 f32
 * scales (each the f32 value of the f16 scale llama.cpp stores). */
static inline size_t dsc_cpu_q8_act_row_bytes(int64_t c) {
    return (size_t)c + (size_t)(c / 32) * sizeof(float);
}

/* Most x rows one dsc_cpu_q8_dot_rows call serves in one pass over the weight rows where the
 * 512-bit VNNI loop runs (eight accumulators in registers; each weight block made unsigned and
 * its sign mask taken once for all of them); the other loops take them DSC_CPU_GEMV_MAX_ROWS at
 * a time. */
#define DSC_CPU_Q8_MAX_ROWS 8

/* Which loops dsc_cpu_q8_dot_rows runs here: "scalar", "avx2" or "avx512vnni". */
const char *dsc_cpu_q8_dot_level(void);

/* Rows [0, n) of x (n, c) f32 into dst, rows of dsc_cpu_q8_act_row_bytes(c). */
void dsc_cpu_q8_quantize_rows(void *dst, const float *x, int64_t n, int64_t c);

/* y[i * ldy + r] = xq[i] . W[r] for i < m (m <= DSC_CPU_Q8_MAX_ROWS) and r in [r0, r1): xq from
 * dsc_cpu_q8_quantize_rows (rows of dsc_cpu_q8_act_row_bytes(c) bytes), W (OC, c) Q8_0. */
void dsc_cpu_q8_dot_rows(float *y, int64_t ldy, const void *xq, int64_t m, const void *w, int64_t c, int64_t r0,
                         int64_t r1);
/* The same with the portable loops, whatever the CPU (the tests' reference). */
void dsc_cpu_q8_dot_rows_scalar(float *y, int64_t ldy, const void *xq, int64_t m, const void *w, int64_t c,
                                int64_t r0, int64_t r1);
/* dsc_cpu_q8_quantize_rows with the portable loops. */
void dsc_cpu_q8_quantize_rows_scalar(void *dst, const float *x, int64_t n, int64_t c);

#endif
