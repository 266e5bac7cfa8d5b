/* PP x EP: a GPT-MoE (2 blocks, the second a MoE block with 4 experts,
 * top-2, capacity factor 1) trained for 10 steps with 2 pipeline stages x 2
 * data-parallel ranks on 4 ranks, the MoE stage's experts split over its
 * expert-parallel group of 2 (the trainer's prepare_build hook registers
 * moe_block with that group), gives the losses (and auxiliary losses) of one
 * process accumulating the same global batch, within 1e-5 relative, and the
 * same parameters within 2e-3 of each tensor's largest value (AdamW turns
 * f32 rounding of different reduction orders into O(lr) steps on elements
 * with tiny gradients; tests/moe/test_moe_train.c uses the same bound). The
 * attention key bias is off (its gradient is exactly zero). The partition
 * counts the whole model's parameters (every expert, as the one process
 * holds them), and separately what one expert-parallel rank holds. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsc/data.h"
#include "dsc/moe.h"
#include "dsc/pipe.h"
#include "test_mpi.h"

enum { STEPS = 10, TOKENS = 4096 };

static const char *config_json =
    "{\"train_batch_size\": 16, \"train_micro_batch_size_per_gpu\": 2, \"seed\": 11,"
    " \"model\": {\"arch\": \"gpt-moe\", \"n_layer\": 2, \"d_model\": 16, \"n_head\": 4, \"d_ff\": 24,"
    "            \"vocab_size\": 32, \"seq_len\": 8, \"qkv_bias\": false},"
    " \"moe\": {\"num_experts\": 4, \"ep_size\": %d, \"k\": 2, \"capacity_factor\": 1.0, \"min_capacity\": 1,"
    "          \"layer_freq\": 2, \"use_rts\": false, \"top2_2nd_expert_sampling\": false, \"aux_loss_coef\": "
    "0.01},"
    " \"pipeline\": {\"stages\": %d, \"partition_method\": \"uniform\"},"
    " \"optimizer\": {\"type\": \"adamw\", \"params\": {\"lr\": 0.01}},"
    " \"train\": {\"steps\": 10}, \"data\": {\"path\": \"%s\", \"val_fraction\": 0}}";

static char token_path[128];

static void load_config(dsc_config *cfg, int ep, int stages, int dp) {
    char json[2048];
    snprintf(json, sizeof json, config_json, ep, stages, token_path);
    assert_ok(dsc_config_parse_string(json, "pipe_moe.json", NULL, 0, cfg));
    assert_ok(dsc_config_resolve_batch(cfg, dp));
}

static dsc_status prepare_moe(const dsc_config *cfg, dsc_groups *groups, void *ctx, const void **extra) {
    dsc_moe_build_extra *x = ctx;
    DSC_TRY(dsc_moe_options_from_config(&cfg->moe, cfg->model.arch, &x->options));
    DSC_TRY(dsc_moe_register_layers());
    x->ep = dsc_groups_get(groups, DSC_GROUP_KIND_EXPERT);
    *extra = x;
    return NULL;
}

static void test_pp2_ep2_equals_one_process(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    int rank = dsc_comm_rank(world);
    snprintf(token_path, sizeof token_path, "/tmp/dsc_test_pipe_moe_%d.tok", (int)getpid());
    uint32_t *ids = malloc(TOKENS * sizeof *ids);
    for (int i = 0; i < TOKENS; i++)
        ids[i] = (uint32_t)((i * 7 + (i / 13) * 3) % 32);
    assert_ok(dsc_token_file_write(token_path, ids, TOKENS, DSC_TOKEN_DTYPE_U16, 32));
    free(ids);

    /* One process: every expert local, the whole global batch accumulated. */
    dsc_config one_cfg;
    load_config(&one_cfg, 1, 1, 1);
    dsc_moe_build_extra one_extra = {0};
    assert_ok(dsc_moe_options_from_config(&one_cfg.moe, one_cfg.model.arch, &one_extra.options));
    assert_ok(dsc_moe_register_layers());
    dsc_trainer_layers one_layers = {.build_extra = &one_extra};
    dsc_trainer_options to = {&one_cfg, NULL, false, NULL, false};
    dsc_trainer *one;
    assert_ok(dsc_trainer_create_with_layers(&to, NULL, &one_layers, &one));

    dsc_config cfg;
    load_config(&cfg, 2, 2, 2);
    dsc_moe_build_extra extra = {0};
    dsc_pipe_trainer_options po = {.cfg = &cfg, .world = world, .hooks = {prepare_moe, &extra, NULL}};
    dsc_pipe_trainer *t;
    assert_ok(dsc_pipe_trainer_create(&po, &t));
    assert_int_equal(dsc_comm_size(dsc_groups_get(dsc_pipe_trainer_groups(t), DSC_GROUP_KIND_EXPERT)), 2);
    const dsc_pipe_module *module = dsc_pipe_trainer_module(t);
    const int64_t whole = dsc_trainer_param_count(one);
    if (rank == 0)
        printf("  parameters: %lld in the module (%lld per expert-parallel rank), %lld in one process\n",
               (long long)dsc_pipe_module_unique_params(module), (long long)dsc_pipe_module_rank_params(module),
               (long long)whole);
    assert_int_equal(dsc_pipe_module_unique_params(module), whole);
    assert_int_equal(dsc_trainer_model_param_count(one), whole);
    assert_true(dsc_pipe_module_rank_params(module) < whole); /* half the experts */

    double worst = 0;
    dsc_step_metrics last = {0};
    for (int s = 0; s < STEPS; s++) {
        dsc_step_metrics a, b;
        assert_ok(dsc_engine_step(dsc_pipe_trainer_engine(t), &a));
        assert_ok(dsc_engine_step(dsc_trainer_engine(one), &b));
        double rel = fmax(fabs(a.loss - b.loss) / fabs(b.loss),
                          fabs(a.aux_loss - b.aux_loss) / fmax(fabs(b.aux_loss), 1e-6));
        if (rank == 0)
            printf("  step %2d loss %.7f aux %.7f vs %.7f aux %.7f (rel %.2e)\n", s + 1, a.loss, a.aux_loss,
                   b.loss, b.aux_loss, rel);
        worst = fmax(worst, rel);
        last = a;
    }
    assert_true(worst <= 1e-5);
    /* Every step times its phases; stages exchange activations and gradients. */
    assert_true(last.phase_s[DSC_PHASE_FORWARD] > 0 && last.phase_s[DSC_PHASE_BACKWARD] > 0);
    assert_true(last.phase_s[DSC_PHASE_P2P] > 0 && last.phase_s[DSC_PHASE_OPTIMIZER] > 0);
    double phases = 0;
    for (int p = 0; p < DSC_PHASE_COUNT; p++)
        phases += last.phase_s[p];
    assert_true(phases <= last.step_s);
    dsc_param_store *got = dsc_pipe_trainer_params(t), *want = dsc_trainer_params(one);
    double pworst = 0;
    for (int i = 0; i < dsc_params_count(got); i++) {
        const dsc_param *p = dsc_params_at(got, i), *q = dsc_params_find(want, p->name);
        assert_non_null(q);
        double d = 0, ref = 1e-6;
        for (int64_t j = 0; j < dsc_param_numel(p); j++) {
            d = fmax(d, fabs(((const float *)p->value.data)[j] - ((const float *)q->value.data)[j]));
            ref = fmax(ref, fabs(((const float *)q->value.data)[j]));
        }
        pworst = fmax(pworst, d / ref);
    }
    printf("  rank %d (stage %d): parameters after %d steps, worst relative difference %.2e\n", rank,
           dsc_pipe_trainer_stage_id(t), STEPS, pworst);
    assert_true(pworst <= 2e-3);
    dsc_pipe_trainer_destroy(t);
    dsc_trainer_destroy(one);
    dsc_config_free(&cfg);
    dsc_config_free(&one_cfg);
    unlink(token_path);
    dsc_comm_free(world);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pp2_ep2_equals_one_process),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
