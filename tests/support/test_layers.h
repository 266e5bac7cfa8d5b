/* Test-only: a model's whole layer stack on one process (embedding, blocks,
 * head, as a single pipeline stage holds it), built from the model's specs
 * with whichever layer factories the caller registered, and run forward or
 * backward through every layer. Not here: registering factories, model
 * configs or losses; tests/nn and tests/moe wrap this in their own models. */
#ifndef DSC_TESTS_SUPPORT_TEST_LAYERS_H
#define DSC_TESTS_SUPPORT_TEST_LAYERS_H

#include "dsc/model.h"
#include "dsc/nn.h"

/* Builds every layer of `mc`'s specs on `device` (`extra`: the build context's
 * extra, NULL for dense models) into a new store, finalises it (seeded with
 * `seed`) and reserves `slots` slots of (B, T). `mc` must outlive the layers.
 * On failure nothing stays allocated and the outputs are NULL / 0. */
dsc_status dsc_test_layers_build(const dsc_model_config *mc, dsc_device device, const void *extra, uint64_t seed,
                                 int slots, int64_t B, int64_t T, dsc_param_store **store, dsc_layer ***layers,
                                 int *n);
/* Destroys layers[0 .. n), the array and the store. */
void dsc_test_layers_free(dsc_param_store *store, dsc_layer **layers, int n);
/* Forward of micro-batch `slot` through layers[0 .. n) in order. */
dsc_status dsc_test_layers_forward(dsc_layer **layers, int n, int slot, dsc_micro_ctx *ctx);
/* Backward of micro-batch `slot` through layers[n - 1 .. 0], head first. */
dsc_status dsc_test_layers_backward(dsc_layer **layers, int n, int slot, dsc_micro_ctx *ctx);

#endif
