/* The generic layer calls (argument checks, error context naming the layer)
 * and the registry from layer type names to factories.
 *
 * It knows no layer type: dense layers register themselves through
 * dsc_nn_register_dense_layers (models.c), moe/ registers its own. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/model.h"
#include "dsc/nn.h"
#include "runtime/nn/nn_internal.h"

dsc_status dsc_layer_reserve(dsc_layer *layer, int slots, int64_t B, int64_t T) {
    DSC_CHECK(slots >= 1 && B >= 1 && T >= 1, DSC_ERR_INVALID,
              "layer %s: reserve needs slots, B and T >= 1 (got %d, %lld, %lld)", layer->name, slots, (long long)B,
              (long long)T);
    dsc_status s = layer->ops->reserve(layer, slots, B, T);
    if (s) {
        layer->slots = 0; /* a failed reserve leaves no usable slot */
        return dsc_error_wrap(s, "layer %s (%s): reserving %d slots of (%lld, %lld)", layer->name,
                              layer->ops->type, slots, (long long)B, (long long)T);
    }
    layer->slots = slots;
    layer->max_B = B;
    layer->max_T = T;
    return NULL;
}

static dsc_status check_slot(const dsc_layer *layer, int slot, const char *what) {
    DSC_CHECK(layer->slots > 0, DSC_ERR_INVALID, "layer %s (%s) %s: no activation slots reserved", layer->name,
              layer->ops->type, what);
    DSC_CHECK(slot >= 0 && slot < layer->slots, DSC_ERR_INVALID, "layer %s (%s) %s: slot %d outside [0, %d)",
              layer->name, layer->ops->type, what, slot, layer->slots);
    return NULL;
}

void dsc_layer_set_saved_dtype(dsc_layer *layer, dsc_dtype dtype) {
    if (layer->ops->set_saved_dtype) layer->ops->set_saved_dtype(layer, dtype);
}

bool dsc_layer_release(dsc_layer *layer) {
    if (!layer->ops->release) return false;
    layer->ops->release(layer);
    layer->slots = 0;
    return true;
}

dsc_status dsc_layer_forward(dsc_layer *layer, int slot, const dsc_tensor *in, dsc_tensor *out,
                             dsc_micro_ctx *ctx) {
    DSC_TRY(check_slot(layer, slot, "forward"));
    nn_profile_mark mark = nn_profile_enter(layer);
    dsc_status s = layer->ops->forward(layer, slot, in, out, ctx);
    nn_profile_leave(mark, false);
    if (s) return dsc_error_wrap(s, "layer %s (%s) forward slot %d", layer->name, layer->ops->type, slot);
    return NULL;
}

dsc_status dsc_layer_backward(dsc_layer *layer, int slot, const dsc_tensor *dout, dsc_tensor *din,
                              dsc_micro_ctx *ctx) {
    DSC_TRY(check_slot(layer, slot, "backward"));
    nn_profile_mark mark = nn_profile_enter(layer);
    dsc_status s = layer->ops->backward(layer, slot, dout, din, ctx);
    nn_profile_leave(mark, true);
    if (s) return dsc_error_wrap(s, "layer %s (%s) backward slot %d", layer->name, layer->ops->type, slot);
    return NULL;
}

void dsc_layer_destroy(dsc_layer *layer) {
    if (!layer) return;
    free(layer->params);
    free(layer->param_uses);
    layer->params = NULL;
    layer->param_uses = NULL;
    layer->n_params = 0;
    layer->ops->destroy(layer);
}

dsc_status dsc_layer_set_params(dsc_layer *layer, dsc_param *const *params, const uint32_t *uses, int n) {
    dsc_param **copy = NULL;
    uint32_t *uses_copy = NULL;
    if (n > 0) {
        copy = malloc((size_t)n * sizeof *copy);
        uses_copy = calloc((size_t)n, sizeof *uses_copy);
        if (!copy || !uses_copy) {
            free(copy);
            free(uses_copy);
            return dsc_error(DSC_ERR_NOMEM, "layer %s: parameter list of %d entries", layer->name, n);
        }
        memcpy(copy, params, (size_t)n * sizeof *copy);
        if (uses) memcpy(uses_copy, uses, (size_t)n * sizeof *uses_copy);
    }
    free(layer->params);
    free(layer->param_uses);
    layer->params = copy;
    layer->param_uses = uses_copy;
    layer->n_params = n;
    return NULL;
}

int64_t dsc_layer_param_numel(const dsc_layer *layer) {
    int64_t n = 0;
    for (int i = 0; i < layer->n_params; i++)
        n += dsc_param_numel(layer->params[i]);
    return n;
}

/* ---- registry ------------------------------------------------------------------------ */

#define MAX_LAYER_TYPES 32

static struct {
    char type[DSC_LAYER_TYPE_MAX];
    dsc_layer_factory factory;
} registry[MAX_LAYER_TYPES];
static int registry_count;

static int registry_find(const char *type) {
    for (int i = 0; i < registry_count; i++)
        if (strcmp(registry[i].type, type) == 0) return i;
    return -1;
}

dsc_status dsc_layer_register(const char *type, dsc_layer_factory factory) {
    DSC_CHECK(type && factory, DSC_ERR_INVALID, "layer registration needs a type name and a factory");
    DSC_CHECK(type[0] && strlen(type) < DSC_LAYER_TYPE_MAX, DSC_ERR_INVALID,
              "layer type name \"%s\" is empty or longer than %d characters", type, DSC_LAYER_TYPE_MAX - 1);
    int i = registry_find(type);
    if (i >= 0) {
        DSC_CHECK(registry[i].factory == factory, DSC_ERR_INVALID,
                  "layer type \"%s\" is already registered with another factory", type);
        return NULL;
    }
    DSC_CHECK(registry_count < MAX_LAYER_TYPES, DSC_ERR_INVALID, "layer registry full (%d types) adding \"%s\"",
              MAX_LAYER_TYPES, type);
    strcpy(registry[registry_count].type, type);
    registry[registry_count].factory = factory;
    registry_count++;
    return NULL;
}

dsc_status dsc_layer_build(const dsc_layer_spec *spec, const dsc_build_ctx *ctx, dsc_layer **out) {
    *out = NULL;
    int i = -1;
    if (ctx->tp) {
        char variant[DSC_LAYER_TYPE_MAX + 4];
        snprintf(variant, sizeof variant, "tp_%s", spec->type);
        i = registry_find(variant);
    }
    if (i < 0) i = registry_find(spec->type);
    if (i < 0) {
        char known[MAX_LAYER_TYPES * (DSC_LAYER_TYPE_MAX + 2)] = "";
        for (int j = 0; j < registry_count; j++) {
            if (j) strcat(known, ", ");
            strcat(known, registry[j].type);
        }
        return dsc_error(DSC_ERR_INVALID, "unknown layer type \"%s\" (registered: %s)", spec->type,
                         registry_count ? known : "none; call dsc_nn_register_dense_layers");
    }
    dsc_status s = registry[i].factory(spec, ctx, out);
    if (s) return dsc_error_wrap(s, "building layer \"%s\" (block %d)", spec->type, spec->block);
    return NULL;
}
