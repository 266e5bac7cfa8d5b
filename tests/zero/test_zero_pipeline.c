/* The optimizer side of PP x ZeRO: a model cut into 2 pipeline stages (the
 * toy's layers 0-2 and 3-4, its first parameter tied between the stages) on
 * 2, 4 and 6 ranks (data-parallel degree 1, 2, 3) trains like the uncut model
 * with the plain optimizer on the same data-parallel ranks, for ZeRO stages 1
 * and 2 (and 0), with the hooks in 1F1B order over 4 micro-batches, the tied
 * gradient summed over the stages between the batch and reduce_grads (the
 * pipeline's ReduceTiedGrads), the norm summed over the pipe group with the
 * tied parameter counted on the first stage only. Stage 3 is refused by
 * dsc_zero_check_pipeline. What a pipeline executor has to do is exactly what
 * this test does around the optimizer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/topology.h"
#include "test_mpi.h"
#include "zero_test_util.h"

typedef struct pipe_ctx {
    dsc_comm *pipe;
    int stage;
} pipe_ctx;

/* ReduceTiedGrads: the tied parameter's gradient summed over the stages. */
static void reduce_tied(toy_model *m, void *ctx) {
    pipe_ctx *pc = ctx;
    dsc_param *tied = dsc_params_find(m->store, "toy.p0");
    assert_non_null(tied);
    assert_non_null(tied->grad.data);
    assert_ok(dsc_comm_allreduce(pc->pipe, &tied->grad, DSC_REDUCE_OP_SUM));
}

static bool counts_in_norm(const dsc_param *param, void *ctx) {
    const pipe_ctx *pc = ctx;
    return !(param->flags & DSC_PARAM_TIED) || pc->stage == 0;
}

/* The toy split after layer 2: stage 0 holds layers 0-2, stage 1 layers 3-4. */
static void stage_spec(toy_spec *spec, int stage) {
    toy_spec_default(spec);
    spec->flags[0] |= DSC_PARAM_TIED;
    if (stage == 0) {
        spec->n_layers = 3;
        for (int i = 7; i < spec->n_params; i++)
            spec->absent[i] = true;
        return;
    }
    for (int i = 1; i < 7; i++)
        spec->absent[i] = true;
    memmove(spec->layer_params[0], spec->layer_params[3], sizeof spec->layer_params[0]);
    memmove(spec->layer_params[1], spec->layer_params[4], sizeof spec->layer_params[1]);
    spec->n_layers = 2;
    spec->layer_base = 3;
}

static void test_pipeline_stages_match_uncut_model(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    dsc_group_plan plan;
    dsc_parallel_dims dims = {.pp = 2, .tp = 1};
    assert_ok(dsc_groups_plan(dsc_comm_size(world), dsc_comm_rank(world), &dims, &plan));
    dsc_groups *groups;
    assert_ok(dsc_groups_create(world, &plan, &groups));
    dsc_comm *dp = dsc_groups_get(groups, DSC_GROUP_KIND_DATA),
             *pipe = dsc_groups_get(groups, DSC_GROUP_KIND_PIPE);
    pipe_ctx pc = {pipe, dsc_comm_rank(pipe)};
    toy_run run = {.steps = 10, .micro_batches = 4, .interleave = true, .lr = 1e-2};

    /* the reference: the whole model on this rank's data-parallel group, plain optimizer */
    toy_spec full;
    toy_spec_default(&full);
    toy_model ref;
    toy_model_init(&ref, &full, dsc_comm_rank(dp));
    dsc_optimizer_options ro = toy_options(&ref, dp);
    dsc_optimizer *plain;
    assert_ok(dsc_optimizer_create_plain(&ro, &plain));
    toy_train(&ref, plain, &run, NULL);

    for (int zstage = 0; zstage <= 3; zstage++) {
        dsc_status refused = dsc_zero_check_pipeline(zstage, 2);
        if (zstage == 3) {
            assert_err(refused, DSC_ERR_UNSUPPORTED, "pipeline.stages = 2 is not supported");
            continue;
        }
        assert_ok(refused);
        toy_spec spec;
        stage_spec(&spec, pc.stage);
        toy_model m;
        toy_model_init(&m, &spec, dsc_comm_rank(dp));
        dsc_optimizer_options o = toy_options(&m, dp);
        o.pipe = pipe;
        o.counts_in_norm = counts_in_norm;
        o.counts_in_norm_ctx = &pc;
        o.reduce_bucket_size = 400;
        dsc_optimizer *opt;
        assert_ok(dsc_zero_create(&o, &(dsc_zero_options){zstage, 2, 300, 0, 0, 0}, &opt));
        toy_run staged = run;
        staged.before_reduce = reduce_tied;
        staged.ctx = &pc;
        toy_train(&m, opt, &staged, NULL);
        double worst = 0;
        for (int i = 0; i < dsc_params_count(m.store); i++) {
            const dsc_param *p = dsc_params_at(m.store, i);
            const dsc_param *r = dsc_params_find(ref.store, p->name);
            assert_non_null(r);
            char what[DSC_PARAM_NAME_MAX + 64];
            snprintf(what, sizeof what, "ZeRO %d, pipe stage %d, dp %d: %s", zstage, pc.stage, dsc_comm_size(dp),
                     p->name);
            double e = dsc_test_max_rel_err(p->value.data, r->value.data, dsc_param_numel(p), 1e-3, what);
            worst = e > worst ? e : worst;
        }
        assert_true(worst <= 1e-5);
        dsc_optimizer_destroy(opt);
        toy_model_free(&m);
    }
    dsc_optimizer_destroy(plain);
    toy_model_free(&ref);
    dsc_groups_free(groups);
    dsc_group_plan_free(&plan);
    dsc_comm_free(world);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pipeline_stages_match_uncut_model),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
