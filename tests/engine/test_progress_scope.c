/* dsc_optimizer_progress_begin / take / end: between begin and end every kernel call first runs
 * the optimizer's progress; its first failure is kept (later calls are skipped), handed out by
 * take named after the layer (nothing from a NULL scope), reported by end when the work itself
 * succeeded and dropped when it failed; after end no kernel call runs it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "dsc/kernels.h"
#include "dsc/optimizer.h"

static int calls, fail_from = 1000;

static dsc_status fake_progress(dsc_optimizer *opt) {
    (void)opt;
    return ++calls >= fail_from ? dsc_error(DSC_ERR_COMM, "bucket 3 failed at call %d", calls) : NULL;
}

static const dsc_optimizer_ops fake_ops = {.name = "fake", .progress = fake_progress};

static void kernel_call(dsc_tensor *x) {
    assert_null(dsc_kernel_scale(x, 1.0f));
}

static void test_progress_scope(void **state) {
    (void)state;
    dsc_optimizer opt = {.ops = &fake_ops};
    float v[4] = {1, 2, 3, 4};
    dsc_tensor x = dsc_tensor_view(v, DSC_DTYPE_F32, 1, (int64_t[]){4}, DSC_CPU);
    dsc_optimizer_progress_scope scope;

    calls = 0, fail_from = 1000;
    dsc_optimizer_progress_begin(&scope, &opt);
    kernel_call(&x), kernel_call(&x), kernel_call(&x);
    assert_int_equal(calls, 3);
    assert_null(dsc_optimizer_progress_take(&scope, "layers.0"));
    assert_null(dsc_optimizer_progress_end(&scope, NULL));
    kernel_call(&x);
    assert_int_equal(calls, 3); /* removed */

    /* The second call fails: kept, later calls skipped, handed out once by take. */
    calls = 0, fail_from = 2;
    dsc_optimizer_progress_begin(&scope, &opt);
    kernel_call(&x), kernel_call(&x), kernel_call(&x);
    assert_int_equal(calls, 2);
    assert_null(dsc_optimizer_progress_take(NULL, "layers.1")); /* not the batch's last backward */
    dsc_status e = dsc_optimizer_progress_take(&scope, "layers.1");
    assert_non_null(e);
    assert_non_null(strstr(dsc_status_message(e), "bucket 3 failed at call 2"));
    assert_non_null(strstr(dsc_status_message(e), "in the backward of layers.1"));
    dsc_status_free(e);
    assert_null(dsc_optimizer_progress_take(&scope, "layers.1"));
    kernel_call(&x); /* runs again once the failure is taken: and fails again */
    assert_int_equal(calls, 3);
    /* end with the work succeeded reports the kept failure ... */
    e = dsc_optimizer_progress_end(&scope, NULL);
    assert_non_null(e);
    assert_non_null(strstr(dsc_status_message(e), "progressing gradient reductions"));
    assert_non_null(strstr(dsc_status_message(e), "bucket 3 failed at call 3"));
    dsc_status_free(e);

    /* ... and with the work failed returns the work's failure, dropping the kept one. */
    calls = 0, fail_from = 1;
    dsc_optimizer_progress_begin(&scope, &opt);
    kernel_call(&x);
    e = dsc_optimizer_progress_end(&scope, dsc_error(DSC_ERR_INVALID, "layer 2 backward failed"));
    assert_non_null(e);
    assert_string_equal(dsc_status_message(e), "layer 2 backward failed");
    dsc_status_free(e);
    kernel_call(&x);
    assert_int_equal(calls, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_progress_scope)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
