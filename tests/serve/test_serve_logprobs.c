/* serve_logprobs across 2 and 3 ranks (slices of uneven width, one rank's
 * possibly holding none of the top ids) equals serve_logprobs over the
 * whole row on one rank: the same ids in the same order (ties to the lower
 * id included), log-probabilities within 1e-5, and the whole row's
 * log-softmax computed here naively. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "dsc/comm.h"
#include "serve/logprobs.h"
#include "test_mpi.h"

enum { V = 53, N = 5 };

static void test_slices_equal_whole_row(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    int P = dsc_comm_size(world), rank = dsc_comm_rank(world);
    float row[V];
    double worst = 0;
    for (int trial = 0; trial < 6; trial++) {
        for (int v = 0; v < V; v++) /* the same row on every rank; trial 1 has ties */
            row[v] = trial == 1 ? (float)(v % 4) : (float)sin(0.37 * v * (trial + 1)) * (float)(2 + trial);
        /* Uneven slices: rank r holds [cut(r), cut(r + 1)), the first one short. */
        int32_t v0 = rank == 0 ? 0 : 7 + (rank - 1) * (V - 7) / (P - 1);
        int32_t v1 = rank == P - 1 ? V : 7 + rank * (V - 7) / (P - 1);
        int32_t token = (trial * 11 + 3) % V, n = trial == 5 ? 0 : N;
        serve_logprob whole[1 + N], split[1 + N];
        assert_ok(serve_logprobs(NULL, row, V, 0, token, n, whole));
        assert_ok(serve_logprobs(world, row + v0, v1 - v0, v0, token, n, split));
        double max = -INFINITY, sum = 0;
        for (int v = 0; v < V; v++)
            max = row[v] > max ? row[v] : max;
        for (int v = 0; v < V; v++)
            sum += exp(row[v] - max);
        for (int k = 0; k <= n; k++) {
            assert_int_equal(split[k].id, whole[k].id);
            double naive = row[whole[k].id] - max - log(sum);
            double err = fabs(split[k].logprob - naive) + fabs(whole[k].logprob - naive);
            worst = err > worst ? err : worst;
            assert_true(err < 1e-5);
            if (k >= 2) assert_true(whole[k].logprob <= whole[k - 1].logprob);
        }
        assert_int_equal(whole[0].id, token);
    }
    if (rank == 0) printf("%d ranks: ids equal to one rank's, worst |logprob error| %.2e\n", P, worst);
    dsc_comm_free(world);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_slices_equal_whole_row)};
    return DSC_RUN_MPI_TESTS(tests);
}
