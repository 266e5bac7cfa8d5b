/* The communicator's watchdog on one machine: a timed-out wait names the
 * peers that had not answered and their hosts, tells a peer that is still
 * behind (waiting elsewhere) from one that is silent, and dsc_comm_host gives
 * every rank's host. The same messages across real hosts are checked by
 * test_multihost.sh. Timeouts are short (0.5 s); every wait here either
 * completes or is meant to time out, so nothing depends on speed. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "dsc/comm.h"
#include "test_mpi.h"

static const double TIMEOUT_S = 0.5;

static void contains(dsc_status s, const char *needle) {
    const char *msg = s ? dsc_status_message(s) : "(ok)";
    if (!strstr(msg, needle)) fail_msg("expected \"%s\" in: %s", needle, msg);
    printf("found \"%s\"\n  in: %s\n", needle, msg);
}

static void test_hosts(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    char name[MPI_MAX_PROCESSOR_NAME];
    int len;
    MPI_Get_processor_name(name, &len);
    assert_string_equal(dsc_comm_host(world, dsc_comm_rank(world)), name);
    for (int r = 0; r < dsc_comm_size(world); r++)
        assert_true(dsc_comm_host(world, r)[0] != '\0');
    dsc_comm_free(world);
}

/* World, and `sub`: every rank of it under `name`, whose waits time out after
 * TIMEOUT_S. Skips the test on one rank (no peer to wait for). */
static void open_comms(const char *name, dsc_comm **world, dsc_comm **sub) {
    assert_ok(dsc_comm_world(NULL, world));
    int p = dsc_comm_size(*world);
    if (p < 2) {
        dsc_comm_free(*world);
        skip();
    }
    int members[16];
    for (int i = 0; i < p; i++)
        members[i] = i;
    assert_ok(dsc_comm_create_sub(*world, members, p, name, sub));
    assert_ok(dsc_comm_set_timeout(*sub, TIMEOUT_S));
}

/* The last rank stays away from dsc (it sleeps) while the others wait in an
 * all-reduce: they report it as not answering, with its host. */
static void test_silent_peer(void **state) {
    (void)state;
    dsc_comm *world, *late;
    open_comms("late", &world, &late);
    int p = dsc_comm_size(world), r = dsc_comm_rank(world);
    int64_t one = 1;
    float x = 1;
    dsc_tensor t = dsc_tensor_view(&x, DSC_DTYPE_F32, 1, &one, DSC_CPU);
    if (r == p - 1) {
        /* Past the others' deadline and their diagnosis window. */
        struct timespec pause = {2, 0};
        nanosleep(&pause, NULL);
    } else {
        dsc_status s = dsc_comm_allreduce(late, &t, DSC_REDUCE_OP_SUM);
        assert_int_equal(dsc_status_code(s), DSC_ERR_TIMEOUT);
        char want[256];
        snprintf(want, sizeof want, "all-reduce on communicator \"late\" (%d ranks) timed out after 0.5 s", p);
        contains(s, want);
        contains(s, "as collective #1 on \"late\"");
        snprintf(want, sizeof want, "did not answer within 0.2 s: world rank %d (host %s)", p - 1,
                 dsc_comm_host(world, p - 1));
        contains(s, want);
        if (p > 2) contains(s, "also inside it: world rank");
        dsc_status_free(s);
    }
    assert_ok(dsc_comm_barrier(world));
    dsc_comm_free(late);
    dsc_comm_free(world);
}

/* Rank 0 enters a barrier on "ahead" while the others wait for a message
 * from rank 0 on world: rank 0 learns they have not reached the barrier and
 * what they wait for; they learn rank 0 answered and is in the barrier. */
static void test_peer_behind(void **state) {
    (void)state;
    dsc_comm *world, *ahead;
    open_comms("ahead", &world, &ahead);
    int r = dsc_comm_rank(world);
    assert_ok(dsc_comm_set_timeout(world, 2 * TIMEOUT_S));
    int64_t one = 1;
    float x = 0;
    dsc_tensor t = dsc_tensor_view(&x, DSC_DTYPE_F32, 1, &one, DSC_CPU);
    char want[256];
    if (r == 0) {
        dsc_status s = dsc_comm_barrier(ahead);
        assert_int_equal(dsc_status_code(s), DSC_ERR_TIMEOUT);
        snprintf(
            want, sizeof want,
            "world rank 1 (host %s) has not reached it (0 collectives entered on \"ahead\"), waiting in recv with "
            "world rank 0 (host %s) on \"world\"",
            dsc_comm_host(world, 1), dsc_comm_host(world, 0));
        contains(s, want);
        contains(s, "did not answer within 0.2 s: none");
        dsc_status_free(s);
    } else {
        dsc_status s = dsc_comm_recv(world, &t, 0, 5);
        assert_int_equal(dsc_status_code(s), DSC_ERR_TIMEOUT);
        snprintf(want, sizeof want, "the peer (host %s) answered: it is ", dsc_comm_host(world, 0));
        contains(s, want);
        dsc_status_free(s);
    }
    assert_ok(dsc_comm_set_timeout(world, 60));
    assert_ok(dsc_comm_barrier(world));
    dsc_comm_free(ahead);
    dsc_comm_free(world);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hosts),
        cmocka_unit_test(test_silent_peer),
        cmocka_unit_test(test_peer_behind),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
