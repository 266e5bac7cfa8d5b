/* Continuous batching with chunked prefill (DeepSpeed-FastGen's Dynamic
 * SplitFuse) over the inference engine. Every forward carries at most
 * `token_budget` tokens: one token for each decoding request, then prompt
 * chunks filling what is left (or prompt chunks first, with
 * DSC_PREFILL_PRIORITY_PREFILL_FIRST); only a chunk that ends its prompt
 * samples a token.
 *
 * Admission (FIFO, no overtaking) keeps KV for what admitted requests will
 * need: a request enters only when the free blocks, minus the blocks still
 * owed to running requests, cover its prompt plus its reserved generation
 * (all of max_new_tokens by default, so nothing is ever preempted). With a
 * smaller reservation decodes may outgrow the cache; then the NEWEST running
 * request is preempted by recompute: its blocks are flushed and it returns
 * to the front of the queue with prompt + generated tokens as its new
 * prompt, so the oldest request always progresses and every request
 * finishes (a request that could not fit the whole cache alone is refused
 * at submit).
 *
 * Under tensor parallelism every rank runs this same scheduler on the same
 * requests: its decisions depend only on the requests, the engine's block
 * counts (equal on all ranks) and the sampled tokens (equal on all ranks,
 * dsc_infer_engine_sample), never on the clock, so all ranks compose the
 * same batches with no broadcast.
 *
 * Under pipeline parallelism the engine keeps P micro-batches in flight
 * (pipeline.c): each step composes one micro-batch from the running
 * requests that are not in flight (at most ceil(running / P) sequences, so
 * the P micro-batches share the work) and lands the one pushed P - 1 steps
 * before. Every rank again runs this scheduler replica: the last stage
 * samples a micro-batch's tokens right after computing it and posts them to
 * every stage, and every replica takes them when the micro-batch lands, so
 * all replicas see the same tokens (no plan is sent: the sampled tokens are
 * the only input the replicas cannot compute themselves, and ids are
 * smaller than plans). Sampling early changes nothing: until it lands, no
 * request of a micro-batch in flight changes; the last stage keeps each
 * micro-batch's logits until then for the token callback. A request in flight is never preempted and its release
 * waits for it to land (its KV blocks are still being written by later stages); when the newest running request is
 * in flight the preemption rule waits for it. With P = 1 nothing is in flight when a step composes, and all of
 * this is the single-rank scheduler. Not here: the forward (engine) or
 * sampling rules (sampling.c). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "inference/pipeline.h"

typedef enum req_state { REQ_WAITING = 0, REQ_RUNNING, REQ_DONE } req_state;

typedef struct request {
    uint64_t uid;
    int32_t *tokens; /* (n_prompt + max_new) prompt, then generated tokens */
    int32_t n_prompt, n_generated, max_new;
    int64_t n_cached; /* tokens in the engine's KV cache */
    int32_t *stop;
    int32_t n_stop;
    dsc_sampling_params sampling;
    dsc_rng rng;
    req_state state;
    int64_t order; /* queue position while waiting (preempted go first), admission order while running */
    double submit_time, first_token_time;
    int32_t chunk;  /* tokens scheduled in the current forward */
    bool preempted; /* waiting again after a preemption */
    bool in_flight; /* in a micro-batch that has not landed */
    bool released;  /* released while in flight: freed when it lands */
} request;

/* A micro-batch in flight: its requests in batch order, and on a sampling
 * rank their logits and the tokens drawn from them. */
typedef struct micro_batch {
    int32_t n;
    request **reqs;   /* (max_batch_sequences) */
    float *logits;    /* (rows, W) in the scheduler's logits */
    int32_t *sampled; /* (rows) tokens of the requests that sample, in batch order */
} micro_batch;

struct dsc_scheduler {
    dsc_infer_engine *engine;
    dsc_scheduler_config cfg;
    dsc_token_callback cb;
    void *user;
    request **reqs;
    int32_t n_reqs, cap_reqs;
    int64_t front, back, admitted;
    dsc_scheduler_stats stats;
    /* one forward's batch, sized for max_batch_sequences */
    uint64_t *uids;
    const int32_t **ptrs;
    int32_t *counts;
    request **batch;
    float *logits;     /* (slots, rows, W): W the engine's logits width (its vocabulary slice under TP) */
    int32_t *sampled;  /* (slots, rows) */
    int32_t rows;      /* sequences of a micro-batch at most */
    micro_batch *ring; /* (depth): the micro-batch pushed at step t in slot t % depth */
    int32_t depth;
    int64_t steps;
    const float *cb_logits; /* (W) the row of the token being reported, only during the callback */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int64_t blocks_for(const dsc_scheduler *s, int64_t tokens) {
    int64_t bs = dsc_infer_engine_kv_config(s->engine)->block_size;
    return (tokens + bs - 1) / bs;
}

/* The tokens a request will hold in the KV cache at most, as far as admission reserves. */
static int64_t reserved_tokens(const dsc_scheduler *s, const request *r) {
    int32_t reserve = s->cfg.kv_reserve_tokens < 0 || s->cfg.kv_reserve_tokens > r->max_new
                          ? r->max_new
                          : s->cfg.kv_reserve_tokens;
    if (reserve < 1) reserve = 1;
    /* After g >= 1 generated tokens the cache holds prompt + g - 1 (the newest is not fed yet). */
    int64_t target = (int64_t)r->n_prompt + reserve - 1, now = (int64_t)r->n_prompt + r->n_generated;
    return target > now ? target : now;
}

dsc_scheduler_config dsc_scheduler_config_default(const dsc_infer_engine *e) {
    return (dsc_scheduler_config){.token_budget = dsc_infer_engine_kv_config(e)->max_tokens_per_forward,
                                  .prefill_priority = DSC_PREFILL_PRIORITY_DECODE_FIRST,
                                  .kv_reserve_tokens = -1};
}

dsc_status dsc_scheduler_create(dsc_infer_engine *e, const dsc_scheduler_config *cfg, dsc_token_callback cb,
                                void *user, dsc_scheduler **out) {
    const dsc_kv_config *kv = dsc_infer_engine_kv_config(e);
    DSC_CHECK(cfg->token_budget >= 1 && cfg->token_budget <= kv->max_tokens_per_forward, DSC_ERR_CONFIG,
              "scheduler token_budget (%d) must be in [1, max_tokens_per_forward = %d]", cfg->token_budget,
              kv->max_tokens_per_forward);
    dsc_scheduler *s = calloc(1, sizeof *s);
    DSC_CHECK(s, DSC_ERR_NOMEM, "scheduler");
    int32_t S = kv->max_batch_sequences, W = dsc_infer_engine_logits_width(e), depth = dsc_infer_engine_depth(e);
    *s = (dsc_scheduler){.engine = e, .cfg = *cfg, .cb = cb, .user = user, .depth = depth};
    /* A micro-batch takes at most ceil(running / depth) sequences (compose),
     * and only a sampling rank keeps logits of micro-batches in flight. */
    int32_t share = (kv->max_sequences + depth - 1) / depth, slots = dsc_infer_engine_samples(e) ? depth : 1;
    s->rows = depth > 1 && share < S ? share : S;
    s->uids = malloc((size_t)S * sizeof *s->uids);
    s->ptrs = malloc((size_t)S * sizeof *s->ptrs);
    s->counts = malloc((size_t)S * sizeof *s->counts);
    s->batch = malloc((size_t)S * sizeof *s->batch);
    s->logits = malloc((size_t)slots * (size_t)s->rows * (size_t)W * sizeof *s->logits);
    s->sampled = malloc((size_t)depth * (size_t)s->rows * sizeof *s->sampled);
    s->ring = calloc((size_t)depth, sizeof *s->ring);
    bool ok = s->ring && s->logits && s->sampled;
    for (int32_t i = 0; ok && i < depth; i++) {
        s->ring[i].logits = s->logits + (size_t)(i % slots) * (size_t)s->rows * (size_t)W;
        s->ring[i].sampled = s->sampled + (size_t)i * (size_t)s->rows;
        ok = (s->ring[i].reqs = malloc((size_t)S * sizeof *s->ring[i].reqs)) != NULL;
    }
    if (!s->uids || !s->ptrs || !s->counts || !s->batch || !s->logits || !s->sampled || !ok) {
        dsc_scheduler_destroy(s);
        return dsc_error(DSC_ERR_NOMEM, "scheduler buffers for %d sequences", S);
    }
    *out = s;
    return NULL;
}

static void request_free(request *r) {
    if (!r) return;
    free(r->tokens);
    free(r->stop);
    free(r);
}

void dsc_scheduler_destroy(dsc_scheduler *s) {
    if (!s) return;
    for (int32_t i = 0; i < s->n_reqs; i++)
        request_free(s->reqs[i]);
    free(s->reqs);
    free(s->uids);
    free(s->ptrs);
    free(s->counts);
    free(s->batch);
    free(s->logits);
    free(s->sampled);
    for (int32_t i = 0; s->ring && i < s->depth; i++)
        free(s->ring[i].reqs);
    free(s->ring);
    free(s);
}

static request *find(const dsc_scheduler *s, uint64_t uid) {
    for (int32_t i = 0; i < s->n_reqs; i++)
        if (s->reqs[i]->uid == uid) return s->reqs[i];
    return NULL;
}

dsc_status dsc_scheduler_submit(dsc_scheduler *s, const dsc_gen_request *req) {
    const dsc_kv_config *kv = dsc_infer_engine_kv_config(s->engine);
    unsigned long long uid = (unsigned long long)req->uid;
    DSC_CHECK(!find(s, req->uid), DSC_ERR_INVALID, "request %llu: uid already submitted", uid);
    DSC_CHECK(req->n_prompt >= 1 && req->prompt && req->max_new_tokens >= 1, DSC_ERR_INVALID,
              "request %llu: needs a prompt and max_new_tokens >= 1", uid);
    int64_t longest = (int64_t)req->n_prompt + req->max_new_tokens - 1;
    DSC_CHECK(longest <= kv->max_context, DSC_ERR_INVALID,
              "request %llu: prompt (%d) + max_new_tokens (%d) exceeds max_context (%lld)", uid, req->n_prompt,
              req->max_new_tokens, (long long)kv->max_context);
    DSC_CHECK(blocks_for(s, longest) <= dsc_infer_engine_total_blocks(s->engine), DSC_ERR_INVALID,
              "request %llu: needs %lld KV blocks, the whole cache has %d", uid, (long long)blocks_for(s, longest),
              dsc_infer_engine_total_blocks(s->engine));
    int32_t V = dsc_infer_engine_vocab_size(s->engine);
    for (int32_t i = 0; i < req->n_prompt; i++)
        DSC_CHECK(req->prompt[i] >= 0 && req->prompt[i] < V, DSC_ERR_INVALID,
                  "request %llu: prompt token %d is %d, outside [0, %d)", uid, i, req->prompt[i], V);
    if (s->n_reqs == s->cap_reqs) {
        int32_t cap = s->cap_reqs ? 2 * s->cap_reqs : 16;
        request **grown = realloc(s->reqs, (size_t)cap * sizeof *grown);
        DSC_CHECK(grown, DSC_ERR_NOMEM, "request %llu: request table", uid);
        s->reqs = grown;
        s->cap_reqs = cap;
    }
    request *r = calloc(1, sizeof *r);
    if (r) r->tokens = malloc(((size_t)req->n_prompt + (size_t)req->max_new_tokens) * sizeof *r->tokens);
    if (r && req->n_stop > 0) r->stop = malloc((size_t)req->n_stop * sizeof *r->stop);
    if (!r || !r->tokens || (req->n_stop > 0 && !r->stop)) {
        request_free(r);
        return dsc_error(DSC_ERR_NOMEM, "request %llu: token buffer", uid);
    }
    memcpy(r->tokens, req->prompt, (size_t)req->n_prompt * sizeof *r->tokens);
    if (req->n_stop > 0) memcpy(r->stop, req->stop_tokens, (size_t)req->n_stop * sizeof *r->stop);
    r->uid = req->uid;
    r->n_prompt = req->n_prompt;
    r->max_new = req->max_new_tokens;
    r->n_stop = req->n_stop;
    r->sampling = req->sampling;
    dsc_rng_init(&r->rng, req->seed, 0, DSC_RNG_SAMPLE);
    r->state = REQ_WAITING;
    r->order = s->back++;
    r->submit_time = now_s();
    r->first_token_time = -1;
    s->reqs[s->n_reqs++] = r;
    return NULL;
}

static int64_t total_tokens(const request *r) {
    return (int64_t)r->n_prompt + r->n_generated;
}

/* Blocks running requests may still claim under their reservation. */
static int64_t owed_blocks(const dsc_scheduler *s) {
    int64_t owed = 0;
    for (int32_t i = 0; i < s->n_reqs; i++) {
        const request *r = s->reqs[i];
        if (r->state != REQ_RUNNING) continue;
        int64_t need = blocks_for(s, reserved_tokens(s, r)) - blocks_for(s, r->n_cached);
        if (need > 0) owed += need;
    }
    return owed;
}

static int32_t count_state(const dsc_scheduler *s, req_state st) {
    int32_t n = 0;
    for (int32_t i = 0; i < s->n_reqs; i++)
        n += s->reqs[i]->state == st;
    return n;
}

/* The waiting request first in line, or NULL. */
static request *next_waiting(const dsc_scheduler *s) {
    request *best = NULL;
    for (int32_t i = 0; i < s->n_reqs; i++) {
        request *r = s->reqs[i];
        if (r->state == REQ_WAITING && (!best || r->order < best->order)) best = r;
    }
    return best;
}

static void admit(dsc_scheduler *s) {
    const dsc_kv_config *kv = dsc_infer_engine_kv_config(s->engine);
    if (s->cfg.static_batching && count_state(s, REQ_RUNNING) > 0) return;
    int32_t running = count_state(s, REQ_RUNNING);
    int32_t limit = s->cfg.static_batching ? kv->max_batch_sequences : kv->max_sequences;
    for (request *r; running < limit && (r = next_waiting(s)); running++) {
        int64_t available = dsc_infer_engine_free_blocks(s->engine) - owed_blocks(s);
        if (blocks_for(s, reserved_tokens(s, r)) > available) return;
        r->state = REQ_RUNNING;
        r->preempted = false;
        r->order = s->admitted++;
    }
}

static request *newest_running(const dsc_scheduler *s);

/* Recompute preemption of the newest running request. */
static dsc_status preempt_newest(dsc_scheduler *s) {
    request *newest = newest_running(s);
    DSC_CHECK(newest, DSC_ERR_INTERNAL, "scheduler: KV exhausted with nothing to preempt");
    if (newest->n_cached > 0) DSC_TRY(dsc_infer_engine_flush(s->engine, newest->uid));
    newest->n_cached = 0;
    newest->state = REQ_WAITING;
    newest->preempted = true;
    newest->order = --s->front;
    s->stats.preemptions++;
    return NULL;
}

/* Adds up to `max` tokens of r to the batch within the token and free-block
 * budgets; false when r got nothing for lack of blocks. */
static bool take(dsc_scheduler *s, request *r, int64_t max, int32_t *n, int32_t *budget, int32_t *blocks,
                 int32_t seqs) {
    if (max <= 0 || *budget <= 0 || *n >= seqs) return true;
    int64_t tokens;
    int32_t need;
    dsc_infer_engine_query(s->engine, r->uid, max < *budget ? max : *budget, *blocks, &tokens, &need);
    if (tokens <= 0) return false;
    r->chunk = (int32_t)tokens;
    s->batch[*n] = r;
    s->uids[*n] = r->uid;
    s->ptrs[*n] = r->tokens + r->n_cached;
    s->counts[*n] = r->chunk;
    (*n)++;
    *budget -= r->chunk;
    *blocks -= need;
    return true;
}

static int by_order(const void *a, const void *b) {
    int64_t x = (*(request *const *)a)->order, y = (*(request *const *)b)->order;
    return (x > y) - (x < y);
}

/* Decodes (one token each, oldest first), then prompt chunks, or the other
 * way round. *starved is the admission order of the oldest running request
 * that got no tokens for lack of KV blocks (-1 when none). */
static dsc_status compose(dsc_scheduler *s, int32_t *n_out, int64_t *starved) {
    int32_t n = 0, budget = s->cfg.token_budget, blocks = dsc_infer_engine_free_blocks(s->engine), n_run = 0;
    request **run = malloc((size_t)s->n_reqs * sizeof *run);
    DSC_CHECK(run, DSC_ERR_NOMEM, "scheduler: running list");
    int32_t running = 0;
    for (int32_t i = 0; i < s->n_reqs; i++) {
        running += s->reqs[i]->state == REQ_RUNNING;
        if (s->reqs[i]->state == REQ_RUNNING && !s->reqs[i]->in_flight) run[n_run++] = s->reqs[i];
    }
    /* P micro-batches in flight share the running requests. */
    int32_t seqs = dsc_infer_engine_kv_config(s->engine)->max_batch_sequences,
            share = (running + s->depth - 1) / s->depth;
    if (share < seqs) seqs = share;
    qsort(run, (size_t)n_run, sizeof *run, by_order);
    *starved = -1;
    for (int32_t i = 0; i < n_run; i++)
        run[i]->chunk = 0;
    for (int pass = 0; pass < 2; pass++) {
        bool decodes = (pass == 0) == (s->cfg.prefill_priority == DSC_PREFILL_PRIORITY_DECODE_FIRST);
        for (int32_t i = 0; i < n_run; i++) {
            request *r = run[i];
            int64_t pending = total_tokens(r) - r->n_cached;
            bool is_decode = pending == 1 && r->n_generated > 0;
            if (is_decode != decodes || take(s, r, pending, &n, &budget, &blocks, seqs)) continue;
            if (*starved < 0 || r->order < *starved) *starved = r->order;
        }
    }
    free(run);
    *n_out = n;
    return NULL;
}

static request *newest_running(const dsc_scheduler *s) {
    request *newest = NULL;
    for (int32_t i = 0; i < s->n_reqs; i++) {
        request *r = s->reqs[i];
        if (r->state == REQ_RUNNING && (!newest || r->order > newest->order)) newest = r;
    }
    return newest;
}

static bool is_stop(const request *r, int32_t tok) {
    for (int32_t i = 0; i < r->n_stop; i++)
        if (r->stop[i] == tok) return true;
    return false;
}

/* Appends the sampled token to r and streams it (row: its logits on a sampling rank, else NULL). */
static dsc_status emit(dsc_scheduler *s, request *r, int32_t tok, const float *row) {
    r->tokens[total_tokens(r)] = tok;
    r->n_generated++;
    s->stats.tokens_generated++;
    if (r->first_token_time < 0) r->first_token_time = now_s();
    bool done = r->n_generated == r->max_new || is_stop(r, tok);
    if (done) {
        DSC_TRY(dsc_infer_engine_flush(s->engine, r->uid));
        r->state = REQ_DONE;
    }
    s->cb_logits = row;
    dsc_status st = s->cb ? s->cb(s->user, r->uid, tok, done) : NULL;
    s->cb_logits = NULL;
    return st;
}

static void forget(dsc_scheduler *s, request *r) {
    int32_t i = 0;
    while (s->reqs[i] != r)
        i++;
    request_free(r);
    s->reqs[i] = s->reqs[--s->n_reqs];
}

/* The micro-batch whose logits just came out of the last stage: the
 * sampling ranks draw the tokens of the requests whose prompt is now cached
 * and post them to the other ranks. */
static dsc_status sample(dsc_scheduler *s, micro_batch *mb) {
    int32_t W = dsc_infer_engine_logits_width(s->engine), k = 0;
    for (int32_t i = 0; i < mb->n; i++) {
        request *r = mb->reqs[i];
        if (r->n_cached != total_tokens(r)) continue;
        DSC_TRY(dsc_infer_engine_sample(s->engine, mb->logits + (size_t)i * (size_t)W, &r->sampling, r->tokens,
                                        total_tokens(r), &r->rng, &mb->sampled[k++]));
    }
    return dsc_infer_engine_post_tokens(s->engine, mb->sampled, k);
}

/* The micro-batch that landed: every rank has its sampled tokens (the
 * other ranks receive them now) and streams them; requests released in
 * flight are dropped now. */
static dsc_status land(dsc_scheduler *s, micro_batch *mb) {
    int32_t W = dsc_infer_engine_logits_width(s->engine), k = 0;
    bool sampler = dsc_infer_engine_samples(s->engine);
    for (int32_t i = 0; i < mb->n; i++)
        k += mb->reqs[i]->n_cached == total_tokens(mb->reqs[i]);
    if (!sampler) DSC_TRY(dsc_infer_engine_recv_tokens(s->engine, mb->sampled, k));
    k = 0;
    for (int32_t i = 0; i < mb->n; i++) {
        request *r = mb->reqs[i];
        r->in_flight = false;
        bool samples = r->n_cached == total_tokens(r);
        int32_t tok = samples ? mb->sampled[k++] : -1;
        if (r->released) {
            if (r->n_cached > 0) DSC_TRY(dsc_infer_engine_flush(s->engine, r->uid));
            forget(s, r);
        } else if (samples) {
            DSC_TRY(emit(s, r, tok, sampler ? mb->logits + (size_t)i * (size_t)W : NULL));
        }
    }
    mb->n = 0;
    return NULL;
}

static bool any_in_flight(const dsc_scheduler *s) {
    for (int32_t i = 0; i < s->depth; i++)
        if (s->ring[i].n > 0) return true;
    return false;
}

dsc_status dsc_scheduler_step(dsc_scheduler *s, bool *idle) {
    admit(s);
    *idle = count_state(s, REQ_RUNNING) == 0 && !next_waiting(s) && !any_in_flight(s);
    if (*idle) return NULL;
    int32_t n;
    int64_t starved;
    DSC_TRY(compose(s, &n, &starved));
    /* KV ran out under an optimistic reservation: the newest request yields
     * to older starved ones (and to itself being retried later); a newest
     * request in flight yields once it has landed. */
    for (;;) {
        request *newest = newest_running(s);
        bool yield = n == 0 || (starved >= 0 && newest && newest->order > starved);
        if (!yield || (newest && newest->in_flight)) break;
        DSC_TRY(preempt_newest(s));
        DSC_TRY(compose(s, &n, &starved));
    }
    micro_batch *mb = &s->ring[s->steps % s->depth];
    int32_t tokens = 0, landed;
    for (int32_t i = 0; i < n; i++) {
        request *r = s->batch[i];
        mb->reqs[i] = r;
        r->in_flight = true;
        r->n_cached += r->chunk; /* the blocks are the engine's from now on */
        tokens += r->chunk;
    }
    mb->n = n;
    DSC_CHECK(n <= s->rows, DSC_ERR_INTERNAL, "scheduler: a micro-batch of %d sequences (at most %d)", n, s->rows);
    DSC_TRY(dsc_infer_engine_tick(s->engine, n, s->uids, s->ptrs, s->counts, mb->logits, &landed));
    if (dsc_infer_engine_samples(s->engine)) DSC_TRY(sample(s, mb));
    micro_batch *done = &s->ring[(s->steps + 1) % s->depth]; /* pushed depth - 1 steps ago */
    s->steps++;
    DSC_CHECK(landed == done->n, DSC_ERR_INTERNAL, "scheduler: %d sequences landed, %d expected", landed, done->n);
    DSC_TRY(land(s, done));
    int32_t total = dsc_infer_engine_total_blocks(s->engine);
    double util = (double)(total - dsc_infer_engine_free_blocks(s->engine)) / total;
    if (n == 0) return NULL; /* a tick that only drains the pipeline is no forward */
    s->stats.forwards++;
    s->stats.tokens_forwarded += tokens;
    if (tokens > s->stats.max_tokens_in_forward) s->stats.max_tokens_in_forward = tokens;
    s->stats.kv_utilisation_sum += util;
    if (util > s->stats.kv_utilisation_peak) s->stats.kv_utilisation_peak = util;
    return NULL;
}

dsc_status dsc_scheduler_run(dsc_scheduler *s) {
    for (bool idle = false; !idle;)
        DSC_TRY(dsc_scheduler_step(s, &idle));
    return NULL;
}

const dsc_scheduler_stats *dsc_scheduler_get_stats(const dsc_scheduler *s) {
    return &s->stats;
}

double dsc_scheduler_ttft(const dsc_scheduler *s, uint64_t uid) {
    const request *r = find(s, uid);
    return r && r->first_token_time >= 0 ? r->first_token_time - r->submit_time : -1.0;
}

const float *dsc_scheduler_token_logits(const dsc_scheduler *s) {
    return s->cb_logits;
}

dsc_scheduler_counts dsc_scheduler_get_counts(const dsc_scheduler *s) {
    dsc_scheduler_counts c = {0};
    for (int32_t i = 0; i < s->n_reqs; i++) {
        const request *r = s->reqs[i];
        if (r->released) continue;
        c.waiting += r->state == REQ_WAITING;
        c.preempted += r->state == REQ_WAITING && r->preempted;
        c.running += r->state == REQ_RUNNING;
        c.finished += r->state == REQ_DONE;
    }
    return c;
}

dsc_status dsc_scheduler_release(dsc_scheduler *s, uint64_t uid) {
    int32_t i = 0;
    while (i < s->n_reqs && s->reqs[i]->uid != uid)
        i++;
    DSC_CHECK(i < s->n_reqs, DSC_ERR_INVALID, "scheduler: release of unknown request %llu",
              (unsigned long long)uid);
    request *r = s->reqs[i];
    DSC_CHECK(!r->released, DSC_ERR_INVALID, "scheduler: request %llu was already released",
              (unsigned long long)uid);
    if (r->in_flight) { /* later stages still write its KV: it goes when it lands */
        r->released = true;
        return NULL;
    }
    /* A finished request was flushed when it ended; any other holds KV once it has cached tokens. */
    if (r->state != REQ_DONE && r->n_cached > 0) DSC_TRY(dsc_infer_engine_flush(s->engine, uid));
    forget(s, r);
    return NULL;
}
