/* Private to the CPU kernels: which OpenBLAS kernels run the products (cpu_blas_core.c). */
#ifndef DSC_KERNELS_CPU_BLAS_CORE_H
#define DSC_KERNELS_CPU_BLAS_CORE_H

/* The vector level of a CPU or of an OpenBLAS core's kernels. */
typedef enum dsc_blas_level {
    DSC_BLAS_SSE = 0,
    DSC_BLAS_AVX,
    DSC_BLAS_AVX2,   /* with FMA */
    DSC_BLAS_AVX512, /* F, CD, BW, DQ, VL */
    DSC_BLAS_AVX512BF16
} dsc_blas_level;

/* The core OpenBLAS should run instead of `chosen` on a CPU of level `cpu`, or NULL to keep it: only a
 * core below AVX2 on a CPU with AVX2 or more (what an OpenBLAS older than the CPU falls back to), and
 * then the core OpenBLAS's own fallback names for the CPU's features. */
const char *dsc_cpu_blas_better_core(const char *chosen, dsc_blas_level cpu);

/* Once per process, before the first product: where OPENBLAS_CORETYPE is unset and
 * dsc_cpu_blas_better_core names a core, OpenBLAS is re-initialised with it. */
void dsc_cpu_blas_choose_core(void);

#endif
