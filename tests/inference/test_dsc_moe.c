/* dsc's MoE training checkpoints served by the inference engine: tiny
 * gpt-moe (GELU experts with biases, MoE every second block and every
 * block, top-1 and top-2, the PR-MoE residual) and mixtral (SwiGLU experts,
 * GQA, top-2 and top-3 with the residual) models are trained for a few
 * steps on tinyshakespeare through the training stack (moe_block layers,
 * moe.drop_tokens false so that training's eval forward routes every token
 * as inference does), saved with dsc_checkpoint_save and loaded by
 * dsc_infer_model_load (policies "gpt-moe" and "mixtral"). The engine's
 * logits at every prompt position (one token at a time through the KV
 * cache) must equal the training layers' logits of one whole-prompt
 * forward, and its greedy continuation must equal dsc_trainer_generate's
 * token for token.
 *
 * With a directory argument the top-2 gpt-moe and mixtral checkpoints are
 * kept in DIR/gpt-moe and DIR/mixtral, each with expected.txt, the text
 * `dsc-generate DIR/ARCH --prompt "ROMEO:" --max-new-tokens 20` must print
 * (dsc_trainer_generate's continuation), for the ctest dsc_generate_dsc_moe. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsc/checkpoint.h"
#include "dsc/data.h"
#include "dsc/engine.h"
#include "dsc/inference.h"
#include "dsc/model.h"
#include "dsc/moe.h"
#include "test_mpi.h"

enum { N_NEW = 20, V = 256 };

static const char *keep_dir; /* argv[1]: where checkpoints for dsc_generate_dsc_moe are kept */

static const char *const tiny_json =
    "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 1, \"steps_per_print\": 1000,"
    " \"seed\": 5,"
    " \"model\": {\"arch\": \"gpt-moe\", \"n_layer\": 2, \"d_model\": 32, \"n_head\": 4, \"vocab_size\": 256,"
    "            \"seq_len\": 48},"
    " \"moe\": {\"num_experts\": 4, \"k\": 2, \"layer_freq\": 2, \"drop_tokens\": false},"
    " \"optimizer\": {\"type\": \"adamw\", \"params\": {\"lr\": 0.01}},"
    " \"data\": {\"val_fraction\": 0.1}, \"train\": {\"steps\": 80, \"eval_iters\": 1}}";

static void write_tokens(const char *path) {
    FILE *fp = fopen(DSC_SOURCE_DIR "/data/tinyshakespeare.txt", "rb");
    assert_non_null(fp);
    enum { COUNT = 20000 };
    char *text = malloc(COUNT);
    assert_int_equal(fread(text, 1, COUNT, fp), COUNT);
    fclose(fp);
    uint32_t *ids = malloc(COUNT * sizeof *ids);
    dsc_byte_tokenizer_encode(text, COUNT, ids);
    assert_ok(dsc_token_file_write(path, ids, COUNT, DSC_TOKEN_DTYPE_U16, DSC_BYTE_VOCAB_SIZE));
    free(ids);
    free(text);
}

/* Logits (T, V) of the training model's layers (eval mode), rebuilt in a
 * fresh parameter store holding the trained values, over one (1, T) prompt. */
static float *training_logits(const dsc_config *cfg, const dsc_moe_build_extra *extra, dsc_trainer *t,
                              const int32_t *prompt, int64_t T) {
    dsc_model_config mc;
    assert_ok(dsc_trainer_model_config(cfg, &mc));
    dsc_layer_spec *specs;
    int n_specs;
    assert_ok(dsc_model_specs(&mc, &specs, &n_specs));
    dsc_param_store *store;
    assert_ok(dsc_params_create(&store, DSC_CPU, 1));
    dsc_build_ctx bctx = {.model = &mc, .params = store, .device = DSC_CPU, .extra = extra};
    dsc_layer **layers = calloc((size_t)n_specs, sizeof *layers);
    for (int i = 0; i < n_specs; i++)
        assert_ok(dsc_layer_build(&specs[i], &bctx, &layers[i]));
    assert_ok(dsc_params_finalize(store));
    dsc_param_store *trained = dsc_trainer_params(t);
    for (int i = 0; i < dsc_params_count(store); i++) {
        dsc_param *p = dsc_params_at(store, i);
        dsc_param *q = dsc_params_find(trained, p->name);
        assert_non_null(q);
        assert_ok(dsc_tensor_copy(&p->value, &q->value));
    }
    dsc_tensor tokens = dsc_tensor_view((void *)prompt, DSC_DTYPE_I32, 2, (int64_t[]){1, T}, DSC_CPU);
    dsc_micro_ctx ctx = {.tokens = &tokens, .loss_scale = 1.0f};
    dsc_tensor x = {0}, y = {0};
    for (int i = 0; i < n_specs; i++) {
        assert_ok(dsc_layer_reserve(layers[i], 1, 1, T));
        assert_ok(dsc_layer_forward(layers[i], 0, &x, &y, &ctx));
        x = y;
    }
    float *out = malloc((size_t)(T * V) * sizeof *out);
    memcpy(out, y.data, (size_t)(T * V) * sizeof *out);
    for (int i = 0; i < n_specs; i++)
        dsc_layer_destroy(layers[i]);
    free(layers);
    free(specs);
    dsc_params_destroy(store);
    return out;
}

/* Worst relative error of the engine's logits at every position of
 * `prompt` (fed one token at a time) against the training layers'. */
static double prompt_error(dsc_infer_engine *e, const float *train, const int32_t *prompt, int32_t n,
                           uint64_t uid) {
    float logits[V];
    double worst = 0;
    for (int i = 0; i < n; i++) {
        const int32_t *one = &prompt[i];
        int32_t c1 = 1;
        assert_ok(dsc_infer_engine_put(e, 1, &uid, &one, &c1, logits));
        double diff = 0, scale = 1e-6;
        for (int v = 0; v < V; v++) {
            double d = fabs((double)logits[v] - train[i * V + v]);
            if (!(d <= diff)) diff = d;
            if (fabs((double)train[i * V + v]) > scale) scale = fabs((double)train[i * V + v]);
        }
        if (diff / scale > worst) worst = diff / scale;
    }
    assert_ok(dsc_infer_engine_flush(e, uid));
    return worst;
}

/* The engine's greedy continuation of got[0 .. n) into got[n .. n + N_NEW). */
static void engine_greedy(dsc_infer_engine *e, int32_t *got, int32_t n, uint64_t uid) {
    float logits[V];
    const int32_t *ptr = got;
    int32_t count = n;
    for (int s = 0; s < N_NEW; s++) {
        assert_ok(dsc_infer_engine_put(e, 1, &uid, &ptr, &count, logits));
        int32_t best = 0;
        for (int32_t v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v;
        got[n + s] = best;
        ptr = &got[n + s];
        count = 1;
    }
    assert_ok(dsc_infer_engine_flush(e, uid));
}

/* What dsc-generate prints for "ROMEO:" greedily: the prompt, the
 * training model's continuation, a newline. */
static void write_expected(dsc_trainer *t, const char *dir) {
    const char *prompt = "ROMEO:";
    int32_t n = (int32_t)strlen(prompt), ids[64];
    for (int i = 0; i < n; i++)
        ids[i] = (unsigned char)prompt[i];
    assert_ok(dsc_trainer_generate(t, ids, n, N_NEW, 0.0f, 1, ids));
    char text[128], path[600];
    size_t len = dsc_byte_tokenizer_decode(ids, n + N_NEW, text, sizeof text);
    snprintf(path, sizeof path, "%s/expected.txt", dir);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(text, 1, len, fp), len);
    fputc('\n', fp);
    fclose(fp);
}

/* Trains, saves, loads and compares one model; `keep` saves it in keep_dir/policy instead of a temporary
 * directory. */
static void check_arch(const char *const *overrides, int n_overrides, const char *policy, bool keep) {
    char dir[] = "/tmp/dsc_infer_moe_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char data[256], data_set[300], save_dir[512];
    snprintf(data, sizeof data, "%s/tokens.bin", dir);
    snprintf(data_set, sizeof data_set, "data.path=%s", data);
    keep = keep && keep_dir;
    if (keep)
        snprintf(save_dir, sizeof save_dir, "%s/%s", keep_dir, policy);
    else
        snprintf(save_dir, sizeof save_dir, "%s/ckpt", dir);
    if (keep) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", save_dir, save_dir);
        assert_int_equal(system(cmd), 0);
    }
    write_tokens(data);
    const char *all[8] = {data_set};
    for (int i = 0; i < n_overrides; i++)
        all[i + 1] = overrides[i];
    dsc_config cfg;
    assert_ok(dsc_config_parse_string(tiny_json, "tiny.json", all, n_overrides + 1, &cfg));
    assert_ok(dsc_config_resolve_batch(&cfg, 1));
    dsc_moe_build_extra extra = {0};
    assert_ok(dsc_moe_options_from_config(&cfg.moe, cfg.model.arch, &extra.options));
    assert_ok(dsc_nn_register_dense_layers());
    assert_ok(dsc_moe_register_layers());
    dsc_trainer_layers tl = {.build_extra = &extra};
    dsc_trainer *t;
    assert_ok(dsc_trainer_create_with_layers(&(dsc_trainer_options){.cfg = &cfg}, NULL, &tl, &t));
    assert_ok(dsc_engine_train(dsc_trainer_engine(t)));
    char *config_json;
    assert_ok(dsc_config_to_json(&cfg, &config_json));
    dsc_checkpoint_state st = {.comm = MPI_COMM_WORLD,
                               .params = dsc_trainer_params(t),
                               .global_step = 4,
                               .config_json = config_json,
                               .layout_json = "{\"world\": 1, \"pp\": 1, \"dp\": 1, \"ep\": 1, \"zero_stage\": 0}",
                               .model_signature = "{}",
                               .engine_json = "{}"};
    assert_ok(dsc_checkpoint_save(&st, save_dir, "step4", 0));
    if (keep) write_expected(t, save_dir);

    dsc_infer_model *m;
    assert_ok(dsc_infer_model_load(save_dir, &m));
    assert_string_equal(dsc_infer_model_arch(m), policy);
    const dsc_infer_model_config *mc = dsc_infer_model_get_config(m);
    assert_int_equal(mc->n_experts, cfg.moe.num_experts);
    assert_int_equal(mc->top_k, cfg.moe.k);
    assert_int_equal(mc->moe_residual, cfg.moe.use_residual);
    dsc_infer_engine *e;
    dsc_infer_engine_config ec = dsc_infer_engine_config_default(m);
    ec.block_size = 8;
    ec.kv_cache_bytes = 1 << 20;
    assert_ok(dsc_infer_engine_create(m, &ec, &e));
    const char *prompts[] = {"First Citizen:\n", "ROMEO: ", "the "};
    for (int p = 0; p < 3; p++) {
        int32_t n = (int32_t)strlen(prompts[p]), ref[64], got[64];
        for (int i = 0; i < n; i++)
            got[i] = (unsigned char)prompts[p][i];
        float *train = training_logits(&cfg, &extra, t, got, n);
        double worst = prompt_error(e, train, got, n, 50 + (uint64_t)p);
        free(train);
        printf("%s (k %d, layer_freq %d, residual %d) prompt %d: logits at %d positions vs training layers, "
               "worst rel err %.3e\n",
               policy, cfg.moe.k, cfg.moe.layer_freq, cfg.moe.use_residual, p, n, worst);
        assert_true(worst <= 1e-4);
        assert_ok(dsc_trainer_generate(t, got, n, N_NEW, 0.0f, 1, ref));
        engine_greedy(e, got, n, (uint64_t)p);
        char a[64], b[64];
        dsc_byte_tokenizer_decode(ref, n + N_NEW, a, sizeof a);
        dsc_byte_tokenizer_decode(got, n + N_NEW, b, sizeof b);
        printf("  training: %s\n  engine:   %s\n", a, b);
        assert_memory_equal(got, ref, (size_t)(n + N_NEW) * sizeof(int32_t));
    }
    dsc_infer_engine_destroy(e);
    dsc_infer_model_destroy(m);
    free(config_json);
    dsc_trainer_destroy(t);
    dsc_config_free(&cfg);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_gpt_moe_top2_every_second(void **state) {
    (void)state;
    check_arch(NULL, 0, "gpt-moe", true);
}

static void test_gpt_moe_top1_residual(void **state) {
    (void)state;
    const char *o[] = {"moe.k=1", "moe.layer_freq=1", "moe.use_residual=true"};
    check_arch(o, 3, "gpt-moe", false);
}

static void test_mixtral_top2(void **state) {
    (void)state;
    const char *o[] = {"model.arch=mixtral", "model.n_kv_head=2", "model.d_ff=48", "moe.layer_freq=1"};
    check_arch(o, 4, "mixtral", true);
}

static void test_mixtral_top3_residual(void **state) {
    (void)state;
    const char *o[] = {"model.arch=mixtral", "model.n_kv_head=2", "model.d_ff=48", "moe.k=3",
                       "moe.use_residual=true"};
    check_arch(o, 5, "mixtral", false);
}

int main(int argc, char **argv) {
    keep_dir = argc > 1 ? argv[1] : NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt_moe_top2_every_second), cmocka_unit_test(test_gpt_moe_top1_residual),
        cmocka_unit_test(test_mixtral_top2), cmocka_unit_test(test_mixtral_top3_residual)};
    return DSC_RUN_MPI_TESTS(tests);
}
