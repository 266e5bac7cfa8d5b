/* Expert-parallel serving equals one process. Every rank loads the whole
 * model (the reference) and its expert-parallel layout over the world, and
 * drives a continuous-batching scheduler over both with the same requests:
 * prompts of mixed lengths, greedy, a token budget that splits prompts into
 * chunks, and a KV budget small enough to force recompute preemptions. The
 * greedy tokens of every request must be equal, and so must the logits rows
 * they were sampled from (1e-4 relative; the rank's vocabulary slice under
 * TP), with the same number of preemptions. Layouts: EP = world (attention
 * replicated, experts split 4/ep per rank, uneven at 3 ranks) and, at 4
 * ranks, TP 2 x EP 2 (DeepSpeed's expert-tensor grid: attention and each
 * expert's width TP-split, experts split over the data axis) and PP 2 x EP 2
 * (pipeline stages, each with its EP group), at 8 ranks TP 2 x PP 2 x EP 2;
 * under PP the preemption count may differ (micro-batches in flight). Models: the
 * Hugging Face Mixtral and Qwen2-MoE (shared expert, dense and sparse
 * layers, both weightings) fixtures and test_dsc_moe's gpt-moe and mixtral
 * checkpoints (directory argument). The weight memory of an EP rank must
 * hold only its experts: the whole model minus the others' experts. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/inference.h"
#include "dsc/memory.h"
#include "dsc/topology.h"
#include "test_mpi.h"

#define FIXTURES DSC_SOURCE_DIR "/tests/inference/fixtures/hf/"

enum { NREQ = 6, MAXNEW = 8, MAXTOK = 64, VMAX = 512 };

static const int32_t LENGTHS[NREQ] = {1, 9, 4, 14, 6, 2};

/* The tokens and logits rows one scheduler run produced, per request. */
typedef struct outputs {
    const dsc_scheduler *sched;
    int32_t width;
    bool rows; /* this rank sees the logits rows (under PP only the last stage does) */
    int32_t n[NREQ];
    int32_t tok[NREQ][MAXNEW];
    float logits[NREQ][MAXNEW][VMAX];
} outputs;

static dsc_status collect(void *user, uint64_t uid, int32_t token, bool finished) {
    (void)finished;
    outputs *o = user;
    int i = (int)uid;
    DSC_CHECK(i >= 0 && i < NREQ && o->n[i] < MAXNEW, DSC_ERR_INTERNAL, "unexpected token for uid %d", i);
    const float *row = dsc_scheduler_token_logits(o->sched);
    o->rows = row != NULL;
    if (row) memcpy(o->logits[i][o->n[i]], row, (size_t)o->width * sizeof(float));
    o->tok[i][o->n[i]++] = token;
    return NULL;
}

/* An engine with `blocks` KV blocks of 4 tokens. */
static dsc_infer_engine *make_engine(dsc_infer_model *m, int32_t blocks) {
    dsc_infer_engine_config ec = dsc_infer_engine_config_default(m);
    ec.block_size = 4;
    ec.max_tokens_per_forward = 32;
    ec.max_batch_sequences = ec.max_sequences = NREQ;
    ec.kv_cache_bytes = 1 << 20;
    dsc_infer_engine *e;
    assert_ok(dsc_infer_engine_create(m, &ec, &e));
    ec.kv_cache_bytes = (int64_t)blocks * (int64_t)dsc_kv_config_block_bytes(dsc_infer_engine_kv_config(e));
    dsc_infer_engine_destroy(e);
    assert_ok(dsc_infer_engine_create(m, &ec, &e));
    return e;
}

/* Runs the requests to completion; returns the preemptions. */
static int64_t generate(dsc_infer_model *m, int32_t vocab, outputs *o) {
    dsc_infer_engine *e = make_engine(m, 9);
    dsc_scheduler_config sc = dsc_scheduler_config_default(e);
    sc.token_budget = 12;
    sc.kv_reserve_tokens = 0;
    dsc_scheduler *s;
    memset(o, 0, sizeof *o);
    o->width = dsc_infer_engine_logits_width(e);
    assert_true(o->width <= VMAX);
    assert_ok(dsc_scheduler_create(e, &sc, collect, o, &s));
    o->sched = s;
    for (int i = 0; i < NREQ; i++) {
        int32_t prompt[MAXTOK];
        for (int j = 0; j < LENGTHS[i]; j++)
            prompt[j] = (int32_t)((7 * i + 13 * j + 3) % vocab);
        dsc_gen_request r = {.uid = (uint64_t)i,
                             .prompt = prompt,
                             .n_prompt = LENGTHS[i],
                             .max_new_tokens = MAXNEW,
                             .sampling = dsc_sampling_params_greedy()};
        assert_ok(dsc_scheduler_submit(s, &r));
    }
    assert_ok(dsc_scheduler_run(s));
    int64_t preemptions = dsc_scheduler_get_stats(s)->preemptions;
    assert_int_equal(dsc_infer_engine_free_blocks(e), dsc_infer_engine_total_blocks(e));
    dsc_scheduler_destroy(s);
    dsc_infer_engine_destroy(e);
    return preemptions;
}

/* The world as DeepSpeed's expert-tensor grid (axes pipe, data, model):
 * TP groups of consecutive ranks, EP groups across them along data, pp
 * pipeline stages. */
typedef struct grid {
    dsc_group_plan plan;
    dsc_groups *groups;
    dsc_infer_tp tp;
    dsc_infer_pp pp;
} grid;

static void grid_init(grid *g, dsc_comm *world, int tp, int pp) {
    int size = dsc_comm_size(world), ep = size / (tp * pp);
    dsc_parallel_dims dims = {.pp = pp, .dp = ep, .tp = tp, .ep = ep, .expert_tp = true};
    assert_ok(dsc_groups_plan(size, dsc_comm_rank(world), &dims, &g->plan));
    assert_ok(dsc_groups_create(world, &g->plan, &g->groups));
    g->tp = (dsc_infer_tp){.comm = tp > 1 ? dsc_groups_get(g->groups, DSC_GROUP_KIND_TENSOR) : NULL,
                           .tp_size = 1,
                           .ep_comm = dsc_groups_get(g->groups, DSC_GROUP_KIND_EXPERT)};
    g->pp = (dsc_infer_pp){.comm = pp > 1 ? dsc_groups_get(g->groups, DSC_GROUP_KIND_PIPE) : NULL};
}

static void grid_free(grid *g) {
    dsc_groups_free(g->groups);
    dsc_group_plan_free(&g->plan);
}

static void compare(const char *dir, const char *what, int tp, int pp) {
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    grid g;
    grid_init(&g, world, tp, pp);
    int ep = dsc_comm_size(g.tp.ep_comm);
    dsc_infer_model *ref, *m;
    assert_ok(dsc_infer_model_load(dir, &ref));
    assert_ok(dsc_infer_model_load_parallel(dir, &g.tp, &g.pp, &m));
    int32_t V = dsc_infer_model_get_config(ref)->vocab_size;
    int64_t v0, nv;
    dsc_infer_model_vocab_shard(m, &v0, &nv);
    outputs *want = malloc(sizeof *want), *got = malloc(sizeof *got);
    int64_t pre_want = generate(ref, V, want), pre_got = generate(m, V, got);
    assert_true(pre_want > 0);
    if (pp == 1) assert_int_equal(pre_got, pre_want); /* P micro-batches in flight schedule differently */
    double worst = 0;
    for (int i = 0; i < NREQ; i++) {
        assert_int_equal(got->n[i], MAXNEW);
        assert_memory_equal(got->tok[i], want->tok[i], sizeof got->tok[i]);
        for (int t = 0; got->rows && t < MAXNEW; t++) {
            double err = dsc_test_rel_err(got->logits[i][t], want->logits[i][t] + v0, nv);
            worst = err > worst ? err : worst;
        }
    }
    printf("%s at tp %d x pp %d x ep %d: %d requests, %lld preemptions (%lld at one rank), greedy tokens equal, "
           "worst logits error %.2e\n",
           what, tp, pp, ep, NREQ, (long long)pre_got, (long long)pre_want, worst);
    assert_true(worst <= 1e-4);
    if (tp == 1 && pp == 1) { /* only the rank's experts: 1/ep of the experts' bytes, the rest whole */
        size_t whole = dsc_infer_model_arena_bytes(ref), mine = dsc_infer_model_arena_bytes(m);
        printf("%s weights at ep %d: %zu of %zu bytes on this rank\n", what, ep, mine, whole);
        assert_true(mine < whole);
    }
    free(want);
    free(got);
    dsc_infer_model_destroy(m);
    dsc_infer_model_destroy(ref);
    grid_free(&g);
    dsc_comm_free(world);
}

static const char *dsc_ckpt_dir; /* argv[1]: test_dsc_moe's kept checkpoints (gpt-moe, mixtral) */

static void each_model(int tp, int pp) {
    compare(FIXTURES "mixtral", "hf mixtral", tp, pp);
    compare(FIXTURES "qwen2_moe", "hf qwen2-moe (raw top-k weights)", tp, pp);
    compare(FIXTURES "qwen2_moe_tf5", "hf qwen2-moe (renormalised)", tp, pp);
    if (!dsc_ckpt_dir) return;
    const char *names[] = {"gpt-moe", "mixtral"};
    for (int i = 0; i < 2; i++) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/%s", dsc_ckpt_dir, names[i]);
        compare(dir, names[i], tp, pp);
    }
}

static int world_size(void) {
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    return size;
}

static void test_ep(void **state) {
    (void)state;
    if (world_size() > 4) skip(); /* the fixtures have 4 experts */
    each_model(1, 1);
}

static void test_tp_ep(void **state) {
    (void)state;
    if (world_size() != 4) skip();
    each_model(2, 1);
}

static void test_pp_ep(void **state) {
    (void)state;
    if (world_size() != 4) skip();
    each_model(1, 2);
}

/* 8 ranks: TP 2 x PP 2 x EP 2. */
static void test_tp_pp_ep(void **state) {
    (void)state;
    if (world_size() != 8) skip();
    each_model(2, 2);
}

/* A dense model (no experts to split) is refused expert-parallel, naming the numbers. */
static void test_dense_refused(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    if (dsc_comm_size(world) < 2) skip();
    dsc_infer_tp tp = {.tp_size = 1, .ep_comm = world};
    dsc_infer_model *m = NULL;
    assert_err(dsc_infer_model_load_tp(FIXTURES "llama", &tp, &m), DSC_ERR_CONFIG,
               "needs a MoE model with at least");
    assert_null(m);
    dsc_comm_free(world);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    dsc_ckpt_dir = argc > 1 ? argv[1] : NULL;
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_ep), cmocka_unit_test(test_tp_ep),
                                       cmocka_unit_test(test_pp_ep), cmocka_unit_test(test_tp_pp_ep),
                                       cmocka_unit_test(test_dense_refused)};
    return DSC_RUN_MPI_TESTS(tests);
}
