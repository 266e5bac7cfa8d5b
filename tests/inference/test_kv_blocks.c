/* The KV block allocator and cache memory: all-or-nothing allocation and
 * free, rejected bad ids, a long random stress against a shadow model, and
 * the cache arena's sizing and accounting. */
#include <stdio.h>
#include <string.h>

#include "dsc/kv_cache.h"
#include "dsc/rng.h"
#include "test_mpi.h"

static void test_allocate_in_order_and_exhaustion(void **state) {
    (void)state;
    dsc_kv_blocks *b;
    assert_ok(dsc_kv_blocks_create(&b, 8));
    assert_int_equal(dsc_kv_blocks_free_count(b), 8);
    int32_t ids[8];
    assert_ok(dsc_kv_blocks_allocate(b, 3, ids));
    assert_int_equal(ids[0], 0);
    assert_int_equal(ids[1], 1);
    assert_int_equal(ids[2], 2);
    assert_int_equal(dsc_kv_blocks_free_count(b), 5);
    /* Exhaustion names requested vs free and changes nothing. */
    int32_t more[8] = {-7, -7, -7, -7, -7, -7, -7, -7};
    assert_err(dsc_kv_blocks_allocate(b, 6, more), DSC_ERR_NOMEM, "requested 6 blocks but only 5 of 8 are free");
    assert_int_equal(dsc_kv_blocks_free_count(b), 5);
    for (int i = 0; i < 8; i++)
        assert_int_equal(more[i], -7);
    for (int32_t id = 3; id < 8; id++)
        assert_false(dsc_kv_blocks_is_used(b, id));
    assert_ok(dsc_kv_blocks_allocate(b, 5, more));
    assert_int_equal(dsc_kv_blocks_free_count(b), 0);
    assert_ok(dsc_kv_blocks_allocate(b, 0, more));
    assert_err(dsc_kv_blocks_allocate(b, 1, more), DSC_ERR_NOMEM, "requested 1 blocks but only 0 of 8");
    dsc_kv_blocks_destroy(b);
    assert_err(dsc_kv_blocks_create(&b, 0), DSC_ERR_INVALID, "num_blocks must be > 0");
}

static void test_free_validates_before_freeing(void **state) {
    (void)state;
    dsc_kv_blocks *b;
    assert_ok(dsc_kv_blocks_create(&b, 6));
    int32_t ids[4];
    assert_ok(dsc_kv_blocks_allocate(b, 4, ids)); /* 0 1 2 3 used, 4 5 free */
    assert_err(dsc_kv_blocks_free(b, (int32_t[]){1, 9}, 2), DSC_ERR_INVALID, "block id 9 out of range [0, 6)");
    assert_err(dsc_kv_blocks_free(b, (int32_t[]){0, -1}, 2), DSC_ERR_INVALID, "block id -1 out of range");
    assert_err(dsc_kv_blocks_free(b, (int32_t[]){2, 4}, 2), DSC_ERR_INVALID, "double free of block id 4");
    assert_err(dsc_kv_blocks_free(b, (int32_t[]){3, 1, 3}, 3), DSC_ERR_INVALID, "block id 3 appears twice");
    /* None of the failed calls freed anything, not even their valid prefix. */
    assert_int_equal(dsc_kv_blocks_free_count(b), 2);
    for (int32_t id = 0; id < 4; id++)
        assert_true(dsc_kv_blocks_is_used(b, id));
    assert_ok(dsc_kv_blocks_free(b, (int32_t[]){3, 1}, 2));
    assert_int_equal(dsc_kv_blocks_free_count(b), 4);
    assert_err(dsc_kv_blocks_free(b, (int32_t[]){1}, 1), DSC_ERR_INVALID, "double free of block id 1");
    /* Freed ids are reused (last freed first). */
    int32_t again[2];
    assert_ok(dsc_kv_blocks_allocate(b, 2, again));
    assert_int_equal(again[0], 1);
    assert_int_equal(again[1], 3);
    dsc_kv_blocks_destroy(b);
}

/* Random allocations and frees (including failing ones) checked after every
 * step against a shadow "owned" array: free + used == total, no id handed
 * out twice, every used id reported used. */
static void test_random_stress(void **state) {
    (void)state;
    enum { NB = 97, STEPS = 20000 };
    dsc_kv_blocks *b;
    assert_ok(dsc_kv_blocks_create(&b, NB));
    int32_t owned[NB];
    int32_t n_owned = 0;
    dsc_rng rng;
    dsc_rng_init(&rng, 1234, 0, DSC_RNG_DATA);
    int failures = 0;
    for (int step = 0; step < STEPS; step++) {
        if (dsc_rng_below(&rng, 2) == 0) {
            int32_t n = (int32_t)dsc_rng_below(&rng, 12);
            int32_t got[12];
            dsc_status s = dsc_kv_blocks_allocate(b, n, got);
            if (n > NB - n_owned) {
                assert_int_equal(dsc_status_code(s), DSC_ERR_NOMEM);
                dsc_status_free(s);
                failures++;
            } else {
                assert_null(s);
                for (int32_t i = 0; i < n; i++) {
                    for (int32_t j = 0; j < n_owned; j++)
                        assert_int_not_equal(owned[j], got[i]);
                    owned[n_owned++] = got[i];
                }
            }
        } else if (n_owned > 0) {
            /* Free a random subset; sometimes poison it with an already-free id. */
            int32_t n = 1 + (int32_t)dsc_rng_below(&rng, (uint64_t)(n_owned < 8 ? n_owned : 8));
            int32_t ids[9];
            for (int32_t i = 0; i < n; i++) {
                int32_t k = (int32_t)dsc_rng_below(&rng, (uint64_t)(n_owned - i)) + i;
                int32_t tmp = owned[i];
                owned[i] = owned[k];
                owned[k] = tmp;
                ids[i] = owned[i];
            }
            bool poison = n_owned < NB && dsc_rng_below(&rng, 10) == 0;
            if (poison) {
                int32_t freeid = 0;
                while (dsc_kv_blocks_is_used(b, freeid))
                    freeid++;
                ids[n++] = freeid;
                assert_err(dsc_kv_blocks_free(b, ids, n), DSC_ERR_INVALID, "double free");
                failures++;
            } else {
                assert_ok(dsc_kv_blocks_free(b, ids, n));
                memmove(owned, owned + n, sizeof(int32_t) * (size_t)(n_owned - n));
                n_owned -= n;
            }
        }
        assert_int_equal(dsc_kv_blocks_free_count(b) + n_owned, NB);
        for (int32_t j = 0; j < n_owned; j++)
            assert_true(dsc_kv_blocks_is_used(b, owned[j]));
    }
    printf("  %d steps, %d rejected requests, %d blocks held at the end\n", STEPS, failures, n_owned);
    assert_true(failures > 100);
    dsc_kv_blocks_destroy(b);
}

static dsc_kv_config small_config(void) {
    return (dsc_kv_config){.num_layers = 3,
                           .num_kv_heads = 2,
                           .head_size = 8,
                           .block_size = 4,
                           .kv_cache_bytes = 10 * 3 * 2 * 4 * 2 * 8 * 4 + 100,
                           .max_sequences = 4,
                           .max_context = 64,
                           .max_tokens_per_forward = 32,
                           .max_batch_sequences = 4};
}

static void test_cache_sizing_and_accounting(void **state) {
    (void)state;
    dsc_kv_config cfg = small_config();
    assert_int_equal(dsc_kv_config_block_bytes(&cfg), 3 * 2 * 4 * 2 * 8 * 4);
    dsc_mem_stats before, during, after;
    dsc_mem_get_stats(&before);
    dsc_kv_cache *c;
    assert_ok(dsc_kv_cache_create(&c, &cfg, DSC_CPU));
    assert_int_equal(dsc_kv_cache_num_blocks(c), 10); /* the 100 spare bytes are not a block */
    assert_int_equal(dsc_kv_blocks_total(dsc_kv_cache_blocks(c)), 10);
    dsc_mem_get_stats(&during);
    assert_int_equal(during.current[DSC_MEM_KV_CACHE] - before.current[DSC_MEM_KV_CACHE],
                     10 * dsc_kv_config_block_bytes(&cfg));
    dsc_tensor l0, l2;
    assert_ok(dsc_kv_cache_layer(c, 0, &l0));
    assert_ok(dsc_kv_cache_layer(c, 2, &l2));
    assert_int_equal(l0.ndim, 5);
    assert_int_equal(l0.shape[0], 10);
    assert_int_equal(l0.shape[1], 2);
    assert_int_equal(l0.shape[2], 4);
    assert_int_equal((float *)l2.data - (float *)l0.data, 2 * 10 * 2 * 4 * 2 * 8);
    assert_err(dsc_kv_cache_layer(c, 3, &l0), DSC_ERR_INVALID, "layer 3 out of range [0, 3)");
    dsc_kv_cache_destroy(c);
    dsc_mem_get_stats(&after);
    assert_int_equal(after.current[DSC_MEM_KV_CACHE], before.current[DSC_MEM_KV_CACHE]);

    /* A bf16 cache: half the bytes per block, twice the blocks for the budget. */
    cfg.dtype = DSC_DTYPE_BF16;
    assert_int_equal(dsc_kv_config_block_bytes(&cfg), 3 * 2 * 4 * 2 * 8 * 2);
    assert_ok(dsc_kv_cache_create(&c, &cfg, DSC_CPU));
    assert_int_equal(dsc_kv_cache_num_blocks(c), 20);
    assert_ok(dsc_kv_cache_layer(c, 1, &l0));
    assert_int_equal(l0.dtype, DSC_DTYPE_BF16);
    dsc_kv_cache_destroy(c);
    cfg.dtype = DSC_DTYPE_I32;
    assert_err(dsc_kv_config_validate(&cfg), DSC_ERR_CONFIG, "dtype must be f32 or bf16, got i32");
    cfg = small_config();

    cfg.kv_cache_bytes = 100;
    assert_err(dsc_kv_cache_create(&c, &cfg, DSC_CPU), DSC_ERR_CONFIG,
               "kv_cache_bytes 100 is less than one block");
    cfg = small_config();
    cfg.block_size = 0;
    assert_err(dsc_kv_cache_create(&c, &cfg, DSC_CPU), DSC_ERR_CONFIG, "block_size must be > 0");
    cfg = small_config();
    cfg.max_batch_sequences = 5;
    assert_err(dsc_kv_config_validate(&cfg), DSC_ERR_CONFIG,
               "max_batch_sequences (5) must be <= max_sequences (4)");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allocate_in_order_and_exhaustion),
        cmocka_unit_test(test_free_validates_before_freeing),
        cmocka_unit_test(test_random_stress),
        cmocka_unit_test(test_cache_sizing_and_accounting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
