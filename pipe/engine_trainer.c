/* The PP x TP x DP trainer built from a config: the pipeline's counterpart of
 * dsc_trainer (runtime/engine/trainer.c). It forms the groups on the
 * foundation's topology (pipe x data x model, plus expert groups for MoE;
 * tensor parallelism's layers come through hooks.prepare_tp), builds the
 * PipelineModule and only this rank's stage, ties the shared weights across
 * stages, and wires optimizer (data-parallel group, pipe group for the norm,
 * tied parameters counted once), pipeline runner, data loader (this rank's
 * data-parallel shard; both ends of a pipeline read the same stream) and the
 * engine, which averages the loss over data and pipe groups.
 *
 * Not here: ZeRO or MoE themselves (they come in through the hooks), the
 * loop over steps (dsc_engine). */
#include <stdlib.h>
#include <string.h>

#include "dsc/pipe.h"

struct dsc_pipe_trainer {
    dsc_model_config mc;
    dsc_group_plan plan;
    bool planned;
    dsc_groups *groups;
    dsc_pipe_module *module;
    dsc_param_store *params;
    dsc_pipe_stage *stage;
    dsc_pipe_tied *tied;
    dsc_data_loader *data;
    dsc_optimizer *opt;
    dsc_batch_runner *runner;
    dsc_engine *engine;
    dsc_rng layer_rng;
    int stage_id;
    dsc_trainer_layers tp; /* tensor parallelism from hooks.prepare_tp; zero without */
    dsc_comm *model_group; /* the stages' tensor groups of this replica (pp x tp ranks): the norm sums over it */
};

static dsc_schedule_kind schedule_kind(dsc_pipe_schedule_kind k) {
    return k == DSC_PIPE_SCHEDULE_KIND_GPIPE         ? DSC_SCHEDULE_GPIPE
           : k == DSC_PIPE_SCHEDULE_KIND_INTERLEAVED ? DSC_SCHEDULE_INTERLEAVED
                                                     : DSC_SCHEDULE_TRAIN_1F1B;
}

static dsc_status check_config(const dsc_pipe_trainer_options *o, int world) {
    const dsc_config *cfg = o->cfg;
    const char *src = cfg->source ? cfg->source : "config";
    int P = cfg->pipeline.stages, tp = cfg->tensor_parallel.autotp_size;
    DSC_CHECK(P >= 1 && tp >= 1 && world % (P * tp) == 0, DSC_ERR_CONFIG,
              "%s: world = pp x tp x dp: %d ranks are not divisible by \"pipeline.stages\" %d x "
              "\"tensor_parallel.autotp_size\" %d",
              src, world, P, tp);
    DSC_CHECK(tp == 1 || o->hooks.prepare_tp, DSC_ERR_UNSUPPORTED,
              "%s: \"tensor_parallel.autotp_size\" = %d needs the tensor-parallel layers (hooks.prepare_tp)", src,
              tp);
    DSC_CHECK(cfg->zero_optimization.stage == 0 || o->hooks.make_optimizer, DSC_ERR_UNSUPPORTED,
              "%s: \"zero_optimization.stage\" = %d needs a sharded optimizer (hooks.make_optimizer)", src,
              cfg->zero_optimization.stage);
    DSC_CHECK(cfg->moe.num_experts == 0 || o->hooks.prepare_build, DSC_ERR_UNSUPPORTED,
              "%s: \"moe.num_experts\" = %d needs the MoE layers (hooks.prepare_build)", src,
              cfg->moe.num_experts);
    DSC_CHECK(cfg->data.path && cfg->data.path[0], DSC_ERR_CONFIG, "%s: \"data.path\" is empty", src);
    DSC_CHECK(
        cfg->train_micro_batch_size_per_gpu > 0 && cfg->gradient_accumulation_steps > 0 &&
            cfg->data_parallel_size == world / (P * tp),
        DSC_ERR_CONFIG,
        "%s: batch sizes are not resolved for %d data-parallel ranks (world %d / %d stages / %d tensor ranks)",
        src, world / (P * tp), world, P, tp);
    return NULL;
}

static dsc_status make_groups(dsc_pipe_trainer *t, const dsc_config *cfg, dsc_comm *world) {
    dsc_parallel_dims dims = {.pp = cfg->pipeline.stages,
                              .dp = 0,
                              .tp = cfg->tensor_parallel.autotp_size,
                              .ep = cfg->moe.num_experts > 0 ? cfg->moe.ep_size : 0,
                              /* tensor ranks see the same tokens: expert groups come from data groups */
                              .expert_tp = cfg->tensor_parallel.autotp_size > 1};
    DSC_TRY(dsc_groups_plan(dsc_comm_size(world), dsc_comm_rank(world), &dims, &t->plan));
    t->planned = true;
    DSC_TRY(dsc_groups_create(world, &t->plan, &t->groups));
    if (dims.tp == 1) return NULL;
    /* The ranks of this rank's data-parallel replica: every stage's tensor group. */
    const dsc_topology *topo = &t->plan.topo;
    const int data = dsc_topology_axis(topo, "data"), n = dsc_topology_world_size(topo);
    int mine[DSC_TOPOLOGY_MAX_AXES], coord[DSC_TOPOLOGY_MAX_AXES], count = 0;
    DSC_TRY(dsc_topology_coord(topo, dsc_comm_rank(world), mine));
    int *members = malloc((size_t)n * sizeof *members);
    DSC_CHECK(members, DSC_ERR_NOMEM, "model-parallel group of %d ranks", n);
    dsc_status s = NULL;
    for (int r = 0; r < n && !s; r++) {
        s = dsc_topology_coord(topo, r, coord);
        if (!s && coord[data] == mine[data]) members[count++] = r;
    }
    if (!s) s = dsc_comm_create_sub(world, members, count, "model-parallel", &t->model_group);
    free(members);
    return s;
}

/* A tied parameter on one stage only, and a tensor-replicated one on one tensor rank only. */
static bool counts_in_norm(const dsc_param *param, void *ctx) {
    const dsc_pipe_trainer *t = ctx;
    return dsc_pipe_tied_counts_in_norm(param, t->tied) &&
           (!t->tp.counts_in_norm || t->tp.counts_in_norm(param, t->tp.counts_in_norm_ctx));
}

static dsc_status build_stage(dsc_pipe_trainer *t, const dsc_pipe_trainer_options *o) {
    const dsc_config *cfg = o->cfg;
    DSC_TRY(dsc_nn_register_dense_layers());
    const void *extra = NULL;
    if (o->hooks.prepare_build) DSC_TRY(o->hooks.prepare_build(cfg, t->groups, o->hooks.ctx, &extra));
    if (cfg->tensor_parallel.autotp_size > 1)
        DSC_TRY(o->hooks.prepare_tp(cfg, t->groups, o->hooks.tp_ctx, &t->tp));
    dsc_pipe_layer_spec *layers;
    int n;
    DSC_TRY(dsc_pipe_model_layers(&t->mc, &layers, &n));
    dsc_pipe_module_options mo = {
        .layers = layers,
        .n_layers = n,
        .stages = cfg->pipeline.stages,
        .chunks = cfg->pipeline.schedule == DSC_PIPE_SCHEDULE_KIND_INTERLEAVED ? cfg->pipeline.virtual_stages : 1,
        .partition_method = cfg->pipeline.partition_method,
        .model = &t->mc,
        .build_extra = extra,
        .expert_parallel = cfg->moe.num_experts > 0 ? cfg->moe.ep_size : 1,
        .build_tp = t->tp.tp,
        .build_attention = t->tp.attention,
    };
    dsc_status s = dsc_pipe_module_create(&mo, &t->module);
    free(layers);
    DSC_TRY(s);
    DSC_TRY(dsc_params_create(&t->params, DSC_CPU, cfg->seed));
    DSC_TRY(dsc_pipe_stage_build(t->module, t->stage_id, t->params, DSC_CPU, &t->stage));
    DSC_TRY(dsc_params_finalize(t->params));
    dsc_comm *pipe = dsc_groups_get(t->groups, DSC_GROUP_KIND_PIPE);
    DSC_TRY(dsc_pipe_tied_create(t->module, t->stage, pipe, t->params, &t->tied));
    return dsc_pipe_tied_sync_values(t->tied);
}

static dsc_status setup(dsc_pipe_trainer *t, const dsc_pipe_trainer_options *o) {
    const dsc_config *cfg = o->cfg;
    DSC_TRY(check_config(o, dsc_comm_size(o->world)));
    DSC_TRY(dsc_trainer_model_config(cfg, &t->mc));
    DSC_TRY(make_groups(t, cfg, o->world));
    dsc_comm *pipe = dsc_groups_get(t->groups, DSC_GROUP_KIND_PIPE);
    dsc_comm *dp = dsc_groups_get(t->groups, DSC_GROUP_KIND_DATA);
    t->stage_id = dsc_comm_rank(pipe);
    DSC_TRY(dsc_comm_set_timeout(pipe, cfg->pipeline.p2p_timeout_s));
    int M = (int)cfg->gradient_accumulation_steps;
    int64_t B = cfg->train_micro_batch_size_per_gpu, T = t->mc.seq_len;
    dsc_data_loader_options dl = {cfg->data.path,    cfg->data.val_fraction, t->mc.vocab_size, B, T, M,
                                  dsc_comm_rank(dp), dsc_comm_size(dp),      cfg->seed};
    DSC_TRY(dsc_data_loader_open(&dl, &t->data));
    DSC_TRY(build_stage(t, o));

    int n_layers;
    dsc_layer *const *layers = dsc_pipe_stage_layers(t->stage, &n_layers);
    bool moe = cfg->moe.num_experts > 0;
    dsc_optimizer_options oo = {
        .params = t->params,
        .layers = layers,
        .n_layers = n_layers,
        .dp = dp,
        .expert_dp = moe ? dsc_groups_get(t->groups, DSC_GROUP_KIND_EXPERT_DATA) : NULL,
        .ep = moe ? dsc_groups_get(t->groups, DSC_GROUP_KIND_EXPERT) : NULL,
        .pipe = t->model_group ? t->model_group : pipe,
        .tensor = dsc_groups_get(t->groups, DSC_GROUP_KIND_TENSOR),
        .counts_in_norm = counts_in_norm,
        .counts_in_norm_ctx = t,
        .reduce_bucket_size = cfg->zero_optimization.reduce_bucket_size,
        .overlap_comm = cfg->zero_optimization.overlap_comm,
    };
    dsc_optim_hparams_from_config(cfg, &oo.hparams);
    if (o->hooks.make_optimizer)
        DSC_TRY(o->hooks.make_optimizer(&oo, cfg, &t->opt));
    else
        DSC_TRY(dsc_optimizer_create_plain(&oo, &t->opt));

    dsc_rng_init(&t->layer_rng, cfg->seed, dsc_comm_rank(dp), DSC_RNG_GATE);
    dsc_pipe_runner_options ro = {
        .module = t->module,
        .stage = t->stage,
        .pipe = pipe,
        .tied = t->tied,
        .optimizer = t->opt,
        .schedule = schedule_kind(cfg->pipeline.schedule),
        .micro_batches = M,
        .B = B,
        .T = T,
        .activation_checkpoint_interval = cfg->pipeline.activation_checkpoint_interval,
        .rng = &t->layer_rng,
    };
    DSC_TRY(dsc_pipe_runner_create(&ro, &t->runner));
    dsc_engine_options eo;
    dsc_engine_options_init(&eo, cfg, t->runner, t->opt, t->data, T);
    eo.dp = dp, eo.pipe = pipe;
    eo.log = o->log, eo.metrics_path = o->metrics_path, eo.progress = o->progress;
    return dsc_engine_create(&eo, &t->engine);
}

dsc_status dsc_pipe_trainer_create(const dsc_pipe_trainer_options *opts, dsc_pipe_trainer **out) {
    *out = NULL;
    dsc_pipe_trainer *t = calloc(1, sizeof *t);
    DSC_CHECK(t, DSC_ERR_NOMEM, "pipeline trainer: out of memory");
    dsc_status s = setup(t, opts);
    if (s) {
        dsc_pipe_trainer_destroy(t);
        return s;
    }
    *out = t;
    return NULL;
}

void dsc_pipe_trainer_destroy(dsc_pipe_trainer *t) {
    if (!t) return;
    dsc_engine_destroy(t->engine);
    dsc_batch_runner_destroy(t->runner);
    dsc_optimizer_destroy(t->opt);
    dsc_pipe_tied_destroy(t->tied);
    dsc_pipe_stage_destroy(t->stage);
    dsc_params_destroy(t->params);
    dsc_pipe_module_destroy(t->module);
    dsc_data_loader_close(t->data);
    dsc_comm_free(t->model_group);
    dsc_groups_free(t->groups);
    if (t->planned) dsc_group_plan_free(&t->plan);
    free(t);
}

dsc_engine *dsc_pipe_trainer_engine(dsc_pipe_trainer *t) {
    return t->engine;
}
dsc_batch_runner *dsc_pipe_trainer_runner(dsc_pipe_trainer *t) {
    return t->runner;
}
dsc_param_store *dsc_pipe_trainer_params(dsc_pipe_trainer *t) {
    return t->params;
}
const dsc_pipe_module *dsc_pipe_trainer_module(const dsc_pipe_trainer *t) {
    return t->module;
}
dsc_groups *dsc_pipe_trainer_groups(dsc_pipe_trainer *t) {
    return t->groups;
}
dsc_optimizer *dsc_pipe_trainer_optimizer(dsc_pipe_trainer *t) {
    return t->opt;
}
dsc_rng *dsc_pipe_trainer_rng(dsc_pipe_trainer *t) {
    return &t->layer_rng;
}
int dsc_pipe_trainer_stage_id(const dsc_pipe_trainer *t) {
    return t->stage_id;
}

dsc_layer *const *dsc_pipe_trainer_layers(dsc_pipe_trainer *t, int *count) {
    return dsc_pipe_stage_layers(t->stage, count);
}
