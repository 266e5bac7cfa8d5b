/* The Dynamic SplitFuse scheduler on the tiny Llama fixture: many requests
 * of random prompt and output lengths, generated greedily under a small
 * token budget (prompts chunked, decodes and chunks mixed), give exactly
 * the tokens each request gets alone; the same holds with prefill-first
 * priority, static batching, and a KV cache so small that an optimistic
 * reservation must preempt (recompute) requests. No forward exceeds the
 * budget, every block is returned, stop tokens and max_new_tokens end
 * requests, seeded sampling repeats, impossible requests are refused.
 * Releasing requests mid-run (how a server cancels) frees their blocks and
 * leaves the others' tokens unchanged; the callback sees the logits row of
 * each token. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/inference.h"
#include "dsc/rng.h"
#include "test_mpi.h"

#define LLAMA DSC_SOURCE_DIR "/tests/inference/fixtures/hf/llama"
enum { NREQ = 10, MAXP = 24, MAXNEW = 10 };

typedef struct workload {
    int32_t prompt[NREQ][MAXP];
    int32_t n_prompt[NREQ], max_new[NREQ];
    int32_t expect[NREQ][MAXNEW], n_expect[NREQ];
    int32_t got[NREQ][MAXNEW], n_got[NREQ];
    bool finished[NREQ];
} workload;

static dsc_infer_model *model;
static workload W;

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static dsc_infer_engine *make_engine(int32_t blocks) {
    dsc_infer_engine_config ec = dsc_infer_engine_config_default(model);
    ec.block_size = 4;
    ec.max_tokens_per_forward = 64;
    ec.max_batch_sequences = 8;
    ec.max_sequences = 16;
    ec.kv_cache_bytes = 1 << 20;
    dsc_infer_engine *e;
    assert_ok(dsc_infer_engine_create(model, &ec, &e));
    if (blocks > 0) {
        ec.kv_cache_bytes = (int64_t)blocks * (int64_t)dsc_kv_config_block_bytes(dsc_infer_engine_kv_config(e));
        dsc_infer_engine_destroy(e);
        assert_ok(dsc_infer_engine_create(model, &ec, &e));
    }
    return e;
}

static int setup(void **state) {
    (void)state;
    assert_ok(dsc_infer_model_load(LLAMA, &model));
    int32_t V = dsc_infer_model_get_config(model)->vocab_size;
    dsc_rng rng;
    dsc_rng_init(&rng, 5, 0, DSC_RNG_DATA);
    dsc_infer_engine *e = make_engine(0);
    float *logits = malloc((size_t)V * sizeof *logits);
    for (int i = 0; i < NREQ; i++) {
        W.n_prompt[i] = 2 + (int32_t)dsc_rng_below(&rng, MAXP - 2);
        W.max_new[i] = 1 + (int32_t)dsc_rng_below(&rng, MAXNEW);
        for (int t = 0; t < W.n_prompt[i]; t++)
            W.prompt[i][t] = (int32_t)dsc_rng_below(&rng, (uint64_t)V);
        /* The reference: this request alone, greedy, one put per step. */
        uint64_t uid = 1000 + (uint64_t)i;
        const int32_t *p = W.prompt[i];
        int32_t count = W.n_prompt[i];
        for (int s = 0; s < W.max_new[i]; s++) {
            assert_ok(dsc_infer_engine_put(e, 1, &uid, &p, &count, logits));
            W.expect[i][s] = argmax(logits, V);
            p = &W.expect[i][s];
            count = 1;
        }
        W.n_expect[i] = W.max_new[i];
        assert_ok(dsc_infer_engine_flush(e, uid));
    }
    free(logits);
    dsc_infer_engine_destroy(e);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    dsc_infer_model_destroy(model);
    return 0;
}

static dsc_status collect(void *user, uint64_t uid, int32_t token, bool finished) {
    workload *w = user;
    int i = (int)uid;
    DSC_CHECK(i >= 0 && i < NREQ && !w->finished[i] && w->n_got[i] < MAXNEW, DSC_ERR_INTERNAL, "bad callback %d",
              i);
    w->got[i][w->n_got[i]++] = token;
    w->finished[i] = finished;
    return NULL;
}

/* Clears the results and submits the NREQ requests of the workload, greedy. */
static void submit_all(dsc_scheduler *s) {
    memset(W.got, 0, sizeof W.got);
    memset(W.n_got, 0, sizeof W.n_got);
    memset(W.finished, 0, sizeof W.finished);
    for (int i = 0; i < NREQ; i++) {
        dsc_gen_request r = {.uid = (uint64_t)i,
                             .prompt = W.prompt[i],
                             .n_prompt = W.n_prompt[i],
                             .max_new_tokens = W.max_new[i],
                             .sampling = dsc_sampling_params_greedy()};
        assert_ok(dsc_scheduler_submit(s, &r));
    }
}

static const dsc_scheduler_stats *run(dsc_infer_engine *e, const dsc_scheduler_config *cfg, dsc_scheduler **out) {
    dsc_scheduler *s;
    assert_ok(dsc_scheduler_create(e, cfg, collect, &W, &s));
    submit_all(s);
    assert_ok(dsc_scheduler_run(s));
    for (int i = 0; i < NREQ; i++) {
        assert_true(W.finished[i]);
        assert_int_equal(W.n_got[i], W.n_expect[i]);
        assert_memory_equal(W.got[i], W.expect[i], (size_t)W.n_got[i] * sizeof(int32_t));
        assert_true(dsc_scheduler_ttft(s, (uint64_t)i) >= 0);
    }
    assert_int_equal(dsc_infer_engine_free_blocks(e), dsc_infer_engine_total_blocks(e));
    const dsc_scheduler_stats *st = dsc_scheduler_get_stats(s);
    assert_true(st->max_tokens_in_forward <= cfg->token_budget);
    printf("budget %d%s%s reserve %d: %lld forwards, %lld tokens forwarded, %lld generated, %lld preemptions, "
           "max %d tokens/forward, mean KV use %.2f\n",
           cfg->token_budget, cfg->prefill_priority ? " prefill-first" : "", cfg->static_batching ? " static" : "",
           cfg->kv_reserve_tokens, (long long)st->forwards, (long long)st->tokens_forwarded,
           (long long)st->tokens_generated, (long long)st->preemptions, st->max_tokens_in_forward,
           st->kv_utilisation_sum / (double)st->forwards);
    *out = s;
    return st;
}

static void test_continuous_batching_equals_solo(void **state) {
    (void)state;
    dsc_infer_engine *e = make_engine(0);
    dsc_scheduler_config cfg = dsc_scheduler_config_default(e);
    cfg.token_budget = 16;
    dsc_scheduler *s;
    const dsc_scheduler_stats *st = run(e, &cfg, &s);
    assert_int_equal(st->preemptions, 0);
    dsc_scheduler_destroy(s);
    cfg.prefill_priority = DSC_PREFILL_PRIORITY_PREFILL_FIRST;
    run(e, &cfg, &s);
    dsc_scheduler_destroy(s);
    cfg.prefill_priority = DSC_PREFILL_PRIORITY_DECODE_FIRST;
    cfg.static_batching = true;
    cfg.token_budget = 64;
    run(e, &cfg, &s);
    dsc_scheduler_destroy(s);
    dsc_infer_engine_destroy(e);
}

static void test_preemption_keeps_every_request_finishing(void **state) {
    (void)state;
    /* 12 blocks of 4 tokens: the longest request needs 9 blocks alone. */
    dsc_infer_engine *e = make_engine(12);
    dsc_scheduler_config cfg = dsc_scheduler_config_default(e);
    cfg.token_budget = 12;
    cfg.kv_reserve_tokens = 0;
    dsc_scheduler *s;
    const dsc_scheduler_stats *st = run(e, &cfg, &s);
    assert_true(st->preemptions > 0);
    dsc_scheduler_destroy(s);
    /* Full reservation on the same cache: no preemption, same tokens. */
    cfg.kv_reserve_tokens = -1;
    st = run(e, &cfg, &s);
    assert_int_equal(st->preemptions, 0);
    dsc_scheduler_destroy(s);
    dsc_infer_engine_destroy(e);
}

typedef struct sink {
    int32_t tokens[32];
    int n;
} sink;

static dsc_status to_sink(void *user, uint64_t uid, int32_t token, bool finished) {
    (void)uid;
    (void)finished;
    sink *k = user;
    k->tokens[k->n++] = token;
    return NULL;
}

static void generate_one(dsc_infer_engine *e, const dsc_gen_request *r, sink *k) {
    dsc_scheduler *s;
    memset(k, 0, sizeof *k);
    assert_ok(dsc_scheduler_create(e, &(dsc_scheduler_config){.token_budget = 8, .kv_reserve_tokens = -1}, to_sink,
                                   k, &s));
    assert_ok(dsc_scheduler_submit(s, r));
    assert_ok(dsc_scheduler_run(s));
    dsc_scheduler_destroy(s);
}

static void test_stop_sampling_and_refusals(void **state) {
    (void)state;
    dsc_infer_engine *e = make_engine(0);
    int i = 0;
    while (W.max_new[i] < 4)
        i++;
    int32_t stop = W.expect[i][2];
    int expect_n = 3;
    for (int t = 0; t < 2; t++)
        if (W.expect[i][t] == stop) expect_n = t + 1;
    dsc_gen_request r = {.uid = 1,
                         .prompt = W.prompt[i],
                         .n_prompt = W.n_prompt[i],
                         .max_new_tokens = 20,
                         .sampling = dsc_sampling_params_greedy(),
                         .stop_tokens = &stop,
                         .n_stop = 1};
    sink a, b;
    generate_one(e, &r, &a);
    assert_int_equal(a.n, expect_n);
    assert_memory_equal(a.tokens, W.expect[i], (size_t)expect_n * sizeof(int32_t));

    r.n_stop = 0;
    r.max_new_tokens = 12;
    r.sampling =
        (dsc_sampling_params){.temperature = 1.5f, .top_k = 20, .top_p = 0.9f, .repetition_penalty = 1.3f};
    r.seed = 77;
    generate_one(e, &r, &a);
    generate_one(e, &r, &b);
    assert_int_equal(a.n, 12);
    assert_memory_equal(a.tokens, b.tokens, sizeof a.tokens);
    r.seed = 78;
    generate_one(e, &r, &b);
    assert_true(memcmp(a.tokens, b.tokens, sizeof a.tokens) != 0);

    dsc_scheduler *s;
    assert_ok(dsc_scheduler_create(e, &(dsc_scheduler_config){.token_budget = 8, .kv_reserve_tokens = -1}, NULL,
                                   NULL, &s));
    r.max_new_tokens = 64;
    assert_err(dsc_scheduler_submit(s, &r), DSC_ERR_INVALID, "exceeds max_context");
    r.max_new_tokens = 4;
    assert_ok(dsc_scheduler_submit(s, &r));
    assert_err(dsc_scheduler_submit(s, &r), DSC_ERR_INVALID, "uid already submitted");
    r.uid = 2;
    r.n_prompt = 0;
    assert_err(dsc_scheduler_submit(s, &r), DSC_ERR_INVALID, "needs a prompt");
    dsc_scheduler_destroy(s);
    assert_err(dsc_scheduler_create(e, &(dsc_scheduler_config){.token_budget = 65}, NULL, NULL, &s),
               DSC_ERR_CONFIG, "token_budget");
    dsc_infer_engine_destroy(e);
}

typedef struct cancel_ctx {
    dsc_scheduler *s;
    int32_t V;
    int calls, argmax_matches;
} cancel_ctx;

static dsc_status check_logits(void *user, uint64_t uid, int32_t token, bool finished) {
    cancel_ctx *c = user;
    const float *row = dsc_scheduler_token_logits(c->s);
    c->calls++;
    c->argmax_matches += row && argmax(row, c->V) == token;
    return collect(&W, uid, token, finished);
}

static void test_release_mid_run(void **state) {
    (void)state;
    dsc_infer_engine *e = make_engine(0);
    dsc_scheduler_config cfg = dsc_scheduler_config_default(e);
    cfg.token_budget = 16;
    cancel_ctx c = {.V = dsc_infer_engine_vocab_size(e)};
    assert_ok(dsc_scheduler_create(e, &cfg, check_logits, &c, &c.s));
    submit_all(c.s);
    assert_null(dsc_scheduler_token_logits(c.s));
    bool idle;
    assert_ok(dsc_scheduler_step(c.s, &idle));
    assert_ok(dsc_scheduler_step(c.s, &idle));
    dsc_scheduler_counts n = dsc_scheduler_get_counts(c.s);
    assert_int_equal(n.waiting + n.running + n.finished, NREQ);
    assert_true(n.running > 0);
    assert_true(dsc_infer_engine_free_blocks(e) < dsc_infer_engine_total_blocks(e));
    /* Cancel the odd requests, whatever their state. */
    for (int i = 1; i < NREQ; i += 2)
        assert_ok(dsc_scheduler_release(c.s, (uint64_t)i));
    assert_err(dsc_scheduler_release(c.s, 1), DSC_ERR_INVALID, "unknown request 1");
    assert_ok(dsc_scheduler_run(c.s));
    for (int i = 0; i < NREQ; i += 2) {
        assert_true(W.finished[i]);
        assert_int_equal(W.n_got[i], W.n_expect[i]);
        assert_memory_equal(W.got[i], W.expect[i], (size_t)W.n_got[i] * sizeof(int32_t));
        assert_ok(dsc_scheduler_release(c.s, (uint64_t)i));
    }
    n = dsc_scheduler_get_counts(c.s);
    assert_int_equal(n.waiting + n.running + n.finished, 0);
    assert_int_equal(dsc_infer_engine_free_blocks(e), dsc_infer_engine_total_blocks(e));
    assert_int_equal(c.argmax_matches, c.calls);
    printf("released 5 of %d mid-run; the other 5 unchanged; %d tokens saw their logits row\n", NREQ, c.calls);
    dsc_scheduler_destroy(c.s);
    dsc_infer_engine_destroy(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_continuous_batching_equals_solo),
                                       cmocka_unit_test(test_preemption_keeps_every_request_finishing),
                                       cmocka_unit_test(test_stop_sampling_and_refusals),
                                       cmocka_unit_test(test_release_mid_run)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
