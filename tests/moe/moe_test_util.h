/* Helpers for the MoE layer tests: MoE options for tiny cases, a whole
 * GPT-MoE / Mixtral model run layer by layer on one process (with the
 * "moe_block" factory and its build extra), and filling tensors with seeded
 * values. Test-only. */
#ifndef DSC_TESTS_MOE_TEST_UTIL_H
#define DSC_TESTS_MOE_TEST_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "dsc/model.h"
#include "dsc/moe.h"
#include "dsc/rng.h"

/* Deterministic options (no random element): E experts, top-k, drop or not. */
void moe_test_options(dsc_moe_options *o, int num_experts, int k, bool drop_tokens, bool residual,
                      dsc_moe_expert_kind kind);

/* A model config for `arch` at tiny sizes (C 16, 4 heads, F 24, V 32, T 8). */
void moe_test_model_config(dsc_model_config *mc, dsc_model_arch arch, int n_layer, int num_experts,
                           int layer_freq);

typedef struct moe_test_model {
    dsc_model_config mc;
    dsc_param_store *store;
    dsc_layer **layers; /* [n] embed, blocks, head */
    int n;
} moe_test_model;

/* Builds every layer (dense and "moe_block" with `extra`), finalises the
 * store seeded with `seed` and reserves one slot of (B, T). */
dsc_status moe_test_model_build(moe_test_model *m, const dsc_model_config *mc, const dsc_moe_build_extra *extra,
                                uint64_t seed, int64_t B, int64_t T);
void moe_test_model_free(moe_test_model *m);
/* Forward and backward of one micro-batch (training, loss_scale 1, random
 * gate elements drawing from `rng`, may be NULL); the cross-entropy and the
 * summed gate losses come back in *loss and *aux. */
dsc_status moe_test_model_step(moe_test_model *m, const dsc_tensor *tokens, const dsc_tensor *targets,
                               dsc_rng *rng, double *loss, double *aux);

/* n values uniform in [-scale, scale] from a stream seeded by `seed`. */
void moe_test_fill(float *p, int64_t n, uint64_t seed, float scale);

#endif
