/* Private to the CPU kernels: one GEMM's arguments, and its two ways, f32 (cpu_gemm.c) and bf16 /
 * fp16 products (cpu_gemm_rounded.c, for a thread that asked for them with
 * dsc_kernels_set_matmul_dtype). */
#ifndef DSC_KERNELS_CPU_GEMM_H
#define DSC_KERNELS_CPU_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "dsc/kernels.h"

/* Multiply-adds below which one thread does the whole product. */
#define DSC_CPU_GEMM_SPLIT_MIN_WORK (1 << 18)

/* o (m, n) = alpha op(a) op(b) + beta o (+ bias), a (m, k) or (k, m) when ta, b (k, n) or (n, k)
 * when tb; act, when not NULL, gets gelu(o) after the bias. */
typedef struct gemm_args {
    float *o;
    float *act; /* gelu(o) after the bias, out of the same block while it is in cache; NULL: none */
    /* With act: the type o is rounded to after the bias and before its GELU (a bf16 / fp16
     * linear's output, which the GELU and its backward then read); f32 (0): as summed. */
    dsc_dtype act_input;
    const float *a, *b, *bias;
    int64_t m, n, k;
    /* The row strides of a, b and o (and act) as stored; 0: packed (k or m, n or k, n). A panel
     * of a larger product (cpu_gemm_rounded.c) keeps the whole product's strides. */
    int64_t lda, ldb, ldo;
    /* How a and o are stored: f32 (0), or the products' 2-byte type, whose bits the array holds
     * (a is read widened, exactly the values rounding it would give; each element of o is rounded
     * once from its f32 sum). Only dsc_cpu_gemm_rounded (o: with beta 0 and no GELU) and, for a,
     * dsc_cpu_gemm_add_rounded take them; strides and offsets count elements either way. */
    dsc_dtype a_type, o_type;
    bool ta, tb;
    float alpha, beta;
} gemm_args;

static inline int64_t dsc_cpu_gemm_lda(const gemm_args *g) {
    return g->lda ? g->lda : g->ta ? g->m : g->k;
}
static inline int64_t dsc_cpu_gemm_ldb(const gemm_args *g) {
    return g->ldb ? g->ldb : g->tb ? g->k : g->n;
}
static inline int64_t dsc_cpu_gemm_ldo(const gemm_args *g) {
    return g->ldo ? g->ldo : g->n;
}

/* The bias (g->bias: columns from c0) and the GELU (into act_row, NULL: none) of n values of one
 * row of o, rounded to g->act_input before the GELU: every product's epilogue. */
void dsc_cpu_gemm_epilogue_row(const gemm_args *g, float *row, float *act_row, int64_t c0, int64_t n);
/* In f32: sgemm over blocks of the threads, or streaming b for a few rows. */
void dsc_cpu_gemm_f32(const gemm_args *g);
/* In bf16 or fp16 products (`dtype`; m, n, k > 0), or in f32 ones for a 2-byte a or o (a_type,
 * o_type); fails only without memory for rounded copies. */
dsc_status dsc_cpu_gemm_rounded(const gemm_args *g, dsc_dtype dtype);
/* o += round(alpha op(a) op(b)) with beta 1 and no bias or GELU: the products in `products` (f32, or
 * operands rounded to bf16 / fp16), summed in f32, each tile's sums rounded to `sum` before they
 * are added (dsc_kernels_set_grad_dtype); fails only without memory. */
dsc_status dsc_cpu_gemm_add_rounded(const gemm_args *g, dsc_dtype products, dsc_dtype sum);
/* Operands of more values than this (default 2^22; values <= 0 restore it) are rounded in panels
 * rather than whole by the two above: for the tests, which reach the panels with small products. */
void dsc_cpu_gemm_rounded_set_whole_max(int64_t values);

/* A buffer a thread keeps between kernel calls (declare it _Thread_local): grown to the largest
 * size asked for, never shrunk, counted as DSC_MEM_OTHER. A fresh allocation of megabytes is a
 * fresh mapping, and faulting its pages in took as long as the products that used it. */
typedef struct dsc_cpu_kept {
    void *p;
    size_t bytes;
} dsc_cpu_kept;
/* At least `bytes` of `s`, 64-byte aligned; NULL without memory. */
void *dsc_cpu_kept_at_least(dsc_cpu_kept *s, size_t bytes);
/* v[0 .. n) rounded to `dtype` (bf16 / fp16) and widened back into `s`, over the kernels' threads;
 * NULL without memory. */
float *dsc_cpu_rounded_copy(dsc_cpu_kept *s, const float *v, int64_t n, dsc_dtype dtype);

#endif
