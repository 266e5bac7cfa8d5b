/* The helpers of serve_test.h. */
#include "serve_test.h"

#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "serve/client.h"

#define FIXTURE DSC_SOURCE_DIR "/tests/inference/fixtures/hf/llama"

const char *st_model_dir(void) {
    static char dir[1024];
    if (dir[0]) return dir;
    snprintf(dir, sizeof dir, "%s/tests/serve/llama4k", DSC_BINARY_DIR);
    mkdir(dir, 0755);
    char path[1200], text[4096];
    FILE *f = fopen(FIXTURE "/config.json", "rb");
    assert_non_null(f);
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    char *at = strstr(text, "\"max_position_embeddings\": 64,");
    assert_non_null(at);
    /* Written under a private name and renamed: tests running at once share the directory. */
    char tmp[1300];
    snprintf(tmp, sizeof tmp, "%s/config.json.%d", dir, (int)getpid());
    f = fopen(tmp, "wb");
    assert_non_null(f);
    fprintf(f, "%.*s\"max_position_embeddings\": 4096,%s", (int)(at - text), text,
            at + strlen("\"max_position_embeddings\": 64,"));
    fclose(f);
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(rename(tmp, path), 0);
    snprintf(tmp, sizeof tmp, "%s/model.safetensors.%d", dir, (int)getpid());
    unlink(tmp);
    assert_int_equal(symlink(FIXTURE "/model.safetensors", tmp), 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(rename(tmp, path), 0);
    return dir;
}

int st_tp = 1, st_pp = 1;

void st_layout(int argc, char **argv) {
    if (argc > 1) st_tp = atoi(argv[1]);
    if (argc > 2) st_pp = atoi(argv[2]);
    assert_true((st_tp == 1 || st_tp == 2) && (st_pp == 1 || st_pp == 2));
}

int st_ranks(void) {
    return st_tp * st_pp;
}

const char *const *st_layout_args(const char **out, const char *const *args) {
    static char tp[16], pp[16];
    snprintf(tp, sizeof tp, "%d", st_tp);
    snprintf(pp, sizeof pp, "%d", st_pp);
    int n = 0;
    if (st_tp > 1) {
        out[n++] = "--tp";
        out[n++] = tp;
    }
    if (st_pp > 1) {
        out[n++] = "--pp";
        out[n++] = pp;
    }
    for (int i = 0; args[i]; i++)
        out[n++] = args[i];
    out[n] = NULL;
    return out;
}

const char *st_kv_bytes(void) {
    static char kv[32];
    snprintf(kv, sizeof kv, "%d", 786432 / (st_tp * st_pp));
    return kv;
}

void st_start_ranks(serve_proc *p, int ranks, bool merge_stderr, const char *const *extra) {
    st_start_model(p, st_model_dir(), ranks, merge_stderr, extra);
}

void st_start_model(serve_proc *p, const char *model, int ranks, bool merge_stderr, const char *const *extra) {
    char np[16];
    snprintf(np, sizeof np, "%d", ranks);
    const char *argv[64] = {"dsc-launch", "-n", np}, *app = DSC_BINARY_DIR "/bin/dsc-launch";
    int n = 3;
    if (ranks == 1) { /* dsc-serve alone */
        app = DSC_BINARY_DIR "/bin/dsc-serve";
        n = 0;
    }
    const char *base[] = {DSC_BINARY_DIR "/bin/dsc-serve", model, "--port", "0", "--api-key", ST_KEY};
    for (int i = 0; i < 6; i++)
        argv[n++] = base[i];
    for (int i = 0; extra && extra[i] && n < 63; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    dsc_status s = serve_proc_start(p, app, argv, 120.0, merge_stderr);
    if (s) fail_msg("%s", dsc_status_message(s));
    assert_int_equal(p->n_ranks, ranks);
}

void st_start(serve_proc *p, const char *const *extra) {
    st_start_ranks(p, 1, false, extra);
}

int st_signal_stop(serve_proc *p, int sig) {
    assert_int_equal(kill(p->ranks[0], sig), 0);
    int code;
    char out[4096];
    dsc_status s = serve_proc_wait(p, 60.0, &code, out, sizeof out);
    if (s) fail_msg("%s; it printed:\n%s", dsc_status_message(s), out);
    if (code != 0) printf("the server exited with %d; it printed:\n%s\n", code, out);
    return code;
}

int st_stop(serve_proc *p) {
    return st_signal_stop(p, SIGTERM);
}

int st_request(int port, const char *path, const char *body, char **resp) {
    int status = 0;
    dsc_status s = serve_client_fetch(port, body ? "POST" : "GET", path, ST_AUTH, body, 30.0, &status, resp);
    if (s) fail_msg("%s %s: %s", body ? "POST" : "GET", path, dsc_status_message(s));
    return status;
}

double st_metric(int port, const char *name) {
    char *text;
    assert_int_equal(st_request(port, "/metrics", NULL, &text), 200);
    size_t n = strlen(name);
    double v = -1;
    bool found = false;
    for (char *line = text; line && *line && !found; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
        if (strncmp(line, name, n) == 0 && (line[n] == '{' || line[n] == ' ')) {
            const char *sp = strchr(line, ' ');
            if (line[n] == '{') sp = strchr(strchr(line, '}'), ' ');
            v = strtod(sp, NULL);
            found = true;
        }
    free(text);
    if (!found) fail_msg("metric %s missing from /metrics", name);
    return v;
}

void st_wait_idle(int port) {
    for (int i = 0; i < 2000; i++) {
        if (st_metric(port, "dsc_num_requests_in_flight") == 0 &&
            st_metric(port, "dsc_num_requests_running") == 0 && st_metric(port, "dsc_num_requests_waiting") == 0 &&
            st_metric(port, "dsc_kv_blocks_used") == 0)
            return;
        usleep(10000);
    }
    fail_msg(
        "the server did not become idle within 20 s (in flight %g, running %g, waiting %g, KV blocks used %g)",
        st_metric(port, "dsc_num_requests_in_flight"), st_metric(port, "dsc_num_requests_running"),
        st_metric(port, "dsc_num_requests_waiting"), st_metric(port, "dsc_kv_blocks_used"));
}

int32_t st_generate(const int32_t *prompt, int32_t n_prompt, const char *options, int32_t *out, int32_t cap) {
    char cmd[4096];
    int at = snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s/bin/dsc-generate %s --quiet --tokens ",
                      DSC_BINARY_DIR, st_model_dir());
    for (int32_t i = 0; i < n_prompt; i++)
        at += snprintf(cmd + at, sizeof cmd - (size_t)at, i ? ",%d" : "%d", prompt[i]);
    snprintf(cmd + at, sizeof cmd - (size_t)at, " %s", options);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    int32_t n = 0, id;
    while (fscanf(f, "%d", &id) == 1)
        if (n < cap + n_prompt) {
            if (n >= n_prompt) out[n - n_prompt] = id;
            n++;
        }
    assert_int_equal(pclose(f), 0);
    assert_true(n >= n_prompt);
    return n - n_prompt;
}

void st_read_stream(serve_client *cl, st_stream *out) {
    *out = (st_stream){.prompt_tokens = -1, .completion_tokens = -1};
    const char *data;
    while (!serve_client_event(cl, &data) && data) {
        if (strcmp(data, "[DONE]") == 0) {
            out->done_seen = true;
            return;
        }
        cJSON *r = cJSON_Parse(data);
        const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0);
        const cJSON *u = cJSON_GetObjectItem(r, "usage"), *f = cJSON_GetObjectItem(choice, "finish_reason");
        if (choice) out->chunks++;
        const cJSON *ids = cJSON_GetObjectItem(choice, "token_ids");
        for (const cJSON *e = ids ? ids->child : NULL; e; e = e->next)
            if (out->n_ids < 64) out->ids[out->n_ids++] = (int32_t)e->valuedouble;
        if (cJSON_IsString(f)) snprintf(out->finish, sizeof out->finish, "%s", f->valuestring);
        if (cJSON_IsObject(u)) {
            out->prompt_tokens = cJSON_GetObjectItem(u, "prompt_tokens")->valueint;
            out->completion_tokens = cJSON_GetObjectItem(u, "completion_tokens")->valueint;
        }
        if (cJSON_GetObjectItem(r, "error")) out->error_seen = true;
        cJSON_Delete(r);
    }
}
