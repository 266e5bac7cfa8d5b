/* Helpers for the ZeRO tests: a toy model (parameter store plus layers that
 * only list their parameters) whose "backward" writes synthetic gradients
 * that depend on the values, the rank and the micro-batch, and a driver that
 * calls the optimizer hooks in the order a runner would (or in a pipeline's
 * interleaved order). */
#ifndef DSC_ZERO_TEST_UTIL_H
#define DSC_ZERO_TEST_UTIL_H

#include <stdbool.h>

#include "dsc/zero.h"

#define TOY_MAX_LAYERS 8
#define TOY_MAX_PARAMS 16

typedef struct toy_model {
    dsc_param_store *store;
    dsc_layer layers[TOY_MAX_LAYERS];
    dsc_layer *layer_ptrs[TOY_MAX_LAYERS];
    int n_layers;
    int rank;       /* the data-parallel rank: gradients differ per rank */
    int layer_base; /* global index of layers[0]: gradients depend on it */
} toy_model;

typedef struct toy_spec {
    int n_params;
    int64_t sizes[TOY_MAX_PARAMS];
    uint32_t flags[TOY_MAX_PARAMS];
    int n_layers;
    int layer_params[TOY_MAX_LAYERS][TOY_MAX_PARAMS]; /* parameter indices, -1 ends the list */
    const char *prefix;                               /* parameter name prefix */
    const char *expert_prefix;                        /* name prefix of DSC_PARAM_EXPERT parameters */
    bool absent[TOY_MAX_PARAMS];                      /* not declared here (another pipeline stage holds it) */
    int layer_base;                                   /* global index of the first layer (pipeline stages) */
} toy_spec;

/* The standard toy: 9 parameters of awkward sizes over 5 layers, the first
 * parameter shared by the first and last layer (a tied embedding). */
void toy_spec_default(toy_spec *spec);
/* Builds the store (seeded identically on every rank) and the layers. */
void toy_model_init(toy_model *m, const toy_spec *spec, int rank);
void toy_model_free(toy_model *m);

typedef struct toy_run {
    int steps;
    int micro_batches;
    bool interleave; /* hooks in 1F1B order over the micro-batches instead of one after another */
    double lr;
    /* Called after the batch's hooks, before reduce_grads (a pipeline's ReduceTiedGrads); may be NULL. */
    void (*before_reduce)(toy_model *m, void *ctx);
    void *ctx;
} toy_run;

/* Runs `run.steps` steps: hooks, synthetic gradients, reduce_grads, step;
 * *clipped (may be NULL) tells whether some step clipped the gradients. */
void toy_train(toy_model *m, dsc_optimizer *opt, const toy_run *run, bool *clipped);
/* Copies every parameter's value into out (parameters back to back),
 * gathering through the hooks (stage 3). Collective. */
void toy_read_params(toy_model *m, dsc_optimizer *opt, float *out);
/* The same for any store and layers. */
void zero_test_read_params(dsc_param_store *store, dsc_layer *const *layers, int n_layers, dsc_optimizer *opt,
                           float *out);
int64_t toy_param_total(toy_model *m);

/* Optimizer options for the toy with clipping on and AdamW. */
dsc_optimizer_options toy_options(toy_model *m, dsc_comm *dp);

#endif
