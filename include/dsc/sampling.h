/* dsc/sampling.h — choosing the next token from a row of logits.
 *
 * Hugging Face generate() semantics, applied in its order: repetition penalty
 * (a seen token's logit is divided by the penalty when positive, multiplied
 * when negative; once per distinct token), then greedy argmax when
 * temperature is 0, else temperature, top-k, top-p (nucleus: the smallest set
 * of most likely tokens whose probability reaches top_p, at least one), and a
 * draw from the renormalised distribution with the caller's dsc_rng (seed it
 * with purpose DSC_RNG_SAMPLE). No allocation per call: the caller passes a
 * scratch array of V candidates. V vocabulary size. */
#ifndef DSC_SAMPLING_H
#define DSC_SAMPLING_H

#include "dsc/api.h"
#include <stdint.h>

#include "dsc/rng.h"
#include "dsc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsc_sampling_params {
    float temperature;        /* 0 = greedy (ties go to the lower id) */
    int32_t top_k;            /* 0 = off */
    float top_p;              /* 1 = off; in (0, 1] */
    float repetition_penalty; /* 1 = off; > 0 */
} dsc_sampling_params;

/* Greedy decoding: temperature 0, every filter off. */
DSC_API dsc_sampling_params dsc_sampling_params_greedy(void);

typedef struct dsc_sample_candidate {
    float logit;
    int32_t id;
} dsc_sample_candidate;

/* Picks a token from logits (V). history (n_history token ids, may repeat)
 * feeds the repetition penalty; scratch (V) is overwritten. Invalid params
 * or history ids outside [0, V) are DSC_ERR_INVALID; a row with no finite
 * logit is DSC_ERR_NUMERIC. */
DSC_API dsc_status dsc_sample(int32_t *token_out, const float *logits, int32_t V,
                              const dsc_sampling_params *params, const int32_t *history, int64_t n_history,
                              dsc_sample_candidate *scratch, dsc_rng *rng);

#ifdef __cplusplus
}
#endif
#endif
