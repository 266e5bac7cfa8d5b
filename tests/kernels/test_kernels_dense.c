/* CPU kernels for dense layers: GEMM (transposes, bias, beta accumulation,
 * batched), linear forward/backward, LayerNorm, RMSNorm, activations and
 * softmax. Forwards are compared with the double-precision references,
 * backwards with central finite differences of sum(out * r) computed by the
 * references, and multi-threaded results with single-threaded ones. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernel_test_util.h"
#include "ref_kernels.h"

static dsc_rng test_rng(uint64_t seed) {
    dsc_rng rng;
    dsc_rng_init(&rng, seed, 0, DSC_RNG_INIT);
    return rng;
}

/* A (rows, cols) matrix, or (bt, rows, cols) when bt > 0. */
static dsc_tensor matrix(dsc_rng *rng, int64_t bt, int64_t rows, int64_t cols) {
    return bt > 0 ? KT_RANDN(rng, 1.0f, bt, rows, cols) : KT_RANDN(rng, 1.0f, rows, cols);
}

static void check_gemm(dsc_rng *rng, int64_t bt, int64_t m, int64_t n, int64_t k, bool ta, bool tb, bool with_bias,
                       float alpha, float beta) {
    dsc_tensor a = matrix(rng, bt, ta ? k : m, ta ? m : k), b = matrix(rng, bt, tb ? n : k, tb ? k : n);
    dsc_tensor out = matrix(rng, bt, m, n), bias = KT_RANDN(rng, 1.0f, n);
    double *ad = kt_to_double(&a), *bd = kt_to_double(&b), *od = kt_to_double(&out), *biasd = kt_to_double(&bias);
    ref_gemm(od, ad, bd, with_bias ? biasd : NULL, bt > 0 ? bt : 1, m, n, k, ta, tb, alpha, beta);
    assert_ok(dsc_kernel_gemm(&out, &a, &b, with_bias ? &bias : NULL, ta, tb, alpha, beta));
    char what[96];
    snprintf(what, sizeof what, "gemm bt=%lld %lldx%lldx%lld ta=%d tb=%d bias=%d beta=%g", (long long)bt,
             (long long)m, (long long)n, (long long)k, ta, tb, with_bias, (double)beta);
    KT_ASSERT_CLOSE(kt_f(&out), od, dsc_tensor_numel(&out), 1e-5, what);
    free(ad), free(bd), free(od), free(biasd);
    dsc_tensor_free(&a), dsc_tensor_free(&b), dsc_tensor_free(&out), dsc_tensor_free(&bias);
}

static void test_gemm_against_reference(void **state) {
    (void)state;
    dsc_rng rng = test_rng(1);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            check_gemm(&rng, 0, 5, 7, 9, ta, tb, false, 1.0f, 0.0f);
            check_gemm(&rng, 0, 33, 65, 17, ta, tb, true, 0.5f, 0.0f);
            check_gemm(&rng, 0, 6, 4, 3, ta, tb, false, 1.0f, 1.0f); /* accumulate into out */
            check_gemm(&rng, 3, 5, 6, 7, ta, tb, ta, 1.0f, tb ? 1.0f : 0.0f);
        }
    check_gemm(&rng, 0, 1, 1, 1, false, false, true, 2.0f, 0.5f);
}

typedef struct linear_ctx {
    double *x, *w, *b, *r, *y; /* x (N, C), w (OC, C), b (OC), r and y (N, OC) */
    int64_t n, c, oc;
} linear_ctx;

static double linear_loss(void *p) {
    linear_ctx *L = p;
    ref_gemm(L->y, L->x, L->w, L->b, 1, L->n, L->oc, L->c, false, true, 1, 0);
    return kt_dot(L->y, L->r, L->n * L->oc);
}

/* Subtracts the value a gradient buffer held before an accumulating backward. */
static void subtract(dsc_tensor *t, float before) {
    for (int64_t i = 0; i < dsc_tensor_numel(t); i++)
        kt_f(t)[i] -= before;
}

static void check_linear(bool with_bias) {
    dsc_rng rng = test_rng(2);
    int64_t b = 2, t = 3, c = 5, oc = 4;
    dsc_tensor x = KT_RANDN(&rng, 1.0f, b, t, c), w = KT_RANDN(&rng, 1.0f, oc, c), bias = KT_RANDN(&rng, 1.0f, oc);
    dsc_tensor y = KT_FULL(0.0f, b, t, oc), r = KT_RANDN(&rng, 1.0f, b, t, oc);
    linear_ctx L = {kt_to_double(&x),
                    kt_to_double(&w),
                    with_bias ? kt_to_double(&bias) : NULL,
                    kt_to_double(&r),
                    kt_zeros_d(b * t * oc),
                    b * t,
                    c,
                    oc};
    assert_ok(dsc_kernel_linear_forward(&y, &x, &w, with_bias ? &bias : NULL));
    linear_loss(&L);
    KT_ASSERT_CLOSE(kt_f(&y), L.y, b * t * oc, 1e-5, with_bias ? "linear forward (bias)" : "linear forward");
    /* Parameter gradients accumulate, so start them from a known value. */
    dsc_tensor dx = KT_FULL(9.0f, b, t, c), dw = KT_FULL(0.25f, oc, c), dbias = KT_FULL(0.25f, oc);
    assert_ok(dsc_kernel_linear_backward(&dx, &dw, with_bias ? &dbias : NULL, &r, &x, &w));
    subtract(&dw, 0.25f);
    KT_ASSERT_GRAD(linear_loss, &L, L.x, b * t * c, kt_f(&dx), "linear dx");
    KT_ASSERT_GRAD(linear_loss, &L, L.w, oc * c, kt_f(&dw), "linear dw");
    if (with_bias) {
        subtract(&dbias, 0.25f);
        KT_ASSERT_GRAD(linear_loss, &L, L.b, oc, kt_f(&dbias), "linear dbias");
    }
    free(L.x), free(L.w), free(L.b), free(L.r), free(L.y);
    dsc_tensor_free(&x), dsc_tensor_free(&w), dsc_tensor_free(&bias), dsc_tensor_free(&y), dsc_tensor_free(&r);
    dsc_tensor_free(&dx), dsc_tensor_free(&dw), dsc_tensor_free(&dbias);
}

static void test_linear_with_bias(void **state) {
    (void)state;
    check_linear(true);
}

static void test_linear_without_bias(void **state) {
    (void)state;
    check_linear(false);
}

typedef struct norm_ctx {
    double *x, *w, *b, *r, *out; /* x, r, out (N, C); w, b (C); b NULL for RMSNorm */
    int64_t n, c;
    bool rms;
} norm_ctx;

static double norm_loss(void *p) {
    norm_ctx *N = p;
    if (N->rms)
        ref_rmsnorm(N->out, NULL, N->x, N->w, N->n, N->c, 1e-5);
    else
        ref_layernorm(N->out, NULL, NULL, N->x, N->w, N->b, N->n, N->c, 1e-5);
    return kt_dot(N->out, N->r, N->n * N->c);
}

/* Forward against the reference, backward against finite differences (small shapes only). */
static void check_norm(bool rms, int64_t n, int64_t c, bool check_grads) {
    dsc_rng rng = test_rng(3 + (uint64_t)c);
    dsc_tensor x = KT_RANDN(&rng, 2.0f, n, c), w = KT_RANDN(&rng, 1.0f, c), b = KT_RANDN(&rng, 1.0f, c);
    dsc_tensor out = KT_FULL(0.0f, n, c), mean = KT_FULL(0.0f, n), rstd = KT_FULL(0.0f, n);
    dsc_tensor r = KT_RANDN(&rng, 1.0f, n, c);
    for (int64_t i = 0; i < n * c; i++)
        kt_f(&x)[i] += 1.5f; /* a nonzero mean exercises the centring */
    norm_ctx N = {kt_to_double(&x),
                  kt_to_double(&w),
                  rms ? NULL : kt_to_double(&b),
                  kt_to_double(&r),
                  kt_zeros_d(n * c),
                  n,
                  c,
                  rms};
    double *ref_mean = kt_zeros_d(n), *ref_rstd = kt_zeros_d(n);
    if (rms) {
        assert_ok(dsc_kernel_rmsnorm_forward(&out, &rstd, &x, &w, 1e-5f));
        ref_rmsnorm(N.out, ref_rstd, N.x, N.w, n, c, 1e-5);
    } else {
        assert_ok(dsc_kernel_layernorm_forward(&out, &mean, &rstd, &x, &w, &b, 1e-5f));
        ref_layernorm(N.out, ref_mean, ref_rstd, N.x, N.w, N.b, n, c, 1e-5);
        KT_ASSERT_CLOSE(kt_f(&mean), ref_mean, n, 1e-5, "layernorm mean");
    }
    KT_ASSERT_CLOSE(kt_f(&out), N.out, n * c, 1e-5, rms ? "rmsnorm forward" : "layernorm forward");
    KT_ASSERT_CLOSE(kt_f(&rstd), ref_rstd, n, 1e-5, rms ? "rmsnorm rstd" : "layernorm rstd");
    if (check_grads) {
        dsc_tensor dx = KT_FULL(9.0f, n, c), dw = KT_FULL(0.5f, c), db = KT_FULL(0.5f, c);
        if (rms)
            assert_ok(dsc_kernel_rmsnorm_backward(&dx, &dw, &r, &x, &w, &rstd));
        else
            assert_ok(dsc_kernel_layernorm_backward(&dx, &dw, &db, &r, &x, &w, &mean, &rstd));
        subtract(&dw, 0.5f);
        KT_ASSERT_GRAD(norm_loss, &N, N.x, n * c, kt_f(&dx), rms ? "rmsnorm dx" : "layernorm dx");
        KT_ASSERT_GRAD(norm_loss, &N, N.w, c, kt_f(&dw), rms ? "rmsnorm dweight" : "layernorm dweight");
        if (!rms) {
            subtract(&db, 0.5f);
            KT_ASSERT_GRAD(norm_loss, &N, N.b, c, kt_f(&db), "layernorm dbias");
        }
        dsc_tensor_free(&dx), dsc_tensor_free(&dw), dsc_tensor_free(&db);
    }
    free(N.x), free(N.w), free(N.b), free(N.r), free(N.out), free(ref_mean), free(ref_rstd);
    dsc_tensor_free(&x), dsc_tensor_free(&w), dsc_tensor_free(&b), dsc_tensor_free(&out);
    dsc_tensor_free(&mean), dsc_tensor_free(&rstd), dsc_tensor_free(&r);
}

static void test_layernorm(void **state) {
    (void)state;
    check_norm(false, 6, 37, true);
    check_norm(false, 1, 1, true);
    check_norm(false, 300, 200, false);
}

static void test_rmsnorm(void **state) {
    (void)state;
    check_norm(true, 6, 37, true);
    check_norm(true, 300, 200, false);
}

/* Runs both norm backwards with 1 and 3 threads on a shape large enough to be
 * split; the per-channel accumulation order is the same, so results match exactly. */
static void test_norm_backward_threads(void **state) {
    (void)state;
    dsc_rng rng = test_rng(4);
    int64_t n = 260, c = 300;
    dsc_tensor x = KT_RANDN(&rng, 1.0f, n, c), w = KT_RANDN(&rng, 1.0f, c), b = KT_RANDN(&rng, 1.0f, c);
    dsc_tensor dout = KT_RANDN(&rng, 1.0f, n, c), out = KT_FULL(0.0f, n, c);
    dsc_tensor mean = KT_FULL(0.0f, n), rstd = KT_FULL(0.0f, n);
    dsc_tensor dx[2], dw[2], db[2];
    int saved = dsc_kernels_get_num_threads();
    for (int rms = 0; rms < 2; rms++) {
        for (int run = 0; run < 2; run++) {
            dsc_kernels_set_num_threads(run ? 3 : 1);
            dx[run] = KT_FULL(0.0f, n, c), dw[run] = KT_FULL(1.0f, c), db[run] = KT_FULL(1.0f, c);
            if (rms) {
                assert_ok(dsc_kernel_rmsnorm_forward(&out, &rstd, &x, &w, 1e-5f));
                assert_ok(dsc_kernel_rmsnorm_backward(&dx[run], &dw[run], &dout, &x, &w, &rstd));
            } else {
                assert_ok(dsc_kernel_layernorm_forward(&out, &mean, &rstd, &x, &w, &b, 1e-5f));
                assert_ok(
                    dsc_kernel_layernorm_backward(&dx[run], &dw[run], &db[run], &dout, &x, &w, &mean, &rstd));
            }
        }
        assert_memory_equal(dx[0].data, dx[1].data, dsc_tensor_nbytes(&dx[0]));
        assert_memory_equal(dw[0].data, dw[1].data, dsc_tensor_nbytes(&dw[0]));
        assert_memory_equal(db[0].data, db[1].data, dsc_tensor_nbytes(&db[0]));
        for (int run = 0; run < 2; run++)
            dsc_tensor_free(&dx[run]), dsc_tensor_free(&dw[run]), dsc_tensor_free(&db[run]);
    }
    dsc_kernels_set_num_threads(saved);
    dsc_tensor_free(&x), dsc_tensor_free(&w), dsc_tensor_free(&b), dsc_tensor_free(&dout), dsc_tensor_free(&out);
    dsc_tensor_free(&mean), dsc_tensor_free(&rstd);
}

typedef struct act_ctx {
    double *x, *up, *r, *out; /* all (n); up used by SwiGLU only */
    int64_t n;
    int kind; /* 0 gelu, 1 silu, 2 swiglu */
} act_ctx;

static double act_loss(void *p) {
    act_ctx *A = p;
    if (A->kind == 0) ref_gelu(A->out, A->x, A->n);
    if (A->kind == 1) ref_silu(A->out, A->x, A->n);
    if (A->kind == 2) ref_swiglu(A->out, A->x, A->up, A->n);
    return kt_dot(A->out, A->r, A->n);
}

static void test_activations(void **state) {
    (void)state;
    static const char *names[] = {"gelu", "silu", "swiglu"};
    dsc_rng rng = test_rng(5);
    int64_t n = 41;
    for (int kind = 0; kind < 3; kind++) {
        dsc_tensor x = KT_RANDN(&rng, 2.0f, n), up = KT_RANDN(&rng, 1.0f, n), r = KT_RANDN(&rng, 1.0f, n);
        dsc_tensor out = KT_FULL(0.0f, n), dx = KT_FULL(7.0f, n), dup = KT_FULL(7.0f, n);
        act_ctx A = {kt_to_double(&x), kt_to_double(&up), kt_to_double(&r), kt_zeros_d(n), n, kind};
        act_loss(&A);
        char what[64];
        snprintf(what, sizeof what, "%s forward", names[kind]);
        if (kind == 0) assert_ok(dsc_kernel_gelu_forward(&out, &x));
        if (kind == 1) assert_ok(dsc_kernel_silu_forward(&out, &x));
        if (kind == 2) assert_ok(dsc_kernel_swiglu_forward(&out, &x, &up));
        KT_ASSERT_CLOSE(kt_f(&out), A.out, n, 1e-5, what);
        if (kind == 0) assert_ok(dsc_kernel_gelu_backward(&dx, &r, &x));
        if (kind == 1) assert_ok(dsc_kernel_silu_backward(&dx, &r, &x));
        if (kind == 2) assert_ok(dsc_kernel_swiglu_backward(&dx, &dup, &r, &x, &up));
        snprintf(what, sizeof what, "%s dx", names[kind]);
        KT_ASSERT_GRAD(act_loss, &A, A.x, n, kt_f(&dx), what);
        if (kind == 2) KT_ASSERT_GRAD(act_loss, &A, A.up, n, kt_f(&dup), "swiglu dup");
        free(A.x), free(A.up), free(A.r), free(A.out);
        dsc_tensor_free(&x), dsc_tensor_free(&up), dsc_tensor_free(&r), dsc_tensor_free(&out);
        dsc_tensor_free(&dx), dsc_tensor_free(&dup);
    }
}

static void test_softmax_in_place(void **state) {
    (void)state;
    dsc_rng rng = test_rng(6);
    dsc_tensor x = KT_RANDN(&rng, 5.0f, 3, 4, 70);
    double *xd = kt_to_double(&x), *want = kt_zeros_d(3 * 4 * 70);
    ref_softmax(want, xd, 12, 70);
    assert_ok(dsc_kernel_softmax(&x, &x));
    KT_ASSERT_CLOSE(kt_f(&x), want, 12 * 70, 1e-5, "softmax in place");
    free(xd), free(want);
    dsc_tensor_free(&x);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemm_against_reference),
        cmocka_unit_test(test_linear_with_bias),
        cmocka_unit_test(test_linear_without_bias),
        cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_norm_backward_threads),
        cmocka_unit_test(test_activations),
        cmocka_unit_test(test_softmax_in_place),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
