/* dsc/kv_cache.h — the blocked KV cache of the inference engine: block
 * allocator, cache memory, per-sequence state, ragged batches and the paged
 * attention kernel that reads and writes the cache through block tables.
 *
 * The design is DeepSpeed inference v2's (FastGen): the cache is a pool of
 * fixed-size blocks of `block_size` token slots; every sequence owns a list
 * of block ids (its block table); one forward pass runs over a ragged batch
 * mixing prompt chunks and decode tokens of many sequences. Nothing here
 * knows about models, policies or ranks: the engine composes these pieces.
 *
 * Dimension letters: L layers, NB blocks, BS block size (tokens per block),
 * NKV key/value heads, NH query heads, HS head size, Ntok tokens in a batch,
 * Nseq sequences in a batch. */
#ifndef DSC_KV_CACHE_H
#define DSC_KV_CACHE_H

#include "dsc/api.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsc/memory.h"
#include "dsc/status.h"
#include "dsc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- configuration ------------------------------------------------------------
 * Field names are the config keys (section "kv_cache" of the engine config). */
typedef struct dsc_kv_config {
    /* cache geometry */
    int32_t num_layers;
    int32_t num_kv_heads;
    int32_t head_size;
    int32_t block_size;     /* token slots per block */
    int64_t kv_cache_bytes; /* byte budget; num_blocks = kv_cache_bytes / block bytes */
    /* scheduling limits */
    int32_t max_sequences;          /* sequences with live state at once */
    int64_t max_context;            /* tokens per sequence (cached + new) */
    int32_t max_tokens_per_forward; /* tokens in one ragged batch */
    int32_t max_batch_sequences;    /* sequences in one ragged batch */
    /* cache element type: DSC_DTYPE_F32 (the zero value) or DSC_DTYPE_BF16 (half the memory) */
    dsc_dtype dtype;
} dsc_kv_config;

/* Checks every field (> 0, max_batch_sequences <= max_sequences and
 * <= max_tokens_per_forward); the error names the offending key. */
DSC_API dsc_status dsc_kv_config_validate(const dsc_kv_config *cfg);
/* Bytes of one block over all layers: L * 2 * BS * NKV * HS * sizeof(dtype). */
DSC_API size_t dsc_kv_config_block_bytes(const dsc_kv_config *cfg);
/* Blocks per sequence at most: ceil(max_context / block_size). */
DSC_API int32_t dsc_kv_config_max_blocks_per_sequence(const dsc_kv_config *cfg);

/* ---- block allocator ------------------------------------------------------------
 * A pool of `num_blocks` ids [0, num_blocks) with a free list. Allocation is
 * all-or-nothing; free validates every id before releasing any. Fresh pools
 * hand out ids in increasing order. */
typedef struct dsc_kv_blocks dsc_kv_blocks;

DSC_API dsc_status dsc_kv_blocks_create(dsc_kv_blocks **out, int32_t num_blocks);
DSC_API void dsc_kv_blocks_destroy(dsc_kv_blocks *blocks);
/* Writes n ids to ids_out (n entries). Fewer than n free: DSC_ERR_NOMEM naming
 * requested vs free, and nothing changes. */
DSC_API dsc_status dsc_kv_blocks_allocate(dsc_kv_blocks *blocks, int32_t n, int32_t *ids_out);
/* Returns n ids to the pool. An id out of range, already free, or repeated in
 * `ids` is DSC_ERR_INVALID naming it, and nothing is freed. */
DSC_API dsc_status dsc_kv_blocks_free(dsc_kv_blocks *blocks, const int32_t *ids, int32_t n);
DSC_API int32_t dsc_kv_blocks_free_count(const dsc_kv_blocks *blocks);
DSC_API int32_t dsc_kv_blocks_total(const dsc_kv_blocks *blocks);
DSC_API bool dsc_kv_blocks_is_used(const dsc_kv_blocks *blocks, int32_t id);

/* ---- cache memory ------------------------------------------------------------------
 * One arena for all layers, shape (L, NB, 2, BS, NKV, HS) of cfg->dtype,
 * counted under DSC_MEM_KV_CACHE, plus the allocator of its blocks.
 * Layer-major so that a layer's cache is one contiguous (NB, 2, BS, NKV, HS)
 * tensor that the attention kernel of that layer receives; index 0/1 of the
 * size-2 axis is K/V. */
typedef struct dsc_kv_cache dsc_kv_cache;

/* Sizes the pool from cfg->kv_cache_bytes; fewer than one block is
 * DSC_ERR_CONFIG naming the budget and the bytes of one block. */
DSC_API dsc_status dsc_kv_cache_create(dsc_kv_cache **out, const dsc_kv_config *cfg, dsc_device device);
DSC_API void dsc_kv_cache_destroy(dsc_kv_cache *cache);
DSC_API int32_t dsc_kv_cache_num_blocks(const dsc_kv_cache *cache);
DSC_API dsc_kv_blocks *dsc_kv_cache_blocks(dsc_kv_cache *cache);
/* A view of layer `layer`'s cache, (NB, 2, BS, NKV, HS) of the cache dtype. */
DSC_API dsc_status dsc_kv_cache_layer(dsc_kv_cache *cache, int32_t layer, dsc_tensor *out);

/* ---- sequence state -------------------------------------------------------------------
 * Sequences are tracked by uid. Each has `seen` tokens (in the cache), `in
 * flight` tokens (scheduled in the current forward, their KV slots allocated)
 * and a block table; blocks used = ceil((seen + in_flight) / block_size). */
typedef struct dsc_kv_state dsc_kv_state;

/* Why a request can or cannot run now (the engine's can_schedule answer). */
typedef enum dsc_sched_result {
    DSC_SCHED_OK = 0,
    DSC_SCHED_TOO_MANY_TOKENS,    /* batch tokens > max_tokens_per_forward */
    DSC_SCHED_TOO_MANY_SEQUENCES, /* batch sequences > max_batch_sequences, or tracked > max_sequences */
    DSC_SCHED_KV_EXHAUSTED,       /* not enough free blocks */
    DSC_SCHED_SEQUENCE_TOO_LONG   /* a sequence would exceed max_context */
} dsc_sched_result;

DSC_API const char *dsc_sched_result_name(dsc_sched_result r);

typedef struct dsc_kv_seq_info {
    uint64_t uid;
    int64_t seen_tokens;
    int64_t in_flight_tokens;
    int32_t num_blocks;
    const int32_t *block_table; /* (num_blocks) block ids, valid until the next call that changes the state */
} dsc_kv_seq_info;

/* The state borrows `blocks` (shared with the cache); cfg is copied. */
DSC_API dsc_status dsc_kv_state_create(dsc_kv_state **out, const dsc_kv_config *cfg, dsc_kv_blocks *blocks);
DSC_API void dsc_kv_state_destroy(dsc_kv_state *state);

DSC_API int32_t dsc_kv_state_num_sequences(const dsc_kv_state *state);
/* False when uid is not tracked. */
DSC_API bool dsc_kv_state_lookup(const dsc_kv_state *state, uint64_t uid, dsc_kv_seq_info *out);
/* Starts tracking uid (0 tokens, no blocks) unless it is already tracked;
 * all max_sequences slots taken is DSC_ERR_NOMEM naming the uid. */
DSC_API dsc_status dsc_kv_state_get_or_create(dsc_kv_state *state, uint64_t uid);

/* New blocks `new_tokens` more tokens of uid would need (an unknown uid counts
 * as an empty sequence). */
DSC_API int32_t dsc_kv_state_blocks_needed(const dsc_kv_state *state, uint64_t uid, int64_t new_tokens);
/* Whether one sequence can take `new_tokens` now, given `free_blocks` (pass
 * the allocator's free count, or a running budget when checking a batch). */
DSC_API dsc_sched_result dsc_kv_state_check(const dsc_kv_state *state, uint64_t uid, int64_t new_tokens,
                                            int32_t free_blocks);
/* Whether a whole batch can run: n uids (distinct) with lengths[i] new tokens
 * each. Checks, in order: batch sequence count, per-sequence length and KV
 * blocks against a running free-block budget, tracked-sequence capacity,
 * batch token count. Side-effect free. */
DSC_API dsc_sched_result dsc_kv_state_can_schedule(const dsc_kv_state *state, const uint64_t *uids,
                                                   const int64_t *lengths, int32_t n);
/* How many of `max_tokens` proposed tokens of uid fit with at most
 * `max_blocks` new blocks (and max_context), and the blocks they need.
 * An untracked uid when all slots are taken gets (0, 0). */
DSC_API void dsc_kv_state_query(const dsc_kv_state *state, uint64_t uid, int64_t max_tokens, int32_t max_blocks,
                                int64_t *tokens_out, int32_t *blocks_out);

/* Creates uid if needed, allocates the blocks for new_tokens and marks them
 * in flight. All-or-nothing: on failure (DSC_ERR_INVALID past max_context,
 * DSC_ERR_NOMEM out of blocks or slots) the state is as before. */
DSC_API dsc_status dsc_kv_state_extend(dsc_kv_state *state, uint64_t uid, int64_t new_tokens);
/* After a forward pass: uid's in-flight tokens become seen. */
DSC_API dsc_status dsc_kv_state_commit(dsc_kv_state *state, uint64_t uid);
/* Frees uid's blocks and tracking slot; an unknown uid is DSC_ERR_INVALID. */
DSC_API dsc_status dsc_kv_state_flush(dsc_kv_state *state, uint64_t uid);

/* ---- ragged batch ---------------------------------------------------------------------------
 * One forward pass's worth of tokens from several sequences, concatenated.
 * Buffers are allocated once for the config's limits and reused. */
typedef struct dsc_ragged_seq {
    uint64_t uid;
    int32_t start;              /* first token of this sequence in the batch */
    int32_t n_new;              /* tokens of this sequence in the batch */
    int64_t n_cached;           /* tokens already in the cache before this batch */
    int32_t num_blocks;         /* blocks covering n_cached + n_new tokens */
    const int32_t *block_table; /* (num_blocks), owned by the state */
} dsc_ragged_seq;

typedef struct dsc_ragged_batch {
    int32_t n_tokens;
    int32_t n_seqs;
    int32_t max_tokens;
    int32_t max_seqs;
    int32_t *tokens;      /* (max_tokens) token ids, sequences concatenated */
    int64_t *positions;   /* (max_tokens) position of each token in its sequence */
    int32_t *token_seq;   /* (max_tokens) index into seqs of each token's sequence */
    int32_t *last_token;  /* (max_seqs) batch index of each sequence's last token (logits only there) */
    dsc_ragged_seq *seqs; /* (max_seqs) */
} dsc_ragged_batch;

/* Buffers for cfg->max_tokens_per_forward tokens and cfg->max_batch_sequences sequences. */
DSC_API dsc_status dsc_ragged_batch_init(dsc_ragged_batch *batch, const dsc_kv_config *cfg);
DSC_API void dsc_ragged_batch_free(dsc_ragged_batch *batch);
/* Fills the batch from n (uid, tokens[i][0..counts[i])) pairs and extends
 * each sequence in `state` (blocks allocated, tokens in flight). Repeated
 * uids or empty token lists are DSC_ERR_INVALID; a batch that cannot be
 * scheduled is DSC_ERR_NOMEM (KV, sequence slots) or DSC_ERR_INVALID (limits)
 * naming the dsc_sched_result; on error neither the state nor the batch's
 * previous content is relied upon (the state is unchanged). */
DSC_API dsc_status dsc_ragged_batch_build(dsc_ragged_batch *batch, dsc_kv_state *state, int32_t n,
                                          const uint64_t *uids, const int32_t *const *tokens,
                                          const int32_t *counts);
/* After the forward pass: commits every sequence's in-flight tokens. */
DSC_API dsc_status dsc_ragged_batch_finish(const dsc_ragged_batch *batch, dsc_kv_state *state);

/* ---- paged attention (CPU) ----------------------------------------------------------------------
 * For each token of the batch: writes its k, v into its sequence's cache slot
 * (block_table[pos / BS], pos % BS), rounded to bf16 for a bf16 cache, then
 * attends causally over that sequence's cached positions 0..pos (in f32).
 * Grouped-query: NH % NKV == 0, query head h reads KV head h / (NH / NKV).
 * Scale 1/sqrt(HS). Online softmax, so no score row is ever materialised.
 * q, out (Ntok, NH, HS) f32; k, v (Ntok, NKV, HS) f32; layer_cache (NB, 2, BS, NKV, HS) f32 or bf16. */
DSC_API dsc_status dsc_paged_attention_forward(dsc_tensor *out, const dsc_tensor *q, const dsc_tensor *k,
                                               const dsc_tensor *v, const dsc_ragged_batch *batch,
                                               dsc_tensor *layer_cache);

#ifdef __cplusplus
}
#endif
#endif
