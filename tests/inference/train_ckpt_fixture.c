/* The trained-checkpoint fixture of the inference tests (see
 * train_ckpt_fixture.h). Test-only: failures fail the running test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/checkpoint.h"
#include "dsc/data.h"
#include "test_mpi.h"
#include "train_ckpt_fixture.h"

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

void train_ckpt_config(const char *json, const char *dir, const char *const *overrides, int n_overrides,
                       dsc_config *cfg) {
    char data[256], data_set[300];
    snprintf(data, sizeof data, "%s/tokens.bin", dir);
    snprintf(data_set, sizeof data_set, "data.path=%s", data);
    write_tokens(data);
    const char *all[8] = {data_set};
    assert_true(n_overrides < 8);
    for (int i = 0; i < n_overrides; i++)
        all[i + 1] = overrides[i];
    assert_ok(dsc_config_parse_string(json, "tiny.json", all, n_overrides + 1, cfg));
    assert_ok(dsc_config_resolve_batch(cfg, 1));
}

dsc_trainer *train_ckpt_trainer(const dsc_config *cfg, dsc_moe_build_extra *extra) {
    *extra = (dsc_moe_build_extra){0};
    const bool moe = cfg->moe.num_experts > 0;
    if (moe) {
        assert_ok(dsc_moe_options_from_config(&cfg->moe, cfg->model.arch, &extra->options));
        assert_ok(dsc_nn_register_dense_layers());
        assert_ok(dsc_moe_register_layers());
    }
    dsc_trainer_layers tl = {.build_extra = extra};
    dsc_trainer *t;
    assert_ok(dsc_trainer_create_with_layers(&(dsc_trainer_options){.cfg = cfg}, NULL, moe ? &tl : NULL, &t));
    return t;
}

void train_ckpt_save(dsc_trainer *t, const dsc_config *cfg, const char *save_dir) {
    char *config_json;
    assert_ok(dsc_config_to_json(cfg, &config_json));
    dsc_checkpoint_state st = {.comm = MPI_COMM_WORLD,
                               .params = dsc_trainer_params(t),
                               .global_step = 4,
                               .config_json = config_json,
                               .layout_json = "{\"world\": 1, \"pp\": 1, \"dp\": 1, \"ep\": 1, \"zero_stage\": 0}",
                               .model_signature = "{}",
                               .engine_json = "{}"};
    assert_ok(dsc_checkpoint_save(&st, save_dir, "step4", 0));
    free(config_json);
}

dsc_infer_engine *train_ckpt_engine(dsc_infer_model *m) {
    dsc_infer_engine *e;
    dsc_infer_engine_config ec = dsc_infer_engine_config_default(m);
    ec.block_size = 8;
    ec.kv_cache_bytes = 1 << 20;
    assert_ok(dsc_infer_engine_create(m, &ec, &e));
    return e;
}

float *train_ckpt_training_logits(const dsc_config *cfg, const dsc_moe_build_extra *extra, dsc_trainer *t,
                                  const int32_t *prompt, int64_t T) {
    dsc_model_config mc;
    assert_ok(dsc_trainer_model_config(cfg, &mc));
    assert_ok(dsc_nn_register_dense_layers());
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
    int64_t V = mc.vocab_size;
    float *out = malloc((size_t)(T * V) * sizeof *out); /* (T, V) */
    memcpy(out, y.data, (size_t)(T * V) * sizeof *out);
    for (int i = 0; i < n_specs; i++)
        dsc_layer_destroy(layers[i]);
    free(layers);
    free(specs);
    dsc_params_destroy(store);
    return out;
}

double train_ckpt_prompt_error(dsc_infer_engine *e, const float *train, const int32_t *prompt, int32_t n,
                               uint64_t uid, int32_t V) {
    float *logits = malloc((size_t)V * sizeof *logits); /* (V) */
    double worst = 0;
    for (int i = 0; i < n; i++) {
        const int32_t *one = &prompt[i];
        int32_t c1 = 1;
        assert_ok(dsc_infer_engine_put(e, 1, &uid, &one, &c1, logits));
        double r = dsc_test_rel_err(logits, train + (size_t)i * (size_t)V, V);
        if (r > worst) worst = r;
    }
    assert_ok(dsc_infer_engine_flush(e, uid));
    free(logits);
    return worst;
}

void train_ckpt_check_greedy(dsc_infer_engine *e, dsc_trainer *t, const int32_t *prompt, int32_t n, int32_t n_new,
                             uint64_t uid, int32_t V) {
    int32_t total = n + n_new;
    int32_t *ref = malloc((size_t)total * sizeof *ref); /* (n + n_new) */
    int32_t *got = malloc((size_t)total * sizeof *got); /* (n + n_new) */
    float *logits = malloc((size_t)V * sizeof *logits); /* (V) */
    memcpy(got, prompt, (size_t)n * sizeof *got);
    assert_ok(dsc_trainer_generate(t, got, n, n_new, 0.0f, 1, ref));
    const int32_t *ptr = got;
    int32_t count = n;
    for (int s = 0; s < n_new; s++) {
        assert_ok(dsc_infer_engine_put(e, 1, &uid, &ptr, &count, logits));
        int32_t best = 0;
        for (int32_t v = 1; v < V; v++)
            if (logits[v] > logits[best]) best = v;
        got[n + s] = best;
        ptr = &got[n + s];
        count = 1;
    }
    assert_ok(dsc_infer_engine_flush(e, uid));
    char a[128], b[128];
    dsc_byte_tokenizer_decode(ref, total, a, sizeof a);
    dsc_byte_tokenizer_decode(got, total, b, sizeof b);
    printf("  training: %s\n  engine:   %s\n", a, b);
    assert_memory_equal(got, ref, (size_t)total * sizeof(int32_t));
    free(logits);
    free(got);
    free(ref);
}

void train_ckpt_remove_dir(const char *dir) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}
