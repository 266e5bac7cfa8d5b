/* dsc-serve with text: the gpt-moe checkpoint that test_dsc_moe trains
 * (byte tokenizer) serves "ROMEO:" with the same greedy continuation that
 * dsc-generate prints (MODEL/expected.txt), as JSON with echo and as a
 * stream whose chunks concatenate to the same text; a stop string ends the
 * text just before it (finish_reason stop); chat through --chat-template
 * phi-3 counts the rendered template's bytes as prompt tokens and stops
 * at the template's end-of-turn text (the model's context is 48). Arguments: the checkpoint directory, then
 * optionally TP PP EP: the server runs on TP x PP x EP ranks under dsc-launch (experts split over EP
 * replicas of each stage's TP group) and must serve the same text as dsc-generate on one rank. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "serve/client.h"
#include "serve_test.h"

static const char *model_dir;
static const char *layout[3] = {"1", "1", "1"}; /* --tp, --pp, --ep */
static serve_proc server;

static cJSON *post(const char *path, const char *body) {
    char *resp;
    int status = st_request(server.port, path, body, &resp);
    if (status != 200) fail_msg("%s: status %d: %s", body, status, resp);
    cJSON *r = cJSON_Parse(resp);
    free(resp);
    assert_non_null(r);
    return r;
}

static const cJSON *choice0(const cJSON *r) {
    return cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0);
}

static void test_text(void **state) {
    (void)state;
    char path[1024], expected[4096];
    snprintf(path, sizeof path, "%s/expected.txt", model_dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = fread(expected, 1, sizeof expected - 1, f);
    fclose(f);
    expected[n] = '\0';
    if (n && expected[n - 1] == '\n') expected[--n] = '\0'; /* dsc-generate ends its line */
    const char *args[] = {"--served-model-name",
                          "gpt-moe",
                          "--chat-template",
                          "phi-3",
                          "--tp",
                          layout[0],
                          "--pp",
                          layout[1],
                          "--ep",
                          layout[2],
                          NULL};
    st_start_model(&server, model_dir, atoi(layout[0]) * atoi(layout[1]) * atoi(layout[2]), false, args);

    cJSON *r =
        post("/v1/completions", "{\"prompt\":\"ROMEO:\",\"max_tokens\":20,\"temperature\":0,\"echo\":true}");
    const char *text = cJSON_GetObjectItem(choice0(r), "text")->valuestring;
    printf("served: %s\n", text);
    assert_string_equal(text, expected);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "usage"), "prompt_tokens")->valueint, 6);
    cJSON_Delete(r);

    serve_client *cl;
    assert_null(serve_client_open(server.port, "POST", "/v1/completions", ST_AUTH,
                                  "{\"prompt\":\"ROMEO:\",\"max_tokens\":20,\"temperature\":0,\"stream\":true}",
                                  30, 0, &cl));
    char streamed[4096] = "ROMEO:";
    int chunks = 0;
    const char *data;
    while (!serve_client_event(cl, &data) && data && strcmp(data, "[DONE]") != 0) {
        cJSON *c = cJSON_Parse(data);
        strcat(streamed, cJSON_GetObjectItem(choice0(c), "text")->valuestring);
        chunks++;
        cJSON_Delete(c);
    }
    serve_client_close(cl);
    assert_int_equal(chunks, 20);
    assert_string_equal(streamed, expected);

    /* Stop at the continuation's bytes 4..6: the text is the 3 bytes before them. */
    char body[512], stop[4] = {0};
    memcpy(stop, expected + 6 + 3, 3);
    cJSON *esc = cJSON_CreateString(stop);
    char *stop_json = cJSON_PrintUnformatted(esc);
    snprintf(body, sizeof body, "{\"prompt\":\"ROMEO:\",\"max_tokens\":20,\"temperature\":0,\"stop\":%s}",
             stop_json);
    free(stop_json);
    cJSON_Delete(esc);
    r = post("/v1/completions", body);
    text = cJSON_GetObjectItem(choice0(r), "text")->valuestring;
    const char *first = strstr(expected + 6, stop);
    assert_int_equal(strlen(text), (size_t)(first - (expected + 6)));
    assert_memory_equal(text, expected + 6, strlen(text));
    assert_string_equal(cJSON_GetObjectItem(choice0(r), "finish_reason")->valuestring, "stop");
    cJSON_Delete(r);

    /* Chat: the Phi-3 prompt is plain bytes here; <|end|> becomes a stop string. */
    r = post("/v1/chat/completions",
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":8,\"temperature\":0}");
    const char *prompt = "<|user|>\nHi<|end|>\n<|assistant|>\n";
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(r, "usage"), "prompt_tokens")->valueint,
                     (int)strlen(prompt));
    const cJSON *msg = cJSON_GetObjectItem(choice0(r), "message");
    assert_string_equal(cJSON_GetObjectItem(msg, "role")->valuestring, "assistant");
    assert_null(strstr(cJSON_GetObjectItem(msg, "content")->valuestring, "<|end|>"));
    assert_string_equal(cJSON_GetObjectItem(r, "object")->valuestring, "chat.completion");
    cJSON_Delete(r);
    assert_int_equal(st_stop(&server), 0);
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 5) return 2;
    model_dir = argv[1];
    for (int i = 0; argc == 5 && i < 3; i++)
        layout[i] = argv[2 + i];
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_text)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
