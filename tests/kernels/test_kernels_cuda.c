/* The CUDA backend against the CPU backend: every operation runs on the same
 * inputs on both devices and the results are compared (relative error 1e-4,
 * looser where float summation orders differ a lot). Without a CUDA device
 * every test is skipped and the program exits with 77, which ctest reports
 * as skipped. Self-contained: needs only libdsc and one GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dsc/memory.h"
#include "kernel_test_util.h"

#define GPU ((dsc_device){DSC_DEVICE_CUDA, 0})

/* The same tensor on the CPU and on the GPU. */
typedef struct pair {
    dsc_tensor c, g;
} pair;

static pair mirror(dsc_tensor cpu) {
    pair p = {cpu, {0}};
    assert_ok(dsc_tensor_alloc(&p.g, cpu.dtype, cpu.ndim, cpu.shape, GPU, DSC_MEM_OTHER));
    assert_ok(dsc_tensor_copy(&p.g, &p.c));
    return p;
}
#define P_RANDN(rng, scale, ...) mirror(KT_RANDN((rng), (scale), __VA_ARGS__))
#define P_FULL(value, ...) mirror(KT_FULL((value), __VA_ARGS__))

static void pair_free(pair *p) {
    dsc_tensor_free(&p->c);
    dsc_tensor_free(&p->g);
}

/* Copies the GPU result back and compares it with the CPU one. */
static void check(const pair *p, double tol, const char *what) {
    dsc_tensor host;
    assert_ok(dsc_tensor_alloc(&host, DSC_DTYPE_F32, p->c.ndim, p->c.shape, DSC_CPU, DSC_MEM_OTHER));
    assert_ok(dsc_tensor_copy(&host, &p->g));
    double rel = dsc_test_max_rel_err(kt_f(&host), kt_f(&p->c), dsc_tensor_numel(&host), 1e-3, what);
    dsc_tensor_free(&host);
    assert_true(rel <= tol);
}

/* Runs `call` once on the CPU tensors and once on the GPU ones; ON(p) picks the side. */
#define ON(p) (side ? &(p).g : &(p).c)
#define BOTH(call)                                                                                                \
    for (int side = 0; side < 2; side++)                                                                          \
    assert_ok(call)

/* Every test starts with this, so without a GPU cmocka lists each one as skipped. */
#define REQUIRE_GPU()                                                                                             \
    do {                                                                                                          \
        if (dsc_cuda_device_count() == 0) skip();                                                                 \
    } while (0)

static dsc_rng rng_for(uint64_t seed) {
    dsc_rng rng;
    dsc_rng_init(&rng, seed, 0, DSC_RNG_INIT);
    return rng;
}

static void test_cuda_gemm(void **state) {
    (void)state;
    REQUIRE_GPU();
    dsc_rng rng = rng_for(1);
    int64_t m = 65, n = 130, k = 47;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            pair a = ta ? P_RANDN(&rng, 1.0f, k, m) : P_RANDN(&rng, 1.0f, m, k);
            pair b = tb ? P_RANDN(&rng, 1.0f, n, k) : P_RANDN(&rng, 1.0f, k, n);
            pair out = P_RANDN(&rng, 1.0f, m, n), bias = P_RANDN(&rng, 1.0f, n);
            BOTH(dsc_kernel_gemm(ON(out), ON(a), ON(b), ON(bias), ta, tb, 0.5f, 1.0f));
            check(&out, 1e-4,
                  ta ? (tb ? "gemm TT bias beta=1" : "gemm TN bias beta=1")
                     : (tb ? "gemm NT bias beta=1" : "gemm NN bias beta=1"));
            pair_free(&a), pair_free(&b), pair_free(&out), pair_free(&bias);
        }
    pair a = P_RANDN(&rng, 1.0f, 3, 17, 33), b = P_RANDN(&rng, 1.0f, 3, 19, 33), out = P_FULL(0.0f, 3, 17, 19);
    BOTH(dsc_kernel_gemm(ON(out), ON(a), ON(b), NULL, false, true, 1.0f, 0.0f));
    check(&out, 1e-4, "batched gemm NT");
    pair_free(&a), pair_free(&b), pair_free(&out);
}

static void test_cuda_linear(void **state) {
    (void)state;
    REQUIRE_GPU();
    dsc_rng rng = rng_for(2);
    pair x = P_RANDN(&rng, 1.0f, 2, 50, 96), w = P_RANDN(&rng, 1.0f, 80, 96), bias = P_RANDN(&rng, 1.0f, 80);
    pair y = P_FULL(0.0f, 2, 50, 80), dy = P_RANDN(&rng, 1.0f, 2, 50, 80);
    pair dx = P_FULL(0.0f, 2, 50, 96), dw = P_FULL(0.5f, 80, 96), db = P_FULL(0.5f, 80);
    BOTH(dsc_kernel_linear_forward(ON(y), ON(x), ON(w), ON(bias)));
    BOTH(dsc_kernel_linear_backward(ON(dx), ON(dw), ON(db), ON(dy), ON(x), ON(w)));
    check(&y, 1e-4, "linear y"), check(&dx, 1e-4, "linear dx"), check(&dw, 1e-4, "linear dw");
    check(&db, 1e-4, "linear dbias");
    pair_free(&x), pair_free(&w), pair_free(&bias), pair_free(&y), pair_free(&dy), pair_free(&dx);
    pair_free(&dw), pair_free(&db);
}

static void test_cuda_norms(void **state) {
    (void)state;
    REQUIRE_GPU();
    dsc_rng rng = rng_for(3);
    int64_t n = 300, c = 1000;
    pair x = P_RANDN(&rng, 2.0f, n, c), w = P_RANDN(&rng, 1.0f, c), b = P_RANDN(&rng, 1.0f, c);
    pair dout = P_RANDN(&rng, 1.0f, n, c), out = P_FULL(0.0f, n, c), mean = P_FULL(0.0f, n),
         rstd = P_FULL(0.0f, n);
    pair dx = P_FULL(0.0f, n, c), dw = P_FULL(0.5f, c), db = P_FULL(0.5f, c);
    BOTH(dsc_kernel_layernorm_forward(ON(out), ON(mean), ON(rstd), ON(x), ON(w), ON(b), 1e-5f));
    check(&out, 1e-4, "layernorm out"), check(&mean, 1e-4, "layernorm mean"), check(&rstd, 1e-4, "layernorm rstd");
    BOTH(dsc_kernel_layernorm_backward(ON(dx), ON(dw), ON(db), ON(dout), ON(x), ON(w), ON(mean), ON(rstd)));
    check(&dx, 1e-4, "layernorm dx"), check(&dw, 1e-4, "layernorm dweight"), check(&db, 1e-4, "layernorm dbias");
    BOTH(dsc_kernel_rmsnorm_forward(ON(out), ON(rstd), ON(x), ON(w), 1e-5f));
    check(&out, 1e-4, "rmsnorm out"), check(&rstd, 1e-4, "rmsnorm rstd");
    BOTH(dsc_kernel_rmsnorm_backward(ON(dx), ON(dw), ON(dout), ON(x), ON(w), ON(rstd)));
    check(&dx, 1e-4, "rmsnorm dx"), check(&dw, 1e-4, "rmsnorm dweight");
    pair_free(&x), pair_free(&w), pair_free(&b), pair_free(&dout), pair_free(&out), pair_free(&mean);
    pair_free(&rstd), pair_free(&dx), pair_free(&dw), pair_free(&db);
}

static void test_cuda_activations_and_softmax(void **state) {
    (void)state;
    REQUIRE_GPU();
    dsc_rng rng = rng_for(4);
    pair x = P_RANDN(&rng, 2.0f, 1000, 77), up = P_RANDN(&rng, 1.0f, 1000, 77),
         dout = P_RANDN(&rng, 1.0f, 1000, 77);
    pair out = P_FULL(0.0f, 1000, 77), dx = P_FULL(0.0f, 1000, 77), dup = P_FULL(0.0f, 1000, 77);
    BOTH(dsc_kernel_gelu_forward(ON(out), ON(x)));
    check(&out, 1e-4, "gelu");
    BOTH(dsc_kernel_gelu_backward(ON(dx), ON(dout), ON(x)));
    check(&dx, 1e-4, "gelu backward");
    BOTH(dsc_kernel_silu_forward(ON(out), ON(x)));
    check(&out, 1e-4, "silu");
    BOTH(dsc_kernel_silu_backward(ON(dx), ON(dout), ON(x)));
    check(&dx, 1e-4, "silu backward");
    BOTH(dsc_kernel_swiglu_forward(ON(out), ON(x), ON(up)));
    check(&out, 1e-4, "swiglu");
    BOTH(dsc_kernel_swiglu_backward(ON(dx), ON(dup), ON(dout), ON(x), ON(up)));
    check(&dx, 1e-4, "swiglu dgate"), check(&dup, 1e-4, "swiglu dup");
    BOTH(dsc_kernel_softmax(ON(out), ON(x)));
    check(&out, 1e-4, "softmax");
    pair_free(&x), pair_free(&up), pair_free(&dout), pair_free(&out), pair_free(&dx), pair_free(&dup);
}

static void check_attention(int64_t b, int64_t t, int64_t nh, int64_t nkv, int64_t hs) {
    dsc_rng rng = rng_for((uint64_t)(t + hs));
    pair q = P_RANDN(&rng, 1.0f, b, t, nh, hs), k = P_RANDN(&rng, 1.0f, b, t, nkv, hs);
    pair v = P_RANDN(&rng, 1.0f, b, t, nkv, hs), dout = P_RANDN(&rng, 1.0f, b, t, nh, hs);
    pair out = P_FULL(0.0f, b, t, nh, hs), lse = P_FULL(0.0f, b, nh, t);
    pair dq = P_FULL(0.0f, b, t, nh, hs), dk = P_FULL(0.0f, b, t, nkv, hs), dv = P_FULL(0.0f, b, t, nkv, hs);
    BOTH(dsc_kernel_attention_forward(ON(out), ON(lse), ON(q), ON(k), ON(v)));
    check(&out, 1e-4, "attention out"), check(&lse, 1e-4, "attention lse");
    BOTH(dsc_kernel_attention_backward(ON(dq), ON(dk), ON(dv), ON(dout), ON(q), ON(k), ON(v), ON(out), ON(lse)));
    check(&dq, 1e-3, "attention dq"), check(&dk, 1e-3, "attention dk"), check(&dv, 1e-3, "attention dv");
    pair_free(&q), pair_free(&k), pair_free(&v), pair_free(&dout), pair_free(&out), pair_free(&lse);
    pair_free(&dq), pair_free(&dk), pair_free(&dv);
}

static void test_cuda_attention(void **state) {
    (void)state;
    REQUIRE_GPU();
    check_attention(2, 130, 4, 2, 64); /* GQA, three 64-row tiles */
    check_attention(1, 1, 2, 1, 128);  /* T = 1 */
    check_attention(1, 70, 4, 1, 128); /* tiled kernels at HS = 128, two tiles */
    check_attention(1, 33, 2, 2, 40);  /* head size without tiled kernels */
}

static void test_cuda_rope(void **state) {
    (void)state;
    REQUIRE_GPU();
    dsc_rng rng = rng_for(5);
    const int32_t positions[] = {0, 5, 1000, 70000};
    pair pos = mirror(kt_ints(positions, KT_SHAPE(4)));
    pair x = P_RANDN(&rng, 1.0f, 2, 4, 3, 64), out = P_FULL(0.0f, 2, 4, 3, 64);
    BOTH(dsc_kernel_rope(ON(out), ON(x), ON(pos), 10000.0f, false));
    check(&out, 1e-4, "rope");
    BOTH(dsc_kernel_rope(ON(out), ON(out), ON(pos), 500000.0f, true));
    check(&out, 1e-4, "rope inverse in place");
    pair_free(&pos), pair_free(&x), pair_free(&out);
}

static void test_cuda_embedding_and_loss(void **state) {
    (void)state;
    REQUIRE_GPU();
    dsc_rng rng = rng_for(6);
    const int32_t ids[] = {4, 1, 4, 0, 4, 2, 3, 3};
    const int32_t targets[] = {4, -1, 0, 2, 4, -100, 1, 3};
    pair tok = mirror(kt_ints(ids, KT_SHAPE(2, 4))), tgt = mirror(kt_ints(targets, KT_SHAPE(8)));
    pair wte = P_RANDN(&rng, 1.0f, 5, 96), wpe = P_RANDN(&rng, 1.0f, 6, 96), out = P_FULL(0.0f, 2, 4, 96);
    pair dwte = P_FULL(0.5f, 5, 96), dwpe = P_FULL(0.5f, 6, 96);
    BOTH(dsc_kernel_embedding_forward(ON(out), ON(tok), ON(wte), ON(wpe)));
    check(&out, 1e-5, "embedding");
    BOTH(dsc_kernel_embedding_backward(ON(dwte), ON(dwpe), ON(out), ON(tok)));
    check(&dwte, 1e-5, "embedding dwte"), check(&dwpe, 1e-5, "embedding dwpe");
    ((int32_t *)tok.c.data)[6] = 5;
    assert_ok(dsc_tensor_copy(&tok.g, &tok.c));
    assert_err(dsc_kernel_embedding_forward(&out.g, &tok.g, &wte.g, NULL), DSC_ERR_INVALID,
               "token id 5 at position 6 is outside [0, 5)");
    pair logits = P_RANDN(&rng, 3.0f, 8, 5003), losses = P_FULL(0.0f, 8), dlogits = P_FULL(0.0f, 8, 5003);
    BOTH(dsc_kernel_cross_entropy_forward(ON(losses), ON(logits), ON(tgt)));
    check(&losses, 1e-4, "cross-entropy losses");
    BOTH(dsc_kernel_cross_entropy_backward(ON(dlogits), ON(logits), ON(tgt), 0.125f));
    check(&dlogits, 1e-4, "cross-entropy dlogits");
    ((int32_t *)tgt.c.data)[2] = 5003;
    assert_ok(dsc_tensor_copy(&tgt.g, &tgt.c));
    assert_err(dsc_kernel_cross_entropy_forward(&losses.g, &logits.g, &tgt.g), DSC_ERR_INVALID,
               "target id 5003 at position 2");
    pair_free(&tok), pair_free(&tgt), pair_free(&wte), pair_free(&wpe), pair_free(&out), pair_free(&dwte);
    pair_free(&dwpe), pair_free(&logits), pair_free(&losses), pair_free(&dlogits);
}

static void test_cuda_optimizers_and_vectors(void **state) {
    (void)state;
    REQUIRE_GPU();
    dsc_rng rng = rng_for(7);
    int64_t n = 100003;
    pair p = P_RANDN(&rng, 1.0f, n), g = P_RANDN(&rng, 0.1f, n), m = P_FULL(0.0f, n), v = P_FULL(0.0f, n);
    pair buf = P_FULL(0.0f, n);
    for (int64_t step = 1; step <= 3; step++)
        BOTH(dsc_kernel_adamw(ON(p), ON(g), ON(m), ON(v), 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step));
    check(&p, 1e-5, "adamw param"), check(&m, 1e-5, "adamw exp_avg"), check(&v, 1e-5, "adamw exp_avg_sq");
    for (int64_t step = 1; step <= 3; step++)
        BOTH(dsc_kernel_sgd(ON(p), ON(g), ON(buf), 0.1f, 0.9f, 0.01f, step));
    check(&p, 1e-5, "sgd param");
    BOTH(dsc_kernel_axpy(ON(p), 0.5f, ON(g)));
    BOTH(dsc_kernel_add(ON(m), ON(p), ON(g)));
    BOTH(dsc_kernel_scale(ON(m), 3.0f));
    check(&m, 1e-6, "axpy, add, scale");
    /* Reductions over g, which is bit-identical on both sides (m is not). */
    double sum[2], sq[2];
    bool finite[2];
    BOTH(dsc_kernel_sum(&sum[side], ON(g)));
    BOTH(dsc_kernel_sum_squares(&sq[side], ON(g)));
    BOTH(dsc_kernel_all_finite(&finite[side], ON(m)));
    printf("  sum %.12g vs %.12g, sum of squares %.12g vs %.12g\n", sum[1], sum[0], sq[1], sq[0]);
    assert_true(fabs(sum[1] - sum[0]) <= 1e-9 * sq[0] && fabs(sq[1] - sq[0]) <= 1e-9 * sq[0]);
    assert_true(finite[0] && finite[1]);
    kt_f(&m.c)[n - 1] = NAN;
    assert_ok(dsc_tensor_copy(&m.g, &m.c));
    assert_ok(dsc_kernel_all_finite(&finite[1], &m.g));
    assert_false(finite[1]);
    BOTH(dsc_kernel_zero(ON(m)));
    assert_ok(dsc_kernel_sum_squares(&sq[1], &m.g));
    assert_true(sq[1] == 0.0);
    pair_free(&p), pair_free(&g), pair_free(&m), pair_free(&v), pair_free(&buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_gemm),
        cmocka_unit_test(test_cuda_linear),
        cmocka_unit_test(test_cuda_norms),
        cmocka_unit_test(test_cuda_activations_and_softmax),
        cmocka_unit_test(test_cuda_attention),
        cmocka_unit_test(test_cuda_rope),
        cmocka_unit_test(test_cuda_embedding_and_loss),
        cmocka_unit_test(test_cuda_optimizers_and_vectors),
    };
    bool have_gpu = dsc_cuda_device_count() > 0;
    if (!have_gpu) printf("SKIPPED: no CUDA device\n");
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    return have_gpu ? failed : 77; /* 77: ctest's SKIP_RETURN_CODE for this test */
}
