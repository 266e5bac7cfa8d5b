/* One table of cases for every kernel operation (the model is ggml's
 * tests/test-backend-ops.cpp). A case builds its inputs from its own seed,
 * makes one public kernel call and names the backend table entry it
 * exercises; shapes include edge sizes (one element, empty tensors, extents
 * that are not a multiple of a block or a warp, in-place calls).
 *
 *   test_kernel_ops          every case on the CPU against the naive double
 *                            reference (ref_kernels.c, ref_backward.c)
 *   test_kernel_ops cuda     every case on cuda:0 against the same case on
 *                            the CPU (an entry the device's table lacks
 *                            fails, but for may_lack's); exits 77
 *                            (skipped) without a device
 *
 * Both modes first check coverage: a table entry of struct dsc_kernel_ops
 * with no case fails the test, so a new operation cannot go untested.
 * Not here: finite-difference checks of the references' gradients and
 * thread-count invariance (test_kernels_dense, _attention, _train), and
 * argument errors (test_kernels_errors). */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h"  /* struct dsc_kernel_ops: the entries to cover; the backends' tables */
#include "dsc/precision.h" /* 2-byte copies of a case's tensors */
#include "kernel_test_util.h"
#include "kernels/cpu/cpu_bf16_gemm.h" /* dsc_cpu_bf16_gemm_available: whether x is rounded to bf16 */
#include "kernels/cpu/cpu_gemm.h"      /* dsc_cpu_gemm_rounded_set_whole_max: panels of small products */
#include "kernels/cpu/cpu_kernels.h"   /* dsc_cpu_stream_max_rows: from how many rows x is */
#include "kernels/cpu/cpu_q8_gemm.h"   /* dsc_cpu_q8_gemm_available: whether prompts quantise x */
#include "kernels/cpu/cpu_simd.h"      /* dsc_cpu_simd_avx512: whether the forced 512-bit loops exist */
#include "ref_kernels.h"

#define MAX_TENSORS 16
#define MAX_SCALARS 4

/* One run of a case: the tensors it made (initial values kept on the host),
 * which of them are outputs, and the expected values (reference mode). */
typedef struct tc {
    dsc_device dev;
    bool ref; /* compute expected values with the reference */
    dsc_rng rng;
    int n;
    dsc_tensor init[MAX_TENSORS]; /* initial values, on the host */
    dsc_tensor t[MAX_TENSORS];    /* what the kernel sees, on dev */
    double *init_d[MAX_TENSORS];  /* initial values in double (f32 tensors) */
    double *want[MAX_TENSORS];    /* expected values of outputs; starts as the initial values */
    int nscalars;
    double scalar[MAX_SCALARS], scalar_want[MAX_SCALARS];
} tc;

static dsc_tensor *tc_add(tc *c, dsc_tensor host) {
    assert_true(c->n < MAX_TENSORS);
    int i = c->n++;
    c->init[i] = host;
    assert_ok(dsc_tensor_alloc(&c->t[i], host.dtype, host.ndim, host.shape, c->dev, DSC_MEM_OTHER));
    assert_ok(dsc_tensor_copy(&c->t[i], &host));
    c->init_d[i] = host.dtype == DSC_DTYPE_F32 ? kt_to_double(&host) : NULL;
    return &c->t[i];
}

static int tc_index(const tc *c, const dsc_tensor *t) {
    for (int i = 0; i < c->n; i++)
        if (&c->t[i] == t) return i;
    fail_msg("tensor not made by this case");
    return -1;
}

static dsc_tensor *tc_randn(tc *c, float scale, int ndim, const int64_t *shape) {
    return tc_add(c, kt_randn(&c->rng, scale, ndim, shape));
}
static dsc_tensor *tc_full(tc *c, float value, int ndim, const int64_t *shape) {
    return tc_add(c, kt_full(value, ndim, shape));
}
static dsc_tensor *tc_ints(tc *c, const int32_t *values, int ndim, const int64_t *shape) {
    return tc_add(c, kt_ints(values, ndim, shape));
}
static dsc_tensor *tc_values(tc *c, const double *values, int ndim, const int64_t *shape) {
    dsc_tensor host = kt_full(0.0f, ndim, shape);
    for (int64_t i = 0; i < dsc_tensor_numel(&host); i++)
        kt_f(&host)[i] = (float)values[i];
    return tc_add(c, host);
}
#define RANDN(c, scale, ...) tc_randn((c), (scale), KT_SHAPE(__VA_ARGS__))
#define FULL(c, value, ...) tc_full((c), (value), KT_SHAPE(__VA_ARGS__))

/* Initial values of t in double (f32) or as ids (i32). */
static const double *tc_in(const tc *c, const dsc_tensor *t) {
    return t ? c->init_d[tc_index(c, t)] : NULL;
}
static const int32_t *tc_ids(const tc *c, const dsc_tensor *t) {
    return (const int32_t *)c->init[tc_index(c, t)].data;
}

/* Marks t as an output; returns its expected values, initialised to t's
 * initial values so that accumulating references add into them. */
static double *tc_out(tc *c, const dsc_tensor *t) {
    int i = tc_index(c, t);
    if (!c->want[i]) {
        c->want[i] = kt_zeros_d(dsc_tensor_numel(t));
        memcpy(c->want[i], c->init_d[i], (size_t)dsc_tensor_numel(t) * sizeof(double));
    }
    return c->want[i];
}

static void tc_scalar(tc *c, double got, double want) {
    assert_true(c->nscalars < MAX_SCALARS);
    c->scalar[c->nscalars] = got;
    c->scalar_want[c->nscalars++] = want;
}

static void tc_free(tc *c) {
    for (int i = 0; i < c->n; i++) {
        dsc_tensor_free(&c->init[i]);
        dsc_tensor_free(&c->t[i]);
        free(c->init_d[i]);
        free(c->want[i]);
    }
}

/* ---- the cases: each makes its tensors, calls the kernel, and (reference
 * mode) computes the expected outputs from the initial values ---------------- */

typedef void (*case_fn)(tc *c, const int64_t *a);

/* a: m, n, k, trans_a, trans_b, batch (0: 2-D). alpha 0.5, beta 1, bias. */
static void case_gemm(tc *c, const int64_t *a) {
    int64_t m = a[0], n = a[1], k = a[2], bt = a[5];
    bool ta = a[3], tb = a[4];
    int64_t sa[3] = {bt, ta ? k : m, ta ? m : k}, sb[3] = {bt, tb ? n : k, tb ? k : n}, so[3] = {bt, m, n};
    int nd = bt ? 3 : 2, o = bt ? 0 : 1;
    dsc_tensor *x = tc_randn(c, 1.0f, nd, sa + o), *y = tc_randn(c, 1.0f, nd, sb + o);
    dsc_tensor *out = tc_randn(c, 1.0f, nd, so + o), *bias = RANDN(c, 1.0f, n);
    assert_ok(dsc_kernel_gemm(out, x, y, bias, ta, tb, 0.5f, 1.0f));
    double *want = tc_out(c, out);
    if (c->ref) ref_gemm(want, tc_in(c, x), tc_in(c, y), tc_in(c, bias), bt ? bt : 1, m, n, k, ta, tb, 0.5, 1.0);
}

/* The value of element j of a packed weight row, widened in double by the
 * format's definition (dsc/kernels.h), not by the kernels' code. */
static double packed_value(const uint8_t *row, dsc_weight_format f, int64_t j) {
    uint16_t h;
    switch (f) {
    case DSC_WEIGHT_BF16:
        memcpy(&h, row + 2 * j, 2);
        return dsc_bf16_to_f32(h);
    case DSC_WEIGHT_F16:
        memcpy(&h, row + 2 * j, 2);
        return dsc_f16_to_f32(h);
    case DSC_WEIGHT_Q8_0:
        memcpy(&h, row + (j / 32) * 34, 2);
        return (double)dsc_f16_to_f32(h) * (int8_t)row[(j / 32) * 34 + 2 + j % 32];
    default: {
        float v;
        memcpy(&v, row + 4 * j, 4);
        return v;
    }
    }
}

/* x as a Q8_0 weight streams it (up to DSC_CPU_STREAM_MAX_ROWS rows, any number on AVX-512 VNNI):
 * quantised by llama.cpp's rule
 * (per block of 32, d = max|x| / 127 kept as f16, q = x / d rounded half away from zero), widened. */
static double *q8_0_activations(const double *x, int64_t n, int64_t ch) {
    double *q = kt_zeros_d(n * ch);
    for (int64_t b = 0; b < n * ch / 32; b++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf((float)x[b * 32 + j]));
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++)
            q[b * 32 + j] = (double)dsc_f16_to_f32(dsc_f32_to_f16(d)) * roundf((float)x[b * 32 + j] * id);
    }
    return q;
}

/* x as the bf16 dot multiplies it (more rows than streaming takes, on AVX-512 BF16): rounded to bf16. */
static double *bf16_activations(const double *x, int64_t n) {
    double *r = kt_zeros_d(n);
    for (int64_t i = 0; i < n; i++)
        r[i] = dsc_bf16_to_f32(dsc_f32_to_bf16((float)x[i]));
    return r;
}

/* a: rows, out channels, in channels, format, bias, workspace threads (panels of widened rows). */
static void case_linear_packed(tc *c, const int64_t *a) {
    int64_t n = a[0], oc = a[1], ch = a[2];
    dsc_weight_format f = (dsc_weight_format)a[3];
    dsc_tensor src = kt_randn(&c->rng, 1.0f, KT_SHAPE(oc, ch)), packed;
    int64_t shape[2] = {oc, dsc_weight_cols(f, ch)};
    assert_ok(dsc_tensor_alloc(&packed, dsc_weight_dtype(f), 2, shape, DSC_CPU, DSC_MEM_OTHER));
    assert_ok(dsc_weight_pack(packed.data, f, kt_f(&src), oc, ch));
    dsc_tensor_free(&src);
    dsc_tensor *w = tc_add(c, packed), *x = RANDN(c, 1.0f, n, ch), *y = FULL(c, 0.0f, n, oc);
    dsc_tensor *bias = a[4] ? RANDN(c, 1.0f, oc) : NULL;
    int64_t ws = dsc_kernel_linear_packed_workspace(f, ch, (int)a[5]);
    dsc_tensor *work = ws ? FULL(c, 0.0f, ws) : NULL;
    assert_ok(dsc_kernel_linear_forward_packed(y, x, w, bias, work));
    double *want = tc_out(c, y);
    if (!c->ref) return;
    double *wide = kt_zeros_d(oc * ch);
    size_t rb = dsc_weight_row_bytes(f, ch);
    for (int64_t r = 0; r < oc; r++)
        for (int64_t j = 0; j < ch; j++)
            wide[r * ch + j] = packed_value((const uint8_t *)c->init[tc_index(c, w)].data + r * rb, f, j);
    double *xq = f == DSC_WEIGHT_Q8_0 && (n <= 32 || dsc_cpu_q8_gemm_available())
                     ? q8_0_activations(tc_in(c, x), n, ch)
                 : f == DSC_WEIGHT_BF16 && n > dsc_cpu_stream_max_rows(f) && dsc_cpu_bf16_gemm_available()
                     ? bf16_activations(tc_in(c, x), n * ch)
                     : NULL;
    ref_gemm(want, xq ? xq : tc_in(c, x), wide, tc_in(c, bias), 1, n, oc, ch, false, true, 1.0, 0.0);
    free(xq);
    free(wide);
}

/* A case's product type: 0 f32, 1 bf16, 2 fp16 (dsc_kernels_set_matmul_dtype). */
static dsc_dtype products_of(int64_t code) {
    return code == 1 ? DSC_DTYPE_BF16 : code == 2 ? DSC_DTYPE_F16 : DSC_DTYPE_F32;
}

/* An operand as the kernel multiplies it in `products`: rounded to bf16 / fp16 (by the scalar
 * conversions of core/tensor.c), or as given. */
static double *operand(const tc *c, const dsc_tensor *t, dsc_dtype products) {
    int64_t n = dsc_tensor_numel(t);
    if (products == DSC_DTYPE_BF16) return bf16_activations(tc_in(c, t), n);
    double *r = kt_zeros_d(n);
    memcpy(r, tc_in(c, t), (size_t)n * sizeof *r);
    for (int64_t i = 0; products == DSC_DTYPE_F16 && i < n; i++)
        r[i] = dsc_f16_to_f32(dsc_f32_to_f16((float)r[i]));
    return r;
}

/* v rounded to `dtype` (bf16 / fp16) by the scalar conversions of core/tensor.c. */
static double rounded_to(double v, dsc_dtype dtype) {
    return dtype == DSC_DTYPE_BF16 ? dsc_bf16_to_f32(dsc_f32_to_bf16((float)v))
                                   : dsc_f16_to_f32(dsc_f32_to_f16((float)v));
}

/* Called twice from zeros under dsc_kernels_set_grad_dtype(dtype), a reduced-type gradient kernel
 * must leave twice a value of the type: want (the reference's f32-free sums) becomes 2 round(want),
 * and every output's half is checked to be a value of the type, which f32 sums added as they are
 * (no rounding) or a second call that overwrote (no accumulation) would not give. */
static void expect_twice_rounded(tc *c, const dsc_tensor *out, double *want, dsc_dtype dtype) {
    for (int64_t i = 0; i < dsc_tensor_numel(out); i++) { /* a CPU case: out is in host memory */
        double half = kt_f(out)[i] / 2.0;
        assert_true(half == rounded_to(half, dtype));
        if (c->ref) want[i] = 2.0 * rounded_to(want[i], dtype);
    }
}

/* a: m, n, k, trans_a, trans_b, beta, product type, and where not 0 the most values an operand is
 * rounded whole in (dsc_cpu_gemm_rounded_set_whole_max: small, so that these products take the
 * panels or the depth blocks a large one does). dsc_kernel_gemm with this thread's products in
 * bf16 / fp16: both operands rounded, f32 sums (AVX-512 BF16's dot for prompt-sized bf16 products,
 * else rounded copies). */
static void case_gemm_rounded(tc *c, const int64_t *a) {
    int64_t m = a[0], n = a[1], k = a[2];
    bool ta = a[3], tb = a[4];
    float beta = (float)a[5];
    dsc_dtype products = products_of(a[6]);
    dsc_tensor *x = ta ? RANDN(c, 1.0f, k, m) : RANDN(c, 1.0f, m, k);
    dsc_tensor *y = tb ? RANDN(c, 1.0f, n, k) : RANDN(c, 1.0f, k, n);
    dsc_tensor *out = RANDN(c, 1.0f, m, n), *bias = RANDN(c, 1.0f, n);
    dsc_dtype was = dsc_kernels_set_matmul_dtype(products);
    dsc_cpu_gemm_rounded_set_whole_max(a[7]);
    dsc_status s = dsc_kernel_gemm(out, x, y, bias, ta, tb, 0.5f, beta);
    dsc_cpu_gemm_rounded_set_whole_max(0);
    dsc_kernels_set_matmul_dtype(was);
    assert_ok(s);
    double *want = tc_out(c, out);
    if (!c->ref) return;
    double *xr = operand(c, x, products), *yr = operand(c, y, products);
    ref_gemm(want, xr, yr, tc_in(c, bias), 1, m, n, k, ta, tb, 0.5, beta);
    free(xr);
    free(yr);
}

/* Each output a kernel rounds to `products` (bf16 / fp16) must be a value of the type within half an
 * ulp (and f32's noise) of the reference's unrounded value, which then takes the kernel's: under
 * bf16 / fp16 products linear_gelu rounds y before its GELU, so act is checked to be the GELU of
 * the rounded y (the unrounded one's is 1e-3 away); the 2-byte outputs below are rounded once. */
static void expect_rounded(const dsc_tensor *y, double *want, dsc_dtype products) {
    const double half_ulp = products == DSC_DTYPE_BF16 ? 0x1p-9 : 0x1p-12;
    for (int64_t i = 0; i < dsc_tensor_numel(y); i++) {
        const double got = kt_f(y)[i];
        assert_true(got == rounded_to(got, products));
        assert_true(fabs(got - want[i]) <= half_ulp * 2.0 * fabs(want[i]) * 1.01 + 1e-5);
        want[i] = got;
    }
}

/* a: rows, out channels, in channels, bias, product type, the most values rounded whole (0: the
 * default; as case_gemm_rounded). y and act = gelu(y) against the GEMM and GELU apart. */
static void case_linear_gelu(tc *c, const int64_t *a) {
    int64_t n = a[0], oc = a[1], ch = a[2];
    dsc_tensor *x = RANDN(c, 1.0f, n, ch), *w = RANDN(c, 0.5f, oc, ch), *bias = a[3] ? RANDN(c, 1.0f, oc) : NULL;
    dsc_tensor *y = FULL(c, 0.0f, n, oc), *act = FULL(c, 0.0f, n, oc);
    dsc_dtype was = dsc_kernels_set_matmul_dtype(products_of(a[4]));
    dsc_cpu_gemm_rounded_set_whole_max(a[5]);
    dsc_status s = dsc_kernel_linear_gelu_forward(act, y, x, w, bias);
    dsc_cpu_gemm_rounded_set_whole_max(0);
    dsc_kernels_set_matmul_dtype(was);
    assert_ok(s);
    double *want_y = tc_out(c, y), *want_act = tc_out(c, act);
    if (!c->ref) return;
    double *xr = operand(c, x, products_of(a[4])), *wr = operand(c, w, products_of(a[4]));
    ref_gemm(want_y, xr, wr, tc_in(c, bias), 1, n, oc, ch, false, true, 1.0, 0.0);
    if (a[4]) expect_rounded(y, want_y, products_of(a[4]));
    ref_gelu(want_act, want_y, n * oc);
    free(xr);
    free(wr);
}

/* A host copy of f32 t (a CPU case's) stored in 2 bytes of `type`: free its data with free(). */
static dsc_tensor narrow_copy(const dsc_tensor *t, dsc_dtype type) {
    const int64_t n = dsc_tensor_numel(t);
    dsc_tensor r = dsc_tensor_view(malloc((size_t)(n > 0 ? n : 1) * 2), type, t->ndim, t->shape, DSC_CPU);
    dsc_precision_pack_to(r.data, t->data, n, type);
    return r;
}

/* f32 tensor `out` (the case's output) = the values of 2-byte `narrow`. */
static void widen_to(dsc_tensor *out, const dsc_tensor *narrow) {
    dsc_precision_unpack(out->data, narrow->data, dsc_tensor_numel(out), narrow->dtype);
}

/* a: rows, out channels, in channels, bias, product type (1 bf16, 2 fp16: also y's), the most values
 * rounded whole (0: the default). y stored in 2 bytes (mixed precision's logits): each sum rounded
 * once, checked in `y_seen`, its widened values. */
static void case_linear_narrow_y(tc *c, const int64_t *a) {
    int64_t n = a[0], oc = a[1], ch = a[2];
    const dsc_dtype type = products_of(a[4]);
    dsc_tensor *x = RANDN(c, 1.0f, n, ch), *w = RANDN(c, 0.5f, oc, ch), *bias = a[3] ? RANDN(c, 1.0f, oc) : NULL;
    dsc_tensor *y_seen = FULL(c, 0.0f, n, oc), y = narrow_copy(y_seen, type);
    const dsc_dtype was = dsc_kernels_set_matmul_dtype(type);
    dsc_cpu_gemm_rounded_set_whole_max(a[5]);
    dsc_status s = dsc_kernel_linear_forward(&y, x, w, bias);
    dsc_cpu_gemm_rounded_set_whole_max(0);
    dsc_kernels_set_matmul_dtype(was);
    assert_ok(s);
    widen_to(y_seen, &y);
    free(y.data);
    double *want = tc_out(c, y_seen);
    if (!c->ref) return;
    double *xr = operand(c, x, type), *wr = operand(c, w, type);
    ref_gemm(want, xr, wr, tc_in(c, bias), 1, n, oc, ch, false, true, 1.0, 0.0);
    expect_rounded(y_seen, want, type);
    free(xr);
    free(wr);
}

/* a: rows, out channels, in channels, product type (also dy's and the gradients'), the most values
 * rounded whole. dy stored in 2 bytes (the logits' gradient): dx, and dw rounded from zeros, called
 * twice (expect_twice_rounded). */
static void case_linear_backward_narrow_dy(tc *c, const int64_t *a) {
    int64_t rows = a[0], oc = a[1], ch = a[2];
    const dsc_dtype type = products_of(a[3]);
    dsc_tensor *dy32 = RANDN(c, 1.0f, rows, oc), *x = RANDN(c, 1.0f, rows, ch), *w = RANDN(c, 1.0f, oc, ch);
    dsc_tensor *dx = FULL(c, 0.0f, rows, ch), *dw = FULL(c, 0.0f, oc, ch), dy = narrow_copy(dy32, type);
    const dsc_dtype was_grads = dsc_kernels_set_grad_dtype(type), was = dsc_kernels_set_matmul_dtype(type);
    dsc_cpu_gemm_rounded_set_whole_max(a[4]);
    dsc_status s = dsc_kernel_linear_backward(dx, dw, NULL, &dy, x, w);
    if (!s) s = dsc_kernel_linear_backward(dx, dw, NULL, &dy, x, w);
    dsc_cpu_gemm_rounded_set_whole_max(0);
    dsc_kernels_set_matmul_dtype(was);
    dsc_kernels_set_grad_dtype(was_grads);
    free(dy.data);
    assert_ok(s);
    double *want_dx = tc_out(c, dx), *want_dw = tc_out(c, dw);
    if (c->ref) {
        double *dyr = operand(c, dy32, type), *xr = operand(c, x, type), *wr = operand(c, w, type);
        ref_gemm(want_dx, dyr, wr, NULL, 1, rows, ch, oc, false, false, 1.0, 0.0);
        ref_gemm(want_dw, dyr, xr, NULL, 1, oc, ch, rows, true, false, 1.0, 0.0);
        free(dyr);
        free(xr);
        free(wr);
    }
    expect_twice_rounded(c, dw, want_dw, type);
}

/* a: rows, out channels. Only dbias is asked for, so only the bias entry runs. */
static void case_linear_bias(tc *c, const int64_t *a) {
    int64_t rows = a[0], oc = a[1];
    dsc_tensor *dy = RANDN(c, 1.0f, rows, oc), *x = RANDN(c, 1.0f, rows, 5), *w = RANDN(c, 1.0f, oc, 5);
    dsc_tensor *db = FULL(c, 0.5f, oc);
    assert_ok(dsc_kernel_linear_backward(NULL, NULL, db, dy, x, w));
    double *want = tc_out(c, db);
    if (c->ref) ref_bias_grad(want, tc_in(c, dy), rows, oc);
}

/* a: rows, out channels, in channels, bias, gradient type, product type, the most values rounded
 * whole (0: the default; as case_gemm_rounded). dw and dbias of dsc_kernel_linear_backward under
 * dsc_kernels_set_grad_dtype, from zeros, called twice. */
static void case_linear_grads_rounded(tc *c, const int64_t *a) {
    int64_t rows = a[0], oc = a[1], ch = a[2];
    dsc_dtype grads = products_of(a[4]), products = products_of(a[5]);
    dsc_tensor *dy = RANDN(c, 1.0f, rows, oc), *x = RANDN(c, 1.0f, rows, ch), *w = RANDN(c, 1.0f, oc, ch);
    dsc_tensor *dw = FULL(c, 0.0f, oc, ch), *db = a[3] ? FULL(c, 0.0f, oc) : NULL;
    dsc_dtype was_grads = dsc_kernels_set_grad_dtype(grads), was = dsc_kernels_set_matmul_dtype(products);
    dsc_cpu_gemm_rounded_set_whole_max(a[6]);
    dsc_status s = dsc_kernel_linear_backward(NULL, dw, db, dy, x, w);
    if (!s) s = dsc_kernel_linear_backward(NULL, dw, db, dy, x, w);
    dsc_cpu_gemm_rounded_set_whole_max(0);
    dsc_kernels_set_matmul_dtype(was);
    dsc_kernels_set_grad_dtype(was_grads);
    assert_ok(s);
    double *want = tc_out(c, dw), *want_b = db ? tc_out(c, db) : NULL;
    if (c->ref) {
        double *dyr = operand(c, dy, products), *xr = operand(c, x, products);
        ref_gemm(want, dyr, xr, NULL, 1, oc, ch, rows, true, false, 1.0, 0.0);
        if (db) ref_bias_grad(want_b, tc_in(c, dy), rows, oc);
        free(dyr);
        free(xr);
    }
    expect_twice_rounded(c, dw, want, grads);
    if (db) expect_twice_rounded(c, db, want_b, grads);
}

/* a: rows, channels, rms (0: LayerNorm). */
static void case_norm_forward(tc *c, const int64_t *a) {
    int64_t n = a[0], ch = a[1];
    dsc_tensor *x = RANDN(c, 2.0f, n, ch), *w = RANDN(c, 1.0f, ch), *b = RANDN(c, 1.0f, ch);
    dsc_tensor *out = FULL(c, 0.0f, n, ch), *mean = FULL(c, 0.0f, n), *rstd = FULL(c, 0.0f, n);
    if (a[2]) {
        assert_ok(dsc_kernel_rmsnorm_forward(out, rstd, x, w, 1e-5f));
        if (c->ref) ref_rmsnorm(tc_out(c, out), tc_out(c, rstd), tc_in(c, x), tc_in(c, w), n, ch, 1e-5);
    } else {
        assert_ok(dsc_kernel_layernorm_forward(out, mean, rstd, x, w, b, 1e-5f));
        if (c->ref)
            ref_layernorm(tc_out(c, out), tc_out(c, mean), tc_out(c, rstd), tc_in(c, x), tc_in(c, w), tc_in(c, b),
                          n, ch, 1e-5);
    }
    tc_out(c, out), tc_out(c, rstd);
    if (!a[2]) tc_out(c, mean);
}

/* a: rows, channels, rms. The saved statistics are the reference's of x. */
static void case_norm_backward(tc *c, const int64_t *a) {
    int64_t n = a[0], ch = a[1];
    bool rms = a[2];
    dsc_tensor *x = RANDN(c, 2.0f, n, ch), *w = RANDN(c, 1.0f, ch), *dout = RANDN(c, 1.0f, n, ch);
    double *y = kt_zeros_d(n * ch), *mu = kt_zeros_d(n), *rs = kt_zeros_d(n);
    if (rms)
        ref_rmsnorm(y, rs, tc_in(c, x), tc_in(c, w), n, ch, 1e-5);
    else
        ref_layernorm(y, mu, rs, tc_in(c, x), tc_in(c, w), NULL, n, ch, 1e-5);
    dsc_tensor *mean = tc_values(c, mu, KT_SHAPE(n)), *rstd = tc_values(c, rs, KT_SHAPE(n));
    dsc_tensor *dx = FULL(c, 0.0f, n, ch), *dw = FULL(c, 0.5f, ch), *db = FULL(c, 0.5f, ch);
    if (rms)
        assert_ok(dsc_kernel_rmsnorm_backward(dx, dw, dout, x, w, rstd));
    else
        assert_ok(dsc_kernel_layernorm_backward(dx, dw, db, dout, x, w, mean, rstd));
    double *want_dx = tc_out(c, dx), *want_dw = tc_out(c, dw), *want_db = rms ? NULL : tc_out(c, db);
    if (c->ref && rms)
        ref_rmsnorm_backward(want_dx, want_dw, tc_in(c, dout), tc_in(c, x), tc_in(c, w), tc_in(c, rstd), n, ch);
    else if (c->ref)
        ref_layernorm_backward(want_dx, want_dw, want_db, tc_in(c, dout), tc_in(c, x), tc_in(c, w), tc_in(c, mean),
                               tc_in(c, rstd), n, ch);
    free(y), free(mu), free(rs);
}

enum { GELU, SILU, SWIGLU };

/* a: rows, cols, which activation. */
static void case_activation(tc *c, const int64_t *a) {
    int64_t r = a[0], k = a[1], n = r * k;
    dsc_tensor *x = RANDN(c, 2.0f, r, k), *up = RANDN(c, 1.0f, r, k), *out = FULL(c, 0.0f, r, k);
    double *want = tc_out(c, out);
    switch (a[2]) {
    case GELU:
        assert_ok(dsc_kernel_gelu_forward(out, x));
        break;
    case SILU:
        assert_ok(dsc_kernel_silu_forward(out, x));
        break;
    default:
        assert_ok(dsc_kernel_swiglu_forward(out, x, up));
        break;
    }
    if (!c->ref) return;
    switch (a[2]) {
    case GELU:
        ref_gelu(want, tc_in(c, x), n);
        break;
    case SILU:
        ref_silu(want, tc_in(c, x), n);
        break;
    default:
        ref_swiglu(want, tc_in(c, x), tc_in(c, up), n);
        break;
    }
}

static void case_activation_backward(tc *c, const int64_t *a) {
    int64_t r = a[0], k = a[1], n = r * k;
    dsc_tensor *x = RANDN(c, 2.0f, r, k), *up = RANDN(c, 1.0f, r, k), *dout = RANDN(c, 1.0f, r, k);
    dsc_tensor *dx = FULL(c, 0.0f, r, k), *dup = FULL(c, 0.0f, r, k);
    double *want = tc_out(c, dx), *want_up = a[2] == SWIGLU ? tc_out(c, dup) : NULL;
    switch (a[2]) {
    case GELU:
        assert_ok(dsc_kernel_gelu_backward(dx, dout, x));
        break;
    case SILU:
        assert_ok(dsc_kernel_silu_backward(dx, dout, x));
        break;
    default:
        assert_ok(dsc_kernel_swiglu_backward(dx, dup, dout, x, up));
        break;
    }
    if (!c->ref) return;
    switch (a[2]) {
    case GELU:
        ref_gelu_backward(want, tc_in(c, dout), tc_in(c, x), n);
        break;
    case SILU:
        ref_silu_backward(want, tc_in(c, dout), tc_in(c, x), n);
        break;
    default:
        ref_swiglu_backward(want, want_up, tc_in(c, dout), tc_in(c, x), tc_in(c, up), n);
        break;
    }
}

/* a: rows, cols, in place. */
static void case_softmax(tc *c, const int64_t *a) {
    dsc_tensor *x = RANDN(c, 3.0f, a[0], a[1]), *out = a[2] ? x : FULL(c, 0.0f, a[0], a[1]);
    assert_ok(dsc_kernel_softmax(out, x));
    double *want = tc_out(c, out);
    if (c->ref) ref_softmax(want, tc_in(c, x), a[0], a[1]);
}

/* a: B, T, NH, NKV, HS. */
static void case_attention(tc *c, const int64_t *a) {
    int64_t b = a[0], t = a[1], nh = a[2], nkv = a[3], hs = a[4];
    dsc_tensor *q = RANDN(c, 1.0f, b, t, nh, hs), *k = RANDN(c, 1.0f, b, t, nkv, hs);
    dsc_tensor *v = RANDN(c, 1.0f, b, t, nkv, hs), *out = FULL(c, 0.0f, b, t, nh, hs),
               *lse = FULL(c, 0.0f, b, nh, t);
    assert_ok(dsc_kernel_attention_forward(out, lse, q, k, v));
    double *want = tc_out(c, out), *want_lse = tc_out(c, lse);
    if (c->ref) ref_attention(want, want_lse, tc_in(c, q), tc_in(c, k), tc_in(c, v), b, t, nh, nkv, hs, NULL);
}

/* a: B, T, NH, NKV, HS. out and lse are the reference forward's. */
static void case_attention_backward(tc *c, const int64_t *a) {
    int64_t b = a[0], t = a[1], nh = a[2], nkv = a[3], hs = a[4];
    dsc_tensor *q = RANDN(c, 1.0f, b, t, nh, hs), *k = RANDN(c, 1.0f, b, t, nkv, hs);
    dsc_tensor *v = RANDN(c, 1.0f, b, t, nkv, hs), *dout = RANDN(c, 1.0f, b, t, nh, hs);
    double *o = kt_zeros_d(b * t * nh * hs), *l = kt_zeros_d(b * nh * t);
    ref_attention(o, l, tc_in(c, q), tc_in(c, k), tc_in(c, v), b, t, nh, nkv, hs, NULL);
    dsc_tensor *out = tc_values(c, o, KT_SHAPE(b, t, nh, hs)), *lse = tc_values(c, l, KT_SHAPE(b, nh, t));
    dsc_tensor *dq = FULL(c, 0.0f, b, t, nh, hs), *dk = FULL(c, 0.0f, b, t, nkv, hs),
               *dv = FULL(c, 0.0f, b, t, nkv, hs);
    assert_ok(dsc_kernel_attention_backward(dq, dk, dv, dout, q, k, v, out, lse));
    double *wq = tc_out(c, dq), *wk = tc_out(c, dk), *wv = tc_out(c, dv);
    if (c->ref)
        ref_attention_backward(wq, wk, wv, tc_in(c, dout), tc_in(c, q), tc_in(c, k), tc_in(c, v), b, t, nh, nkv,
                               hs, NULL);
    free(o), free(l);
}

/* a: B, T, NH, HS, inverse, in place. Positions reach 1e5 (angles need double). */
static void case_rope(tc *c, const int64_t *a) {
    int64_t b = a[0], t = a[1], nh = a[2], hs = a[3];
    int32_t *pos = malloc((size_t)t * sizeof *pos);
    for (int64_t i = 0; i < t; i++)
        pos[i] = (int32_t)((i * 7919) % 100003);
    dsc_tensor *p = tc_ints(c, pos, KT_SHAPE(t)), *x = RANDN(c, 1.0f, b, t, nh, hs);
    dsc_tensor *out = a[5] ? x : FULL(c, 0.0f, b, t, nh, hs);
    assert_ok(dsc_kernel_rope(out, x, p, 10000.0f, a[4]));
    double *want = tc_out(c, out);
    if (c->ref) ref_rope(want, tc_in(c, x), pos, b, t, nh, hs, 10000.0, a[4]);
    free(pos);
}

/* Ids with repeats, in [0, v). */
static dsc_tensor *ids(tc *c, int64_t b, int64_t t, int64_t v) {
    int32_t *id = malloc((size_t)(b * t) * sizeof *id);
    for (int64_t i = 0; i < b * t; i++)
        id[i] = (int32_t)((i * 3 + i / 2) % v);
    dsc_tensor *tok = tc_ints(c, id, KT_SHAPE(b, t));
    free(id);
    return tok;
}

/* a: B, T, V, C, with wpe, product type (bf16 / fp16: the gathered rows read rounded). */
static void case_embedding(tc *c, const int64_t *a) {
    int64_t b = a[0], t = a[1], v = a[2], ch = a[3];
    dsc_tensor *tok = ids(c, b, t, v), *wte = RANDN(c, 1.0f, v, ch);
    dsc_tensor *wpe = a[4] ? RANDN(c, 1.0f, t + 2, ch) : NULL, *out = FULL(c, 0.0f, b, t, ch);
    dsc_dtype was = dsc_kernels_set_matmul_dtype(products_of(a[5]));
    dsc_status s = dsc_kernel_embedding_forward(out, tok, wte, wpe);
    dsc_kernels_set_matmul_dtype(was);
    assert_ok(s);
    double *want = tc_out(c, out);
    if (!c->ref) return;
    double *te = operand(c, wte, products_of(a[5])), *pe = wpe ? operand(c, wpe, products_of(a[5])) : NULL;
    ref_embedding(want, tc_ids(c, tok), te, pe, b * t, t, ch);
    free(te);
    free(pe);
}

static void case_embedding_backward(tc *c, const int64_t *a) {
    int64_t b = a[0], t = a[1], v = a[2], ch = a[3];
    dsc_tensor *tok = ids(c, b, t, v), *dout = RANDN(c, 1.0f, b, t, ch), *dwte = FULL(c, 0.5f, v, ch);
    dsc_tensor *dwpe = a[4] ? FULL(c, 0.5f, t + 2, ch) : NULL;
    assert_ok(dsc_kernel_embedding_backward(dwte, dwpe, dout, tok));
    double *want = tc_out(c, dwte), *want_pe = dwpe ? tc_out(c, dwpe) : NULL;
    if (c->ref) ref_embedding_backward(want, want_pe, tc_in(c, dout), tc_ids(c, tok), b * t, t, ch);
}

/* a: B, T, V, C, wpe, gradient type. Each row's sum rounded, from zeros, called twice. */
static void case_embedding_backward_rounded(tc *c, const int64_t *a) {
    int64_t b = a[0], t = a[1], v = a[2], ch = a[3];
    dsc_dtype grads = products_of(a[5]);
    dsc_tensor *tok = ids(c, b, t, v), *dout = RANDN(c, 1.0f, b, t, ch), *dwte = FULL(c, 0.0f, v, ch);
    dsc_tensor *dwpe = a[4] ? FULL(c, 0.0f, t + 2, ch) : NULL;
    dsc_dtype was = dsc_kernels_set_grad_dtype(grads);
    dsc_status s = dsc_kernel_embedding_backward(dwte, dwpe, dout, tok);
    if (!s) s = dsc_kernel_embedding_backward(dwte, dwpe, dout, tok);
    dsc_kernels_set_grad_dtype(was);
    assert_ok(s);
    double *want = tc_out(c, dwte), *want_pe = dwpe ? tc_out(c, dwpe) : NULL;
    if (c->ref) ref_embedding_backward(want, want_pe, tc_in(c, dout), tc_ids(c, tok), b * t, t, ch);
    expect_twice_rounded(c, dwte, want, grads);
    if (dwpe) expect_twice_rounded(c, dwpe, want_pe, grads);
}

/* Targets in [0, v), every fifth ignored (negative). */
static dsc_tensor *targets(tc *c, int64_t n, int64_t v) {
    int32_t *id = malloc((size_t)n * sizeof *id);
    for (int64_t i = 0; i < n; i++)
        id[i] = i % 5 == 1 ? (i % 2 ? -1 : -100) : (int32_t)((i * 7) % v);
    dsc_tensor *tgt = tc_ints(c, id, KT_SHAPE(n));
    free(id);
    return tgt;
}

/* a: rows, vocabulary. */
static void case_cross_entropy(tc *c, const int64_t *a) {
    int64_t n = a[0], v = a[1];
    dsc_tensor *logits = RANDN(c, 3.0f, n, v), *tgt = targets(c, n, v), *losses = FULL(c, 0.0f, n);
    assert_ok(dsc_kernel_cross_entropy_forward(losses, logits, tgt));
    double *want = tc_out(c, losses);
    if (c->ref) ref_cross_entropy(want, tc_in(c, logits), tc_ids(c, tgt), n, v);
}

/* a: rows, vocabulary, in place (dlogits aliases logits). */
static void case_cross_entropy_backward(tc *c, const int64_t *a) {
    int64_t n = a[0], v = a[1];
    dsc_tensor *logits = RANDN(c, 3.0f, n, v), *tgt = targets(c, n, v);
    dsc_tensor *dlogits = a[2] ? logits : FULL(c, 0.0f, n, v);
    assert_ok(dsc_kernel_cross_entropy_backward(dlogits, logits, tgt, 0.125f));
    double *want = tc_out(c, dlogits);
    if (c->ref) ref_cross_entropy_backward(want, tc_in(c, logits), tc_ids(c, tgt), n, v, 0.125);
}

/* a: rows, vocabulary, type (1 bf16, 2 fp16). Logits stored in 2 bytes: the losses of their values. */
static void case_cross_entropy_narrow(tc *c, const int64_t *a) {
    int64_t n = a[0], v = a[1];
    const dsc_dtype type = products_of(a[2]);
    dsc_tensor *logits = RANDN(c, 3.0f, n, v), *tgt = targets(c, n, v), *losses = FULL(c, 0.0f, n);
    dsc_tensor narrow = narrow_copy(logits, type);
    dsc_status s = dsc_kernel_cross_entropy_forward(losses, &narrow, tgt);
    free(narrow.data);
    assert_ok(s);
    double *want = tc_out(c, losses);
    if (!c->ref) return;
    double *lr = operand(c, logits, type);
    ref_cross_entropy(want, lr, tc_ids(c, tgt), n, v);
    free(lr);
}

/* a: rows, vocabulary, in place, type. The gradient of 2-byte logits, written rounded (seen widened
 * in `seen`). */
static void case_cross_entropy_backward_narrow(tc *c, const int64_t *a) {
    int64_t n = a[0], v = a[1];
    const dsc_dtype type = products_of(a[3]);
    dsc_tensor *logits = RANDN(c, 3.0f, n, v), *tgt = targets(c, n, v), *seen = FULL(c, 0.0f, n, v);
    dsc_tensor narrow = narrow_copy(logits, type), apart = narrow_copy(seen, type);
    dsc_tensor *d = a[2] ? &narrow : &apart;
    dsc_status s = dsc_kernel_cross_entropy_backward(d, &narrow, tgt, 0.125f);
    if (!s) widen_to(seen, d);
    free(narrow.data);
    free(apart.data);
    assert_ok(s);
    double *want = tc_out(c, seen);
    if (!c->ref) return;
    double *lr = operand(c, logits, type);
    ref_cross_entropy_backward(want, lr, tc_ids(c, tgt), n, v, 0.125);
    expect_rounded(seen, want, type);
    free(lr);
}

/* a: n, steps. */
static void case_adamw(tc *c, const int64_t *a) {
    int64_t n = a[0];
    dsc_tensor *p = RANDN(c, 1.0f, n), *g = RANDN(c, 0.1f, n), *m = FULL(c, 0.0f, n), *v = FULL(c, 0.0f, n);
    double *wp = tc_out(c, p), *wm = tc_out(c, m), *wv = tc_out(c, v);
    for (int64_t step = 1; step <= a[1]; step++) {
        assert_ok(dsc_kernel_adamw(p, g, m, v, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step));
        if (c->ref) ref_adamw(wp, tc_in(c, g), wm, wv, n, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step);
    }
}

/* a: n, steps, momentum (x10). */
static void case_sgd(tc *c, const int64_t *a) {
    int64_t n = a[0];
    float momentum = (float)a[2] / 10;
    dsc_tensor *p = RANDN(c, 1.0f, n), *g = RANDN(c, 0.1f, n), *buf = FULL(c, 0.0f, n);
    double *wp = tc_out(c, p), *wb = kt_zeros_d(n);
    for (int64_t step = 1; step <= a[1]; step++) {
        assert_ok(dsc_kernel_sgd(p, g, buf, 0.1f, momentum, 0.01f, step));
        if (c->ref) ref_sgd(wp, tc_in(c, g), wb, n, 0.1f, momentum, 0.01f, step);
    }
    free(wb);
}

/* a: n, steps. */
static void case_lion(tc *c, const int64_t *a) {
    int64_t n = a[0];
    dsc_tensor *p = RANDN(c, 1.0f, n), *g = RANDN(c, 0.1f, n), *m = RANDN(c, 0.1f, n);
    double *wp = tc_out(c, p), *wm = tc_out(c, m);
    for (int64_t step = 1; step <= a[1]; step++) {
        assert_ok(dsc_kernel_lion(p, g, m, 1e-2f, 0.9f, 0.99f, 0.1f));
        if (c->ref) ref_lion(wp, tc_in(c, g), wm, n, 1e-2f, 0.9f, 0.99f, 0.1f);
    }
}

/* a: n, update aliases grad. */
static void case_lamb_direction(tc *c, const int64_t *a) {
    int64_t n = a[0];
    dsc_tensor *p = RANDN(c, 1.0f, n), *g = RANDN(c, 0.1f, n), *m = RANDN(c, 0.1f, n);
    dsc_tensor *v = FULL(c, 0.01f, n), *u = a[1] ? g : FULL(c, 0.0f, n);
    assert_ok(dsc_kernel_lamb_direction(u, p, g, m, v, 0.9f, 0.999f, 1e-6f, 0.01f));
    double *wu = tc_out(c, u), *wm = tc_out(c, m), *wv = tc_out(c, v);
    if (c->ref) ref_lamb_direction(wu, tc_in(c, p), tc_in(c, g), wm, wv, n, 0.9f, 0.999f, 1e-6f, 0.01f);
}

enum { SUM, SUM_SQUARES, ALL_FINITE };

/* a: n, which reduction, poison (0 none, 1 NaN at the end, 2 -inf at the start). */
static void case_reduce(tc *c, const int64_t *a) {
    int64_t n = a[0];
    double *vals = kt_zeros_d(n), want = 0;
    for (int64_t i = 0; i < n; i++)
        vals[i] = (double)((i * 37) % 101) / 16 - 3;
    if (n && a[2] == 1) vals[n - 1] = NAN;
    if (n && a[2] == 2) vals[0] = -INFINITY;
    dsc_tensor *x = tc_values(c, vals, KT_SHAPE(n));
    double got;
    bool finite = true;
    switch (a[1]) {
    case SUM:
        assert_ok(dsc_kernel_sum(&got, x));
        break;
    case SUM_SQUARES:
        assert_ok(dsc_kernel_sum_squares(&got, x));
        break;
    default:
        assert_ok(dsc_kernel_all_finite(&finite, x));
        got = finite;
    }
    for (int64_t i = 0; i < n; i++) {
        double f = (float)vals[i];
        want += a[1] == SUM ? f : f * f;
    }
    if (a[1] == ALL_FINITE) want = a[2] == 0;
    tc_scalar(c, got, want);
    free(vals);
}

enum { SCALE, AXPY, ADD, ZERO };

/* a: n, which operation. zero's input holds NaN and inf (it must not scale them). */
static void case_elementwise(tc *c, const int64_t *a) {
    int64_t n = a[0];
    dsc_tensor *x = RANDN(c, 1.0f, n), *y = RANDN(c, 1.0f, n), *out = FULL(c, 0.0f, n);
    switch (a[1]) {
    case SCALE:
        assert_ok(dsc_kernel_scale(x, 3.0f));
        break;
    case AXPY:
        assert_ok(dsc_kernel_axpy(y, 0.5f, x));
        break;
    case ADD:
        assert_ok(dsc_kernel_add(out, x, y));
        break;
    default: {
        double *bad = kt_zeros_d(n);
        for (int64_t i = 0; i < n; i++)
            bad[i] = i % 3 == 0 ? NAN : i % 3 == 1 ? INFINITY : 1;
        dsc_tensor *z = tc_values(c, bad, KT_SHAPE(n));
        free(bad);
        assert_ok(dsc_kernel_zero(z));
        double *w = tc_out(c, z);
        for (int64_t i = 0; i < n; i++)
            w[i] = 0;
        return;
    }
    }
    dsc_tensor *result = a[1] == SCALE ? x : a[1] == AXPY ? y : out;
    double *w = tc_out(c, result);
    const double *xi = tc_in(c, x), *yi = tc_in(c, y);
    for (int64_t i = 0; c->ref && i < n; i++)
        w[i] = a[1] == SCALE ? 3 * xi[i] : a[1] == AXPY ? yi[i] + 0.5 * xi[i] : xi[i] + yi[i];
}

/* ---- MoE row movement: routes (S, K) to distinct rows of R, every fourth dropped ---- */

/* Route i goes to row (i * 7 + 3) % R (distinct while S*K <= R and 7 does not divide R), -1 when i % 4 == 2. */
static dsc_tensor *route_rows(tc *c, int64_t s, int64_t k, int64_t r) {
    int32_t *d = malloc((size_t)(s * k > 0 ? s * k : 1) * sizeof *d);
    for (int64_t i = 0; i < s * k; i++)
        d[i] = i % 4 == 2 ? -1 : (int32_t)((i * 7 + 3) % r);
    dsc_tensor *t = tc_ints(c, d, KT_SHAPE(s, k));
    free(d);
    return t;
}

/* a: S, K, M, R. buf starts non-zero: rows no route names must keep their values. */
static void case_moe_scatter(tc *c, const int64_t *a) {
    int64_t s = a[0], k = a[1], m = a[2], r = a[3];
    dsc_tensor *x = RANDN(c, 1.0f, s, m), *dest = route_rows(c, s, k, r), *buf = FULL(c, 7.0f, r, m);
    assert_ok(dsc_kernel_moe_scatter(buf, x, dest));
    double *want = tc_out(c, buf);
    if (!c->ref) return;
    const int32_t *d = tc_ids(c, dest);
    const double *xi = tc_in(c, x);
    for (int64_t i = 0; i < s * k; i++)
        for (int64_t j = 0; d[i] >= 0 && j < m; j++)
            want[d[i] * m + j] = xi[(i / k) * m + j];
}

/* a: S, K, M, R, weighted, accumulate. */
static void case_moe_gather(tc *c, const int64_t *a) {
    int64_t s = a[0], k = a[1], m = a[2], r = a[3];
    dsc_tensor *y = RANDN(c, 1.0f, r, m), *dest = route_rows(c, s, k, r), *out = FULL(c, 0.5f, s, m);
    dsc_tensor *w = a[4] ? RANDN(c, 1.0f, s, k) : NULL;
    assert_ok(dsc_kernel_moe_gather(out, y, dest, w, a[5] != 0));
    double *want = tc_out(c, out);
    if (!c->ref) return;
    const int32_t *d = tc_ids(c, dest);
    const double *yi = tc_in(c, y), *wi = tc_in(c, w);
    for (int64_t t = 0; t < s; t++)
        for (int64_t j = 0; j < m; j++) {
            double acc = a[5] ? want[t * m + j] : 0.0;
            for (int64_t i = t * k; i < (t + 1) * k; i++)
                acc += d[i] < 0 ? 0.0 : (wi ? wi[i] : 1.0) * yi[d[i] * m + j];
            want[t * m + j] = acc;
        }
}

/* a: S, K, M, R. dy and dw start non-zero: rows no route names keep their values, dropped routes get dw 0. */
static void case_moe_combine_backward(tc *c, const int64_t *a) {
    int64_t s = a[0], k = a[1], m = a[2], r = a[3];
    dsc_tensor *dout = RANDN(c, 1.0f, s, m), *y = RANDN(c, 1.0f, r, m), *dest = route_rows(c, s, k, r);
    dsc_tensor *w = RANDN(c, 1.0f, s, k), *dy = FULL(c, 3.0f, r, m), *dw = FULL(c, 3.0f, s, k);
    assert_ok(dsc_kernel_moe_combine_backward(dy, dw, dout, y, dest, w));
    double *want_dy = tc_out(c, dy), *want_dw = tc_out(c, dw);
    if (!c->ref) return;
    const int32_t *d = tc_ids(c, dest);
    const double *g = tc_in(c, dout), *yi = tc_in(c, y), *wi = tc_in(c, w);
    for (int64_t i = 0; i < s * k; i++) {
        want_dw[i] = 0;
        for (int64_t j = 0; d[i] >= 0 && j < m; j++) {
            want_dy[d[i] * m + j] = wi[i] * g[(i / k) * m + j];
            want_dw[i] += g[(i / k) * m + j] * yi[d[i] * m + j];
        }
    }
}

/* ---- the table ------------------------------------------------------------------ */

typedef struct op_case {
    size_t entry; /* offsetof(struct dsc_kernel_ops, <entry>) */
    const char *name;
    case_fn fn;
    int64_t a[8];
    double tol;    /* relative error, in both modes */
    bool cpu_only; /* products in bf16 / fp16 (dsc_kernels_set_matmul_dtype): the CUDA backend keeps f32 */
} op_case;

#define ENTRY(op) offsetof(struct dsc_kernel_ops, op)
#define CASE(op, fn, tol, ...)                                                                                    \
    { ENTRY(op), #op " (" #__VA_ARGS__ ")", fn, {__VA_ARGS__}, tol, false }
#define CPU_CASE(op, fn, tol, ...)                                                                                \
    { ENTRY(op), #op " (" #__VA_ARGS__ ")", fn, {__VA_ARGS__}, tol, true }

static const op_case cases[] = {
    /* MoE rows: S, K, M, R (+ weighted, accumulate for the gather); M 37: the vector loops' tails,
     * M 1000 x 80 routes: above the threshold of the parallel loops */
    CASE(moe_scatter, case_moe_scatter, 1e-6, 9, 2, 37, 30),
    CASE(moe_scatter, case_moe_scatter, 1e-6, 40, 2, 1000, 90),
    CASE(moe_scatter, case_moe_scatter, 1e-6, 0, 2, 8, 5), /* no tokens: nothing written */
    CASE(moe_gather, case_moe_gather, 1e-5, 9, 2, 37, 30, 1, 0),
    CASE(moe_gather, case_moe_gather, 1e-5, 40, 2, 1000, 90, 1, 0),
    CASE(moe_gather, case_moe_gather, 1e-5, 11, 3, 33, 40, 0, 1),
    CASE(moe_gather, case_moe_gather, 1e-5, 5, 1, 16, 9, 1, 1),
    CASE(moe_combine_backward, case_moe_combine_backward, 1e-5, 9, 2, 37, 30),
    CASE(moe_combine_backward, case_moe_combine_backward, 1e-5, 40, 2, 1000, 90),
    /* gemm: m, n, k, trans_a, trans_b, batch */
    CASE(gemm, case_gemm, 1e-4, 65, 130, 47, 0, 0, 0),
    CASE(gemm, case_gemm, 1e-4, 65, 130, 47, 0, 1, 0),
    CASE(gemm, case_gemm, 1e-4, 65, 130, 47, 1, 0, 0),
    CASE(gemm, case_gemm, 1e-4, 65, 130, 47, 1, 1, 0),
    CASE(gemm, case_gemm, 1e-4, 17, 19, 33, 0, 1, 3),
    CASE(gemm, case_gemm, 1e-4, 1, 1, 1, 0, 0, 0),
    CASE(gemm, case_gemm, 1e-4, 7, 5, 0, 0, 0, 0), /* k = 0: out = beta out + bias */
    CASE(gemm, case_gemm, 1e-4, 0, 5, 3, 0, 0, 0), /* no rows */
    /* products in bf16 (dsc_kernels_set_matmul_dtype): every layout, odd depth, beta 0 and 1 */
    CPU_CASE(gemm, case_gemm_rounded, 1e-4, 70, 130, 47, 0, 0, 0, 1),
    CPU_CASE(gemm, case_gemm_rounded, 1e-4, 70, 130, 47, 0, 1, 1, 1),
    CPU_CASE(gemm, case_gemm_rounded, 1e-4, 70, 130, 47, 1, 0, 1, 1),
    CPU_CASE(gemm, case_gemm_rounded, 1e-4, 70, 130, 47, 1, 1, 0, 1),
    CPU_CASE(gemm, case_gemm_rounded, 1e-4, 97, 64, 96, 1, 0, 1, 1),
    CPU_CASE(gemm, case_gemm_rounded, 1e-4, 20, 19, 33, 0, 1, 1, 1),  /* small: rounded copies */
    CPU_CASE(gemm, case_gemm_rounded, 1e-4, 70, 130, 47, 1, 0, 3, 1), /* beta 3: out scaled first */
    /* in fp16 (mixed-precision fp16): rounded copies, every layout */
    CPU_CASE(gemm, case_gemm_rounded, 1e-4, 70, 130, 47, 0, 0, 0, 2),
    CPU_CASE(gemm, case_gemm_rounded, 1e-4, 70, 130, 47, 1, 1, 1, 2),
    CPU_CASE(gemm, case_gemm_rounded, 1e-4, 97, 64, 96, 1, 0, 1, 2),
    CPU_CASE(gemm, case_gemm_rounded, 1e-4, 20, 19, 33, 0, 1, 3, 2),
    /* operands above the whole-rounding limit: panels of both (each of b's again for every one of
     * a's), of b alone, and blocks of the depth (beta in the first, the bias in the last) */
    CPU_CASE(gemm, case_gemm_rounded, 1e-4, 70, 130, 47, 0, 0, 0, 1, 1000),
    CPU_CASE(gemm, case_gemm_rounded, 1e-4, 70, 130, 47, 1, 1, 3, 2, 1000),
    CPU_CASE(gemm, case_gemm_rounded, 1e-4, 8, 500, 64, 0, 1, 1, 1, 2000),
    CPU_CASE(gemm, case_gemm_rounded, 1e-4, 20, 19, 700, 0, 0, 3, 1, 6000),
    CPU_CASE(gemm, case_gemm_rounded, 1e-4, 20, 19, 700, 1, 1, 0, 2, 6000),
    /* enough rows for the bf16 dot (DSC_CPU_SIMD=avx512bf16 on Intel): its blocks of the depth */
    CPU_CASE(gemm, case_gemm_rounded, 1e-4, 40, 40, 700, 0, 0, 1, 1, 12000),
    CPU_CASE(gemm, case_gemm_rounded, 1e-4, 40, 40, 700, 1, 1, 0, 1, 12000),
    /* linear_packed: rows, OC, C, format, bias, workspace threads. Up to 32 rows stream the
     * weight (Q8_0 against x quantised too), four x rows a block (odd C: the vector loops' tails; odd rows and
     * OC: the blocks' remainders); more rows take the GEMM paths (f32 directly, narrow
     * formats in 128-row panels, one or two at a time). */
    CASE(linear_packed, case_linear_packed, 1e-4, 1, 130, 64, DSC_WEIGHT_F32, 1, 1),
    CASE(linear_packed, case_linear_packed, 1e-4, 3, 77, 45, DSC_WEIGHT_BF16, 0, 1),
    CASE(linear_packed, case_linear_packed, 1e-4, 4, 33, 24, DSC_WEIGHT_F16, 1, 1),
    CASE(linear_packed, case_linear_packed, 1e-4, 2, 50, 96, DSC_WEIGHT_Q8_0, 1, 1),
    CASE(linear_packed, case_linear_packed, 1e-4, 6, 40, 33, DSC_WEIGHT_F32, 1, 1),
    CASE(linear_packed, case_linear_packed, 1e-4, 9, 300, 64, DSC_WEIGHT_BF16, 1, 2),
    CASE(linear_packed, case_linear_packed, 1e-4, 70, 131, 96, DSC_WEIGHT_Q8_0, 0, 1),
    CASE(linear_packed, case_linear_packed, 1e-4, 5, 20, 45, DSC_WEIGHT_F16, 0, 2),
    CASE(linear_packed, case_linear_packed, 1e-4, 32, 67, 96, DSC_WEIGHT_Q8_0, 1, 1),
    CASE(linear_packed, case_linear_packed, 1e-4, 31, 70, 45, DSC_WEIGHT_F32, 1, 1),
    CASE(linear_packed, case_linear_packed, 1e-4, 17, 53, 40, DSC_WEIGHT_BF16, 0, 1),
    CASE(linear_packed, case_linear_packed, 1e-4, 33, 21, 45, DSC_WEIGHT_F16, 1, 1),
    /* widened panels: vector steps of 8 and 16 columns with a tail, and whole Q8_0 blocks */
    CASE(linear_packed, case_linear_packed, 1e-4, 40, 19, 45, DSC_WEIGHT_BF16, 1, 2),
    /* bf16 panels of 128 and a remainder, 64-row blocks with a remainder, 6-row x tiles with a
     * remainder, an odd c (a padded column pair) and c 1 */
    CASE(linear_packed, case_linear_packed, 1e-4, 70, 150, 64, DSC_WEIGHT_BF16, 1, 2),
    CASE(linear_packed, case_linear_packed, 1e-4, 37, 130, 33, DSC_WEIGHT_BF16, 0, 1),
    CASE(linear_packed, case_linear_packed, 1e-4, 33, 65, 1, DSC_WEIGHT_BF16, 1, 1),
    CASE(linear_packed, case_linear_packed, 1e-4, 35, 140, 37, DSC_WEIGHT_F16, 0, 2),
    CASE(linear_packed, case_linear_packed, 1e-4, 34, 23, 160, DSC_WEIGHT_Q8_0, 1, 2),
    /* Q8_0 on AVX-512 VNNI: two panels, the second's 64-row blocks 64 + 8, 3-row x tiles + 2 */
    CASE(linear_packed, case_linear_packed, 1e-4, 35, 200, 64, DSC_WEIGHT_Q8_0, 1, 2),
    /* one to four rows over 32-column steps with a tail, 4-row blocks with a remainder, several
     * row chunks (the 512-bit loops, their bf16 even / odd order and their prefetch) */
    CASE(linear_packed, case_linear_packed, 1e-4, 1, 150, 77, DSC_WEIGHT_BF16, 1, 1),
    CASE(linear_packed, case_linear_packed, 1e-4, 1, 131, 160, DSC_WEIGHT_F32, 0, 1),
    CASE(linear_packed, case_linear_packed, 1e-4, 2, 133, 100, DSC_WEIGHT_F16, 1, 1),
    CASE(linear_packed, case_linear_packed, 1e-4, 2, 70, 64, DSC_WEIGHT_BF16, 0, 1),
    CASE(linear_packed, case_linear_packed, 1e-4, 3, 9, 40, DSC_WEIGHT_F32, 1, 1),
    /* linear_gelu: rows, OC, C, bias. 300 rows: the threads' GEMM blocks, their rows' vector steps
     * and tails (OC 77); 5 rows stream the weight; 33 rows, one column: the GEMM's smallest */
    CASE(linear_gelu, case_linear_gelu, 1e-4, 300, 77, 64, 1, 0),
    CASE(linear_gelu, case_linear_gelu, 1e-4, 64, 400, 33, 0, 0),
    CASE(linear_gelu, case_linear_gelu, 1e-4, 5, 70, 40, 1, 0),
    CASE(linear_gelu, case_linear_gelu, 1e-4, 33, 1, 7, 1, 0),
    CPU_CASE(linear_gelu, case_linear_gelu, 1e-4, 300, 77, 64, 1, 1),       /* products in bf16 */
    CPU_CASE(linear_gelu, case_linear_gelu, 1e-4, 5, 70, 40, 1, 1),         /* rounded copies, streamed */
    CPU_CASE(linear_gelu, case_linear_gelu, 1e-4, 300, 77, 64, 1, 2),       /* products in fp16 */
    CPU_CASE(linear_gelu, case_linear_gelu, 1e-4, 40, 300, 30, 1, 1, 2000), /* panels of w */
    CPU_CASE(linear_gelu, case_linear_gelu, 1e-4, 20, 30, 600, 1, 2, 8000), /* depth blocks */
    CASE(linear_backward_bias, case_linear_bias, 1e-4, 50, 80),
    /* reduced-type gradients: rows, OC, C, bias, gradient type, product type; one tile, and (OC
     * 300, C 2100) tiles of 2048 columns and 112 rows with remainders over the threads; the
     * tolerance is one ulp of the type, the reference's double sums rounded against f32 sums */
    CPU_CASE(linear_grads_rounded, case_linear_grads_rounded, 1e-2, 33, 20, 17, 1, 1, 1),
    CPU_CASE(linear_grads_rounded, case_linear_grads_rounded, 1e-2, 64, 300, 2100, 1, 1, 0),
    CPU_CASE(linear_grads_rounded, case_linear_grads_rounded, 2e-3, 40, 70, 90, 0, 2, 2),
    CPU_CASE(linear_grads_rounded, case_linear_grads_rounded, 2e-3, 9, 5, 3, 1, 2, 0),
    /* dy^T (300 x 64), then x (16 x 4100), rounded by the tiles that read them */
    CPU_CASE(linear_grads_rounded, case_linear_grads_rounded, 1e-2, 64, 300, 90, 1, 1, 1, 5000),
    CPU_CASE(linear_grads_rounded, case_linear_grads_rounded, 2e-3, 16, 16, 4100, 0, 2, 2, 5000),
    /* 2-byte tensors (mixed precision's head): y rounded once, in one panel, in the narrow product's
     * column panels (300 x 5000) and through the rounded panels and depth blocks (whole_max 4000);
     * dy widened, through the depth blocks and the tiles */
    CPU_CASE(linear_narrow_y, case_linear_narrow_y, 1e-5, 33, 70, 40, 1, 1, 0),
    CPU_CASE(linear_narrow_y, case_linear_narrow_y, 1e-5, 300, 5000, 64, 1, 1, 0),
    CPU_CASE(linear_narrow_y, case_linear_narrow_y, 1e-5, 37, 700, 300, 0, 2, 4000),
    CPU_CASE(linear_backward_narrow_dy, case_linear_backward_narrow_dy, 1e-2, 40, 90, 48, 1, 0),
    CPU_CASE(linear_backward_narrow_dy, case_linear_backward_narrow_dy, 1e-2, 40, 900, 48, 1, 4000),
    CPU_CASE(linear_backward_narrow_dy, case_linear_backward_narrow_dy, 2e-3, 16, 300, 20, 2, 4000),
    CASE(linear_backward_bias, case_linear_bias, 1e-4, 1, 33),
    CASE(linear_backward_bias, case_linear_bias, 1e-4, 600, 3),
    /* norms: rows, channels, rms */
    CASE(layernorm_forward, case_norm_forward, 1e-4, 300, 1000, 0),
    CASE(layernorm_forward, case_norm_forward, 1e-4, 3, 33, 0),
    CASE(layernorm_forward, case_norm_forward, 1e-4, 1, 1, 0),
    CASE(layernorm_backward, case_norm_backward, 1e-4, 300, 1000, 0),
    CASE(layernorm_backward, case_norm_backward, 1e-4, 5, 33, 0),
    CASE(rmsnorm_forward, case_norm_forward, 1e-4, 300, 1000, 1),
    CASE(rmsnorm_forward, case_norm_forward, 1e-4, 1, 1, 1),
    CASE(rmsnorm_backward, case_norm_backward, 1e-4, 300, 1000, 1),
    CASE(rmsnorm_backward, case_norm_backward, 1e-4, 5, 33, 1),
    /* activations: rows, cols, which */
    CASE(gelu_forward, case_activation, 1e-4, 1000, 77, GELU),
    CASE(gelu_forward, case_activation, 1e-4, 1, 1, GELU),
    CASE(gelu_forward, case_activation, 1e-4, 0, 5, GELU),
    CASE(gelu_backward, case_activation_backward, 1e-4, 1000, 77, GELU),
    /* 111 values: 8-lane vector steps and a 7-value scalar tail in one call */
    CASE(gelu_forward, case_activation, 1e-4, 3, 37, GELU),
    CASE(gelu_backward, case_activation_backward, 1e-4, 3, 37, GELU),
    CASE(swiglu_backward, case_activation_backward, 1e-4, 3, 37, SWIGLU),
    CASE(silu_forward, case_activation, 1e-4, 1000, 77, SILU),
    CASE(silu_forward, case_activation, 1e-4, 1, 1, SILU),
    CASE(silu_backward, case_activation_backward, 1e-4, 1000, 77, SILU),
    CASE(swiglu_forward, case_activation, 1e-4, 1000, 77, SWIGLU),
    CASE(swiglu_backward, case_activation_backward, 1e-4, 1000, 77, SWIGLU),
    CASE(swiglu_backward, case_activation_backward, 1e-4, 1, 3, SWIGLU),
    /* softmax: rows, cols, in place */
    CASE(softmax, case_softmax, 1e-4, 1000, 77, 0),
    CASE(softmax, case_softmax, 1e-4, 3, 1, 0),
    CASE(softmax, case_softmax, 1e-4, 7, 5003, 1),
    /* attention: B, T, NH, NKV, HS (64 and 128 take the tiled CUDA kernels) */
    CASE(attention_forward, case_attention, 1e-4, 2, 130, 4, 2, 64),
    CASE(attention_forward, case_attention, 1e-4, 1, 1, 2, 1, 128),
    CASE(attention_forward, case_attention, 1e-4, 1, 70, 4, 1, 128),
    CASE(attention_forward, case_attention, 1e-4, 1, 33, 2, 2, 40),
    CASE(attention_backward, case_attention_backward, 1e-3, 2, 130, 4, 2, 64),
    /* one key: dq and dk are exactly 0, and f32 sums of 128 products of size ~1 leave ~1e-6 there
     * (what the 1e-3 floor of close_enough times this tolerance admits; any real error is ~1) */
    CASE(attention_backward, case_attention_backward, 5e-3, 1, 1, 2, 1, 128),
    CASE(attention_backward, case_attention_backward, 1e-3, 1, 70, 4, 1, 128),
    CASE(attention_backward, case_attention_backward, 1e-3, 1, 33, 2, 2, 40),
    /* rope: B, T, NH, HS, inverse, in place */
    CASE(rope, case_rope, 1e-4, 2, 4, 3, 64, 0, 0),
    CASE(rope, case_rope, 1e-4, 1, 9, 2, 2, 1, 1),
    /* embedding: B, T, V, C, wpe, products in bf16 */
    CASE(embedding_forward, case_embedding, 1e-5, 2, 4, 5, 96, 1, 0),
    CASE(embedding_forward, case_embedding, 1e-5, 1, 7, 3, 1, 0, 0),
    CPU_CASE(embedding_forward, case_embedding, 1e-5, 2, 4, 5, 96, 1, 1),
    CPU_CASE(embedding_forward, case_embedding, 1e-5, 3, 5, 7, 33, 0, 1),
    CPU_CASE(embedding_forward, case_embedding, 1e-5, 2, 4, 5, 300, 1, 2), /* fp16: rows past 256 */
    CASE(embedding_backward, case_embedding_backward, 1e-5, 2, 4, 5, 96, 1),
    CASE(embedding_backward, case_embedding_backward, 1e-5, 3, 50, 4, 33, 0),
    /* B, T, V, C, wpe, gradient type: repeated tokens (V 5 and 4 for 8 and 150 positions), slices of
     * 16 channels with a tail */
    CPU_CASE(embedding_backward_rounded, case_embedding_backward_rounded, 1e-2, 2, 4, 5, 96, 1, 1),
    CPU_CASE(embedding_backward_rounded, case_embedding_backward_rounded, 2e-3, 3, 50, 4, 33, 1, 2),
    CPU_CASE(embedding_backward_rounded, case_embedding_backward_rounded, 1e-2, 3, 50, 4, 33, 0, 1),
    /* cross-entropy: rows, vocabulary, in place */
    CASE(cross_entropy_forward, case_cross_entropy, 1e-4, 8, 5003),
    CASE(cross_entropy_forward, case_cross_entropy, 1e-4, 1, 1),
    CASE(cross_entropy_backward, case_cross_entropy_backward, 1e-4, 8, 5003, 0),
    CASE(cross_entropy_backward, case_cross_entropy_backward, 1e-4, 11, 7, 1),
    /* 2-byte logits: rows, vocabulary (past one 1024-value staging chunk), (in place,) type */
    CPU_CASE(cross_entropy_forward_narrow, case_cross_entropy_narrow, 1e-5, 8, 5003, 1),
    CPU_CASE(cross_entropy_forward_narrow, case_cross_entropy_narrow, 1e-5, 8, 5003, 2),
    CPU_CASE(cross_entropy_backward_narrow, case_cross_entropy_backward_narrow, 1e-5, 8, 5003, 0, 1),
    CPU_CASE(cross_entropy_backward_narrow, case_cross_entropy_backward_narrow, 1e-5, 11, 7, 1, 2),
    /* optimizers: n, steps (, momentum x10) */
    CASE(adamw, case_adamw, 1e-5, 100003, 3),
    CASE(adamw, case_adamw, 1e-5, 1, 1),
    CASE(sgd, case_sgd, 1e-5, 100003, 3, 9),
    CASE(sgd, case_sgd, 1e-5, 5, 2, 0),
    CASE(lion, case_lion, 1e-5, 100003, 3),
    CASE(lion, case_lion, 1e-5, 1, 1),
    CASE(lamb_direction, case_lamb_direction, 1e-5, 100003, 0),
    CASE(lamb_direction, case_lamb_direction, 1e-5, 7, 1),
    /* reductions: n, which, poison */
    CASE(sum, case_reduce, 1e-9, 100003, SUM, 0),
    CASE(sum, case_reduce, 1e-9, 0, SUM, 0),
    CASE(sum_squares, case_reduce, 1e-9, 100003, SUM_SQUARES, 0),
    CASE(sum_squares, case_reduce, 1e-9, 1, SUM_SQUARES, 0),
    CASE(all_finite, case_reduce, 0, 100003, ALL_FINITE, 0),
    CASE(all_finite, case_reduce, 0, 100003, ALL_FINITE, 1),
    CASE(all_finite, case_reduce, 0, 3, ALL_FINITE, 2),
    /* elementwise: n, which */
    CASE(scale, case_elementwise, 1e-6, 100003, SCALE),
    CASE(scale, case_elementwise, 1e-6, 0, SCALE),
    CASE(axpy, case_elementwise, 1e-6, 100003, AXPY),
    CASE(add, case_elementwise, 1e-6, 100003, ADD),
    CASE(add, case_elementwise, 1e-6, 1, ADD),
    CASE(zero, case_elementwise, 0, 1001, ZERO),
};
#define NUM_CASES ((int)(sizeof cases / sizeof cases[0]))

/* ---- running ----------------------------------------------------------------------- */

static void run(const op_case *k, tc *c, dsc_device dev, bool ref) {
    memset(c, 0, sizeof *c);
    c->dev = dev;
    c->ref = ref;
    dsc_rng_init(&c->rng, 1000 + (uint64_t)(k - cases), 0, DSC_RNG_INIT);
    k->fn(c, k->a);
}

/* Output i of a finished run, copied to the host (the caller frees it). */
static dsc_tensor fetch(const tc *c, int i) {
    dsc_tensor host;
    assert_ok(dsc_tensor_alloc(&host, DSC_DTYPE_F32, c->t[i].ndim, c->t[i].shape, DSC_CPU, DSC_MEM_OTHER));
    assert_ok(dsc_tensor_copy(&host, &c->t[i]));
    return host;
}

static bool close_enough(double got, double want, double tol) {
    return fabs(got - want) <= tol * fmax(fabs(want), 1e-3); /* false for NaN */
}

/* Whether the backend of `dev` implements table entry `entry` (the CPU must implement all). */
static bool implements(dsc_device dev, size_t entry) {
    const dsc_backend *backend;
    assert_ok(dsc_backend_get(dev, &backend));
    void (*slot)(void);
    memcpy(&slot, (const char *)backend->iface->kernels + entry, sizeof slot);
    return slot != NULL;
}

static int unsupported; /* cases the device skips: its table lacks their entry, or they multiply in bf16 */

/* The entries a device backend may leave NULL (its wrapper then reports them
 * unsupported): narrow packed weights are a CPU decode feature. Every other
 * entry, the optimizers' included, must run on the device. */
static bool may_lack(size_t entry) {
    return entry == ENTRY(linear_packed) || entry == ENTRY(linear_grads_rounded) ||
           entry == ENTRY(embedding_backward_rounded) || entry == ENTRY(linear_narrow_y) ||
           entry == ENTRY(linear_backward_narrow_dy) || entry == ENTRY(cross_entropy_forward_narrow) ||
           entry == ENTRY(cross_entropy_backward_narrow);
}

/* CPU against the reference, or `dev` against the CPU: true when every output agrees. */
static bool check_case(const op_case *k, dsc_device dev) {
    bool against_ref = dev.type == DSC_DEVICE_CPU, ok = true;
    if (!implements(DSC_CPU, k->entry)) {
        printf("FAILED: %s: the CPU backend does not implement it\n", k->name);
        return false;
    }
    if (!against_ref && k->cpu_only) {
        printf("  %-44s bf16 products are the CPU's: skipped\n", k->name);
        unsupported++;
        return true;
    }
    if (!against_ref && !implements(dev, k->entry)) {
        if (!may_lack(k->entry)) {
            printf("FAILED: %s: the device backend's table has no entry for it\n", k->name);
            return false;
        }
        printf("  %-44s not implemented by this backend: skipped\n", k->name);
        unsupported++;
        return true;
    }
    tc cpu, other;
    run(k, &cpu, DSC_CPU, against_ref);
    if (!against_ref) run(k, &other, dev, false);
    const tc *got = against_ref ? &cpu : &other;
    char what[160];
    for (int i = 0; i < cpu.n; i++) {
        if (!cpu.want[i]) continue;
        dsc_tensor g = fetch(got, i);
        double *want = against_ref ? cpu.want[i] : kt_to_double(&cpu.t[i]);
        snprintf(what, sizeof what, "%s output %d", k->name, i);
        double err = kt_rel_err(kt_f(&g), want, dsc_tensor_numel(&g), 1e-3, what);
        if (!(err <= k->tol)) ok = false;
        if (!against_ref) free(want);
        dsc_tensor_free(&g);
    }
    for (int s = 0; s < cpu.nscalars; s++) {
        double want = against_ref ? cpu.scalar_want[s] : cpu.scalar[s];
        printf("  %-44s %.12g vs %.12g\n", k->name, got->scalar[s], want);
        if (!close_enough(got->scalar[s], want, k->tol)) ok = false;
    }
    if (!ok) printf("FAILED: %s\n", k->name);
    tc_free(&cpu);
    if (!against_ref) tc_free(&other);
    return ok;
}

/* Every entry of the backend table has a case. */
static void test_coverage(void **state) {
    (void)state;
    size_t entries = sizeof(struct dsc_kernel_ops) / sizeof(void (*)(void)), missing = 0;
    for (size_t e = 0; e < entries; e++) {
        bool covered = false;
        for (int i = 0; i < NUM_CASES && !covered; i++)
            covered = cases[i].entry == e * sizeof(void (*)(void));
        if (!covered) {
            printf("entry %zu of struct dsc_kernel_ops has no case in test_kernel_ops.c\n", e);
            missing++;
        }
    }
    printf("  %zu table entries, %d cases\n", entries, NUM_CASES);
    assert_int_equal(missing, 0);
}

static dsc_device device; /* CPU: against the reference; CUDA: against the CPU */

static void test_cases(void **state) {
    (void)state;
    if (device.type == DSC_DEVICE_CUDA && dsc_cuda_device_count() == 0) skip();
    int failed = 0;
    for (int i = 0; i < NUM_CASES; i++)
        failed += !check_case(&cases[i], device);
    printf("  %d of %d cases agree (%d not implemented by the backend)\n", NUM_CASES - failed - unsupported,
           NUM_CASES, unsupported);
    assert_int_equal(failed, 0);
}

int main(int argc, char **argv) {
    bool cuda = argc > 1 && strcmp(argv[1], "cuda") == 0;
    device = cuda ? (dsc_device){DSC_DEVICE_CUDA, 0} : DSC_CPU;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_coverage),
        cmocka_unit_test(test_cases),
    };
    /* Against the device, the CPU keeps x in f32 (the CUDA kernels widen bf16 weights, x stays f32). */
    if (cuda) setenv("DSC_CPU_SIMD", "avx512", 0);
    const char *simd = getenv("DSC_CPU_SIMD");
    if (!cuda && simd && strcmp(simd, "avx512") == 0 && !dsc_cpu_simd_avx512()) {
        printf("SKIPPED: the CPU has no AVX-512F / VL\n");
        return 77;
    }
    if (!cuda && simd && strcmp(simd, "avx512bf16") == 0 && !dsc_cpu_bf16_gemm_available()) {
        printf("SKIPPED: the CPU has no AVX-512 BF16\n");
        return 77;
    }
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (cuda && dsc_cuda_device_count() == 0) {
        printf("SKIPPED: no CUDA device\n");
        return failed ? failed : 77; /* 77: ctest's SKIP_RETURN_CODE for this test */
    }
    return failed;
}
