/* The sequence state manager and ragged batches: block accounting per
 * sequence, all-or-nothing extension, scheduling answers and their order,
 * query, flush, and a batch's token/position/sequence layout. */
#include <stdio.h>
#include <string.h>

#include "dsc/kv_cache.h"
#include "dsc/rng.h"
#include "test_mpi.h"

static dsc_kv_config config(int32_t block_size) {
    return (dsc_kv_config){.num_layers = 1,
                           .num_kv_heads = 1,
                           .head_size = 1,
                           .block_size = block_size,
                           .kv_cache_bytes = 1,
                           .max_sequences = 3,
                           .max_context = 40,
                           .max_tokens_per_forward = 24,
                           .max_batch_sequences = 3};
}

typedef struct fixture {
    dsc_kv_config cfg;
    dsc_kv_blocks *blocks;
    dsc_kv_state *state;
} fixture;

static void setup(fixture *f, int32_t block_size, int32_t num_blocks) {
    f->cfg = config(block_size);
    assert_ok(dsc_kv_blocks_create(&f->blocks, num_blocks));
    assert_ok(dsc_kv_state_create(&f->state, &f->cfg, f->blocks));
}

static void teardown(fixture *f) {
    dsc_kv_state_destroy(f->state);
    dsc_kv_blocks_destroy(f->blocks);
}

static int64_t ceil_div(int64_t a, int64_t b) {
    return (a + b - 1) / b;
}

static void test_block_accounting(void **state) {
    (void)state;
    fixture f;
    setup(&f, 4, 20);
    dsc_kv_seq_info info;
    assert_false(dsc_kv_state_lookup(f.state, 7, &info));
    assert_int_equal(dsc_kv_state_blocks_needed(f.state, 7, 9), 3); /* unknown = empty sequence */
    assert_ok(dsc_kv_state_extend(f.state, 7, 5));
    assert_true(dsc_kv_state_lookup(f.state, 7, &info));
    assert_int_equal(info.seen_tokens, 0);
    assert_int_equal(info.in_flight_tokens, 5);
    assert_int_equal(info.num_blocks, 2);
    assert_int_equal(info.block_table[0], 0);
    assert_int_equal(info.block_table[1], 1);
    assert_ok(dsc_kv_state_commit(f.state, 7));
    /* 5 tokens fill 1.25 blocks: 3 more fit without a new block. */
    assert_int_equal(dsc_kv_state_blocks_needed(f.state, 7, 3), 0);
    assert_int_equal(dsc_kv_state_blocks_needed(f.state, 7, 4), 1);
    /* Grow one token at a time, as decoding does, checking used = ceil(tokens / BS). */
    for (int64_t t = 6; t <= 40; t++) {
        assert_ok(dsc_kv_state_extend(f.state, 7, 1));
        assert_ok(dsc_kv_state_commit(f.state, 7));
        assert_true(dsc_kv_state_lookup(f.state, 7, &info));
        assert_int_equal(info.seen_tokens, t);
        assert_int_equal(info.num_blocks, ceil_div(t, 4));
        assert_int_equal(dsc_kv_blocks_free_count(f.blocks), 20 - ceil_div(t, 4));
    }
    assert_err(dsc_kv_state_extend(f.state, 7, 1), DSC_ERR_INVALID, "40 tokens + 1 new exceed max_context 40");
    assert_ok(dsc_kv_state_flush(f.state, 7));
    assert_int_equal(dsc_kv_blocks_free_count(f.blocks), 20);
    assert_int_equal(dsc_kv_state_num_sequences(f.state), 0);
    assert_err(dsc_kv_state_flush(f.state, 7), DSC_ERR_INVALID, "flush of unknown sequence 7");
    teardown(&f);
}

static void test_extend_is_all_or_nothing(void **state) {
    (void)state;
    fixture f;
    setup(&f, 4, 5);
    assert_ok(dsc_kv_state_extend(f.state, 1, 12)); /* 3 blocks */
    /* A new sequence that does not fit is not left behind half-created. */
    assert_err(dsc_kv_state_extend(f.state, 2, 9), DSC_ERR_NOMEM, "requested 3 blocks but only 2 of 5 are free");
    dsc_kv_seq_info info;
    assert_false(dsc_kv_state_lookup(f.state, 2, &info));
    assert_int_equal(dsc_kv_state_num_sequences(f.state), 1);
    /* An existing one keeps its tokens and blocks. */
    assert_err(dsc_kv_state_extend(f.state, 1, 13), DSC_ERR_NOMEM, "extending sequence 1 by 13 tokens");
    assert_true(dsc_kv_state_lookup(f.state, 1, &info));
    assert_int_equal(info.in_flight_tokens, 12);
    assert_int_equal(info.num_blocks, 3);
    assert_int_equal(dsc_kv_blocks_free_count(f.blocks), 2);
    /* Sequence slots run out at max_sequences = 3. */
    assert_ok(dsc_kv_state_extend(f.state, 2, 1));
    assert_ok(dsc_kv_state_extend(f.state, 3, 1));
    assert_err(dsc_kv_state_extend(f.state, 4, 0), DSC_ERR_NOMEM, "all 3 sequence slots are in use");
    assert_err(dsc_kv_state_get_or_create(f.state, 4), DSC_ERR_NOMEM, "cannot track sequence 4");
    assert_ok(dsc_kv_state_get_or_create(f.state, 3)); /* already tracked */
    teardown(&f);
}

static void test_scheduling_answers(void **state) {
    (void)state;
    fixture f;
    setup(&f, 4, 6);
    assert_ok(dsc_kv_state_extend(f.state, 10, 6)); /* 2 blocks, 4 free */
    assert_ok(dsc_kv_state_commit(f.state, 10));
    int32_t free_blocks = dsc_kv_blocks_free_count(f.blocks);
    assert_int_equal(dsc_kv_state_check(f.state, 10, 2, free_blocks), DSC_SCHED_OK);
    assert_int_equal(dsc_kv_state_check(f.state, 10, 35, 100), DSC_SCHED_SEQUENCE_TOO_LONG);
    assert_int_equal(dsc_kv_state_check(f.state, 10, 19, free_blocks), DSC_SCHED_KV_EXHAUSTED);
    assert_int_equal(dsc_kv_state_check(f.state, 10, 18, free_blocks), DSC_SCHED_OK);

    uint64_t uids[4] = {10, 11, 12, 13};
    assert_int_equal(dsc_kv_state_can_schedule(f.state, uids, (int64_t[]){1, 4, 4}, 3), DSC_SCHED_OK);
    assert_int_equal(dsc_kv_state_can_schedule(f.state, uids, (int64_t[]){1, 1, 1, 1}, 4),
                     DSC_SCHED_TOO_MANY_SEQUENCES); /* > max_batch_sequences */
    /* The running budget: 4 free blocks cover 0 + 2 + 1 new ones, not 1 + 2 + 2. */
    assert_int_equal(dsc_kv_state_can_schedule(f.state, uids, (int64_t[]){2, 8, 1}, 3), DSC_SCHED_OK);
    assert_int_equal(dsc_kv_state_can_schedule(f.state, uids, (int64_t[]){3, 8, 5}, 3), DSC_SCHED_KV_EXHAUSTED);
    assert_int_equal(dsc_kv_state_can_schedule(f.state, uids, (int64_t[]){40, 1}, 2), DSC_SCHED_SEQUENCE_TOO_LONG);
    assert_int_equal(dsc_kv_state_can_schedule(f.state, uids, (int64_t[]){2, 15, 8}, 3), DSC_SCHED_KV_EXHAUSTED);
    teardown(&f);

    setup(&f, 16, 10);
    assert_int_equal(dsc_kv_state_can_schedule(f.state, uids, (int64_t[]){10, 10, 5}, 3),
                     DSC_SCHED_TOO_MANY_TOKENS);
    assert_ok(dsc_kv_state_extend(f.state, 1, 1));
    assert_ok(dsc_kv_state_extend(f.state, 2, 1));
    /* Two tracked + two new uids > max_sequences = 3. */
    assert_int_equal(dsc_kv_state_can_schedule(f.state, uids, (int64_t[]){1, 1}, 2), DSC_SCHED_TOO_MANY_SEQUENCES);
    assert_int_equal(dsc_kv_state_can_schedule(f.state, (uint64_t[]){1, 2, 11}, (int64_t[]){1, 1, 1}, 3),
                     DSC_SCHED_OK);
    /* Checks are side-effect free. */
    assert_int_equal(dsc_kv_state_num_sequences(f.state), 2);
    assert_int_equal(dsc_kv_blocks_free_count(f.blocks), 8);
    for (int r = DSC_SCHED_OK; r <= DSC_SCHED_SEQUENCE_TOO_LONG; r++)
        assert_true(strlen(dsc_sched_result_name((dsc_sched_result)r)) > 1);
    teardown(&f);
}

static void test_query(void **state) {
    (void)state;
    fixture f;
    setup(&f, 4, 20);
    int64_t tokens;
    int32_t blocks;
    dsc_kv_state_query(f.state, 5, 10, 100, &tokens, &blocks);
    assert_int_equal(tokens, 10);
    assert_int_equal(blocks, 3);
    assert_ok(dsc_kv_state_extend(f.state, 5, 6)); /* 2 blocks, 2 slots left in the last */
    /* Only one new block allowed: 2 + 4 tokens fit. */
    dsc_kv_state_query(f.state, 5, 10, 1, &tokens, &blocks);
    assert_int_equal(tokens, 6);
    assert_int_equal(blocks, 1);
    /* max_context caps the answer: 40 - 6 = 34. */
    dsc_kv_state_query(f.state, 5, 100, 100, &tokens, &blocks);
    assert_int_equal(tokens, 34);
    assert_int_equal(blocks, 8);
    assert_ok(dsc_kv_state_extend(f.state, 6, 1));
    assert_ok(dsc_kv_state_extend(f.state, 7, 1));
    dsc_kv_state_query(f.state, 8, 10, 100, &tokens, &blocks); /* no slot left for a new uid */
    assert_int_equal(tokens, 0);
    assert_int_equal(blocks, 0);
    teardown(&f);
}

/* Many uids created and flushed in random order keep the uid lookup right
 * (exercises the hash table's deletion) and the block pool balanced. */
static void test_random_lifecycle(void **state) {
    (void)state;
    dsc_kv_config cfg = config(3);
    cfg.max_sequences = 17;
    cfg.max_batch_sequences = 17;
    dsc_kv_blocks *blocks;
    dsc_kv_state *st;
    assert_ok(dsc_kv_blocks_create(&blocks, 120));
    assert_ok(dsc_kv_state_create(&st, &cfg, blocks));
    uint64_t live[17];
    int64_t tokens[17];
    int n_live = 0;
    dsc_rng rng;
    dsc_rng_init(&rng, 99, 0, DSC_RNG_DATA);
    for (int step = 0; step < 5000; step++) {
        uint64_t r = dsc_rng_below(&rng, 3);
        if (r == 0 && n_live < 17) {
            /* Up to 17 live uids in a 64-slot table: probe runs and shifts on delete. */
            uint64_t uid = dsc_rng_u64(&rng) % 1000 * 64;
            dsc_kv_seq_info info;
            if (dsc_kv_state_lookup(st, uid, &info)) continue;
            int64_t n = 1 + (int64_t)dsc_rng_below(&rng, 10);
            dsc_status s = dsc_kv_state_extend(st, uid, n);
            if (s) {
                dsc_status_free(s);
                continue;
            }
            live[n_live] = uid;
            tokens[n_live++] = n;
        } else if (r == 1 && n_live > 0) {
            int k = (int)dsc_rng_below(&rng, (uint64_t)n_live);
            assert_ok(dsc_kv_state_flush(st, live[k]));
            live[k] = live[--n_live];
            tokens[k] = tokens[n_live];
        } else if (n_live > 0) {
            int k = (int)dsc_rng_below(&rng, (uint64_t)n_live);
            if (tokens[k] + 2 <= cfg.max_context && dsc_kv_state_extend(st, live[k], 2) == NULL) tokens[k] += 2;
        }
        int64_t used = 0;
        for (int i = 0; i < n_live; i++) {
            dsc_kv_seq_info info;
            assert_true(dsc_kv_state_lookup(st, live[i], &info));
            assert_int_equal(info.uid, live[i]);
            assert_int_equal(info.in_flight_tokens, tokens[i]);
            assert_int_equal(info.num_blocks, ceil_div(tokens[i], 3));
            used += info.num_blocks;
        }
        assert_int_equal(dsc_kv_state_num_sequences(st), n_live);
        assert_int_equal(used + dsc_kv_blocks_free_count(blocks), 120);
    }
    dsc_kv_state_destroy(st);
    dsc_kv_blocks_destroy(blocks);
}

static void test_ragged_batch_layout(void **state) {
    (void)state;
    fixture f;
    setup(&f, 4, 20);
    dsc_ragged_batch b;
    assert_ok(dsc_ragged_batch_init(&b, &f.cfg));
    /* Sequence 3 already has 5 cached tokens; 8 and 9 are new prompts. */
    assert_ok(dsc_kv_state_extend(f.state, 3, 5));
    assert_ok(dsc_kv_state_commit(f.state, 3));
    const int32_t p8[] = {80, 81, 82, 83}, p3[] = {30}, p9[] = {90, 91, 92};
    const int32_t *toks[] = {p8, p3, p9};
    assert_ok(dsc_ragged_batch_build(&b, f.state, 3, (uint64_t[]){8, 3, 9}, toks, (int32_t[]){4, 1, 3}));
    assert_int_equal(b.n_tokens, 8);
    assert_int_equal(b.n_seqs, 3);
    const int32_t want_tokens[] = {80, 81, 82, 83, 30, 90, 91, 92};
    const int64_t want_pos[] = {0, 1, 2, 3, 5, 0, 1, 2};
    const int32_t want_seq[] = {0, 0, 0, 0, 1, 2, 2, 2};
    for (int t = 0; t < 8; t++) {
        assert_int_equal(b.tokens[t], want_tokens[t]);
        assert_int_equal(b.positions[t], want_pos[t]);
        assert_int_equal(b.token_seq[t], want_seq[t]);
    }
    assert_int_equal(b.last_token[0], 3);
    assert_int_equal(b.last_token[1], 4);
    assert_int_equal(b.last_token[2], 7);
    assert_int_equal(b.seqs[1].start, 4);
    assert_int_equal(b.seqs[1].n_new, 1);
    assert_int_equal(b.seqs[1].n_cached, 5);
    assert_int_equal(b.seqs[1].num_blocks, 2);
    assert_int_equal(b.seqs[0].num_blocks, 1);
    assert_int_equal(b.seqs[2].n_cached, 0);
    assert_ok(dsc_ragged_batch_finish(&b, f.state));
    dsc_kv_seq_info info;
    assert_true(dsc_kv_state_lookup(f.state, 3, &info));
    assert_int_equal(info.seen_tokens, 6);
    assert_int_equal(info.in_flight_tokens, 0);

    /* Rejected batches leave the state untouched. */
    int32_t free_before = dsc_kv_blocks_free_count(f.blocks);
    assert_err(dsc_ragged_batch_build(&b, f.state, 2, (uint64_t[]){8, 8}, toks, (int32_t[]){1, 1}),
               DSC_ERR_INVALID, "sequence 8 appears twice");
    assert_err(dsc_ragged_batch_build(&b, f.state, 1, (uint64_t[]){8}, toks, (int32_t[]){0}), DSC_ERR_INVALID,
               "sequence 8 has 0 tokens");
    int32_t big[40] = {0};
    const int32_t *bigt[] = {big, big};
    assert_err(dsc_ragged_batch_build(&b, f.state, 2, (uint64_t[]){8, 9}, bigt, (int32_t[]){20, 10}),
               DSC_ERR_INVALID, "too many tokens");
    assert_err(dsc_ragged_batch_build(&b, f.state, 1, (uint64_t[]){9}, bigt, (int32_t[]){38}), DSC_ERR_INVALID,
               "sequence too long"); /* 3 + 38 > max_context 40, checked before the token budget */
    assert_err(dsc_ragged_batch_build(&b, f.state, 1, (uint64_t[]){11}, bigt, (int32_t[]){1}), DSC_ERR_NOMEM,
               "too many sequences");
    assert_int_equal(dsc_kv_blocks_free_count(f.blocks), free_before);
    assert_int_equal(dsc_kv_state_num_sequences(f.state), 3);
    dsc_ragged_batch_free(&b);
    teardown(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_block_accounting),   cmocka_unit_test(test_extend_is_all_or_nothing),
        cmocka_unit_test(test_scheduling_answers), cmocka_unit_test(test_query),
        cmocka_unit_test(test_random_lifecycle),   cmocka_unit_test(test_ragged_batch_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
