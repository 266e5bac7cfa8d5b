/* Parameter store (declaration, ties, flat layout, layout-independent
 * initialisation), model configs and spec lists, and the layer registry. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/kernels.h"
#include "dsc/model.h"
#include "dsc/rng.h"
#include "nn_test_util.h"
#include "test_mpi.h"

static void test_declare_find_and_flat_layout(void **state) {
    (void)state;
    dsc_param_store *s;
    assert_ok(dsc_params_create(&s, DSC_CPU, 7));
    dsc_param *w, *b, *e, *again;
    assert_ok(dsc_params_declare(s, "a.weight", 2, (int64_t[]){3, 5}, 0, DSC_INIT_NORMAL, 1.0f, &w));
    assert_ok(dsc_params_declare(s, "a.bias", 1, (int64_t[]){3}, DSC_PARAM_NO_DECAY, DSC_INIT_ONES, 0, &b));
    assert_ok(dsc_params_declare(s, "x.expert", 1, (int64_t[]){70}, DSC_PARAM_EXPERT, DSC_INIT_ZEROS, 0, &e));
    /* Declaring a name again returns the same parameter (ties), merging flags. */
    assert_ok(
        dsc_params_declare(s, "a.weight", 2, (int64_t[]){3, 5}, DSC_PARAM_TIED, DSC_INIT_NORMAL, 1.0f, &again));
    assert_ptr_equal(again, w);
    assert_true(w->flags & DSC_PARAM_TIED);
    assert_err(dsc_params_declare(s, "a.weight", 2, (int64_t[]){5, 3}, 0, DSC_INIT_NORMAL, 1.0f, &again),
               DSC_ERR_INVALID, "parameter a.weight declared with shape (5, 3)");
    assert_err(dsc_params_declare(s, "a.bias", 1, (int64_t[]){3}, DSC_PARAM_EXPERT, DSC_INIT_ZEROS, 0, &again),
               DSC_ERR_INVALID, "a.bias declared both as an expert and as a dense");
    assert_err(dsc_params_declare(s, "bad", 1, (int64_t[]){0}, 0, DSC_INIT_ZEROS, 0, &again), DSC_ERR_INVALID,
               "parameter bad: dimension 0 is 0");
    assert_ok(dsc_params_finalize(s));
    assert_err(dsc_params_finalize(s), DSC_ERR_INVALID, "finalized twice");
    assert_err(dsc_params_declare(s, "late", 1, (int64_t[]){2}, 0, DSC_INIT_ZEROS, 0, &again), DSC_ERR_INVALID,
               "late declared after dsc_params_finalize");

    assert_int_equal(dsc_params_count(s), 3);
    assert_ptr_equal(dsc_params_at(s, 1), b);
    assert_ptr_equal(dsc_params_find(s, "x.expert"), e);
    assert_null(dsc_params_find(s, "nope"));
    /* Offsets are 64-element aligned; groups are separate buffers. */
    assert_int_equal(w->offset, 0);
    assert_int_equal(b->offset, 64);
    assert_int_equal(e->offset, 0);
    assert_int_equal(e->group, DSC_PARAM_GROUP_EXPERT);
    assert_int_equal(dsc_params_numel(s, DSC_PARAM_GROUP_DENSE), 128);
    assert_int_equal(dsc_params_numel(s, DSC_PARAM_GROUP_EXPERT), 128);
    assert_int_equal(dsc_param_numel(w), 15);
    dsc_tensor values, grads;
    dsc_params_flat(s, DSC_PARAM_GROUP_DENSE, &values, &grads);
    assert_ptr_equal((float *)values.data + 64, b->value.data);
    assert_ptr_equal((float *)grads.data + 64, b->grad.data);
    for (int i = 0; i < 3; i++)
        assert_true(((float *)b->value.data)[i] == 1.0f);
    for (int i = 15; i < 64; i++)
        assert_true(((float *)values.data)[i] == 0.0f); /* gaps are zero */
    ((float *)w->grad.data)[2] = 3.0f;
    assert_ok(dsc_params_zero_grads(s));
    assert_true(((float *)w->grad.data)[2] == 0.0f);

    dsc_params_destroy(s);
}

/* A tensor of several initialisation chunks (split over threads) holds the sequential stream's
 * normals: seed ^ FNV-1a(name), purpose DSC_RNG_INIT, value i the i-th draw times init_std. */
static void test_init_chunks_are_the_stream(void **state) {
    (void)state;
    enum { N = 3 * 65536 + 77 };
    dsc_param_store *s;
    dsc_param *w;
    assert_ok(dsc_params_create(&s, DSC_CPU, 11));
    assert_ok(dsc_params_declare(s, "big.weight", 1, (int64_t[]){N}, 0, DSC_INIT_NORMAL, 0.02f, &w));
    assert_ok(dsc_params_finalize(s));
    uint64_t h = 0xcbf29ce484222325ULL;
    for (const char *c = "big.weight"; *c; c++)
        h = (h ^ (unsigned char)*c) * 0x100000001b3ULL;
    dsc_rng rng;
    dsc_rng_init(&rng, 11 ^ h, 0, DSC_RNG_INIT);
    const float *v = w->value.data;
    int bad = 0;
    for (int i = 0; i < N; i++)
        bad += v[i] != (float)(0.02f * dsc_rng_normal(&rng));
    assert_int_equal(bad, 0);
    dsc_params_destroy(s);
}

/* Initial values depend on (seed, name) only: another declaration order, or a
 * store holding a subset (another pipeline stage), gives the same values. */
static void test_init_independent_of_layout(void **state) {
    (void)state;
    dsc_param_store *a, *b, *c;
    assert_ok(dsc_params_create(&a, DSC_CPU, 42));
    assert_ok(dsc_params_create(&b, DSC_CPU, 42));
    assert_ok(dsc_params_create(&c, DSC_CPU, 43));
    dsc_param *p1, *p2, *q1, *q2, *r;
    assert_ok(dsc_params_declare(a, "layers.0.w", 2, (int64_t[]){8, 8}, 0, DSC_INIT_NORMAL, 0.5f, &p1));
    assert_ok(dsc_params_declare(a, "layers.1.w", 2, (int64_t[]){8, 8}, 0, DSC_INIT_NORMAL, 0.5f, &q1));
    assert_ok(dsc_params_declare(b, "layers.1.w", 2, (int64_t[]){8, 8}, 0, DSC_INIT_NORMAL, 0.5f, &q2));
    assert_ok(dsc_params_declare(b, "layers.0.w", 2, (int64_t[]){8, 8}, 0, DSC_INIT_NORMAL, 0.5f, &p2));
    assert_ok(dsc_params_declare(c, "layers.0.w", 2, (int64_t[]){8, 8}, 0, DSC_INIT_NORMAL, 0.5f, &r));
    assert_ok(dsc_params_finalize(a));
    assert_ok(dsc_params_finalize(b));
    assert_ok(dsc_params_finalize(c));
    assert_memory_equal(p1->value.data, p2->value.data, 64 * sizeof(float));
    assert_memory_equal(q1->value.data, q2->value.data, 64 * sizeof(float));
    assert_memory_not_equal(p1->value.data, q1->value.data, 64 * sizeof(float));
    assert_memory_not_equal(p1->value.data, r->value.data, 64 * sizeof(float));
    double sumsq = 0;
    assert_ok(dsc_kernel_sum_squares(&sumsq, &p1->value));
    assert_true(fabs(sqrt(sumsq / 64) - 0.5) < 0.15); /* std 0.5 over 64 draws */
    dsc_params_destroy(a);
    dsc_params_destroy(b);
    dsc_params_destroy(c);
}

static void test_config_validation(void **state) {
    (void)state;
    dsc_model_config mc;
    for (int arch = DSC_ARCH_GPT; arch <= DSC_ARCH_MIXTRAL; arch++) {
        dsc_model_config_defaults(&mc, (dsc_model_arch)arch);
        assert_ok(dsc_model_config_validate(&mc));
        dsc_model_arch back;
        assert_ok(dsc_model_arch_from_name(dsc_model_arch_name((dsc_model_arch)arch), &back));
        assert_int_equal(back, arch);
    }
    dsc_model_arch out;
    assert_err(dsc_model_arch_from_name("bert", &out), DSC_ERR_CONFIG,
               "model.arch: unknown architecture \"bert\"");
    dsc_model_config_defaults(&mc, DSC_ARCH_GPT);
    mc.n_head = 5;
    assert_err(dsc_model_config_validate(&mc), DSC_ERR_CONFIG, "model.n_head (5) must be >= 1 and divide");
    dsc_model_config_defaults(&mc, DSC_ARCH_LLAMA);
    mc.n_kv_head = 4;
    assert_err(dsc_model_config_validate(&mc), DSC_ERR_CONFIG, "model.n_kv_head (4) must be >= 1 and divide");
    dsc_model_config_defaults(&mc, DSC_ARCH_LLAMA);
    mc.d_model = 30;
    mc.n_head = 2;
    mc.n_kv_head = 2;
    assert_err(dsc_model_config_validate(&mc), DSC_ERR_CONFIG, "RoPE needs an even head size");
    dsc_model_config_defaults(&mc, DSC_ARCH_GPT);
    mc.vocab_size = 0;
    assert_err(dsc_model_config_validate(&mc), DSC_ERR_CONFIG, "model.vocab_size must be >= 1");
}

static void test_specs_and_registry(void **state) {
    (void)state;
    dsc_model_config mc;
    dsc_model_config_defaults(&mc, DSC_ARCH_GPT_MOE);
    mc.n_layer = 4;
    dsc_layer_spec *specs;
    int n;
    assert_ok(dsc_model_specs(&mc, &specs, &n));
    const char *want[] = {"embedding", "block", "moe_block", "block", "moe_block", "lm_head"};
    assert_int_equal(n, 6);
    for (int i = 0; i < n; i++) {
        assert_string_equal(specs[i].type, want[i]);
        assert_int_equal(specs[i].block, i >= 1 && i <= 4 ? i - 1 : -1);
    }
    assert_ok(dsc_nn_register_dense_layers());
    assert_ok(dsc_nn_register_dense_layers()); /* idempotent */
    dsc_param_store *store;
    assert_ok(dsc_params_create(&store, DSC_CPU, 1));
    dsc_build_ctx ctx = {.model = &mc, .params = store, .device = DSC_CPU};
    dsc_layer *layer;
    assert_err(dsc_layer_build(&specs[2], &ctx, &layer), DSC_ERR_INVALID, "unknown layer type \"moe_block\"");
    dsc_layer_spec bad = {.type = "block", .block = 9};
    assert_err(dsc_layer_build(&bad, &ctx, &layer), DSC_ERR_INVALID, "block index 9 outside [0, 4)");
    free(specs);

    /* A block declares its parameters under layers.<i>; a Llama block has no biases. */
    test_tiny_config(&mc, DSC_ARCH_LLAMA);
    dsc_layer_spec blk = {.type = "block", .block = 1};
    assert_ok(dsc_layer_build(&blk, &ctx, &layer));
    assert_string_equal(layer->name, "layers.1");
    const char *names[] = {"layers.1.norm1.weight",    "layers.1.attn.q.weight", "layers.1.attn.k.weight",
                           "layers.1.attn.v.weight",   "layers.1.attn.o.weight", "layers.1.norm2.weight",
                           "layers.1.mlp.gate.weight", "layers.1.mlp.up.weight", "layers.1.mlp.down.weight"};
    assert_int_equal(layer->n_params, 9);
    for (int i = 0; i < 9; i++)
        assert_string_equal(layer->params[i]->name, names[i]);
    assert_int_equal(layer->params[2]->value.shape[0], 8); /* NKV * HS = 2 * 4 */
    assert_int_equal(dsc_layer_param_numel(layer), 2 * 16 + 16 * 16 * 2 + 8 * 16 * 2 + 3 * 24 * 16);
    assert_true(layer->params[0]->flags & DSC_PARAM_NO_DECAY);
    assert_false(layer->params[1]->flags & DSC_PARAM_NO_DECAY);
    assert_err(dsc_layer_register("block", (dsc_layer_factory)dsc_layer_build), DSC_ERR_INVALID,
               "layer type \"block\" is already registered with another factory");
    dsc_layer_destroy(layer);
    dsc_params_destroy(store);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_declare_find_and_flat_layout), cmocka_unit_test(test_init_independent_of_layout),
        cmocka_unit_test(test_init_chunks_are_the_stream),   cmocka_unit_test(test_config_validation),
        cmocka_unit_test(test_specs_and_registry),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
