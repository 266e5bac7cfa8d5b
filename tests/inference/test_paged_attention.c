/* Paged attention against dense causal attention: random sequences are fed
 * through the blocked cache in several ragged batches (whole prompts, chunked
 * prompts continuing from the cache, single decode tokens; one prompt longer
 * than the kernel's query and key tiles), with GQA and
 * block sizes 1, 4 and 16, f32 and bf16 caches; each output row must equal
 * naive attention of that sequence alone over its full history (for bf16,
 * over keys and values rounded to bf16). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/kv_cache.h"
#include "dsc/rng.h"
#include "test_mpi.h"

/* MAXLEN spans several query tiles (128 rows) and key tiles (256 keys) of the kernel. */
enum { NH = 4, NKV = 2, HS = 8, NSEQ = 3, MAXLEN = 300, FIRST_CHUNK = 280 };

/* Naive causal attention of query (NH, HS) at position pos over keys/values
 * (pos + 1, NKV, HS) of one sequence, in double. */
static void naive_attention(float *out, const float *q, const float *k, const float *v, int64_t pos) {
    for (int h = 0; h < NH; h++) {
        int g = h / (NH / NKV);
        double scores[MAXLEN], max = -INFINITY, sum = 0;
        for (int64_t p = 0; p <= pos; p++) {
            double s = 0;
            for (int i = 0; i < HS; i++)
                s += (double)q[h * HS + i] * k[(p * NKV + g) * HS + i];
            scores[p] = s / sqrt((double)HS);
            if (scores[p] > max) max = scores[p];
        }
        for (int64_t p = 0; p <= pos; p++)
            sum += (scores[p] = exp(scores[p] - max));
        for (int i = 0; i < HS; i++) {
            double acc = 0;
            for (int64_t p = 0; p <= pos; p++)
                acc += scores[p] * v[(p * NKV + g) * HS + i];
            out[h * HS + i] = (float)(acc / sum);
        }
    }
}

static void fill_normal(float *x, int64_t n, dsc_rng *rng) {
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)dsc_rng_normal(rng);
}

/* Runs `rounds` batches; in each, every unfinished sequence contributes a
 * chunk of random length (1 for decode-like steps). */
static void run_case(int32_t block_size, uint64_t seed, dsc_dtype dtype) {
    dsc_kv_config cfg = {.num_layers = 2,
                         .num_kv_heads = NKV,
                         .head_size = HS,
                         .block_size = block_size,
                         .max_sequences = NSEQ,
                         .max_context = MAXLEN,
                         .max_tokens_per_forward = NSEQ * MAXLEN,
                         .max_batch_sequences = NSEQ,
                         .dtype = dtype};
    cfg.kv_cache_bytes = (int64_t)dsc_kv_config_block_bytes(&cfg) * (NSEQ * (MAXLEN / block_size + 1) + 3);
    dsc_kv_cache *cache;
    dsc_kv_state *state;
    dsc_ragged_batch batch;
    assert_ok(dsc_kv_cache_create(&cache, &cfg, DSC_CPU));
    assert_ok(dsc_kv_state_create(&state, &cfg, dsc_kv_cache_blocks(cache)));
    assert_ok(dsc_ragged_batch_init(&batch, &cfg));
    dsc_tensor layer;
    assert_ok(dsc_kv_cache_layer(cache, 1, &layer));
    /* Some blocks taken up front so sequences do not start at block 0. */
    int32_t hole[3];
    assert_ok(dsc_kv_blocks_allocate(dsc_kv_cache_blocks(cache), 3, hole));

    dsc_rng rng;
    dsc_rng_init(&rng, seed, 0, DSC_RNG_DATA);
    int64_t len[NSEQ], done[NSEQ] = {0};
    static float q[NSEQ][MAXLEN][NH * HS], k[NSEQ][MAXLEN][NKV * HS], v[NSEQ][MAXLEN][NKV * HS];
    static float kref[NSEQ][MAXLEN][NKV * HS], vref[NSEQ][MAXLEN][NKV * HS]; /* as the cache stores them */
    for (int s = 0; s < NSEQ; s++) {
        len[s] = s == 0 ? MAXLEN : 5 + (int64_t)dsc_rng_below(&rng, MAXLEN - 5);
        fill_normal(&q[s][0][0], MAXLEN * NH * HS, &rng);
        fill_normal(&k[s][0][0], MAXLEN * NKV * HS, &rng);
        fill_normal(&v[s][0][0], MAXLEN * NKV * HS, &rng);
    }
    for (int i = 0; i < NSEQ * MAXLEN * NKV * HS; i++) {
        float kx = (&k[0][0][0])[i], vx = (&v[0][0][0])[i];
        (&kref[0][0][0])[i] = dtype == DSC_DTYPE_BF16 ? dsc_bf16_to_f32(dsc_f32_to_bf16(kx)) : kx;
        (&vref[0][0][0])[i] = dtype == DSC_DTYPE_BF16 ? dsc_bf16_to_f32(dsc_f32_to_bf16(vx)) : vx;
    }
    static float bq[NSEQ * MAXLEN * NH * HS], bk[NSEQ * MAXLEN * NKV * HS], bv[NSEQ * MAXLEN * NKV * HS];
    static float bout[NSEQ * MAXLEN * NH * HS];
    double worst = 0;
    int batches = 0;
    for (;;) {
        uint64_t uids[NSEQ];
        int32_t counts[NSEQ], n = 0;
        const int32_t *tokens[NSEQ];
        static const int32_t dummy[MAXLEN] = {0};
        for (int s = 0; s < NSEQ; s++) {
            if (done[s] == len[s]) continue;
            int64_t left = len[s] - done[s];
            int64_t chunk = dsc_rng_below(&rng, 3) == 0 ? 1 : 1 + (int64_t)dsc_rng_below(&rng, (uint64_t)left);
            if (s == 0 && done[s] == 0) chunk = FIRST_CHUNK; /* a long prompt, then continuations from the cache */
            uids[n] = 100 + (uint64_t)s;
            counts[n] = (int32_t)chunk;
            tokens[n++] = dummy;
        }
        if (n == 0) break;
        assert_ok(dsc_ragged_batch_build(&batch, state, n, uids, tokens, counts));
        for (int32_t t = 0; t < batch.n_tokens; t++) {
            int s = (int)(batch.seqs[batch.token_seq[t]].uid - 100);
            int64_t p = batch.positions[t];
            memcpy(bq + t * NH * HS, q[s][p], sizeof q[s][p]);
            memcpy(bk + t * NKV * HS, k[s][p], sizeof k[s][p]);
            memcpy(bv + t * NKV * HS, v[s][p], sizeof v[s][p]);
        }
        int64_t qshape[3] = {batch.n_tokens, NH, HS}, kshape[3] = {batch.n_tokens, NKV, HS};
        dsc_tensor tq = dsc_tensor_view(bq, DSC_DTYPE_F32, 3, qshape, DSC_CPU);
        dsc_tensor tk = dsc_tensor_view(bk, DSC_DTYPE_F32, 3, kshape, DSC_CPU);
        dsc_tensor tv = dsc_tensor_view(bv, DSC_DTYPE_F32, 3, kshape, DSC_CPU);
        dsc_tensor tout = dsc_tensor_view(bout, DSC_DTYPE_F32, 3, qshape, DSC_CPU);
        assert_ok(dsc_paged_attention_forward(&tout, &tq, &tk, &tv, &batch, &layer));
        for (int32_t t = 0; t < batch.n_tokens; t++) {
            int s = (int)(batch.seqs[batch.token_seq[t]].uid - 100);
            int64_t p = batch.positions[t];
            float ref[NH * HS];
            naive_attention(ref, q[s][p], &kref[s][0][0], &vref[s][0][0], p);
            for (int i = 0; i < NH * HS; i++) {
                double e = fabs((double)bout[t * NH * HS + i] - ref[i]);
                if (e > worst) worst = e;
            }
        }
        assert_ok(dsc_ragged_batch_finish(&batch, state));
        for (int i = 0; i < n; i++)
            done[uids[i] - 100] += counts[i];
        batches++;
    }
    printf("  %s cache, block size %2d: %d batches, lengths %lld %lld %lld, max abs err %.2e\n",
           dsc_dtype_name(dtype), block_size, batches, (long long)len[0], (long long)len[1], (long long)len[2],
           worst);
    assert_true(worst < 1e-5);
    dsc_ragged_batch_free(&batch);
    dsc_kv_state_destroy(state);
    dsc_kv_cache_destroy(cache);
}

static void test_matches_dense_attention(void **state) {
    (void)state;
    const int32_t sizes[] = {1, 4, 16};
    for (int i = 0; i < 3; i++)
        for (uint64_t seed = 1; seed <= 3; seed++)
            run_case(sizes[i], seed * 7 + (uint64_t)i, DSC_DTYPE_F32);
    for (int i = 0; i < 3; i++)
        run_case(sizes[i], 100 + (uint64_t)i, DSC_DTYPE_BF16);
}

static void test_rejects_bad_arguments(void **state) {
    (void)state;
    dsc_kv_config cfg = {.num_layers = 1,
                         .num_kv_heads = NKV,
                         .head_size = HS,
                         .block_size = 4,
                         .kv_cache_bytes = 1 << 20,
                         .max_sequences = 2,
                         .max_context = 16,
                         .max_tokens_per_forward = 16,
                         .max_batch_sequences = 2};
    dsc_kv_cache *cache;
    dsc_kv_state *state_;
    dsc_ragged_batch batch;
    assert_ok(dsc_kv_cache_create(&cache, &cfg, DSC_CPU));
    assert_ok(dsc_kv_state_create(&state_, &cfg, dsc_kv_cache_blocks(cache)));
    assert_ok(dsc_ragged_batch_init(&batch, &cfg));
    const int32_t toks[2] = {0, 0};
    const int32_t *tp[] = {toks};
    assert_ok(dsc_ragged_batch_build(&batch, state_, 1, (uint64_t[]){1}, tp, (int32_t[]){2}));
    dsc_tensor layer;
    assert_ok(dsc_kv_cache_layer(cache, 0, &layer));
    float buf[2 * 3 * HS] = {0};
    dsc_tensor q3 = dsc_tensor_view(buf, DSC_DTYPE_F32, 3, (int64_t[]){2, 3, HS}, DSC_CPU);
    dsc_tensor k2 = dsc_tensor_view(buf, DSC_DTYPE_F32, 3, (int64_t[]){2, NKV, HS}, DSC_CPU);
    assert_err(dsc_paged_attention_forward(&q3, &q3, &k2, &k2, &batch, &layer), DSC_ERR_INVALID,
               "NH 3 is not a multiple of NKV 2");
    dsc_tensor q1 = dsc_tensor_view(buf, DSC_DTYPE_F32, 3, (int64_t[]){1, NKV, HS}, DSC_CPU);
    assert_err(dsc_paged_attention_forward(&q1, &q1, &k2, &k2, &batch, &layer), DSC_ERR_INVALID, "q");
    dsc_ragged_batch_free(&batch);
    dsc_kv_state_destroy(state_);
    dsc_kv_cache_destroy(cache);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_dense_attention),
        cmocka_unit_test(test_rejects_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
