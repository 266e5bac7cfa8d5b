/* The dropless serving MoE (dsc/moe_dropless.h) against a naive reference
 * computed here: softmax of each token's router logits in double, the top-k
 * experts by probability, combine weights by each rule (renormalised over
 * the k, DeepSpeed's, raw probabilities), and out = sum_k w_k * f_e(x) with
 * the affine experts f_e(x) = (e + 1) * x + e / 2. Over the world as the
 * expert-parallel group (every rank the same tokens): k = 1, 2, 3 with
 * E = 5, token counts below, at and above the rank count (ranks with an
 * empty slice), uneven expert ranges. Also checks that each rank ran only
 * its own experts and that the rows run over all ranks are N * k. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/moe_dropless.h"
#include "test_mpi.h"

enum { E = 5, M = 6, NMAX = 17 };

static uint64_t lcg = 99;
static float urand(void) {
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(lcg >> 40) / (float)(1ull << 24) * 2.0f - 1.0f;
}

typedef struct expert_log {
    int32_t first, count;
    int64_t calls;
} expert_log;

static dsc_status affine(void *user, int32_t expert, int64_t n, float *rows) {
    expert_log *log = user;
    DSC_CHECK(expert >= log->first && expert < log->first + log->count, DSC_ERR_INTERNAL,
              "expert %d run on a rank holding [%d, %d)", expert, log->first, log->first + log->count);
    log->calls++;
    for (int64_t i = 0; i < n * M; i++)
        rows[i] = (float)(expert + 1) * rows[i] + 0.5f * (float)expert;
    return NULL;
}

static void reference(const float *z, const float *x, int n, int k, dsc_moe_weighting how, float *out) {
    for (int t = 0; t < n; t++) {
        double p[E], mx = z[t * E], sum = 0;
        for (int e = 1; e < E; e++)
            mx = fmax(mx, z[t * E + e]);
        for (int e = 0; e < E; e++)
            sum += p[e] = exp(z[t * E + e] - mx);
        int chosen[E];
        double w[E], wsum = 0;
        for (int r = 0; r < k; r++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int j = 0; j < r; j++)
                    taken |= chosen[j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            chosen[r] = best;
            wsum += w[r] = p[best] / sum;
        }
        bool norm = how == DSC_MOE_WEIGHTING_RENORMALISED || (how == DSC_MOE_WEIGHTING_DEEPSPEED && k > 1);
        for (int c = 0; c < M; c++) {
            double acc = 0;
            for (int r = 0; r < k; r++)
                acc += (norm ? w[r] / wsum : w[r]) * ((chosen[r] + 1) * (double)x[t * M + c] + 0.5 * chosen[r]);
            out[t * M + c] = (float)acc;
        }
    }
}

static void test_against_reference(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    const int ep = dsc_comm_size(world);
    const int ns[] = {1, 3, NMAX};
    const dsc_moe_weighting rules[] = {DSC_MOE_WEIGHTING_RENORMALISED, DSC_MOE_WEIGHTING_DEEPSPEED,
                                       DSC_MOE_WEIGHTING_NONE};
    float z[NMAX * E], x[NMAX * M], out[NMAX * M], want[NMAX * M];
    double worst = 0;
    for (int k = 1; k <= 3; k++)
        for (int w = 0; w < 3; w++) {
            dsc_moe_dropless_options o = {E, k, M, NMAX, rules[w], ep > 1 ? world : NULL};
            dsc_moe_dropless *d;
            assert_ok(dsc_moe_dropless_create(&o, &d));
            expert_log log = {0};
            dsc_moe_expert_range(E, ep, dsc_comm_rank(world), &log.first, &log.count);
            for (int i = 0; i < 3; i++) {
                int n = ns[i];
                for (int j = 0; j < n * E; j++)
                    z[j] = 2.0f * urand();
                for (int j = 0; j < n * M; j++)
                    x[j] = urand();
                memset(out, 0xff, sizeof out);
                assert_ok(dsc_moe_dropless_forward(d, z, x, n, affine, &log, out));
                reference(z, x, n, k, rules[w], want);
                double err = dsc_test_rel_err(out, want, (int64_t)n * M);
                worst = err > worst ? err : worst;
                if (err > 1e-5) fail_msg("k %d rule %d n %d: relative error %.3e", k, w, n, err);
                int64_t rows[E], total = 0, n_rows = E;
                dsc_moe_dropless_expert_rows(d, rows);
                for (int e = 0; e < E; e++)
                    assert_true(rows[e] == 0 || (e >= log.first && e < log.first + log.count));
                dsc_tensor t = dsc_tensor_view(rows, DSC_DTYPE_I64, 1, &n_rows, DSC_CPU);
                assert_ok(dsc_comm_allreduce(world, &t, DSC_REDUCE_OP_SUM));
                for (int e = 0; e < E; e++)
                    total += rows[e];
                assert_int_equal(total, (int64_t)n * k);
            }
            dsc_moe_dropless_destroy(d);
        }
    printf("dropless MoE at ep %d: k 1-3, three weightings, N 1/3/%d: worst relative error %.2e\n", ep, NMAX,
           worst);
    dsc_comm_free(world);
}

static void test_refusals(void **state) {
    (void)state;
    dsc_moe_dropless *d = NULL;
    dsc_moe_dropless_options o = {E, E + 1, M, NMAX, DSC_MOE_WEIGHTING_NONE, NULL};
    assert_err(dsc_moe_dropless_create(&o, &d), DSC_ERR_INVALID, "need 1 <= k (6) <= E (5)");
    o.k = 2;
    assert_ok(dsc_moe_dropless_create(&o, &d));
    float z[E], x[M], out[M];
    assert_err(dsc_moe_dropless_forward(d, z, x, NMAX + 1, affine, NULL, out), DSC_ERR_INVALID,
               "18 tokens, at most 17 reserved");
    dsc_moe_dropless_destroy(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_against_reference), cmocka_unit_test(test_refusals)};
    return DSC_RUN_MPI_TESTS(tests);
}
