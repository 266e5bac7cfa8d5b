/* CPU kernels around the model body: embeddings (with and without position
 * table, repeated ids, threaded scatter-add), fused cross-entropy (ignored
 * targets, in-place backward), AdamW and SGD against torch.optim's update
 * rules written in double, and the flat-vector reductions and helpers. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernel_test_util.h"
#include "ref_kernels.h"

static void check_embedding(bool with_wpe, int threads) {
    dsc_rng rng;
    dsc_rng_init(&rng, 11, 0, DSC_RNG_INIT);
    int saved = dsc_kernels_get_num_threads();
    dsc_kernels_set_num_threads(threads);
    /* C large enough that 3 threads split the work; ids repeat within and across rows. */
    int64_t b = 2, t = 3, v = 5, c = 6000, tmax = 4;
    const int32_t ids[] = {4, 1, 4, 0, 4, 2};
    dsc_tensor tokens = kt_ints(ids, KT_SHAPE(b, t));
    dsc_tensor wte = KT_RANDN(&rng, 1.0f, v, c), wpe = KT_RANDN(&rng, 1.0f, tmax, c), out = KT_FULL(0.0f, b, t, c);
    double *wted = kt_to_double(&wte), *wped = kt_to_double(&wpe), *want = kt_zeros_d(b * t * c);
    ref_embedding(want, ids, wted, with_wpe ? wped : NULL, b * t, t, c);
    assert_ok(dsc_kernel_embedding_forward(&out, &tokens, &wte, with_wpe ? &wpe : NULL));
    KT_ASSERT_CLOSE(kt_f(&out), want, b * t * c, 1e-6,
                    with_wpe ? "embedding forward (wte + wpe)" : "embedding forward");
    /* Backward: the gradient of sum(out * r) is a scatter-add of r, on top of what dwte held. */
    dsc_tensor r = KT_RANDN(&rng, 1.0f, b, t, c), dwte = KT_FULL(0.5f, v, c), dwpe = KT_FULL(0.5f, tmax, c);
    double *gte = kt_zeros_d(v * c), *gpe = kt_zeros_d(tmax * c);
    for (int64_t i = 0; i < v * c; i++)
        gte[i] = 0.5;
    for (int64_t i = 0; i < tmax * c; i++)
        gpe[i] = 0.5;
    for (int64_t i = 0; i < b * t; i++)
        for (int64_t j = 0; j < c; j++) {
            gte[ids[i] * c + j] += kt_f(&r)[i * c + j];
            gpe[(i % t) * c + j] += kt_f(&r)[i * c + j];
        }
    assert_ok(dsc_kernel_embedding_backward(&dwte, with_wpe ? &dwpe : NULL, &r, &tokens));
    KT_ASSERT_CLOSE(kt_f(&dwte), gte, v * c, 1e-6, "embedding dwte (accumulated)");
    if (with_wpe) KT_ASSERT_CLOSE(kt_f(&dwpe), gpe, tmax * c, 1e-6, "embedding dwpe (accumulated)");
    dsc_kernels_set_num_threads(saved);
    free(wted), free(wped), free(want), free(gte), free(gpe);
    dsc_tensor_free(&tokens), dsc_tensor_free(&wte), dsc_tensor_free(&wpe), dsc_tensor_free(&out);
    dsc_tensor_free(&r), dsc_tensor_free(&dwte), dsc_tensor_free(&dwpe);
}

static void test_embedding(void **state) {
    (void)state;
    check_embedding(true, 1);
    check_embedding(false, 1);
    check_embedding(true, 3);
}

typedef struct ce_ctx {
    double *logits, *losses; /* (N, V), (N) */
    const int32_t *targets;
    int64_t n, v;
    double dloss;
} ce_ctx;

static double ce_loss(void *p) {
    ce_ctx *C = p;
    ref_cross_entropy(C->losses, C->logits, C->targets, C->n, C->v);
    double s = 0;
    for (int64_t i = 0; i < C->n; i++)
        s += C->losses[i];
    return s * C->dloss;
}

static void test_cross_entropy(void **state) {
    (void)state;
    dsc_rng rng;
    dsc_rng_init(&rng, 12, 0, DSC_RNG_INIT);
    int64_t n = 5, v = 11;
    const int32_t ids[] = {3, -1, 10, 0, -100}; /* two ignored rows */
    dsc_tensor targets = kt_ints(ids, KT_SHAPE(n));
    dsc_tensor logits = KT_RANDN(&rng, 3.0f, n, v), losses = KT_FULL(7.0f, n), dlogits = KT_FULL(7.0f, n, v);
    ce_ctx C = {kt_to_double(&logits), kt_zeros_d(n), ids, n, v, 0.25};
    ce_loss(&C);
    assert_ok(dsc_kernel_cross_entropy_forward(&losses, &logits, &targets));
    KT_ASSERT_CLOSE(kt_f(&losses), C.losses, n, 1e-6, "cross-entropy losses");
    assert_true(kt_f(&losses)[1] == 0.0f && kt_f(&losses)[4] == 0.0f);
    assert_ok(dsc_kernel_cross_entropy_backward(&dlogits, &logits, &targets, 0.25f));
    KT_ASSERT_GRAD(ce_loss, &C, C.logits, n * v, kt_f(&dlogits), "cross-entropy dlogits");
    /* In place: dlogits overwrites logits and gives the same gradient. */
    assert_ok(dsc_kernel_cross_entropy_backward(&logits, &logits, &targets, 0.25f));
    assert_memory_equal(logits.data, dlogits.data, dsc_tensor_nbytes(&logits));
    free(C.logits), free(C.losses);
    dsc_tensor_free(&targets), dsc_tensor_free(&logits), dsc_tensor_free(&losses), dsc_tensor_free(&dlogits);
}

static void test_adamw_matches_torch_rule(void **state) {
    (void)state;
    dsc_rng rng;
    dsc_rng_init(&rng, 13, 0, DSC_RNG_INIT);
    int64_t n = 37;
    dsc_tensor p = KT_RANDN(&rng, 1.0f, n), m = KT_FULL(0.0f, n), v = KT_FULL(0.0f, n);
    double *pd = kt_to_double(&p), *md = kt_zeros_d(n), *vd = kt_zeros_d(n);
    for (int64_t step = 1; step <= 5; step++) {
        dsc_tensor g = KT_RANDN(&rng, 0.1f, n);
        double *gd = kt_to_double(&g);
        assert_ok(dsc_kernel_adamw(&p, &g, &m, &v, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step));
        ref_adamw(pd, gd, md, vd, n, 1e-2, 0.9f, 0.95f, 1e-8, 0.1, step);
        free(gd);
        dsc_tensor_free(&g);
    }
    KT_ASSERT_CLOSE(kt_f(&p), pd, n, 1e-5, "adamw params after 5 steps");
    KT_ASSERT_CLOSE(kt_f(&m), md, n, 1e-5, "adamw exp_avg");
    KT_ASSERT_CLOSE(kt_f(&v), vd, n, 1e-5, "adamw exp_avg_sq");
    free(pd), free(md), free(vd);
    dsc_tensor_free(&p), dsc_tensor_free(&m), dsc_tensor_free(&v);
}

static void check_sgd(float momentum, float wd) {
    dsc_rng rng;
    dsc_rng_init(&rng, 14, 0, DSC_RNG_INIT);
    int64_t n = 29;
    dsc_tensor p = KT_RANDN(&rng, 1.0f, n), buf = KT_FULL(123.0f, n); /* step 1 ignores the old buffer */
    double *pd = kt_to_double(&p), *bufd = kt_zeros_d(n);
    for (int64_t step = 1; step <= 4; step++) {
        dsc_tensor g = KT_RANDN(&rng, 1.0f, n);
        double *gd = kt_to_double(&g);
        assert_ok(dsc_kernel_sgd(&p, &g, momentum != 0 ? &buf : NULL, 0.1f, momentum, wd, step));
        ref_sgd(pd, gd, bufd, n, 0.1, momentum, wd, step);
        free(gd);
        dsc_tensor_free(&g);
    }
    char what[64];
    snprintf(what, sizeof what, "sgd momentum=%g wd=%g", (double)momentum, (double)wd);
    KT_ASSERT_CLOSE(kt_f(&p), pd, n, 1e-5, what);
    free(pd), free(bufd);
    dsc_tensor_free(&p), dsc_tensor_free(&buf);
}

static void test_sgd_matches_torch_rule(void **state) {
    (void)state;
    check_sgd(0.0f, 0.0f);
    check_sgd(0.9f, 0.0f);
    check_sgd(0.9f, 0.01f);
}

static void test_reductions_and_helpers(void **state) {
    (void)state;
    int64_t n = 100003; /* odd, and large enough to run threaded */
    dsc_tensor x = KT_FULL(0.0f, n), y = KT_FULL(1.0f, n), out = KT_FULL(5.0f, n);
    double want_sum = 0, want_sq = 0;
    for (int64_t i = 0; i < n; i++) {
        kt_f(&x)[i] = (float)((i % 7) - 3) * 0.5f;
        want_sum += kt_f(&x)[i];
        want_sq += (double)kt_f(&x)[i] * kt_f(&x)[i];
    }
    int saved = dsc_kernels_get_num_threads();
    dsc_kernels_set_num_threads(3);
    double sum, sq;
    bool finite;
    assert_ok(dsc_kernel_sum(&sum, &x));
    assert_ok(dsc_kernel_sum_squares(&sq, &x));
    assert_true(fabs(sum - want_sum) < 1e-9 && fabs(sq - want_sq) < 1e-9);
    assert_ok(dsc_kernel_axpy(&y, 2.0f, &x)); /* y = 1 + 2x */
    assert_ok(dsc_kernel_add(&out, &y, &x));  /* out = 1 + 3x */
    assert_ok(dsc_kernel_scale(&out, 0.5f));  /* out = 0.5 + 1.5x */
    for (int64_t i = 0; i < n; i += 997)
        assert_true(kt_f(&out)[i] == 0.5f + 1.5f * kt_f(&x)[i]);
    assert_ok(dsc_kernel_all_finite(&finite, &out));
    assert_true(finite);
    kt_f(&out)[n - 1] = INFINITY;
    assert_ok(dsc_kernel_all_finite(&finite, &out));
    assert_false(finite);
    kt_f(&out)[n - 1] = 0, kt_f(&out)[7] = NAN;
    assert_ok(dsc_kernel_all_finite(&finite, &out));
    assert_false(finite);
    assert_ok(dsc_kernel_zero(&out)); /* zero clears NaN too */
    assert_ok(dsc_kernel_sum_squares(&sq, &out));
    assert_true(sq == 0.0);
    dsc_kernels_set_num_threads(saved);
    dsc_tensor_free(&x), dsc_tensor_free(&y), dsc_tensor_free(&out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_adamw_matches_torch_rule),
        cmocka_unit_test(test_sgd_matches_torch_rule),
        cmocka_unit_test(test_reductions_and_helpers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
