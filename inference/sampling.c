/* Token sampling from one row of logits: repetition penalty, greedy,
 * temperature, top-k, top-p, and a seeded draw.
 *
 * Works in a caller-provided candidate array, so decoding allocates nothing
 * per token. It samples one row; batching over sequences and keeping each
 * sequence's history is the engine's job. */
#include <math.h>
#include <stdlib.h>

#include "inference/sampling_internal.h"

dsc_sampling_params dsc_sampling_params_greedy(void) {
    return (dsc_sampling_params){.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .repetition_penalty = 1.0f};
}

dsc_status dsc_sample_check_params(const dsc_sampling_params *p, int32_t V) {
    DSC_CHECK(V > 0, DSC_ERR_INVALID, "sampling: vocabulary size must be > 0, got %d", V);
    DSC_CHECK(isfinite(p->temperature) && p->temperature >= 0.0f, DSC_ERR_INVALID,
              "sampling: temperature must be finite and >= 0, got %g", (double)p->temperature);
    DSC_CHECK(p->top_k >= 0, DSC_ERR_INVALID, "sampling: top_k must be >= 0, got %d", p->top_k);
    DSC_CHECK(p->top_p > 0.0f && p->top_p <= 1.0f, DSC_ERR_INVALID, "sampling: top_p must be in (0, 1], got %g",
              (double)p->top_p);
    DSC_CHECK(isfinite(p->repetition_penalty) && p->repetition_penalty > 0.0f, DSC_ERR_INVALID,
              "sampling: repetition_penalty must be > 0, got %g", (double)p->repetition_penalty);
    return NULL;
}

/* Penalises each distinct history token once (HF gathers and scatters, so a
 * token seen twice is still penalised once): a visited candidate's id is
 * negated while the loop runs, then restored. */
dsc_status dsc_sample_penalize(dsc_sample_candidate *c, int64_t v0, int32_t nv, int32_t V, float penalty,
                               const int32_t *history, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        DSC_CHECK(history[i] >= 0 && history[i] < V, DSC_ERR_INVALID,
                  "sampling: history token %lld is id %d, outside [0, %d)", (long long)i, history[i], V);
    if (penalty == 1.0f) return NULL;
    for (int64_t i = 0; i < n; i++) {
        if (history[i] < v0 || history[i] >= v0 + nv) continue;
        dsc_sample_candidate *x = &c[history[i] - v0];
        if (x->id < 0) continue;
        x->logit = x->logit > 0.0f ? x->logit / penalty : x->logit * penalty;
        x->id = -1 - x->id;
    }
    for (int64_t i = 0; i < n; i++)
        if (history[i] >= v0 && history[i] < v0 + nv) c[history[i] - v0].id = history[i];
    return NULL;
}

/* Descending logit, ties to the lower id, NaN last. */
int dsc_sample_compare(const void *pa, const void *pb) {
    const dsc_sample_candidate *a = pa, *b = pb;
    if (a->logit > b->logit || (isnan(b->logit) && !isnan(a->logit))) return -1;
    if (a->logit < b->logit || (isnan(a->logit) && !isnan(b->logit))) return 1;
    return (a->id > b->id) - (a->id < b->id);
}

static void swap(dsc_sample_candidate *a, dsc_sample_candidate *b) {
    dsc_sample_candidate t = *a;
    *a = *b;
    *b = t;
}

/* Moves the k first candidates of c[0, n) in dsc_sample_compare order to c[0, k),
 * unordered (quickselect with a median-of-three pivot): top-k and the head of
 * the nucleus never need the whole vocabulary sorted. */
static void select_first(dsc_sample_candidate *c, int32_t n, int32_t k) {
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (dsc_sample_compare(&c[mid], &c[lo]) < 0) swap(&c[mid], &c[lo]);
        if (dsc_sample_compare(&c[hi], &c[lo]) < 0) swap(&c[hi], &c[lo]);
        if (dsc_sample_compare(&c[hi], &c[mid]) < 0) swap(&c[hi], &c[mid]);
        dsc_sample_candidate pivot = c[mid];
        swap(&c[mid], &c[hi]);
        int32_t store = lo;
        for (int32_t i = lo; i < hi; i++)
            if (dsc_sample_compare(&c[i], &pivot) < 0) swap(&c[i], &c[store++]);
        swap(&c[store], &c[hi]);
        if (store == k || store == k - 1) return;
        if (store < k)
            lo = store + 1;
        else
            hi = store - 1;
    }
}

/* Brings the first n_keep candidates (dsc_sample_compare) to the front, sorted. */
void dsc_sample_sort_first(dsc_sample_candidate *c, int32_t n, int32_t n_keep) {
    if (n_keep < n) select_first(c, n, n_keep);
    qsort(c, (size_t)n_keep, sizeof *c, dsc_sample_compare);
}

int32_t dsc_sample_top_k(dsc_sample_candidate *c, int32_t n, int32_t k) {
    if (k >= n) {
        qsort(c, (size_t)n, sizeof *c, dsc_sample_compare);
        return n;
    }
    dsc_sample_sort_first(c, n, k);
    /* HF keeps every token tied with the k-th logit. */
    int32_t kept = k;
    for (int32_t i = k; i < n; i++)
        if (c[i].logit == c[k - 1].logit) swap(&c[i], &c[kept++]);
    qsort(c, (size_t)kept, sizeof *c, dsc_sample_compare);
    return kept;
}

/* Index of the largest logit (lowest index among equals); -1 if none is > -inf. */
int32_t dsc_sample_argmax(const dsc_sample_candidate *c, int32_t n) {
    int32_t best = -1;
    for (int32_t i = 0; i < n; i++)
        if (c[i].logit > -INFINITY && (best < 0 || c[i].logit > c[best].logit)) best = i;
    return best;
}

/* Draws from exp(logit - max) over c[0, n), overwriting logits with weights. */
int32_t dsc_sample_draw(dsc_sample_candidate *c, int32_t n, float max, dsc_rng *rng) {
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        c[i].logit = isnan(c[i].logit) ? 0.0f : expf(c[i].logit - max);
        sum += c[i].logit;
    }
    double target = dsc_rng_uniform(rng) * sum, cum = 0.0;
    int32_t last = 0;
    for (int32_t i = 0; i < n; i++) {
        if (c[i].logit <= 0.0f) continue;
        cum += c[i].logit;
        last = i;
        if (cum > target) return c[i].id;
    }
    return c[last].id; /* rounding left target at the very top */
}

dsc_status dsc_sample(int32_t *token_out, const float *logits, int32_t V, const dsc_sampling_params *p,
                      const int32_t *history, int64_t n_history, dsc_sample_candidate *c, dsc_rng *rng) {
    DSC_TRY(dsc_sample_check_params(p, V));
    for (int32_t i = 0; i < V; i++)
        c[i] = (dsc_sample_candidate){logits[i], i};
    DSC_TRY(dsc_sample_penalize(c, 0, V, V, p->repetition_penalty, history, n_history));
    int32_t best = dsc_sample_argmax(c, V);
    DSC_CHECK(best >= 0, DSC_ERR_NUMERIC, "sampling: no finite logit among %d", V);
    if (p->temperature == 0.0f) {
        *token_out = best;
        return NULL;
    }
    float max = c[best].logit / p->temperature;
    for (int32_t i = 0; i < V; i++)
        c[i].logit /= p->temperature;
    int32_t n = V;
    if (p->top_k > 0 && p->top_k < V) n = dsc_sample_top_k(c, V, p->top_k);
    if (p->top_p < 1.0f) {
        /* Smallest sorted prefix whose mass reaches top_p, found by sorting
         * growing chunks: each chunk precedes everything after it. */
        double sum = 0.0, cum = 0.0;
        for (int32_t i = 0; i < n; i++)
            sum += exp((double)c[i].logit - max);
        int32_t keep = 0, sorted = 0;
        while (keep < n && cum < (double)p->top_p * sum) {
            if (keep == sorted) {
                int32_t chunk = sorted > 256 ? sorted : 256;
                if (chunk > n - sorted) chunk = n - sorted;
                dsc_sample_sort_first(c + sorted, n - sorted, chunk);
                sorted += chunk;
            }
            cum += exp((double)c[keep++].logit - max);
        }
        n = keep > 0 ? keep : 1;
    }
    *token_out = dsc_sample_draw(c, n, max, rng);
    return NULL;
}
