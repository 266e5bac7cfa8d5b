/* Communicator lifecycle and failure behaviour on 1..8 ranks: the world and
 * sub-communicators (membership, order, world ranks), the agreement on member
 * lists (invalid or disagreeing lists become errors on every rank), argument
 * errors, size mismatches between peers, and timeouts that name the
 * operation, the communicator and the peer instead of hanging. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "comm_test_util.h"
#include "dsc/memory.h"
#include "test_mpi.h"

static void test_world(void **state) {
    (void)state;
    dsc_comm *c;
    assert_ok(dsc_comm_world(NULL, &c));
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    assert_int_equal(dsc_comm_rank(c), rank);
    assert_int_equal(dsc_comm_size(c), size);
    assert_string_equal(dsc_comm_name(c), "world");
    assert_string_equal(dsc_comm_backend_name(c), "mpi");
    for (int i = 0; i < size; i++)
        assert_int_equal(dsc_comm_world_rank(c, i), i);
    assert_true(dsc_comm_timeout(c) == DSC_COMM_DEFAULT_TIMEOUT_S);
    assert_err(dsc_comm_set_timeout(c, 0), DSC_ERR_INVALID, "must be positive");
    assert_ok(dsc_comm_set_timeout(c, 12.5));
    assert_true(dsc_comm_timeout(c) == 12.5);
    dsc_comm_free(c);
    if (dsc_cuda_device_count() == 0) {
        dsc_comm_options gpu = {.timeout_s = 5, .device = {DSC_DEVICE_CUDA, 0}};
        dsc_status s = dsc_comm_world(&gpu, &c);
        assert_non_null(s);
        dsc_status_free(s);
    }
}

static void test_sub_communicators(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    int p = dsc_comm_size(world), r = dsc_comm_rank(world);
    /* Ranks of my parity, listed in descending order: the sub-communicator keeps that order. */
    int members[8], n = 0;
    for (int q = p - 1; q >= 0; q--)
        if (q % 2 == r % 2) members[n++] = q;
    dsc_comm *sub;
    assert_ok(dsc_comm_create_sub(world, members, n, "parity", &sub));
    assert_string_equal(dsc_comm_name(sub), "parity");
    assert_int_equal(dsc_comm_size(sub), n);
    for (int i = 0; i < n; i++) {
        assert_int_equal(dsc_comm_world_rank(sub, i), members[i]);
        if (members[i] == r) assert_int_equal(dsc_comm_rank(sub), i);
    }
    int64_t one = 1;
    int64_t value = r;
    dsc_tensor t = dsc_tensor_view(&value, DSC_DTYPE_I64, 1, &one, DSC_CPU);
    assert_ok(dsc_comm_allreduce(sub, &t, DSC_REDUCE_OP_SUM));
    int64_t want = 0;
    for (int i = 0; i < n; i++)
        want += members[i];
    assert_int_equal(value, want);
    /* A sub-communicator of a sub-communicator: singletons. */
    int me = dsc_comm_rank(sub);
    dsc_comm *single;
    assert_ok(dsc_comm_create_sub(sub, &me, 1, "single", &single));
    assert_int_equal(dsc_comm_size(single), 1);
    assert_int_equal(dsc_comm_world_rank(single, 0), r);
    dsc_comm_free(single);
    dsc_comm_free(sub);
    dsc_comm_free(world);
}

static void test_invalid_member_lists(void **state) {
    (void)state;
    dsc_comm *world, *sub = NULL;
    assert_ok(dsc_comm_world(NULL, &world));
    int p = dsc_comm_size(world), r = dsc_comm_rank(world);
    /* Rank 0 leaves itself out: it learns why, every other rank learns who. */
    int other = (r + 1) % p;
    if (r == 0)
        assert_err(dsc_comm_create_sub(world, &other, p > 1 ? 1 : 0, "bad", &sub), DSC_ERR_INVALID, "bad");
    else
        assert_err(dsc_comm_create_sub(world, &r, 1, "bad", &sub), DSC_ERR_PEER,
                   "rank 0 of \"world\" passed an invalid member list");
    assert_null(sub);
    int twice[2] = {r, r};
    assert_err(dsc_comm_create_sub(world, twice, 2, "dup", &sub), DSC_ERR_INVALID,
               p > 1 ? "is listed twice" : "2 members requested");
    if (p > 1) {
        /* Rank 0 claims {0, 1} while rank 1 claims only itself: every rank refuses. */
        int pair[2] = {0, 1};
        dsc_status s = r == 0 ? dsc_comm_create_sub(world, pair, 2, "split", &sub)
                              : dsc_comm_create_sub(world, &r, 1, "split", &sub);
        assert_err(s, DSC_ERR_INVALID, "member lists disagree");
    }
    /* The world is still usable afterwards. */
    assert_ok(dsc_comm_barrier(world));
    dsc_comm_free(world);
}

static void test_argument_errors(void **state) {
    (void)state;
    dsc_comm *c;
    assert_ok(dsc_comm_world(NULL, &c));
    int p = dsc_comm_size(c), r = dsc_comm_rank(c);
    dsc_tensor f, g, h, i32;
    assert_ok(vec_alloc(&f, DSC_DTYPE_F32, p * 2));
    assert_ok(vec_alloc(&g, DSC_DTYPE_F32, 2));
    assert_ok(vec_alloc(&h, DSC_DTYPE_F32, 3));
    assert_ok(vec_alloc(&i32, DSC_DTYPE_I32, 2));
    assert_err(dsc_comm_allreduce(c, &f, (dsc_reduce_op)7), DSC_ERR_INVALID, "unknown reduce op 7");
    int64_t counts[8] = {0};
    counts[0] = 1;
    assert_err(dsc_comm_reduce_scatter(c, &f, &g, counts, DSC_REDUCE_OP_SUM), DSC_ERR_INVALID, "sum to 1");
    assert_err(dsc_comm_reduce_scatter(c, &f, &i32, NULL, DSC_REDUCE_OP_SUM), DSC_ERR_INVALID,
               "send is f32 but recv is i32");
    assert_err(dsc_comm_allgather(c, &h, &f, NULL), DSC_ERR_INVALID, "this rank's piece");
    assert_err(dsc_comm_alltoallv(c, &f, NULL, &f, NULL), DSC_ERR_INVALID, "counts are NULL");
    assert_err(dsc_comm_broadcast(c, &f, p), DSC_ERR_INVALID, "root");
    assert_err(dsc_comm_send(c, &f, -1, 0), DSC_ERR_INVALID, "peer -1");
    assert_err(dsc_comm_send(c, &f, 0, 40000), DSC_ERR_INVALID, "tag 40000");
    dsc_tensor gpu = f;
    gpu.device = (dsc_device){DSC_DEVICE_CUDA, 0};
    assert_err(dsc_comm_allreduce(c, &gpu, DSC_REDUCE_OP_SUM), DSC_ERR_INVALID,
               "is on cuda:0 but the communicator serves cpu");

    /* A receive that expects more than its peer sends. */
    dsc_comm_request *req;
    assert_ok(dsc_comm_isend(c, &g, r, 3, &req));
    assert_err(dsc_comm_recv(c, &h, r, 3), DSC_ERR_INVALID, "sent 2 elements but 3 were expected");
    assert_ok(dsc_comm_wait(&req));
    if (p > 1) {
        /* all-to-all-v where rank 1 expects one more element from rank 0 than it sends. */
        int64_t send_counts[8] = {0}, recv_counts[8] = {0};
        if (r == 1) recv_counts[0] = 1;
        if (r == 0) send_counts[1] = 0;
        dsc_tensor empty, one;
        assert_ok(vec_alloc(&empty, DSC_DTYPE_F32, 0));
        assert_ok(vec_alloc(&one, DSC_DTYPE_F32, r == 1 ? 1 : 0));
        dsc_status s = dsc_comm_alltoallv(c, &empty, send_counts, &one, recv_counts);
        if (r == 1)
            assert_err(s, DSC_ERR_INVALID, "peer 0 sent 0 elements but 1 were expected");
        else
            assert_ok(s);
        dsc_tensor_free(&empty);
        dsc_tensor_free(&one);

        /* More than expected: MPI truncates, the receiver names the peer, and
         * its communicator refuses further collectives. */
        dsc_comm *trunc;
        int all[8];
        for (int i = 0; i < p; i++)
            all[i] = i;
        assert_ok(dsc_comm_create_sub(c, all, p, "trunc", &trunc));
        memset(send_counts, 0, sizeof send_counts);
        memset(recv_counts, 0, sizeof recv_counts);
        if (r == 0) send_counts[1] = 2;
        if (r == 1) recv_counts[0] = 1;
        dsc_tensor out2, in1;
        assert_ok(vec_alloc(&out2, DSC_DTYPE_F32, r == 0 ? 2 : 0));
        assert_ok(vec_alloc(&in1, DSC_DTYPE_F32, r == 1 ? 1 : 0));
        s = dsc_comm_alltoallv(trunc, &out2, send_counts, &in1, recv_counts);
        if (r == 1) {
            assert_err(s, DSC_ERR_COMM, "all-to-all, message from peer 0");
            assert_err(dsc_comm_barrier(trunc), DSC_ERR_COMM, "refused: an earlier all-to-all-v failed");
        } else {
            assert_ok(s);
        }
        dsc_tensor_free(&out2);
        dsc_tensor_free(&in1);
        dsc_comm_free(trunc);
    }
    assert_ok(dsc_comm_barrier(c));
    dsc_tensor_free(&f);
    dsc_tensor_free(&g);
    dsc_tensor_free(&h);
    dsc_tensor_free(&i32);
    dsc_comm_free(c);
}

static void test_timeouts(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world)); /* ranks may arrive far apart on a loaded machine */
    assert_ok(dsc_comm_set_timeout(world, 0.3));
    int p = dsc_comm_size(world), r = dsc_comm_rank(world), left = (r - 1 + p) % p;
    int64_t one = 1;
    float x = 0;
    dsc_tensor t = dsc_tensor_view(&x, DSC_DTYPE_F32, 1, &one, DSC_CPU);
    /* Nobody sends tag 77: the receive gives up, naming what it waited for. */
    dsc_status s = dsc_comm_recv(world, &t, left, 77);
    assert_int_equal(dsc_status_code(s), DSC_ERR_TIMEOUT);
    char want[160];
    snprintf(want, sizeof want,
             "recv with peer %d (world rank %d) on communicator \"world\" timed out after 0.3 s", left, left);
    assert_non_null(strstr(dsc_status_message(s), want));
    dsc_status_free(s);
    /* The same through test(): it reports the timeout once the deadline passed. */
    dsc_comm_request *req;
    assert_ok(dsc_comm_irecv(world, &t, left, 78, &req));
    bool done = false;
    while (!done)
        s = dsc_comm_test(&req, &done);
    assert_null(req);
    assert_err(s, DSC_ERR_TIMEOUT, "recv with peer");
    assert_ok(dsc_comm_set_timeout(world, 60));
    assert_ok(dsc_comm_barrier(world)); /* a point-to-point timeout leaves the communicator usable */

    if (p > 1) {
        int members[8];
        for (int i = 0; i < p; i++)
            members[i] = i;
        dsc_comm *late;
        assert_ok(dsc_comm_create_sub(world, members, p, "late", &late));
        assert_ok(dsc_comm_set_timeout(late, 0.3));
        if (r == 0) {
            /* Rank 0 enters a barrier the others join only after it gave up. */
            assert_err(dsc_comm_barrier(late), DSC_ERR_TIMEOUT, "barrier on communicator \"late\"");
            assert_ok(dsc_comm_barrier(world));
        } else {
            assert_ok(dsc_comm_barrier(world));
            assert_ok(dsc_comm_set_timeout(late, 60));
            assert_ok(dsc_comm_barrier(late));
        }
        assert_ok(dsc_comm_barrier(world));
        if (r == 0) assert_err(dsc_comm_allreduce(late, &t, DSC_REDUCE_OP_SUM), DSC_ERR_COMM, "refused");
        dsc_comm_free(late);
    }
    dsc_comm_free(world);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_world),
        cmocka_unit_test(test_sub_communicators),
        cmocka_unit_test(test_invalid_member_lists),
        cmocka_unit_test(test_argument_errors),
        cmocka_unit_test(test_timeouts),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
