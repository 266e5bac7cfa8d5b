/* A data-parallel trainer built from a config: the wiring of parameter
 * store, model layers, plain optimizer, default runner, data loader and engine
 * that dsc-train, bench_train and the engine tests share, plus the
 * full-recompute text generation dsc-train prints at the end.
 *
 * Not here: pipelines (pipe/ wires its own runner into dsc_engine_create),
 * MoE layers (the caller's dsc_trainer_layers bring them), sharded optimizers (the caller's optimizer maker), or
 * fast generation (inference/). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/engine.h"
#include "dsc/log.h"
#include "dsc/model.h"
#include "dsc/precision.h"

struct dsc_trainer {
    dsc_model_config mc;
    dsc_param_store *params;
    dsc_layer **layers; /* [n_layers] forward order */
    int n_layers;
    dsc_data_loader *data;
    dsc_optimizer *opt;
    dsc_batch_runner *runner;
    dsc_engine *engine;
    dsc_trainer_layers ext; /* build extra and expert groups from above the runtime (zero when dense) */
    dsc_rng layer_rng;      /* for stochastic layers */
    dsc_tensor context;     /* (1, T) i32 generation context */
};

static dsc_status check_supported(const dsc_config *cfg, bool can_shard, bool has_ext) {
    const char *src = cfg->source ? cfg->source : "config";
    DSC_CHECK(
        cfg->pipeline.stages == 1, DSC_ERR_UNSUPPORTED,
        "%s: \"pipeline.stages\" = %d needs the pipeline runner (pipe/); the data-parallel trainer runs 1 stage",
        src, cfg->pipeline.stages);
    DSC_CHECK(cfg->zero_optimization.stage == 0 || can_shard, DSC_ERR_UNSUPPORTED,
              "%s: \"zero_optimization.stage\" = %d needs a sharded optimizer (zero/), and none was given to the "
              "trainer",
              src, cfg->zero_optimization.stage);
    DSC_CHECK(cfg->moe.num_experts == 0 || has_ext, DSC_ERR_UNSUPPORTED,
              "%s: \"moe.num_experts\" = %d needs the MoE layers (moe/), and the trainer was given none "
              "(dsc_trainer_create_with_layers)",
              src, cfg->moe.num_experts);
    DSC_CHECK(
        cfg->data.path && cfg->data.path[0], DSC_ERR_CONFIG,
        "%s: \"data.path\" is empty; set it to a token file (make one with dsc-train --prepare TEXT OUT) or a "
        "Megatron dataset prefix",
        src);
    DSC_CHECK(cfg->train_micro_batch_size_per_gpu > 0 && cfg->gradient_accumulation_steps > 0, DSC_ERR_CONFIG,
              "%s: batch sizes are not resolved (call dsc_config_resolve_batch first)", src);
    return NULL;
}

dsc_status dsc_trainer_model_config(const dsc_config *cfg, dsc_model_config *mc) {
    const dsc_config_model *m = &cfg->model;
    dsc_model_config_defaults(mc, m->arch);
    mc->n_layer = m->n_layer;
    mc->d_model = m->d_model;
    mc->n_head = m->n_head;
    mc->n_kv_head = m->n_kv_head;
    mc->d_ff = m->d_ff;
    mc->vocab_size = m->vocab_size;
    mc->seq_len = m->seq_len;
    mc->tie_embeddings = m->tie_embeddings;
    mc->activation_checkpointing = m->activation_checkpointing;
    mc->qkv_bias = m->qkv_bias;
    mc->rope_theta = (float)m->rope_theta;
    mc->norm_eps = (float)m->norm_eps;
    mc->moe_num_experts = cfg->moe.num_experts;
    mc->moe_layer_freq = cfg->moe.layer_freq;
    return dsc_model_config_validate(mc);
}

static dsc_status build_layers(dsc_trainer *t, uint64_t seed) {
    DSC_TRY(dsc_params_create(&t->params, DSC_CPU, seed));
    DSC_TRY(dsc_nn_register_dense_layers());
    dsc_layer_spec *specs;
    int count;
    DSC_TRY(dsc_model_specs(&t->mc, &specs, &count));
    t->layers = calloc((size_t)count, sizeof *t->layers);
    dsc_status s = t->layers ? NULL : dsc_error(DSC_ERR_NOMEM, "trainer: %d layers", count);
    dsc_build_ctx ctx = {.model = &t->mc,
                         .params = t->params,
                         .device = DSC_CPU,
                         .extra = t->ext.build_extra,
                         .tp = t->ext.tp,
                         .attention = t->ext.attention};
    for (int i = 0; i < count && !s; i++) {
        s = dsc_layer_build(&specs[i], &ctx, &t->layers[i]);
        if (!s) t->n_layers++;
    }
    free(specs);
    DSC_TRY(s);
    return dsc_params_finalize(t->params);
}

/* DeepSpeed's offload moves state from the GPU to host memory; this trainer
 * keeps everything in host memory, so the request is met as it stands. */
static void note_offload(const dsc_config *cfg) {
    const dsc_config_zero *z = &cfg->zero_optimization;
    if (z->offload_optimizer == DSC_OFFLOAD_DEVICE_CPU || z->offload_param == DSC_OFFLOAD_DEVICE_CPU ||
        z->cpu_offload)
        dsc_log_rank0(DSC_LOG_INFO,
                      "%s: offload to \"cpu\": this job trains on the CPU, so its optimizer state and parameters "
                      "are in host memory already",
                      cfg->source ? cfg->source : "config");
}

static dsc_status setup(dsc_trainer *t, const dsc_trainer_options *o, dsc_optimizer_maker make_optimizer) {
    const dsc_config *cfg = o->cfg;
    DSC_TRY(check_supported(cfg, make_optimizer != NULL, t->ext.build_extra != NULL));
    note_offload(cfg);
    DSC_TRY(dsc_trainer_model_config(cfg, &t->mc));
    int dp_rank = o->dp ? dsc_comm_rank(o->dp) : 0, dp_size = o->dp ? dsc_comm_size(o->dp) : 1;
    int M = (int)cfg->gradient_accumulation_steps;
    int64_t B = cfg->train_micro_batch_size_per_gpu, T = t->mc.seq_len;
    /* The data first: a missing or bad file should not wait for model setup. */
    dsc_data_loader_options dl = {
        cfg->data.path, cfg->data.val_fraction, t->mc.vocab_size, B, T, M, dp_rank, dp_size, cfg->seed};
    DSC_TRY(dsc_data_loader_open(&dl, &t->data));
    DSC_TRY(build_layers(t, cfg->seed));

    dsc_optimizer_options oo = {
        .params = t->params,
        .layers = t->layers,
        .n_layers = t->n_layers,
        .dp = o->dp,
        .expert_dp = t->ext.expert_dp,
        .ep = t->ext.ep,
        .pipe = t->ext.model,
        .tensor = t->ext.tp ? t->ext.model : NULL,
        .counts_in_norm = t->ext.counts_in_norm,
        .counts_in_norm_ctx = t->ext.counts_in_norm_ctx,
        .reduce_bucket_size = cfg->zero_optimization.reduce_bucket_size,
        .overlap_comm = cfg->zero_optimization.overlap_comm,
        .reduce_dtype = dsc_precision_comm_dtype(cfg),
    };
    dsc_optim_hparams_from_config(cfg, &oo.hparams);
    if (make_optimizer) {
        DSC_TRY(make_optimizer(&oo, cfg, &t->opt)); /* zero/'s maker wraps mixed precision itself */
    } else {
        DSC_TRY(dsc_optimizer_create_plain(&oo, &t->opt));
        DSC_TRY(dsc_precision_maybe_wrap(cfg, &oo, NULL, &t->opt));
    }
    dsc_rng_init(&t->layer_rng, cfg->seed, dp_rank, DSC_RNG_GATE);
    DSC_TRY(dsc_runner_create_default(t->layers, t->n_layers, t->opt, B, T, &t->layer_rng, &t->runner));
    DSC_TRY(dsc_tensor_alloc(&t->context, DSC_DTYPE_I32, 2, (int64_t[]){1, T}, DSC_CPU, DSC_MEM_ACTIVATIONS));

    dsc_engine_options eo;
    dsc_engine_options_init(&eo, cfg, t->runner, t->opt, t->data, T);
    eo.dp = o->dp;
    eo.log = o->log, eo.metrics_path = o->metrics_path, eo.progress = o->progress;
    return dsc_engine_create(&eo, &t->engine);
}

dsc_status dsc_trainer_create(const dsc_trainer_options *opts, dsc_trainer **out) {
    return dsc_trainer_create_with_optimizer(opts, NULL, out);
}

dsc_status dsc_trainer_create_with_optimizer(const dsc_trainer_options *opts, dsc_optimizer_maker make_optimizer,
                                             dsc_trainer **out) {
    return dsc_trainer_create_with_layers(opts, make_optimizer, NULL, out);
}

dsc_status dsc_trainer_create_with_layers(const dsc_trainer_options *opts, dsc_optimizer_maker make_optimizer,
                                          const dsc_trainer_layers *layers, dsc_trainer **out) {
    *out = NULL;
    dsc_trainer *t = calloc(1, sizeof *t);
    DSC_CHECK(t, DSC_ERR_NOMEM, "trainer: out of memory");
    if (layers) t->ext = *layers;
    dsc_status s = setup(t, opts, make_optimizer);
    if (s) {
        dsc_trainer_destroy(t);
        return s;
    }
    *out = t;
    return NULL;
}

void dsc_trainer_destroy(dsc_trainer *t) {
    if (!t) return;
    dsc_engine_destroy(t->engine);
    dsc_batch_runner_destroy(t->runner);
    dsc_optimizer_destroy(t->opt);
    for (int i = 0; i < t->n_layers; i++)
        dsc_layer_destroy(t->layers[i]);
    free(t->layers);
    dsc_params_destroy(t->params);
    dsc_data_loader_close(t->data);
    dsc_tensor_free(&t->context);
    free(t);
}

dsc_engine *dsc_trainer_engine(dsc_trainer *t) {
    return t->engine;
}
dsc_param_store *dsc_trainer_params(dsc_trainer *t) {
    return t->params;
}
dsc_optimizer *dsc_trainer_optimizer(dsc_trainer *t) {
    return t->opt;
}
dsc_rng *dsc_trainer_rng(dsc_trainer *t) {
    return &t->layer_rng;
}

dsc_layer *const *dsc_trainer_model_layers(dsc_trainer *t, int *count) {
    *count = t->n_layers;
    return t->layers;
}

int64_t dsc_trainer_param_count(const dsc_trainer *t) {
    return dsc_params_held_numel(t->params);
}

int64_t dsc_trainer_model_param_count(const dsc_trainer *t) {
    return dsc_params_model_numel(t->params, t->ext.ep ? dsc_comm_size(t->ext.ep) : 1);
}

/* The next token from the last row of logits (V). */
static int32_t pick(const float *logits, int64_t V, float temperature, dsc_rng *rng) {
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (logits[v] > logits[best]) best = v;
    if (temperature <= 0) return (int32_t)best;
    double total = 0;
    for (int64_t v = 0; v < V; v++)
        total += exp((double)(logits[v] - logits[best]) / temperature);
    double u = dsc_rng_uniform(rng) * total;
    for (int64_t v = 0; v < V; v++) {
        u -= exp((double)(logits[v] - logits[best]) / temperature);
        if (u <= 0) return (int32_t)v;
    }
    return (int32_t)best;
}

/* One token after out[0, i): the model's forward on the newest seq_len of them, then a pick from the
 * last position's logits (widened into `row`, V floats, where the head stores them in 2 bytes). */
static dsc_status next_token(dsc_trainer *t, int32_t *out, int i, float temperature, dsc_rng *rng, float *row) {
    const int64_t T = t->mc.seq_len, V = t->mc.vocab_size;
    int64_t len = i < T ? i : T; /* the newest seq_len tokens */
    memcpy(t->context.data, out + (i - len), (size_t)len * sizeof *out);
    dsc_tensor tokens = dsc_tensor_view(t->context.data, DSC_DTYPE_I32, 2, (int64_t[]){1, len}, DSC_CPU);
    dsc_micro_ctx ctx = {.tokens = &tokens, .loss_scale = 1.0f, .training = false, .rng = &t->layer_rng};
    dsc_tensor x = {0}, y = {0};
    for (int l = 0; l < t->n_layers; l++) {
        DSC_TRY(dsc_optimizer_before_layer(t->opt, t->layers[l], false));
        DSC_TRY(dsc_layer_forward(t->layers[l], 0, &x, &y, &ctx));
        DSC_TRY(dsc_optimizer_after_layer(t->opt, t->layers[l], false));
        x = y;
    }
    DSC_CHECK(y.ndim == 3 && y.shape[2] == V, DSC_ERR_INTERNAL,
              "generate: the last layer gave no (1, t, V) logits");
    DSC_TRY(dsc_logits_row(&y, len - 1, row));
    out[i] = pick(row, V, temperature, rng);
    return NULL;
}

dsc_status dsc_trainer_generate(dsc_trainer *t, const int32_t *prompt, int n_prompt, int n_new, float temperature,
                                uint64_t seed, int32_t *out) {
    DSC_CHECK(n_prompt >= 1 && n_new >= 0, DSC_ERR_INVALID, "generate: needs a prompt of >= 1 tokens (got %d)",
              n_prompt);
    memcpy(out, prompt, (size_t)n_prompt * sizeof *out);
    dsc_rng rng;
    dsc_rng_init(&rng, seed, 0, DSC_RNG_SAMPLE);
    float *row = malloc((size_t)t->mc.vocab_size * sizeof *row);
    DSC_CHECK(row, DSC_ERR_NOMEM, "generate: a row of %lld logits", (long long)t->mc.vocab_size);
    dsc_status s = NULL;
    for (int i = n_prompt; i < n_prompt + n_new && !s; i++)
        s = next_token(t, out, i, temperature, &rng, row);
    free(row);
    return s;
}
