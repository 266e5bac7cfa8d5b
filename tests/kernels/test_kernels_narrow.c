/* The kernels that take tensors stored in 2 bytes (mixed precision's head:
 * bf16 / fp16 logits and their gradient) against the same kernels on the f32
 * tensors holding the same values: the products' outputs are those sums
 * rounded, the cross-entropy's losses and the linear backward's gradients are
 * bit for bit the f32 ones, the cross-entropy's gradients those rounded. The
 * products run at the sizes that take the panels, the depth blocks and the
 * tiles (dsc_cpu_gemm_rounded_set_whole_max). test_kernel_ops checks the
 * same kernels against the naive double reference. */
#include <stdlib.h>
#include <string.h>

#include "dsc/kernels.h"
#include "dsc/precision.h"
#include "kernel_test_util.h"
#include "kernels/cpu/cpu_gemm.h" /* dsc_cpu_gemm_rounded_set_whole_max */

static const dsc_dtype types[2] = {DSC_DTYPE_BF16, DSC_DTYPE_F16};

/* A host tensor of `type` and shape (rows, cols) holding f32 `src` rounded. */
static dsc_tensor packed(const float *src, int64_t rows, int64_t cols, dsc_dtype type) {
    dsc_tensor t = dsc_tensor_view(malloc((size_t)(rows * cols) * 2), type, 2, (int64_t[]){rows, cols}, DSC_CPU);
    dsc_precision_pack_to(t.data, src, rows * cols, type);
    return t;
}

/* The f32 values of a 2-byte tensor, in a new host tensor. */
static dsc_tensor widened(const dsc_tensor *t) {
    dsc_tensor w = kt_full(0.0f, t->ndim, t->shape);
    dsc_precision_unpack(w.data, t->data, dsc_tensor_numel(t), t->dtype);
    return w;
}

static dsc_tensor randn(int64_t rows, int64_t cols, float scale, uint64_t seed) {
    dsc_rng rng;
    dsc_rng_init(&rng, seed, 0, DSC_RNG_INIT);
    return KT_RANDN(&rng, scale, rows, cols);
}

static dsc_tensor zeros(int64_t rows, int64_t cols) {
    return KT_FULL(0.0f, rows, cols);
}

/* Targets of n rows over v classes, some ignored (-1). */
static dsc_tensor targets(int64_t n, int64_t v) {
    int32_t ids[64];
    assert_true(n <= 64);
    for (int64_t i = 0; i < n; i++)
        ids[i] = i % 5 == 3 ? -1 : (int32_t)((i * 7919) % v);
    return kt_ints(ids, 1, &n);
}

/* 2-byte logits: the losses of their widened values, the gradients those of the f32 kernel rounded,
 * in place and not (a vocabulary past one staging chunk and not a multiple of it). */
static void test_cross_entropy(void **state) {
    (void)state;
    const int64_t n = 7, v = 2500;
    for (int k = 0; k < 2; k++) {
        dsc_tensor x = randn(n, v, 3.0f, 11 + k), tgt = targets(n, v);
        dsc_tensor narrow = packed(x.data, n, v, types[k]), wide = widened(&narrow);
        float loss_n[7], loss_w[7];
        dsc_tensor ln = dsc_tensor_view(loss_n, DSC_DTYPE_F32, 1, &n, DSC_CPU),
                   lw = dsc_tensor_view(loss_w, DSC_DTYPE_F32, 1, &n, DSC_CPU);
        assert_ok(dsc_kernel_cross_entropy_forward(&ln, &narrow, &tgt));
        assert_ok(dsc_kernel_cross_entropy_forward(&lw, &wide, &tgt));
        assert_memory_equal(loss_n, loss_w, sizeof loss_n);

        dsc_tensor apart = packed(x.data, n, v, types[k]); /* overwritten: any values */
        assert_ok(dsc_kernel_cross_entropy_backward(&apart, &narrow, &tgt, 0.375f));
        assert_ok(dsc_kernel_cross_entropy_backward(&narrow, &narrow, &tgt, 0.375f)); /* in place */
        assert_ok(dsc_kernel_cross_entropy_backward(&wide, &wide, &tgt, 0.375f));
        dsc_tensor want = packed(wide.data, n, v, types[k]);
        assert_memory_equal(narrow.data, want.data, (size_t)(n * v) * 2);
        assert_memory_equal(apart.data, want.data, (size_t)(n * v) * 2);
        free(want.data);
        free(apart.data);
        free(narrow.data);
        dsc_tensor_free(&wide);
        dsc_tensor_free(&x);
        dsc_tensor_free(&tgt);
    }
}

/* y stored in 2 bytes: the f32 kernel's y under the same products, rounded. 300 x 5000 outputs take
 * two of the narrow product's column panels; a whole_max of 4000 values sends its panels through the
 * rounded panels and depth blocks of the product. */
static void forward_case(int64_t n, int64_t oc, int64_t c, int64_t whole_max, bool bias) {
    dsc_tensor x = randn(n, c, 1.0f, 3), w = randn(oc, c, 0.5f, 4), b = randn(1, oc, 1.0f, 5);
    dsc_tensor b1 = dsc_tensor_view(b.data, DSC_DTYPE_F32, 1, &oc, DSC_CPU);
    for (int k = 0; k < 2; k++) {
        dsc_tensor wide = zeros(n, oc), narrow = packed(wide.data, n, oc, types[k]);
        const dsc_dtype was = dsc_kernels_set_matmul_dtype(types[k]);
        dsc_cpu_gemm_rounded_set_whole_max(whole_max);
        assert_ok(dsc_kernel_linear_forward(&wide, &x, &w, bias ? &b1 : NULL));
        assert_ok(dsc_kernel_linear_forward(&narrow, &x, &w, bias ? &b1 : NULL));
        dsc_cpu_gemm_rounded_set_whole_max(0);
        dsc_kernels_set_matmul_dtype(was);
        dsc_tensor want = packed(wide.data, n, oc, types[k]);
        assert_memory_equal(narrow.data, want.data, (size_t)(n * oc) * 2);
        free(want.data);
        free(narrow.data);
        dsc_tensor_free(&wide);
    }
    dsc_tensor_free(&x);
    dsc_tensor_free(&w);
    dsc_tensor_free(&b);
}

static void test_linear_forward(void **state) {
    (void)state;
    forward_case(300, 5000, 64, 0, true);
    forward_case(37, 700, 300, 4000, false);
    forward_case(5, 70, 40, 0, true); /* rows the f32 path streams */
}

/* dy stored in 2 bytes: dx and dw (rounded to the gradient type) those of the f32 kernel on dy's
 * widened values, bit for bit; a whole_max of 4000 takes the depth blocks (dx) and the tiles (dw). */
static void backward_case(int64_t n, int64_t oc, int64_t c, int64_t whole_max, dsc_dtype grads) {
    dsc_tensor x = randn(n, c, 1.0f, 6), w = randn(oc, c, 0.5f, 7), d = randn(n, oc, 0.25f, 8);
    for (int k = 0; k < 2; k++) {
        dsc_tensor narrow = packed(d.data, n, oc, types[k]), wide = widened(&narrow);
        dsc_tensor dx_n = zeros(n, c), dx_w = zeros(n, c), dw_n = randn(oc, c, 0.1f, 9),
                   dw_w = randn(oc, c, 0.1f, 9);
        const dsc_dtype was = dsc_kernels_set_matmul_dtype(types[k]), grad_was = dsc_kernels_set_grad_dtype(grads);
        dsc_cpu_gemm_rounded_set_whole_max(whole_max);
        assert_ok(dsc_kernel_linear_backward(&dx_n, &dw_n, NULL, &narrow, &x, &w));
        assert_ok(dsc_kernel_linear_backward(&dx_w, &dw_w, NULL, &wide, &x, &w));
        dsc_cpu_gemm_rounded_set_whole_max(0);
        dsc_kernels_set_grad_dtype(grad_was);
        dsc_kernels_set_matmul_dtype(was);
        assert_memory_equal(dx_n.data, dx_w.data, dsc_tensor_nbytes(&dx_n));
        assert_memory_equal(dw_n.data, dw_w.data, dsc_tensor_nbytes(&dw_n));
        free(narrow.data);
        dsc_tensor_free(&wide);
        dsc_tensor_free(&dx_n);
        dsc_tensor_free(&dx_w);
        dsc_tensor_free(&dw_n);
        dsc_tensor_free(&dw_w);
    }
    dsc_tensor_free(&x);
    dsc_tensor_free(&w);
    dsc_tensor_free(&d);
}

static void test_linear_backward(void **state) {
    (void)state;
    backward_case(40, 900, 48, 0, DSC_DTYPE_BF16);
    backward_case(40, 900, 48, 4000, DSC_DTYPE_BF16);
    backward_case(40, 900, 48, 4000, DSC_DTYPE_F32);
}

/* What the 2-byte tensors do not do, refused with what failed. */
static void test_refusals(void **state) {
    (void)state;
    const int64_t n = 4, oc = 6, c = 5;
    dsc_tensor x = randn(n, c, 1.0f, 1), w = randn(oc, c, 1.0f, 2), d = randn(n, oc, 1.0f, 3), b = zeros(1, oc);
    dsc_tensor b1 = dsc_tensor_view(b.data, DSC_DTYPE_F32, 1, &oc, DSC_CPU), dx = zeros(n, c), dw = zeros(oc, c);
    dsc_tensor narrow = packed(d.data, n, oc, DSC_DTYPE_BF16), db = b1;
    assert_err(dsc_kernel_linear_backward(&dx, &dw, &db, &narrow, &x, &w), DSC_ERR_UNSUPPORTED,
               "dbias from a bf16 dy");
    dsc_tensor act = zeros(n, oc);
    assert_err(dsc_kernel_linear_gelu_forward(&act, &narrow, &x, &w, &b1), DSC_ERR_INVALID, "argument y");
    dsc_tensor other = packed(d.data, n, oc, DSC_DTYPE_F16), tgt = targets(n, oc);
    assert_err(dsc_kernel_cross_entropy_backward(&other, &narrow, &tgt, 1.0f), DSC_ERR_INVALID, "dlogits");
    free(narrow.data);
    free(other.data);
    dsc_tensor_free(&x);
    dsc_tensor_free(&w);
    dsc_tensor_free(&d);
    dsc_tensor_free(&b);
    dsc_tensor_free(&dx);
    dsc_tensor_free(&dw);
    dsc_tensor_free(&act);
    dsc_tensor_free(&tgt);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_linear_forward),
        cmocka_unit_test(test_linear_backward),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
