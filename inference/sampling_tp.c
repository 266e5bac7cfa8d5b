/* Sampling from a vocabulary-parallel row (tensor-parallel LM head): each
 * rank holds the logits of ids [v0, v0 + nv); no rank ever sees the whole
 * row. Every rank applies the repetition penalty and temperature to its
 * slice, then
 *   greedy:  the best (logit, id) of each rank is gathered; the largest wins,
 *            ties to the lower id;
 *   top-k:   each rank's top k (with ties) is gathered and filtered again,
 *            then top-p and the draw run on those candidates as dsc_sample does;
 *   top-p:   the exp-mass of each rank is gathered for the total, then each
 *            rank's top m candidates (m = 256, doubling) until the merged
 *            prefix that no unsent candidate can precede reaches top_p;
 *   neither: the per-rank masses pick the rank the draw falls in, that rank
 *            draws inside its slice and broadcasts the id.
 * All ranks hold the same rng state and consume one uniform per draw, so
 * they agree on every token. Candidates are merged in rank order = id order,
 * so a draw visits them in the order dsc_sample would. Not here: the rules
 * (sampling.c, dsc/sampling.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "inference/sampling_internal.h"

/* Every rank's `bytes` bytes (counts[r] bytes from rank r; NULL: equal) into recv, in rank order. */
static dsc_status gather_bytes(dsc_comm *comm, const void *send, int64_t bytes, void *recv, const int64_t *counts,
                               int64_t total) {
    dsc_tensor s = dsc_tensor_view((void *)send, DSC_DTYPE_U8, 1, &bytes, DSC_CPU);
    dsc_tensor r = dsc_tensor_view(recv, DSC_DTYPE_U8, 1, &total, DSC_CPU);
    return dsc_comm_allgather(comm, &s, &r, counts);
}

/* Per-rank bookkeeping of one sampling call, carved from one allocation. */
typedef struct gathered {
    int tp;
    int64_t *bytes;               /* (tp) bytes each rank sends */
    dsc_sample_candidate *bounds; /* (tp) */
    double *mass;                 /* (tp) */
    int32_t *n;                   /* (tp) candidates per rank */
} gathered;

/* Every rank's n candidates `mine` into out, rank after rank; *total of them. */
static dsc_status gather(gathered *g, dsc_comm *comm, const dsc_sample_candidate *mine, int32_t n,
                         dsc_sample_candidate *out, int32_t *total) {
    DSC_TRY(gather_bytes(comm, &n, sizeof n, g->n, NULL, (int64_t)g->tp * (int64_t)sizeof n));
    int64_t sum = 0;
    for (int r = 0; r < g->tp; r++) {
        g->bytes[r] = (int64_t)g->n[r] * (int64_t)sizeof *mine;
        sum += g->n[r];
    }
    *total = (int32_t)sum;
    return gather_bytes(comm, mine, (int64_t)n * (int64_t)sizeof *mine, out, g->bytes,
                        sum * (int64_t)sizeof *mine);
}

/* Each rank's exp-mass of its slice relative to max, gathered; *sum is their total (rank order). */
static dsc_status masses(gathered *g, dsc_comm *comm, const dsc_sample_candidate *c, int32_t nv, float max,
                         double *per_rank, double *sum) {
    double mine = 0.0;
    for (int32_t i = 0; i < nv; i++)
        mine += exp((double)c[i].logit - max);
    DSC_TRY(gather_bytes(comm, &mine, sizeof mine, per_rank, NULL, (int64_t)g->tp * (int64_t)sizeof mine));
    *sum = 0.0;
    for (int r = 0; r < g->tp; r++)
        *sum += per_rank[r];
    return NULL;
}

/* Top-p alone: grows each rank's sorted prefix until the merged candidates
 * that precede every unsent one hold top_p of the mass. */
static dsc_status nucleus(gathered *g, const dsc_sample_shard *sh, dsc_sample_candidate *c,
                          dsc_sample_candidate *merged, float top_p, float max, int32_t *n_out) {
    dsc_sample_candidate *bounds = g->bounds;
    double sum;
    DSC_TRY(masses(g, sh->comm, c, sh->nv, max, g->mass, &sum));
    for (int32_t m = 256;; m *= 2) {
        int32_t mine = m < sh->nv ? m : sh->nv, total, nb;
        dsc_sample_sort_first(c, sh->nv, mine);
        /* An unsent candidate of a truncated rank is at most its last sent logit. */
        dsc_sample_candidate bound = {mine < sh->nv ? c[mine - 1].logit : -INFINITY, mine < sh->nv};
        DSC_TRY(gather(g, sh->comm, &bound, 1, bounds, &nb));
        DSC_TRY(gather(g, sh->comm, c, mine, merged, &total));
        qsort(merged, (size_t)total, sizeof *merged, dsc_sample_compare);
        bool complete = true;
        float limit = -INFINITY;
        for (int r = 0; r < nb; r++)
            if (bounds[r].id) {
                complete = false;
                limit = bounds[r].logit > limit ? bounds[r].logit : limit;
            }
        double cum = 0.0;
        int32_t keep = 0;
        while (keep < total && cum < (double)top_p * sum && (complete || merged[keep].logit > limit))
            cum += exp((double)merged[keep++].logit - max);
        if (cum >= (double)top_p * sum || complete || m >= sh->V) {
            *n_out = keep > 0 ? keep : 1;
            return NULL;
        }
    }
}

/* No filter: the rank the draw falls in draws inside its slice and broadcasts the id. */
static dsc_status draw_sharded(gathered *g, const dsc_sample_shard *sh, dsc_sample_candidate *c, float max,
                               dsc_rng *rng, int32_t *token) {
    double sum, *per_rank = g->mass;
    DSC_TRY(masses(g, sh->comm, c, sh->nv, max, per_rank, &sum));
    double target = dsc_rng_uniform(rng) * sum, before = 0.0;
    int owner = -1;
    for (int r = 0; r < g->tp && owner < 0; r++) {
        if (per_rank[r] > 0.0 && before + per_rank[r] > target) owner = r;
        if (owner < 0) before += per_rank[r];
    }
    if (owner < 0) /* rounding left target at the very top: the last rank with mass */
        for (int r = g->tp - 1; r >= 0 && owner < 0; r--)
            if (per_rank[r] > 0.0) owner = r, before = sum - per_rank[r], target = sum;
    int32_t id = -1;
    if (dsc_comm_rank(sh->comm) == owner) {
        double cum = before;
        for (int32_t i = 0; i < sh->nv; i++) {
            float w = isnan(c[i].logit) ? 0.0f : expf(c[i].logit - max);
            if (w <= 0.0f) continue;
            cum += w;
            id = c[i].id;
            if (cum > target) break;
        }
    }
    int64_t one = 1;
    dsc_tensor t = dsc_tensor_view(&id, DSC_DTYPE_I32, 1, &one, DSC_CPU);
    DSC_TRY(dsc_comm_broadcast(sh->comm, &t, owner));
    *token = id;
    return NULL;
}

static dsc_status sample(gathered *g, int32_t *token_out, const float *logits, const dsc_sample_shard *sh,
                         const dsc_sampling_params *p, const int32_t *history, int64_t n_history,
                         dsc_sample_candidate *c, dsc_rng *rng) {
    dsc_sample_candidate *merged = c + sh->nv;
    for (int32_t i = 0; i < sh->nv; i++)
        c[i] = (dsc_sample_candidate){logits[i], (int32_t)(sh->v0 + i)};
    DSC_TRY(dsc_sample_penalize(c, sh->v0, sh->nv, sh->V, p->repetition_penalty, history, n_history));
    int32_t b = dsc_sample_argmax(c, sh->nv), total;
    dsc_sample_candidate best = b >= 0 ? c[b] : (dsc_sample_candidate){-INFINITY, -1};
    DSC_TRY(gather(g, sh->comm, &best, 1, merged, &total));
    int32_t top = dsc_sample_argmax(merged, total);
    DSC_CHECK(top >= 0, DSC_ERR_NUMERIC, "sampling: no finite logit among %d", sh->V);
    if (p->temperature == 0.0f) {
        *token_out = merged[top].id;
        return NULL;
    }
    float max = merged[top].logit / p->temperature;
    for (int32_t i = 0; i < sh->nv; i++)
        c[i].logit /= p->temperature;
    int32_t n;
    if (p->top_k > 0 && p->top_k < sh->V) {
        int32_t mine = dsc_sample_top_k(c, sh->nv, p->top_k < sh->nv ? p->top_k : sh->nv);
        DSC_TRY(gather(g, sh->comm, c, mine, merged, &total));
        n = dsc_sample_top_k(merged, total, p->top_k);
        if (p->top_p < 1.0f) {
            double sum = 0.0, cum = 0.0;
            for (int32_t i = 0; i < n; i++)
                sum += exp((double)merged[i].logit - max);
            int32_t keep = 0;
            while (keep < n && cum < (double)p->top_p * sum)
                cum += exp((double)merged[keep++].logit - max);
            n = keep > 0 ? keep : 1;
        }
    } else if (p->top_p < 1.0f) {
        DSC_TRY(nucleus(g, sh, c, merged, p->top_p, max, &n));
    } else {
        return draw_sharded(g, sh, c, max, rng, token_out);
    }
    *token_out = dsc_sample_draw(merged, n, max, rng);
    return NULL;
}

dsc_status dsc_sample_sharded(int32_t *token_out, const float *logits, const dsc_sample_shard *sh,
                              const dsc_sampling_params *p, const int32_t *history, int64_t n_history,
                              dsc_sample_candidate *scratch, dsc_rng *rng) {
    DSC_TRY(dsc_sample_check_params(p, sh->V));
    int tp = dsc_comm_size(sh->comm);
    /* per rank: a count, a byte count, a bound candidate and a mass */
    size_t bytes =
        (size_t)tp * (sizeof(int32_t) + sizeof(int64_t) + sizeof(dsc_sample_candidate) + sizeof(double));
    void *work = malloc(bytes);
    DSC_CHECK(work, DSC_ERR_NOMEM, "sampling over %d ranks", tp);
    gathered g = {.tp = tp, .bytes = work};
    g.bounds = (dsc_sample_candidate *)(g.bytes + tp);
    g.mass = (double *)(g.bounds + tp);
    g.n = (int32_t *)(g.mass + tp);
    dsc_status s = sample(&g, token_out, logits, sh, p, history, n_history, scratch, rng);
    free(work);
    return s;
}
