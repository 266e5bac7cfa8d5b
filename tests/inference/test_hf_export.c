/* The models `dsc-ckpt export --format hf` is checked on: a tiny dsc llama
 * (GQA), llama with q/k/v biases (exported as Qwen2), mixtral (top-2, MoE in
 * every block, dropless) and gpt (GPT-2, untied head) are trained for a few
 * steps through the training stack and saved as dsc checkpoints in
 * DIR/<case>/ckpt, each with DIR/<case>/dsc_logits.safetensors: the
 * training layers' logits (T, V) over a prompt ("tokens", "logits").
 * hf_export_check.sh then exports each with the CLI and check_hf_export.py
 * has transformers load the export and compare its logits with these.
 * Here too: dsc_hf_export's refusals (gpt-moe, mixtral with a top-1 router)
 * and its writing nothing over an existing export. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/checkpoint.h"
#include "dsc/hf.h"
#include "dsc/safetensors.h"
#include "test_mpi.h"
#include "train_ckpt_fixture.h"

static const char *out_dir; /* argv[1] */

static const char *const tiny_json =
    "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 1, \"steps_per_print\": 1000,"
    " \"seed\": 11,"
    " \"model\": {\"arch\": \"llama\", \"n_layer\": 2, \"d_model\": 32, \"n_head\": 4, \"n_kv_head\": 2,"
    "            \"d_ff\": 48, \"vocab_size\": 256, \"seq_len\": 32},"
    " \"optimizer\": {\"type\": \"adamw\", \"params\": {\"lr\": 0.01}},"
    " \"data\": {\"val_fraction\": 0.1}, \"train\": {\"steps\": 30, \"eval_iters\": 1}}";

/* Trains the case, saves it in out_dir/name/ckpt and writes the training logits beside it. */
static void make_case(const char *name, const char *const *overrides, int n_overrides) {
    char dir[700], save_dir[800], path[800];
    snprintf(dir, sizeof dir, "%s/%s", out_dir, name);
    char cmd[1600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    assert_int_equal(system(cmd), 0);
    snprintf(save_dir, sizeof save_dir, "%s/ckpt", dir);
    dsc_config cfg;
    train_ckpt_config(tiny_json, dir, overrides, n_overrides, &cfg);
    const bool moe = cfg.moe.num_experts > 0;
    dsc_moe_build_extra extra;
    dsc_trainer *t = train_ckpt_trainer(&cfg, &extra);
    assert_ok(dsc_engine_train(dsc_trainer_engine(t)));
    train_ckpt_save(t, &cfg, save_dir);

    const char *prompt = "First Citizen:\nBefore we proceed";
    int32_t T = (int32_t)strlen(prompt), ids[64];
    for (int i = 0; i < T; i++)
        ids[i] = (unsigned char)prompt[i];
    float *logits = train_ckpt_training_logits(&cfg, moe ? &extra : NULL, t, ids, T);
    int64_t V = cfg.model.vocab_size;
    const char *names[] = {"tokens", "logits"};
    dsc_tensor tensors[] = {dsc_tensor_view(ids, DSC_DTYPE_I32, 1, (int64_t[]){T}, DSC_CPU),
                            dsc_tensor_view(logits, DSC_DTYPE_F32, 2, (int64_t[]){T, V}, DSC_CPU)};
    snprintf(path, sizeof path, "%s/dsc_logits.safetensors", dir);
    assert_ok(dsc_safetensors_write(path, 2, names, tensors, 0, NULL));
    printf("%s: trained %s, saved %s and the training logits (%d, %lld)\n", name,
           dsc_model_arch_name(cfg.model.arch), save_dir, T, (long long)V);
    free(logits);
    dsc_trainer_destroy(t);
    dsc_config_free(&cfg);
}

static void test_llama(void **state) {
    (void)state;
    make_case("llama", NULL, 0);
}

static void test_llama_qkv_bias(void **state) {
    (void)state;
    const char *o[] = {"model.qkv_bias=true", "model.tie_embeddings=true"};
    make_case("qwen2", o, 2);
}

static void test_mixtral(void **state) {
    (void)state;
    const char *o[] = {"model.arch=mixtral", "moe.num_experts=4", "moe.k=2", "moe.layer_freq=1",
                       "moe.drop_tokens=false"};
    make_case("mixtral", o, 5);
}

static void test_gpt(void **state) {
    (void)state;
    const char *o[] = {"model.arch=gpt", "model.n_kv_head=4", "model.d_ff=64"};
    make_case("gpt", o, 3);
}

/* A fresh checkpoint of `overrides`, trained 0 steps, in a temporary directory. */
static void save_untrained(const char *dir, const char *const *overrides, int n, char *save_dir, size_t len) {
    snprintf(save_dir, len, "%s/ckpt", dir);
    dsc_config cfg;
    train_ckpt_config(tiny_json, dir, overrides, n, &cfg);
    dsc_moe_build_extra extra;
    dsc_trainer *t = train_ckpt_trainer(&cfg, &extra);
    train_ckpt_save(t, &cfg, save_dir);
    dsc_trainer_destroy(t);
    dsc_config_free(&cfg);
}

/* Exports a fresh checkpoint of `overrides`: the first export must give `code`
 * (0: success) with `needle` in its message; a second one must refuse to overwrite. */
static void export_fresh(const char *const *overrides, int n, int code, const char *needle) {
    char dir[] = "/tmp/dsc_hf_export_XXXXXX", save_dir[300], file[400], out[300];
    assert_non_null(mkdtemp(dir));
    snprintf(out, sizeof out, "%s/hf", dir);
    save_untrained(dir, overrides, n, save_dir, sizeof save_dir);
    assert_ok(dsc_checkpoint_path(save_dir, "latest", file, sizeof file));
    if (code) {
        assert_err(dsc_hf_export(file, out, NULL), code, needle);
    } else {
        int64_t count = 0;
        assert_ok(dsc_hf_export(file, out, &count));
        assert_int_equal(count, 2 * 9 + 3); /* 9 per llama block, embedding, final norm, head */
        assert_err(dsc_hf_export(file, out, NULL), DSC_ERR_IO, "nothing is overwritten");
    }
    train_ckpt_remove_dir(dir);
}

static void test_refusals(void **state) {
    (void)state;
    const char *top1[] = {"model.arch=mixtral", "moe.num_experts=4", "moe.k=1"};
    export_fresh(top1, 3, DSC_ERR_UNSUPPORTED, "top-1");
    const char *gpt_moe[] = {"model.arch=gpt-moe", "model.n_kv_head=4", "moe.num_experts=4", "moe.k=2"};
    export_fresh(gpt_moe, 4, DSC_ERR_UNSUPPORTED, "gpt-moe");
    export_fresh(NULL, 0, 0, NULL);
}

int main(int argc, char **argv) {
    out_dir = argc > 1 ? argv[1] : "/tmp/dsc_hf_export_cases";
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama), cmocka_unit_test(test_llama_qkv_bias), cmocka_unit_test(test_mixtral),
        cmocka_unit_test(test_gpt),   cmocka_unit_test(test_refusals),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
