/* Helpers for the nn tests: a whole model run layer by layer on one process
 * (embedding, blocks, head, as a single pipeline stage would), and the
 * loader of the PyTorch fixtures written by tests/ref/make_model_fixtures.py. */
#ifndef DSC_TESTS_NN_TEST_UTIL_H
#define DSC_TESTS_NN_TEST_UTIL_H

#include "dsc/model.h"
#include "dsc/nn.h"

typedef struct test_model {
    dsc_model_config mc;
    dsc_param_store *store;
    dsc_layer **layers; /* [n] in spec order: embed, blocks, head */
    int n;
} test_model;

/* Builds every layer of `mc` from its specs on `device`, finalises the store
 * (seeded with `seed`) and reserves `slots` slots of (B, T). */
dsc_status test_model_build(test_model *m, const dsc_model_config *mc, dsc_device device, uint64_t seed, int slots,
                            int64_t B, int64_t T);
void test_model_free(test_model *m);
/* Forward of one micro-batch through all layers; *loss from the head. */
dsc_status test_model_forward(test_model *m, int slot, const dsc_tensor *tokens, const dsc_tensor *targets,
                              double *loss);
/* Backward of one micro-batch through all layers, head first. */
dsc_status test_model_backward(test_model *m, int slot, float loss_scale);

/* Tiny configs used across the tests. */
void test_tiny_config(dsc_model_config *mc, dsc_model_arch arch);

/* ---- fixtures ------------------------------------------------------------------------ */

typedef struct fixture_array {
    char name[160];
    bool is_int;
    int ndim;
    int64_t shape[4];
    int64_t numel;
    void *data; /* float or int32_t */
} fixture_array;

typedef struct fixture {
    char keys[64][32];
    char values[64][32];
    int n_meta;
    fixture_array *arrays;
    int n_arrays;
    void *blob;
} fixture;

/* Loads tests/nn/fixtures/<name>.idx and .bin; aborts the test on failure. */
void fixture_load(fixture *f, const char *name);
void fixture_free(fixture *f);
const fixture_array *fixture_get(const fixture *f, const char *name); /* NULL when absent */
double fixture_meta(const fixture *f, const char *key);               /* fails the test when absent */
const char *fixture_meta_str(const fixture *f, const char *key);
/* The model configuration of a fixture's meta lines (arch, sizes, ties, biases, rope, eps). */
void fixture_model_config(const fixture *f, dsc_model_config *mc);

#endif
