/* ZeRO end to end through the real layers (runtime/nn) and the default
 * runner: a tiny GPT with tied embeddings (the embedding is read by the first
 * and the last layer) trained for 10 steps on 2 and 3 data-parallel ranks with
 * each ZeRO stage gives the same losses and parameters as the plain
 * optimizer (<= 1e-6 relative), with gradient accumulation 1 and 4, clipping
 * on, and activation checkpointing on (stage 3 gathers again for the
 * recomputation inside backward). Losses agree to 1e-5 relative. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dsc/engine.h"
#include "dsc/model.h"
#include "test_mpi.h"
#include "zero_test_util.h"

enum { B = 2, T = 16, STEPS = 10 };

typedef struct gpt {
    dsc_model_config mc;
    dsc_param_store *store;
    dsc_layer *layers[16];
    int n_layers;
    dsc_optimizer *opt;
    dsc_batch_runner *runner;
} gpt;

static void gpt_init(gpt *g, dsc_comm *dp, int stage) {
    *g = (gpt){0};
    dsc_model_config_defaults(&g->mc, DSC_ARCH_GPT);
    g->mc.n_layer = 2;
    g->mc.d_model = 32;
    g->mc.n_head = 4;
    g->mc.n_kv_head = 4;
    g->mc.d_ff = 64;
    g->mc.vocab_size = 61;
    g->mc.seq_len = T;
    g->mc.activation_checkpointing = true;
    /* The key bias's exact gradient is zero (softmax ignores a shift shared by
     * all keys); what backward computes is rounding noise, which Adam scales
     * up to whole steps, so any change of summation order (all-reduce vs
     * reduce-scatter) shows there as O(lr) differences. Without it every
     * parameter has a real gradient and the comparison is meaningful. */
    g->mc.qkv_bias = false;
    assert_ok(dsc_nn_register_dense_layers());
    assert_ok(dsc_params_create(&g->store, DSC_CPU, 7));
    dsc_layer_spec *specs;
    int count;
    assert_ok(dsc_model_specs(&g->mc, &specs, &count));
    assert_true(count <= 16);
    dsc_build_ctx ctx = {.model = &g->mc, .params = g->store, .device = DSC_CPU};
    for (int i = 0; i < count; i++)
        assert_ok(dsc_layer_build(&specs[i], &ctx, &g->layers[g->n_layers++]));
    free(specs);
    assert_ok(dsc_params_finalize(g->store));
    dsc_optimizer_options o = {
        .params = g->store,
        .layers = g->layers,
        .n_layers = g->n_layers,
        .dp = dp,
        .hparams = {DSC_OPTIMIZER_TYPE_ADAMW, 0.9f, 0.95f, 1e-8f, 0.0f, 0.1f, 0.5},
        .reduce_bucket_size = 2000,
    };
    assert_ok(dsc_zero_create(&o, &(dsc_zero_options){stage, 1, 3000, 1 << 30, 1 << 30, 0}, &g->opt));
    assert_ok(dsc_runner_create_default(g->layers, g->n_layers, g->opt, B, T, NULL, &g->runner));
}

static void gpt_free(gpt *g) {
    dsc_batch_runner_destroy(g->runner);
    dsc_optimizer_destroy(g->opt);
    for (int i = 0; i < g->n_layers; i++)
        dsc_layer_destroy(g->layers[i]);
    dsc_params_destroy(g->store);
}

/* Tokens that differ per step, micro-batch and rank; targets are the next token. */
typedef struct toy_source {
    dsc_batch_source base;
    int step, rank, V;
} toy_source;

static dsc_status toy_next(dsc_batch_source *base, dsc_tensor *tokens, dsc_tensor *targets) {
    toy_source *src = (toy_source *)base;
    int32_t *x = tokens->data, *y = targets->data;
    for (int i = 0; i < B * T; i++) {
        uint32_t h =
            (uint32_t)(i * 2654435761u) ^ (uint32_t)(src->step * 97 + base->consumed * 13 + src->rank * 7);
        x[i] = (int32_t)((h >> 7) % (uint32_t)src->V);
    }
    for (int i = 0; i < B * T; i++)
        y[i] = (i + 1) % T == 0 ? -1 : x[i + 1];
    base->consumed++;
    return NULL;
}

static void gpt_train(gpt *g, int rank, int M, double *losses) {
    for (int s = 0; s < STEPS; s++) {
        toy_source src = {{toy_next, M, 0}, s, rank, g->mc.vocab_size};
        dsc_batch_result res;
        assert_ok(g->runner->ops->train_batch(g->runner, &src.base, &res));
        assert_ok(dsc_optimizer_reduce_grads(g->opt));
        dsc_optim_stats st;
        assert_ok(dsc_optimizer_step(g->opt, 3e-3, &st));
        losses[s] = res.loss;
    }
}

static void test_gpt_matches_plain(void **state) {
    (void)state;
    dsc_comm *dp;
    assert_ok(dsc_comm_world(NULL, &dp));
    int rank = dsc_comm_rank(dp);
    for (int M = 1; M <= 4; M += 3) {
        gpt ref;
        gpt_init(&ref, dp, 0);
        double ref_loss[STEPS];
        gpt_train(&ref, rank, M, ref_loss);
        int64_t total = 0;
        for (int i = 0; i < dsc_params_count(ref.store); i++)
            total += dsc_param_numel(dsc_params_at(ref.store, i));
        float *want = malloc((size_t)total * sizeof *want), *got = malloc((size_t)total * sizeof *got);
        assert_non_null(want);
        assert_non_null(got);
        zero_test_read_params(ref.store, ref.layers, ref.n_layers, ref.opt, want);
        for (int stage = 1; stage <= 3; stage++) {
            gpt z;
            gpt_init(&z, dp, stage);
            double loss[STEPS];
            gpt_train(&z, rank, M, loss);
            zero_test_read_params(z.store, z.layers, z.n_layers, z.opt, got);
            for (int s = 0; s < STEPS; s++)
                assert_true(fabs(loss[s] - ref_loss[s]) <= 1e-5 * fabs(ref_loss[s]));
            char what[96];
            snprintf(what, sizeof what, "GPT stage %d, dp %d, M %d (loss %.4f -> %.4f)", stage, dsc_comm_size(dp),
                     M, loss[0], loss[STEPS - 1]);
            assert_true(dsc_test_max_rel_err(got, want, total, 1e-3, what) <= 1e-6);
            gpt_free(&z);
        }
        free(want);
        free(got);
        gpt_free(&ref);
    }
    dsc_comm_free(dp);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt_matches_plain),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
