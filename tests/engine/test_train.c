/* One-rank training: bitwise determinism for a seed, resuming from copied
 * parameters and optimizer state, evaluation, the metrics
 * file and its plot, generation, and a clear error for each bad input
 * (missing data file, token id >= vocab, NaN loss, wrong shapes, features
 * this trainer does not wire). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsc/data.h"
#include "nn_test_util.h"
#include "test_mpi.h"
#include "train_fixture.h"

static char data[128];

static int setup(void **state) {
    (void)state;
    snprintf(data, sizeof data, "/tmp/dsc_test_train_%d.tok", (int)getpid());
    train_fixture_tokens(data, 20000);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    unlink(data);
    return 0;
}

static dsc_status make(const char *path, const char *const *over, int n, dsc_config *cfg, dsc_trainer **t,
                       const char *metrics) {
    train_fixture_config(cfg, path, over, n, 1);
    dsc_trainer_options o = {cfg, NULL, metrics != NULL, metrics, false};
    return dsc_trainer_create(&o, t);
}

static void test_bitwise_deterministic(void **state) {
    (void)state;
    double losses[2][5];
    float *params[2];
    int64_t count;
    for (int run = 0; run < 2; run++) {
        dsc_config cfg;
        dsc_trainer *t;
        assert_ok(make(data, NULL, 0, &cfg, &t, NULL));
        for (int s = 0; s < 5; s++) {
            dsc_step_metrics m;
            assert_ok(dsc_engine_step(dsc_trainer_engine(t), &m));
            losses[run][s] = m.loss;
        }
        params[run] = train_fixture_params(t, &count);
        dsc_trainer_destroy(t);
        dsc_config_free(&cfg);
    }
    assert_memory_equal(losses[0], losses[1], sizeof losses[0]);
    assert_memory_equal(params[0], params[1], (size_t)count * sizeof(float));
    printf("  two runs: losses %.6f ... %.6f identical bit for bit, %lld parameters identical\n", losses[0][0],
           losses[0][4], (long long)count);
    free(params[0]);
    free(params[1]);
}

/* What a checkpoint restore does through the public interfaces: copy the
 * parameters and every optimizer state tensor into a fresh trainer and set its
 * step count; the continuation is then bit for bit the uninterrupted run. */
static void test_resume_from_state(void **state) {
    (void)state;
    dsc_config ca, cb;
    dsc_trainer *a, *b;
    assert_ok(make(data, NULL, 0, &ca, &a, NULL));
    assert_ok(make(data, NULL, 0, &cb, &b, NULL));
    for (int s = 0; s < 2; s++)
        assert_ok(dsc_engine_step(dsc_trainer_engine(a), NULL));

    dsc_param_store *pa = dsc_trainer_params(a), *pb = dsc_trainer_params(b);
    for (int i = 0; i < dsc_params_count(pa); i++)
        assert_ok(dsc_tensor_copy(&dsc_params_at(pb, i)->value, &dsc_params_at(pa, i)->value));
    dsc_optimizer *oa = dsc_trainer_optimizer(a), *ob = dsc_trainer_optimizer(b);
    assert_int_equal(dsc_optimizer_state_count(oa), dsc_optimizer_state_count(ob));
    for (int i = 0; i < dsc_optimizer_state_count(oa); i++) {
        dsc_optim_state sa, sb;
        dsc_optimizer_state_at(oa, i, &sa);
        dsc_optimizer_state_at(ob, i, &sb);
        assert_string_equal(sa.name, sb.name);
        assert_int_equal(dsc_tensor_nbytes(&sa.local), dsc_tensor_nbytes(&sb.local));
        memcpy(sb.local.data, sa.local.data, dsc_tensor_nbytes(&sa.local));
    }
    dsc_engine_set_steps_done(dsc_trainer_engine(b), 2);

    for (int s = 0; s < 3; s++) {
        dsc_step_metrics ma, mb;
        assert_ok(dsc_engine_step(dsc_trainer_engine(a), &ma));
        assert_ok(dsc_engine_step(dsc_trainer_engine(b), &mb));
        assert_int_equal(ma.step, mb.step);
        assert_true(ma.loss == mb.loss && ma.lr == mb.lr && ma.grad_norm == mb.grad_norm);
    }
    int64_t n;
    float *xa = train_fixture_params(a, &n), *xb = train_fixture_params(b, &n);
    assert_memory_equal(xa, xb, (size_t)n * sizeof *xa);
    printf("  resumed at step 2 from copied state: steps 3..5 and %lld parameters identical\n", (long long)n);
    free(xa);
    free(xb);
    dsc_trainer_destroy(a);
    dsc_trainer_destroy(b);
    dsc_config_free(&ca);
    dsc_config_free(&cb);
}

static void test_train_eval_metrics_plot_generate(void **state) {
    (void)state;
    char metrics[160], svg[160];
    snprintf(metrics, sizeof metrics, "/tmp/dsc_test_train_%d.jsonl", (int)getpid());
    snprintf(svg, sizeof svg, "/tmp/dsc_test_train_%d.svg", (int)getpid());
    const char *over[] = {"train.eval_interval=2", "train.steps=4"};
    dsc_config cfg;
    dsc_trainer *t;
    assert_ok(make(data, over, 2, &cfg, &t, metrics));
    assert_ok(dsc_engine_train(dsc_trainer_engine(t)));
    assert_int_equal(dsc_engine_steps_done(dsc_trainer_engine(t)), 4);
    double val;
    assert_ok(dsc_engine_evaluate(dsc_trainer_engine(t), &val));
    assert_true(isfinite(val) && val > 0 && val < 6);

    /* 4 step lines + val lines at steps 2 and 4 */
    FILE *fp = fopen(metrics, "r");
    assert_non_null(fp);
    char line[512];
    int steps = 0, vals = 0;
    while (fgets(line, sizeof line, fp)) {
        assert_null(strstr(line, "\"time_ms\"")); /* wall_clock_breakdown is off */
        steps += strstr(line, "\"grad_norm\"") != NULL && strstr(line, "\"tokens_per_s\"") != NULL;
        vals += strstr(line, "\"val_loss\"") != NULL;
    }
    fclose(fp);
    assert_int_equal(steps, 4);
    assert_int_equal(vals, 2);
    assert_ok(dsc_metrics_plot_svg(metrics, svg));
    fp = fopen(svg, "r");
    assert_non_null(fp);
    assert_non_null(fgets(line, sizeof line, fp));
    assert_non_null(strstr(line, "<svg"));
    fclose(fp);
    assert_err(dsc_metrics_plot_svg("/nonexistent.jsonl", svg), DSC_ERR_IO, "metrics file /nonexistent.jsonl");

    /* generation: deterministic for a seed, ids in range, greedy differs from nothing */
    int32_t prompt[3] = {'T', 'h', 'e'}, a[23], b[23];
    assert_ok(dsc_trainer_generate(t, prompt, 3, 20, 0.8f, 5, a));
    assert_ok(dsc_trainer_generate(t, prompt, 3, 20, 0.8f, 5, b));
    assert_memory_equal(a, b, sizeof a);
    for (int i = 0; i < 23; i++)
        assert_true(a[i] >= 0 && a[i] < 256);
    assert_memory_equal(a, prompt, sizeof prompt);
    dsc_trainer_destroy(t);
    dsc_config_free(&cfg);
    unlink(metrics);
    unlink(svg);
}

/* dsc_engine_evaluate against PyTorch: the fixture's GPT weights and tokens
 * (tests/ref/make_eval_fixture.py) give the validation loss PyTorch computed
 * in float64 over the same val windows, within 1e-5 relative. */
static void test_evaluate_matches_pytorch(void **state) {
    (void)state;
    fixture f;
    fixture_load(&f, "eval_gpt");
    const fixture_array *tok = fixture_get(&f, "tokens"), *want = fixture_get(&f, "val_loss");
    assert_non_null(tok);
    assert_non_null(want);
    char path[128];
    snprintf(path, sizeof path, "/tmp/dsc_test_eval_%d.tok", (int)getpid());
    uint32_t *ids = malloc((size_t)tok->numel * sizeof *ids);
    for (int64_t i = 0; i < tok->numel; i++)
        ids[i] = (uint32_t)((const int32_t *)tok->data)[i];
    assert_ok(
        dsc_token_file_write(path, ids, tok->numel, DSC_TOKEN_DTYPE_U16, (int64_t)fixture_meta(&f, "vocab_size")));
    free(ids);
    char set[6][64];
    snprintf(set[0], sizeof set[0], "model.n_head=%d", (int)fixture_meta(&f, "n_head"));
    snprintf(set[1], sizeof set[1], "model.d_ff=%d", (int)fixture_meta(&f, "d_ff"));
    snprintf(set[2], sizeof set[2], "model.vocab_size=%d", (int)fixture_meta(&f, "vocab_size"));
    snprintf(set[3], sizeof set[3], "data.val_fraction=%g", fixture_meta(&f, "val_fraction"));
    snprintf(set[4], sizeof set[4], "train.eval_iters=%d", (int)fixture_meta(&f, "eval_iters"));
    snprintf(set[5], sizeof set[5], "model.n_layer=%d", (int)fixture_meta(&f, "n_layer"));
    const char *over[6] = {set[0], set[1], set[2], set[3], set[4], set[5]};
    dsc_config cfg;
    dsc_trainer *t;
    assert_ok(make(path, over, 6, &cfg, &t, NULL));
    assert_int_equal(cfg.model.d_model, (int)fixture_meta(&f, "d_model"));
    assert_int_equal(cfg.model.seq_len, (int)fixture_meta(&f, "seq_len"));
    assert_int_equal(cfg.train_micro_batch_size_per_gpu, (int)fixture_meta(&f, "micro"));
    assert_int_equal(cfg.gradient_accumulation_steps, (int)fixture_meta(&f, "accumulation"));
    assert_true(cfg.model.tie_embeddings && cfg.model.qkv_bias);
    dsc_param_store *ps = dsc_trainer_params(t);
    int in_fixture = 0;
    for (int i = 0; i < f.n_arrays; i++)
        in_fixture += strncmp(f.arrays[i].name, "param/", 6) == 0;
    assert_int_equal(in_fixture, dsc_params_count(ps)); /* the same parameters, both ways */
    for (int i = 0; i < dsc_params_count(ps); i++) {
        dsc_param *p = dsc_params_at(ps, i);
        char name[200];
        snprintf(name, sizeof name, "param/%s", p->name);
        const fixture_array *a = fixture_get(&f, name);
        if (!a) fail_msg("fixture has no %s", name);
        assert_int_equal(a->numel, dsc_param_numel(p));
        memcpy(p->value.data, a->data, (size_t)a->numel * sizeof(float));
    }
    double val;
    assert_ok(dsc_engine_evaluate(dsc_trainer_engine(t), &val));
    double ref = ((const float *)want->data)[0], rel = fabs(val - ref) / ref;
    printf("  val loss %.9f, PyTorch %.9f (rel %.2e)\n", val, ref, rel);
    assert_true(rel <= 1e-5);
    dsc_trainer_destroy(t);
    dsc_config_free(&cfg);
    fixture_free(&f);
    unlink(path);
}

/* Activation checkpointing on the default runner: an 8-block model holds one
 * block's intermediates at a time instead of 8, measured by the allocator's
 * accounting (what the layers reserve, and the peak during a step), with
 * bitwise the same losses. */
static void test_activation_checkpointing_saves_memory(void **state) {
    (void)state;
    int64_t reserved[2], peak[2];
    double loss[2][2];
    for (int ckpt = 0; ckpt < 2; ckpt++) {
        const char *over[] = {"model.n_layer=8", ckpt ? "model.activation_checkpointing=true"
                                                      : "model.activation_checkpointing=false"};
        dsc_mem_stats before, after;
        dsc_mem_get_stats(&before);
        dsc_config cfg;
        dsc_trainer *t;
        assert_ok(make(data, over, 2, &cfg, &t, NULL));
        dsc_mem_get_stats(&after);
        reserved[ckpt] = after.current[DSC_MEM_ACTIVATIONS] - before.current[DSC_MEM_ACTIVATIONS];
        dsc_mem_reset_peaks();
        for (int s = 0; s < 2; s++) {
            dsc_step_metrics m;
            assert_ok(dsc_engine_step(dsc_trainer_engine(t), &m));
            loss[ckpt][s] = m.loss;
        }
        dsc_mem_get_stats(&after);
        peak[ckpt] = after.peak[DSC_MEM_ACTIVATIONS] - before.current[DSC_MEM_ACTIVATIONS];
        printf("  activation checkpointing %s: activations reserved %lld bytes, peak in a step %lld bytes\n",
               ckpt ? "on " : "off", (long long)reserved[ckpt], (long long)peak[ckpt]);
        dsc_trainer_destroy(t);
        dsc_config_free(&cfg);
    }
    assert_true(loss[0][0] == loss[1][0] && loss[0][1] == loss[1][1]);
    assert_true(2 * reserved[1] < reserved[0]);
    assert_true(2 * peak[1] < peak[0]);
}

/* wall_clock_breakdown: every step reports its time per phase (the default
 * runner has no p2p), the phases fit in the step, and the metrics file
 * carries them only when the key is on. */
static void test_wall_clock_breakdown(void **state) {
    (void)state;
    char metrics[160];
    snprintf(metrics, sizeof metrics, "/tmp/dsc_test_train_wcb_%d.jsonl", (int)getpid());
    const char *over[] = {"wall_clock_breakdown=true", "train.steps=3"};
    dsc_config cfg;
    dsc_trainer *t;
    assert_ok(make(data, over, 2, &cfg, &t, metrics));
    dsc_step_metrics m;
    assert_ok(dsc_engine_step(dsc_trainer_engine(t), &m));
    double sum = 0;
    for (int p = 0; p < DSC_PHASE_COUNT; p++) {
        printf("  %-9s %.3f ms\n", dsc_phase_name((dsc_phase)p), 1e3 * m.phase_s[p]);
        sum += m.phase_s[p];
    }
    assert_true(m.phase_s[DSC_PHASE_FORWARD] > 0 && m.phase_s[DSC_PHASE_BACKWARD] > 0);
    assert_true(m.phase_s[DSC_PHASE_OPTIMIZER] > 0 && m.phase_s[DSC_PHASE_REDUCE] >= 0);
    assert_true(m.phase_s[DSC_PHASE_P2P] == 0);
    assert_true(sum <= m.step_s);
    assert_ok(dsc_engine_train(dsc_trainer_engine(t)));
    FILE *fp = fopen(metrics, "r");
    assert_non_null(fp);
    char line[1024];
    int timed = 0;
    while (fgets(line, sizeof line, fp))
        timed += strstr(line, "\"time_ms\": {\"step\": ") && strstr(line, "\"forward\": ") &&
                 strstr(line, "\"backward\": ") && strstr(line, "\"p2p\": ") && strstr(line, "\"reduce\": ") &&
                 strstr(line, "\"optimizer\": ");
    fclose(fp);
    assert_int_equal(timed, 2); /* the steps dsc_engine_train ran */
    dsc_trainer_destroy(t);
    dsc_config_free(&cfg);
    unlink(metrics);
}

static void test_bad_inputs(void **state) {
    (void)state;
    dsc_config cfg;
    dsc_trainer *t = NULL;

    assert_err(make("/nonexistent/train.tok", NULL, 0, &cfg, &t, NULL), DSC_ERR_IO,
               "data file /nonexistent/train.tok: cannot open");
    dsc_config_free(&cfg);

    /* ids up to 255 in the file, a 64-token model */
    const char *small_vocab[] = {"model.vocab_size=64"};
    assert_ok(make(data, small_vocab, 1, &cfg, &t, NULL));
    assert_err(dsc_engine_step(dsc_trainer_engine(t), NULL), DSC_ERR_CORRUPT, "is >= vocab size 64");
    dsc_trainer_destroy(t);
    dsc_config_free(&cfg);

    /* a learning rate that blows the model up: stops with the step named */
    const char *huge_lr[] = {"optimizer.params.lr=1e30", "scheduler.type=constant", "gradient_clipping=0"};
    assert_ok(make(data, huge_lr, 3, &cfg, &t, NULL));
    dsc_status s = NULL;
    int64_t step = 0;
    while (!s && step < 5) {
        s = dsc_engine_step(dsc_trainer_engine(t), NULL);
        step++;
    }
    char want[64];
    snprintf(want, sizeof want, "step %lld: the ", (long long)step);
    printf("  lr 1e30: %s\n", dsc_status_message(s));
    assert_err(s, DSC_ERR_NUMERIC, want);
    assert_int_equal(dsc_engine_steps_done(dsc_trainer_engine(t)), step - 1);
    dsc_trainer_destroy(t);
    dsc_config_free(&cfg);

    /* wrong shapes: heads that do not divide the width (the config or the model check names the key) */
    const char *bad_heads[] = {"data.path=x", "model.n_head=5", "model.d_model=32"};
    s = dsc_config_parse_string("{}", "tiny.json", bad_heads, 3, &cfg);
    if (!s) {
        assert_ok(dsc_config_resolve_batch(&cfg, 1));
        dsc_trainer_options bad = {&cfg, NULL, false, NULL, false};
        s = dsc_trainer_create(&bad, &t);
        dsc_config_free(&cfg);
    }
    printf("  n_head 5 with d_model 32: %s\n", dsc_status_message(s));
    assert_err(s, DSC_ERR_CONFIG, "model.n_head");

    const char *pipe[] = {"pipeline.stages=2"};
    train_fixture_config(&cfg, data, pipe, 1, 1);
    dsc_trainer_options o = {&cfg, NULL, false, NULL, false};
    assert_err(dsc_trainer_create(&o, &t), DSC_ERR_UNSUPPORTED, "\"pipeline.stages\" = 2");
    dsc_config_free(&cfg);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bitwise_deterministic),
        cmocka_unit_test(test_resume_from_state),
        cmocka_unit_test(test_train_eval_metrics_plot_generate),
        cmocka_unit_test(test_evaluate_matches_pytorch),
        cmocka_unit_test(test_wall_clock_breakdown),
        cmocka_unit_test(test_activation_checkpointing_saves_memory),
        cmocka_unit_test(test_bad_inputs),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
