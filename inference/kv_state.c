/* The sequence state manager: which sequences are live, how many of their
 * tokens are cached or in flight, and which KV blocks they own.
 *
 * Sequences are found by uid through a small open-addressing hash table over
 * tracking slots; the slots themselves come from a dsc_kv_blocks pool (the
 * same all-or-nothing allocator as the cache blocks). Block tables live in one
 * preallocated (max_sequences, max_blocks) array, so extending a sequence
 * never allocates memory. This file does not touch cache memory or build
 * batches; it only does the accounting those rely on. */
#include "dsc/kv_cache.h"

#include <string.h>

typedef struct seq_state {
    uint64_t uid;
    int64_t seen;
    int64_t in_flight;
    int32_t num_blocks;
} seq_state;

struct dsc_kv_state {
    dsc_kv_config cfg;
    dsc_kv_blocks *blocks; /* borrowed: the cache's block pool */
    dsc_kv_blocks *slots;  /* tracking slots [0, max_sequences) */
    int32_t max_blocks;    /* per sequence */
    seq_state *seqs;       /* (max_sequences) indexed by slot */
    int32_t *tables;       /* (max_sequences, max_blocks) block ids */
    int32_t *hash;         /* (hash_size) slot + 1, 0 = empty */
    uint32_t hash_mask;
    size_t hash_size;
};

static uint32_t hash_uid(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (uint32_t)x;
}

static int32_t find_slot(const dsc_kv_state *s, uint64_t uid) {
    for (uint32_t h = hash_uid(uid) & s->hash_mask;; h = (h + 1) & s->hash_mask) {
        int32_t e = s->hash[h];
        if (e == 0) return -1;
        if (s->seqs[e - 1].uid == uid) return e - 1;
    }
}

static void hash_insert(dsc_kv_state *s, uint64_t uid, int32_t slot) {
    uint32_t h = hash_uid(uid) & s->hash_mask;
    while (s->hash[h] != 0)
        h = (h + 1) & s->hash_mask;
    s->hash[h] = slot + 1;
}

/* Linear-probing delete by backward shift: later entries of the same probe
 * run move into the hole, so lookups never need tombstones. */
static void hash_remove(dsc_kv_state *s, uint64_t uid) {
    uint32_t h = hash_uid(uid) & s->hash_mask;
    while (s->seqs[s->hash[h] - 1].uid != uid)
        h = (h + 1) & s->hash_mask;
    uint32_t hole = h;
    for (uint32_t j = (hole + 1) & s->hash_mask; s->hash[j] != 0; j = (j + 1) & s->hash_mask) {
        uint32_t home = hash_uid(s->seqs[s->hash[j] - 1].uid) & s->hash_mask;
        /* Entry j may fill the hole unless its home lies cyclically in (hole, j]. */
        bool home_in_range = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!home_in_range) {
            s->hash[hole] = s->hash[j];
            hole = j;
        }
    }
    s->hash[hole] = 0;
}

dsc_status dsc_kv_state_create(dsc_kv_state **out, const dsc_kv_config *cfg, dsc_kv_blocks *blocks) {
    *out = NULL;
    DSC_TRY(dsc_kv_config_validate(cfg));
    dsc_kv_state *s = NULL;
    dsc_status st = NULL;
    DSC_TRY(dsc_mem_alloc((void **)&s, sizeof *s, DSC_MEM_OTHER, DSC_CPU));
    s->cfg = *cfg;
    s->blocks = blocks;
    s->max_blocks = dsc_kv_config_max_blocks_per_sequence(cfg);
    s->hash_size = 1;
    while (s->hash_size < 2 * (size_t)cfg->max_sequences)
        s->hash_size *= 2;
    s->hash_mask = (uint32_t)(s->hash_size - 1);
    size_t nseq = (size_t)cfg->max_sequences;
    DSC_TRY_GOTO(st, dsc_kv_blocks_create(&s->slots, cfg->max_sequences), fail);
    DSC_TRY_GOTO(st, dsc_mem_alloc((void **)&s->seqs, nseq * sizeof(seq_state), DSC_MEM_OTHER, DSC_CPU), fail);
    DSC_TRY_GOTO(
        st,
        dsc_mem_alloc((void **)&s->tables, nseq * (size_t)s->max_blocks * sizeof(int32_t), DSC_MEM_OTHER, DSC_CPU),
        fail);
    DSC_TRY_GOTO(st, dsc_mem_alloc((void **)&s->hash, s->hash_size * sizeof(int32_t), DSC_MEM_OTHER, DSC_CPU),
                 fail);
    *out = s;
    return NULL;
fail:
    dsc_kv_state_destroy(s);
    return dsc_error_wrap(st, "creating kv state for %d sequences", cfg->max_sequences);
}

void dsc_kv_state_destroy(dsc_kv_state *s) {
    if (!s) return;
    size_t nseq = (size_t)s->cfg.max_sequences;
    dsc_kv_blocks_destroy(s->slots);
    dsc_mem_free(s->seqs, nseq * sizeof(seq_state), DSC_MEM_OTHER, DSC_CPU);
    dsc_mem_free(s->tables, nseq * (size_t)s->max_blocks * sizeof(int32_t), DSC_MEM_OTHER, DSC_CPU);
    dsc_mem_free(s->hash, s->hash_size * sizeof(int32_t), DSC_MEM_OTHER, DSC_CPU);
    dsc_mem_free(s, sizeof *s, DSC_MEM_OTHER, DSC_CPU);
}

const char *dsc_sched_result_name(dsc_sched_result r) {
    switch (r) {
    case DSC_SCHED_OK:
        return "ok";
    case DSC_SCHED_TOO_MANY_TOKENS:
        return "too many tokens";
    case DSC_SCHED_TOO_MANY_SEQUENCES:
        return "too many sequences";
    case DSC_SCHED_KV_EXHAUSTED:
        return "kv cache exhausted";
    case DSC_SCHED_SEQUENCE_TOO_LONG:
        return "sequence too long";
    }
    return "unknown";
}

int32_t dsc_kv_state_num_sequences(const dsc_kv_state *s) {
    return s->cfg.max_sequences - dsc_kv_blocks_free_count(s->slots);
}

bool dsc_kv_state_lookup(const dsc_kv_state *s, uint64_t uid, dsc_kv_seq_info *out) {
    int32_t slot = find_slot(s, uid);
    if (slot < 0) return false;
    const seq_state *q = &s->seqs[slot];
    *out = (dsc_kv_seq_info){.uid = uid,
                             .seen_tokens = q->seen,
                             .in_flight_tokens = q->in_flight,
                             .num_blocks = q->num_blocks,
                             .block_table = s->tables + (size_t)slot * (size_t)s->max_blocks};
    return true;
}

dsc_status dsc_kv_state_get_or_create(dsc_kv_state *s, uint64_t uid) {
    if (find_slot(s, uid) >= 0) return NULL;
    int32_t slot;
    dsc_status st = dsc_kv_blocks_allocate(s->slots, 1, &slot);
    if (st) {
        dsc_status_free(st);
        return dsc_error(DSC_ERR_NOMEM, "kv state: cannot track sequence %llu: all %d sequence slots are in use",
                         (unsigned long long)uid, s->cfg.max_sequences);
    }
    s->seqs[slot] = (seq_state){.uid = uid};
    hash_insert(s, uid, slot);
    return NULL;
}

/* Tokens the sequence holds (seen + in flight) and blocks it owns; zero for an unknown uid. */
static void current_usage(const dsc_kv_state *s, uint64_t uid, int64_t *tokens, int32_t *blocks) {
    int32_t slot = find_slot(s, uid);
    *tokens = slot < 0 ? 0 : s->seqs[slot].seen + s->seqs[slot].in_flight;
    *blocks = slot < 0 ? 0 : s->seqs[slot].num_blocks;
}

static int64_t blocks_for(const dsc_kv_state *s, int64_t tokens) {
    return (tokens + s->cfg.block_size - 1) / s->cfg.block_size;
}

int32_t dsc_kv_state_blocks_needed(const dsc_kv_state *s, uint64_t uid, int64_t new_tokens) {
    int64_t tokens;
    int32_t blocks;
    current_usage(s, uid, &tokens, &blocks);
    int64_t need = blocks_for(s, tokens + new_tokens) - blocks;
    return need > 0 ? (int32_t)need : 0;
}

dsc_sched_result dsc_kv_state_check(const dsc_kv_state *s, uint64_t uid, int64_t new_tokens, int32_t free_blocks) {
    int64_t tokens;
    int32_t blocks;
    current_usage(s, uid, &tokens, &blocks);
    if (tokens + new_tokens > s->cfg.max_context) return DSC_SCHED_SEQUENCE_TOO_LONG;
    if (dsc_kv_state_blocks_needed(s, uid, new_tokens) > free_blocks) return DSC_SCHED_KV_EXHAUSTED;
    if (find_slot(s, uid) < 0 && dsc_kv_state_num_sequences(s) >= s->cfg.max_sequences)
        return DSC_SCHED_TOO_MANY_SEQUENCES;
    return DSC_SCHED_OK;
}

dsc_sched_result dsc_kv_state_can_schedule(const dsc_kv_state *s, const uint64_t *uids, const int64_t *lengths,
                                           int32_t n) {
    if (n > s->cfg.max_batch_sequences) return DSC_SCHED_TOO_MANY_SEQUENCES;
    int32_t budget = dsc_kv_blocks_free_count(s->blocks);
    int32_t new_seqs = 0;
    int64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        int64_t tokens;
        int32_t blocks;
        current_usage(s, uids[i], &tokens, &blocks);
        if (tokens + lengths[i] > s->cfg.max_context) return DSC_SCHED_SEQUENCE_TOO_LONG;
        int32_t need = dsc_kv_state_blocks_needed(s, uids[i], lengths[i]);
        if (need > budget) return DSC_SCHED_KV_EXHAUSTED;
        budget -= need;
        if (find_slot(s, uids[i]) < 0) new_seqs++;
        total += lengths[i];
    }
    if (dsc_kv_state_num_sequences(s) + new_seqs > s->cfg.max_sequences) return DSC_SCHED_TOO_MANY_SEQUENCES;
    if (total > s->cfg.max_tokens_per_forward) return DSC_SCHED_TOO_MANY_TOKENS;
    return DSC_SCHED_OK;
}

void dsc_kv_state_query(const dsc_kv_state *s, uint64_t uid, int64_t max_tokens, int32_t max_blocks,
                        int64_t *tokens_out, int32_t *blocks_out) {
    *tokens_out = 0;
    *blocks_out = 0;
    if (find_slot(s, uid) < 0 && dsc_kv_state_num_sequences(s) >= s->cfg.max_sequences) return;
    int64_t tokens;
    int32_t blocks;
    current_usage(s, uid, &tokens, &blocks);
    if (max_tokens > s->cfg.max_context - tokens) max_tokens = s->cfg.max_context - tokens;
    if (max_tokens <= 0) return;
    int32_t need = dsc_kv_state_blocks_needed(s, uid, max_tokens);
    if (need <= max_blocks) {
        *tokens_out = max_tokens;
        *blocks_out = need;
        return;
    }
    /* Only what fits in the partly filled last block plus max_blocks new ones. */
    *tokens_out = ((int64_t)blocks + max_blocks) * s->cfg.block_size - tokens;
    *blocks_out = max_blocks;
}

/* Returns a tracked sequence's blocks and slot. The ids came from the pool
 * and were recorded once, so a failure here is a bug in this file. */
static dsc_status release(dsc_kv_state *s, int32_t slot) {
    seq_state *q = &s->seqs[slot];
    dsc_status st = dsc_kv_blocks_free(s->blocks, s->tables + (size_t)slot * (size_t)s->max_blocks, q->num_blocks);
    if (!st) {
        hash_remove(s, q->uid);
        st = dsc_kv_blocks_free(s->slots, &slot, 1);
    }
    if (st) {
        dsc_status bug = dsc_error(DSC_ERR_INTERNAL, "kv state: releasing sequence %llu: %s",
                                   (unsigned long long)q->uid, dsc_status_message(st));
        dsc_status_free(st);
        return bug;
    }
    memset(q, 0, sizeof *q);
    return NULL;
}

dsc_status dsc_kv_state_extend(dsc_kv_state *s, uint64_t uid, int64_t new_tokens) {
    DSC_CHECK(new_tokens >= 0, DSC_ERR_INVALID, "kv state: sequence %llu: cannot extend by %lld tokens",
              (unsigned long long)uid, (long long)new_tokens);
    int64_t tokens;
    int32_t blocks;
    current_usage(s, uid, &tokens, &blocks);
    DSC_CHECK(tokens + new_tokens <= s->cfg.max_context, DSC_ERR_INVALID,
              "kv state: sequence %llu: %lld tokens + %lld new exceed max_context %lld", (unsigned long long)uid,
              (long long)tokens, (long long)new_tokens, (long long)s->cfg.max_context);
    bool created = find_slot(s, uid) < 0;
    DSC_TRY(dsc_kv_state_get_or_create(s, uid));
    int32_t slot = find_slot(s, uid);
    seq_state *q = &s->seqs[slot];
    int32_t need = dsc_kv_state_blocks_needed(s, uid, new_tokens);
    dsc_status st =
        dsc_kv_blocks_allocate(s->blocks, need, s->tables + (size_t)slot * (size_t)s->max_blocks + q->num_blocks);
    if (st) {
        dsc_status bug = created ? release(s, slot) : NULL; /* a sequence made here must not outlive the failure */
        if (bug) {
            dsc_status_free(st);
            return bug;
        }
        return dsc_error_wrap(st, "kv state: extending sequence %llu by %lld tokens", (unsigned long long)uid,
                              (long long)new_tokens);
    }
    q->num_blocks += need;
    q->in_flight += new_tokens;
    return NULL;
}

dsc_status dsc_kv_state_commit(dsc_kv_state *s, uint64_t uid) {
    int32_t slot = find_slot(s, uid);
    DSC_CHECK(slot >= 0, DSC_ERR_INVALID, "kv state: commit of unknown sequence %llu", (unsigned long long)uid);
    s->seqs[slot].seen += s->seqs[slot].in_flight;
    s->seqs[slot].in_flight = 0;
    return NULL;
}

dsc_status dsc_kv_state_flush(dsc_kv_state *s, uint64_t uid) {
    int32_t slot = find_slot(s, uid);
    DSC_CHECK(slot >= 0, DSC_ERR_INVALID, "kv state: flush of unknown sequence %llu", (unsigned long long)uid);
    return release(s, slot);
}
