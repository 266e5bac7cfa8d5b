/* Private to the CPU kernels: prompt-sized products with Q8_0 weights on AVX-512 VNNI, where the
 * CPU has it. x is quantised to Q8_0 once per product by the rule decode uses (cpu_q8_dot.h:
 * llama.cpp's quantize_row_q8_0), so a prompt and a decode step multiply the same integers, and
 * each block of 32 columns is an integer dot product (vpdpbusd) scaled once by both blocks'
 * scales. Used by dsc_cpu_linear_packed (cpu_linear.c) for more rows than decode streams. */
#ifndef DSC_KERNELS_CPU_Q8_GEMM_H
#define DSC_KERNELS_CPU_Q8_GEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether this path runs: the Q8_0 dot runs its AVX-512 VNNI loops (dsc_cpu_q8_dot_level). */
bool dsc_cpu_q8_gemm_available(void);

#if defined(__x86_64__) /* the kernels; elsewhere the path is never available */
/* Bytes of x (n, c) as this path takes it: rows of dsc_cpu_q8_act_row_bytes(c), padded to whole tiles. */
size_t dsc_cpu_q8_gemm_x_bytes(int64_t n, int64_t c);
/* xu = x (n, c; c % 32 == 0) quantised as dsc_cpu_q8_quantize_rows, each int8 then offset by 128
 * (the unsigned operand of vpdpbusd; the packed weights carry the correction); the padding zero. */
void dsc_cpu_q8_gemm_prepare_x(void *xu, const float *x, int64_t n, int64_t c);

/* Bytes of the packing buffer one panel of `rows` Q8_0 weight rows of c columns needs. */
size_t dsc_cpu_q8_gemm_pack_bytes(int64_t rows, int64_t c);
/* y[i * ldy + r] = x[i] . W[r] for i < n and r in [r0, r0 + rows): xu from
 * dsc_cpu_q8_gemm_prepare_x, W (OC, c) Q8_0; `pack` holds dsc_cpu_q8_gemm_pack_bytes(rows, c)
 * bytes. */
void dsc_cpu_q8_gemm_panel(float *y, int64_t ldy, const void *xu, int64_t n, const void *w, int64_t c, int64_t r0,
                           int64_t rows, void *pack);

#endif

#endif
