/* The load-time weight types (dsc_infer_model_set_weight_type): a random
 * Llama (C 64, F 96, 4 heads, 2 KV heads, V 256, untied head) with bf16, f16
 * and Q8_0 projection weights gives the logits of the same model in f32
 * within each type's documented tolerance (docs/performance.md), for a
 * 40-token prompt (more rows than decode's streaming loops take: panels
 * widened into the workspace and GEMM, or with bf16 on AVX-512 BF16 and Q8_0
 * on AVX-512 VNNI x rounded or quantised and their dots) and 8 decode tokens after it (the weight streamed
 * once per token, widened in registers); the arena shrinks accordingly; widths that Q8_0
 * cannot block (the fixture's F 48) and a second conversion are refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/inference.h"
#include "dsc/rng.h"
#include "test_mpi.h"

#define LLAMA DSC_SOURCE_DIR "/tests/inference/fixtures/hf/llama"
enum { C = 64, F = 96, L = 2, V = 256, KVW = 32, PROMPT = 40, STEPS = 8, MAX_TENSORS = 3 + 9 * L };

static const char *const config_json =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 256, \"hidden_size\": 64,"
    " \"intermediate_size\": 96, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"max_position_embeddings\": 64, \"rms_norm_eps\": 1e-5,"
    " \"tie_word_embeddings\": false}";

typedef struct source {
    char names[MAX_TENSORS][64];
    int64_t rows[MAX_TENSORS], cols[MAX_TENSORS]; /* cols 0: a vector */
    int64_t count;
} source;

static void add(source *s, const char *name, int64_t rows, int64_t cols) {
    snprintf(s->names[s->count], sizeof s->names[0], "%s", name);
    s->rows[s->count] = rows;
    s->cols[s->count++] = cols;
}

static void describe(void *impl, int64_t i, const char **name, int *ndim, int64_t *shape) {
    source *s = impl;
    *name = s->names[i];
    *ndim = s->cols[i] ? 2 : 1;
    shape[0] = s->rows[i];
    shape[1] = s->cols[i];
}

/* Norm weights near 1, matrices normal(0, 0.1): logits of order one. */
static dsc_status read_f32(void *impl, int64_t i, float *dst, int64_t numel) {
    source *s = impl;
    dsc_rng rng;
    dsc_rng_init(&rng, 77 + (uint64_t)i, 0, DSC_RNG_INIT);
    for (int64_t k = 0; k < numel; k++)
        dst[k] = s->cols[i] ? (float)(0.1 * dsc_rng_normal(&rng)) : (float)(1.0 + 0.1 * dsc_rng_normal(&rng));
    return NULL;
}

static dsc_infer_model *random_model(void) {
    const dsc_policy *p;
    assert_ok(dsc_policy_register_builtin());
    assert_ok(dsc_policy_find("LlamaForCausalLM", &p));
    dsc_infer_model_config mc;
    assert_ok(p->configure(&mc, config_json, "test config"));
    source s = {0};
    add(&s, "model.embed_tokens.weight", V, C);
    add(&s, "model.norm.weight", C, 0);
    add(&s, "lm_head.weight", V, C);
    const struct {
        const char *name;
        int64_t rows, cols;
    } per_layer[] = {{"input_layernorm.weight", C, 0},    {"post_attention_layernorm.weight", C, 0},
                     {"self_attn.q_proj.weight", C, C},   {"self_attn.k_proj.weight", KVW, C},
                     {"self_attn.v_proj.weight", KVW, C}, {"self_attn.o_proj.weight", C, C},
                     {"mlp.gate_proj.weight", F, C},      {"mlp.up_proj.weight", F, C},
                     {"mlp.down_proj.weight", C, F}};
    char name[64];
    for (int l = 0; l < L; l++)
        for (size_t j = 0; j < sizeof per_layer / sizeof per_layer[0]; j++) {
            snprintf(name, sizeof name, "model.layers.%d.%s", l, per_layer[j].name);
            add(&s, name, per_layer[j].rows, per_layer[j].cols);
        }
    dsc_tensor_source src = {&s, s.count, describe, read_f32, NULL};
    dsc_infer_model *m;
    assert_ok(dsc_infer_model_build(p, &mc, &src, &m));
    return m;
}

/* Logits (1 + STEPS, V): after the prompt, then after each of STEPS fixed tokens. */
static float *run(dsc_infer_model *m) {
    dsc_infer_engine_config ec = dsc_infer_engine_config_default(m);
    ec.kv_cache_bytes = 1 << 20;
    dsc_infer_engine *e;
    assert_ok(dsc_infer_engine_create(m, &ec, &e));
    float *out = malloc((size_t)(1 + STEPS) * V * sizeof *out);
    int32_t tokens[PROMPT + STEPS], n = PROMPT, one = 1;
    for (int i = 0; i < PROMPT + STEPS; i++)
        tokens[i] = (i * 37 + 5) % V;
    uint64_t uid = 1;
    const int32_t *p = tokens;
    assert_ok(dsc_infer_engine_put(e, 1, &uid, &p, &n, out));
    for (int s = 0; s < STEPS; s++) {
        p = tokens + PROMPT + s;
        assert_ok(dsc_infer_engine_put(e, 1, &uid, &p, &one, out + (size_t)(1 + s) * V));
    }
    dsc_infer_engine_destroy(e);
    return out;
}

static void test_logits_within_tolerance(void **state) {
    (void)state;
    /* The tolerances of docs/performance.md: max |logit - f32 logit| / max |f32 logit|. */
    const struct {
        dsc_weight_format f;
        double tol;
    } types[] = {{DSC_WEIGHT_BF16, 2e-2}, {DSC_WEIGHT_F16, 2e-3}, {DSC_WEIGHT_Q8_0, 7e-2}};
    dsc_infer_model *m = random_model();
    size_t f32_bytes = dsc_infer_model_arena_bytes(m);
    float *want = run(m);
    dsc_infer_model_destroy(m);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        m = random_model();
        assert_ok(dsc_infer_model_set_weight_type(m, types[t].f));
        assert_int_equal(dsc_infer_model_weight_type(m), types[t].f);
        float *got = run(m);
        char what[64];
        snprintf(what, sizeof what, "%s logits vs f32 (prompt)", dsc_weight_format_name(types[t].f));
        double prompt = dsc_test_max_rel_err(got, want, V, 1e-3, what);
        snprintf(what, sizeof what, "%s logits vs f32 (decode)", dsc_weight_format_name(types[t].f));
        double decode = dsc_test_max_rel_err(got + V, want + V, (int64_t)STEPS * V, 1e-3, what);
        printf("  %s: arena %zu bytes (f32 %zu)\n", dsc_weight_format_name(types[t].f),
               dsc_infer_model_arena_bytes(m), f32_bytes);
        assert_true(prompt <= types[t].tol && decode <= types[t].tol);
        assert_true(prompt > 0 && decode > 0); /* the weights really changed */
        /* The projections shrink to a half (bf16, f16) or 34/128 (Q8_0); the f32 embedding stays. */
        assert_true(dsc_infer_model_arena_bytes(m) < f32_bytes * (types[t].f == DSC_WEIGHT_Q8_0 ? 2 : 3) / 5);
        free(got);
        dsc_infer_model_destroy(m);
    }
    free(want);
}

static void test_refusals(void **state) {
    (void)state;
    dsc_infer_model *m;
    assert_ok(dsc_infer_model_load(LLAMA, &m));
    assert_err(dsc_infer_model_set_weight_type(m, DSC_WEIGHT_Q8_0), DSC_ERR_UNSUPPORTED, "multiple of 32");
    assert_ok(dsc_infer_model_set_weight_type(m, DSC_WEIGHT_BF16));
    assert_err(dsc_infer_model_set_weight_type(m, DSC_WEIGHT_F16), DSC_ERR_INVALID, "already bf16");
    assert_err(dsc_infer_model_set_weight_type(m, (dsc_weight_format)9), DSC_ERR_INVALID, "weight type 9");
    dsc_weight_format f;
    assert_err(dsc_weight_format_from_name("int4", &f), DSC_ERR_INVALID, "q8_0");
    dsc_infer_model_destroy(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_logits_within_tolerance),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
