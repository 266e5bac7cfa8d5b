/* Mixed precision's pieces against independent references:
 *  - rounding to bf16 / fp16: the bit patterns torch gives for edge values
 *    (ties both ways, subnormals, overflow, inf, nan, largest finite values,
 *    random values), for the scalar conversion and the in-place rounding;
 *  - the loss scaler: DeepSpeed's DynamicLossScaler driven by the same
 *    overflow patterns (scale and hysteresis after every update, the error
 *    at the minimum scale). Fixtures: gen_precision_fixtures.py;
 *  - the memory formula: DeepSpeed's 2 + 2 + 12 bytes per parameter;
 *  - the fp16 / bf16 / communication_data_type sections and their refusals. */
#define _POSIX_C_SOURCE 200809L /* open_memstream */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/precision.h"
#include "dsc/zero.h"
#include "kernels/cpu/cpu_round.h" /* dsc_cpu_pack_span */
#include "precision_fixtures.h"
#include "test_mpi.h"

enum { N_ROUND = sizeof fx_round_in / sizeof fx_round_in[0] };

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void test_round_bits_match_torch(void **state) {
    (void)state;
    int bad = 0;
    for (int i = 0; i < N_ROUND; i++) {
        float x = from_bits(fx_round_in[i]);
        uint16_t b = dsc_precision_to_bf16(x), h = dsc_precision_to_f16(x);
        if (b != fx_round_bf16[i] || h != fx_round_f16[i]) {
            printf("  0x%08x: bf16 0x%04x (torch 0x%04x), f16 0x%04x (torch 0x%04x)\n", fx_round_in[i], b,
                   fx_round_bf16[i], h, fx_round_f16[i]);
            bad++;
        }
    }
    printf("  %d edge and random values: bf16 and f16 bit patterns as torch's\n", N_ROUND);
    assert_int_equal(bad, 0);
}

/* In place: each value becomes exactly the widened torch result (NaN: a NaN). */
static void check_in_place(dsc_dtype dtype, const uint16_t *ref) {
    float x[N_ROUND];
    for (int i = 0; i < N_ROUND; i++)
        x[i] = from_bits(fx_round_in[i]);
    dsc_round_to_dtype(x, N_ROUND, dtype);
    int bad = 0;
    for (int i = 0; i < N_ROUND; i++) {
        float want = dtype == DSC_DTYPE_BF16 ? dsc_bf16_to_f32(ref[i]) : dsc_f16_to_f32(ref[i]);
        bool ok = isnan(want) ? isnan(x[i]) : to_bits(x[i]) == to_bits(want);
        if (!ok)
            printf("  %s 0x%08x -> 0x%08x, want 0x%08x\n", dsc_dtype_name(dtype), fx_round_in[i], to_bits(x[i]),
                   to_bits(want));
        bad += !ok;
    }
    assert_int_equal(bad, 0);
}

static void test_round_in_place(void **state) {
    (void)state;
    check_in_place(DSC_DTYPE_BF16, fx_round_bf16);
    check_in_place(DSC_DTYPE_F16, fx_round_f16);
}

/* Long passes (split over threads in chunks): out of place, and rounded as it is accumulated, each
 * value as torch rounds it. The fixture's values repeat over 200003 elements, across every chunk boundary. */
static void check_long(dsc_dtype dtype, const uint16_t *ref) {
    enum { N = 200003 };
    float *src = malloc(N * sizeof *src), *dst = malloc(N * sizeof *dst), *acc = malloc(N * sizeof *acc);
    assert_non_null(src && dst && acc);
    for (int i = 0; i < N; i++) {
        src[i] = from_bits(fx_round_in[i % N_ROUND]);
        acc[i] = (float)(i % 97);
    }
    dsc_round_to_dtype_from(dst, src, N, dtype);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        float want =
            dtype == DSC_DTYPE_BF16 ? dsc_bf16_to_f32(ref[i % N_ROUND]) : dsc_f16_to_f32(ref[i % N_ROUND]);
        bad += isnan(want) ? !isnan(dst[i]) : to_bits(dst[i]) != to_bits(want);
    }
    assert_int_equal(bad, 0);
    dsc_precision_add_rounded(acc, src, N, dtype);
    for (int i = 0; i < N; i++) {
        float want = (float)(i % 97) + dst[i]; /* src rounded as torch does */
        bool ok = isnan(want) ? isnan(acc[i]) : to_bits(acc[i]) == to_bits(want);
        if (!ok && bad++ < 4)
            printf("  %s: %g + round(%g) = %g, want %g\n", dsc_dtype_name(dtype), (double)(i % 97), (double)src[i],
                   (double)acc[i], (double)want);
    }
    assert_int_equal(bad, 0);
    free(src);
    free(dst);
    free(acc);
}

static void test_round_long_passes(void **state) {
    (void)state;
    check_long(DSC_DTYPE_BF16, fx_round_bf16);
    check_long(DSC_DTYPE_F16, fx_round_f16);
}

/* Whether 2-byte `h` is a NaN of `dtype`. */
static bool narrow_nan(uint16_t h, dsc_dtype dtype) {
    return (h & 0x7fffu) > (dtype == DSC_DTYPE_BF16 ? 0x7f80u : 0x7c00u);
}

/* The kernels' packing into 2 bytes (the activations kept in bf16 / fp16, kernels/cpu/cpu_round.c):
 * torch's bit patterns for every fixture value (NaN: a NaN), over a length whose vector loops end
 * mid-way. */
static void test_kernels_pack_bits_match_torch(void **state) {
    (void)state;
    enum { N = 16 * N_ROUND + 7 };
    float *src = malloc(N * sizeof *src);
    uint16_t *dst = malloc(N * sizeof *dst);
    assert_non_null(src && dst);
    for (int i = 0; i < N; i++)
        src[i] = from_bits(fx_round_in[i % N_ROUND]);
    const dsc_dtype types[2] = {DSC_DTYPE_BF16, DSC_DTYPE_F16};
    const uint16_t *refs[2] = {fx_round_bf16, fx_round_f16};
    for (int k = 0; k < 2; k++) {
        dsc_cpu_pack_span(dst, src, N, types[k]);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            const uint16_t want = refs[k][i % N_ROUND];
            bad += narrow_nan(want, types[k]) ? !narrow_nan(dst[i], types[k]) : dst[i] != want;
        }
        assert_int_equal(bad, 0);
    }
    free(src);
    free(dst);
}

static void test_loss_scaler_matches_deepspeed(void **state) {
    (void)state;
    for (size_t c = 0; c < sizeof fx_scaler_cases / sizeof fx_scaler_cases[0]; c++) {
        const fx_scaler_case *fx = &fx_scaler_cases[c];
        dsc_loss_scaler s;
        dsc_loss_scaler_init(&s, &(dsc_loss_scaler_options){.dynamic = true,
                                                            .init_scale = fx->init_scale,
                                                            .scale_window = fx->window,
                                                            .hysteresis = fx->hysteresis,
                                                            .consecutive_hysteresis = fx->consecutive != 0,
                                                            .min_scale = fx->min_scale,
                                                            .scale_factor = 2.0});
        int n = (int)strlen(fx->overflow);
        for (int i = 0; i < n; i++) {
            char msg[200];
            dsc_status st = dsc_loss_scaler_update(&s, fx->overflow[i] == '1', msg, sizeof msg);
            if (i == fx->error_at) {
                assert_err(st, DSC_ERR_NUMERIC, "already at fp16.min_loss_scale");
                break;
            }
            assert_ok(st);
            if (s.cur_scale != fx->scale_after[i] || s.cur_hysteresis != fx->hysteresis_after[i])
                fail_msg("case %s, update %d: scale %g hysteresis %d, DeepSpeed %g %d", fx->name, i, s.cur_scale,
                         s.cur_hysteresis, fx->scale_after[i], fx->hysteresis_after[i]);
            if (fx->overflow[i] == '1') assert_non_null(strstr(msg, "OVERFLOW! Skipping step."));
        }
        printf("  %-14s %2d updates as DeepSpeed's DynamicLossScaler (final scale %g)\n", fx->name, n,
               s.cur_scale);
    }
}

/* Packing in place and widening back (whole range, and a share at an offset as ZeRO's in-place
 * reduce-scatter leaves it): the values rounded, nothing else touched. */
static void test_pack_in_place(void **state) {
    (void)state;
    enum { N = 1000, AT = 337, M = 401 };
    dsc_dtype types[2] = {DSC_DTYPE_BF16, DSC_DTYPE_F16};
    for (int k = 0; k < 2; k++) {
        float x[N], want[N];
        for (int i = 0; i < N; i++)
            x[i] = want[i] = sinf(0.37f * (float)i) * powf(2.0f, (float)(i % 40 - 20));
        dsc_round_to_dtype(want, N, types[k]);
        float y[N];
        memcpy(y, x, sizeof x);
        dsc_precision_pack(y, N, types[k]);
        dsc_precision_unpack(y, y, N, types[k]);
        assert_memory_equal(y, want, sizeof y);
        memcpy(y, x, sizeof x);
        dsc_precision_pack(y, N, types[k]);
        dsc_precision_unpack(y + AT, (uint16_t *)(void *)y + AT, M, types[k]); /* the share [AT, AT + M) */
        assert_memory_equal(y + AT, want + AT, M * sizeof(float));
        float acc[M];
        for (int i = 0; i < M; i++)
            acc[i] = 1.0f;
        memcpy(y, x, sizeof x);
        dsc_precision_pack(y, N, types[k]);
        dsc_precision_unpack_add(acc, (uint16_t *)(void *)y + AT, M, types[k]);
        for (int i = 0; i < M; i++)
            assert_true(acc[i] == 1.0f + want[AT + i]);
    }
}

/* DeepSpeed's mixed-precision model states: 2 + 2 + 12 bytes per parameter for Adam, 16 / dp at stage 3. */
static void test_memory_formula_halves(void **state) {
    (void)state;
    const double psi = 7.5e9;
    dsc_zero_memory f32, mixed, z3;
    dsc_zero_memory_formula(0, psi, 64, 8, &f32);
    dsc_zero_memory_formula(0, psi, 64, 8 | DSC_ZERO_MIXED_PRECISION, &mixed);
    dsc_zero_memory_formula(3, psi, 64, 8 | DSC_ZERO_MIXED_PRECISION, &z3);
    assert_true(mixed.params == 2 * psi && mixed.grads == 2 * psi && mixed.optim == 12 * psi);
    assert_true(mixed.params == f32.params / 2 && mixed.grads == f32.grads / 2);
    assert_true(z3.params + z3.grads + z3.optim == 16 * psi / 64);
    char *text = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&text, &len);
    assert_non_null(fp);
    dsc_zero_model_size size = {.params = psi, .largest_layer = 1e8};
    dsc_zero_estimate_print(fp, &size, 64, 1, 1, 8 | DSC_ZERO_MIXED_PRECISION);
    fclose(fp);
    assert_non_null(strstr(text, "bf16/fp16 mixed precision: 2-byte parameters and gradients"));
    assert_non_null(strstr(text, "13.970       13.970       83.819")); /* stage 0: 2, 2, 12 bytes of 7.5B in GiB */
    free(text);
}

/* The sections as DeepSpeed spells them, to the wrapper's options; the refusals. */
static void test_config_sections(void **state) {
    (void)state;
    dsc_config c;
    dsc_precision_options po;
    assert_ok(dsc_config_parse_string("{\"fp16\": {\"enabled\": true, \"initial_scale_power\": 12, "
                                      "\"loss_scale_window\": 500, \"hysteresis\": 3, \"min_loss_scale\": 2}}",
                                      "c.json", NULL, 0, &c));
    assert_true(dsc_precision_from_config(&c, &po));
    assert_int_equal(po.dtype, DSC_DTYPE_F16);
    assert_true(po.check_overflow && po.scaler.dynamic && po.scaler.init_scale == 4096.0);
    assert_true(po.scaler.scale_window == 500 && po.scaler.hysteresis == 3 && po.scaler.min_scale == 2.0);
    assert_int_equal(dsc_precision_comm_dtype(&c), DSC_DTYPE_F16); /* DeepSpeed: the training dtype */
    dsc_config_free(&c);
    assert_ok(dsc_config_parse_string("{\"fp16\": {\"enabled\": true, \"loss_scale\": 128}, "
                                      "\"communication_data_type\": \"float32\"}",
                                      "c.json", NULL, 0, &c));
    assert_true(dsc_precision_from_config(&c, &po));
    assert_true(!po.scaler.dynamic && po.scaler.init_scale == 128.0);
    assert_int_equal(dsc_precision_comm_dtype(&c), DSC_DTYPE_F32);
    dsc_config_free(&c);
    assert_ok(dsc_config_parse_string("{\"bf16\": {\"enabled\": true}, \"communication_data_type\": \"fp16\"}",
                                      "c.json", NULL, 0, &c));
    assert_true(dsc_precision_from_config(&c, &po));
    assert_true(po.dtype == DSC_DTYPE_BF16 && !po.check_overflow && po.scaler.init_scale == 1.0);
    assert_int_equal(dsc_precision_comm_dtype(&c), DSC_DTYPE_F16);
    dsc_config_free(&c);
    /* off: "auto" (the HF Trainer's default), and f32 training reduced in bf16 */
    assert_ok(dsc_config_parse_string("{\"fp16\": {\"enabled\": \"auto\"}, \"communication_data_type\": "
                                      "\"bfloat16\"}",
                                      "c.json", NULL, 0, &c));
    assert_false(dsc_precision_from_config(&c, &po));
    assert_int_equal(dsc_precision_comm_dtype(&c), DSC_DTYPE_BF16);
    dsc_config_free(&c);
    assert_err(dsc_config_parse_string("{\"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true}}", "c.json",
                                       NULL, 0, &c),
               DSC_ERR_CONFIG, "\"fp16.enabled\" and \"bf16.enabled\" are both true");
    assert_err(
        dsc_config_parse_string("{\"fp16\": {\"enabled\": true, \"auto_cast\": true}}", "c.json", NULL, 0, &c),
        DSC_ERR_CONFIG, "\"fp16.auto_cast\" (true) is supported by DeepSpeed, not by dsc");
    assert_err(dsc_config_parse_string("{\"communication_data_type\": \"int8\"}", "c.json", NULL, 0, &c),
               DSC_ERR_CONFIG, "communication_data_type");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_bits_match_torch),
        cmocka_unit_test(test_round_in_place),
        cmocka_unit_test(test_round_long_passes),
        cmocka_unit_test(test_kernels_pack_bits_match_torch),
        cmocka_unit_test(test_loss_scaler_matches_deepspeed),
        cmocka_unit_test(test_pack_in_place),
        cmocka_unit_test(test_memory_formula_halves),
        cmocka_unit_test(test_config_sections),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
