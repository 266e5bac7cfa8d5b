/* dsc_kernels_set_progress: the callback runs once at the start of every
 * kernel call on the thread that installed it, never on another thread,
 * not re-entered by kernels it calls itself, and not after it is removed. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "dsc/kernels.h"

typedef struct hook_state {
    int calls;
    int depth, max_depth;
    dsc_tensor *a, *b; /* the callback adds them, itself a kernel call */
} hook_state;

static void hook(void *arg) {
    hook_state *h = arg;
    h->calls++;
    if (++h->depth > h->max_depth) h->max_depth = h->depth;
    assert_null(dsc_kernel_add(h->a, h->a, h->b));
    h->depth--;
}

static dsc_tensor make(float value) {
    dsc_tensor t;
    assert_null(dsc_tensor_alloc(&t, DSC_DTYPE_F32, 1, (int64_t[]){4}, DSC_CPU, DSC_MEM_OTHER));
    for (int i = 0; i < 4; i++)
        ((float *)t.data)[i] = value;
    return t;
}

static void *other_thread(void *arg) {
    dsc_tensor *t = arg;
    dsc_status s = dsc_kernel_add(&t[0], &t[0], &t[1]); /* the main thread's hook must not run here */
    return s ? (void *)1 : NULL;
}

static void test_progress_hook(void **state) {
    (void)state;
    dsc_tensor a = make(0.0f), b = make(1.0f), x = make(2.0f), y = make(3.0f);
    hook_state h = {.a = &a, .b = &b};
    dsc_kernels_set_progress(hook, &h);
    for (int i = 0; i < 3; i++)
        assert_null(dsc_kernel_add(&x, &x, &y));
    assert_int_equal(h.calls, 3);
    assert_int_equal(h.max_depth, 1); /* its own dsc_kernel_add did not call it again */
    assert_true(((float *)a.data)[0] == 3.0f);
    assert_true(((float *)x.data)[0] == 11.0f);

    pthread_t th;
    dsc_tensor pair[2] = {x, y};
    assert_int_equal(pthread_create(&th, NULL, other_thread, pair), 0);
    void *rc;
    assert_int_equal(pthread_join(th, &rc), 0);
    assert_null(rc);
    assert_int_equal(h.calls, 3);

    dsc_kernels_set_progress(NULL, NULL);
    assert_null(dsc_kernel_add(&x, &x, &y));
    assert_int_equal(h.calls, 3);
    dsc_tensor_free(&a);
    dsc_tensor_free(&b);
    dsc_tensor_free(&x);
    dsc_tensor_free(&y);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_progress_hook)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
