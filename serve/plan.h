/* The batch plan: what one iteration of the step loop does to the
 * scheduler, in order — cancel these uids, submit these requests, then
 * step (unless `stop`). Rank 0 builds it from its HTTP queue; the plan
 * channel then hands it to every rank, and every rank applies the same plan
 * to its own scheduler replica. Because the scheduler is deterministic
 * (same plans in the same order, same logits, same per-request seeds), all
 * ranks then compose the same ragged batches, which is what a tensor- or
 * pipeline-parallel forward needs. The plan is flat POD arrays (requests
 * refer to token ranges by offset) so that a channel can broadcast it as
 * three buffers.
 *
 * Two channels: one rank (its exchange does nothing), and a communicator
 * of the ranks that serve together (plan_comm.c: rank 0 broadcasts the plan
 * before each step; a plan with `stop` ends every rank's loop). */
#ifndef DSC_SERVE_PLAN_H
#define DSC_SERVE_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "dsc/comm.h"
#include "dsc/inference.h"
#include "dsc/status.h"

typedef struct serve_plan_submit {
    uint64_t uid;
    int64_t prompt_off; /* into ids */
    int32_t n_prompt;
    int32_t max_new_tokens;
    dsc_sampling_params sampling;
    uint64_t seed;
    int64_t stop_off; /* into ids */
    int32_t n_stop;
    int32_t logprobs; /* top alternatives its tokens report (-1: none); every rank joins their computation */
} serve_plan_submit;

typedef struct serve_plan {
    serve_plan_submit *submits;
    int32_t n_submits;
    int64_t cap_submits;
    int32_t *ids; /* prompts and stop tokens of the submits */
    int64_t n_ids, cap_ids;
    uint64_t *cancels;
    int32_t n_cancels;
    int64_t cap_cancels;
    bool stop; /* the last plan: every rank leaves its loop */
} serve_plan;

/* Copies r (its prompt and stop tokens) into the plan, with the number of
 * top logprobs its tokens report (-1: none). */
dsc_status serve_plan_add_submit(serve_plan *p, const dsc_gen_request *r, int32_t logprobs);
dsc_status serve_plan_add_cancel(serve_plan *p, uint64_t uid);
/* Empties the plan, keeping its buffers. */
void serve_plan_clear(serve_plan *p);
void serve_plan_free(serve_plan *p);

/* Applies the plan's cancels (dsc_scheduler_release) and submits, calling
 * on_submit (may be NULL) with each submit's result, which it consumes. A
 * failed cancel is an error: the plan named a uid the scheduler lacks. */
dsc_status serve_plan_apply(const serve_plan *p, dsc_scheduler *s,
                            void (*on_submit)(void *user, int32_t i, dsc_status result), void *user);

typedef struct serve_plan_channel {
    void *impl;
    /* Rank 0: sends *p to the other ranks; other ranks: replaces *p with rank 0's. */
    dsc_status (*exchange)(void *impl, serve_plan *p);
} serve_plan_channel;

/* One rank: nothing to exchange. */
serve_plan_channel serve_plan_channel_single(void);
/* The ranks of comm (borrowed): rank 0's plan is broadcast to the others. */
serve_plan_channel serve_plan_channel_comm(dsc_comm *comm);

#endif
