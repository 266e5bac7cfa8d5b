/* Private to inference/: the steps of dsc_sample (sampling.c) that the
 * vocabulary-parallel sampler (sampling_tp.c) applies to its slice and to
 * the candidates merged across ranks, and the sharded sampler itself.
 * Not here: the rules' documentation (dsc/sampling.h). */
#ifndef DSC_INFERENCE_SAMPLING_INTERNAL_H
#define DSC_INFERENCE_SAMPLING_INTERNAL_H

#include "dsc/comm.h"
#include "dsc/sampling.h"

dsc_status dsc_sample_check_params(const dsc_sampling_params *p, int32_t V);
/* Repetition penalty on candidates c (nv) of ids [v0, v0 + nv); history ids must be in [0, V). */
dsc_status dsc_sample_penalize(dsc_sample_candidate *c, int64_t v0, int32_t nv, int32_t V, float penalty,
                               const int32_t *history, int64_t n);
/* Descending logit, ties to the lower id, NaN last (a qsort comparator). */
int dsc_sample_compare(const void *a, const void *b);
/* The first n_keep of c (n) in dsc_sample_compare order brought to the front, sorted. */
void dsc_sample_sort_first(dsc_sample_candidate *c, int32_t n, int32_t n_keep);
/* Keeps the top k of c (n) and every candidate tied with the k-th, sorted; returns how many. */
int32_t dsc_sample_top_k(dsc_sample_candidate *c, int32_t n, int32_t k);
/* Index of the largest logit (lowest index among equals); -1 if none is > -inf. */
int32_t dsc_sample_argmax(const dsc_sample_candidate *c, int32_t n);
/* Draws from exp(logit - max) over c (n), overwriting logits with weights. */
int32_t dsc_sample_draw(dsc_sample_candidate *c, int32_t n, float max, dsc_rng *rng);

/* A vocabulary-parallel row: this rank holds ids [v0, v0 + nv) of V. */
typedef struct dsc_sample_shard {
    dsc_comm *comm;
    int64_t v0;
    int32_t nv, V;
} dsc_sample_shard;

/* dsc_sample over a row split across the ranks of shard->comm: every rank
 * passes its slice (nv logits), the same params, history and rng state, and
 * gets the same token; only candidates cross ranks (the best of each rank
 * for greedy, each rank's top-k or growing nucleus prefix, or per-rank
 * mass sums for plain temperature). scratch holds nv + V candidates. */
dsc_status dsc_sample_sharded(int32_t *token_out, const float *logits, const dsc_sample_shard *shard,
                              const dsc_sampling_params *p, const int32_t *history, int64_t n_history,
                              dsc_sample_candidate *scratch, dsc_rng *rng);

#endif
