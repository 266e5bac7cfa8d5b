/* serve_logprobs: the log-softmax normaliser and the top n over a row, or
 * over the ranks' slices: a max all-reduce (the row's maximum and the
 * token's logit, which one rank holds), a sum all-reduce of exp(x - max),
 * and an all-gather of each rank's own top n, from which every rank picks
 * the same n (slices come in rank order = id order, so ties still go to
 * the lower id). */
#include "serve/logprobs.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>

/* The n best of cand[0, m) (ids < 0 are absent), best first, ties to the lower id. */
static void top_of(const serve_logprob *cand, int32_t m, int32_t n, serve_logprob *out) {
    for (int32_t k = 0; k < n; k++) {
        int32_t best = -1;
        for (int32_t i = 0; i < m; i++) {
            bool taken = cand[i].id < 0;
            for (int32_t j = 0; j < k && !taken; j++)
                taken = out[j].id == cand[i].id;
            if (!taken && (best < 0 || cand[i].logprob > cand[best].logprob ||
                           (cand[i].logprob == cand[best].logprob && cand[i].id < cand[best].id)))
                best = i;
        }
        out[k] = best >= 0 ? cand[best] : (serve_logprob){-1, -INFINITY};
    }
}

/* The same pick over row (ids v0 + i; raw logits), without building candidates. */
static void top_of_row(const float *row, int32_t width, int32_t v0, int32_t n, serve_logprob *out) {
    for (int32_t k = 0; k < n; k++) {
        int32_t best = -1;
        for (int32_t v = 0; v < width; v++) {
            bool taken = false;
            for (int32_t j = 0; j < k && !taken; j++)
                taken = out[j].id == v0 + v;
            if (!taken && (best < 0 || row[v] > row[best])) best = v;
        }
        out[k] = best >= 0 ? (serve_logprob){v0 + best, row[best]} : (serve_logprob){-1, -INFINITY};
    }
}

static dsc_status allreduce(dsc_comm *comm, float *x, int64_t n, dsc_reduce_op op) {
    dsc_tensor t = dsc_tensor_view(x, DSC_DTYPE_F32, 1, &n, DSC_CPU);
    return dsc_error_wrap(dsc_comm_allreduce(comm, &t, op), "logprobs: %s all-reduce", dsc_reduce_op_name(op));
}

dsc_status serve_logprobs(dsc_comm *comm, const float *row, int32_t width, int32_t v0, int32_t token, int32_t n,
                          serve_logprob *out) {
    DSC_CHECK(n >= 0 && n <= SERVE_LOGPROBS_MAX, DSC_ERR_INVALID, "logprobs: %d alternatives (0..%d)", n,
              SERVE_LOGPROBS_MAX);
    bool mine = token >= v0 && token < v0 + width;
    float top[2] = {-INFINITY, mine ? row[token - v0] : -INFINITY}; /* the row's maximum, the token's logit */
    for (int32_t v = 0; v < width; v++)
        if (row[v] > top[0]) top[0] = row[v];
    if (comm) DSC_TRY(allreduce(comm, top, 2, DSC_REDUCE_OP_MAX));
    double sum = 0;
    for (int32_t v = 0; v < width; v++)
        sum += exp((double)row[v] - top[0]);
    float total = (float)sum;
    if (comm) DSC_TRY(allreduce(comm, &total, 1, DSC_REDUCE_OP_SUM));
    float lse = top[0] + (float)log(comm ? (double)total : sum);
    top_of_row(row, width, v0, n, out + 1);
    if (comm && n > 0) {
        int P = dsc_comm_size(comm);
        serve_logprob *all = malloc((size_t)P * (size_t)n * sizeof *all);
        DSC_CHECK(all, DSC_ERR_NOMEM, "logprobs: %d candidates", P * n);
        int64_t bytes = (int64_t)n * (int64_t)sizeof *all, total_bytes = bytes * P;
        dsc_tensor s = dsc_tensor_view(out + 1, DSC_DTYPE_U8, 1, &bytes, DSC_CPU);
        dsc_tensor r = dsc_tensor_view(all, DSC_DTYPE_U8, 1, &total_bytes, DSC_CPU);
        dsc_status st = dsc_comm_allgather(comm, &s, &r, NULL);
        if (!st) top_of(all, P * n, n, out + 1);
        free(all);
        DSC_TRY(dsc_error_wrap(st, "logprobs: all-gather of the candidates"));
    }
    out[0] = (serve_logprob){token, top[1] - lse};
    for (int32_t k = 1; k <= n; k++)
        if (out[k].id >= 0) out[k].logprob -= lse;
    return NULL;
}
