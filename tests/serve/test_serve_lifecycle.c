/* dsc-serve's shutdown: SIGTERM with requests in flight stops new
 * connections, lets every in-flight request (streaming or not) finish
 * normally, and exits 0; with a short --drain-timeout the requests still
 * running are cancelled instead (streams end with finish_reason "abort",
 * an error event and [DONE]; waiting JSON requests get 503), the KV blocks
 * are freed, and the exit is 0 too. */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
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

typedef struct call {
    int port, max_tokens;
    bool stream;
    int status, completion_tokens, tokens_seen;
    bool done_seen, error_seen;
    char finish[16];
} call;

static void *run_call(void *arg) {
    call *c = arg;
    char body[256];
    snprintf(body, sizeof body, "{\"prompt\":[3,1,4,1,5],\"max_tokens\":%d,\"temperature\":0,\"stream\":%s}",
             c->max_tokens, c->stream ? "true,\"stream_options\":{\"include_usage\":true}" : "false");
    serve_client *cl;
    if (serve_client_open(c->port, "POST", "/v1/completions", ST_AUTH, body, 60.0, 0, &cl)) return NULL;
    c->status = serve_client_status(cl);
    if (!c->stream || c->status != 200) {
        const char *b;
        size_t n;
        cJSON *r = serve_client_body(cl, &b, &n) ? NULL : cJSON_Parse(b);
        const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0);
        const cJSON *f = cJSON_GetObjectItem(choice, "finish_reason");
        const cJSON *u = cJSON_GetObjectItem(cJSON_GetObjectItem(r, "usage"), "completion_tokens");
        if (cJSON_IsString(f)) snprintf(c->finish, sizeof c->finish, "%s", f->valuestring);
        c->completion_tokens = cJSON_IsNumber(u) ? u->valueint : -1;
        c->error_seen = cJSON_GetObjectItem(r, "error") != NULL;
        cJSON_Delete(r);
        serve_client_close(cl);
        return NULL;
    }
    st_stream st;
    st_read_stream(cl, &st);
    c->tokens_seen = st.chunks;
    c->completion_tokens = st.completion_tokens;
    c->done_seen = st.done_seen;
    c->error_seen = st.error_seen;
    snprintf(c->finish, sizeof c->finish, "%s", st.finish);
    serve_client_close(cl);
    return NULL;
}

enum { N = 4 };

/* Starts N requests of max_tokens (even ones streaming), waits until all
 * are in flight, then sends SIGTERM; returns after the calls ended. */
static void sigterm_during(serve_proc *p, call *calls, int max_tokens) {
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        calls[i] = (call){.port = p->port, .max_tokens = max_tokens, .stream = i % 2 == 0};
        assert_int_equal(pthread_create(&th[i], NULL, run_call, &calls[i]), 0);
        usleep(20000); /* queued in this order */
    }
    for (int i = 0; i < 1000 && st_metric(p->port, "dsc_num_requests_in_flight") < N; i++)
        usleep(10000);
    assert_true(st_metric(p->port, "dsc_num_requests_in_flight") == N);
    assert_int_equal(kill(p->pid, SIGTERM), 0);
    usleep(300000);
    /* No new connection is accepted once draining. */
    int status;
    char *resp = NULL;
    dsc_status s = serve_client_fetch(p->port, "GET", "/health", NULL, NULL, 5, &status, &resp);
    assert_true(s != NULL || status == 503);
    dsc_status_free(s);
    free(resp);
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
}

static void test_sigterm_finishes_in_flight(void **state) {
    (void)state;
    serve_proc p;
    const char *args[] = {"--kv-cache-bytes", "786432", "--drain-timeout", "120", NULL};
    st_start(&p, args);
    call calls[N];
    sigterm_during(&p, calls, 1500); /* two at a time in the cache, far below the drain timeout even when loaded */
    for (int i = 0; i < N; i++) {
        printf("call %d (%s): status %d, %d tokens, finish %s\n", i, calls[i].stream ? "stream" : "json",
               calls[i].status, calls[i].completion_tokens, calls[i].finish);
        assert_int_equal(calls[i].status, 200);
        assert_false(calls[i].error_seen);
        assert_true(strcmp(calls[i].finish, "length") == 0 || strcmp(calls[i].finish, "stop") == 0);
        assert_true(calls[i].completion_tokens > 0);
        if (calls[i].stream) {
            assert_true(calls[i].done_seen);
            assert_int_equal(calls[i].tokens_seen, calls[i].completion_tokens);
        }
    }
    assert_int_equal(calls[0].completion_tokens, calls[1].completion_tokens); /* same greedy request */
    assert_int_equal(st_stop(&p), 0);
}

static void test_drain_timeout_cancels(void **state) {
    (void)state;
    serve_proc p;
    const char *args[] = {"--kv-cache-bytes", "786432", "--drain-timeout", "0.2", NULL};
    st_start(&p, args);
    call calls[N];
    sigterm_during(&p, calls, 3000);
    int cancelled = 0;
    for (int i = 0; i < N; i++) {
        printf("call %d (%s): status %d, %d tokens seen, finish %s%s\n", i, calls[i].stream ? "stream" : "json",
               calls[i].status, calls[i].tokens_seen, calls[i].finish, calls[i].error_seen ? ", error" : "");
        if (calls[i].stream) {
            assert_int_equal(calls[i].status, 200);
            assert_true(calls[i].done_seen);
            cancelled += strcmp(calls[i].finish, "abort") == 0 && calls[i].error_seen;
        } else {
            cancelled += calls[i].status == 503 && calls[i].error_seen;
        }
    }
    /* 4 requests of 3000 tokens, one at a time in a 192-block cache: the later ones cannot finish in 0.2 s. */
    assert_true(cancelled >= 2);
    assert_int_equal(st_stop(&p), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sigterm_finishes_in_flight),
                                       cmocka_unit_test(test_drain_timeout_cancels)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
