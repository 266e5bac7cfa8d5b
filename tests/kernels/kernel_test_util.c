/* Random tensors, double mirrors, comparisons and finite differences for the
 * kernel tests. Allocation failures abort the test: these are helpers. */
#include "kernel_test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dsc_tensor alloc_or_fail(dsc_dtype dtype, int ndim, const int64_t *shape) {
    dsc_tensor t;
    assert_ok(dsc_tensor_alloc(&t, dtype, ndim, shape, DSC_CPU, DSC_MEM_OTHER));
    return t;
}

dsc_tensor kt_randn(dsc_rng *rng, float scale, int ndim, const int64_t *shape) {
    dsc_tensor t = alloc_or_fail(DSC_DTYPE_F32, ndim, shape);
    int64_t n = dsc_tensor_numel(&t);
    for (int64_t i = 0; i < n; i++)
        kt_f(&t)[i] = scale * (float)dsc_rng_normal(rng);
    return t;
}

dsc_tensor kt_full(float value, int ndim, const int64_t *shape) {
    dsc_tensor t = alloc_or_fail(DSC_DTYPE_F32, ndim, shape);
    int64_t n = dsc_tensor_numel(&t);
    for (int64_t i = 0; i < n; i++)
        kt_f(&t)[i] = value;
    return t;
}

dsc_tensor kt_ints(const int32_t *values, int ndim, const int64_t *shape) {
    dsc_tensor t = alloc_or_fail(DSC_DTYPE_I32, ndim, shape);
    memcpy(t.data, values, dsc_tensor_nbytes(&t));
    return t;
}

double *kt_zeros_d(int64_t n) {
    double *d = calloc((size_t)(n > 0 ? n : 1), sizeof *d);
    assert_non_null(d);
    return d;
}

double *kt_to_double(const dsc_tensor *t) {
    int64_t n = dsc_tensor_numel(t);
    double *d = kt_zeros_d(n);
    for (int64_t i = 0; i < n; i++)
        d[i] = kt_f(t)[i];
    return d;
}

double kt_rel_err(const float *got, const double *want, int64_t n, double floor, const char *what) {
    double max_diff = 0, max_ref = floor;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        if (!(d <= max_diff)) max_diff = d; /* NaN propagates as a failure */
        if (fabs(want[i]) > max_ref) max_ref = fabs(want[i]);
    }
    double rel = max_diff / max_ref;
    printf("  %-44s max abs err %.3e, rel err %.3e over %lld values\n", what, max_diff, rel, (long long)n);
    return rel;
}

double kt_grad_check(kt_loss_fn loss, void *ctx, double *x, int64_t n, const float *grad, const char *what) {
    double *fd = kt_zeros_d(n);
    for (int64_t i = 0; i < n; i++) {
        double saved = x[i], h = 1e-6 * fmax(1.0, fabs(saved));
        x[i] = saved + h;
        double up = loss(ctx);
        x[i] = saved - h;
        double down = loss(ctx);
        x[i] = saved;
        fd[i] = (up - down) / (2 * h);
    }
    char label[96];
    snprintf(label, sizeof label, "%s vs finite differences", what);
    double rel = kt_rel_err(grad, fd, n, 1e-3, label);
    free(fd);
    return rel;
}

double kt_dot(const double *out, const double *w, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += out[i] * w[i];
    return s;
}
