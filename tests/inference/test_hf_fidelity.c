/* Fidelity of the inference engine against Hugging Face transformers: tiny
 * random-weight Llama (Llama-3 RoPE scaling), Mistral, Qwen2 (q/k/v biases,
 * tied embeddings), Mixtral (top-2 MoE) and Phi-3 (fused qkv_proj and
 * gate_up_proj) checkpoints made by tests/ref/make_hf_fixtures.py
 * (transformers 4.x; the Llama and Mistral ones also saved by 5.x, which
 * writes rope_parameters), GPT-NeoX, GPT-2 and OPT ones saved by both
 * (fixtures/hf/make_family_fixtures.py) and Qwen2-MoE ones by both
 * (fixtures/hf/make_qwen2_moe_fixtures.py) are loaded with dsc's loader; for every
 * prompt the logits of a whole-prompt forward, of the prompt fed one token
 * at a time through the KV cache, and of 6 greedy decode steps must match
 * PyTorch's within 1e-4 relative, and the greedy tokens must be the same. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/inference.h"
#include "dsc/safetensors.h"
#include "test_mpi.h"

#define FIXTURES DSC_SOURCE_DIR "/tests/inference/fixtures/hf/"
enum { N_PROMPTS = 3 };
static const double TOL = 1e-4;

static float *read_ref(const dsc_safetensors *st, const char *name, int64_t *numel) {
    dsc_safetensors_tensor t;
    assert_true(dsc_safetensors_find(st, name, &t));
    float *buf = malloc((size_t)t.numel * sizeof *buf);
    assert_ok(dsc_safetensors_read_f32(st, name, buf, t.numel));
    *numel = t.numel;
    return buf;
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static void check_model(const char *name) {
    char dir[512], ref[600];
    snprintf(dir, sizeof dir, FIXTURES "%s", name);
    snprintf(ref, sizeof ref, "%s/ref.safetensors", dir);
    printf("%s\n", name);
    dsc_infer_model *m;
    assert_ok(dsc_infer_model_load(dir, &m));
    dsc_infer_engine_config ec = dsc_infer_engine_config_default(m);
    ec.block_size = 4;
    ec.kv_cache_bytes = 1 << 20;
    dsc_infer_engine *e;
    assert_ok(dsc_infer_engine_create(m, &ec, &e));
    dsc_safetensors *st;
    assert_ok(dsc_safetensors_open(&st, ref));
    int32_t V = dsc_infer_model_get_config(m)->vocab_size;
    float *row = malloc((size_t)V * sizeof *row);
    for (int p = 0; p < N_PROMPTS; p++) {
        char key[64], what[96];
        int64_t T, n_logits, S, n_gen_logits;
        snprintf(key, sizeof key, "tokens_%d", p);
        float *tokf = read_ref(st, key, &T);
        int32_t *tokens = malloc((size_t)(T + 8) * sizeof *tokens);
        for (int64_t t = 0; t < T; t++)
            tokens[t] = (int32_t)tokf[t];
        snprintf(key, sizeof key, "logits_%d", p);
        float *logits = read_ref(st, key, &n_logits);
        snprintf(key, sizeof key, "gen_%d", p);
        float *genf = read_ref(st, key, &S);
        snprintf(key, sizeof key, "gen_logits_%d", p);
        float *gen_logits = read_ref(st, key, &n_gen_logits);

        /* The whole prompt in one forward, then greedy decode step by step. */
        uint64_t uid = 100 + (uint64_t)p;
        const int32_t *ptr = tokens;
        int32_t count = (int32_t)T;
        assert_ok(dsc_infer_engine_put(e, 1, &uid, &ptr, &count, row));
        snprintf(what, sizeof what, "%s prompt %d full forward", name, p);
        assert_true(dsc_test_max_rel_err(row, logits + (T - 1) * V, V, 1e-6, what) <= TOL);
        double worst = 0;
        for (int64_t s = 0; s < S; s++) {
            if (s > 0) {
                int32_t next = (int32_t)genf[s - 1];
                const int32_t *np = &next;
                int32_t one = 1;
                assert_ok(dsc_infer_engine_put(e, 1, &uid, &np, &one, row));
            }
            double r = dsc_test_rel_err(row, gen_logits + s * V, V);
            if (r > worst) worst = r;
            assert_int_equal(argmax(row, V), (int32_t)genf[s]);
        }
        printf("  %s prompt %d: %lld greedy tokens equal, worst decode rel err %.3e\n", name, p, (long long)S,
               worst);
        assert_true(worst <= TOL);
        assert_ok(dsc_infer_engine_flush(e, uid));

        /* The prompt one token at a time: every position's logits. */
        worst = 0;
        for (int64_t t = 0; t < T; t++) {
            const int32_t *tp = tokens + t;
            int32_t one = 1;
            assert_ok(dsc_infer_engine_put(e, 1, &uid, &tp, &one, row));
            double r = dsc_test_rel_err(row, logits + t * V, V);
            if (r > worst) worst = r;
        }
        printf("  %s prompt %d: token-by-token worst rel err %.3e\n", name, p, worst);
        assert_true(worst <= TOL);
        assert_ok(dsc_infer_engine_flush(e, uid));
        assert_int_equal(dsc_infer_engine_free_blocks(e), dsc_infer_engine_total_blocks(e));
        free(tokf);
        free(tokens);
        free(logits);
        free(genf);
        free(gen_logits);
    }
    free(row);
    dsc_safetensors_close(st);
    dsc_infer_engine_destroy(e);
    dsc_infer_model_destroy(m);
}

/* The fixture named by the test's state. Saved by transformers 4.x
 * (tests/ref/make_hf_fixtures.py, fixtures/hf/make_family_fixtures.py) and
 * 5.x (the *_tf5 ones: rope_parameters instead of rope_theta / rope_scaling
 * / rotary_pct): Llama-3 scaling and a non-default theta; GPT-NeoX
 * (interleaved query_key_value, partial rotary, parallel and sequential
 * residuals), GPT-2 (Conv1D weights stored (in, out), tied head) and OPT
 * (ReLU, positions + 2; post-LN with project_in / project_out, and pre-LN);
 * Qwen2-MoE (shared expert with its sigmoid gate, narrower routed experts,
 * dense and sparse layers; raw top-k weights in 4.x, renormalised in 5.x). */
static void test_model(void **state) {
    check_model(*state);
}
#define MODEL(name) cmocka_unit_test_prestate_setup_teardown(test_model, NULL, NULL, (void *)(name))

int main(void) {
    const struct CMUnitTest tests[] = {
        MODEL("llama"),     MODEL("mistral"),     MODEL("qwen2"),    MODEL("mixtral"),      MODEL("phi3"),
        MODEL("llama_tf5"), MODEL("mistral_tf5"), MODEL("gpt_neox"), MODEL("gpt_neox_tf5"), MODEL("gpt2"),
        MODEL("gpt2_tf5"),  MODEL("opt"),         MODEL("opt_tf5"),  MODEL("qwen2_moe"),    MODEL("qwen2_moe_tf5"),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
