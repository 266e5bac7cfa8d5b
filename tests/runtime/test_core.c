/* Runtime core: status messages, tensors and dtypes, allocator accounting,
 * and reproducible RNG streams. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dsc/memory.h"
#include "dsc/rng.h"
#include "dsc/tensor.h"
#include "test_mpi.h"

static void test_status_messages(void **state) {
    (void)state;
    assert_null(dsc_error_wrap(NULL, "nothing"));
    dsc_set_rank(3);
    dsc_status s = dsc_error(DSC_ERR_CONFIG, "key %s: expected %s", "optimizer.lr", "number");
    assert_int_equal(dsc_status_code(s), DSC_ERR_CONFIG);
    assert_string_equal(dsc_status_message(s), "rank 3: key optimizer.lr: expected number");
    s = dsc_error_wrap(s, "loading %s", "cfg.json");
    assert_string_equal(dsc_status_message(s), "rank 3: loading cfg.json: key optimizer.lr: expected number");
    assert_int_equal(dsc_status_code(s), DSC_ERR_CONFIG);
    dsc_status_free(s);
    dsc_set_rank(-1);
    s = dsc_error(DSC_ERR_IO, "x");
    assert_string_equal(dsc_status_message(s), "x");
    dsc_status_free(s);
    assert_string_equal(dsc_status_message(NULL), "ok");
}

static dsc_status propagate(int fail) {
    DSC_CHECK(!fail, DSC_ERR_INVALID, "failing on request %d", fail);
    return NULL;
}

static dsc_status outer(int fail) {
    DSC_TRY(propagate(fail));
    return NULL;
}

static void test_try_macros(void **state) {
    (void)state;
    assert_null(outer(0));
    assert_err(outer(7), DSC_ERR_INVALID, "failing on request 7");
}

static void test_dtypes_and_half_conversions(void **state) {
    (void)state;
    assert_int_equal(dsc_dtype_size(DSC_DTYPE_BF16), 2);
    assert_int_equal(dsc_dtype_size(DSC_DTYPE_I64), 8);
    dsc_dtype d;
    assert_ok(dsc_dtype_from_name("bf16", &d));
    assert_int_equal(d, DSC_DTYPE_BF16);
    assert_err(dsc_dtype_from_name("f64", &d), DSC_ERR_INVALID, "unknown dtype \"f64\"");
    /* Exactly representable values survive both half formats. */
    const float exact[] = {0.0f, 1.0f, -2.5f, 0.15625f, 65504.0f, 1024.0f};
    for (size_t i = 0; i < sizeof exact / sizeof exact[0]; i++) {
        assert_true(dsc_f16_to_f32(dsc_f32_to_f16(exact[i])) == exact[i]);
        if (exact[i] != 65504.0f) assert_true(dsc_bf16_to_f32(dsc_f32_to_bf16(exact[i])) == exact[i]);
    }
    assert_int_equal(dsc_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(dsc_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(dsc_f32_to_f16(1e6f), 0x7c00);     /* overflow is inf */
    assert_int_equal(dsc_f32_to_f16(5.96e-8f), 0x0001); /* smallest subnormal */
    assert_true(isnan(dsc_f16_to_f32(dsc_f32_to_f16(NAN))));
    /* Round to nearest even: 1 + 2^-11 is halfway between two f16 values. */
    assert_int_equal(dsc_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    assert_int_equal(dsc_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
    assert_int_equal(dsc_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
}

static void test_tensor_alloc_and_accounting(void **state) {
    (void)state;
    dsc_mem_stats before, during, after;
    dsc_mem_get_stats(&before);
    dsc_tensor t;
    int64_t shape[] = {4, 16};
    assert_ok(dsc_tensor_alloc(&t, DSC_DTYPE_F32, 2, shape, DSC_CPU, DSC_MEM_GRADS));
    assert_int_equal(dsc_tensor_numel(&t), 64);
    assert_int_equal(dsc_tensor_nbytes(&t), 256);
    for (int i = 0; i < 64; i++)
        assert_true(((float *)t.data)[i] == 0.0f);
    assert_int_equal((uintptr_t)t.data % DSC_MEM_ALIGN, 0);
    dsc_mem_get_stats(&during);
    assert_int_equal(during.current[DSC_MEM_GRADS] - before.current[DSC_MEM_GRADS], 256);
    assert_true(during.peak[DSC_MEM_GRADS] >= during.current[DSC_MEM_GRADS]);
    dsc_tensor_free(&t);
    assert_null(t.data);
    dsc_mem_get_stats(&after);
    assert_int_equal(after.current[DSC_MEM_GRADS], before.current[DSC_MEM_GRADS]);
    assert_int_equal(after.peak[DSC_MEM_GRADS], during.peak[DSC_MEM_GRADS]);
    dsc_mem_reset_peaks();
    dsc_mem_get_stats(&after);
    assert_int_equal(after.peak[DSC_MEM_GRADS], after.current[DSC_MEM_GRADS]);

    int64_t bad[] = {2, -1};
    assert_err(dsc_tensor_alloc(&t, DSC_DTYPE_F32, 2, bad, DSC_CPU, DSC_MEM_OTHER), DSC_ERR_INVALID,
               "dimension 1 is negative");
    dsc_device gpu = {DSC_DEVICE_CUDA, 7};
    dsc_status s = dsc_tensor_alloc(&t, DSC_DTYPE_F32, 2, shape, gpu, DSC_MEM_OTHER);
    assert_non_null(s);
    assert_non_null(strstr(dsc_status_message(s), "cuda:7"));
    dsc_status_free(s);
}

/* Sizes that wrap (issue 12, item 2: B = 2^52, T = 1024 made B*T*4 wrap to
 * 0) are errors, and an empty request never returns NULL as success. */
static void test_tensor_sizes_are_overflow_checked(void **state) {
    (void)state;
    dsc_tensor t;
    int64_t wraps[] = {4503599627370496LL, 1024};
    assert_err(dsc_tensor_alloc(&t, DSC_DTYPE_I32, 2, wraps, DSC_CPU, DSC_MEM_OTHER), DSC_ERR_INVALID,
               "tensor of shape (4503599627370496, 1024) i32: its size overflows");
    assert_null(t.data);
    int64_t numel_wraps[] = {INT64_MAX, 2};
    assert_err(dsc_tensor_alloc(&t, DSC_DTYPE_U8, 2, numel_wraps, DSC_CPU, DSC_MEM_OTHER), DSC_ERR_INVALID,
               "overflows");
    size_t bytes = 1;
    int64_t huge[] = {1LL << 40, 1LL << 40, 1LL << 40};
    assert_err(dsc_shape_nbytes(DSC_DTYPE_F32, 3, huge, &bytes), DSC_ERR_INVALID, "overflows");
    assert_int_equal(bytes, 0);
    dsc_tensor v = dsc_tensor_view(NULL, DSC_DTYPE_F32, 1, (int64_t[]){8}, DSC_CPU), r;
    assert_err(dsc_tensor_reshape(&v, 3, huge, &r), DSC_ERR_INVALID, "overflows");

    dsc_mem_stats before, after;
    dsc_mem_get_stats(&before);
    int64_t empty[] = {0, 1024};
    assert_ok(dsc_tensor_alloc(&t, DSC_DTYPE_F32, 2, empty, DSC_CPU, DSC_MEM_OTHER));
    assert_non_null(t.data);
    assert_int_equal(dsc_tensor_nbytes(&t), 0);
    dsc_tensor_free(&t);
    void *p;
    assert_ok(dsc_mem_alloc(&p, 0, DSC_MEM_OTHER, DSC_CPU));
    assert_non_null(p);
    dsc_mem_free(p, 0, DSC_MEM_OTHER, DSC_CPU);
    dsc_mem_get_stats(&after);
    assert_int_equal(after.current[DSC_MEM_OTHER], before.current[DSC_MEM_OTHER]);
}

/* Host allocations from DSC_MEM_HUGE_MIN bytes on start on a huge-page boundary (where the
 * kernel's transparent huge pages can back them), smaller ones on DSC_MEM_ALIGN; both zeroed,
 * both counted as asked. */
static void test_large_allocations_huge_page_aligned(void **state) {
    (void)state;
    const size_t sizes[] = {DSC_MEM_HUGE_MIN - 1, DSC_MEM_HUGE_MIN, DSC_MEM_HUGE_MIN + 12345};
    for (size_t k = 0; k < 3; k++) {
        dsc_mem_stats before, during;
        dsc_mem_get_stats(&before);
        unsigned char *p;
        assert_ok(dsc_mem_alloc((void **)&p, sizes[k], DSC_MEM_OTHER, DSC_CPU));
        dsc_mem_get_stats(&during);
        assert_int_equal(during.current[DSC_MEM_OTHER] - before.current[DSC_MEM_OTHER], (int64_t)sizes[k]);
        const size_t align = sizes[k] >= DSC_MEM_HUGE_MIN ? DSC_MEM_HUGE_PAGE : DSC_MEM_ALIGN;
        assert_int_equal((uintptr_t)p % align, 0);
        assert_int_equal(p[0], 0);
        assert_int_equal(p[sizes[k] - 1], 0);
        dsc_mem_free(p, sizes[k], DSC_MEM_OTHER, DSC_CPU);
    }
}

static void test_tensor_views_and_checks(void **state) {
    (void)state;
    float data[12];
    for (int i = 0; i < 12; i++)
        data[i] = (float)i;
    int64_t shape[] = {3, 4};
    dsc_tensor t = dsc_tensor_view(data, DSC_DTYPE_F32, 2, shape, DSC_CPU);
    dsc_tensor rows = dsc_tensor_rows(&t, 1, 2);
    assert_int_equal(rows.shape[0], 2);
    assert_true(((float *)rows.data)[0] == 4.0f);
    dsc_tensor r;
    int64_t flat[] = {12};
    assert_ok(dsc_tensor_reshape(&t, 1, flat, &r));
    int64_t wrong[] = {5};
    assert_err(dsc_tensor_reshape(&t, 1, wrong, &r), DSC_ERR_INVALID, "element counts differ");
    int64_t want[] = {-1, 4};
    assert_ok(dsc_tensor_expect(&t, "x", DSC_DTYPE_F32, 2, want));
    int64_t want2[] = {3, 5};
    assert_err(dsc_tensor_expect(&t, "attn.q", DSC_DTYPE_F32, 2, want2), DSC_ERR_INVALID,
               "attn.q: expected shape (3, 5) f32, got (3, 4) f32 cpu");
    uint16_t half[12];
    dsc_tensor h = dsc_tensor_view(half, DSC_DTYPE_BF16, 2, shape, DSC_CPU);
    assert_ok(dsc_tensor_copy(&h, &t));
    float back[12];
    dsc_tensor b = dsc_tensor_view(back, DSC_DTYPE_F32, 2, shape, DSC_CPU);
    assert_ok(dsc_tensor_copy(&b, &h));
    for (int i = 0; i < 12; i++)
        assert_true(back[i] == data[i]);
}

static void test_rng_streams(void **state) {
    (void)state;
    dsc_rng a, b, c;
    dsc_rng_init(&a, 42, 0, DSC_RNG_DATA);
    dsc_rng_init(&b, 42, 0, DSC_RNG_DATA);
    dsc_rng_init(&c, 42, 1, DSC_RNG_DATA);
    int same_ac = 0;
    for (int i = 0; i < 100; i++) {
        uint64_t x = dsc_rng_u64(&a);
        assert_true(x == dsc_rng_u64(&b));
        same_ac += x == dsc_rng_u64(&c);
    }
    assert_int_equal(same_ac, 0);
    double sum = 0, sq = 0;
    for (int i = 0; i < 20000; i++) {
        double u = dsc_rng_uniform(&a);
        assert_true(u >= 0 && u < 1);
        double n = dsc_rng_normal(&a);
        sum += n;
        sq += n * n;
        assert_true(dsc_rng_below(&a, 7) < 7);
    }
    assert_true(fabs(sum / 20000) < 0.05);
    assert_true(fabs(sq / 20000 - 1) < 0.05);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_messages),
        cmocka_unit_test(test_try_macros),
        cmocka_unit_test(test_dtypes_and_half_conversions),
        cmocka_unit_test(test_tensor_alloc_and_accounting),
        cmocka_unit_test(test_tensor_sizes_are_overflow_checked),
        cmocka_unit_test(test_large_allocations_huge_page_aligned),
        cmocka_unit_test(test_tensor_views_and_checks),
        cmocka_unit_test(test_rng_streams),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
