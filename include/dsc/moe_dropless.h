/* dsc/moe_dropless.h — the dropless MoE feed-forward for serving: the gate
 * (dsc/moe_gate.h, no capacity, nothing dropped, no random element), the
 * dispatch of every route's row into a buffer packed by expert, expert
 * parallelism by all-to-all-v with the counts exchanged first, the caller's
 * experts, the way back, and the weighted combine. The routing, dispatch and
 * combine are training's (moe/gate*.c, moe/dispatch.c); only the packed
 * layout and the variable-count exchange are serving's own.
 *
 * Expert parallelism over `ep` (ep ranks, experts in contiguous ranges,
 * dsc_moe_expert_range): every rank of the group holds the same N tokens
 * (the replicated residual stream of a serving stage). Rank r gates its
 * slice of them (dsc_moe_split), sends each route's row to the rank holding
 * its expert, runs its experts on what arrives from all ranks (one block per
 * expert), sends the rows back, combines its slice, and the slices are
 * all-gathered, so every rank ends with the output of all N tokens. Every
 * rank of the group must call forward with the same N.
 *
 * Not here: the router logits, the experts' math and weights (the caller's
 * callback), a residual or shared expert.
 *
 * Dimension letters: N tokens, E experts, K routes per token, M width. */
#ifndef DSC_MOE_DROPLESS_H
#define DSC_MOE_DROPLESS_H

#include "dsc/api.h"
#include <stdint.h>

#include "dsc/comm.h"
#include "dsc/moe_gate.h"
#include "dsc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsc_moe_dropless_options {
    int32_t num_experts; /* E */
    int k;               /* K */
    int64_t width;       /* M */
    int64_t max_tokens;  /* the largest N of a forward */
    dsc_moe_weighting weighting;
    dsc_comm *ep; /* the expert-parallel group; NULL: this rank holds every expert */
} dsc_moe_dropless_options;

typedef struct dsc_moe_dropless dsc_moe_dropless;

/* Expert `expert` (a global index this rank holds) on n rows (n, M):
 * overwrites `rows` with the expert's output. n >= 1. */
typedef dsc_status (*dsc_moe_expert_fn)(void *user, int32_t expert, int64_t n, float *rows);

/* Part i of `total` items cut into `parts` contiguous parts, the first
 * total % parts of them one larger: items [*first, *first + *count). */
DSC_API void dsc_moe_split(int64_t total, int parts, int i, int64_t *first, int64_t *count);
/* The experts rank `ep_rank` of `ep_size` holds (dsc_moe_split of E). */
DSC_API void dsc_moe_expert_range(int32_t num_experts, int ep_size, int ep_rank, int32_t *first, int32_t *count);

DSC_API dsc_status dsc_moe_dropless_create(const dsc_moe_dropless_options *o, dsc_moe_dropless **out);
DSC_API void dsc_moe_dropless_destroy(dsc_moe_dropless *d);

/* out (N, M) = sum over each token's K routes of weight * expert(x row):
 * logits (N, E) the router's, x (N, M) the tokens; out may not alias x. */
DSC_API dsc_status dsc_moe_dropless_forward(dsc_moe_dropless *d, const float *logits, const float *x, int64_t n,
                                            dsc_moe_expert_fn fn, void *user, float *out);

/* Rows each expert of this rank ran in the last forward (all ranks' routes
 * to it), counts (E) with zeros for the experts held elsewhere. */
DSC_API void dsc_moe_dropless_expert_rows(const dsc_moe_dropless *d, int64_t *counts);

#ifdef __cplusplus
}
#endif
#endif
