/* Which OpenBLAS kernels run the products (kernels/cpu/cpu_blas_core.c): the rule that replaces a core
 * below AVX2 on a CPU with AVX2 or more, and what the kernels' first use does in this process (run
 * by ctest with the machine's OPENBLAS_CORETYPE, and again with it set: test_blas_core_set). */
#include <cblas.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "dsc/kernels.h"
#include "kernels/cpu/cpu_blas_core.h"

static void test_rule(void **state) {
    (void)state;
    /* what Debian 12's OpenBLAS 0.3.21 chose on an Emerald Rapids (AVX-512 BF16) */
    assert_string_equal(dsc_cpu_blas_better_core("Prescott", DSC_BLAS_AVX512BF16), "Cooperlake");
    assert_string_equal(dsc_cpu_blas_better_core("Prescott", DSC_BLAS_AVX512), "SkylakeX");
    assert_string_equal(dsc_cpu_blas_better_core("Nehalem", DSC_BLAS_AVX2), "Haswell");
    assert_string_equal(dsc_cpu_blas_better_core("Sandybridge", DSC_BLAS_AVX2), "Haswell");
    /* deliberate choices stand: Zen on a Zen 4 (AVX-512), Haswell on an AVX2 CPU, any core below AVX2 */
    assert_null(dsc_cpu_blas_better_core("Zen", DSC_BLAS_AVX512BF16));
    assert_null(dsc_cpu_blas_better_core("haswell", DSC_BLAS_AVX2));
    assert_null(dsc_cpu_blas_better_core("SkylakeX", DSC_BLAS_AVX512BF16));
    assert_null(dsc_cpu_blas_better_core("Prescott", DSC_BLAS_AVX));
    assert_null(dsc_cpu_blas_better_core(NULL, DSC_BLAS_AVX512));
}

/* The kernels' first use leaves a core the user or the machine chose (OPENBLAS_CORETYPE set) as it
 * is, and otherwise runs none below AVX2 where the CPU has AVX2 and FMA. */
static void test_this_process(void **state) {
    (void)state;
    char before[32];
    snprintf(before, sizeof before, "%s", openblas_get_corename());
    dsc_kernels_get_num_threads(); /* the kernels' first use */
    const char *core = openblas_get_corename();
    printf("  OpenBLAS ran its %s kernels, now its %s (%s; OPENBLAS_CORETYPE %s)\n", before, core,
           openblas_get_config(), getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "unset");
    if (getenv("OPENBLAS_CORETYPE")) {
        assert_string_equal(core, before);
        return;
    }
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        assert_null(dsc_cpu_blas_better_core(core, DSC_BLAS_AVX2));
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rule),
        cmocka_unit_test(test_this_process),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
