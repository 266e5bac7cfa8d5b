/* Checkpointing a training run (see dsc/checkpoint.h): when to save, what
 * identifies the model, and moving the engine to the restored step. The
 * saving and loading themselves are dsc_checkpoint_save / _load. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/checkpoint.h"
#include "dsc/log.h"
#include "runtime/checkpoint/agree.h"

struct dsc_checkpointer {
    dsc_checkpointer_options o;
    char *config_json;
    char *signature;
    char layout[160];
    int64_t saved_step; /* -1: nothing saved yet */
};

dsc_status dsc_checkpoint_model_signature(const dsc_config *cfg, char **json) {
    const dsc_config_model *m = &cfg->model;
    cJSON *o = cJSON_CreateObject();
    DSC_CHECK(o, DSC_ERR_NOMEM, "model signature");
    cJSON_AddStringToObject(o, "arch", dsc_model_arch_name(m->arch));
    cJSON_AddNumberToObject(o, "n_layer", m->n_layer);
    cJSON_AddNumberToObject(o, "d_model", m->d_model);
    cJSON_AddNumberToObject(o, "n_head", m->n_head);
    cJSON_AddNumberToObject(o, "n_kv_head", m->n_kv_head);
    cJSON_AddNumberToObject(o, "d_ff", m->d_ff);
    cJSON_AddNumberToObject(o, "vocab_size", m->vocab_size);
    cJSON_AddNumberToObject(o, "seq_len", m->seq_len);
    cJSON_AddBoolToObject(o, "tie_embeddings", m->tie_embeddings);
    cJSON_AddBoolToObject(o, "qkv_bias", m->qkv_bias);
    cJSON_AddNumberToObject(o, "num_experts", cfg->moe.num_experts);
    cJSON_AddNumberToObject(o, "moe_layer_freq", cfg->moe.num_experts ? cfg->moe.layer_freq : 0);
    *json = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    DSC_CHECK(*json, DSC_ERR_NOMEM, "model signature");
    return NULL;
}

dsc_status dsc_checkpointer_create(const dsc_checkpointer_options *opts, dsc_checkpointer **out) {
    *out = NULL;
    dsc_checkpointer *c = calloc(1, sizeof *c);
    DSC_CHECK(c, DSC_ERR_NOMEM, "checkpointer");
    c->o = *opts;
    c->saved_step = -1;
    int world;
    MPI_Comm_size(opts->comm, &world);
    snprintf(c->layout, sizeof c->layout,
             "{\"world\": %d, \"pp\": %d, \"tp\": %d, \"dp\": %d, \"ep\": %d, \"zero_stage\": %d}", world,
             opts->pp, opts->cfg->tensor_parallel.autotp_size, opts->dp, opts->ep,
             opts->cfg->zero_optimization.stage);
    dsc_status s = dsc_config_to_json(opts->cfg, &c->config_json);
    if (!s) s = dsc_checkpoint_model_signature(opts->cfg, &c->signature);
    if (s) {
        dsc_checkpointer_destroy(c);
        return s;
    }
    *out = c;
    return NULL;
}

void dsc_checkpointer_destroy(dsc_checkpointer *c) {
    if (!c) return;
    free(c->config_json);
    free(c->signature);
    free(c);
}

static dsc_checkpoint_state state_of(dsc_checkpointer *c) {
    return (dsc_checkpoint_state){
        .comm = c->o.comm,
        .params = c->o.params,
        .optimizer = c->o.optimizer,
        .global_step = dsc_engine_steps_done(c->o.engine),
        .config_json = c->config_json,
        .layout_json = c->layout,
        .model_signature = c->signature,
        .engine_json = "{\"loss_scale\": 1.0}", /* f32 training: no dynamic loss scale */
        .rngs = c->o.rngs,
        .n_rngs = c->o.n_rngs,
    };
}

static const char *save_dir(const dsc_checkpointer *c) {
    return c->o.cfg->checkpoint.save_dir;
}

/* The name of the save at `step`: checkpoint.tag with "{step}" replaced by the
 * step, or global_step<N> when the tag is "" (DeepSpeed's default). */
static void tag_of(const char *tmpl, int64_t step, char *buf, size_t len) {
    const char *at = tmpl ? strstr(tmpl, "{step}") : NULL;
    if (!tmpl || !tmpl[0])
        snprintf(buf, len, "global_step%lld", (long long)step);
    else if (at)
        snprintf(buf, len, "%.*s%lld%s", (int)(at - tmpl), tmpl, (long long)step, at + strlen("{step}"));
    else
        snprintf(buf, len, "%s", tmpl);
}

dsc_status dsc_checkpointer_save(dsc_checkpointer *c) {
    DSC_CHECK(save_dir(c) && save_dir(c)[0], DSC_ERR_CONFIG,
              "%s: \"checkpoint.save_dir\" is empty; nowhere to save",
              c->o.cfg->source ? c->o.cfg->source : "config");
    dsc_checkpoint_state st = state_of(c);
    char tag[128];
    tag_of(c->o.cfg->checkpoint.tag, st.global_step, tag, sizeof tag);
    DSC_TRY(dsc_checkpoint_save(&st, save_dir(c), tag, c->o.cfg->checkpoint.keep_last));
    if (c->o.log) printf("saved checkpoint %s/%s\n", save_dir(c), tag);
    c->saved_step = st.global_step;
    return NULL;
}

int64_t dsc_checkpointer_saved_step(const dsc_checkpointer *c) {
    return c->saved_step;
}

dsc_status dsc_checkpointer_resume(dsc_checkpointer *c, const char *tag) {
    DSC_CHECK(save_dir(c) && save_dir(c)[0], DSC_ERR_CONFIG,
              "%s: \"checkpoint.save_dir\" is empty; nothing to resume from",
              c->o.cfg->source ? c->o.cfg->source : "config");
    dsc_checkpoint_state st = state_of(c);
    int rank;
    MPI_Comm_rank(c->o.comm, &rank);
    if (!tag || strcmp(tag, "latest") == 0) /* a crash may have left latest behind the newest save */
        DSC_TRY(dsc_agree(c->o.comm, rank == 0 ? dsc_checkpoint_recover(save_dir(c), stdout) : NULL));
    DSC_TRY(dsc_checkpoint_load(&st, save_dir(c), tag, DSC_CHECKPOINT_FULL, NULL));
    dsc_engine_set_steps_done(c->o.engine, st.global_step);
    if (c->o.log)
        printf("resumed from %s/%s at step %lld\n", save_dir(c), tag ? tag : "latest", (long long)st.global_step);
    return NULL;
}

dsc_status dsc_checkpointer_on_step(dsc_engine *e, const dsc_step_metrics *m, void *ctx) {
    (void)e;
    dsc_checkpointer *c = ctx;
    int64_t interval = c->o.cfg->checkpoint.save_interval;
    bool due = (interval > 0 && m->step % interval == 0) || m->step == c->o.cfg->train.steps;
    if (!due || !save_dir(c) || !save_dir(c)[0]) return NULL;
    return dsc_checkpointer_save(c);
}
