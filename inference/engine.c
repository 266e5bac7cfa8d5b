/* The inference engine (DeepSpeed's InferenceEngineV2): owns the KV cache,
 * the sequence state, one reusable ragged batch and the forward scratch, all
 * sized once from the engine config. put() runs exactly one forward over a
 * ragged batch and returns each sequence's last-token logits; query() and
 * can_schedule() answer without side effects; flush() frees a sequence.
 * Under tensor parallelism every rank runs the same engine over its shard:
 * the KV cache holds the rank's KV heads only, and every rank gets the same
 * number of blocks (sized for the rank with the most KV heads), so the same
 * calls make the same block decisions everywhere. Under pipeline
 * parallelism each stage's cache holds its layers only, with the block
 * count of the stage holding the most layers (and KV heads), and forwards
 * run as ticks of the micro-batch pipeline (pipeline.c): the scheduler
 * keeps P micro-batches in flight; put() is one micro-batch through all
 * stages, its logits shared from the last stage, so a caller of put /
 * query / flush cannot tell the layout.
 * Not here: which requests to run (scheduler.c) or sampling. */
#include <stdlib.h>

#include "inference/pipeline.h"
#include "inference/sampling_internal.h"

struct dsc_infer_engine {
    dsc_infer_model *model;
    dsc_kv_config kv;
    dsc_kv_cache *cache;
    dsc_kv_state *state;
    infer_pipeline *pipe;
    dsc_forward_scratch scratch;
    dsc_sample_candidate *candidates; /* (shard V + V): a rank's own candidates, then the merged ones */
};

dsc_infer_engine_config dsc_infer_engine_config_default(const dsc_infer_model *m) {
    int64_t ctx = m->cfg.max_positions < 4096 ? m->cfg.max_positions : 4096;
    return (dsc_infer_engine_config){.block_size = 16,
                                     .kv_cache_bytes = 64ll << 20,
                                     .max_sequences = 64,
                                     .max_context = ctx,
                                     .max_tokens_per_forward = 512,
                                     .max_batch_sequences = 64};
}

dsc_status dsc_infer_engine_create(dsc_infer_model *m, const dsc_infer_engine_config *cfg,
                                   dsc_infer_engine **out) {
    *out = NULL;
    dsc_infer_engine *e = calloc(1, sizeof *e);
    DSC_CHECK(e, DSC_ERR_NOMEM, "inference engine");
    e->model = m;
    e->kv = (dsc_kv_config){.num_layers = m->layer1 - m->layer0,
                            .num_kv_heads = m->shard.n_kv_head,
                            .head_size = m->cfg.head_size,
                            .block_size = cfg->block_size,
                            .kv_cache_bytes = cfg->kv_cache_bytes,
                            .max_sequences = cfg->max_sequences,
                            .max_context =
                                cfg->max_context < m->cfg.max_positions ? cfg->max_context : m->cfg.max_positions,
                            .max_tokens_per_forward = cfg->max_tokens_per_forward,
                            .max_batch_sequences = cfg->max_batch_sequences,
                            .dtype = cfg->kv_dtype};
    dsc_status s = dsc_kv_config_validate(&e->kv);
    if (!s && (m->tp_comm || m->pipe_comm)) {
        /* Every rank gets the block count of the rank holding the most KV heads and
         * layers, so all ranks make the same KV and scheduling decisions without talking. */
        dsc_kv_config widest = e->kv;
        if (m->tp_comm) widest.num_kv_heads = m->tp_max_kv_heads;
        widest.num_layers = m->pp_max_layers;
        int64_t blocks = cfg->kv_cache_bytes / (int64_t)dsc_kv_config_block_bytes(&widest);
        e->kv.kv_cache_bytes = blocks * (int64_t)dsc_kv_config_block_bytes(&e->kv);
        if (blocks < 1) s = dsc_kv_config_validate(&widest); /* names the budget that is too small */
    }
    if (!s) s = dsc_kv_cache_create(&e->cache, &e->kv, DSC_CPU);
    if (!s) s = dsc_kv_state_create(&e->state, &e->kv, dsc_kv_cache_blocks(e->cache));
    if (!s) s = infer_pipeline_create(m, &e->kv, cfg->micro_batches, &e->pipe);
    if (!s) s = dsc_forward_scratch_init(&e->scratch, m, e->kv.max_tokens_per_forward, e->kv.max_batch_sequences);
    if (!s) {
        e->candidates = malloc(((size_t)m->shard.vocab_size + (size_t)m->cfg.vocab_size) * sizeof *e->candidates);
        if (!e->candidates) s = dsc_error(DSC_ERR_NOMEM, "sampling candidates for %d tokens", m->cfg.vocab_size);
    }
    if (s) {
        dsc_infer_engine_destroy(e);
        return dsc_error_wrap(s, "creating the inference engine for %s", m->policy->arch);
    }
    *out = e;
    return NULL;
}

void dsc_infer_engine_destroy(dsc_infer_engine *e) {
    if (!e) return;
    free(e->candidates);
    dsc_forward_scratch_free(&e->scratch);
    infer_pipeline_destroy(e->pipe);
    dsc_kv_state_destroy(e->state);
    dsc_kv_cache_destroy(e->cache);
    free(e);
}

const dsc_kv_config *dsc_infer_engine_kv_config(const dsc_infer_engine *e) {
    return &e->kv;
}
int32_t dsc_infer_engine_vocab_size(const dsc_infer_engine *e) {
    return e->model->cfg.vocab_size;
}
int32_t dsc_infer_engine_logits_width(const dsc_infer_engine *e) {
    return e->model->shard.vocab_size;
}

dsc_status dsc_infer_engine_sample(dsc_infer_engine *e, const float *row, const dsc_sampling_params *params,
                                   const int32_t *history, int64_t n_history, dsc_rng *rng, int32_t *token) {
    const dsc_infer_model *m = e->model;
    if (!m->tp_comm)
        return dsc_sample(token, row, m->cfg.vocab_size, params, history, n_history, e->candidates, rng);
    dsc_sample_shard shard = {m->tp_comm, m->vocab0, m->shard.vocab_size, m->cfg.vocab_size};
    return dsc_sample_sharded(token, row, &shard, params, history, n_history, e->candidates, rng);
}

int32_t dsc_infer_engine_depth(const dsc_infer_engine *e) {
    return infer_pipeline_depth(e->pipe);
}

bool dsc_infer_engine_samples(const dsc_infer_engine *e) {
    return e->model->last;
}

dsc_status dsc_infer_engine_tick(dsc_infer_engine *e, int32_t n, const uint64_t *uids,
                                 const int32_t *const *tokens, const int32_t *counts, float *logits,
                                 int32_t *landed) {
    *landed = 0;
    /* Inputs are checked before any state changes, so a forward never fails on them. */
    int32_t V = e->model->cfg.vocab_size;
    for (int32_t i = 0; i < n; i++)
        for (int32_t j = 0; tokens && tokens[i] && j < counts[i]; j++)
            DSC_CHECK(tokens[i][j] >= 0 && tokens[i][j] < V, DSC_ERR_INVALID,
                      "put: sequence %llu token %d is id %d, outside the vocabulary [0, %d)",
                      (unsigned long long)uids[i], j, tokens[i][j], V);
    dsc_ragged_batch *slot = infer_pipeline_push_slot(e->pipe);
    if (n > 0) DSC_TRY(dsc_ragged_batch_build(slot, e->state, n, uids, tokens, counts));
    return infer_pipeline_tick(e->pipe, e->cache, e->state, &e->scratch, logits, landed);
}

dsc_status dsc_infer_engine_post_tokens(dsc_infer_engine *e, const int32_t *tokens, int32_t n) {
    return infer_pipeline_post_tokens(e->pipe, tokens, n);
}

dsc_status dsc_infer_engine_recv_tokens(dsc_infer_engine *e, int32_t *tokens, int32_t n) {
    return infer_pipeline_recv_tokens(e->pipe, tokens, n);
}

void dsc_infer_engine_pipeline_profile(const dsc_infer_engine *e, infer_pipeline_profile *out) {
    infer_pipeline_get_profile(e->pipe, out);
}

dsc_status dsc_infer_engine_put(dsc_infer_engine *e, int32_t n, const uint64_t *uids, const int32_t *const *tokens,
                                const int32_t *counts, float *logits) {
    DSC_CHECK(infer_pipeline_empty(e->pipe), DSC_ERR_INVALID,
              "put: micro-batches of a scheduler are still in flight in this engine's pipeline");
    DSC_CHECK(n >= 1, DSC_ERR_INVALID, "ragged batch: needs at least one sequence, got %d", n);
    int32_t landed = 0, P = infer_pipeline_depth(e->pipe);
    DSC_TRY(dsc_infer_engine_tick(e, n, uids, tokens, counts, logits, &landed));
    for (int32_t t = 1; t < P; t++) /* the micro-batch reaches the last stage */
        DSC_TRY(dsc_infer_engine_tick(e, 0, NULL, NULL, NULL, logits, &landed));
    DSC_CHECK(landed == n, DSC_ERR_INTERNAL, "put: %d of %d sequences came back from the pipeline", landed, n);
    return infer_pipeline_share(e->pipe, logits, DSC_DTYPE_F32, (int64_t)n * e->model->shard.vocab_size);
}

dsc_sched_result dsc_infer_engine_can_schedule(const dsc_infer_engine *e, const uint64_t *uids,
                                               const int64_t *lengths, int32_t n) {
    return dsc_kv_state_can_schedule(e->state, uids, lengths, n);
}

void dsc_infer_engine_query(const dsc_infer_engine *e, uint64_t uid, int64_t max_tokens, int32_t max_blocks,
                            int64_t *tokens_out, int32_t *blocks_out) {
    dsc_kv_state_query(e->state, uid, max_tokens, max_blocks, tokens_out, blocks_out);
}

dsc_status dsc_infer_engine_flush(dsc_infer_engine *e, uint64_t uid) {
    return dsc_kv_state_flush(e->state, uid);
}

int32_t dsc_infer_engine_free_blocks(const dsc_infer_engine *e) {
    return dsc_kv_blocks_free_count(dsc_kv_cache_blocks(e->cache));
}

int32_t dsc_infer_engine_total_blocks(const dsc_infer_engine *e) {
    return dsc_kv_cache_num_blocks(e->cache);
}

int64_t dsc_infer_engine_seen_tokens(const dsc_infer_engine *e, uint64_t uid) {
    dsc_kv_seq_info info;
    return dsc_kv_state_lookup(e->state, uid, &info) ? info.seen_tokens : 0;
}

void dsc_infer_engine_busy(const dsc_infer_engine *e, double *busy_s, double *tick_s) {
    infer_pipeline_profile prof;
    infer_pipeline_get_profile(e->pipe, &prof);
    *busy_s = prof.busy;
    *tick_s = prof.total;
}
