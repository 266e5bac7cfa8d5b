/* The multi-rank plan channel (serve/plan_comm.c) on 2 and 3 ranks: every
 * rank ends with rank 0's plan, field for field (submits with their prompt
 * and stop tokens and logprobs counts, cancels, the stop flag), whatever
 * it held before (a bigger plan grows the followers' buffers, an empty one
 * clears them); a
 * submit whose tokens lie outside the plan's ids, or that asks for more
 * logprobs than OpenAI allows, is refused by the followers as corrupt. */
#include <stdio.h>
#include <string.h>

#include "dsc/comm.h"
#include "serve/plan.h"
#include "test_mpi.h"

/* The plan of round `round`: `round * 3` submits with distinct prompts, seeds
 * and sampling, `round` cancels, stop on round 0. Every rank can build it. */
static void build(serve_plan *p, int round) {
    serve_plan_clear(p);
    for (int i = 0; i < round * 3; i++) {
        int32_t prompt[40], stop[3] = {2, 7 + i, 9};
        int32_t n = 1 + (i * 13 + round) % 40;
        for (int32_t t = 0; t < n; t++)
            prompt[t] = (i * 31 + t * 7 + round) % 128;
        dsc_gen_request r = {
            .uid = (uint64_t)(1000 * round + i),
            .prompt = prompt,
            .n_prompt = n,
            .max_new_tokens = 5 + i,
            .sampling = {.temperature = 0.1f * (float)i, .top_k = i, .top_p = 0.9f, .repetition_penalty = 1},
            .seed = 77 + (uint64_t)i,
            .stop_tokens = stop,
            .n_stop = i % 4};
        assert_ok(serve_plan_add_submit(p, &r, i % 3 - 1));
    }
    for (int i = 0; i < round; i++)
        assert_ok(serve_plan_add_cancel(p, (uint64_t)(500 + i)));
    p->stop = round == 0;
}

static void assert_same(const serve_plan *a, const serve_plan *b) {
    assert_int_equal(a->n_submits, b->n_submits);
    assert_int_equal(a->n_ids, b->n_ids);
    assert_int_equal(a->n_cancels, b->n_cancels);
    assert_int_equal(a->stop, b->stop);
    for (int32_t i = 0; i < a->n_submits; i++) {
        const serve_plan_submit *x = &a->submits[i], *y = &b->submits[i];
        assert_int_equal(x->uid, y->uid);
        assert_int_equal(x->n_prompt, y->n_prompt);
        assert_int_equal(x->n_stop, y->n_stop);
        assert_int_equal(x->max_new_tokens, y->max_new_tokens);
        assert_int_equal(x->seed, y->seed);
        assert_int_equal(x->logprobs, y->logprobs);
        assert_true(x->sampling.temperature == y->sampling.temperature && x->sampling.top_k == y->sampling.top_k &&
                    x->sampling.top_p == y->sampling.top_p);
        assert_memory_equal(a->ids + x->prompt_off, b->ids + y->prompt_off, (size_t)x->n_prompt * sizeof(int32_t));
        if (x->n_stop)
            assert_memory_equal(a->ids + x->stop_off, b->ids + y->stop_off, (size_t)x->n_stop * sizeof(int32_t));
    }
    if (a->n_cancels) assert_memory_equal(a->cancels, b->cancels, (size_t)a->n_cancels * sizeof(uint64_t));
}

static void test_followers_get_rank0s_plan(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    int rank = dsc_comm_rank(world);
    serve_plan_channel ch = serve_plan_channel_comm(world);
    serve_plan mine = {0}, expect = {0};
    const int rounds[] = {2, 5, 1, 0, 3};
    for (int k = 0; k < 5; k++) {
        build(&expect, rounds[k]);
        if (rank == 0)
            build(&mine, rounds[k]);
        else
            build(&mine, 4 - k % 3); /* whatever a follower held before: overwritten */
        assert_ok(ch.exchange(ch.impl, &mine));
        assert_same(&mine, &expect);
    }
    printf("rank %d: 5 plans (up to 15 submits, %lld ids) as rank 0 sent them\n", rank, (long long)mine.n_ids);
    serve_plan_free(&mine);
    serve_plan_free(&expect);
    dsc_comm_free(world);
}

static void test_followers_refuse_a_bad_range(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    serve_plan_channel ch = serve_plan_channel_comm(world);
    serve_plan p = {0};
    build(&p, 1);
    if (dsc_comm_rank(world) == 0) {
        p.submits[2].prompt_off = p.n_ids - 1; /* its prompt runs past the ids */
        assert_ok(ch.exchange(ch.impl, &p));
        build(&p, 1);
        p.submits[1].logprobs = 21;
        assert_ok(ch.exchange(ch.impl, &p));
    } else {
        assert_err(ch.exchange(ch.impl, &p), DSC_ERR_CORRUPT, "submit 2 (uid 1002) names tokens outside");
        assert_err(ch.exchange(ch.impl, &p), DSC_ERR_CORRUPT, "submit 1 (uid 1001) asks for 21 logprobs");
    }
    serve_plan_free(&p);
    dsc_comm_free(world);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_followers_get_rank0s_plan),
                                       cmocka_unit_test(test_followers_refuse_a_bad_range)};
    return DSC_RUN_MPI_TESTS(tests);
}
