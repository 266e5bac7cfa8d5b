/* A model's layer stack for tests (see test_layers.h). */
#include <stdlib.h>

#include "test_layers.h"

dsc_status dsc_test_layers_build(const dsc_model_config *mc, dsc_device device, const void *extra, uint64_t seed,
                                 int slots, int64_t B, int64_t T, dsc_param_store **store, dsc_layer ***layers,
                                 int *n) {
    *store = NULL;
    *layers = NULL;
    *n = 0;
    dsc_layer_spec *specs;
    int count;
    DSC_TRY(dsc_model_specs(mc, &specs, &count));
    dsc_status s = dsc_params_create(store, device, seed);
    *layers = calloc((size_t)count, sizeof **layers);
    dsc_build_ctx ctx = {.model = mc, .params = *store, .device = device, .extra = extra};
    for (int i = 0; i < count && !s; i++) {
        s = dsc_layer_build(&specs[i], &ctx, &(*layers)[i]);
        if (!s) (*n)++;
    }
    free(specs);
    if (!s) s = dsc_params_finalize(*store);
    for (int i = 0; i < *n && !s; i++)
        s = dsc_layer_reserve((*layers)[i], slots, B, T);
    if (s) {
        dsc_test_layers_free(*store, *layers, *n);
        *store = NULL;
        *layers = NULL;
        *n = 0;
    }
    return s;
}

void dsc_test_layers_free(dsc_param_store *store, dsc_layer **layers, int n) {
    for (int i = 0; i < n; i++)
        dsc_layer_destroy(layers[i]);
    free(layers);
    dsc_params_destroy(store);
}

dsc_status dsc_test_layers_forward(dsc_layer **layers, int n, int slot, dsc_micro_ctx *ctx) {
    dsc_tensor cur = {0}, next;
    for (int i = 0; i < n; i++) {
        DSC_TRY(dsc_layer_forward(layers[i], slot, &cur, &next, ctx));
        cur = next;
    }
    return NULL;
}

dsc_status dsc_test_layers_backward(dsc_layer **layers, int n, int slot, dsc_micro_ctx *ctx) {
    dsc_tensor grad = {0}, din;
    for (int i = n - 1; i >= 0; i--) {
        DSC_TRY(dsc_layer_backward(layers[i], slot, &grad, &din, ctx));
        grad = din;
    }
    return NULL;
}
