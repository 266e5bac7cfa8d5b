/* dsc-serve end to end on one rank, or (arguments TP [PP]) on several
 * ranks under dsc-launch, over 127.0.0.1, with the tiny Llama fixture
 * (4096-token context, a 192-block KV cache on every rank): 12 concurrent
 * requests (streaming and not, greedy and seeded sampling) return exactly
 * the tokens dsc-generate prints for the same prompt and seed, with exact
 * usage and finish reasons; lists of token-id prompts; every 400, 401,
 * 404, 405, 413 and 429 path with OpenAI's error object naming the field;
 * logprobs (on several ranks: equal to one rank's, also from the last
 * pipeline stage); a client that leaves mid-stream gets its sequence cancelled and its KV
 * blocks freed (seen in /metrics), and the next request still matches
 * dsc-generate (on several ranks: every rank released the same sequence);
 * the server exits 0 on SIGTERM. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "serve/client.h"
#include "serve_test.h"

static serve_proc server;
static int setup(void **state) {
    (void)state;
    const char *args[16];
    st_start_ranks(
        &server, st_ranks(), false,
        st_layout_args(args, (const char *[]){"--kv-cache-bytes", st_kv_bytes(), "--max-concurrent-requests", "12",
                                              "--max-body-bytes", "65536", "--max-tokens-limit", "4000",
                                              "--max-prompt-tokens", "512", NULL}));
    return 0;
}

static int teardown(void **state) {
    (void)state;
    if (server.pid > 0) assert_int_equal(st_stop(&server), 0);
    return 0;
}

/* ---- the same tokens as dsc-generate -------------------------------------------------------- */
typedef struct gen_case {
    int32_t prompt[24];
    int32_t n_prompt, max_tokens;
    float temperature, top_p;
    int32_t top_k;
    int seed;
    bool stream;
    int32_t expect[64], n_expect;
    int32_t got[64], n_got;
    int prompt_tokens, completion_tokens, chunks;
    char finish[16];
    bool done_seen;
} gen_case;

static void collect_ids(const cJSON *a, gen_case *c) {
    for (const cJSON *e = a ? a->child : NULL; e; e = e->next)
        if (c->n_got < 64) c->got[c->n_got++] = (int32_t)e->valuedouble;
}

static void *run_case(void *arg) {
    gen_case *c = arg;
    char body[2048];
    int at = snprintf(body, sizeof body, "{\"model\":\"llama4k\",\"prompt\":[");
    for (int32_t i = 0; i < c->n_prompt; i++)
        at += snprintf(body + at, sizeof body - (size_t)at, i ? ",%d" : "%d", c->prompt[i]);
    snprintf(body + at, sizeof body - (size_t)at,
             "],\"max_tokens\":%d,\"temperature\":%g,\"top_p\":%g,\"top_k\":%d,\"seed\":%d,\"stream\":%s,"
             "\"return_token_ids\":true%s}",
             c->max_tokens, c->temperature, c->top_p, c->top_k, c->seed, c->stream ? "true" : "false",
             c->stream ? ",\"stream_options\":{\"include_usage\":true}" : "");
    serve_client *cl;
    if (serve_client_open(server.port, "POST", "/v1/completions", ST_AUTH, body, 30.0, 0, &cl)) return NULL;
    if (serve_client_status(cl) != 200) {
        serve_client_close(cl);
        return NULL;
    }
    if (!c->stream) {
        const char *b;
        size_t n;
        cJSON *r = serve_client_body(cl, &b, &n) ? NULL : cJSON_Parse(b);
        const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0);
        collect_ids(cJSON_GetObjectItem(choice, "token_ids"), c);
        const cJSON *u = cJSON_GetObjectItem(r, "usage"), *f = cJSON_GetObjectItem(choice, "finish_reason");
        c->prompt_tokens = cJSON_GetObjectItem(u, "prompt_tokens")->valueint;
        c->completion_tokens = cJSON_GetObjectItem(u, "completion_tokens")->valueint;
        snprintf(c->finish, sizeof c->finish, "%s", cJSON_IsString(f) ? f->valuestring : "?");
        cJSON_Delete(r);
    } else {
        st_stream st;
        st_read_stream(cl, &st);
        memcpy(c->got, st.ids, (size_t)st.n_ids * sizeof *st.ids);
        c->n_got = st.n_ids;
        c->chunks = st.chunks;
        c->prompt_tokens = st.prompt_tokens;
        c->completion_tokens = st.completion_tokens;
        c->done_seen = st.done_seen;
        snprintf(c->finish, sizeof c->finish, "%s", st.finish);
    }
    serve_client_close(cl);
    return NULL;
}

static void test_matches_dsc_generate(void **state) {
    (void)state;
    enum { N = 12 };
    static gen_case cases[N];
    const float temps[] = {0.0f, 0.8f, 1.0f, 0.0f, 1.2f, 0.7f};
    const float top_ps[] = {1.0f, 1.0f, 0.9f, 1.0f, 1.0f, 0.8f};
    const int32_t top_ks[] = {0, 20, 0, 0, 0, 5}, max_tokens[] = {24, 30, 40, 16, 50, 32};
    for (int i = 0; i < N; i++) {
        gen_case *c = &cases[i];
        memset(c, 0, sizeof *c);
        c->n_prompt = 1 + (i * 7) % 20;
        for (int32_t t = 0; t < c->n_prompt; t++)
            c->prompt[t] = (int32_t)((i * 31 + t * 17 + 3) % 128);
        c->max_tokens = max_tokens[i % 6];
        c->temperature = temps[i % 6];
        c->top_p = top_ps[i % 6];
        c->top_k = top_ks[i % 6];
        c->seed = 1 + i;
        c->stream = i % 2 == 0;
        char options[256];
        snprintf(options, sizeof options,
                 "--max-new-tokens %d --temperature %g --top-p %g --top-k %d --seed %d --stop 2", c->max_tokens,
                 c->temperature, c->top_p, c->top_k, c->seed);
        c->n_expect = st_generate(c->prompt, c->n_prompt, options, c->expect, 64);
    }
    pthread_t th[N];
    for (int i = 0; i < N; i++)
        assert_int_equal(pthread_create(&th[i], NULL, run_case, &cases[i]), 0);
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++) {
        gen_case *c = &cases[i];
        printf("case %2d (%s, T=%.1f, top_k %d, top_p %.1f, seed %d): %d tokens, finish %s\n", i,
               c->stream ? "stream" : "json", c->temperature, c->top_k, c->top_p, c->seed, c->n_got, c->finish);
        assert_int_equal(c->n_got, c->n_expect);
        assert_memory_equal(c->got, c->expect, (size_t)c->n_got * sizeof(int32_t));
        assert_int_equal(c->prompt_tokens, c->n_prompt);
        assert_int_equal(c->completion_tokens, c->n_expect);
        bool stopped = c->n_expect > 0 && c->expect[c->n_expect - 1] == 2;
        assert_string_equal(c->finish, stopped ? "stop" : "length");
        if (!stopped) assert_int_equal(c->n_expect, c->max_tokens);
        if (c->stream) {
            assert_true(c->done_seen);
            assert_int_equal(c->chunks, c->n_expect); /* one chunk per token */
        }
    }
    st_wait_idle(server.port);
}

/* ---- prompt lists, logprobs, routes ---------------------------------------------------------- */
static cJSON *post_json(const char *path, const char *body, int expect_status) {
    char *resp;
    int status = st_request(server.port, path, body, &resp);
    if (status != expect_status)
        fail_msg("%s %s: status %d, expected %d: %s", path, body ? body : "(GET)", status, expect_status, resp);
    cJSON *r = cJSON_Parse(resp);
    free(resp);
    assert_non_null(r);
    return r;
}

/* Several ranks: the logprobs of `body` equal those of the same server on one
 * rank (started here): the same top ids in order, values within 1e-5. */
static void expect_one_rank_logprobs(const cJSON *r, const char *body) {
    if (st_ranks() == 1) return;
    serve_proc one;
    st_start(&one, (const char *[]){"--kv-cache-bytes", "786432", NULL});
    char *resp;
    int status = st_request(one.port, "/v1/completions", body, &resp);
    assert_int_equal(st_stop(&one), 0);
    assert_int_equal(status, 200);
    cJSON *ref = cJSON_Parse(resp);
    free(resp);
    const cJSON *choices = cJSON_GetObjectItem(r, "choices"), *ref_choices = cJSON_GetObjectItem(ref, "choices");
    assert_int_equal(cJSON_GetArraySize(choices), cJSON_GetArraySize(ref_choices));
    int compared = 0;
    for (int k = 0; k < cJSON_GetArraySize(choices); k++) {
        const cJSON *tops =
            cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(choices, k), "logprobs"), "top_logprobs");
        const cJSON *ref_tops = cJSON_GetObjectItem(
            cJSON_GetObjectItem(cJSON_GetArrayItem(ref_choices, k), "logprobs"), "top_logprobs");
        assert_int_equal(cJSON_GetArraySize(tops), cJSON_GetArraySize(ref_tops));
        for (int t = 0; t < cJSON_GetArraySize(tops); t++) {
            const cJSON *e = cJSON_GetArrayItem(tops, t)->child, *f = cJSON_GetArrayItem(ref_tops, t)->child;
            for (; e && f; e = e->next, f = f->next, compared++) {
                assert_string_equal(e->string, f->string);
                if (fabs(e->valuedouble - f->valuedouble) > 1e-5)
                    fail_msg("choice %d token %d: logprob of %s %.7f on %d ranks, %.7f on one", k, t, e->string,
                             e->valuedouble, st_ranks(), f->valuedouble);
            }
            assert_true(!e && !f);
        }
    }
    printf("%d logprobs equal to one rank's\n", compared);
    cJSON_Delete(ref);
}

static void test_prompt_list_and_logprobs(void **state) {
    (void)state;
    int32_t a[] = {71, 69, 123, 44, 56}, b[] = {9, 8};
    int32_t ea[8], eb[8];
    assert_int_equal(st_generate(a, 5, "--max-new-tokens 6 --stop 2", ea, 8), 6);
    int32_t nb = st_generate(b, 2, "--max-new-tokens 6 --stop 2", eb, 8);
    const char *body = "{\"prompt\":[[71,69,123,44,56],[9,8]],\"max_tokens\":6,\"temperature\":0,"
                       "\"return_token_ids\":true,\"logprobs\":3}";
    cJSON *r = post_json("/v1/completions", body, 200);
    expect_one_rank_logprobs(r, body);
    const cJSON *choices = cJSON_GetObjectItem(r, "choices");
    assert_int_equal(cJSON_GetArraySize(choices), 2);
    for (int k = 0; k < 2; k++) {
        const cJSON *c = cJSON_GetArrayItem(choices, k), *ids = cJSON_GetObjectItem(c, "token_ids");
        const int32_t *expect = k == 0 ? ea : eb;
        int32_t n = k == 0 ? 6 : nb;
        assert_int_equal(cJSON_GetObjectItem(c, "index")->valueint, k);
        assert_int_equal(cJSON_GetArraySize(ids), n);
        for (int32_t t = 0; t < n; t++)
            assert_int_equal(cJSON_GetArrayItem(ids, t)->valueint, expect[t]);
        /* Greedy: each token is its row's most likely one, listed first among the top 3. */
        const cJSON *lp = cJSON_GetObjectItem(c, "logprobs");
        const cJSON *tops = cJSON_GetObjectItem(lp, "top_logprobs"),
                    *tlp = cJSON_GetObjectItem(lp, "token_logprobs");
        assert_int_equal(cJSON_GetArraySize(tops), n);
        for (int32_t t = 0; t < n; t++) {
            const cJSON *top = cJSON_GetArrayItem(tops, t);
            assert_int_equal(cJSON_GetArraySize(top), 3);
            char want[32];
            snprintf(want, sizeof want, "token_id:%d", expect[t]);
            assert_string_equal(top->child->string, want);
            double lpt = cJSON_GetArrayItem(tlp, t)->valuedouble;
            assert_true(lpt <= 0 && lpt == top->child->valuedouble);
            assert_true(top->child->next->valuedouble <= lpt);
        }
    }
    const cJSON *u = cJSON_GetObjectItem(r, "usage");
    assert_int_equal(cJSON_GetObjectItem(u, "prompt_tokens")->valueint, 7);
    assert_int_equal(cJSON_GetObjectItem(u, "completion_tokens")->valueint, 6 + nb);
    assert_int_equal(cJSON_GetObjectItem(u, "total_tokens")->valueint, 13 + nb);
    cJSON_Delete(r);
    r = post_json("/v1/models", NULL, 200);
    assert_string_equal(
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "data"), 0), "id")->valuestring, "llama4k");
    cJSON_Delete(r);
    assert_true(st_metric(server.port, "dsc_kv_blocks_free") == 192);
}

/* Status, error.param and a piece of error.message of one bad request. */
static void expect_error(const char *path, const char *body, int status, const char *param, const char *message) {
    cJSON *r = post_json(path, body, status);
    const cJSON *e = cJSON_GetObjectItem(r, "error");
    assert_non_null(e);
    const cJSON *p = cJSON_GetObjectItem(e, "param"), *m = cJSON_GetObjectItem(e, "message");
    assert_true(cJSON_IsString(cJSON_GetObjectItem(e, "type")));
    if (param)
        assert_string_equal(cJSON_IsString(p) ? p->valuestring : "(null)", param);
    else
        assert_true(cJSON_IsNull(p));
    if (!strstr(m->valuestring, message)) fail_msg("message \"%s\" lacks \"%s\"", m->valuestring, message);
    printf("%d %-18s %s\n", status, param ? param : "-", m->valuestring);
    cJSON_Delete(r);
}

static void test_bad_requests(void **state) {
    (void)state;
    const char *C = "/v1/completions";
    expect_error(C, "{\"prompt\":[1,2", 400, NULL, "malformed JSON");
    expect_error(C, "[1,2]", 400, NULL, "JSON object");
    expect_error(C, "{\"prompt\":[1],\"best_of\":2}", 400, "best_of", "unknown field");
    expect_error(C, "{\"max_tokens\":3}", 400, "prompt", "required");
    expect_error(C, "{\"prompt\":[1],\"temperature\":3}", 400, "temperature", "[0, 2]");
    expect_error(C, "{\"prompt\":[1],\"top_p\":0}", 400, "top_p", "(0, 1]");
    expect_error(C, "{\"prompt\":[1],\"top_k\":-2}", 400, "top_k", "[-1,");
    expect_error(C, "{\"prompt\":[1],\"n\":2}", 400, "n", "must be 1");
    expect_error(C, "{\"prompt\":[1],\"max_tokens\":0}", 400, "max_tokens", "[1,");
    expect_error(C, "{\"prompt\":[1],\"max_tokens\":1.5}", 400, "max_tokens", "integer");
    expect_error(C, "{\"prompt\":[1],\"max_tokens\":4001}", 400, "max_tokens", "at most 4000");
    expect_error(C, "{\"prompt\":[1],\"logprobs\":21}", 400, "logprobs", "[0, 20]");
    expect_error(C, "{\"prompt\":[1],\"stream\":\"yes\"}", 400, "stream", "true or false");
    expect_error(C, "{\"prompt\":[1],\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "stop", "at most 4");
    expect_error(C, "{\"prompt\":[1],\"echo\":true,\"logprobs\":1}", 400, "echo", "not supported");
    expect_error(C, "{\"prompt\":[1],\"presence_penalty\":0.5}", 400, "presence_penalty", "not implemented");
    expect_error(C, "{\"prompt\":[1],\"stream_options\":{\"include_usage\":true}}", 400, "stream_options",
                 "stream: true");
    expect_error(C, "{\"prompt\":[]}", 400, "prompt", "empty");
    expect_error(C, "{\"prompt\":[1,128]}", 400, "prompt", "outside the vocabulary [0, 128)");
    expect_error(C, "{\"prompt\":[1],\"stop_token_ids\":[500]}", 400, "stop_token_ids", "outside the vocabulary");
    expect_error(C, "{\"prompt\":\"hello\"}", 400, "prompt", "no tokenizer");
    expect_error(C, "{\"prompt\":[1],\"model\":\"gpt-4\"}", 404, "model", "does not exist");
    char big[1400];
    int at = snprintf(big, sizeof big, "{\"prompt\":[");
    for (int i = 0; i < 200; i++)
        at += snprintf(big + at, sizeof big - (size_t)at, i ? ",1" : "1");
    snprintf(big + at, sizeof big - (size_t)at, "],\"max_tokens\":3990}");
    expect_error(C, big, 400, "max_tokens", "maximum context length is 4096 tokens");
    /* 5 + 4000 - 1 tokens fit the context but need 251 blocks of 16; the cache has 192. */
    expect_error(C, "{\"prompt\":[1,2,3,4,5],\"max_tokens\":4000}", 400, "prompt", "the whole cache has 192");
    char *huge = malloc(70000);
    at = snprintf(huge, 70000, "{\"prompt\":[");
    for (int i = 0; at < 69000; i++)
        at += snprintf(huge + at, 70000 - (size_t)at, i ? ",1" : "1");
    snprintf(huge + at, 70000 - (size_t)at, "]}");
    expect_error(C, huge, 413, NULL, "exceeds 65536 bytes");
    at = snprintf(huge, 70000, "{\"prompt\":[");
    for (int i = 0; i < 513; i++)
        at += snprintf(huge + at, 70000 - (size_t)at, i ? ",1" : "1");
    snprintf(huge + at, 70000 - (size_t)at, "]}");
    expect_error(C, huge, 400, "prompt", "at most 512");
    free(huge);
    expect_error("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}", 400,
                 "messages", "--chat-template");
    expect_error("/v1/chat/completions", "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\",\"x\":1}]}", 400,
                 "messages[0].x", "unknown field");
    expect_error("/v1/embeddings", "{}", 404, NULL, "no such route");
    expect_error("/v1/models", "{}", 405, NULL, "GET");
    /* 401: no key, a wrong key; /health needs none. */
    int status;
    char *resp;
    assert_null(serve_client_fetch(server.port, "GET", "/v1/models", NULL, NULL, 10, &status, &resp));
    assert_int_equal(status, 401);
    assert_non_null(strstr(resp, "\"code\":\"invalid_api_key\""));
    free(resp);
    assert_null(serve_client_fetch(server.port, "POST", "/v1/completions", "Authorization: Bearer wrong\r\n",
                                   "{\"prompt\":[1]}", 10, &status, &resp));
    assert_int_equal(status, 401);
    free(resp);
    assert_null(serve_client_fetch(server.port, "GET", "/metrics", NULL, NULL, 10, &status, &resp));
    assert_int_equal(status, 401);
    free(resp);
    assert_null(serve_client_fetch(server.port, "GET", "/health", NULL, NULL, 10, &status, &resp));
    assert_int_equal(status, 200);
    free(resp);
    assert_true(st_metric(server.port, "dsc_http_requests_total") > 0);
    st_wait_idle(server.port);
}

/* ---- a client that leaves; a full server ---------------------------------------------------------- */
static serve_client *open_stream(int max_tokens, int rcvbuf) {
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":[3,1,4,1,5],\"max_tokens\":%d,\"temperature\":0,\"stream\":true}",
             max_tokens);
    serve_client *cl;
    dsc_status s = serve_client_open(server.port, "POST", "/v1/completions", ST_AUTH, body, 30.0, rcvbuf, &cl);
    if (s) fail_msg("%s", dsc_status_message(s));
    assert_int_equal(serve_client_status(cl), 200);
    return cl;
}

/* Several times, after 2..7 tokens: under pipeline parallelism the
 * sequence is released in flight or not depending on the tick it is
 * cancelled at, and either way its blocks must come back. */
static void test_disconnect_frees_blocks(void **state) {
    (void)state;
    enum { ROUNDS = 6 };
    double cancelled = st_metric(server.port, "dsc_sequences_cancelled_total");
    for (int round = 0; round < ROUNDS; round++) {
        serve_client *cl = open_stream(3000, 0);
        const char *data;
        for (int i = 0; i < 2 + round; i++) {
            assert_null(serve_client_event(cl, &data));
            assert_non_null(data);
        }
        double used = st_metric(server.port, "dsc_kv_blocks_used");
        printf("mid-stream after %d tokens: %g KV blocks used\n", 2 + round, used);
        assert_true(used > 0);
        serve_client_close(cl); /* leaves with ~2995 tokens to go */
        st_wait_idle(server.port);
        assert_true(st_metric(server.port, "dsc_sequences_cancelled_total") == cancelled + round + 1);
        assert_true(st_metric(server.port, "dsc_kv_blocks_used") == 0);
    }
    /* The cancel reached every rank's scheduler: the next request runs as on a fresh server. */
    int32_t prompt[] = {71, 69, 123, 44, 56}, expect[12];
    int32_t n = st_generate(prompt, 5, "--max-new-tokens 12 --stop 2", expect, 12);
    cJSON *r = post_json(
        "/v1/completions",
        "{\"prompt\":[71,69,123,44,56],\"max_tokens\":12,\"temperature\":0,\"return_token_ids\":true}", 200);
    const cJSON *ids = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "token_ids");
    assert_int_equal(cJSON_GetArraySize(ids), n);
    for (int32_t t = 0; t < n; t++)
        assert_int_equal(cJSON_GetArrayItem(ids, t)->valueint, expect[t]);
    cJSON_Delete(r);
}

static void test_full_server_429(void **state) {
    (void)state;
    enum { LIMIT = 12 };
    serve_client *slow[LIMIT];
    /* Clients that do not read hold their requests in flight (the server's send buffer is small). */
    for (int i = 0; i < LIMIT; i++)
        slow[i] = open_stream(2500, 4096);
    for (int i = 0; i < 1000 && st_metric(server.port, "dsc_num_requests_in_flight") < LIMIT; i++)
        usleep(10000);
    assert_true(st_metric(server.port, "dsc_num_requests_in_flight") == LIMIT);
    serve_client *cl;
    assert_null(
        serve_client_open(server.port, "POST", "/v1/completions", ST_AUTH, "{\"prompt\":[1]}", 10, 0, &cl));
    assert_int_equal(serve_client_status(cl), 429);
    const char *retry = serve_client_header(cl, "Retry-After");
    assert_non_null(retry);
    assert_string_equal(retry, "1");
    const char *b;
    size_t n;
    assert_null(serve_client_body(cl, &b, &n));
    assert_non_null(strstr(b, "\"type\":\"rate_limit_error\""));
    printf("429 with %d requests in flight: %s\n", LIMIT, b);
    serve_client_close(cl);
    for (int i = 0; i < LIMIT; i++)
        serve_client_close(slow[i]);
    st_wait_idle(server.port);
}

static void test_sigterm_exits_zero(void **state) {
    (void)state;
    assert_int_equal(st_stop(&server), 0);
}

int main(int argc, char **argv) {
    st_layout(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_dsc_generate), cmocka_unit_test(test_prompt_list_and_logprobs),
        cmocka_unit_test(test_bad_requests),         cmocka_unit_test(test_disconnect_frees_blocks),
        cmocka_unit_test(test_full_server_429),      cmocka_unit_test(test_sigterm_exits_zero)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
