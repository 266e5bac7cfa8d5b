/* The pipeline simulator against its closed forms (docs/schedules.md):
 * makespan and bubble exactly for unit and for binary-exact unequal costs
 * where the form is exact, peak live activations per stage always; error
 * reports for deadlocked and mismatched streams; the ASCII timeline of a
 * hand-drawn case; the SVG file; and a P=64, M=512 run. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/pipe_sim.h"
#include "test_mpi.h"

typedef struct sim_case {
    dsc_schedule *stages[64];
    int P;
    dsc_pipe_sim_result r;
} sim_case;

static sim_case sc;

static dsc_status run_case(dsc_schedule_kind kind, int M, int P, int v, dsc_pipe_sim_costs costs) {
    sc.P = P;
    for (int s = 0; s < P; s++)
        assert_ok(dsc_schedule_create(kind, M, P, s, v, &sc.stages[s]));
    return dsc_pipe_sim_run(sc.stages, P, &costs, &sc.r);
}

static void free_case(void) {
    dsc_pipe_sim_free(&sc.r);
    for (int s = 0; s < sc.P; s++)
        dsc_schedule_destroy(sc.stages[s]);
}

/* Simulated makespan, bubble and peak_live equal the closed forms: exactly
 * when every cost is a small binary fraction, else within 1e-9. */
static void expect_closed_form(dsc_schedule_kind kind, int M, int P, int v, dsc_pipe_sim_costs costs, int exact) {
    assert_ok(run_case(kind, M, P, v, costs));
    dsc_pipe_sim_bounds cf;
    assert_ok(dsc_pipe_sim_closed_form(kind, M, P, v, &costs, &cf));
    const double tol = exact ? 0.0 : 1e-9;
    if (fabs(sc.r.makespan - cf.makespan) > tol * cf.makespan || fabs(sc.r.bubble - cf.bubble) > 1e-12)
        fail_msg("%s M=%d P=%d v=%d F=%g B=%g: makespan %.17g (closed %.17g), bubble %.17g (closed %.17g)",
                 dsc_schedule_kind_name(kind), M, P, v, costs.forward, costs.backward, sc.r.makespan, cf.makespan,
                 sc.r.bubble, cf.bubble);
    for (int s = 0; s < P; s++) {
        assert_int_equal(sc.r.stages[s].peak_live, dsc_pipe_sim_peak_live_bound(kind, M, P, s, v));
        const double busy =
            kind == DSC_SCHEDULE_INFERENCE ? M * costs.forward : M * (costs.forward + costs.backward);
        assert_true(fabs(sc.r.stages[s].busy - busy) <= tol * busy);
    }
    free_case();
}

static void test_unit_costs_match_closed_forms(void **state) {
    (void)state;
    const dsc_pipe_sim_costs unit = {1, 1, 0};
    int cases = 0;
    for (int P = 1; P <= 8; P++)
        for (int M = 1; M <= 12; M++) {
            expect_closed_form(DSC_SCHEDULE_TRAIN_1F1B, M, P, 1, unit, 1);
            expect_closed_form(DSC_SCHEDULE_INFERENCE, M, P, 1, unit, 1);
            expect_closed_form(DSC_SCHEDULE_GPIPE, M, P, 1, unit, 1);
            cases += 3;
            if (P >= 2 && M % P == 0) {
                expect_closed_form(DSC_SCHEDULE_INTERLEAVED, M, P, 2, unit, 1);
                expect_closed_form(DSC_SCHEDULE_INTERLEAVED, M, P, 4, unit, 1);
                expect_closed_form(DSC_SCHEDULE_INTERLEAVED, M, P, 3, unit, 0);
                cases += 3;
            }
        }
    for (int M = 1; M <= 12; M++)
        expect_closed_form(DSC_SCHEDULE_DATA_PARALLEL, M, 1, 1, unit, 1);
    printf("%d pipelines: simulated makespan, bubble and peak_live equal the closed forms\n", cases + 12);
}

/* Every pipelined kind stays exact for any F and B: 1F1B and GPipe by
 * DeepSpeed's brick-wall grid, interleaved because each steady step holds a
 * forward and a backward on every rank. */
static void test_unequal_costs(void **state) {
    (void)state;
    const dsc_pipe_sim_costs costs[] = {{1, 2, 0}, {0.5, 1.5, 0}, {2, 1, 0}, {1, 3, 0}};
    for (size_t c = 0; c < sizeof costs / sizeof costs[0]; c++)
        for (int P = 1; P <= 8; P++)
            for (int M = 1; M <= 12; M++) {
                expect_closed_form(DSC_SCHEDULE_TRAIN_1F1B, M, P, 1, costs[c], 1);
                expect_closed_form(DSC_SCHEDULE_GPIPE, M, P, 1, costs[c], 1);
                expect_closed_form(DSC_SCHEDULE_INFERENCE, M, P, 1, costs[c], 1);
                if (P >= 2 && M % P == 0) {
                    expect_closed_form(DSC_SCHEDULE_INTERLEAVED, M, P, 2, costs[c], 1);
                    expect_closed_form(DSC_SCHEDULE_INTERLEAVED, M, P, 3, costs[c], 0);
                }
            }
    /* With B = 2F, interleaving beats 1F1B by the bubble it removes. */
    const dsc_pipe_sim_costs b2 = {1, 2, 0};
    dsc_pipe_sim_bounds one;
    assert_ok(run_case(DSC_SCHEDULE_INTERLEAVED, 16, 4, 2, b2));
    assert_ok(dsc_pipe_sim_closed_form(DSC_SCHEDULE_TRAIN_1F1B, 16, 4, 1, &b2, &one));
    printf("interleaved M=16 P=4 v=2 F=1 B=2: makespan %g, 1F1B %g\n", sc.r.makespan, one.makespan);
    assert_true(sc.r.makespan == 52.5 && one.makespan == 57.0);
    free_case();
}

/* Hand-derived values: 1F1B bubble (P-1)/(M+P-1), GPipe the same bubble
 * with M activations held, interleaved (P-1)/(vM+P-1). */
static void test_closed_form_values(void **state) {
    (void)state;
    const dsc_pipe_sim_costs c = {1, 2, 0};
    dsc_pipe_sim_bounds b;
    assert_ok(dsc_pipe_sim_closed_form(DSC_SCHEDULE_TRAIN_1F1B, 8, 4, 1, &c, &b));
    assert_true(b.makespan == 33.0 && b.bubble == 3.0 / 11.0);
    assert_ok(dsc_pipe_sim_closed_form(DSC_SCHEDULE_GPIPE, 8, 4, 1, &c, &b));
    assert_true(b.makespan == 33.0 && b.bubble == 3.0 / 11.0);
    assert_ok(dsc_pipe_sim_closed_form(DSC_SCHEDULE_INTERLEAVED, 8, 4, 2, &c, &b));
    assert_true(b.makespan == 28.5 && b.bubble == 3.0 / 19.0);
    assert_int_equal(dsc_pipe_sim_peak_live_bound(DSC_SCHEDULE_TRAIN_1F1B, 8, 4, 1, 1), 3);
    assert_int_equal(dsc_pipe_sim_peak_live_bound(DSC_SCHEDULE_GPIPE, 8, 4, 1, 1), 8);
    assert_int_equal(dsc_pipe_sim_peak_live_bound(DSC_SCHEDULE_INTERLEAVED, 8, 4, 0, 2), 11);
    assert_err(dsc_pipe_sim_closed_form(DSC_SCHEDULE_TRAIN_1F1B, 0, 4, 1, &c, &b), DSC_ERR_INVALID, "M, P, v");
}

/* With p2p cost C every stage boundary adds latency: never below the C=0 form. */
static void test_p2p_cost(void **state) {
    (void)state;
    const dsc_pipe_sim_costs c = {1, 2, 0.25};
    dsc_pipe_sim_bounds cf;
    for (int P = 1; P <= 4; P++) {
        assert_ok(run_case(DSC_SCHEDULE_TRAIN_1F1B, 8, P, 1, c));
        assert_ok(dsc_pipe_sim_closed_form(DSC_SCHEDULE_TRAIN_1F1B, 8, P, 1, &c, &cf));
        if (P == 1)
            assert_true(sc.r.makespan == cf.makespan);
        else
            assert_true(sc.r.makespan >= cf.makespan + 2 * (P - 1) * c.p2p);
        free_case();
    }
}

static void test_broken_pipelines_are_reported(void **state) {
    (void)state;
    const dsc_pipe_sim_costs c = {1, 1, 0};
    dsc_schedule *s[2];
    /* Stage 1 expects a fifth micro-batch that stage 0 never sends. */
    assert_ok(dsc_schedule_create(DSC_SCHEDULE_TRAIN_1F1B, 4, 2, 0, 1, &s[0]));
    assert_ok(dsc_schedule_create(DSC_SCHEDULE_TRAIN_1F1B, 5, 2, 1, 1, &s[1]));
    dsc_pipe_sim_result r;
    assert_err(dsc_pipe_sim_run(s, 2, &c, &r), DSC_ERR_INVALID, "deadlock");
    assert_null(r.stages);
    dsc_schedule_destroy(s[1]);
    /* GPipe's stage 1 wants a second activation while 1F1B's stage 0 waits for a gradient. */
    assert_ok(dsc_schedule_create(DSC_SCHEDULE_GPIPE, 4, 2, 1, 1, &s[1]));
    assert_err(dsc_pipe_sim_run(s, 2, &c, &r), DSC_ERR_INVALID, "mismatched message");
    /* Slots out of order. */
    dsc_schedule *swapped[2] = {s[1], s[0]};
    assert_err(dsc_pipe_sim_run(swapped, 2, &c, &r), DSC_ERR_INVALID, "slot 0 holds stage 1 of 2");
    const dsc_pipe_sim_costs negative = {1, -1, 0};
    assert_err(dsc_pipe_sim_run(s, 2, &negative, &r), DSC_ERR_INVALID, "backward -1");
    dsc_schedule_destroy(s[0]);
    dsc_schedule_destroy(s[1]);
}

static char *read_back(FILE *f, size_t *len) {
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    rewind(f);
    char *text = calloc(*len + 1, 1);
    assert_non_null(text);
    assert_int_equal(fread(text, 1, *len, f), *len);
    return text;
}

/* train M=2 P=2, F=B=1: stage 0 runs F0 F1, waits for B0's gradient from
 * stage 1 (which runs F0 B0 F1 B1 back to back), then B0, waits, B1. */
static void test_ascii_timeline(void **state) {
    (void)state;
    assert_ok(run_case(DSC_SCHEDULE_TRAIN_1F1B, 2, 2, 1, (dsc_pipe_sim_costs){1, 1, 0}));
    FILE *f = tmpfile();
    assert_non_null(f);
    assert_ok(dsc_pipe_sim_print_timeline(&sc.r, 80, f));
    size_t len;
    char *text = read_back(f, &len);
    fclose(f);
    assert_string_equal(text,
                        "timeline: 1 column = 1 time units; F/B forward/backward (f/b odd model chunks), . idle\n"
                        "stage   0 |FF.B.B|\n"
                        "stage   1 |.FBFB.|\n");
    free(text);
    /* Scaled down: 33 time units into 11 columns, 3 units per column. */
    free_case();
    assert_ok(run_case(DSC_SCHEDULE_GPIPE, 8, 4, 1, (dsc_pipe_sim_costs){1, 2, 0}));
    f = tmpfile();
    assert_ok(dsc_pipe_sim_print_timeline(&sc.r, 11, f));
    text = read_back(f, &len);
    fclose(f);
    assert_non_null(strstr(text, "1 column = 3 time units"));
    assert_non_null(strstr(text, "stage   0 |FFF...BBBBB|\n"));
    free(text);
    free_case();
}

static void test_svg(void **state) {
    (void)state;
    assert_ok(run_case(DSC_SCHEDULE_INTERLEAVED, 4, 2, 2, (dsc_pipe_sim_costs){1, 2, 0}));
    const char *path = DSC_BINARY_DIR "/test_schedule_sim.svg";
    assert_ok(dsc_pipe_sim_write_svg(&sc.r, "interleaved <M=4>", path));
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t len;
    char *text = read_back(f, &len);
    fclose(f);
    remove(path);
    assert_true(strncmp(text, "<svg ", 5) == 0);
    assert_non_null(strstr(text, "interleaved &lt;M=4&gt;"));
    int rects = 0;
    for (const char *p = text; (p = strstr(p, "<rect")); p++)
        rects++;
    assert_int_equal(rects, 2 + 2 * 2 * 4 * 2); /* one background per stage + every compute */
    free(text);
    assert_err(dsc_pipe_sim_write_svg(&sc.r, "x", "/nonexistent-dir/t.svg"), DSC_ERR_IO, "/nonexistent-dir/t.svg");
    free_case();
}

/* The size the issue asks to be instant; exactness holds there too. */
static void test_large_pipeline(void **state) {
    (void)state;
    expect_closed_form(DSC_SCHEDULE_TRAIN_1F1B, 512, 64, 1, (dsc_pipe_sim_costs){1, 2, 0}, 1);
    expect_closed_form(DSC_SCHEDULE_INTERLEAVED, 512, 64, 2, (dsc_pipe_sim_costs){1, 2, 0}, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unit_costs_match_closed_forms),
        cmocka_unit_test(test_unequal_costs),
        cmocka_unit_test(test_closed_form_values),
        cmocka_unit_test(test_p2p_cost),
        cmocka_unit_test(test_broken_pipelines_are_reported),
        cmocka_unit_test(test_ascii_timeline),
        cmocka_unit_test(test_svg),
        cmocka_unit_test(test_large_pipeline),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
