/* Ragged batches: the tokens of many sequences (prompt chunks and decode
 * tokens alike) concatenated into one forward pass, with the per-sequence
 * and per-token metadata the model and the paged attention kernel need.
 *
 * Building a batch schedules it: every sequence is extended in the state
 * manager (blocks allocated, tokens in flight) after a side-effect-free check
 * that the whole batch fits, so a rejected batch changes nothing. This file
 * runs no model and touches no cache memory. */
#include "dsc/kv_cache.h"

#include <string.h>

dsc_status dsc_ragged_batch_init(dsc_ragged_batch *b, const dsc_kv_config *cfg) {
    memset(b, 0, sizeof *b);
    DSC_TRY(dsc_kv_config_validate(cfg));
    size_t nt = (size_t)cfg->max_tokens_per_forward, ns = (size_t)cfg->max_batch_sequences;
    b->max_tokens = cfg->max_tokens_per_forward;
    b->max_seqs = cfg->max_batch_sequences;
    dsc_status st = NULL;
    DSC_TRY_GOTO(st, dsc_mem_alloc((void **)&b->tokens, nt * sizeof(int32_t), DSC_MEM_OTHER, DSC_CPU), fail);
    DSC_TRY_GOTO(st, dsc_mem_alloc((void **)&b->positions, nt * sizeof(int64_t), DSC_MEM_OTHER, DSC_CPU), fail);
    DSC_TRY_GOTO(st, dsc_mem_alloc((void **)&b->token_seq, nt * sizeof(int32_t), DSC_MEM_OTHER, DSC_CPU), fail);
    DSC_TRY_GOTO(st, dsc_mem_alloc((void **)&b->last_token, ns * sizeof(int32_t), DSC_MEM_OTHER, DSC_CPU), fail);
    DSC_TRY_GOTO(st, dsc_mem_alloc((void **)&b->seqs, ns * sizeof(dsc_ragged_seq), DSC_MEM_OTHER, DSC_CPU), fail);
    return NULL;
fail:
    dsc_ragged_batch_free(b);
    return dsc_error_wrap(st, "allocating a ragged batch of %zu tokens, %zu sequences", nt, ns);
}

void dsc_ragged_batch_free(dsc_ragged_batch *b) {
    size_t nt = (size_t)b->max_tokens, ns = (size_t)b->max_seqs;
    dsc_mem_free(b->tokens, nt * sizeof(int32_t), DSC_MEM_OTHER, DSC_CPU);
    dsc_mem_free(b->positions, nt * sizeof(int64_t), DSC_MEM_OTHER, DSC_CPU);
    dsc_mem_free(b->token_seq, nt * sizeof(int32_t), DSC_MEM_OTHER, DSC_CPU);
    dsc_mem_free(b->last_token, ns * sizeof(int32_t), DSC_MEM_OTHER, DSC_CPU);
    dsc_mem_free(b->seqs, ns * sizeof(dsc_ragged_seq), DSC_MEM_OTHER, DSC_CPU);
    memset(b, 0, sizeof *b);
}

/* Caller errors the scheduler check cannot express: empty lists, repeated uids. */
static dsc_status check_requests(int32_t n, const uint64_t *uids, const int32_t *counts) {
    for (int32_t i = 0; i < n; i++) {
        DSC_CHECK(counts[i] > 0, DSC_ERR_INVALID, "ragged batch: sequence %llu has %d tokens (need >= 1)",
                  (unsigned long long)uids[i], counts[i]);
        for (int32_t j = 0; j < i; j++)
            DSC_CHECK(uids[j] != uids[i], DSC_ERR_INVALID, "ragged batch: sequence %llu appears twice",
                      (unsigned long long)uids[i]);
    }
    return NULL;
}

dsc_status dsc_ragged_batch_build(dsc_ragged_batch *b, dsc_kv_state *state, int32_t n, const uint64_t *uids,
                                  const int32_t *const *tokens, const int32_t *counts) {
    DSC_CHECK(n >= 1, DSC_ERR_INVALID, "ragged batch: needs at least one sequence, got %d", n);
    DSC_TRY(check_requests(n, uids, counts));
    DSC_CHECK(n <= b->max_seqs, DSC_ERR_INVALID, "ragged batch: %d sequences exceed max_batch_sequences %d (%s)",
              n, b->max_seqs, dsc_sched_result_name(DSC_SCHED_TOO_MANY_SEQUENCES));
    /* positions (max_tokens >= max_seqs entries) doubles as the int64 lengths
     * the scheduler check reads, so building never allocates. */
    int64_t *lengths = b->positions;
    for (int32_t i = 0; i < n; i++)
        lengths[i] = counts[i];
    dsc_sched_result r = dsc_kv_state_can_schedule(state, uids, lengths, n);
    if (r != DSC_SCHED_OK) {
        dsc_code code =
            r == DSC_SCHED_KV_EXHAUSTED || r == DSC_SCHED_TOO_MANY_SEQUENCES ? DSC_ERR_NOMEM : DSC_ERR_INVALID;
        return dsc_error(code, "ragged batch of %d sequences cannot be scheduled: %s", n,
                         dsc_sched_result_name(r));
    }
    int32_t t = 0;
    for (int32_t i = 0; i < n; i++) {
        /* can_schedule guaranteed room, so a failure here is a bug. */
        dsc_status st = dsc_kv_state_extend(state, uids[i], counts[i]);
        if (st) {
            dsc_status bug = dsc_error(DSC_ERR_INTERNAL, "ragged batch: sequence %llu passed the check but: %s",
                                       (unsigned long long)uids[i], dsc_status_message(st));
            dsc_status_free(st);
            return bug;
        }
        dsc_kv_seq_info info;
        DSC_ASSERT(dsc_kv_state_lookup(state, uids[i], &info));
        int64_t cached = info.seen_tokens + info.in_flight_tokens - counts[i];
        b->seqs[i] = (dsc_ragged_seq){.uid = uids[i],
                                      .start = t,
                                      .n_new = counts[i],
                                      .n_cached = cached,
                                      .num_blocks = info.num_blocks,
                                      .block_table = info.block_table};
        for (int32_t j = 0; j < counts[i]; j++, t++) {
            b->tokens[t] = tokens[i][j];
            b->positions[t] = cached + j;
            b->token_seq[t] = i;
        }
        b->last_token[i] = t - 1;
    }
    b->n_tokens = t;
    b->n_seqs = n;
    return NULL;
}

dsc_status dsc_ragged_batch_finish(const dsc_ragged_batch *b, dsc_kv_state *state) {
    for (int32_t i = 0; i < b->n_seqs; i++)
        DSC_TRY(dsc_kv_state_commit(state, b->seqs[i].uid));
    return NULL;
}
