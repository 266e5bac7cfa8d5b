/* Helpers shared by the kernel tests: random tensors, double mirrors for the
 * reference code, comparison against references, and central finite
 * differences of a scalar loss computed in double. */
#ifndef DSC_TESTS_KERNEL_TEST_UTIL_H
#define DSC_TESTS_KERNEL_TEST_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "dsc/kernels.h"
#include "dsc/rng.h"
#include "dsc/tensor.h"
#include "test_mpi.h"

#define KT_NDIM(...) ((int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)))
#define KT_SHAPE(...) KT_NDIM(__VA_ARGS__), ((const int64_t[]){__VA_ARGS__})

/* f32 CPU tensors: normal(0, scale) entries, or all `value`. */
dsc_tensor kt_randn(dsc_rng *rng, float scale, int ndim, const int64_t *shape);
dsc_tensor kt_full(float value, int ndim, const int64_t *shape);
/* i32 CPU tensor of the given values. */
dsc_tensor kt_ints(const int32_t *values, int ndim, const int64_t *shape);
#define KT_RANDN(rng, scale, ...) kt_randn((rng), (scale), KT_SHAPE(__VA_ARGS__))
#define KT_FULL(value, ...) kt_full((value), KT_SHAPE(__VA_ARGS__))

static inline float *kt_f(const dsc_tensor *t) {
    return (float *)t->data;
}

/* malloc'ed double copy of an f32 tensor (free with free()). */
double *kt_to_double(const dsc_tensor *t);
double *kt_zeros_d(int64_t n);

/* Max relative error of got vs want (relative to max(max|want|, floor)); prints it. */
double kt_rel_err(const float *got, const double *want, int64_t n, double floor, const char *what);
#define KT_ASSERT_CLOSE(got, want, n, tol, what) assert_true(kt_rel_err((got), (want), (n), 1e-3, (what)) <= (tol))

/* Central differences of loss(ctx) with respect to every element of x (n
 * doubles that loss reads), compared with `grad` as in kt_rel_err. */
typedef double (*kt_loss_fn)(void *ctx);
double kt_grad_check(kt_loss_fn loss, void *ctx, double *x, int64_t n, const float *grad, const char *what);
#define KT_ASSERT_GRAD(loss, ctx, x, n, grad, what)                                                               \
    assert_true(kt_grad_check((loss), (ctx), (x), (n), (grad), (what)) <= 2e-3)

/* sum(out * w) in double. */
double kt_dot(const double *out, const double *w, int64_t n);

#endif
