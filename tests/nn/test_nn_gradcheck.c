/* Every dense layer's backward against central finite differences, through
 * the layer API: embedding (GPT with positions, Llama without), block (GPT;
 * Llama with RoPE, GQA and SwiGLU; Llama with QKV bias and checkpointing) and
 * LM head (LayerNorm untied, RMSNorm tied).
 *
 * Objective: J = sum(out * G) for a fixed random G (the head: its mean loss),
 * accumulated in double. Each parameter and input element is perturbed by +-h;
 * kernels are f32, so h = 1e-2 and the tolerance (1e-2 of the largest
 * gradient of the tensor) cover f32 rounding of J. A tensor whose gradient is
 * much smaller than the layer's (the key bias, exactly 0 by softmax's shift
 * invariance) is measured against 1% of the layer's largest gradient. The micro-batch (2, 5) is
 * smaller than the reserved (3, 6), so views into slot buffers are exercised. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/model.h"
#include "nn_test_util.h"
#include "test_mpi.h"

#define RB 3
#define RT 6
#define NB 2
#define NT 5
#define H 1e-2
#define TOL 1e-2

typedef struct gc_layer {
    dsc_model_config mc;
    dsc_param_store *store;
    dsc_layer *layer;
    dsc_tensor x;       /* (NB, NT, C) input (blocks, head) */
    dsc_tensor g;       /* (NB, NT, C) upstream gradient (embedding, blocks) */
    dsc_tensor tokens;  /* (NB, NT) i32 */
    dsc_tensor targets; /* (NB, NT) i32, one ignored */
    bool is_head, is_embedding;
} gc_layer;

static void fill_normal(float *p, int64_t n, dsc_rng *rng, float mean, float std) {
    for (int64_t i = 0; i < n; i++)
        p[i] = mean + std * (float)dsc_rng_normal(rng);
}

static void setup(gc_layer *L, const dsc_model_config *mc, const char *type, int block) {
    memset(L, 0, sizeof *L);
    L->mc = *mc;
    assert_ok(dsc_nn_register_dense_layers());
    assert_ok(dsc_params_create(&L->store, DSC_CPU, 5));
    dsc_build_ctx ctx = {.model = &L->mc, .params = L->store, .device = DSC_CPU};
    dsc_layer_spec spec = {.block = block};
    strcpy(spec.type, type);
    assert_ok(dsc_layer_build(&spec, &ctx, &L->layer));
    assert_ok(dsc_params_finalize(L->store));
    assert_ok(dsc_layer_reserve(L->layer, 1, RB, RT));
    L->is_head = strcmp(type, "lm_head") == 0;
    L->is_embedding = strcmp(type, "embedding") == 0;
    dsc_rng rng;
    dsc_rng_init(&rng, 11, 0, DSC_RNG_DATA);
    /* Non-trivial parameters everywhere: norm weights around 1, everything else O(0.3). */
    for (int i = 0; i < dsc_params_count(L->store); i++) {
        dsc_param *p = dsc_params_at(L->store, i);
        const bool norm_weight = strstr(p->name, "norm") && strstr(p->name, "weight");
        fill_normal(p->value.data, dsc_param_numel(p), &rng, norm_weight ? 1.0f : 0.0f, 0.3f);
    }
    const int64_t C = mc->d_model, xs[3] = {NB, NT, C}, ts[2] = {NB, NT};
    assert_ok(dsc_tensor_alloc(&L->x, DSC_DTYPE_F32, 3, xs, DSC_CPU, DSC_MEM_OTHER));
    assert_ok(dsc_tensor_alloc(&L->g, DSC_DTYPE_F32, 3, xs, DSC_CPU, DSC_MEM_OTHER));
    assert_ok(dsc_tensor_alloc(&L->tokens, DSC_DTYPE_I32, 2, ts, DSC_CPU, DSC_MEM_OTHER));
    assert_ok(dsc_tensor_alloc(&L->targets, DSC_DTYPE_I32, 2, ts, DSC_CPU, DSC_MEM_OTHER));
    fill_normal(L->x.data, NB * NT * C, &rng, 0.0f, 1.0f);
    fill_normal(L->g.data, NB * NT * C, &rng, 0.0f, 1.0f);
    for (int i = 0; i < NB * NT; i++) {
        ((int32_t *)L->tokens.data)[i] = (int32_t)dsc_rng_below(&rng, (uint64_t)mc->vocab_size);
        ((int32_t *)L->targets.data)[i] = (int32_t)dsc_rng_below(&rng, (uint64_t)mc->vocab_size);
    }
    ((int32_t *)L->targets.data)[3] = -1;
}

static void teardown(gc_layer *L) {
    dsc_layer_destroy(L->layer);
    dsc_params_destroy(L->store);
    dsc_tensor_free(&L->x);
    dsc_tensor_free(&L->g);
    dsc_tensor_free(&L->tokens);
    dsc_tensor_free(&L->targets);
}

static double objective(gc_layer *L) {
    dsc_micro_ctx ctx = {.tokens = &L->tokens, .targets = &L->targets, .loss_scale = 1.0f, .training = true};
    dsc_tensor out;
    assert_ok(dsc_layer_forward(L->layer, 0, &L->x, &out, &ctx));
    if (L->is_head) return ctx.loss;
    double j = 0;
    const float *o = out.data, *g = L->g.data;
    for (int64_t i = 0; i < dsc_tensor_numel(&L->g); i++)
        j += (double)o[i] * g[i];
    return j;
}

/* Central differences of J over the n floats at p, compared with `analytic`. */
static double check(gc_layer *L, float *p, const float *analytic, int64_t n, double floor, const char *what) {
    float *numeric = malloc((size_t)n * sizeof *numeric);
    for (int64_t i = 0; i < n; i++) {
        const float keep = p[i];
        p[i] = keep + (float)H;
        const double plus = objective(L);
        p[i] = keep - (float)H;
        const double minus = objective(L);
        p[i] = keep;
        numeric[i] = (float)((plus - minus) / (2 * H));
    }
    double rel = dsc_test_max_rel_err(analytic, numeric, n, floor, what);
    free(numeric);
    return rel;
}

static void gradcheck(const dsc_model_config *mc, const char *type, int block) {
    gc_layer L;
    setup(&L, mc, type, block);
    printf("%s %s (%s%s)\n", dsc_model_arch_name(mc->arch), L.layer->name, type,
           mc->activation_checkpointing ? ", checkpointed" : "");
    assert_ok(dsc_params_zero_grads(L.store));
    objective(&L);
    dsc_micro_ctx ctx = {.loss_scale = 1.0f, .training = true};
    dsc_tensor din;
    assert_ok(dsc_layer_backward(L.layer, 0, &L.g, &din, &ctx));
    double worst = 0, scale = 0;
    for (int64_t i = 0; !L.is_embedding && i < dsc_tensor_numel(&din); i++)
        scale = fmax(scale, fabs(((float *)din.data)[i]));
    for (int i = 0; i < L.layer->n_params; i++)
        for (int64_t j = 0; j < dsc_param_numel(L.layer->params[i]); j++)
            scale = fmax(scale, fabs(((float *)L.layer->params[i]->grad.data)[j]));
    const double floor = 1e-2 * scale;
    if (L.is_embedding) {
        assert_int_equal(din.ndim, 0); /* the first layer has no input gradient */
    } else {
        assert_int_equal(din.shape[0], NB);
        assert_int_equal(din.shape[1], NT);
        float *analytic = malloc(dsc_tensor_nbytes(&L.x));
        memcpy(analytic, din.data, dsc_tensor_nbytes(&L.x));
        worst = check(&L, L.x.data, analytic, dsc_tensor_numel(&L.x), floor, "input");
        free(analytic);
    }
    for (int i = 0; i < L.layer->n_params; i++) {
        dsc_param *p = L.layer->params[i];
        worst = fmax(worst, check(&L, p->value.data, p->grad.data, dsc_param_numel(p), floor, p->name));
    }
    printf("worst relative error %.3e (tolerance %.0e)\n", worst, TOL);
    assert_true(worst <= TOL);
    teardown(&L);
}

static void test_embedding(void **state) {
    (void)state;
    dsc_model_config mc;
    test_tiny_config(&mc, DSC_ARCH_GPT);
    gradcheck(&mc, "embedding", -1);
    test_tiny_config(&mc, DSC_ARCH_LLAMA);
    gradcheck(&mc, "embedding", -1);
}

static void test_block_gpt(void **state) {
    (void)state;
    dsc_model_config mc;
    test_tiny_config(&mc, DSC_ARCH_GPT);
    gradcheck(&mc, "block", 1);
}

static void test_block_llama(void **state) {
    (void)state;
    dsc_model_config mc;
    test_tiny_config(&mc, DSC_ARCH_LLAMA);
    gradcheck(&mc, "block", 0);
    mc.qkv_bias = true;
    mc.activation_checkpointing = true;
    gradcheck(&mc, "block", 1);
}

static void test_head(void **state) {
    (void)state;
    dsc_model_config mc;
    test_tiny_config(&mc, DSC_ARCH_GPT);
    mc.tie_embeddings = false;
    gradcheck(&mc, "lm_head", -1);
    test_tiny_config(&mc, DSC_ARCH_LLAMA);
    mc.tie_embeddings = true;
    gradcheck(&mc, "lm_head", -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_block_gpt),
        cmocka_unit_test(test_block_llama),
        cmocka_unit_test(test_head),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
