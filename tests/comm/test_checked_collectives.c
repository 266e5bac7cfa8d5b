/* Checked collectives (dsc_comm_options.check_collectives, DSC_COMM_CHECK=1)
 * on 2..4 ranks: when the last rank enters a collective with a different
 * size, reduce op, root, counts, element type or operation than the others,
 * every rank returns DSC_ERR_INVALID naming that rank, no payload moves, and
 * the communicator still works for the next, agreeing collective. Unchecked
 * communicators pay nothing: their disagreements are not run here (they
 * corrupt memory; that is what the check is for). */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "comm_test_util.h"
#include "test_mpi.h"

static dsc_comm *checked_world(void) {
    dsc_comm *c;
    assert_ok(dsc_comm_world(&(dsc_comm_options){.timeout_s = 30, .check_collectives = true}, &c));
    return c;
}

/* The status every rank got is DSC_ERR_INVALID and names the odd rank. */
static void expect_named(dsc_status s, int odd, const char *needle) {
    char rank_text[32];
    snprintf(rank_text, sizeof rank_text, "rank %d", odd);
    assert_non_null(s);
    assert_int_equal(dsc_status_code(s), DSC_ERR_INVALID);
    if (!strstr(dsc_status_message(s), rank_text) || !strstr(dsc_status_message(s), needle))
        fail_msg("message \"%s\" lacks \"%s\" or \"%s\"", dsc_status_message(s), rank_text, needle);
    dsc_status_free(s);
}

/* An all-reduce every rank agrees on gives the rank sum: the communicator is usable. */
static void expect_usable(dsc_comm *c) {
    dsc_tensor t;
    assert_ok(vec_alloc(&t, DSC_DTYPE_F32, 5));
    for (int i = 0; i < 5; i++)
        elem_set(&t, i, dsc_comm_rank(c) + i);
    assert_ok(dsc_comm_allreduce(c, &t, DSC_REDUCE_OP_SUM));
    int p = dsc_comm_size(c);
    for (int i = 0; i < 5; i++)
        assert_true(elem_get(&t, i) == p * (p - 1) / 2.0 + (double)p * i);
    dsc_tensor_free(&t);
}

static void test_allreduce_size_and_op(void **state) {
    (void)state;
    dsc_comm *c = checked_world();
    int odd = dsc_comm_size(c) - 1;
    bool me = dsc_comm_rank(c) == odd;
    if (odd == 0) { /* one rank has no one to disagree with */
        expect_usable(c);
        dsc_comm_free(c);
        return;
    }
    dsc_tensor t;
    assert_ok(vec_alloc(&t, DSC_DTYPE_F32, me ? 7 : 8));
    memset(t.data, 0x7f, dsc_tensor_nbytes(&t)); /* a moved payload would show as a changed value */
    expect_named(dsc_comm_allreduce(c, &t, DSC_REDUCE_OP_SUM), odd, "elements: rank");
    for (int64_t i = 0; i < dsc_tensor_numel(&t); i++)
        assert_true(((uint32_t *)t.data)[i] == 0x7f7f7f7fu);
    dsc_tensor_free(&t);
    assert_ok(vec_alloc(&t, DSC_DTYPE_F32, 4));
    expect_named(dsc_comm_allreduce(c, &t, me ? DSC_REDUCE_OP_MAX : DSC_REDUCE_OP_SUM), odd, "reduce op");
    dsc_tensor_free(&t);
    assert_ok(vec_alloc(&t, me ? DSC_DTYPE_I32 : DSC_DTYPE_F32, 4));
    expect_named(dsc_comm_allreduce(c, &t, DSC_REDUCE_OP_SUM), odd, "i32");
    dsc_tensor_free(&t);
    expect_usable(c);
    dsc_comm_free(c);
}

static void test_other_operations(void **state) {
    (void)state;
    dsc_comm *c = checked_world();
    int p = dsc_comm_size(c), odd = p - 1, rank = dsc_comm_rank(c);
    bool me = rank == odd;
    if (p == 1) {
        dsc_comm_free(c);
        return;
    }
    dsc_tensor t;
    assert_ok(vec_alloc(&t, DSC_DTYPE_F32, 6));
    expect_named(dsc_comm_broadcast(c, &t, me ? 1 : 0), odd, "root");

    /* All-gather with counts that sum to the same total but split differently. */
    int64_t counts[4] = {0}, n = 2 * p;
    for (int i = 0; i < p; i++)
        counts[i] = 2;
    if (me) {
        counts[0] = 3;
        counts[1] = 1;
    }
    dsc_tensor piece;
    assert_ok(vec_alloc(&piece, DSC_DTYPE_F32, counts[rank]));
    dsc_tensor all;
    assert_ok(vec_alloc(&all, DSC_DTYPE_F32, n));
    expect_named(dsc_comm_allgather(c, &piece, &all, counts), odd, "counts");
    dsc_tensor_free(&piece);
    dsc_tensor_free(&all);

    /* A barrier on every rank but the last, which entered an all-reduce. */
    dsc_status s = me ? dsc_comm_allreduce(c, &t, DSC_REDUCE_OP_SUM) : dsc_comm_barrier(c);
    expect_named(s, odd, "entered");
    dsc_tensor_free(&t);
    expect_usable(c);
    dsc_comm_free(c);
}

/* All-to-all-v: the last rank expects 2 elements from rank 0, which sends 1. */
static void test_alltoallv_pairs(void **state) {
    (void)state;
    dsc_comm *c = checked_world();
    int p = dsc_comm_size(c), odd = p - 1, rank = dsc_comm_rank(c);
    if (p == 1) {
        dsc_comm_free(c);
        return;
    }
    int64_t send_counts[4], recv_counts[4];
    for (int j = 0; j < p; j++)
        send_counts[j] = recv_counts[j] = 1;
    if (rank == odd) recv_counts[0] = 2;
    dsc_tensor send, recv;
    assert_ok(vec_alloc(&send, DSC_DTYPE_F32, p));
    assert_ok(vec_alloc(&recv, DSC_DTYPE_F32, rank == odd ? p + 1 : p));
    expect_named(dsc_comm_alltoallv(c, &send, send_counts, &recv, recv_counts), odd, "expects");
    dsc_tensor_free(&send);
    dsc_tensor_free(&recv);
    expect_usable(c);
    dsc_comm_free(c);
}

/* DSC_COMM_CHECK=1 turns the check on for communicators created without the option. */
static void test_environment_switch(void **state) {
    (void)state;
    setenv("DSC_COMM_CHECK", "1", 1);
    dsc_comm *c;
    assert_ok(dsc_comm_world(NULL, &c));
    unsetenv("DSC_COMM_CHECK");
    int p = dsc_comm_size(c), odd = p - 1;
    if (p > 1) {
        dsc_tensor t;
        assert_ok(vec_alloc(&t, DSC_DTYPE_F32, dsc_comm_rank(c) == odd ? 3 : 2));
        expect_named(dsc_comm_allreduce(c, &t, DSC_REDUCE_OP_SUM), odd, "elements");
        dsc_tensor_free(&t);
    }
    expect_usable(c);
    dsc_comm_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allreduce_size_and_op),
        cmocka_unit_test(test_other_operations),
        cmocka_unit_test(test_alltoallv_pairs),
        cmocka_unit_test(test_environment_switch),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
