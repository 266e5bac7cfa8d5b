/* CPU causal attention (MHA and GQA; T = 1, and T below, at and across the
 * 64-row query tile / 64-key block) and RoPE. Forwards against the
 * double-precision references (materialised softmax), backwards against
 * finite differences; attention with 3 threads against 1 thread; in bf16 / fp16
 * products against the reference with a bf16 / fp16 flash attention's roundings. */
#include <stdio.h>
#include <stdlib.h>

#include "kernel_test_util.h"
#include "ref_kernels.h"

typedef struct attn_ctx {
    double *q, *k, *v, *r, *out; /* q, r, out (B, T, NH, HS); k, v (B, T, NKV, HS) */
    int64_t b, t, nh, nkv, hs;
} attn_ctx;

static double attn_loss(void *p) {
    attn_ctx *A = p;
    ref_attention(A->out, NULL, A->q, A->k, A->v, A->b, A->t, A->nh, A->nkv, A->hs, NULL);
    return kt_dot(A->out, A->r, A->b * A->t * A->nh * A->hs);
}

static void check_attention(int64_t b, int64_t t, int64_t nh, int64_t nkv, int64_t hs, bool check_grads) {
    dsc_rng rng;
    dsc_rng_init(&rng, (uint64_t)(t * 131 + nh * 7 + hs), 0, DSC_RNG_INIT);
    dsc_tensor q = KT_RANDN(&rng, 1.0f, b, t, nh, hs), k = KT_RANDN(&rng, 1.0f, b, t, nkv, hs);
    dsc_tensor v = KT_RANDN(&rng, 1.0f, b, t, nkv, hs), r = KT_RANDN(&rng, 1.0f, b, t, nh, hs);
    dsc_tensor out = KT_FULL(0.0f, b, t, nh, hs), lse = KT_FULL(0.0f, b, nh, t);
    int64_t nq = b * t * nh * hs, nk = b * t * nkv * hs;
    attn_ctx A = {
        kt_to_double(&q), kt_to_double(&k), kt_to_double(&v), kt_to_double(&r), kt_zeros_d(nq), b, t, nh, nkv, hs};
    double *ref_lse = kt_zeros_d(b * nh * t);
    ref_attention(A.out, ref_lse, A.q, A.k, A.v, b, t, nh, nkv, hs, NULL);
    assert_ok(dsc_kernel_attention_forward(&out, &lse, &q, &k, &v));
    char what[96];
    snprintf(what, sizeof what, "attention B=%lld T=%lld NH=%lld NKV=%lld HS=%lld", (long long)b, (long long)t,
             (long long)nh, (long long)nkv, (long long)hs);
    KT_ASSERT_CLOSE(kt_f(&out), A.out, nq, 1e-5, what);
    KT_ASSERT_CLOSE(kt_f(&lse), ref_lse, b * nh * t, 1e-5, "attention lse");
    if (check_grads) {
        dsc_tensor dq = KT_FULL(9.0f, b, t, nh, hs), dk = KT_FULL(9.0f, b, t, nkv, hs);
        dsc_tensor dv = KT_FULL(9.0f, b, t, nkv, hs);
        assert_ok(dsc_kernel_attention_backward(&dq, &dk, &dv, &r, &q, &k, &v, &out, &lse));
        KT_ASSERT_GRAD(attn_loss, &A, A.q, nq, kt_f(&dq), "attention dq");
        KT_ASSERT_GRAD(attn_loss, &A, A.k, nk, kt_f(&dk), "attention dk");
        KT_ASSERT_GRAD(attn_loss, &A, A.v, nk, kt_f(&dv), "attention dv");
        dsc_tensor_free(&dq), dsc_tensor_free(&dk), dsc_tensor_free(&dv);
    }
    free(A.q), free(A.k), free(A.v), free(A.r), free(A.out), free(ref_lse);
    dsc_tensor_free(&q), dsc_tensor_free(&k), dsc_tensor_free(&v), dsc_tensor_free(&r);
    dsc_tensor_free(&out), dsc_tensor_free(&lse);
}

static void test_attention_small(void **state) {
    (void)state;
    check_attention(2, 5, 2, 2, 4, true); /* multi-head */
    check_attention(1, 6, 4, 2, 8, true); /* grouped-query: NH=4, NKV=2 */
    check_attention(2, 1, 4, 1, 6, true); /* T = 1 */
}

static void test_attention_across_key_blocks(void **state) {
    (void)state;
    check_attention(1, 70, 2, 1, 4, true);   /* T not a multiple of the 64-key block */
    check_attention(2, 64, 4, 2, 16, false); /* exactly one block */
    check_attention(1, 130, 4, 2, 32, false);
    check_attention(1, 130, 2, 1, 2, true); /* gradients across three query tiles */
}

/* Forward and backward with 3 threads equal 1 thread exactly (each output has one owner). */
static void test_attention_threads(void **state) {
    (void)state;
    dsc_rng rng;
    dsc_rng_init(&rng, 9, 0, DSC_RNG_INIT);
    int64_t b = 2, t = 100, nh = 4, nkv = 2, hs = 16; /* two query tiles */
    dsc_tensor q = KT_RANDN(&rng, 1.0f, b, t, nh, hs), k = KT_RANDN(&rng, 1.0f, b, t, nkv, hs);
    dsc_tensor v = KT_RANDN(&rng, 1.0f, b, t, nkv, hs), dout = KT_RANDN(&rng, 1.0f, b, t, nh, hs);
    dsc_tensor out[2], lse[2], dq[2], dk[2], dv[2];
    int saved = dsc_kernels_get_num_threads();
    for (int run = 0; run < 2; run++) {
        dsc_kernels_set_num_threads(run ? 3 : 1);
        out[run] = KT_FULL(0.0f, b, t, nh, hs), lse[run] = KT_FULL(0.0f, b, nh, t);
        dq[run] = KT_FULL(0.0f, b, t, nh, hs), dk[run] = KT_FULL(0.0f, b, t, nkv, hs);
        dv[run] = KT_FULL(0.0f, b, t, nkv, hs);
        assert_ok(dsc_kernel_attention_forward(&out[run], &lse[run], &q, &k, &v));
        assert_ok(
            dsc_kernel_attention_backward(&dq[run], &dk[run], &dv[run], &dout, &q, &k, &v, &out[run], &lse[run]));
    }
    dsc_kernels_set_num_threads(saved);
    assert_memory_equal(out[0].data, out[1].data, dsc_tensor_nbytes(&out[0]));
    assert_memory_equal(dq[0].data, dq[1].data, dsc_tensor_nbytes(&dq[0]));
    assert_memory_equal(dk[0].data, dk[1].data, dsc_tensor_nbytes(&dk[0]));
    assert_memory_equal(dv[0].data, dv[1].data, dsc_tensor_nbytes(&dv[0]));
    for (int run = 0; run < 2; run++) {
        dsc_tensor_free(&out[run]), dsc_tensor_free(&lse[run]), dsc_tensor_free(&dq[run]);
        dsc_tensor_free(&dk[run]), dsc_tensor_free(&dv[run]);
    }
    dsc_tensor_free(&q), dsc_tensor_free(&k), dsc_tensor_free(&v), dsc_tensor_free(&dout);
}

static double bf16(double x) {
    return dsc_bf16_to_f32(dsc_f32_to_bf16((float)x));
}

static double f16(double x) {
    return dsc_f16_to_f32(dsc_f32_to_f16((float)x));
}

static double *rounded_copy(const dsc_tensor *t, ref_rounding rounding) {
    double *d = kt_to_double(t);
    for (int64_t i = 0; i < dsc_tensor_numel(t); i++)
        d[i] = rounding(d[i]);
    return d;
}

/* Under dsc_kernels_set_matmul_dtype(bf16 / fp16) the attention's products take operands rounded
 * to it: within `close` of the reference that rounds q, k, v, dout, the probabilities, the output
 * and the score gradients where a bf16 / fp16 flash attention does, and `apart` or more from the
 * f32 attention, so a rounding left out fails. With T within one 64-key block the running maximum
 * the kernel rounds against is the row's, as the reference's; across blocks it rounds against a
 * partial maximum, which is the same up to a rounding of each probability. */
static void check_attention_rounded(dsc_dtype products, int64_t b, int64_t t, int64_t nh, int64_t nkv, int64_t hs,
                                    double close, double apart) {
    ref_rounding rounding = products == DSC_DTYPE_BF16 ? bf16 : f16;
    dsc_rng rng;
    dsc_rng_init(&rng, (uint64_t)(t * 17 + hs), 0, DSC_RNG_INIT);
    dsc_tensor q = KT_RANDN(&rng, 1.0f, b, t, nh, hs), k = KT_RANDN(&rng, 1.0f, b, t, nkv, hs);
    dsc_tensor v = KT_RANDN(&rng, 1.0f, b, t, nkv, hs), dout = KT_RANDN(&rng, 1.0f, b, t, nh, hs);
    dsc_tensor out = KT_FULL(0.0f, b, t, nh, hs), lse = KT_FULL(0.0f, b, nh, t);
    dsc_tensor dq = KT_FULL(9.0f, b, t, nh, hs), dk = KT_FULL(9.0f, b, t, nkv, hs),
               dv = KT_FULL(9.0f, b, t, nkv, hs);
    int64_t nq = b * t * nh * hs, nk = b * t * nkv * hs;
    double *rq = rounded_copy(&q, rounding), *rk = rounded_copy(&k, rounding), *rv = rounded_copy(&v, rounding);
    double *rd = rounded_copy(&dout, rounding), *want[4], *exact[4];
    for (int i = 0; i < 4; i++)
        want[i] = kt_zeros_d(nq), exact[i] = kt_zeros_d(nq);
    ref_attention(want[0], NULL, rq, rk, rv, b, t, nh, nkv, hs, rounding);
    ref_attention_backward(want[1], want[2], want[3], rd, rq, rk, rv, b, t, nh, nkv, hs, rounding);
    double *q64 = kt_to_double(&q), *k64 = kt_to_double(&k), *v64 = kt_to_double(&v), *d64 = kt_to_double(&dout);
    ref_attention(exact[0], NULL, q64, k64, v64, b, t, nh, nkv, hs, NULL);
    ref_attention_backward(exact[1], exact[2], exact[3], d64, q64, k64, v64, b, t, nh, nkv, hs, NULL);

    dsc_dtype was = dsc_kernels_set_matmul_dtype(products);
    assert_ok(dsc_kernel_attention_forward(&out, &lse, &q, &k, &v));
    assert_ok(dsc_kernel_attention_backward(&dq, &dk, &dv, &dout, &q, &k, &v, &out, &lse));
    dsc_kernels_set_matmul_dtype(was);

    const float *o = kt_f(&out);
    int64_t unrounded = 0;
    for (int64_t i = 0; i < nq; i++)
        unrounded += (double)o[i] != rounding(o[i]);
    assert_int_equal(unrounded, 0); /* the bf16 / fp16 output autocast's attention returns */
    const dsc_tensor *got[4] = {&out, &dq, &dk, &dv};
    const char *names[4] = {"attention out", "attention dq", "attention dk", "attention dv"};
    for (int i = 0; i < 4; i++) {
        int64_t n = i < 2 ? nq : nk;
        char name[64];
        snprintf(name, sizeof name, "%s %s", dsc_dtype_name(products), names[i]);
        assert_true(kt_rel_err(kt_f(got[i]), want[i], n, 1e-3, name) <= close);
        assert_true(kt_rel_err(kt_f(got[i]), exact[i], n, 1e-3, "  against f32") >= apart);
    }
    for (int i = 0; i < 4; i++)
        free(want[i]), free(exact[i]);
    free(rq), free(rk), free(rv), free(rd), free(q64), free(k64), free(v64), free(d64);
    dsc_tensor_free(&q), dsc_tensor_free(&k), dsc_tensor_free(&v), dsc_tensor_free(&dout);
    dsc_tensor_free(&out), dsc_tensor_free(&lse), dsc_tensor_free(&dq), dsc_tensor_free(&dk), dsc_tensor_free(&dv);
}

static void test_attention_bf16_products(void **state) {
    (void)state;
    check_attention_rounded(DSC_DTYPE_BF16, 2, 40, 4, 2, 16, 1e-5, 1e-3);  /* one key block: exactly */
    check_attention_rounded(DSC_DTYPE_BF16, 1, 130, 4, 1, 32, 3e-3, 1e-3); /* three query tiles */
}

static void test_attention_fp16_products(void **state) {
    (void)state;
    check_attention_rounded(DSC_DTYPE_F16, 2, 40, 4, 2, 16, 6e-5, 2.5e-4); /* one key block */
    check_attention_rounded(DSC_DTYPE_F16, 1, 130, 4, 1, 32, 5e-4, 2e-4);  /* three query tiles */
}

typedef struct rope_ctx {
    double *x, *r, *out;
    const int32_t *pos;
    int64_t b, t, nh, hs;
} rope_ctx;

static double rope_loss(void *p) {
    rope_ctx *R = p;
    ref_rope(R->out, R->x, R->pos, R->b, R->t, R->nh, R->hs, 10000.0, false);
    return kt_dot(R->out, R->r, R->b * R->t * R->nh * R->hs);
}

static void test_rope(void **state) {
    (void)state;
    dsc_rng rng;
    dsc_rng_init(&rng, 10, 0, DSC_RNG_INIT);
    int64_t b = 2, t = 5, nh = 3, hs = 8, n = b * t * nh * hs;
    const int32_t positions[] = {0, 1, 7, 300, 4095};
    dsc_tensor pos = kt_ints(positions, KT_SHAPE(t));
    dsc_tensor x = KT_RANDN(&rng, 1.0f, b, t, nh, hs), r = KT_RANDN(&rng, 1.0f, b, t, nh, hs);
    dsc_tensor out = KT_FULL(0.0f, b, t, nh, hs), back = KT_FULL(0.0f, b, t, nh, hs);
    rope_ctx R = {kt_to_double(&x), kt_to_double(&r), kt_zeros_d(n), positions, b, t, nh, hs};
    rope_loss(&R);
    assert_ok(dsc_kernel_rope(&out, &x, &pos, 10000.0f, false));
    KT_ASSERT_CLOSE(kt_f(&out), R.out, n, 1e-5, "rope forward");
    /* The inverse rotation undoes the forward one, in place. */
    assert_ok(dsc_kernel_rope(&out, &out, &pos, 10000.0f, true));
    KT_ASSERT_CLOSE(kt_f(&out), R.x, n, 1e-5, "rope inverse(forward(x)) in place");
    /* RoPE is linear and orthogonal: its backward is the inverse rotation of dout. */
    assert_ok(dsc_kernel_rope(&back, &r, &pos, 10000.0f, true));
    KT_ASSERT_GRAD(rope_loss, &R, R.x, n, kt_f(&back), "rope backward (inverse)");
    free(R.x), free(R.r), free(R.out);
    dsc_tensor_free(&pos), dsc_tensor_free(&x), dsc_tensor_free(&r), dsc_tensor_free(&out), dsc_tensor_free(&back);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_small),         cmocka_unit_test(test_attention_across_key_blocks),
        cmocka_unit_test(test_attention_threads),       cmocka_unit_test(test_attention_bf16_products),
        cmocka_unit_test(test_attention_fp16_products), cmocka_unit_test(test_rope),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
