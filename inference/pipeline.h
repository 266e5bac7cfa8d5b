/* Private to inference/: the engine's micro-batch pipeline (pipeline.c) and
 * the engine calls the scheduler drives it with. Without pipeline
 * parallelism the pipeline is one stage deep and a tick is one forward. */
#ifndef DSC_INFERENCE_PIPELINE_H
#define DSC_INFERENCE_PIPELINE_H

#include "inference/model_internal.h"

typedef struct infer_pipeline infer_pipeline;

/* Collective over the model's pipeline group (when it has one).
 * micro_batches: in flight at once, in [P, 4 P] for P stages; 0 = P. */
dsc_status infer_pipeline_create(dsc_infer_model *m, const dsc_kv_config *kv, int32_t micro_batches,
                                 infer_pipeline **out);
void infer_pipeline_destroy(infer_pipeline *p);
/* D: micro-batches that may be in flight at once. */
int32_t infer_pipeline_depth(const infer_pipeline *p);
/* Whether no micro-batch is in flight. */
bool infer_pipeline_empty(const infer_pipeline *p);
/* The slot this tick's micro-batch is built into (left empty for an empty tick). */
dsc_ragged_batch *infer_pipeline_push_slot(infer_pipeline *p);
/* Runs this stage's forward of the micro-batch pushed now (receiving its
 * input from the previous stage and posting its output to the next), then
 * lands the micro-batch pushed D - 1 ticks ago: *landed is its sequence
 * count (0 when that slot was empty). Logits in `logits` on the last stage
 * are those of the micro-batch pushed now. The KV of the landed sequences
 * is committed in `state`. */
dsc_status infer_pipeline_tick(infer_pipeline *p, dsc_kv_cache *cache, dsc_kv_state *state, dsc_forward_scratch *s,
                               float *logits, int32_t *landed);
/* The last stage, right after a tick: posts the n tokens it sampled from
 * that tick's micro-batch to every other stage (a no-op with one stage). */
dsc_status infer_pipeline_post_tokens(infer_pipeline *p, const int32_t *tokens, int32_t n);
/* Any other stage, after a tick: the n tokens of the micro-batch that
 * landed in it, from the last stage (a no-op with one stage). */
dsc_status infer_pipeline_recv_tokens(infer_pipeline *p, int32_t *tokens, int32_t n);
/* n values from the last stage to every stage, a broadcast (a no-op with one stage). */
dsc_status infer_pipeline_share(infer_pipeline *p, void *values, dsc_dtype dtype, int64_t n);

/* Where this rank's time went, in seconds: its forwards (busy; busy_cpu
 * the CPU time of the process in them, which a machine shared with other
 * work does not inflate), ticks altogether (total, the forwards and the
 * waits for activations in them), waiting for the previous stage's
 * activation, for its own sends to complete, for the last stage's tokens
 * (outside ticks), and all-gathering the activation over the TP group. */
typedef struct infer_pipeline_profile {
    double busy, busy_cpu, total, recv_wait, send_wait, token_wait, gather;
    int64_t forwards;
} infer_pipeline_profile;
void infer_pipeline_get_profile(const infer_pipeline *p, infer_pipeline_profile *out);

/* ---- the engine's side (engine.c) ---------------------------------------------------------- */

/* Micro-batches the engine keeps in flight (1 without pipeline parallelism). */
int32_t dsc_infer_engine_depth(const dsc_infer_engine *e);
/* Whether this rank samples (holds logits): the last stage. */
bool dsc_infer_engine_samples(const dsc_infer_engine *e);
/* One tick: (n, uids, tokens, counts) as put() takes them, n = 0 for an
 * empty tick, becomes the newest micro-batch, its logits (n, logits width)
 * in `logits` on a sampling rank; the one pushed depth - 1 ticks ago lands:
 * *landed its sequence count (0 when none). */
dsc_status dsc_infer_engine_tick(dsc_infer_engine *e, int32_t n, const uint64_t *uids,
                                 const int32_t *const *tokens, const int32_t *counts, float *logits,
                                 int32_t *landed);
/* The n tokens the sampling ranks drew from the micro-batch of the tick
 * just run, posted to every rank (sampling ranks only). */
dsc_status dsc_infer_engine_post_tokens(dsc_infer_engine *e, const int32_t *tokens, int32_t n);
/* The n tokens of the micro-batch that landed in the tick just run (the
 * other ranks). */
dsc_status dsc_infer_engine_recv_tokens(dsc_infer_engine *e, int32_t *tokens, int32_t n);
/* This rank's pipeline profile (infer_pipeline_get_profile). */
void dsc_infer_engine_pipeline_profile(const dsc_infer_engine *e, infer_pipeline_profile *out);

#endif
