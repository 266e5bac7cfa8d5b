/* Schedules through the public API: argument errors, DeepSpeed's own
 * schedule unit tests (test_pipe_schedule.py) restated, instruction fields
 * (micro-batch, chunk, peers) on hand-checked cases, and the canonical text
 * form against the goldens written by tests/ref/pipe_schedule_ref.py. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/schedule.h"
#include "test_mpi.h"

static dsc_schedule *make(dsc_schedule_kind kind, int M, int P, int S, int v) {
    dsc_schedule *s = NULL;
    assert_ok(dsc_schedule_create(kind, M, P, S, v, &s));
    return s;
}

static int count_type(const dsc_schedule *s, dsc_instr_type type) {
    int total = 0;
    for (int t = 0; t < dsc_schedule_num_steps(s); t++) {
        int n;
        const dsc_instr *in = dsc_schedule_step(s, t, &n);
        for (int i = 0; i < n; i++)
            total += in[i].type == type;
    }
    return total;
}

static void test_invalid_arguments(void **state) {
    (void)state;
    dsc_schedule *s = NULL;
    assert_err(dsc_schedule_create(DSC_SCHEDULE_TRAIN_1F1B, 0, 2, 0, 1, &s), DSC_ERR_INVALID,
               "micro_batches must be >= 1, got 0");
    assert_err(dsc_schedule_create(DSC_SCHEDULE_INFERENCE, 4, 0, 0, 1, &s), DSC_ERR_INVALID,
               "stages must be >= 1, got 0");
    assert_err(dsc_schedule_create(DSC_SCHEDULE_TRAIN_1F1B, 4, 3, 3, 1, &s), DSC_ERR_INVALID,
               "stage_id 3 is out of range for 3 stages");
    assert_err(dsc_schedule_create(DSC_SCHEDULE_GPIPE, 4, 3, -1, 1, &s), DSC_ERR_INVALID, "stage_id -1");
    assert_err(dsc_schedule_create(DSC_SCHEDULE_TRAIN_1F1B, 4, 3, 0, 2, &s), DSC_ERR_INVALID,
               "train schedule: chunks must be 1, got 2");
    assert_err(dsc_schedule_create(DSC_SCHEDULE_INTERLEAVED, 6, 4, 0, 2, &s), DSC_ERR_INVALID,
               "micro_batches 6 must be a multiple of stages 4");
    assert_err(dsc_schedule_create(DSC_SCHEDULE_INTERLEAVED, 8, 4, 0, 1, &s), DSC_ERR_INVALID,
               "chunks v must be >= 2, got 1");
    assert_err(dsc_schedule_create(DSC_SCHEDULE_INTERLEAVED, 4, 1, 0, 2, &s), DSC_ERR_INVALID,
               "stages must be >= 2, got 1");
    assert_err(dsc_schedule_create((dsc_schedule_kind)42, 4, 1, 0, 1, &s), DSC_ERR_INVALID, "kind 42");
    assert_err(dsc_schedule_create(DSC_SCHEDULE_GPIPE, 100000, 1000, 0, 1, &s), DSC_ERR_INVALID,
               "M*P*v = 100000000 is too large");
    assert_null(s);
    s = make(DSC_SCHEDULE_DATA_PARALLEL, 2, 1, 0, 1);
    int n = 7;
    assert_null(dsc_schedule_step(s, 2, &n));
    assert_int_equal(n, 0);
    assert_null(dsc_schedule_step(s, -1, &n));
    dsc_schedule_destroy(s);
}

static void test_names(void **state) {
    (void)state;
    assert_string_equal(dsc_instr_name(DSC_INSTR_LOAD_MICRO_BATCH), "LoadMicroBatch");
    assert_string_equal(dsc_instr_name(DSC_INSTR_RECV_GRAD), "RecvGrad");
    assert_string_equal(dsc_instr_name(DSC_INSTR_OPTIMIZER_STEP), "OptimizerStep");
    const char *names[] = {"train", "infer", "dp", "gpipe", "interleaved"};
    for (int k = 0; k < DSC_SCHEDULE_KIND_COUNT; k++) {
        dsc_schedule_kind kind;
        assert_ok(dsc_schedule_kind_from_name(names[k], &kind));
        assert_int_equal(kind, k);
        assert_string_equal(dsc_schedule_kind_name(kind), names[k]);
    }
    dsc_schedule_kind kind;
    assert_err(dsc_schedule_kind_from_name("zb-h1", &kind), DSC_ERR_INVALID, "unknown schedule \"zb-h1\"");
}

/* DeepSpeed: single stage inference is M steps of Load, Forward on one buffer. */
static void test_single_stage_inference(void **state) {
    (void)state;
    dsc_schedule *s = make(DSC_SCHEDULE_INFERENCE, 8, 1, 0, 1);
    assert_int_equal(dsc_schedule_num_steps(s), 8);
    for (int t = 0; t < 8; t++) {
        int n;
        const dsc_instr *in = dsc_schedule_step(s, t, &n);
        assert_int_equal(n, 2);
        assert_int_equal(in[0].type, DSC_INSTR_LOAD_MICRO_BATCH);
        assert_int_equal(in[1].type, DSC_INSTR_FORWARD_PASS);
        assert_int_equal(in[0].buffer, in[1].buffer);
        assert_int_equal(in[1].micro_batch, t);
    }
    dsc_schedule_destroy(s);
}

/* DeepSpeed: single stage train is Load, Forward on even steps and Backward
 * on odd steps, 2M steps, the batch-end trio on the last. */
static void test_single_stage_train(void **state) {
    (void)state;
    dsc_schedule *s = make(DSC_SCHEDULE_TRAIN_1F1B, 8, 1, 0, 1);
    assert_int_equal(dsc_schedule_num_steps(s), 16);
    for (int t = 0; t < 16; t++) {
        int n;
        const dsc_instr *in = dsc_schedule_step(s, t, &n);
        if (t % 2 == 0) {
            assert_int_equal(n, 2);
            assert_int_equal(in[0].type, DSC_INSTR_LOAD_MICRO_BATCH);
            assert_int_equal(in[1].type, DSC_INSTR_FORWARD_PASS);
        } else {
            assert_int_equal(n, t == 15 ? 4 : 1);
            assert_int_equal(in[0].type, DSC_INSTR_BACKWARD_PASS);
            assert_int_equal(in[0].micro_batch, t / 2);
        }
    }
    int n;
    const dsc_instr *last = dsc_schedule_step(s, 15, &n);
    assert_int_equal(last[1].type, DSC_INSTR_REDUCE_TIED_GRADS);
    assert_int_equal(last[2].type, DSC_INSTR_REDUCE_GRADS);
    assert_int_equal(last[3].type, DSC_INSTR_OPTIMIZER_STEP);
    assert_int_equal(last[3].buffer, -1);
    dsc_schedule_destroy(s);
}

/* DeepSpeed: inference on the first, middle and last of three stages. */
static void test_inference_three_stages(void **state) {
    (void)state;
    const int micro[] = {1, 3, 8, 10};
    for (int k = 0; k < 4; k++) {
        const int M = micro[k];
        for (int S = 0; S < 3; S++) {
            dsc_schedule *s = make(DSC_SCHEDULE_INFERENCE, M, 3, S, 1);
            assert_int_equal(dsc_schedule_num_steps(s), M + 2);
            assert_int_equal(dsc_schedule_num_buffers(s), 2);
            for (int t = 0; t < M + 2; t++) {
                int n;
                const dsc_instr *in = dsc_schedule_step(s, t, &n);
                const int m = t - S;
                int expect;
                if (m < 0 || m > M)
                    expect = 0; /* before the first input, idle tail */
                else if (m == M)
                    expect = S < 2 ? 1 : 0; /* the send-only step S+M */
                else
                    expect = 1 + (S == 0 || S == 2) + (S > 0) + (S < 2 && m > 0);
                assert_int_equal(n, expect);
                if (m == M && S < 2) assert_int_equal(in[0].type, DSC_INSTR_SEND_ACTIVATION);
                if (m >= 0 && m < M) assert_int_equal(in[n - 1].type, DSC_INSTR_FORWARD_PASS);
            }
            dsc_schedule_destroy(s);
        }
    }
}

/* DeepSpeed: the first stage never sends gradients or receives activations,
 * the last never sends activations or receives gradients; 2(M+P-1) steps. */
static void test_train_ends(void **state) {
    (void)state;
    for (int M = 1; M <= 9; M += 4) {
        dsc_schedule *first = make(DSC_SCHEDULE_TRAIN_1F1B, M, 4, 0, 1);
        dsc_schedule *last = make(DSC_SCHEDULE_TRAIN_1F1B, M, 4, 3, 1);
        assert_int_equal(count_type(first, DSC_INSTR_SEND_GRAD) + count_type(first, DSC_INSTR_RECV_ACTIVATION), 0);
        assert_int_equal(count_type(last, DSC_INSTR_SEND_ACTIVATION) + count_type(last, DSC_INSTR_RECV_GRAD), 0);
        assert_int_equal(count_type(first, DSC_INSTR_SEND_ACTIVATION), M);
        assert_int_equal(count_type(last, DSC_INSTR_LOAD_MICRO_BATCH), M);
        assert_int_equal(dsc_schedule_num_steps(first), 2 * (M + 3));
        assert_int_equal(dsc_schedule_num_steps(last), 2 * (M + 3));
        for (int t = 0; t < dsc_schedule_num_steps(first); t++) {
            int n;
            const dsc_instr *in = dsc_schedule_step(first, t, &n);
            for (int i = 0; i < n; i++)
                assert_true(in[i].buffer < dsc_schedule_num_buffers(first));
        }
        dsc_schedule_destroy(first);
        dsc_schedule_destroy(last);
    }
}

static void expect_instr(const dsc_schedule *s, int t, int i, dsc_instr want) {
    int n;
    const dsc_instr *in = dsc_schedule_step(s, t, &n);
    assert_true(i < n);
    assert_int_equal(in[i].type, want.type);
    assert_int_equal(in[i].buffer, want.buffer);
    assert_int_equal(in[i].micro_batch, want.micro_batch);
    assert_int_equal(in[i].chunk, want.chunk);
    assert_int_equal(in[i].peer_stage, want.peer_stage);
    assert_int_equal(in[i].peer_chunk, want.peer_chunk);
}

/* Fields the executor needs, on cases checked by hand against docs/schedules.md. */
static void test_instruction_fields(void **state) {
    (void)state;
    /* train 4 3 1, step 5: SendGrad of micro-batch 0 to stage 0, then the
     * inputs of micro-batch 2 from stage 0 into the same slot. */
    dsc_schedule *s = make(DSC_SCHEDULE_TRAIN_1F1B, 4, 3, 1, 1);
    expect_instr(s, 5, 0, (dsc_instr){DSC_INSTR_SEND_GRAD, 0, 0, 0, 0, 0});
    expect_instr(s, 5, 1, (dsc_instr){DSC_INSTR_RECV_ACTIVATION, 0, 2, 0, 0, 0});
    expect_instr(s, 5, 2, (dsc_instr){DSC_INSTR_FORWARD_PASS, 0, 2, 0, -1, -1});
    expect_instr(s, 6, 0, (dsc_instr){DSC_INSTR_RECV_GRAD, 1, 1, 0, 2, 0});
    expect_instr(s, 6, 1, (dsc_instr){DSC_INSTR_SEND_ACTIVATION, 0, 2, 0, 2, 0});
    expect_instr(s, 11, 1, (dsc_instr){DSC_INSTR_REDUCE_TIED_GRADS, -1, -1, -1, -1, -1});
    dsc_schedule_destroy(s);
    /* Interleaved, P=2, v=2: virtual stages 0,1,2,3 live on ranks 0,1,0,1.
     * Rank 1 chunk 0 (virtual stage 1) sends its output around the ring to
     * rank 0 chunk 1; rank 0 chunk 1 sends its input gradient back to it. */
    s = make(DSC_SCHEDULE_INTERLEAVED, 4, 2, 0, 2);
    assert_int_equal(dsc_schedule_num_steps(s), 2 * 4 + 3 * 2 - 2); /* vM + (v+1)P - 2 */
    expect_instr(s, 0, 0, (dsc_instr){DSC_INSTR_LOAD_MICRO_BATCH, 0, 0, 0, -1, -1});
    expect_instr(s, 2, 1, (dsc_instr){DSC_INSTR_RECV_ACTIVATION, 2, 0, 1, 1, 0});
    expect_instr(s, 2, 2, (dsc_instr){DSC_INSTR_FORWARD_PASS, 2, 0, 1, -1, -1});
    /* Step 5: gradient of rank 1 first (edge 0), the activation to rank 1
     * (edge 0), then the wrap edge 1: micro-batch 0's input gradient from
     * chunk 1 back to rank 1 chunk 0, which frees slot 2 for the load. */
    expect_instr(s, 5, 0, (dsc_instr){DSC_INSTR_RECV_GRAD, 3, 1, 1, 1, 1});
    expect_instr(s, 5, 1, (dsc_instr){DSC_INSTR_SEND_ACTIVATION, 4, 2, 0, 1, 0});
    expect_instr(s, 5, 2, (dsc_instr){DSC_INSTR_SEND_GRAD, 2, 0, 1, 1, 0});
    expect_instr(s, 5, 3, (dsc_instr){DSC_INSTR_LOAD_MICRO_BATCH, 2, 3, 0, -1, -1});
    expect_instr(s, 5, 4, (dsc_instr){DSC_INSTR_FORWARD_PASS, 2, 3, 0, -1, -1});
    expect_instr(s, 5, 5, (dsc_instr){DSC_INSTR_BACKWARD_PASS, 3, 1, 1, -1, -1});
    dsc_schedule_destroy(s);
    s = make(DSC_SCHEDULE_INTERLEAVED, 4, 2, 1, 2);
    expect_instr(s, 2, 1, (dsc_instr){DSC_INSTR_SEND_ACTIVATION, 0, 0, 0, 0, 1});
    /* The last virtual stage loads labels, runs forward and backward in one step. */
    expect_instr(s, 3, 2, (dsc_instr){DSC_INSTR_LOAD_MICRO_BATCH, 2, 0, 1, -1, -1});
    expect_instr(s, 3, 4, (dsc_instr){DSC_INSTR_BACKWARD_PASS, 2, 0, 1, -1, -1});
    dsc_schedule_destroy(s);
}

/* The library's text form equals the oracle's goldens byte for byte (the
 * ctest test_schedule_golden checks the same through the dsc-schedule app). */
static void test_print_matches_goldens(void **state) {
    (void)state;
    static const struct {
        const char *kind;
        int M, P, S;
    } cases[] = {
        {"train", 4, 2, 0}, {"train", 4, 3, 1}, {"train", 1, 1, 0}, {"train", 8, 4, 3},
        {"train", 8, 4, 0}, {"train", 2, 5, 2}, {"infer", 4, 3, 0}, {"infer", 4, 3, 1},
        {"infer", 4, 3, 2}, {"infer", 1, 1, 0}, {"dp", 3, 1, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char path[512];
        snprintf(path, sizeof path, "%s/tests/pipe/golden/%s_%d_%d_%d.txt", DSC_SOURCE_DIR, cases[c].kind,
                 cases[c].M, cases[c].P, cases[c].S);
        FILE *g = fopen(path, "rb");
        assert_non_null(g);
        static char want[1 << 14], got[1 << 14];
        const size_t nwant = fread(want, 1, sizeof want, g);
        fclose(g);
        dsc_schedule_kind kind;
        assert_ok(dsc_schedule_kind_from_name(cases[c].kind, &kind));
        dsc_schedule *s = make(kind, cases[c].M, cases[c].P, cases[c].S, 1);
        FILE *tmp = tmpfile();
        assert_non_null(tmp);
        assert_ok(dsc_schedule_print(s, tmp));
        rewind(tmp);
        const size_t ngot = fread(got, 1, sizeof got, tmp);
        fclose(tmp);
        dsc_schedule_destroy(s);
        if (ngot != nwant || memcmp(got, want, nwant) != 0) fail_msg("%s differs from the printed stream", path);
        printf("golden %s: %zu bytes identical\n", path + strlen(DSC_SOURCE_DIR) + 1, ngot);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_invalid_arguments),      cmocka_unit_test(test_names),
        cmocka_unit_test(test_single_stage_inference), cmocka_unit_test(test_single_stage_train),
        cmocka_unit_test(test_inference_three_stages), cmocka_unit_test(test_train_ends),
        cmocka_unit_test(test_instruction_fields),     cmocka_unit_test(test_print_matches_goldens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
