/* Private to the CPU kernels (and the paged attention, which tiles the same
 * way): the loops that read narrow weights, the vector exponential, the row max, SwiGLU and GELU, each
 * in an AVX2 + FMA + F16C version and a portable scalar one. The choice is
 * made at run time (machines differ), once: dsc_cpu_simd() says which runs.
 * Not here: threading (the callers split rows between threads). */
#ifndef DSC_KERNELS_CPU_SIMD_H
#define DSC_KERNELS_CPU_SIMD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsc/kernels.h"

/* Most x rows one pass over a weight row serves (the register block). */
#define DSC_CPU_GEMV_MAX_ROWS 4
/* Up to this many x rows a linear layer streams its weight from memory
 * once, DSC_CPU_GEMV_MAX_ROWS x rows at a time against a few weight rows
 * that stay in cache (decode, and batched decode of many sequences); beyond
 * it, GEMM, whose packing of the weight costs as much as the multiply at
 * these sizes. */
#define DSC_CPU_STREAM_MAX_ROWS 32

/* Bytes of one weight row of c values (dsc_weight_row_bytes, which lives a layer above). */
static inline size_t dsc_cpu_row_bytes(dsc_weight_format f, int64_t c) {
    if (f == DSC_WEIGHT_Q8_0) return (size_t)(c / 32) * 34;
    return (size_t)c * (f == DSC_WEIGHT_F32 ? 4 : 2);
}

/* Whether the AVX2 paths run: the CPU has AVX2, FMA and F16C and
 * DSC_CPU_SIMD is not "scalar" (read once; the tests run every path). Where
 * the CPU also has AVX-512F and VL, the GEMV loops are the same 256-bit code
 * compiled for its 32 registers, with wider register blocks
 * (DSC_CPU_SIMD=avx2 keeps the 16-register ones). */
bool dsc_cpu_simd(void);
/* Whether the 512-bit GEMV loops run (AVX-512F and VL, DSC_CPU_SIMD unset or "avx512";
 * "avx512vl" keeps the 256-bit loops with 32 registers). */
bool dsc_cpu_simd_avx512(void);

/* y[i * ldy + r] = x[i] . W[r] for i < m (m <= DSC_CPU_GEMV_MAX_ROWS) and r in [r0, r1):
 * x (m, c) f32, W (OC, c) in `format` (rows of dsc_weight_row_bytes(format, c) bytes). */
void dsc_cpu_dot_rows(float *y, int64_t ldy, const float *x, int64_t m, const void *w, dsc_weight_format format,
                      int64_t c, int64_t r0, int64_t r1);
/* dst (r1 - r0, c) f32 = rows [r0, r1) of W widened. */
void dsc_cpu_widen_rows(float *dst, const void *w, dsc_weight_format format, int64_t c, int64_t r0, int64_t r1);
/* x[i] = exp(x[i] - shift) for i < n; returns their sum. */
float dsc_cpu_exp_shift_sum(float *x, int64_t n, float shift);
/* The largest of x[0 .. n) (NaNs skipped; -inf when n is 0 or all are NaN). */
float dsc_cpu_max(const float *x, int64_t n);
/* out[i] = gate[i] * sigmoid(gate[i]) * up[i] for i < n (out may be gate or up). */
void dsc_cpu_swiglu_rows(float *out, const float *gate, const float *up, int64_t n);
/* SwiGLU's backward for i < n: dup[i] = dout[i] silu(gate[i]), dgate[i] = dout[i] up[i] silu'(gate[i]). */
void dsc_cpu_swiglu_grad_rows(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                              int64_t n);
/* out[i] = gelu(x[i]), the tanh form 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), for i < n
 * (out may be x). */
void dsc_cpu_gelu_rows(float *out, const float *x, int64_t n);
/* dx[i] = dout[i] * gelu'(x[i]) for i < n (dx may be dout). */
void dsc_cpu_gelu_grad_rows(float *dx, const float *dout, const float *x, int64_t n);

#endif
