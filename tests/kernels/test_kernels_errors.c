/* Argument checking of the public kernel API: every error names the function
 * and the offending argument (or token position), and nothing is written
 * when an id is out of range. */
#include "dsc/memory.h"
#include "kernel_test_util.h"

static void test_bad_token_id_names_id_and_position(void **state) {
    (void)state;
    dsc_rng rng;
    dsc_rng_init(&rng, 20, 0, DSC_RNG_INIT);
    const int32_t ids[] = {1, 2, 0, 3, 70, 1};
    dsc_tensor tokens = kt_ints(ids, KT_SHAPE(2, 3)), wte = KT_RANDN(&rng, 1.0f, 5, 4);
    dsc_tensor out = KT_FULL(7.0f, 2, 3, 4), dwte = KT_FULL(0.0f, 5, 4);
    assert_err(dsc_kernel_embedding_forward(&out, &tokens, &wte, NULL), DSC_ERR_INVALID,
               "dsc_kernel_embedding_forward: token id 70 at position 4 is outside [0, 5)");
    assert_true(kt_f(&out)[0] == 7.0f); /* untouched */
    assert_err(dsc_kernel_embedding_backward(&dwte, NULL, &out, &tokens), DSC_ERR_INVALID,
               "token id 70 at position 4");
    ((int32_t *)tokens.data)[4] = -2;
    assert_err(dsc_kernel_embedding_forward(&out, &tokens, &wte, NULL), DSC_ERR_INVALID,
               "token id -2 at position 4");
    dsc_tensor_free(&tokens), dsc_tensor_free(&wte), dsc_tensor_free(&out), dsc_tensor_free(&dwte);
}

static void test_bad_target_id(void **state) {
    (void)state;
    const int32_t ids[] = {1, -1, 9};
    dsc_tensor targets = kt_ints(ids, KT_SHAPE(3)), logits = KT_FULL(0.0f, 3, 9), losses = KT_FULL(0.0f, 3);
    assert_err(dsc_kernel_cross_entropy_forward(&losses, &logits, &targets), DSC_ERR_INVALID,
               "dsc_kernel_cross_entropy_forward: target id 9 at position 2 is outside [0, 9)");
    assert_err(dsc_kernel_cross_entropy_backward(&logits, &logits, &targets, 1.0f), DSC_ERR_INVALID,
               "target id 9 at position 2");
    dsc_tensor_free(&targets), dsc_tensor_free(&logits), dsc_tensor_free(&losses);
}

static void test_shape_and_dtype_mismatches(void **state) {
    (void)state;
    dsc_tensor x = KT_FULL(1.0f, 4, 8), w = KT_FULL(1.0f, 3, 7), y = KT_FULL(0.0f, 4, 3), w8 = KT_FULL(1.0f, 7);
    assert_err(
        dsc_kernel_linear_forward(&y, &x, &w, NULL), DSC_ERR_INVALID,
        "dsc_kernel_linear_forward: x (4, 8) f32 cpu and y (4, 3) f32 cpu do not fit a linear map from 7 to 3");
    assert_err(dsc_kernel_gemm(&y, &x, &w, NULL, false, false, 1, 0), DSC_ERR_INVALID,
               "dsc_kernel_gemm argument b: expected shape (8, 7) f32, got (3, 7) f32 cpu");
    dsc_tensor mean = KT_FULL(0.0f, 4), rstd = KT_FULL(0.0f, 4), out = KT_FULL(0.0f, 4, 8);
    assert_err(dsc_kernel_layernorm_forward(&out, &mean, &rstd, &x, &w8, NULL, 1e-5f), DSC_ERR_INVALID,
               "dsc_kernel_layernorm_forward argument weight: expected shape (8) f32, got (7) f32 cpu");
    assert_err(dsc_kernel_gelu_forward(&y, &x), DSC_ERR_INVALID,
               "dsc_kernel_gelu_forward argument out: expected f32 with the shape of x (4, 8) f32 cpu");
    dsc_tensor q = KT_FULL(0.0f, 1, 2, 3, 4), k = KT_FULL(0.0f, 1, 2, 2, 4), lse = KT_FULL(0.0f, 1, 3, 2);
    dsc_tensor ao = KT_FULL(0.0f, 1, 2, 3, 4);
    assert_err(dsc_kernel_attention_forward(&ao, &lse, &q, &k, &k), DSC_ERR_INVALID,
               "dsc_kernel_attention_forward: 3 query heads are not a multiple of 2 key/value heads");
    dsc_tensor tokens_f32 = KT_FULL(0.0f, 1, 2), wte = KT_FULL(0.0f, 5, 4), eo = KT_FULL(0.0f, 1, 2, 4);
    assert_err(dsc_kernel_embedding_forward(&eo, &tokens_f32, &wte, NULL), DSC_ERR_INVALID,
               "dsc_kernel_embedding_forward argument tokens: expected shape (*, *) i32, got (1, 2) f32 cpu");
    assert_err(dsc_kernel_adamw(&x, &x, &x, &x, 1e-3f, 0.9f, 0.99f, 1e-8f, 0, 0), DSC_ERR_INVALID,
               "dsc_kernel_adamw: step 0 is not 1-based");
    assert_err(dsc_kernel_linear_forward(NULL, &x, &w, NULL), DSC_ERR_INVALID,
               "dsc_kernel_linear_forward: argument y is NULL");
    dsc_tensor_free(&x), dsc_tensor_free(&w), dsc_tensor_free(&y), dsc_tensor_free(&w8), dsc_tensor_free(&mean);
    dsc_tensor_free(&rstd), dsc_tensor_free(&out), dsc_tensor_free(&q), dsc_tensor_free(&k), dsc_tensor_free(&lse);
    dsc_tensor_free(&ao), dsc_tensor_free(&tokens_f32), dsc_tensor_free(&wte), dsc_tensor_free(&eo);
}

/* Tensors on two devices are refused before any backend runs (the pointer is never read). */
static void test_mixed_devices(void **state) {
    (void)state;
    dsc_tensor x = KT_FULL(1.0f, 4, 8);
    float fake;
    dsc_tensor on_gpu = dsc_tensor_view(&fake, DSC_DTYPE_F32, 2, x.shape, (dsc_device){DSC_DEVICE_CUDA, 0});
    assert_err(dsc_kernel_gelu_forward(&x, &on_gpu), DSC_ERR_INVALID,
               "dsc_kernel_gelu_forward: argument x is on cuda:0 but out is on cpu");
    /* All on a device this process cannot use: the backend lookup fails, named by the operation. */
    if (dsc_cuda_device_count() == 0)
        assert_err(dsc_kernel_gelu_forward(&on_gpu, &on_gpu), DSC_ERR_UNSUPPORTED,
                   "dsc_kernel_gelu_forward: device cuda:0 requested but");
    dsc_tensor_free(&x);
}

/* The CUDA id checks run on the device and report the first bad id by
 * position, as the CPU ones do; skipped without a GPU. */
static void test_cuda_bad_ids(void **state) {
    (void)state;
    if (dsc_cuda_device_count() == 0) skip();
    dsc_device gpu = {DSC_DEVICE_CUDA, 0};
    const int32_t ids[] = {4, 1, 4, 0, 4, 2, 5, 3}, targets[] = {4, -1, 5003, 2};
    dsc_tensor tok_h = kt_ints(ids, KT_SHAPE(2, 4)), tgt_h = kt_ints(targets, KT_SHAPE(4)), tok, tgt, wte, out;
    dsc_tensor logits, losses;
    assert_ok(dsc_tensor_alloc(&tok, DSC_DTYPE_I32, 2, tok_h.shape, gpu, DSC_MEM_OTHER));
    assert_ok(dsc_tensor_alloc(&tgt, DSC_DTYPE_I32, 1, tgt_h.shape, gpu, DSC_MEM_OTHER));
    assert_ok(dsc_tensor_copy(&tok, &tok_h)), assert_ok(dsc_tensor_copy(&tgt, &tgt_h));
    assert_ok(dsc_tensor_alloc(&wte, DSC_DTYPE_F32, KT_SHAPE(5, 8), gpu, DSC_MEM_OTHER));
    assert_ok(dsc_tensor_alloc(&out, DSC_DTYPE_F32, KT_SHAPE(2, 4, 8), gpu, DSC_MEM_OTHER));
    assert_ok(dsc_tensor_alloc(&logits, DSC_DTYPE_F32, KT_SHAPE(4, 5003), gpu, DSC_MEM_OTHER));
    assert_ok(dsc_tensor_alloc(&losses, DSC_DTYPE_F32, KT_SHAPE(4), gpu, DSC_MEM_OTHER));
    assert_err(dsc_kernel_embedding_forward(&out, &tok, &wte, NULL), DSC_ERR_INVALID,
               "token id 5 at position 6 is outside [0, 5)");
    assert_err(dsc_kernel_cross_entropy_forward(&losses, &logits, &tgt), DSC_ERR_INVALID,
               "target id 5003 at position 2");
    dsc_tensor_free(&tok_h), dsc_tensor_free(&tgt_h), dsc_tensor_free(&tok), dsc_tensor_free(&tgt);
    dsc_tensor_free(&wte), dsc_tensor_free(&out), dsc_tensor_free(&logits), dsc_tensor_free(&losses);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bad_token_id_names_id_and_position),
        cmocka_unit_test(test_bad_target_id),
        cmocka_unit_test(test_shape_and_dtype_mismatches),
        cmocka_unit_test(test_mixed_devices),
        cmocka_unit_test(test_cuda_bad_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
