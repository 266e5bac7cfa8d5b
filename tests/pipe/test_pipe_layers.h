/* Test-only layer types for the pipeline tests: "test_linear" (a 1x1 linear
 * without bias, weight "lin.<block>.weight" initialised to 1; the first layer
 * reads the tokens as floats), "test_wide" (the same, but emitting two
 * features per token: a stage whose output shape is wrong) and "test_mse"
 * (mean squared error against the targets, the loss layer). The GAS-scaling
 * regression of DeepSpeed is written with them. */
#ifndef DSC_TEST_PIPE_LAYERS_H
#define DSC_TEST_PIPE_LAYERS_H

#include "dsc/pipe.h"

/* Registers the three types (idempotent). */
void test_pipe_register_layers(void);

/* A batch source whose every micro-batch is tokens = `input`, targets = `target`. */
typedef struct test_const_source {
    dsc_batch_source base;
    int32_t input, target;
} test_const_source;

void test_const_source_init(test_const_source *s, int micro_batches, int32_t input, int32_t target);

/* A pipeline of test layers over `pipe` (comm rank = stage) with the plain
 * SGD optimizer (lr given at step time, no momentum, no clipping). */
typedef struct test_pipe {
    dsc_model_config mc;
    dsc_pipe_module *module;
    dsc_param_store *store;
    dsc_pipe_stage *stage;
    dsc_optimizer *opt;
    dsc_batch_runner *runner;
} test_pipe;

typedef struct test_pipe_spec {
    const char *const *types; /* layer types in order; block index = position */
    int n;
    const char *method;
    int chunks;
    dsc_schedule_kind schedule;
    int micro_batches;
    double timeout_s;
} test_pipe_spec;

/* Returns the first error (module, build, runner); the caller asserts on it. */
dsc_status test_pipe_build(dsc_comm *pipe, const test_pipe_spec *spec, test_pipe *tp);
void test_pipe_free(test_pipe *tp);

#endif
