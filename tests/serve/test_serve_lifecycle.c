/* dsc-serve's shutdown, on one rank or (arguments TP [PP]) on several
 * ranks under dsc-launch: SIGTERM to rank 0 (or to dsc-launch, which passes
 * it to every rank as SIGUSR2) with requests in flight stops
 * new connections, lets every in-flight request (streaming or not) finish
 * normally, and every rank exits 0 (the launcher too); SIGINT with a short
 * --drain-timeout cancels the requests still running instead (streams end
 * with finish_reason "abort", an error event and [DONE]; waiting JSON
 * requests get 503), and the exit is 0 too. On several ranks, a rank killed
 * mid-stream ends the server: the launcher exits non-zero naming that rank;
 * so does a rank whose engine fails (pipeline-parallel failpoint).
 * Every wait is on a condition (metrics, the health route, the process's
 * exit), bounded by a deadline, never a fixed sleep. */
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
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

/* Until /health answers 503 or refuses the connection: the server drains (bounded). */
static void wait_draining(int port) {
    for (int i = 0; i < 3000; i++) {
        int status = 0;
        char *resp = NULL;
        dsc_status s = serve_client_fetch(port, "GET", "/health", NULL, NULL, 5, &status, &resp);
        bool draining = s != NULL || status == 503;
        dsc_status_free(s);
        free(resp);
        if (draining) return;
        assert_int_equal(status, 200);
        usleep(10000);
    }
    fail_msg("the server still accepted requests 30 s after the signal");
}

/* Starts N requests of max_tokens (even ones streaming), waits until all
 * are in flight, then sends sig to `target` (rank 0, or the launcher) and
 * waits until the server refuses new connections; returns after the calls
 * ended. */
static void signal_during(serve_proc *p, pid_t target, call *calls, int max_tokens, int sig) {
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        calls[i] = (call){.port = p->port, .max_tokens = max_tokens, .stream = i % 2 == 0};
        assert_int_equal(pthread_create(&th[i], NULL, run_call, &calls[i]), 0);
    }
    for (int i = 0; i < 6000 && st_metric(p->port, "dsc_num_requests_in_flight") < N; i++)
        usleep(10000);
    assert_true(st_metric(p->port, "dsc_num_requests_in_flight") == N);
    assert_int_equal(kill(target, sig), 0);
    wait_draining(p->port);
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
}

static void test_sigterm_finishes_in_flight(void **state) {
    (void)state;
    serve_proc p;
    const char *args[12];
    st_start_ranks(
        &p, st_ranks(), false,
        st_layout_args(args, (const char *[]){"--kv-cache-bytes", st_kv_bytes(), "--drain-timeout", "600", NULL}));
    call calls[N];
    /* Two at a time in the cache on one rank, far below the drain timeout; fewer tokens on slower ranks. */
    signal_during(&p, p.ranks[0], calls, st_ranks() == 1 ? 1500 : 400, SIGTERM);
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
    int code;
    char out[4096];
    assert_null(serve_proc_wait(&p, 60.0, &code, out, sizeof out)); /* it exits by itself once drained */
    assert_int_equal(code, 0);
}

static void test_drain_timeout_cancels(void **state) {
    (void)state;
    serve_proc p;
    const char *args[12];
    st_start_ranks(
        &p, st_ranks(), false,
        st_layout_args(args, (const char *[]){"--kv-cache-bytes", st_kv_bytes(), "--drain-timeout", "0.2", NULL}));
    call calls[N];
    signal_during(&p, p.ranks[0], calls, 3000, SIGINT);
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
    /* 4 requests of 3000 tokens, one at a time in 192 blocks: the later ones cannot finish in 0.2 s. */
    assert_true(cancelled >= 2);
    int code;
    char out[4096];
    assert_null(serve_proc_wait(&p, 60.0, &code, out, sizeof out));
    assert_int_equal(code, 0);
}

/* Whether pid has a handler for sig (/proc/PID/status, SigCgt). */
static bool catches(pid_t pid, int sig) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    unsigned long long mask = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "SigCgt: %llx", &mask) == 1) break;
    if (f) fclose(f);
    return (mask >> (sig - 1)) & 1;
}

/* One rank: SIGTERM as soon as dsc-serve has its handler, long before it
 * listens (MPI_Init and the model load come after): the signal is kept, the
 * server starts, drains at once and exits 0, instead of losing the signal
 * (and serving on) or dying of it. */
static void test_sigterm_while_starting(void **state) {
    (void)state;
    if (st_ranks() > 1) skip();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        execl(DSC_BINARY_DIR "/bin/dsc-serve", "dsc-serve", st_model_dir(), "--port", "0", (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 20000 && !catches(pid, SIGTERM); i++) /* at most 20 s */
        usleep(1000);
    assert_true(catches(pid, SIGTERM));
    assert_int_equal(kill(pid, SIGTERM), 0);
    int status = 0;
    pid_t done = 0;
    for (int i = 0; i < 6000 && done == 0; i++) { /* at most 60 s */
        done = waitpid(pid, &status, WNOHANG);
        if (done == 0) usleep(10000);
    }
    if (done == 0) kill(pid, SIGKILL);
    if (done == 0) fail_msg("dsc-serve still ran 60 s after a SIGTERM while it started: the signal was lost");
    assert_int_equal(done, pid);
    if (WIFSIGNALED(status)) fail_msg("dsc-serve died of signal %d", WTERMSIG(status));
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

/* Several ranks: SIGTERM to dsc-launch reaches every rank as SIGUSR2 (the
 * launcher asks mpirun to pass it on), which drains as SIGTERM to rank 0
 * does: the in-flight requests finish, every rank exits 0 and so does the
 * launcher, saying so. With `drain_timeout` "0.2" the requests still running
 * are cancelled instead and the exits are 0 all the same. */
static void sigterm_to_launcher(const char *drain_timeout, int max_tokens) {
    if (st_ranks() == 1) skip();
    serve_proc p;
    const char *args[12];
    st_start_ranks(&p, st_ranks(), true,
                   st_layout_args(args, (const char *[]){"--kv-cache-bytes", st_kv_bytes(), "--drain-timeout",
                                                         drain_timeout, NULL}));
    call calls[N];
    signal_during(&p, p.pid, calls, max_tokens, SIGTERM);
    int finished = 0, cancelled = 0;
    for (int i = 0; i < N; i++) {
        printf("call %d (%s): status %d, %d tokens, finish %s%s\n", i, calls[i].stream ? "stream" : "json",
               calls[i].status, calls[i].stream ? calls[i].tokens_seen : calls[i].completion_tokens,
               calls[i].finish, calls[i].error_seen ? ", error" : "");
        if (calls[i].stream) {
            assert_int_equal(calls[i].status, 200);
            assert_true(calls[i].done_seen); /* ended properly, not broken off by a killed rank */
        }
        bool complete = calls[i].status == 200 && !calls[i].error_seen && strcmp(calls[i].finish, "length") == 0 &&
                        calls[i].completion_tokens == max_tokens;
        finished += complete;
        cancelled += calls[i].error_seen &&
                     (calls[i].stream ? strcmp(calls[i].finish, "abort") == 0 : calls[i].status == 503);
    }
    int code;
    char out[16384];
    assert_null(serve_proc_wait(&p, 90.0, &code, out, sizeof out));
    printf("launcher exit %d; it printed:\n%s\n", code, out);
    assert_int_equal(code, 0);
    if (!strstr(out, "dsc-launch: every rank stopped and exited 0 after signal 15"))
        fail_msg("the launcher did not report a clean stop");
    assert_null(strstr(out, "job failed"));
    for (int r = 0; r < p.n_ranks; r++)
        assert_int_not_equal(kill(p.ranks[r], 0), 0); /* gone (and reaped) */
    if (strcmp(drain_timeout, "600") == 0)
        assert_int_equal(finished, N);
    else
        assert_true(cancelled >= 2); /* 4 x 3000 tokens, one at a time in 192 blocks */
}

static void test_sigterm_to_launcher_drains(void **state) {
    (void)state;
    sigterm_to_launcher("600", 300);
}

static void test_sigterm_to_launcher_drain_timeout(void **state) {
    (void)state;
    sigterm_to_launcher("0.2", 3000);
}

/* Several ranks: the last rank killed while a stream is running. */
static void test_rank_failure_named(void **state) {
    (void)state;
    int ranks = st_ranks();
    if (ranks == 1) skip();
    serve_proc p;
    const char *args[12];
    st_start_ranks(&p, st_ranks(), true, st_layout_args(args, (const char *[]){NULL}));
    call c = {.port = p.port, .max_tokens = 3000, .stream = true};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, run_call, &c), 0);
    for (int i = 0; i < 6000 && st_metric(p.port, "dsc_num_requests_running") < 1; i++)
        usleep(10000);
    assert_true(st_metric(p.port, "dsc_num_requests_running") == 1);
    assert_int_equal(kill(p.ranks[ranks - 1], SIGKILL), 0);
    int code;
    char out[16384];
    assert_null(serve_proc_wait(&p, 60.0, &code, out, sizeof out));
    pthread_join(th, NULL);
    printf("launcher exit %d; stream: %d tokens, finish \"%s\", [DONE] %s\n", code, c.tokens_seen, c.finish,
           c.done_seen ? "seen" : "not seen");
    char named[64];
    snprintf(named, sizeof named, "job failed: rank %d killed by signal 9", ranks - 1);
    if (!strstr(out, named)) fail_msg("the launcher did not say \"%s\"; it printed:\n%s", named, out);
    assert_int_not_equal(code, 0);
    assert_false(c.done_seen); /* the stream broke off: it did not end as if complete */
}

/* Pipeline-parallel: the last rank returns an error mid-stream (the engine's
 * failpoint serve_error:R:K, at its tick 40): it prints "dsc-serve: rank R:
 * <why>" and aborts the job rather than leave its peers waiting for its
 * stage; the launcher exits non-zero naming the rank and the reason. */
static void test_rank_error_named(void **state) {
    (void)state;
    if (st_pp == 1) skip(); /* the failpoint is the pipeline's */
    int ranks = st_ranks();
    char failpoint[64];
    snprintf(failpoint, sizeof failpoint, "serve_error:%d:40", ranks - 1);
    assert_int_equal(setenv("DSC_FAILPOINT", failpoint, 1), 0);
    serve_proc p;
    const char *args[12];
    st_start_ranks(&p, ranks, true, st_layout_args(args, (const char *[]){NULL}));
    unsetenv("DSC_FAILPOINT");
    call c = {.port = p.port, .max_tokens = 3000, .stream = true};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, run_call, &c), 0);
    int code;
    char out[16384];
    assert_null(serve_proc_wait(&p, 60.0, &code, out, sizeof out));
    pthread_join(th, NULL);
    printf("launcher exit %d; stream: %d tokens, [DONE] %s\n", code, c.tokens_seen,
           c.done_seen ? "seen" : "not seen");
    char said[64], named[64];
    snprintf(said, sizeof said, "dsc-serve: rank %d: ", ranks - 1);
    snprintf(named, sizeof named, "job failed: rank %d", ranks - 1);
    if (!strstr(out, said) || !strstr(out, named) ||
        !strstr(out, "simulated failure of pipeline stage 1 at tick 40"))
        fail_msg("the rank and the launcher did not name rank %d and its error; they printed:\n%s", ranks - 1,
                 out);
    assert_int_not_equal(code, 0);
    assert_false(c.done_seen);
}

int main(int argc, char **argv) {
    st_layout(argc, argv);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_sigterm_finishes_in_flight),
                                       cmocka_unit_test(test_drain_timeout_cancels),
                                       cmocka_unit_test(test_sigterm_to_launcher_drains),
                                       cmocka_unit_test(test_sigterm_to_launcher_drain_timeout),
                                       cmocka_unit_test(test_rank_failure_named),
                                       cmocka_unit_test(test_sigterm_while_starting),
                                       cmocka_unit_test(test_rank_error_named)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
