/* dsc-train --init-from-hf's library path: the tiny Mistral, Qwen2 (q/k/v
 * biases, tied embeddings) and Mixtral (top-2 MoE) checkpoints that
 * tests/ref/make_hf_fixtures.py made with transformers give the model
 * section of a training config (dsc_hf_import_config), the training
 * parameters are set from them by the checkpoint restore path
 * (dsc_checkpoint_load_params) with 0 training steps, and the training
 * layers' logits over each fixture prompt must equal transformers' logits
 * (ref.safetensors) within 1e-5 relative. Then the other direction without
 * transformers at test time: those parameters saved as a dsc checkpoint and
 * exported with dsc_hf_export (dsc-ckpt export --format hf) must give back
 * transformers' own file, every tensor by name, shape and value, and a
 * config.json from which the import builds the same model section (where
 * transformers is installed, hf_export_transformers loads exports in it).
 * Also: a checkpoint dsc training
 * cannot build exactly (Llama-3 RoPE scaling), a config whose model section
 * disagrees with the checkpoint, and a seq_len beyond its context are
 * refused, naming the key. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/checkpoint.h"
#include "dsc/data.h"
#include "dsc/hf.h"
#include "dsc/safetensors.h"
#include "test_mpi.h"
#include "train_ckpt_fixture.h"

#define FIXTURES DSC_SOURCE_DIR "/tests/inference/fixtures/hf/"

/* A job file in dir with `model_and_moe` (JSON members) and a token file of ids < 128. */
static void write_job(const char *dir, const char *model_and_moe, char *path, size_t len) {
    char tokens[400];
    snprintf(tokens, sizeof tokens, "%s/tokens.bin", dir);
    uint32_t ids[2000];
    for (int i = 0; i < 2000; i++)
        ids[i] = (uint32_t)(i * 37 % 128);
    assert_ok(dsc_token_file_write(tokens, ids, 2000, DSC_TOKEN_DTYPE_U16, 128));
    snprintf(path, len, "%s/job.json", dir);
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fprintf(fp,
            "{\"train_micro_batch_size_per_gpu\": 2, \"gradient_accumulation_steps\": 1, \"seed\": 1,\n"
            " %s,\n \"optimizer\": {\"type\": \"adamw\", \"params\": {\"lr\": 0.001}},\n"
            " \"data\": {\"path\": \"%s\"}, \"train\": {\"steps\": 1}}\n",
            model_and_moe, tokens);
    fclose(fp);
}

/* Every tensor of transformers' file `want` is in `got` under its name, with its shape and values (as
 * f32) bit for bit, and `got` has no other. */
static void expect_same_tensors(const char *want_path, const char *got_path) {
    dsc_safetensors *want, *got;
    assert_ok(dsc_safetensors_open(&want, want_path));
    assert_ok(dsc_safetensors_open(&got, got_path));
    assert_int_equal(dsc_safetensors_count(got), dsc_safetensors_count(want));
    for (int64_t i = 0; i < dsc_safetensors_count(want); i++) {
        dsc_safetensors_tensor w, g;
        dsc_safetensors_at(want, i, &w);
        if (!dsc_safetensors_find(got, w.name, &g)) fail_msg("the export has no tensor %s", w.name);
        assert_int_equal(g.ndim, w.ndim);
        for (int d = 0; d < w.ndim; d++)
            assert_int_equal(g.shape[d], w.shape[d]);
        float *a = malloc((size_t)w.numel * sizeof *a), *b = malloc((size_t)w.numel * sizeof *b);
        assert_ok(dsc_safetensors_read_f32(want, w.name, a, w.numel));
        assert_ok(dsc_safetensors_read_f32(got, w.name, b, w.numel));
        if (memcmp(a, b, (size_t)w.numel * sizeof *a) != 0) fail_msg("tensor %s: the values differ", w.name);
        free(a);
        free(b);
    }
    printf("  export: the %lld tensors of transformers' %s, bit for bit\n", (long long)dsc_safetensors_count(want),
           want_path);
    dsc_safetensors_close(want);
    dsc_safetensors_close(got);
}

/* The checkpoint of t exported to dir/hf: transformers' tensors, and a config whose import gives cfg's
 * model section. */
static void check_export(dsc_trainer *t, const dsc_config *cfg, const char *dir, const char *hf_dir,
                         const char *job) {
    char save_dir[400], file[600], out[400], st_want[600], st_got[600];
    snprintf(save_dir, sizeof save_dir, "%s/ckpt", dir);
    snprintf(out, sizeof out, "%s/hf", dir);
    train_ckpt_save(t, cfg, save_dir);
    assert_ok(dsc_checkpoint_path(save_dir, "latest", file, sizeof file));
    assert_ok(dsc_hf_export(file, out, NULL));
    snprintf(st_want, sizeof st_want, "%s/model.safetensors", hf_dir);
    snprintf(st_got, sizeof st_got, "%s/model.safetensors", out);
    expect_same_tensors(st_want, st_got);
    dsc_hf_import *again;
    assert_ok(dsc_hf_import_open(out, &again));
    dsc_config back;
    assert_ok(dsc_hf_import_config(again, job, NULL, 0, &back));
    assert_memory_equal(&back.model, &cfg->model, sizeof back.model);
    assert_memory_equal(&back.moe, &cfg->moe, sizeof back.moe);
    dsc_config_free(&back);
    dsc_hf_import_close(again);
}

static void check_fixture(const char *name, const char *model_and_moe) {
    char dir[] = "/tmp/dsc_hf_init_XXXXXX", job[300], hf_dir[512], ref_path[600];
    assert_non_null(mkdtemp(dir));
    write_job(dir, model_and_moe, job, sizeof job);
    snprintf(hf_dir, sizeof hf_dir, FIXTURES "%s", name);
    snprintf(ref_path, sizeof ref_path, "%s/ref.safetensors", hf_dir);
    dsc_hf_import *imp;
    assert_ok(dsc_hf_import_open(hf_dir, &imp));
    dsc_config cfg;
    assert_ok(dsc_hf_import_config(imp, job, NULL, 0, &cfg));
    assert_ok(dsc_config_resolve_batch(&cfg, 1));
    const bool moe = cfg.moe.num_experts > 0;
    dsc_moe_build_extra extra;
    dsc_trainer *t = train_ckpt_trainer(&cfg, &extra);
    dsc_checkpoint_state st = {
        .comm = MPI_COMM_WORLD, .params = dsc_trainer_params(t), .optimizer = dsc_trainer_optimizer(t)};
    assert_ok(dsc_checkpoint_load_params(&st, dsc_hf_import_read, imp));

    dsc_safetensors *ref;
    assert_ok(dsc_safetensors_open(&ref, ref_path));
    for (int p = 0; p < 3; p++) {
        char key[32], what[96];
        dsc_safetensors_tensor tt, tl_;
        snprintf(key, sizeof key, "tokens_%d", p);
        assert_true(dsc_safetensors_find(ref, key, &tt));
        float *tokf = malloc((size_t)tt.numel * sizeof *tokf);
        assert_ok(dsc_safetensors_read_f32(ref, key, tokf, tt.numel));
        int32_t ids[64];
        for (int64_t i = 0; i < tt.numel; i++)
            ids[i] = (int32_t)tokf[i];
        snprintf(key, sizeof key, "logits_%d", p);
        assert_true(dsc_safetensors_find(ref, key, &tl_));
        float *want = malloc((size_t)tl_.numel * sizeof *want);
        assert_ok(dsc_safetensors_read_f32(ref, key, want, tl_.numel));
        float *got = train_ckpt_training_logits(&cfg, moe ? &extra : NULL, t, ids, tt.numel);
        snprintf(what, sizeof what, "%s prompt %d (%lld tokens): dsc training logits vs transformers", name, p,
                 (long long)tt.numel);
        assert_true(dsc_test_max_rel_err(got, want, tl_.numel, 0, what) <= 1e-5);
        free(got);
        free(want);
        free(tokf);
    }
    dsc_safetensors_close(ref);
    check_export(t, &cfg, dir, hf_dir, job);
    dsc_trainer_destroy(t);
    dsc_config_free(&cfg);
    dsc_hf_import_close(imp);
    train_ckpt_remove_dir(dir);
}

static void test_mistral(void **state) {
    (void)state;
    check_fixture("mistral", "\"model\": {\"seq_len\": 16}");
}

static void test_qwen2(void **state) {
    (void)state;
    check_fixture("qwen2", "\"model\": {\"seq_len\": 16, \"d_model\": 32}");
}

static void test_mixtral(void **state) {
    (void)state;
    check_fixture("mixtral", "\"model\": {\"seq_len\": 16}, \"moe\": {\"drop_tokens\": false}");
}

static void test_refusals(void **state) {
    (void)state;
    dsc_hf_import *imp = NULL;
    assert_err(dsc_hf_import_open(FIXTURES "llama", &imp), DSC_ERR_UNSUPPORTED, "rope_scaling");
    assert_null(imp);
    char dir[] = "/tmp/dsc_hf_init_XXXXXX", job[300];
    assert_non_null(mkdtemp(dir));
    assert_ok(dsc_hf_import_open(FIXTURES "mistral", &imp));
    dsc_config cfg;
    write_job(dir, "\"model\": {\"seq_len\": 16, \"d_model\": 64}", job, sizeof job);
    assert_err(dsc_hf_import_config(imp, job, NULL, 0, &cfg), DSC_ERR_CONFIG, "\"model.d_model\" is 64");
    remove(job);
    write_job(dir, "\"model\": {\"seq_len\": 16}", job, sizeof job);
    const char *set[] = {"model.n_layer=3"};
    assert_err(dsc_hf_import_config(imp, job, set, 1, &cfg), DSC_ERR_CONFIG, "--set model.n_layer=3");
    remove(job);
    write_job(dir, "\"model\": {\"seq_len\": 128}", job, sizeof job);
    assert_err(dsc_hf_import_config(imp, job, NULL, 0, &cfg), DSC_ERR_CONFIG, "context of 64 tokens");
    dsc_hf_import_close(imp);
    train_ckpt_remove_dir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mistral),
        cmocka_unit_test(test_qwen2),
        cmocka_unit_test(test_mixtral),
        cmocka_unit_test(test_refusals),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
