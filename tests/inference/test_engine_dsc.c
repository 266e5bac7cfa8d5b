/* A dsc training checkpoint served by the inference engine: a tiny GPT and
 * a tiny Llama-style model (RoPE, grouped-query attention) are trained for
 * a few steps on tinyshakespeare with the training engine, saved with
 * dsc_checkpoint_save, loaded by dsc_infer_model_load (policies "gpt" and
 * "llama"). The engine's logits at every prompt position (fed one token at
 * a time through the KV cache) must equal the training layers' logits of
 * one whole-prompt forward, and its greedy continuation must equal
 * dsc_trainer_generate's token for token (train_ckpt_fixture.c). */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_mpi.h"
#include "train_ckpt_fixture.h"

enum { N_NEW = 20, V = 256 };

static const char *const tiny_json =
    "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 1, \"steps_per_print\": 1000,"
    " \"seed\": 3,"
    " \"model\": {\"arch\": \"gpt\", \"n_layer\": 2, \"d_model\": 32, \"n_head\": 4, \"vocab_size\": 256,"
    "            \"seq_len\": 48},"
    " \"optimizer\": {\"type\": \"adamw\", \"params\": {\"lr\": 0.02}},"
    " \"data\": {\"val_fraction\": 0.1}, \"train\": {\"steps\": 80, \"eval_iters\": 1}}";

static void check_arch(const char *const *overrides, int n_overrides, const char *policy) {
    char dir[] = "/tmp/dsc_infer_ckpt_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char save_dir[300];
    snprintf(save_dir, sizeof save_dir, "%s/ckpt", dir);
    dsc_config cfg;
    train_ckpt_config(tiny_json, dir, overrides, n_overrides, &cfg);
    dsc_trainer *t;
    assert_ok(dsc_trainer_create(&(dsc_trainer_options){.cfg = &cfg}, &t));
    assert_ok(dsc_engine_train(dsc_trainer_engine(t)));
    train_ckpt_save(t, &cfg, save_dir);

    dsc_infer_model *m;
    assert_ok(dsc_infer_model_load(save_dir, &m));
    assert_string_equal(dsc_infer_model_arch(m), policy);
    dsc_infer_engine *e = train_ckpt_engine(m);
    const char *prompts[] = {"First Citizen:\n", "ROMEO: ", "the "};
    for (int p = 0; p < 3; p++) {
        int32_t n = (int32_t)strlen(prompts[p]), ids[64];
        for (int i = 0; i < n; i++)
            ids[i] = (unsigned char)prompts[p][i];
        float *train = train_ckpt_training_logits(&cfg, NULL, t, ids, n);
        double worst = train_ckpt_prompt_error(e, train, ids, n, 50 + (uint64_t)p, V);
        printf("%s prompt %d: logits at %d positions vs training layers, worst rel err %.3e\n", policy, p, n,
               worst);
        assert_true(worst <= 1e-5);
        free(train);
        train_ckpt_check_greedy(e, t, ids, n, N_NEW, (uint64_t)p, V);
    }
    dsc_infer_engine_destroy(e);
    dsc_infer_model_destroy(m);
    dsc_trainer_destroy(t);
    dsc_config_free(&cfg);
    train_ckpt_remove_dir(dir);
}

static void test_gpt_checkpoint(void **state) {
    (void)state;
    check_arch(NULL, 0, "gpt");
}

static void test_llama_checkpoint(void **state) {
    (void)state;
    const char *o[] = {"model.arch=llama", "model.n_kv_head=2", "model.d_ff=48"};
    check_arch(o, 3, "llama");
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_gpt_checkpoint),
                                       cmocka_unit_test(test_llama_checkpoint)};
    return DSC_RUN_MPI_TESTS(tests);
}
