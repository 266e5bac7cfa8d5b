/* Private to the CPU kernels: prompt-sized products with bf16 weights on AVX-512 BF16, where the
 * CPU has it. The weights stay bf16 and are never widened; x is rounded to bf16 (nearest even,
 * torch's rounding) once per product, and vdpbf16ps multiplies pairs of bf16 into f32 sums at
 * twice the rate of f32 FMAs where it issues as often as an FMA (AMD's Zen 4). Used by dsc_cpu_linear_packed
 * (cpu_linear.c) for more rows than decode's streaming loops take, and by the f32 GEMM (cpu_gemm.c) for a thread
 * whose products are set to bf16 (mixed-precision training). */
#ifndef DSC_KERNELS_CPU_BF16_GEMM_H
#define DSC_KERNELS_CPU_BF16_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether this path runs: the CPU has AVX-512F, BW, VL and BF16, and DSC_CPU_SIMD is "avx512bf16",
 * or unset on a CPU where the dot outruns sgemm (AMD's; every other case keeps the widening panels,
 * which leave x in f32, and sgemm over rounded copies for bf16 products). */
bool dsc_cpu_bf16_gemm_available(void);

#if defined(__x86_64__) /* the kernels; elsewhere the path is never available */
/* Bytes of x (n, c) rounded to bf16 with each row padded to an even length: n * 2 * even(c). */
size_t dsc_cpu_bf16_x_bytes(int64_t n, int64_t c);
/* xb (n, even(c)) = x (n, c) rounded to bf16, a zero after an odd row; the padding rows zero. */
void dsc_cpu_bf16_round_x(uint16_t *xb, const float *x, int64_t n, int64_t c);
/* The same in parts, for any layout of x (element (i, j) at x[i * rs + j * cs]): the padding rows
 * zeroed, then rows [i0, i1) rounded (parts of the rows may run on different threads). */
void dsc_cpu_bf16_pad_x(uint16_t *xb, int64_t n, int64_t c);
void dsc_cpu_bf16_round_x_rows(uint16_t *xb, const float *x, int64_t rs, int64_t cs, int64_t c, int64_t i0,
                               int64_t i1);

/* Bytes of the packing buffer one panel of `rows` weight rows of c columns needs. */
size_t dsc_cpu_bf16_pack_bytes(int64_t rows, int64_t c);
/* y[i * ldy + r] = xb[i] . W[r] for i < n and r in [r0, r0 + rows): xb from dsc_cpu_bf16_round_x,
 * W (OC, c) bf16 rows of c values; `pack` holds dsc_cpu_bf16_pack_bytes(rows, c) bytes (64-byte
 * aligned is fastest; any alignment works). */
void dsc_cpu_bf16_gemm_panel(float *y, int64_t ldy, const uint16_t *xb, int64_t n, const uint16_t *w, int64_t c,
                             int64_t r0, int64_t rows, uint32_t *pack);
/* Products of f32 operands rounded to bf16 (dsc_kernels_set_matmul_dtype), in two steps. First
 * rows [r0, r0 + rows) of W (rows at most 64), f32 with element (r, k) at w[r * rs + k * ks],
 * rounded as they are packed into `pack` (dsc_cpu_bf16_pack_bytes(64, c) bytes); then
 * y[i * ldy + r] = alpha * xb[i] . W[r] (+ the y there when `add`) for i < n and those rows. */
void dsc_cpu_bf16_pack_f32(uint32_t *pack, const float *w, int64_t rs, int64_t ks, int64_t c, int64_t r0,
                           int64_t rows);
void dsc_cpu_bf16_multiply(float *y, int64_t ldy, const uint16_t *xb, int64_t n, const uint32_t *pack, int64_t c,
                           int64_t r0, int64_t rows, float alpha, bool add);

#endif

#endif
