/* Log-probabilities for OpenAI's `logprobs`: the log-softmax of one raw
 * logits row at the sampled token, and the top n alternatives, on one rank
 * (the whole row) or across the ranks of a vocabulary-parallel LM head
 * (each holds a slice; no rank gathers the row). Not here: where the rows
 * come from (the scheduler's token callback, loop.c) or how they print. */
#ifndef DSC_SERVE_LOGPROBS_H
#define DSC_SERVE_LOGPROBS_H

#include <stdint.h>

#include "dsc/comm.h"
#include "dsc/status.h"

enum { SERVE_LOGPROBS_MAX = 20 }; /* top alternatives per token: OpenAI's limit */

typedef struct serve_logprob {
    int32_t id;
    float logprob;
} serve_logprob;

/* out[0]: `token` and its log-probability; out[1..n] (n <= SERVE_LOGPROBS_MAX): the n most likely
 * ids, best first, ties to the lower id ((-1, -inf) past the vocabulary).
 * row holds the logits of ids [v0, v0 + width). comm NULL: row is the
 * whole vocabulary (v0 0). Otherwise every rank of comm calls this with its
 * slice (slices in rank order cover the vocabulary) and the same token and
 * n, and every rank gets the same out. */
dsc_status serve_logprobs(dsc_comm *comm, const float *row, int32_t width, int32_t v0, int32_t token, int32_t n,
                          serve_logprob *out);

#endif
