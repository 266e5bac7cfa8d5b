/* Units of dsc-serve's library, without HTTP: the built-in chat templates
 * equal jinja2's rendering of the families' own templates
 * (tests/ref/chat_template_ref.py) byte for byte; request parsing keeps
 * every implemented field and names the refused one; stop strings end the
 * text before them and hold back a possible beginning, UTF-8 split across
 * byte tokens is released whole; invalid UTF-8 is replaced for JSON; a
 * batch plan applied to a scheduler generates what direct submission does;
 * the Prometheus histogram is cumulative. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/chat_template.h"
#include "serve/metrics.h"
#include "serve/plan.h"
#include "serve/serve_internal.h"
#include "test_mpi.h"

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

static void test_chat_templates_match_jinja(void **state) {
    (void)state;
    char *text = read_file(DSC_SOURCE_DIR "/tests/serve/fixtures/chat_templates.json");
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    int n = 0;
    for (const cJSON *c = root->child; c; c = c->next, n++) {
        const cJSON *msgs = cJSON_GetObjectItem(c, "messages");
        serve_message m[8];
        int32_t k = 0;
        for (const cJSON *e = msgs->child; e; e = e->next, k++)
            m[k] = (serve_message){cJSON_GetObjectItem(e, "role")->valuestring,
                                   cJSON_GetObjectItem(e, "content")->valuestring};
        const serve_chat_template *t = serve_chat_template_find(cJSON_GetObjectItem(c, "template")->valuestring);
        assert_non_null(t);
        char *got;
        assert_ok(serve_chat_render(t, m, k, &got));
        assert_string_equal(got, cJSON_GetObjectItem(c, "text")->valuestring);
        free(got);
    }
    printf("%d renderings equal jinja2's\n", n);
    assert_true(n >= 10);
    cJSON_Delete(root);
    free(text);
    /* Mistral: a leading system message joins the first user turn; roles must alternate. */
    const serve_chat_template *mistral = serve_chat_template_find("mistral");
    serve_message sys[] = {{"system", "Be brief."}, {"user", "Hi"}};
    char *got;
    assert_ok(serve_chat_render(mistral, sys, 2, &got));
    assert_string_equal(got, "<s>[INST] Be brief.\n\nHi [/INST]");
    free(got);
    serve_message twice[] = {{"user", "a"}, {"user", "b"}};
    assert_err(serve_chat_render(mistral, twice, 2, &got), DSC_ERR_INVALID, "alternating");
    serve_message tool[] = {{"tool", "x"}};
    assert_err(serve_chat_render(serve_chat_template_find("chatml"), tool, 1, &got), DSC_ERR_INVALID,
               "messages[0].role");
    assert_null(serve_chat_template_find("vicuna"));
    assert_null(serve_chat_template_detect(NULL));
}

static void test_request_parse(void **state) {
    (void)state;
    serve_params p;
    serve_error err = {0};
    const char *ok =
        "{\"model\":\"m\",\"prompt\":[\"a\",[1,2]],\"max_tokens\":7,\"temperature\":0.5,\"top_p\":0.9,"
        "\"top_k\":-1,\"seed\":42,\"stop\":[\"x\",\"yz\"],\"stop_token_ids\":[3],\"n\":1,\"echo\":true,"
        "\"stream\":true,\"stream_options\":{\"include_usage\":true},\"repetition_penalty\":1.1,"
        "\"presence_penalty\":0,\"user\":\"u\",\"return_token_ids\":true}";
    assert_true(serve_params_parse(ok, strlen(ok), SERVE_KIND_COMPLETION, "m", &p, &err));
    assert_int_equal(p.n_prompts, 2);
    assert_string_equal(p.prompts[0].text, "a");
    assert_int_equal(p.prompts[1].n_ids, 2);
    assert_int_equal(p.prompts[1].ids[1], 2);
    assert_int_equal(p.max_tokens, 7);
    assert_true(p.sampling.temperature == 0.5f && p.sampling.top_p == 0.9f && p.sampling.top_k == 0);
    assert_true(p.sampling.repetition_penalty == 1.1f);
    assert_true(p.has_seed && p.seed == 42);
    assert_int_equal(p.n_stop, 2);
    assert_string_equal(p.stop[1], "yz");
    assert_int_equal(p.n_stop_ids, 1);
    assert_true(p.echo && p.stream && p.include_usage && p.return_token_ids);
    assert_int_equal(p.logprobs, -1);
    serve_params_free(&p);
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                       "{\"type\":\"text\",\"text\":\"b\"}]}],\"logprobs\":true,\"top_logprobs\":4,"
                       "\"max_completion_tokens\":9}";
    assert_true(serve_params_parse(chat, strlen(chat), SERVE_KIND_CHAT, "m", &p, &err));
    assert_string_equal(p.messages[0].content, "ab");
    assert_int_equal(p.logprobs, 4);
    assert_int_equal(p.max_tokens, 9);
    serve_params_free(&p);
    struct {
        serve_kind kind;
        const char *body, *param;
        int http;
    } bad[] = {
        {SERVE_KIND_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"top_logprobs\":2}",
         "top_logprobs", 400},
        {SERVE_KIND_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"echo\":true}", "echo", 400},
        {SERVE_KIND_CHAT, "{\"messages\":[]}", "messages", 400},
        {SERVE_KIND_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
         "messages[0].content", 400},
        {SERVE_KIND_COMPLETION, "{\"prompt\":[1],\"messages\":[]}", "messages", 400},
        {SERVE_KIND_COMPLETION, "{\"prompt\":[1],\"seed\":-1}", "seed", 400},
        {SERVE_KIND_COMPLETION, "{\"prompt\":[1],\"stop\":\"\"}", "stop", 400},
        {SERVE_KIND_COMPLETION, "{\"prompt\":[1,-4]}", "prompt", 400},
        {SERVE_KIND_COMPLETION, "{\"prompt\":[1],\"model\":\"other\"}", "model", 404},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_false(serve_params_parse(bad[i].body, strlen(bad[i].body), bad[i].kind, "m", &p, &err));
        assert_string_equal(err.param, bad[i].param);
        assert_int_equal(err.http, bad[i].http);
        serve_params_free(&p);
    }
}

/* Feeds bytes as byte-tokenizer ids; returns the visible text after each. */
static void feed(serve_text *t, const dsc_tokenizer *tok, const char *bytes, char *const *stop, int32_t n_stop,
                 const size_t *visible_after, bool *stopped) {
    for (size_t i = 0; bytes[i]; i++) {
        assert_ok(serve_text_append(t, tok, (unsigned char)bytes[i], false, false, stop, n_stop, stopped));
        assert_int_equal(t->visible, visible_after[i]);
        if (*stopped) return;
    }
}

static void test_stop_strings_and_utf8(void **state) {
    (void)state;
    dsc_tokenizer *tok;
    assert_ok(dsc_tokenizer_create_bytes(&tok));
    char *stop[] = {"</end>", "zz"};
    serve_text t = {0};
    bool stopped;
    /* "<" may begin "</end>": held until "b" shows it does not. */
    const size_t v1[] = {1, 1, 3};
    feed(&t, tok, "a<b", stop, 2, v1, &stopped);
    assert_false(stopped);
    const size_t v2[] = {3, 3, 3, 3, 3, 3};
    feed(&t, tok, "</end>", stop, 2, v2, &stopped);
    assert_true(stopped);
    assert_string_equal(t.all, "a<b");
    serve_text_free(&t);
    /* The last token releases what was held. */
    assert_ok(serve_text_append(&t, tok, 'z', false, true, stop, 2, &stopped));
    assert_false(stopped);
    assert_int_equal(t.visible, 1);
    serve_text_free(&t);
    /* "é" (C3 A9) split across two byte tokens comes out whole; a stop token is silent. */
    assert_ok(serve_text_append(&t, tok, 0xC3, false, false, NULL, 0, &stopped));
    assert_int_equal(t.len, 0);
    assert_ok(serve_text_append(&t, tok, 0xA9, false, false, NULL, 0, &stopped));
    assert_int_equal(t.len, 2);
    assert_string_equal(t.all, "\xC3\xA9");
    assert_ok(serve_text_append(&t, tok, 'q', true, true, NULL, 0, &stopped));
    assert_int_equal(t.visible, 2);
    serve_text_free(&t);
    char *clean = serve_utf8_clean("a\xC3\x28z\xF0\x9F\x98\x80", 8);
    assert_string_equal(clean, "a\xEF\xBF\xBD(z\xF0\x9F\x98\x80");
    free(clean);
    dsc_tokenizer_destroy(tok);
}

typedef struct sink {
    int32_t tokens[4][16];
    int n[4];
} sink;

static dsc_status to_sink(void *user, uint64_t uid, int32_t token, bool finished) {
    (void)finished;
    sink *k = user;
    k->tokens[uid][k->n[uid]++] = token;
    return NULL;
}

static void test_plan_applies_like_direct_submission(void **state) {
    (void)state;
    dsc_infer_model *m;
    assert_ok(dsc_infer_model_load(DSC_SOURCE_DIR "/tests/inference/fixtures/hf/llama", &m));
    dsc_infer_engine *e;
    dsc_infer_engine_config ec = dsc_infer_engine_config_default(m);
    assert_ok(dsc_infer_engine_create(m, &ec, &e));
    dsc_scheduler_config sc = dsc_scheduler_config_default(e);
    sink direct = {0}, planned = {0};
    dsc_scheduler *a, *b;
    assert_ok(dsc_scheduler_create(e, &sc, to_sink, &direct, &a));
    int32_t prompt[4][5] = {{1, 2, 3}, {9, 9, 9, 9, 9}, {40}, {7, 70}}, n_prompt[4] = {3, 5, 1, 2}, stop = 5;
    serve_plan plan = {0};
    for (int i = 0; i < 4; i++) {
        dsc_gen_request r = {.uid = (uint64_t)i,
                             .prompt = prompt[i],
                             .n_prompt = n_prompt[i],
                             .max_new_tokens = 12,
                             .sampling = {.temperature = 0.9f, .top_k = 0, .top_p = 1, .repetition_penalty = 1},
                             .seed = 100 + (uint64_t)i,
                             .stop_tokens = &stop,
                             .n_stop = 1};
        assert_ok(dsc_scheduler_submit(a, &r));
        assert_ok(serve_plan_add_submit(&plan, &r, -1));
    }
    memset(prompt, 0, sizeof prompt); /* the plan holds its own copies */
    assert_ok(dsc_scheduler_run(a));
    assert_ok(dsc_scheduler_create(e, &sc, to_sink, &planned, &b));
    serve_plan_channel ch = serve_plan_channel_single();
    assert_ok(ch.exchange(ch.impl, &plan));
    assert_ok(serve_plan_apply(&plan, b, NULL, NULL));
    assert_ok(dsc_scheduler_run(b));
    assert_memory_equal(&direct, &planned, sizeof direct);
    serve_plan_clear(&plan);
    for (uint64_t i = 0; i < 4; i++)
        assert_ok(serve_plan_add_cancel(&plan, i));
    assert_ok(serve_plan_apply(&plan, b, NULL, NULL));
    assert_int_equal(dsc_scheduler_get_counts(b).finished, 0);
    assert_err(serve_plan_apply(&plan, b, NULL, NULL), DSC_ERR_INVALID, "unknown request 0");
    serve_plan_free(&plan);
    dsc_scheduler_destroy(a);
    dsc_scheduler_destroy(b);
    dsc_infer_engine_destroy(e);
    dsc_infer_model_destroy(m);
}

static void test_metrics_text(void **state) {
    (void)state;
    serve_metrics m = {.kv_total = 10, .kv_used = 4};
    serve_hist_observe(&m.ttft, 0.003);
    serve_hist_observe(&m.ttft, 0.2);
    serve_hist_observe(&m.ttft, 100.0);
    serve_metrics_count_status(&m, 429);
    serve_metrics_count_status(&m, 418);
    serve_buf b = {0};
    serve_metrics_render(&m, "x", &b);
    assert_false(b.oom);
    assert_non_null(strstr(b.p, "dsc_time_to_first_token_seconds_bucket{model=\"x\",le=\"0.0025\"} 0\n"));
    assert_non_null(strstr(b.p, "dsc_time_to_first_token_seconds_bucket{model=\"x\",le=\"0.005\"} 1\n"));
    assert_non_null(strstr(b.p, "dsc_time_to_first_token_seconds_bucket{model=\"x\",le=\"0.25\"} 2\n"));
    assert_non_null(strstr(b.p, "dsc_time_to_first_token_seconds_bucket{model=\"x\",le=\"+Inf\"} 3\n"));
    assert_non_null(strstr(b.p, "dsc_time_to_first_token_seconds_count{model=\"x\"} 3\n"));
    assert_non_null(strstr(b.p, "dsc_http_requests_total{model=\"x\",status=\"429\"} 1\n"));
    assert_non_null(strstr(b.p, "dsc_http_requests_total{model=\"x\",status=\"other\"} 1\n"));
    assert_non_null(strstr(b.p, "dsc_kv_blocks_free{model=\"x\"} 6\n"));
    serve_buf_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chat_templates_match_jinja), cmocka_unit_test(test_request_parse),
        cmocka_unit_test(test_stop_strings_and_utf8), cmocka_unit_test(test_plan_applies_like_direct_submission),
        cmocka_unit_test(test_metrics_text)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
