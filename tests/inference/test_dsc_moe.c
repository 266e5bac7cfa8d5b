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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/data.h"
#include "test_mpi.h"
#include "train_ckpt_fixture.h"

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
    char save_dir[512];
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
    dsc_config cfg;
    train_ckpt_config(tiny_json, dir, overrides, n_overrides, &cfg);
    dsc_moe_build_extra extra = {0};
    assert_ok(dsc_moe_options_from_config(&cfg.moe, cfg.model.arch, &extra.options));
    assert_ok(dsc_nn_register_dense_layers());
    assert_ok(dsc_moe_register_layers());
    dsc_trainer_layers tl = {.build_extra = &extra};
    dsc_trainer *t;
    assert_ok(dsc_trainer_create_with_layers(&(dsc_trainer_options){.cfg = &cfg}, NULL, &tl, &t));
    assert_ok(dsc_engine_train(dsc_trainer_engine(t)));
    train_ckpt_save(t, &cfg, save_dir);
    if (keep) write_expected(t, save_dir);

    dsc_infer_model *m;
    assert_ok(dsc_infer_model_load(save_dir, &m));
    assert_string_equal(dsc_infer_model_arch(m), policy);
    const dsc_infer_model_config *mc = dsc_infer_model_get_config(m);
    assert_int_equal(mc->n_experts, cfg.moe.num_experts);
    assert_int_equal(mc->top_k, cfg.moe.k);
    assert_int_equal(mc->moe_residual, cfg.moe.use_residual);
    dsc_infer_engine *e = train_ckpt_engine(m);
    const char *prompts[] = {"First Citizen:\n", "ROMEO: ", "the "};
    for (int p = 0; p < 3; p++) {
        int32_t n = (int32_t)strlen(prompts[p]), ids[64];
        for (int i = 0; i < n; i++)
            ids[i] = (unsigned char)prompts[p][i];
        float *train = train_ckpt_training_logits(&cfg, &extra, t, ids, n);
        double worst = train_ckpt_prompt_error(e, train, ids, n, 50 + (uint64_t)p, V);
        free(train);
        printf("%s (k %d, layer_freq %d, residual %d) prompt %d: logits at %d positions vs training layers, "
               "worst rel err %.3e\n",
               policy, cfg.moe.k, cfg.moe.layer_freq, cfg.moe.use_residual, p, n, worst);
        assert_true(worst <= 1e-4);
        train_ckpt_check_greedy(e, t, ids, n, N_NEW, (uint64_t)p, V);
    }
    dsc_infer_engine_destroy(e);
    dsc_infer_model_destroy(m);
    dsc_trainer_destroy(t);
    dsc_config_free(&cfg);
    train_ckpt_remove_dir(dir);
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
