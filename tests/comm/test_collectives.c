/* Collectives of runtime/comm on 1..8 ranks: every operation, dtype and
 * reduce op on sizes that take both the MPI path and the ring path (and
 * zero-length buffers), with uneven and empty pieces; results compare with
 * values computed here from the closed-form inputs, and each call's byte
 * counters with the counting rule of docs/comm.md. The non-blocking forms
 * with several collectives of every path in flight at once, tested in one
 * order and waited in the reverse one, give the same results. */
#include <stdio.h>
#include <string.h>

#include "comm_test_util.h"
#include "test_mpi.h"

/* Small integers, exact in every dtype even after summing over 8 ranks. */
static double v(int rank, int64_t i) {
    return (double)((rank * 7 + i * 3) % 11);
}

static dsc_comm *world_comm(void) {
    dsc_comm *c = NULL;
    assert_ok(dsc_comm_world(NULL, &c));
    assert_true(dsc_comm_size(c) <= 8); /* the tests' count arrays hold 8 */
    return c;
}

/* The expected result of reducing v(., i) over p ranks, rounded like the dtype. */
static double reduced(dsc_dtype dtype, dsc_reduce_op op, int p, int64_t i) {
    double sum = 0, max = 0;
    for (int r = 0; r < p; r++) {
        sum += v(r, i);
        if (v(r, i) > max) max = v(r, i);
    }
    if (op == DSC_REDUCE_OP_MAX) return max;
    if (op == DSC_REDUCE_OP_SUM) return sum;
    if (!dsc_dtype_is_float(dtype)) return (double)((int64_t)sum / p);
    uint16_t cell[4];
    dsc_tensor one = dsc_tensor_view(cell, dtype, 1, (int64_t[]){1}, DSC_CPU);
    elem_set(&one, 0, (double)((float)sum / (float)p));
    return elem_get(&one, 0);
}

static void check_counters(dsc_comm *c, const dsc_comm_stats *before, dsc_comm_op op, int64_t sent, int64_t recv) {
    dsc_comm_stats after;
    dsc_comm_get_stats(c, &after);
    int64_t calls, got_sent, got_recv;
    stats_delta(before, &after, op, &calls, &got_sent, &got_recv);
    assert_int_equal(calls, 1);
    assert_int_equal(got_sent, sent);
    assert_int_equal(got_recv, recv);
}

static const dsc_dtype all_dtypes[] = {DSC_DTYPE_F32, DSC_DTYPE_BF16, DSC_DTYPE_F16,
                                       DSC_DTYPE_I32, DSC_DTYPE_I64,  DSC_DTYPE_U8};
#define N_DTYPES (sizeof all_dtypes / sizeof all_dtypes[0])

static void test_allreduce(void **state) {
    (void)state;
    dsc_comm *c = world_comm();
    int p = dsc_comm_size(c), r = dsc_comm_rank(c);
    const int64_t sizes[] = {0, 1, 5, 1000, 100003}; /* the last takes the ring for every dtype */
    for (size_t d = 0; d < N_DTYPES; d++)
        for (int op = 0; op < DSC_REDUCE_OP_COUNT; op++)
            for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
                int64_t n = sizes[k];
                dsc_tensor t;
                assert_ok(vec_alloc(&t, all_dtypes[d], n));
                for (int64_t i = 0; i < n; i++)
                    elem_set(&t, i, v(r, i));
                dsc_comm_stats before;
                dsc_comm_get_stats(c, &before);
                assert_ok(dsc_comm_allreduce(c, &t, (dsc_reduce_op)op));
                for (int64_t i = 0; i < n; i++) {
                    double want = reduced(t.dtype, (dsc_reduce_op)op, p, i);
                    if (elem_get(&t, i) != want) {
                        print_error("all-reduce %s %s n=%lld: [%lld] = %g, want %g\n", dsc_dtype_name(t.dtype),
                                    dsc_reduce_op_name((dsc_reduce_op)op), (long long)n, (long long)i,
                                    elem_get(&t, i), want);
                        fail();
                    }
                }
                int64_t mine = n / p + (r < n % p),
                        bytes = (int64_t)dsc_dtype_size(t.dtype) * (n + (p - 2) * mine);
                check_counters(c, &before, DSC_COMM_OP_ALLREDUCE, bytes, bytes);
                dsc_tensor_free(&t);
            }
    dsc_comm_free(c);
}

/* Uneven pieces, one of them empty: 3, 1, 6, 4, 2, 0, 5, 3 (times scale). */
static void uneven_counts(int p, int64_t scale, int64_t *counts, int64_t *displs, int64_t *total) {
    *total = 0;
    for (int i = 0; i < p; i++) {
        counts[i] = ((i * 5 + 3) % 7) * scale;
        displs[i] = *total;
        *total += counts[i];
    }
}

static void test_reduce_scatter(void **state) {
    (void)state;
    dsc_comm *c = world_comm();
    int p = dsc_comm_size(c), r = dsc_comm_rank(c);
    const dsc_dtype dtypes[] = {DSC_DTYPE_F32, DSC_DTYPE_BF16, DSC_DTYPE_I64};
    const int64_t scales[] = {1, 20000};
    int64_t counts[8], displs[8], total;
    for (size_t d = 0; d < 3; d++)
        for (int op = 0; op < DSC_REDUCE_OP_COUNT; op++)
            for (int uneven = 0; uneven < 2; uneven++)
                for (size_t k = 0; k < 2; k++) {
                    if (uneven) {
                        uneven_counts(p, scales[k], counts, displs, &total);
                    } else {
                        for (int i = 0; i < p; i++) {
                            counts[i] = 3 * scales[k];
                            displs[i] = i * counts[i];
                        }
                        total = p * counts[0];
                    }
                    dsc_tensor send, recv;
                    assert_ok(vec_alloc(&send, dtypes[d], total));
                    assert_ok(vec_alloc(&recv, dtypes[d], counts[r]));
                    for (int64_t g = 0; g < total; g++)
                        elem_set(&send, g, v(r, g));
                    dsc_comm_stats before;
                    dsc_comm_get_stats(c, &before);
                    assert_ok(dsc_comm_reduce_scatter(c, &send, &recv, uneven ? counts : NULL, (dsc_reduce_op)op));
                    for (int64_t j = 0; j < counts[r]; j++)
                        assert_true(elem_get(&recv, j) ==
                                    reduced(recv.dtype, (dsc_reduce_op)op, p, displs[r] + j));
                    int64_t e = (int64_t)dsc_dtype_size(send.dtype);
                    check_counters(c, &before, DSC_COMM_OP_REDUCE_SCATTER, (total - counts[r]) * e,
                                   (p - 1) * counts[r] * e);
                    dsc_tensor_free(&send);
                    dsc_tensor_free(&recv);
                }
    dsc_comm_free(c);
}

static void test_allgather(void **state) {
    (void)state;
    dsc_comm *c = world_comm();
    int p = dsc_comm_size(c), r = dsc_comm_rank(c);
    const dsc_dtype dtypes[] = {DSC_DTYPE_F32, DSC_DTYPE_U8, DSC_DTYPE_I32};
    const int64_t scales[] = {1, 20000};
    int64_t counts[8], displs[8], total;
    for (size_t d = 0; d < 3; d++)
        for (int uneven = 0; uneven < 2; uneven++)
            for (size_t k = 0; k < 2; k++) {
                uneven_counts(p, scales[k], counts, displs, &total);
                if (!uneven) {
                    for (int i = 0; i < p; i++) {
                        counts[i] = 2 * scales[k];
                        displs[i] = i * counts[i];
                    }
                    total = p * counts[0];
                }
                dsc_tensor send, recv;
                assert_ok(vec_alloc(&send, dtypes[d], counts[r]));
                assert_ok(vec_alloc(&recv, dtypes[d], total));
                for (int64_t j = 0; j < counts[r]; j++)
                    elem_set(&send, j, v(r, displs[r] + j));
                dsc_comm_stats before;
                dsc_comm_get_stats(c, &before);
                assert_ok(dsc_comm_allgather(c, &send, &recv, uneven ? counts : NULL));
                for (int q = 0; q < p; q++)
                    for (int64_t j = 0; j < counts[q]; j++)
                        assert_true(elem_get(&recv, displs[q] + j) == v(q, displs[q] + j));
                int64_t e = (int64_t)dsc_dtype_size(send.dtype);
                check_counters(c, &before, DSC_COMM_OP_ALLGATHER, (p - 1) * counts[r] * e,
                               (total - counts[r]) * e);
                dsc_tensor_free(&send);
                dsc_tensor_free(&recv);
            }
    dsc_comm_free(c);
}

/* ZeRO's usage: the shard is a view of this rank's piece of the flat buffer. */
static void test_in_place(void **state) {
    (void)state;
    dsc_comm *c = world_comm();
    int p = dsc_comm_size(c), r = dsc_comm_rank(c);
    const int64_t pieces[] = {3, 20000}; /* MPI's path and the ring */
    for (size_t k = 0; k < 2; k++) {
        int64_t m = pieces[k];
        dsc_tensor flat;
        assert_ok(vec_alloc(&flat, DSC_DTYPE_F32, p * m));
        dsc_tensor mine = dsc_tensor_rows(&flat, r * m, m);
        for (int64_t i = 0; i < m; i++)
            elem_set(&mine, i, v(r, r * m + i));
        assert_ok(dsc_comm_allgather(c, &mine, &flat, NULL));
        for (int64_t g = 0; g < p * m; g++)
            assert_true(elem_get(&flat, g) == v((int)(g / m), g));
        for (int64_t g = 0; g < p * m; g++)
            elem_set(&flat, g, v(r, g));
        assert_ok(dsc_comm_reduce_scatter(c, &flat, &mine, NULL, DSC_REDUCE_OP_SUM));
        for (int64_t i = 0; i < m; i++)
            assert_true(elem_get(&mine, i) == reduced(DSC_DTYPE_F32, DSC_REDUCE_OP_SUM, p, r * m + i));
        dsc_tensor_free(&flat);
    }
    dsc_comm_free(c);
}

/* Element k of the piece rank `from` sends to rank `to`. */
static double w(int from, int to, int64_t k) {
    return (double)((from * 31 + to * 17 + k) % 251);
}

static void test_alltoall(void **state) {
    (void)state;
    dsc_comm *c = world_comm();
    int p = dsc_comm_size(c), r = dsc_comm_rank(c);
    const dsc_dtype dtypes[] = {DSC_DTYPE_F32, DSC_DTYPE_BF16, DSC_DTYPE_I32};
    const int64_t pieces[] = {0, 1, 20000};
    for (size_t d = 0; d < 3; d++)
        for (size_t k = 0; k < 3; k++) {
            int64_t m = pieces[k];
            dsc_tensor send, recv;
            assert_ok(vec_alloc(&send, dtypes[d], p * m));
            assert_ok(vec_alloc(&recv, dtypes[d], p * m));
            for (int j = 0; j < p; j++)
                for (int64_t i = 0; i < m; i++)
                    elem_set(&send, j * m + i, w(r, j, i));
            dsc_comm_stats before;
            dsc_comm_get_stats(c, &before);
            assert_ok(dsc_comm_alltoall(c, &send, &recv));
            for (int j = 0; j < p; j++)
                for (int64_t i = 0; i < m; i++)
                    assert_true(elem_get(&recv, j * m + i) == w(j, r, i));
            int64_t bytes = (p - 1) * m * (int64_t)dsc_dtype_size(send.dtype);
            check_counters(c, &before, DSC_COMM_OP_ALLTOALL, bytes, bytes);
            dsc_tensor_free(&send);
            dsc_tensor_free(&recv);
        }
    dsc_comm_free(c);
}

static void test_alltoallv_uneven(void **state) {
    (void)state;
    dsc_comm *c = world_comm();
    int p = dsc_comm_size(c), r = dsc_comm_rank(c);
    const int64_t scales[] = {1, 5000};
    for (size_t k = 0; k < 2; k++) {
        /* Rank a sends ((a + 2b) % 4) * scale elements to rank b: many pieces are empty. */
        int64_t send_counts[8], recv_counts[8], send_total = 0, recv_total = 0, sent = 0, received = 0;
        for (int j = 0; j < p; j++) {
            send_counts[j] = ((r + 2 * j) % 4) * scales[k];
            recv_counts[j] = ((j + 2 * r) % 4) * scales[k];
            send_total += send_counts[j];
            recv_total += recv_counts[j];
            if (j != r) {
                sent += send_counts[j] * 4;
                received += recv_counts[j] * 4;
            }
        }
        dsc_tensor send, recv;
        assert_ok(vec_alloc(&send, DSC_DTYPE_F32, send_total));
        assert_ok(vec_alloc(&recv, DSC_DTYPE_F32, recv_total));
        for (int j = 0, off = 0; j < p; off += (int)send_counts[j], j++)
            for (int64_t i = 0; i < send_counts[j]; i++)
                elem_set(&send, off + i, w(r, j, i));
        dsc_comm_stats before;
        dsc_comm_get_stats(c, &before);
        assert_ok(dsc_comm_alltoallv(c, &send, send_counts, &recv, recv_counts));
        for (int j = 0, off = 0; j < p; off += (int)recv_counts[j], j++)
            for (int64_t i = 0; i < recv_counts[j]; i++)
                assert_true(elem_get(&recv, off + i) == w(j, r, i));
        check_counters(c, &before, DSC_COMM_OP_ALLTOALLV, sent, received);
        dsc_tensor_free(&send);
        dsc_tensor_free(&recv);
    }
    dsc_comm_free(c);
}

static void test_broadcast(void **state) {
    (void)state;
    dsc_comm *c = world_comm();
    int p = dsc_comm_size(c), r = dsc_comm_rank(c), root = p - 1;
    const int64_t sizes[] = {0, 3, 100000};
    for (size_t d = 0; d < N_DTYPES; d++)
        for (size_t k = 0; k < 3; k++) {
            int64_t n = sizes[k];
            dsc_tensor t;
            assert_ok(vec_alloc(&t, all_dtypes[d], n));
            if (r == root)
                for (int64_t i = 0; i < n; i++)
                    elem_set(&t, i, v(root, i) + 1);
            dsc_comm_stats before;
            dsc_comm_get_stats(c, &before);
            assert_ok(dsc_comm_broadcast(c, &t, root));
            for (int64_t i = 0; i < n; i++)
                assert_true(elem_get(&t, i) == v(root, i) + 1);
            int64_t bytes = (int64_t)dsc_tensor_nbytes(&t);
            check_counters(c, &before, DSC_COMM_OP_BROADCAST, r == root ? (p - 1) * bytes : 0,
                           r == root ? 0 : bytes);
            dsc_tensor_free(&t);
        }
    dsc_comm_free(c);
}

/* Each rank sends to its right neighbour and receives from its left, with
 * test() polling for one request and wait() for the other; a second round
 * uses the blocking forms, including a message to itself. */
static void test_point_to_point(void **state) {
    (void)state;
    dsc_comm *c = world_comm();
    int p = dsc_comm_size(c), r = dsc_comm_rank(c), right = (r + 1) % p, left = (r - 1 + p) % p;
    const int64_t n = 70000;
    dsc_tensor out, in;
    assert_ok(vec_alloc(&out, DSC_DTYPE_I64, n));
    assert_ok(vec_alloc(&in, DSC_DTYPE_I64, n));
    for (int64_t i = 0; i < n; i++)
        elem_set(&out, i, r * 100000 + i);
    dsc_comm_stats before;
    dsc_comm_get_stats(c, &before);
    dsc_comm_request *rr, *sr;
    assert_ok(dsc_comm_irecv(c, &in, left, 5, &rr));
    assert_ok(dsc_comm_isend(c, &out, right, 5, &sr));
    bool done = false;
    while (!done)
        assert_ok(dsc_comm_test(&rr, &done));
    assert_null(rr);
    assert_ok(dsc_comm_wait(&sr));
    assert_null(sr);
    for (int64_t i = 0; i < n; i++)
        assert_true(elem_get(&in, i) == left * 100000 + i);
    dsc_comm_stats after;
    dsc_comm_get_stats(c, &after);
    int64_t calls, sent, recv;
    stats_delta(&before, &after, DSC_COMM_OP_SEND, &calls, &sent, &recv);
    assert_true(calls == 1 && sent == n * 8 && recv == 0);
    stats_delta(&before, &after, DSC_COMM_OP_RECV, &calls, &sent, &recv);
    assert_true(calls == 1 && sent == 0 && recv == n * 8);

    /* Blocking pair with itself: the send is posted first so the receive finds it. */
    dsc_comm_request *self;
    assert_ok(dsc_comm_isend(c, &out, r, 9, &self));
    assert_ok(dsc_comm_recv(c, &in, r, 9));
    assert_ok(dsc_comm_wait(&self));
    for (int64_t i = 0; i < n; i++)
        assert_true(elem_get(&in, i) == r * 100000 + i);
    dsc_tensor_free(&out);
    dsc_tensor_free(&in);
    dsc_comm_free(c);
}

static void test_barrier(void **state) {
    (void)state;
    dsc_comm *c = world_comm();
    dsc_comm_stats before;
    dsc_comm_get_stats(c, &before);
    for (int i = 0; i < 3; i++)
        assert_ok(dsc_comm_barrier(c));
    dsc_comm_stats after;
    dsc_comm_get_stats(c, &after);
    assert_int_equal(after.calls[DSC_COMM_OP_BARRIER] - before.calls[DSC_COMM_OP_BARRIER], 3);
    assert_int_equal(after.bytes_sent[DSC_COMM_OP_BARRIER], 0);
    dsc_comm_reset_stats(c);
    dsc_comm_get_stats(c, &after);
    assert_int_equal(after.calls[DSC_COMM_OP_BARRIER], 0);
    dsc_comm_free(c);
}

/* Five collectives in flight at once (ring and MPI paths, uneven pieces, a
 * zero-length one), tested round-robin a few times and then waited in the
 * reverse of their posting order; the counts arrays are overwritten as soon
 * as each is posted (the API copies them). */
static void test_nonblocking(void **state) {
    (void)state;
    dsc_comm *c = world_comm();
    int p = dsc_comm_size(c), r = dsc_comm_rank(c);
    dsc_tensor big, half, tiny, rs_send, rs_recv, ag_send, ag_recv, empty;
    int64_t big_n = 100003, rs_counts[8], rs_displs[8], rs_total, ag_counts[8], ag_displs[8], ag_total;
    assert_ok(vec_alloc(&big, DSC_DTYPE_F32, big_n));
    assert_ok(vec_alloc(&half, DSC_DTYPE_BF16, 1000));
    assert_ok(vec_alloc(&tiny, DSC_DTYPE_I32, 5));
    assert_ok(vec_alloc(&empty, DSC_DTYPE_F32, 0));
    uneven_counts(p, 20000, rs_counts, rs_displs, &rs_total);
    uneven_counts(p, 1, ag_counts, ag_displs, &ag_total);
    assert_ok(vec_alloc(&rs_send, DSC_DTYPE_F32, rs_total));
    assert_ok(vec_alloc(&rs_recv, DSC_DTYPE_F32, rs_counts[r]));
    assert_ok(vec_alloc(&ag_send, DSC_DTYPE_U8, ag_counts[r]));
    assert_ok(vec_alloc(&ag_recv, DSC_DTYPE_U8, ag_total));
    dsc_tensor *inputs[] = {&big, &half, &tiny, &rs_send};
    for (size_t k = 0; k < 4; k++)
        for (int64_t i = 0; i < dsc_tensor_numel(inputs[k]); i++)
            elem_set(inputs[k], i, v(r, i));
    for (int64_t j = 0; j < ag_counts[r]; j++)
        elem_set(&ag_send, j, v(r, ag_displs[r] + j));
    dsc_comm_stats before, after;
    dsc_comm_get_stats(c, &before);
    enum { N_REQ = 6 };
    dsc_comm_request *req[N_REQ];
    int64_t scratch_counts[8];
    memcpy(scratch_counts, rs_counts, sizeof scratch_counts);
    assert_ok(dsc_comm_iallreduce(c, &big, DSC_REDUCE_OP_SUM, &req[0]));
    assert_ok(dsc_comm_iallreduce(c, &half, DSC_REDUCE_OP_AVG, &req[1]));
    assert_ok(dsc_comm_iallreduce(c, &tiny, DSC_REDUCE_OP_MAX, &req[2]));
    assert_ok(dsc_comm_ireduce_scatter(c, &rs_send, &rs_recv, scratch_counts, DSC_REDUCE_OP_SUM, &req[3]));
    memset(scratch_counts, 0, sizeof scratch_counts);
    memcpy(scratch_counts, ag_counts, sizeof scratch_counts);
    assert_ok(dsc_comm_iallgather(c, &ag_send, &ag_recv, scratch_counts, &req[4]));
    memset(scratch_counts, 0, sizeof scratch_counts);
    assert_ok(dsc_comm_iallreduce(c, &empty, DSC_REDUCE_OP_SUM, &req[5]));
    assert_null(req[5]); /* nothing to move */
    for (int round = 0; round < 3; round++)
        for (int k = 0; k < N_REQ; k++) {
            bool done;
            assert_ok(dsc_comm_test(&req[k], &done));
            assert_true(done == (req[k] == NULL));
        }
    for (int k = N_REQ - 1; k >= 0; k--)
        assert_ok(dsc_comm_wait(&req[k]));
    for (int64_t i = 0; i < big_n; i++)
        assert_true(elem_get(&big, i) == reduced(DSC_DTYPE_F32, DSC_REDUCE_OP_SUM, p, i));
    for (int64_t i = 0; i < 1000; i++)
        assert_true(elem_get(&half, i) == reduced(DSC_DTYPE_BF16, DSC_REDUCE_OP_AVG, p, i));
    for (int64_t i = 0; i < 5; i++)
        assert_true(elem_get(&tiny, i) == reduced(DSC_DTYPE_I32, DSC_REDUCE_OP_MAX, p, i));
    for (int64_t j = 0; j < rs_counts[r]; j++)
        assert_true(elem_get(&rs_recv, j) == reduced(DSC_DTYPE_F32, DSC_REDUCE_OP_SUM, p, rs_displs[r] + j));
    for (int q = 0; q < p; q++)
        for (int64_t j = 0; j < ag_counts[q]; j++)
            assert_true(elem_get(&ag_recv, ag_displs[q] + j) == v(q, ag_displs[q] + j));
    dsc_comm_get_stats(c, &after);
    int64_t calls, sent, recv, e = 4;
    stats_delta(&before, &after, DSC_COMM_OP_ALLREDUCE, &calls, &sent, &recv);
    assert_int_equal(calls, 4);
    stats_delta(&before, &after, DSC_COMM_OP_REDUCE_SCATTER, &calls, &sent, &recv);
    assert_int_equal(calls, 1);
    assert_int_equal(sent, (rs_total - rs_counts[r]) * e);
    assert_int_equal(recv, (p - 1) * rs_counts[r] * e);
    stats_delta(&before, &after, DSC_COMM_OP_ALLGATHER, &calls, &sent, &recv);
    assert_int_equal(calls, 1);
    assert_int_equal(sent, (p - 1) * ag_counts[r]);
    assert_int_equal(recv, ag_total - ag_counts[r]);
    dsc_tensor *all[] = {&big, &half, &tiny, &rs_send, &rs_recv, &ag_send, &ag_recv, &empty};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        dsc_tensor_free(all[k]);
    dsc_comm_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allreduce), cmocka_unit_test(test_reduce_scatter),
        cmocka_unit_test(test_allgather), cmocka_unit_test(test_in_place),
        cmocka_unit_test(test_alltoall),  cmocka_unit_test(test_alltoallv_uneven),
        cmocka_unit_test(test_broadcast), cmocka_unit_test(test_point_to_point),
        cmocka_unit_test(test_barrier),   cmocka_unit_test(test_nonblocking),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
