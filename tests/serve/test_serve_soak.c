/* A short soak of dsc-serve, on one rank or (arguments TP [PP]) on several
 * under dsc-launch: the load generator sends 1500 streaming
 * requests (16 at a time, random prompts and lengths, 30% of the clients
 * leaving after 1..4 tokens) in at most 45 s. Afterwards no request is in
 * flight, no sequence queued or running, no KV block used; every request
 * either completed or was abandoned by its client (none failed); and the
 * resident memory of every rank is what it was after a warm-up of the
 * same kind (within 8 MiB + 10%). */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "serve/loadgen.h"
#include "serve_test.h"

static serve_load_result load(int port, int32_t requests, uint64_t seed) {
    serve_load_config c = {.port = port,
                           .headers = ST_AUTH,
                           .concurrency = 16,
                           .requests = requests,
                           .time_limit_s = 45.0,
                           .disconnect_fraction = 0.3,
                           .vocab = 128,
                           .prompt_min = 1,
                           .prompt_max = 24,
                           .tokens_min = 1,
                           .tokens_max = 48,
                           .seed = seed};
    serve_load_result r;
    dsc_status s = serve_load_run(&c, &r);
    if (s) fail_msg("%s", dsc_status_message(s));
    printf("%lld sent: %lld completed, %lld left early, %lld rejected, %lld failed; %lld tokens in %.1f s "
           "(%.0f tokens/s); TTFT p50 %.1f ms p99 %.1f ms; ITL p50 %.2f ms p99 %.2f ms%s%s\n",
           (long long)r.sent, (long long)r.completed, (long long)r.disconnected, (long long)r.rejected,
           (long long)r.failed, (long long)r.tokens, r.elapsed_s, (double)r.tokens / r.elapsed_s, 1e3 * r.ttft[0],
           1e3 * r.ttft[2], 1e3 * r.itl[0], 1e3 * r.itl[2], r.first_error[0] ? "; first error: " : "",
           r.first_error);
    assert_int_equal(r.failed, 0);
    assert_int_equal(r.rejected, 0);
    assert_int_equal(r.completed + r.disconnected, r.sent);
    return r;
}

static void test_soak(void **state) {
    (void)state;
    serve_proc p;
    const char *args[12];
    st_start_ranks(
        &p, st_ranks(), false,
        st_layout_args(args, (const char *[]){"--max-num-seqs", "16", "--kv-cache-bytes", st_kv_bytes(), NULL}));
    load(p.port, 200, 1);
    st_wait_idle(p.port);
    long before[SERVE_PROC_MAX_RANKS];
    for (int k = 0; k < p.n_ranks; k++)
        before[k] = serve_proc_rss_kib(p.ranks[k]);
    double cancelled0 = st_metric(p.port, "dsc_sequences_cancelled_total");
    serve_load_result r = load(p.port, 1500, 2);
    st_wait_idle(p.port);
    double cancelled = st_metric(p.port, "dsc_sequences_cancelled_total") - cancelled0;
    printf("%g sequences cancelled by clients leaving\n", cancelled);
    assert_true(r.sent >= 300); /* the time limit did not cut the soak to nothing */
    assert_true(cancelled > 0 && cancelled <= (double)r.disconnected);
    for (int k = 0; k < p.n_ranks; k++) {
        long after = serve_proc_rss_kib(p.ranks[k]);
        printf("rank %d: RSS %ld KiB after the warm-up, %ld KiB after the soak\n", k, before[k], after);
        assert_true(before[k] > 0 && after > 0);
        assert_true(after - before[k] < 8192 + before[k] / 10);
    }
    assert_int_equal(st_stop(&p), 0);
}

int main(int argc, char **argv) {
    st_layout(argc, argv);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_soak)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
