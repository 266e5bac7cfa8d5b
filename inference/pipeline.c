/* The engine's micro-batch pipeline: a ring of P ragged batches, one per
 * tick, so that while stage s computes micro-batch m, stage s + 1 computes
 * m - 1. Every rank builds every micro-batch (its scheduler replica makes
 * the same calls, so KV blocks are allocated alike on all stages) and
 * stage s runs the one pushed s ticks ago: it receives the residual stream
 * (N, C) from stage s - 1 over pipe/'s p2p (each activation carries the
 * meta header, so a stage that disagrees about a micro-batch's size is an
 * error naming both stages, and every transfer is bounded by the pipe
 * communicator's watchdog deadline), runs its layers and sends its output
 * on. The micro-batch pushed P - 1 ticks ago lands: the last stage has its
 * logits, and its KV commits on every rank. With one stage the ring has one
 * slot and a tick is exactly one forward.
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

struct infer_pipeline {
    dsc_infer_model *m;
    int32_t P;
    dsc_ragged_batch *ring; /* (P): micro-batch pushed at tick t in slot t % P */
    int64_t ticks;
    pipe_p2p *p2p; /* NULL with one stage */
    float *send;   /* (N, C) output in flight to the next stage */
    size_t send_bytes;
    int64_t max_tokens;
    int64_t fail_tick; /* failpoint: the tick this rank fails at (-1: never) */
    bool fail_kill;
    double busy, total;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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

dsc_status infer_pipeline_create(dsc_infer_model *m, const dsc_kv_config *kv, infer_pipeline **out) {
    *out = NULL;
    infer_pipeline *p = calloc(1, sizeof *p);
    DSC_CHECK(p, DSC_ERR_NOMEM, "inference pipeline");
    p->m = m;
    p->P = m->pipe_comm ? m->stages : 1;
    p->max_tokens = kv->max_tokens_per_forward;
    p->ring = calloc((size_t)p->P, sizeof *p->ring);
    dsc_status s = p->ring ? NULL : dsc_error(DSC_ERR_NOMEM, "pipeline ring of %d micro-batches", p->P);
    for (int32_t i = 0; !s && i < p->P; i++)
        s = dsc_ragged_batch_init(&p->ring[i], kv);
    if (!s && m->pipe_comm) {
        p->send_bytes = (size_t)p->max_tokens * (size_t)m->cfg.d_model * sizeof(float);
        s = dsc_mem_alloc((void **)&p->send, p->send_bytes, DSC_MEM_ACTIVATIONS, DSC_CPU);
        if (!s) s = pipe_p2p_create(m->pipe_comm, 1, &p->p2p);
    }
    if (s) {
        int32_t P = p->P;
        infer_pipeline_destroy(p);
        return dsc_error_wrap(s, "pipeline stage %d of %d", m->stage, P);
    }
    read_failpoint(p);
    *out = p;
    return NULL;
}

void infer_pipeline_destroy(infer_pipeline *p) {
    if (!p) return;
    pipe_p2p_destroy(p->p2p);
    if (p->send) dsc_mem_free(p->send, p->send_bytes, DSC_MEM_ACTIVATIONS, DSC_CPU);
    for (int32_t i = 0; p->ring && i < p->P; i++)
        if (p->ring[i].tokens) dsc_ragged_batch_free(&p->ring[i]);
    free(p->ring);
    free(p);
}

int32_t infer_pipeline_depth(const infer_pipeline *p) {
    return p->P;
}

bool infer_pipeline_empty(const infer_pipeline *p) {
    for (int32_t i = 0; i < p->P; i++)
        if (p->ring[i].n_seqs > 0) return false;
    return true;
}

dsc_ragged_batch *infer_pipeline_push_slot(infer_pipeline *p) {
    dsc_ragged_batch *b = &p->ring[p->ticks % p->P];
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

/* This stage's part of micro-batch b: receive, compute, send. */
static dsc_status stage_forward(infer_pipeline *p, const dsc_ragged_batch *b, dsc_kv_cache *cache,
                                dsc_forward_scratch *s, float *logits) {
    dsc_infer_model *m = p->m;
    int64_t N = b->n_tokens, C = m->cfg.d_model;
    if (!m->first) {
        dsc_tensor buf = dsc_model_view2(s->x, p->max_tokens, C), got;
        DSC_TRY(pipe_p2p_recv_activation(p->p2p, &buf, 0, m->stage - 1, 0, &got));
        DSC_CHECK(got.shape[0] == N, DSC_ERR_INTERNAL,
                  "pipeline stage %d: stage %d sent %lld tokens for a micro-batch of %lld: the stages' schedulers "
                  "disagree",
                  m->stage, m->stage - 1, (long long)got.shape[0], (long long)N);
    }
    double t0 = now_s();
    DSC_TRY(dsc_model_forward(m, b, cache, s, logits));
    p->busy += now_s() - t0;
    if (!p->p2p) return NULL;
    /* The previous send read p->send and its header buffer: both are reused now. */
    DSC_TRY(pipe_p2p_wait_sends(p->p2p));
    pipe_p2p_begin_batch(p->p2p); /* every micro-batch's activation carries its own header */
    if (m->last) return NULL;
    memcpy(p->send, s->x, (size_t)(N * C) * sizeof(float));
    dsc_tensor out = dsc_model_view2(p->send, N, C);
    return pipe_p2p_send_activation(p->p2p, &out, 0, m->stage + 1, 0);
}

dsc_status infer_pipeline_tick(infer_pipeline *p, dsc_kv_cache *cache, dsc_kv_state *state, dsc_forward_scratch *s,
                               float *logits, int32_t *landed) {
    double t0 = now_s();
    *landed = 0;
    DSC_TRY(failpoint(p));
    int64_t t = p->ticks++;
    int stage = p->m->pipe_comm ? p->m->stage : 0;
    if (t >= stage) {
        const dsc_ragged_batch *b = &p->ring[(t - stage) % p->P];
        if (b->n_seqs > 0) DSC_TRY(stage_forward(p, b, cache, s, logits));
    }
    if (t >= p->P - 1) {
        dsc_ragged_batch *b = &p->ring[(t - (p->P - 1)) % p->P];
        if (b->n_seqs > 0) {
            DSC_TRY(dsc_ragged_batch_finish(b, state));
            *landed = b->n_seqs;
            b->n_seqs = b->n_tokens = 0; /* out of flight */
        }
    }
    p->total += now_s() - t0;
    return NULL;
}

dsc_status infer_pipeline_share(infer_pipeline *p, void *values, dsc_dtype dtype, int64_t n) {
    if (!p->p2p || n == 0) return NULL;
    dsc_tensor t = dsc_tensor_view(values, dtype, 1, &n, DSC_CPU);
    dsc_status s = dsc_comm_broadcast(p->m->pipe_comm, &t, p->P - 1);
    return s ? dsc_error_wrap(s, "pipeline stage %d: the last stage's sampled tokens", p->m->stage) : NULL;
}

void infer_pipeline_times(const infer_pipeline *p, double *busy, double *total) {
    *busy = p->busy;
    *total = p->total;
}
