/* The Q8_0 x Q8_0 dot products of decode (kernels/cpu/cpu_q8_dot.c):
 *
 *   - quantising f32 rows gives the blocks the gguf package's Q8_0
 *     quantiser gives (fixtures/q8_0_gguf.bin, written by
 *     fixtures/make_q8_0_fixture.py; bit-exact with llama.cpp's
 *     quantize_row_q8_0_ref), and so does dsc_weight_pack's Q8_0;
 *   - the dot products equal a naive integer reference exactly, on inputs
 *     whose every partial sum is exact in f32 (power-of-two scales, full-range
 *     int8 including +-127 everywhere), for 1..32 x rows and weight row ranges
 *     with remainders; on random data they agree with a double reference;
 *   - the loops that ran are the ones asked for.
 *
 * ctest runs it as test_q8_dot (AVX-512 VNNI where the CPU has it),
 * test_q8_dot_avx2 (DSC_CPU_SIMD=avx2) and test_q8_dot_scalar. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "dsc/kernels.h"
#include "dsc/tensor.h"
#include "kernels/cpu/cpu_q8_dot.h"
#include "kernels/cpu/cpu_simd.h"

#define FIXTURE DSC_SOURCE_DIR "/tests/kernels/fixtures/q8_0_gguf.bin"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 2685821657736338717ull) >> 32);
}
static int8_t rand_q(int lim) { /* uniform in [-lim, lim], the ends more often */
    uint32_t u = next_u32();
    if (u % 8 == 0) return (int8_t)(u & 8 ? lim : -lim);
    return (int8_t)((int)(u >> 8) % (2 * lim + 1) - lim);
}
static float rand_f(void) {
    return ((float)(next_u32() >> 8) / 16777216.0f) * 2.0f - 1.0f;
}

static void test_level(void **state) {
    (void)state;
    const char *env = getenv("DSC_CPU_SIMD"), *level = dsc_cpu_q8_dot_level();
    print_message("q8 dot loops: %s\n", level);
    if (env && strcmp(env, "scalar") == 0) assert_string_equal(level, "scalar");
    if (env && strcmp(env, "avx2") == 0 && dsc_cpu_simd()) assert_string_equal(level, "avx2");
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (!env && dsc_cpu_simd() && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
        assert_string_equal(level, "avx512vnni");
#endif
}

/* Blocks q (34 bytes each) against the quantised rows in act (dsc_cpu_q8_act_row_bytes each). */
static void expect_blocks(const uint8_t *q, const uint8_t *act, int64_t rows, int64_t cols, const char *what) {
    size_t xrb = dsc_cpu_q8_act_row_bytes(cols);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < cols / 32; b++) {
            const uint8_t *blk = q + ((size_t)r * (size_t)(cols / 32) + (size_t)b) * 34;
            uint16_t dh;
            float d;
            memcpy(&dh, blk, 2);
            memcpy(&d, act + r * xrb + cols + b * 4, 4);
            if (d != dsc_f16_to_f32(dh))
                fail_msg("%s: row %lld block %lld scale %.9g, gguf %.9g", what, (long long)r, (long long)b, d,
                         dsc_f16_to_f32(dh));
            for (int j = 0; j < 32; j++)
                if ((int8_t)act[r * xrb + b * 32 + j] != (int8_t)blk[2 + j])
                    fail_msg("%s: row %lld value %lld q %d, gguf %d", what, (long long)r, (long long)(b * 32 + j),
                             (int8_t)act[r * xrb + b * 32 + j], (int8_t)blk[2 + j]);
        }
}

static void test_quantize_matches_gguf(void **state) {
    (void)state;
    FILE *fp = fopen(FIXTURE, "rb");
    assert_non_null(fp);
    int32_t hdr[2];
    assert_int_equal(fread(hdr, sizeof hdr, 1, fp), 1);
    int64_t rows = hdr[0], cols = hdr[1];
    assert_true(rows > 0 && rows <= 64 && cols > 0 && cols <= 4096 && cols % 32 == 0);
    float *x = malloc((size_t)(rows * cols) * sizeof *x);
    size_t qbytes = (size_t)(rows * cols / 32) * 34;
    uint8_t *q = malloc(qbytes), *act = malloc((size_t)rows * dsc_cpu_q8_act_row_bytes(cols)),
            *packed = malloc(qbytes);
    assert_true(x && q && act && packed);
    assert_int_equal(fread(x, sizeof *x, (size_t)(rows * cols), fp), (size_t)(rows * cols));
    assert_int_equal(fread(q, 1, qbytes, fp), qbytes);
    fclose(fp);

    dsc_cpu_q8_quantize_rows(act, x, rows, cols);
    expect_blocks(q, act, rows, cols, dsc_cpu_q8_dot_level());
    memset(act, 0x55, (size_t)rows * dsc_cpu_q8_act_row_bytes(cols));
    dsc_cpu_q8_quantize_rows_scalar(act, x, rows, cols);
    expect_blocks(q, act, rows, cols, "scalar");
    /* the weights' own packing: the same blocks, byte for byte */
    assert_null(dsc_weight_pack(packed, DSC_WEIGHT_Q8_0, x, rows, cols));
    assert_memory_equal(packed, q, qbytes);
    free(x);
    free(q);
    free(act);
    free(packed);
}

/* Random quantised x rows and Q8_0 weight rows with |q| <= lim and scales 2^-(0..sh). */
static void fill_exact(uint8_t *act, int64_t n, uint8_t *w, int64_t oc, int64_t c, int lim, int sh) {
    size_t xrb = dsc_cpu_q8_act_row_bytes(c), rb = (size_t)(c / 32) * 34;
    for (int64_t i = 0; i < n; i++)
        for (int64_t b = 0; b < c / 32; b++) {
            float d = ldexpf(1.0f, -(int)(next_u32() % (unsigned)(sh + 1)));
            memcpy(act + i * xrb + c + b * 4, &d, 4);
            for (int j = 0; j < 32; j++)
                act[i * xrb + b * 32 + j] = (uint8_t)rand_q(lim);
        }
    for (int64_t r = 0; r < oc; r++)
        for (int64_t b = 0; b < c / 32; b++) {
            uint8_t *blk = w + r * rb + b * 34;
            uint16_t dh = dsc_f32_to_f16(ldexpf(1.0f, -(int)(next_u32() % (unsigned)(sh + 1))));
            memcpy(blk, &dh, 2);
            for (int j = 0; j < 32; j++)
                blk[2 + j] = (uint8_t)rand_q(lim);
        }
}

/* sum_b dw_b dx_b (sum_j xq wq), the block sums in 64-bit integers and the rest in double;
 * *mag (if not NULL) the sum of the terms' magnitudes. */
static double naive(const uint8_t *act, const uint8_t *w, int64_t c, double *mag) {
    double y = 0.0, m = 0.0;
    for (int64_t b = 0; b < c / 32; b++) {
        int64_t s = 0;
        for (int j = 0; j < 32; j++)
            s += (int64_t)(int8_t)act[b * 32 + j] * (int8_t)w[b * 34 + 2 + j];
        uint16_t dh;
        float dx;
        memcpy(&dh, w + b * 34, 2);
        memcpy(&dx, act + c + b * 4, 4);
        double t = (double)dsc_f16_to_f32(dh) * dx * (double)s;
        y += t;
        m += fabs(t);
    }
    if (mag) *mag = m;
    return y;
}

/* y (n, oc) through the dispatched loops, weight rows [r0, oc), at most four x rows a call (as
 * kernels/cpu/cpu_linear.c calls them); rows below r0 stay NAN. */
static float *run(const uint8_t *act, int64_t n, const uint8_t *w, int64_t oc, int64_t c, int64_t r0,
                  bool scalar) {
    float *y = malloc((size_t)(n * oc) * sizeof *y);
    assert_non_null(y);
    for (int64_t k = 0; k < n * oc; k++)
        y[k] = NAN;
    size_t xrb = dsc_cpu_q8_act_row_bytes(c);
    for (int64_t i0 = 0; i0 < n; i0 += DSC_CPU_Q8_MAX_ROWS) { /* as cpu_linear.c calls it */
        int64_t m = n - i0 < DSC_CPU_Q8_MAX_ROWS ? n - i0 : DSC_CPU_Q8_MAX_ROWS;
        if (scalar)
            dsc_cpu_q8_dot_rows_scalar(y + i0 * oc, oc, act + i0 * xrb, m, w, c, r0, oc);
        else
            dsc_cpu_q8_dot_rows(y + i0 * oc, oc, act + i0 * xrb, m, w, c, r0, oc);
    }
    return y;
}

/* Exact: every partial sum fits f32's 24 bits, so any order of the additions gives the naive value. */
static void check_exact(int64_t n, int64_t oc, int64_t c, int lim, int sh, int64_t r0) {
    size_t xrb = dsc_cpu_q8_act_row_bytes(c), rb = (size_t)(c / 32) * 34;
    uint8_t *act = malloc((size_t)n * xrb), *w = malloc((size_t)oc * rb);
    assert_true(act && w);
    fill_exact(act, n, w, oc, c, lim, sh);
    if (oc > 1) /* a weight row of -127s against whatever x is: the widest block sums */
        for (int64_t b = 0; b < c / 32; b++)
            memset(w + (oc - 1) * rb + b * 34 + 2, 0x81, 32);
    for (int pass = 0; pass < 2; pass++) {
        float *y = run(act, n, w, oc, c, r0, pass == 1);
        for (int64_t i = 0; i < n; i++)
            for (int64_t r = 0; r < oc; r++) {
                float got = y[i * oc + r];
                if (r < r0) {
                    if (!isnan(got))
                        fail_msg("n %lld: row %lld below r0 %lld written", (long long)n, (long long)r,
                                 (long long)r0);
                    continue;
                }
                double want = naive(act + i * xrb, w + r * rb, c, NULL);
                if ((double)got != want)
                    fail_msg("%s n %lld oc %lld c %lld: y[%lld][%lld] = %.9g, naive %.17g",
                             pass ? "scalar" : dsc_cpu_q8_dot_level(), (long long)n, (long long)oc, (long long)c,
                             (long long)i, (long long)r, got, want);
            }
        free(y);
    }
    free(act);
    free(w);
}

static void test_dot_exact(void **state) {
    (void)state;
    for (int64_t n = 1; n <= DSC_CPU_STREAM_MAX_ROWS; n++)
        check_exact(n, 19, 128, 127, 1, n % 3); /* full-range int8: block sums up to 32 * 127^2 */
    check_exact(32, 37, 2048, 7, 1, 5);         /* long rows, small values: still exact */
    check_exact(3, 1, 32, 127, 0, 0);
}

/* Realistic data: x and W quantised from f32; the loops against double (and the scalar ones). */
static void test_dot_random(void **state) {
    (void)state;
    const int64_t n = 32, oc = 45, c = 768;
    float *x = malloc((size_t)(n * c) * sizeof *x), *wf = malloc((size_t)(oc * c) * sizeof *wf);
    size_t xrb = dsc_cpu_q8_act_row_bytes(c), rb = (size_t)(c / 32) * 34;
    uint8_t *act = malloc((size_t)n * xrb), *w = malloc((size_t)oc * rb);
    assert_true(x && wf && act && w);
    for (int64_t k = 0; k < n * c; k++)
        x[k] = rand_f() * 3.0f;
    for (int64_t k = 0; k < oc * c; k++)
        wf[k] = rand_f() * 0.05f;
    dsc_cpu_q8_quantize_rows(act, x, n, c);
    assert_null(dsc_weight_pack(w, DSC_WEIGHT_Q8_0, wf, oc, c));
    float *y = run(act, n, w, oc, c, 0, false), *ys = run(act, n, w, oc, c, 0, true);
    for (int64_t i = 0; i < n; i++)
        for (int64_t r = 0; r < oc; r++) {
            double mag, want = naive(act + i * xrb, w + r * rb, c, &mag),
                        tol = (double)(c / 32) * FLT_EPSILON * mag;
            if (fabs(y[i * oc + r] - want) > tol || fabs(ys[i * oc + r] - want) > tol)
                fail_msg("y[%lld][%lld] = %.9g (scalar %.9g), double %.9g", (long long)i, (long long)r,
                         y[i * oc + r], ys[i * oc + r], want);
        }
    free(y);
    free(ys);
    free(x);
    free(wf);
    free(act);
    free(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_level),
        cmocka_unit_test(test_quantize_matches_gguf),
        cmocka_unit_test(test_dot_exact),
        cmocka_unit_test(test_dot_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
