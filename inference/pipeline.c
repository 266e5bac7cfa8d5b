/* The engine's micro-batch pipeline: a ring of D ragged batches, one per
 * tick, so that D micro-batches are in flight (D = P, the number of stages,
 * unless the engine's micro_batches asks for more). Every rank builds every
 * micro-batch (its scheduler replica makes the same calls, so KV blocks are
 * allocated alike on all stages), and at tick t every stage computes the
 * micro-batch pushed at tick t: stage s waits only for its input from stage
 * s - 1, so the stages run skewed in time — while stage s computes
 * micro-batch m, stage s + 1 computes m - 1 — with no collective across the
 * pipeline. The micro-batch pushed D - 1 ticks ago lands: its KV commits on
 * every rank, and its sampled tokens, which the last stage drew and posted
 * to every stage right after computing it (infer_pipeline_post_tokens),
 * are received (infer_pipeline_recv_tokens). Stage 0 is the only stage
 * that waits for them (the pipeline's ring: a sequence's next micro-batch
 * needs its token; D > P leaves it D - P micro-batches of slack for the
 * latency of that round trip); the middle stages find them already there,
 * and the last stage never waits. With one stage the ring has one slot and
 * a tick is exactly one forward.
 *
 * Each activation is one message over pipe/'s p2p: a header (magic,
 * sender stage, tick, tokens) fused with the payload, of the size both
 * ends compute from their replica's micro-batch (no separate meta message
 * per micro-batch); a stage that disagrees about a micro-batch is an error
 * naming both stages, and every transfer is bounded by the pipe
 * communicator's watchdog deadline. Sends are posted with request handles
 * from a ring of D message buffers (a stage's send of micro-batch m
 * completes while it computes the next ones; only the send of D ticks ago
 * is waited for, before its buffer is reused).
 * Under TP the residual stream is replicated over the stage's TP group, so
 * each TP rank sends only its 1/tp slice of the flattened (N, C) activation
 * (Megatron's scatter-gather; uneven splits give the first N·C mod tp ranks
 * one element more) and the next stage all-gathers the slices over its TP
 * group.
 *
 * Fault injection for the failure tests: DSC_FAILPOINT=serve_tick:R:K
 * makes world rank R kill itself (SIGKILL) at its tick K;
 * serve_error:R:K makes it return an error there instead.
 *
 * Not here: what goes into a micro-batch (scheduler.c), the forward
 * (model_forward.c), which layers a stage holds (pipeline_stage.c). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "inference/pipeline.h"
#include "pipe/p2p.h"

/* An activation message: HDR int32 words, then the payload floats. */
enum { HDR = 4, MAGIC = 0x44535350 /* "DSSP" */, STREAM_ACTIVATION = 0, STREAM_TOKENS = 1 };

struct infer_pipeline {
    dsc_infer_model *m;
    int32_t P, D;           /* stages, micro-batches in flight (>= P) */
    dsc_ragged_batch *ring; /* (D): micro-batch pushed at tick t in slot t % D */
    int64_t ticks;
    pipe_p2p *p2p; /* NULL with one stage */
    dsc_comm *tp;  /* the stage's TP group (scatter-gather); NULL: one rank */
    int tp_rank, tp_size;
    float *in;                   /* (HDR + slice) the message received */
    float *out;                  /* (D, HDR + slice) messages in flight to the next stage, by slot */
    dsc_comm_request **out_reqs; /* (D) their sends */
    int64_t msg_floats;
    int32_t *tokens;             /* (D, 1 + max_seqs) token messages of the last stage, by slot */
    dsc_comm_request **tok_reqs; /* (D, P - 1): their sends to each other stage */
    int64_t max_tokens, max_seqs;
    int64_t fail_tick; /* failpoint: the tick this rank fails at (-1: never) */
    bool fail_kill;
    infer_pipeline_profile prof;
};

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static double now_s(void) {
    return clock_s(CLOCK_MONOTONIC);
}

static void read_failpoint(infer_pipeline *p) {
    p->fail_tick = -1;
    const char *fp = getenv("DSC_FAILPOINT");
    int rank = p->m->pipe_comm ? dsc_comm_world_rank(p->m->pipe_comm, p->m->stage) : 0, r;
    long long k;
    char kind[16];
    if (!fp || sscanf(fp, "serve_%15[a-z]:%d:%lld", kind, &r, &k) != 3 || r != rank) return;
    p->fail_kill = strcmp(kind, "tick") == 0;
    if (p->fail_kill || strcmp(kind, "error") == 0) p->fail_tick = k;
}

/* This TP rank's slice [*off, *off + *count) of n elements. */
static void slice(const infer_pipeline *p, int64_t n, int64_t *off, int64_t *count) {
    int64_t q = n / p->tp_size, r = n % p->tp_size, k = p->tp_rank;
    *off = k * q + (k < r ? k : r);
    *count = q + (k < r);
}

static dsc_status alloc_messages(infer_pipeline *p) {
    /* the largest slice, rounded to 64 floats so that each message of the ring is aligned */
    p->msg_floats = (HDR + (p->max_tokens * p->m->cfg.d_model + p->tp_size - 1) / p->tp_size + 63) / 64 * 64;
    DSC_TRY(dsc_mem_alloc((void **)&p->in, (size_t)p->msg_floats * sizeof(float), DSC_MEM_ACTIVATIONS, DSC_CPU));
    DSC_TRY(dsc_mem_alloc((void **)&p->out, (size_t)(p->D * p->msg_floats) * sizeof(float), DSC_MEM_ACTIVATIONS,
                          DSC_CPU));
    p->out_reqs = calloc((size_t)p->D, sizeof *p->out_reqs);
    p->tokens = calloc((size_t)p->D * (size_t)(1 + p->max_seqs), sizeof *p->tokens);
    p->tok_reqs = calloc((size_t)p->D * (size_t)(p->P - 1), sizeof *p->tok_reqs);
    DSC_CHECK(p->out_reqs && p->tokens && p->tok_reqs, DSC_ERR_NOMEM, "messages of %d micro-batches", p->D);
    return pipe_p2p_create(p->m->pipe_comm, 1, &p->p2p);
}

dsc_status infer_pipeline_create(dsc_infer_model *m, const dsc_kv_config *kv, int32_t micro_batches,
                                 infer_pipeline **out) {
    *out = NULL;
    int32_t P = m->pipe_comm ? m->stages : 1;
    DSC_CHECK(micro_batches == 0 || (micro_batches >= P && micro_batches <= 4 * P), DSC_ERR_CONFIG,
              "engine micro_batches %d: with %d pipeline stage%s it must be 0 (as many as stages) or in [%d, %d]",
              micro_batches, P, P == 1 ? "" : "s", P, 4 * P);
    infer_pipeline *p = calloc(1, sizeof *p);
    DSC_CHECK(p, DSC_ERR_NOMEM, "inference pipeline");
    p->m = m;
    p->P = P;
    p->D = micro_batches > 0 ? micro_batches : P;
    p->max_tokens = kv->max_tokens_per_forward;
    p->max_seqs = kv->max_batch_sequences;
    p->tp = m->tp_comm;
    p->tp_rank = m->tp_comm ? m->tp_rank : 0;
    p->tp_size = m->tp_comm ? dsc_comm_size(m->tp_comm) : 1;
    p->ring = calloc((size_t)p->D, sizeof *p->ring);
    dsc_status s = p->ring ? NULL : dsc_error(DSC_ERR_NOMEM, "pipeline ring of %d micro-batches", p->D);
    for (int32_t i = 0; !s && i < p->D; i++)
        s = dsc_ragged_batch_init(&p->ring[i], kv);
    if (!s && m->pipe_comm) s = alloc_messages(p);
    if (s) {
        infer_pipeline_destroy(p);
        return dsc_error_wrap(s, "pipeline stage %d of %d", m->stage, P);
    }
    read_failpoint(p);
    *out = p;
    return NULL;
}

void infer_pipeline_destroy(infer_pipeline *p) {
    if (!p) return;
    for (int32_t i = 0; p->out_reqs && i < p->D; i++)
        dsc_status_free(dsc_comm_wait(&p->out_reqs[i]));
    for (int32_t i = 0; p->tok_reqs && i < p->D * (p->P - 1); i++)
        dsc_status_free(dsc_comm_wait(&p->tok_reqs[i]));
    pipe_p2p_destroy(p->p2p);
    if (p->in) dsc_mem_free(p->in, (size_t)p->msg_floats * sizeof(float), DSC_MEM_ACTIVATIONS, DSC_CPU);
    if (p->out) dsc_mem_free(p->out, (size_t)(p->D * p->msg_floats) * sizeof(float), DSC_MEM_ACTIVATIONS, DSC_CPU);
    free(p->out_reqs);
    free(p->tokens);
    free(p->tok_reqs);
    for (int32_t i = 0; p->ring && i < p->D; i++)
        if (p->ring[i].tokens) dsc_ragged_batch_free(&p->ring[i]);
    free(p->ring);
    free(p);
}

int32_t infer_pipeline_depth(const infer_pipeline *p) {
    return p->D;
}

bool infer_pipeline_empty(const infer_pipeline *p) {
    for (int32_t i = 0; i < p->D; i++)
        if (p->ring[i].n_seqs > 0) return false;
    return true;
}

dsc_ragged_batch *infer_pipeline_push_slot(infer_pipeline *p) {
    dsc_ragged_batch *b = &p->ring[p->ticks % p->D];
    b->n_seqs = b->n_tokens = 0;
    return b;
}

static dsc_status failpoint(const infer_pipeline *p) {
    if (p->ticks != p->fail_tick) return NULL;
    /* the moment of the failure, for the test that times how fast every rank stops */
    fprintf(stderr, "dsc: failpoint serve_%s: pipeline stage %d fails at tick %lld\n",
            p->fail_kill ? "tick" : "error", p->m->stage, (long long)p->ticks);
    fflush(stderr);
    if (p->fail_kill) raise(SIGKILL);
    return dsc_error(DSC_ERR_INTERNAL,
                     "failpoint serve_error: simulated failure of pipeline stage %d at tick %lld", p->m->stage,
                     (long long)p->ticks);
}

static void put_header(void *msg, int32_t stage, int64_t tick, int64_t n) {
    int32_t h[HDR] = {MAGIC, stage, (int32_t)(tick & 0x7fffffff), (int32_t)n};
    memcpy(msg, h, sizeof h);
}

/* Checks the header of a message from stage `from` for micro-batch `tick` of n tokens. */
static dsc_status check_header(const infer_pipeline *p, const void *msg, int32_t from, int64_t tick, int64_t n,
                               const char *what) {
    int32_t h[HDR];
    memcpy(h, msg, sizeof h);
    DSC_CHECK(h[0] == MAGIC && h[1] == from && h[2] == (int32_t)(tick & 0x7fffffff) && h[3] == (int32_t)n,
              DSC_ERR_INTERNAL,
              "pipeline stage %d: stage %d sent %s for stage %d's micro-batch %d of %d (magic %#x), stage %d "
              "expects micro-batch %lld of %lld: the stages' schedulers disagree",
              p->m->stage, from, what, h[1], h[2], h[3], (unsigned)h[0], p->m->stage, (long long)tick,
              (long long)n);
    return NULL;
}

/* The input of micro-batch b (pushed at `tick`) from the previous stage into s->x: this TP rank's
 * slice, then the whole (N, C) all-gathered over the TP group. */
static dsc_status receive(infer_pipeline *p, const dsc_ragged_batch *b, int64_t tick, dsc_forward_scratch *s) {
    int64_t n = b->n_tokens * p->m->cfg.d_model, off, count;
    slice(p, n, &off, &count);
    dsc_tensor msg = dsc_tensor_view(p->in, DSC_DTYPE_F32, 1, (int64_t[]){HDR + count}, DSC_CPU);
    double t0 = now_s();
    DSC_TRY(pipe_p2p_recv_stream(p->p2p, &msg, p->m->stage - 1, STREAM_ACTIVATION));
    p->prof.recv_wait += now_s() - t0;
    DSC_TRY(check_header(p, p->in, p->m->stage - 1, tick, b->n_tokens, "an activation"));
    if (!p->tp) {
        memcpy(s->x, p->in + HDR, (size_t)n * sizeof(float));
        return NULL;
    }
    int64_t *counts = malloc((size_t)p->tp_size * sizeof *counts);
    DSC_CHECK(counts, DSC_ERR_NOMEM, "pipeline stage %d: all-gather counts", p->m->stage);
    infer_pipeline q = {.tp_size = p->tp_size};
    for (q.tp_rank = 0; q.tp_rank < p->tp_size; q.tp_rank++)
        slice(&q, n, &off, &counts[q.tp_rank]);
    dsc_tensor mine = dsc_tensor_view(p->in + HDR, DSC_DTYPE_F32, 1, (int64_t[]){count}, DSC_CPU);
    dsc_tensor all = dsc_tensor_view(s->x, DSC_DTYPE_F32, 1, (int64_t[]){n}, DSC_CPU);
    t0 = now_s();
    dsc_status st = dsc_comm_allgather(p->tp, &mine, &all, counts);
    p->prof.gather += now_s() - t0;
    free(counts);
    return st ? dsc_error_wrap(st, "pipeline stage %d: all-gathering the activation over the TP group",
                               p->m->stage)
              : NULL;
}

/* Posts this TP rank's slice of s->x (micro-batch b, pushed at `tick`) to the
 * next stage, from the message slot of the tick: its send of D ticks ago
 * (long received: the next stage has computed that micro-batch since) is
 * the only one waited for. */
static dsc_status send(infer_pipeline *p, const dsc_ragged_batch *b, int64_t tick, const dsc_forward_scratch *s) {
    int64_t n = b->n_tokens * p->m->cfg.d_model, off, count;
    slice(p, n, &off, &count);
    float *msg = p->out + (tick % p->D) * p->msg_floats;
    dsc_comm_request **req = &p->out_reqs[tick % p->D];
    double t0 = now_s();
    DSC_TRY(dsc_comm_wait(req));
    p->prof.send_wait += now_s() - t0;
    put_header(msg, p->m->stage, tick, b->n_tokens);
    memcpy(msg + HDR, s->x + off, (size_t)count * sizeof(float));
    dsc_tensor t = dsc_tensor_view(msg, DSC_DTYPE_F32, 1, (int64_t[]){HDR + count}, DSC_CPU);
    return pipe_p2p_isend_stream(p->p2p, &t, p->m->stage + 1, STREAM_ACTIVATION, req);
}

dsc_status infer_pipeline_tick(infer_pipeline *p, dsc_kv_cache *cache, dsc_kv_state *state, dsc_forward_scratch *s,
                               float *logits, int32_t *landed) {
    double t0 = now_s();
    *landed = 0;
    DSC_TRY(failpoint(p));
    int64_t t = p->ticks++;
    const dsc_ragged_batch *b = &p->ring[t % p->D];
    if (b->n_seqs > 0) {
        dsc_infer_model *m = p->m;
        if (p->p2p && !m->first) DSC_TRY(receive(p, b, t, s));
        double f0 = now_s(), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
        DSC_TRY(dsc_model_forward(m, b, cache, s, logits));
        p->prof.busy += now_s() - f0;
        p->prof.busy_cpu += clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
        p->prof.forwards++;
        if (p->p2p && !m->last) DSC_TRY(send(p, b, t, s));
    }
    if (t >= p->D - 1) {
        dsc_ragged_batch *done = &p->ring[(t - (p->D - 1)) % p->D];
        if (done->n_seqs > 0) {
            DSC_TRY(dsc_ragged_batch_finish(done, state));
            *landed = done->n_seqs;
            done->n_seqs = done->n_tokens = 0; /* out of flight */
        }
    }
    p->prof.total += now_s() - t0;
    return NULL;
}

dsc_status infer_pipeline_post_tokens(infer_pipeline *p, const int32_t *tokens, int32_t n) {
    if (!p->p2p || n == 0) return NULL;
    DSC_CHECK(p->m->last && n <= p->max_seqs, DSC_ERR_INTERNAL,
              "pipeline stage %d: posting %d sampled tokens (the last stage posts at most %lld)", p->m->stage, n,
              (long long)p->max_seqs);
    int64_t t = p->ticks - 1; /* the micro-batch just computed */
    int32_t *msg = p->tokens + (t % p->D) * (1 + p->max_seqs);
    dsc_comm_request **reqs = p->tok_reqs + (t % p->D) * (p->P - 1);
    double t0 = now_s();
    for (int32_t k = 0; k < p->P - 1; k++) /* the sends of D ticks ago read this slot */
        DSC_TRY(dsc_comm_wait(&reqs[k]));
    p->prof.send_wait += now_s() - t0;
    msg[0] = (int32_t)(t & 0x7fffffff);
    memcpy(msg + 1, tokens, (size_t)n * sizeof *tokens);
    dsc_tensor v = dsc_tensor_view(msg, DSC_DTYPE_I32, 1, (int64_t[]){1 + n}, DSC_CPU);
    for (int32_t k = 0; k < p->P - 1; k++)
        DSC_TRY(pipe_p2p_isend_stream(p->p2p, &v, k, STREAM_TOKENS, &reqs[k]));
    return NULL;
}

dsc_status infer_pipeline_recv_tokens(infer_pipeline *p, int32_t *tokens, int32_t n) {
    if (!p->p2p || n == 0) return NULL;
    DSC_CHECK(!p->m->last && n <= p->max_seqs, DSC_ERR_INTERNAL,
              "pipeline stage %d: receiving %d sampled tokens (at most %lld, never on the last stage)",
              p->m->stage, n, (long long)p->max_seqs);
    int64_t t = p->ticks - p->D; /* the micro-batch landing in this tick */
    int32_t *msg = p->tokens;    /* slot 0: only the last stage keeps its messages in flight */
    dsc_tensor v = dsc_tensor_view(msg, DSC_DTYPE_I32, 1, (int64_t[]){1 + n}, DSC_CPU);
    double t0 = now_s();
    DSC_TRY(pipe_p2p_recv_stream(p->p2p, &v, p->P - 1, STREAM_TOKENS));
    p->prof.token_wait += now_s() - t0;
    DSC_CHECK(msg[0] == (int32_t)(t & 0x7fffffff), DSC_ERR_INTERNAL,
              "pipeline stage %d: the last stage sent the tokens of micro-batch %d, stage %d lands micro-batch "
              "%lld: the stages' schedulers disagree",
              p->m->stage, msg[0], p->m->stage, (long long)t);
    memcpy(tokens, msg + 1, (size_t)n * sizeof *tokens);
    return NULL;
}

dsc_status infer_pipeline_share(infer_pipeline *p, void *values, dsc_dtype dtype, int64_t n) {
    if (!p->p2p || n == 0) return NULL;
    dsc_tensor t = dsc_tensor_view(values, dtype, 1, &n, DSC_CPU);
    dsc_status s = dsc_comm_broadcast(p->m->pipe_comm, &t, p->P - 1);
    return s ? dsc_error_wrap(s, "pipeline stage %d: the last stage's values", p->m->stage) : NULL;
}

void infer_pipeline_get_profile(const infer_pipeline *p, infer_pipeline_profile *out) {
    *out = p->prof;
}
