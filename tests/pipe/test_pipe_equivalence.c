/* Pipeline equivalence: training a tiny GPT (6 blocks, tied embeddings) for
 * 3 steps with P in {2, 4} stages and DP in {1, 2} replicas (as many as the
 * world allows), M in {1, 3, 8} micro-batches, under 1F1B, GPipe and
 * interleaved 1F1B (v = 2), with and without activation checkpointing and
 * with untied embeddings, gives the same per-step losses and final
 * parameters as one process accumulating M * DP micro-batches of the same
 * global batch (dsc_trainer, no communicator), computed on every rank.
 * Tolerance: 1e-5 relative (losses; parameters per tensor against the
 * tensor's largest value). Every partition method takes part, and ZeRO
 * stages 1 and 2 (zero/, through the trainer's optimizer hook) with 1F1B. The key
 * bias is left out (qkv_bias false): its gradient is exactly zero, so AdamW
 * turns rounding noise into +-lr steps in any summation order (docs/models.md). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../engine/train_fixture.h"
#include "dsc/pipe.h"
#include "dsc/zero.h"
#include "test_mpi.h"

enum { STEPS = 3 };

typedef struct reference {
    int micro, tie;
    double losses[STEPS];
    dsc_config cfg; /* the trainer's engine reads it */
    dsc_trainer *trainer;
} reference;

typedef struct pipe_case {
    const char *schedule; /* "1f1b", "gpipe", "interleaved" */
    int M;
    int ckpt; /* activation_checkpoint_interval */
    bool untied;
    const char *method;
    int zero; /* zero_optimization.stage */
} pipe_case;

static char data_path[128];

static void reference_run(reference *ref, int micro, bool untied) {
    char accum[64];
    snprintf(accum, sizeof accum, "gradient_accumulation_steps=%d", micro);
    const char *over[] = {"model.n_layer=6", "model.qkv_bias=false", accum,
                          untied ? "model.tie_embeddings=false" : "model.tie_embeddings=true"};
    train_fixture_config(&ref->cfg, data_path, over, 4, 1);
    dsc_trainer_options o = {&ref->cfg, NULL, false, NULL, false};
    assert_ok(dsc_trainer_create(&o, &ref->trainer));
    for (int s = 0; s < STEPS; s++) {
        dsc_step_metrics m;
        assert_ok(dsc_engine_step(dsc_trainer_engine(ref->trainer), &m));
        ref->losses[s] = m.loss;
    }
}

static void compare_params(dsc_param_store *got, dsc_param_store *want, double *worst) {
    for (int i = 0; i < dsc_params_count(got); i++) {
        const dsc_param *p = dsc_params_at(got, i);
        const dsc_param *q = dsc_params_find(want, p->name);
        assert_non_null(q);
        assert_int_equal(dsc_param_numel(p), dsc_param_numel(q));
        double max_diff = 0, max_ref = 1e-6;
        for (int64_t k = 0; k < dsc_param_numel(p); k++) {
            double a = ((const float *)p->value.data)[k], b = ((const float *)q->value.data)[k];
            if (!(fabs(a - b) <= max_diff)) max_diff = fabs(a - b);
            max_ref = fmax(max_ref, fabs(b));
        }
        *worst = fmax(*worst, max_diff / max_ref);
        if (getenv("DSC_TEST_VERBOSE")) printf("    %-32s rel err %.3e\n", p->name, max_diff / max_ref);
    }
}

/* Greedy continuation through the pipeline (every rank takes part). */
static void pipe_greedy(dsc_pipe_trainer *t, int32_t *ids, int n_prompt, int n_new) {
    int32_t ctx[16];
    float logits[256];
    dsc_tensor out = dsc_tensor_view(logits, DSC_DTYPE_F32, 1, (int64_t[]){256}, DSC_CPU);
    for (int i = n_prompt; i < n_prompt + n_new; i++) {
        memcpy(ctx, ids, (size_t)i * sizeof *ids);
        dsc_tensor tokens = dsc_tensor_view(ctx, DSC_DTYPE_I32, 2, (int64_t[]){1, i}, DSC_CPU);
        assert_ok(dsc_pipe_runner_logits(dsc_pipe_trainer_runner(t), &tokens, &out));
        int best = 0;
        for (int v = 1; v < 256; v++)
            best = logits[v] > logits[best] ? v : best;
        ids[i] = best;
    }
}

static int64_t activation_bytes(void) {
    dsc_mem_stats st;
    dsc_mem_get_stats(&st);
    return st.current[DSC_MEM_ACTIVATIONS];
}

/* Returns this rank's activation bytes for the case (the trainer's reservations). */
static int64_t run_case(dsc_comm *world, int P, const pipe_case *c, reference *ref) {
    int DP = dsc_comm_size(world) / P;
    char stages[48], sched[48], accum[48], ckpt[64], method[96], zero[48];
    snprintf(stages, sizeof stages, "pipeline.stages=%d", P);
    snprintf(sched, sizeof sched, "pipeline.schedule=%s", c->schedule);
    snprintf(accum, sizeof accum, "gradient_accumulation_steps=%d", c->M);
    snprintf(ckpt, sizeof ckpt, "pipeline.activation_checkpoint_interval=%d", c->ckpt);
    snprintf(method, sizeof method, "pipeline.partition_method=%s", c->method);
    snprintf(zero, sizeof zero, "zero_optimization.stage=%d", c->zero);
    bool inter = strcmp(c->schedule, "interleaved") == 0;
    const char *over[] = {"model.n_layer=6",
                          "model.qkv_bias=false",
                          stages,
                          sched,
                          accum,
                          ckpt,
                          method,
                          c->untied ? "model.tie_embeddings=false" : "model.tie_embeddings=true",
                          "pipeline.p2p_timeout_s=60",
                          inter ? "pipeline.virtual_stages=2" : "pipeline.virtual_stages=1",
                          zero};
    dsc_config cfg;
    train_fixture_config(&cfg, data_path, over, 11, DP);
    dsc_pipe_trainer_options o = {.cfg = &cfg, .world = world, .hooks.make_optimizer = dsc_zero_make_optimizer};
    dsc_pipe_trainer *t;
    int64_t act0 = activation_bytes();
    assert_ok(dsc_pipe_trainer_create(&o, &t));
    int64_t act = activation_bytes() - act0;
    double worst_loss = 0, worst_param = 0;
    for (int s = 0; s < STEPS; s++) {
        dsc_step_metrics m;
        assert_ok(dsc_engine_step(dsc_pipe_trainer_engine(t), &m));
        worst_loss = fmax(worst_loss, fabs(m.loss - ref->losses[s]) / fabs(ref->losses[s]));
    }
    compare_params(dsc_pipe_trainer_params(t), dsc_trainer_params(ref->trainer), &worst_param);
    /* Evaluation: the inference schedule (v = 1) or the chunk ring (v = 2). */
    double val, val_ref;
    assert_ok(dsc_engine_evaluate(dsc_pipe_trainer_engine(t), &val));
    assert_ok(dsc_engine_evaluate(dsc_trainer_engine(ref->trainer), &val_ref));
    if (getenv("DSC_TEST_VERBOSE")) printf("    val loss %.7f vs %.7f\n", val, val_ref);
    worst_loss = fmax(worst_loss, fabs(val - val_ref) / fabs(val_ref));
    /* Generation through the stages continues a prompt as the one process does. */
    int32_t want[12] = {72, 101, 108}, got[12] = {72, 101, 108};
    assert_ok(dsc_trainer_generate(ref->trainer, want, 3, 9, 0.0f, 1, want));
    pipe_greedy(t, got, 3, 9);
    assert_memory_equal(got, want, sizeof want);
    if (dsc_comm_rank(world) == 0)
        printf(
            "  P=%d DP=%d M=%d %-11s ckpt=%d %-6s %-12s zero %d: loss rel err %.2e, param rel err %.2e (stage 0; "
            "losses %.4f -> %.4f)\n",
            P, DP, c->M, c->schedule, c->ckpt, c->untied ? "untied" : "tied", c->method, c->zero, worst_loss,
            worst_param, ref->losses[0], ref->losses[STEPS - 1]);
    assert_true(worst_loss <= 1e-5);
    assert_true(worst_param <= 1e-5);
    dsc_pipe_trainer_destroy(t);
    dsc_config_free(&cfg);
    return act;
}

static reference *reference_for(reference *refs, int *n_refs, int micro, bool untied) {
    for (int i = 0; i < *n_refs; i++)
        if (refs[i].micro == micro && refs[i].tie == !untied) return &refs[i];
    reference *r = &refs[(*n_refs)++];
    r->micro = micro;
    r->tie = !untied;
    reference_run(r, micro, untied);
    return r;
}

static void test_pipeline_equals_one_process(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    snprintf(data_path, sizeof data_path, "/tmp/dsc_test_pipe_eq_%d.tok", (int)getpid());
    train_fixture_tokens(data_path, 20000);
    static const pipe_case cases[] = {
        {"1f1b", 1, 0, false, "parameters", 0},     {"1f1b", 3, 0, false, "parameters", 0},
        {"1f1b", 8, 0, false, "uniform", 0},        {"gpipe", 1, 0, false, "type:block", 0},
        {"gpipe", 3, 0, false, "type:block", 0},    {"gpipe", 8, 0, false, "parameters", 0},
        {"interleaved", 8, 0, false, "uniform", 0}, {"1f1b", 3, 2, false, "parameters", 0},
        {"interleaved", 8, 1, false, "uniform", 0}, {"1f1b", 3, 0, true, "uniform", 0},
        {"1f1b", 3, 0, false, "parameters", 1},     {"1f1b", 3, 0, false, "parameters", 2},
    };
    reference refs[16];
    int n_refs = 0;
    int W = dsc_comm_size(world), ran = 0;
    enum { N_CASES = sizeof cases / sizeof cases[0] };
    for (int P = 2; P <= 4; P *= 2) {
        if (W % P != 0 || W / P > 2) continue;
        int64_t act[N_CASES];
        for (int i = 0; i < N_CASES; i++) {
            reference *ref = reference_for(refs, &n_refs, cases[i].M * (W / P), cases[i].untied);
            act[i] = run_case(world, P, &cases[i], ref);
            ran++;
        }
        /* Checkpointing keeps fewer activations: cases 7 and 8 are cases 1 and 6 with it. */
        int64_t saved[2] = {act[1] - act[7], act[6] - act[8]};
        assert_true(saved[0] >= 0 && saved[1] >= 0);
        dsc_tensor t = dsc_tensor_view(saved, DSC_DTYPE_I64, 1, (int64_t[]){2}, DSC_CPU);
        assert_ok(dsc_comm_allreduce(world, &t, DSC_REDUCE_OP_SUM));
        if (dsc_comm_rank(world) == 0)
            printf(
                "  P=%d: activation checkpointing saves %lld bytes (1F1B, k=2) and %lld bytes (interleaved, k=1) "
                "over all ranks\n",
                P, (long long)saved[0], (long long)saved[1]);
        assert_true(saved[0] > 0 && saved[1] > 0);
    }
    assert_true(ran > 0);
    for (int i = 0; i < n_refs; i++) {
        dsc_trainer_destroy(refs[i].trainer);
        dsc_config_free(&refs[i].cfg);
    }
    unlink(data_path);
    dsc_comm_free(world);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipeline_equals_one_process),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
