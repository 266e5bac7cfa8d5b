/* OpenBLAS chooses its kernels once, as it loads: a DYNAMIC_ARCH build (Debian's) picks them by the
 * CPU's family and model, and a release older than the CPU does not know it. Debian 12's 0.3.21 gives
 * an Emerald Rapids (family 6, model 207) its Prescott kernels, SSE3: sgemm ran at 51 GFLOP/s on two
 * cores where the AVX-512 kernels the same library carries ran at 209-302, and prefill and training
 * are mostly sgemm. So before the first product, where OPENBLAS_CORETYPE is unset (a value the user
 * or the machine set is theirs) and the chosen core is below AVX2 on a CPU with AVX2 or more, OpenBLAS
 * is re-initialised with the core its own fallback for unknown CPUs names for the CPU's features,
 * through its start-up's entry points (gotoblas_dynamic_quit, then gotoblas_dynamic_init, which reads
 * OPENBLAS_CORETYPE as start-up does). A build without them (one target, or another BLAS) is left as
 * it is. */
#define _GNU_SOURCE
#include <cblas.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dsc/log.h"
#include "kernels/cpu/cpu_blas_core.h"

/* OpenBLAS's x86-64 core names by the vector level of their kernels; unlisted ones are below AVX. */
static const struct {
    const char *name;
    dsc_blas_level level;
} cores[] = {{"Sandybridge", DSC_BLAS_AVX},
             {"Bulldozer", DSC_BLAS_AVX},
             {"Piledriver", DSC_BLAS_AVX},
             {"Haswell", DSC_BLAS_AVX2},
             {"Zen", DSC_BLAS_AVX2},
             {"Steamroller", DSC_BLAS_AVX2},
             {"Excavator", DSC_BLAS_AVX2},
             {"SkylakeX", DSC_BLAS_AVX512},
             {"Cooperlake", DSC_BLAS_AVX512BF16},
             {"SapphireRapids", DSC_BLAS_AVX512BF16}};

static dsc_blas_level core_level(const char *name) {
    for (size_t i = 0; i < sizeof cores / sizeof cores[0]; i++)
        if (strcasecmp(name, cores[i].name) == 0) return cores[i].level;
    return DSC_BLAS_SSE;
}

const char *dsc_cpu_blas_better_core(const char *chosen, dsc_blas_level cpu) {
    if (!chosen || cpu < DSC_BLAS_AVX2 || core_level(chosen) >= DSC_BLAS_AVX2) return NULL;
    return cpu >= DSC_BLAS_AVX512BF16 ? "Cooperlake" : cpu >= DSC_BLAS_AVX512 ? "SkylakeX" : "Haswell";
}

static dsc_blas_level cpu_level(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
                  __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl");
    if (avx512) return __builtin_cpu_supports("avx512bf16") ? DSC_BLAS_AVX512BF16 : DSC_BLAS_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return DSC_BLAS_AVX2;
    return __builtin_cpu_supports("avx") ? DSC_BLAS_AVX : DSC_BLAS_SSE;
#else
    return DSC_BLAS_SSE; /* OpenBLAS's choice stands off x86-64 */
#endif
}

static void choose_core(void) {
    const char *better =
        getenv("OPENBLAS_CORETYPE") ? NULL : dsc_cpu_blas_better_core(openblas_get_corename(), cpu_level());
    void (*quit)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit");
    void (*init)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init");
    if (!better || !quit || !init) return;
    char was[32], version[32];
    snprintf(was, sizeof was, "%s", openblas_get_corename());
    snprintf(version, sizeof version, "%s", openblas_get_config()); /* "OpenBLAS 0.3.21 DYNAMIC_ARCH ..." */
    char *third = strchr(version, ' ');
    if (third) third = strchr(third + 1, ' ');
    if (third) *third = '\0';
    setenv("OPENBLAS_CORETYPE", better, 0);
    quit();
    init();
    unsetenv("OPENBLAS_CORETYPE"); /* this process's choice, not its children's */
    dsc_log_rank0(DSC_LOG_DEBUG,   /* every program's stderr would carry it; bench_kernels prints the core */
                  "%s chose its %s kernels for this CPU, which it does not know; running its %s kernels "
                  "instead (OPENBLAS_CORETYPE chooses)",
                  version, was, openblas_get_corename());
}

void dsc_cpu_blas_choose_core(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, choose_core);
}
