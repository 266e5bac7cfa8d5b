/* Pipeline-parallel serving equals one process. Every rank generates the
 * same continuous batch twice: with the whole model in one process (the
 * reference) and with the model cut into stages over the world (PP = world
 * size, and TP 2 x PP 2 on DeepSpeed's grid at 4 ranks). The batch mixes
 * prompt lengths, runs chunked prefill, and its KV cache is small enough,
 * with an optimistic reservation, that requests are preempted (asserted);
 * the greedy tokens of every request must be equal, on every rank. Models:
 * the Hugging Face fixtures (Llama, Qwen2 with tied embeddings; 2 layers),
 * random-weight Llama checkpoints with 4 and 5 layers (uniform and
 * parameters partitions, uneven stages), and test_dsc_moe's dsc checkpoint
 * (gpt-moe) when its directory is given. Also:
 *  - put() over the pipeline returns the one-process logits on every rank
 *    (the API cannot tell the layout);
 *  - KV blocks are accounted per stage and never leak: releasing requests
 *    while their micro-batches are in flight, then finishing, leaves every
 *    stage's cache wholly free, and the others' tokens are unchanged;
 *  - a weight budget (max_weight_bytes) refuses the whole model on one rank
 *    naming the bytes it needs, and PP over the world fits it, each rank's
 *    weight and KV memory within 5% of the formula in docs/inference.md;
 *  - OPT's project_in / project_out only on the stage that uses them (first
 *    / last): each stage's weight bytes equal the formula exactly. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/inference.h"
#include "dsc/memory.h"
#include "dsc/pipe.h"
#include "dsc/topology.h"
#include "synth_model.h"
#include "test_mpi.h"

#define FIXTURES DSC_SOURCE_DIR "/tests/inference/fixtures/hf/"
enum { NREQ = 6, MAX_NEW = 10, BLOCK = 4, BLOCKS = 12 };

static const int32_t prompt_len[NREQ] = {3, 9, 5, 12, 2, 7};

/* ---- layouts ---------------------------------------------------------------------------------- */

typedef struct layout {
    dsc_groups *groups;
    dsc_comm *tp, *pipe; /* NULL when of size 1 */
    int tp_size, pp_size;
} layout;

static void make_layout(dsc_comm *world, int tp, layout *l) {
    int size = dsc_comm_size(world);
    dsc_group_plan plan;
    dsc_parallel_dims dims = {.pp = size / tp, .dp = 1, .tp = tp};
    assert_ok(dsc_groups_plan(size, dsc_comm_rank(world), &dims, &plan));
    assert_ok(dsc_groups_create(world, &plan, &l->groups));
    dsc_group_plan_free(&plan);
    l->tp_size = tp;
    l->pp_size = size / tp;
    l->tp = tp > 1 ? dsc_groups_get(l->groups, DSC_GROUP_KIND_TENSOR) : NULL;
    l->pipe = l->pp_size > 1 ? dsc_groups_get(l->groups, DSC_GROUP_KIND_PIPE) : NULL;
}

static void load(const char *dir, const layout *l, const char *method, dsc_infer_model **m) {
    dsc_infer_tp tp = {.comm = l ? l->tp : NULL};
    dsc_infer_pp pp = {.comm = l ? l->pipe : NULL, .partition_method = method};
    assert_ok(dsc_infer_model_load_parallel(dir, tp.comm ? &tp : NULL, &pp, m));
}

/* KV bytes for BLOCKS blocks on the widest rank (the most layers of any
 * stage, as describe() names them, over `pipe`; ceil(NKV / TP) heads). */
static int64_t kv_budget(const dsc_infer_model *m, dsc_comm *pipe, int tp) {
    const dsc_infer_model_config *c = dsc_infer_model_get_config(m);
    char holds[512];
    int stage, stages, a, b;
    dsc_infer_model_describe(m, holds, sizeof holds);
    assert_int_equal(sscanf(holds, "stage %d of %d: layers %d-%d", &stage, &stages, &a, &b), 4);
    int64_t layers = b - a + 1, heads = (c->n_kv_head + tp - 1) / tp;
    dsc_tensor t = dsc_tensor_view(&layers, DSC_DTYPE_I64, 1, (int64_t[]){1}, DSC_CPU);
    if (pipe) assert_ok(dsc_comm_allreduce(pipe, &t, DSC_REDUCE_OP_MAX));
    return (int64_t)BLOCKS * layers * 2 * BLOCK * heads * c->head_size * (int64_t)sizeof(float);
}

/* Micro-batches in flight in the pipelined engines (0: as many as stages). */
static int32_t split_micro_batches;

static dsc_infer_engine *engine(dsc_infer_model *m, int64_t kv_bytes, int32_t micro_batches) {
    dsc_infer_engine_config ec = dsc_infer_engine_config_default(m);
    ec.micro_batches = micro_batches;
    ec.block_size = BLOCK;
    ec.kv_cache_bytes = kv_bytes;
    ec.max_sequences = ec.max_batch_sequences = NREQ;
    ec.max_tokens_per_forward = 64;
    dsc_infer_engine *e;
    assert_ok(dsc_infer_engine_create(m, &ec, &e));
    assert_int_equal(dsc_infer_engine_total_blocks(e), BLOCKS);
    return e;
}

/* ---- generation -------------------------------------------------------------------------------- */

typedef struct gen {
    int32_t tokens[NREQ][MAX_NEW];
    int32_t n[NREQ];
    bool done[NREQ];
    dsc_scheduler_stats stats;
} gen;

static dsc_status on_token(void *user, uint64_t uid, int32_t token, bool finished) {
    gen *g = user;
    int r = (int)uid - 1;
    if (g->n[r] >= MAX_NEW) return dsc_error(DSC_ERR_INTERNAL, "request %d: too many tokens", r + 1);
    g->tokens[r][g->n[r]++] = token;
    g->done[r] = finished;
    return NULL;
}

typedef struct run_opts {
    int cancel_after; /* > 0: release requests 2 and 5 after this many steps */
} run_opts;

/* The batch on engine e; returns the preemptions. */
static int64_t generate(dsc_infer_engine *e, int32_t V, const run_opts *o, gen *g) {
    memset(g, 0, sizeof *g);
    dsc_scheduler_config sc = dsc_scheduler_config_default(e);
    sc.token_budget = 8;      /* chunked prefill */
    sc.kv_reserve_tokens = 1; /* optimistic: decodes outgrow the cache, so requests are preempted */
    dsc_scheduler *s;
    assert_ok(dsc_scheduler_create(e, &sc, on_token, g, &s));
    for (int r = 0; r < NREQ; r++) {
        int32_t prompt[16];
        for (int i = 0; i < prompt_len[r]; i++)
            prompt[i] = (7 * r + 13 * i + 5) % V;
        dsc_gen_request req = {.uid = (uint64_t)r + 1,
                               .prompt = prompt,
                               .n_prompt = prompt_len[r],
                               .max_new_tokens = MAX_NEW - r % 3,
                               .sampling = dsc_sampling_params_greedy(),
                               .seed = 1};
        assert_ok(dsc_scheduler_submit(s, &req));
    }
    bool idle = false;
    for (int step = 1; !idle; step++) {
        assert_ok(dsc_scheduler_step(s, &idle));
        if (step == o->cancel_after) {
            assert_ok(dsc_scheduler_release(s, 2));
            assert_ok(dsc_scheduler_release(s, 5));
        }
    }
    g->stats = *dsc_scheduler_get_stats(s);
    int64_t preemptions = g->stats.preemptions;
    for (int r = 0; r < NREQ; r++)
        if (!o->cancel_after || (r != 1 && r != 4)) assert_ok(dsc_scheduler_release(s, (uint64_t)r + 1));
    /* every stage's cache is free again: nothing leaked on preemption or cancellation */
    assert_int_equal(dsc_infer_engine_free_blocks(e), dsc_infer_engine_total_blocks(e));
    dsc_scheduler_destroy(s);
    return preemptions;
}

static void expect_same_tokens(const gen *want, const gen *got, bool cancelled, const char *what) {
    for (int r = 0; r < NREQ; r++) {
        if (cancelled && (r == 1 || r == 4)) continue;
        assert_int_equal(got->n[r], want->n[r]);
        assert_true(got->done[r]);
        for (int i = 0; i < want->n[r]; i++)
            if (got->tokens[r][i] != want->tokens[r][i])
                fail_msg("%s: request %d token %d is %d, one process gives %d", what, r + 1, i, got->tokens[r][i],
                         want->tokens[r][i]);
    }
}

/* put() through the pipeline: the one-process logits on every rank. */
static void check_put(dsc_infer_engine *ref, dsc_infer_engine *pp, const char *what) {
    int32_t W = dsc_infer_engine_logits_width(pp), V = dsc_infer_engine_vocab_size(ref);
    if (W != V) return; /* under TP the logits are a slice: test_tp_engine checks those */
    int32_t a[] = {1, 2, 3, 4}, b[] = {9, 8};
    const int32_t *toks[] = {a, b};
    int32_t counts[] = {4, 2};
    uint64_t uids[] = {101, 102};
    float *x = malloc(2 * (size_t)V * sizeof *x), *y = malloc(2 * (size_t)V * sizeof *y);
    assert_ok(dsc_infer_engine_put(ref, 2, uids, toks, counts, x));
    assert_ok(dsc_infer_engine_put(pp, 2, uids, toks, counts, y));
    char label[256];
    snprintf(label, sizeof label, "%s put() logits", what);
    assert_true(dsc_test_max_rel_err(y, x, 2 * (int64_t)V, 1e-3, label) <= 1e-5);
    for (int i = 0; i < 2; i++) {
        assert_ok(dsc_infer_engine_flush(ref, uids[i]));
        assert_ok(dsc_infer_engine_flush(pp, uids[i]));
    }
    free(x);
    free(y);
}

/* The activation bytes between stages, from the pipe communicator's
 * counters: a fresh engine generates the batch (tokens equal one process),
 * and its M micro-batches of T tokens in all cross every stage boundary
 * once, each as one message of HDR int32 words (the header fused with the
 * payload, inference/pipeline.c) and this TP rank's slice of the (N, C)
 * activation — ceil or floor of N·C / tp floats (Megatron's scatter-gather:
 * each TP rank sends 1/tp, the next stage all-gathers) — so a rank's bytes
 * lie within 4 (HDR M + (C T ± (tp - 1) M) / tp), and a stage's TP ranks
 * together send exactly 4 (tp HDR M + C T). Senders (every stage but the
 * last) count them sent, the last stage received (the others also receive
 * the sampled tokens). */
enum { HDR = 4 };

static void check_bytes(dsc_infer_model *split, const layout *l, const gen *want, const char *what) {
    dsc_infer_engine *e = engine(split, kv_budget(split, l->pipe, l->tp_size), split_micro_batches);
    dsc_comm_reset_stats(l->pipe);
    gen got;
    run_opts plain = {0};
    generate(e, dsc_infer_model_get_config(split)->vocab_size, &plain, &got);
    dsc_infer_engine_destroy(e); /* completes the sends still in flight, which count when they complete */
    expect_same_tokens(want, &got, false, what);
    dsc_comm_stats st;
    dsc_comm_get_stats(l->pipe, &st);
    bool last = dsc_comm_rank(l->pipe) == l->pp_size - 1;
    int64_t bytes = last ? st.bytes_recv[DSC_COMM_OP_RECV] : st.bytes_sent[DSC_COMM_OP_SEND];
    int64_t M = got.stats.forwards, T = got.stats.tokens_forwarded, tp = l->tp_size;
    int64_t C = dsc_infer_model_get_config(split)->d_model, whole = 4 * C * T;
    printf("%s: %s %lld activation bytes for %lld micro-batches of %lld tokens (whole activations: %lld)\n", what,
           last ? "received" : "sent", (long long)bytes, (long long)M, (long long)T, (long long)whole);
    fflush(stdout);
    assert_true(bytes >= 4 * (HDR * M + (C * T - (tp - 1) * M) / tp));
    assert_true(bytes <= 4 * (HDR * M + (C * T + (tp - 1) * M + tp - 1) / tp));
    if (l->tp) {
        dsc_tensor t = dsc_tensor_view(&bytes, DSC_DTYPE_I64, 1, (int64_t[]){1}, DSC_CPU);
        assert_ok(dsc_comm_allreduce(l->tp, &t, DSC_REDUCE_OP_SUM));
        assert_int_equal(bytes, 4 * (tp * HDR * M + C * T));
    }
}

static void compare(dsc_comm *world, const char *dir, int tp, const char *method, const char *what) {
    layout l;
    make_layout(world, tp, &l);
    dsc_infer_model *one, *split;
    load(dir, NULL, NULL, &one);
    load(dir, &l, method, &split);
    int32_t V = dsc_infer_model_get_config(one)->vocab_size;
    dsc_infer_engine *e1 = engine(one, kv_budget(one, NULL, 1), 0),
                     *e2 = engine(split, kv_budget(split, l.pipe, tp), split_micro_batches);
    gen want, got;
    run_opts plain = {0}, cancel = {.cancel_after = 3};
    int64_t p1 = generate(e1, V, &plain, &want), p2 = generate(e2, V, &plain, &got);
    char label[200];
    snprintf(label, sizeof label, "%s at tp %d x pp %d (%s, %d micro-batches)", what, tp, l.pp_size,
             method ? method : "uniform", split_micro_batches ? split_micro_batches : l.pp_size);
    expect_same_tokens(&want, &got, false, label);
    assert_true(p1 > 0 && p2 > 0);
    generate(e2, V, &cancel, &got);
    expect_same_tokens(&want, &got, true, label);
    check_put(e1, e2, label);
    if (l.pipe) check_bytes(split, &l, &want, label);
    char holds[512];
    dsc_infer_model_describe(split, holds, sizeof holds);
    printf(
        "%s: greedy tokens equal (%lld and %lld preemptions), cancellation leaves the cache free; rank %d: %s\n",
        label, (long long)p1, (long long)p2, dsc_comm_rank(world), holds);
    fflush(stdout);
    dsc_infer_engine_destroy(e2);
    dsc_infer_engine_destroy(e1);
    dsc_infer_model_destroy(split);
    dsc_infer_model_destroy(one);
    dsc_groups_free(l.groups);
}

static void test_fixtures(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    int size = dsc_comm_size(world);
    if (size == 2) {
        compare(world, FIXTURES "llama", 1, NULL, "hf llama");
        compare(world, FIXTURES "qwen2", 1, NULL, "hf qwen2 (tied)");
    } else if (size == 4) {
        compare(world, FIXTURES "llama", 2, NULL, "hf llama");
        compare(world, FIXTURES "qwen2", 2, NULL, "hf qwen2 (tied)");
    }
    dsc_comm_free(world);
}

static void test_deeper(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    char dir[512];
    synth four = {"LlamaForCausalLM", 32, 4, 2, 8, 48, 97, 4, false, false};
    synth_dir(dir, sizeof dir, "pp4", &four);
    compare(world, dir, 1, NULL, "llama 4 layers");
    synth five = {"Qwen2ForCausalLM", 32, 4, 2, 8, 40, 89, 5, true, true};
    synth_dir(dir, sizeof dir, "pp5", &five);
    compare(world, dir, 1, NULL, "qwen2 5 layers");
    compare(world, dir, 1, "parameters", "qwen2 5 layers");
    if (dsc_comm_size(world) == 4) compare(world, dir, 2, NULL, "qwen2 5 layers");
    /* The compute partition weighs the LM head (V x C = 65536 multiply-adds
     * per token against 7744 per layer) and not the embedding (a lookup): at
     * PP 2 it gives the last stage one layer of 4, where parameters (which
     * counts the embedding's 65536 too) and uniform give two. */
    synth wide = {"LlamaForCausalLM", 32, 4, 2, 8, 48, 2048, 4, false, false};
    synth_dir(dir, sizeof dir, "pp_wide", &wide);
    compare(world, dir, 1, "compute", "llama 4 layers, wide vocabulary");
    if (dsc_comm_size(world) == 2) {
        const char *methods[] = {"compute", "parameters", "uniform"};
        const int first[] = {3, 2, 2}; /* layers of stage 0 */
        for (int i = 0; i < 3; i++) {
            dsc_infer_model *m;
            layout l;
            make_layout(world, 1, &l);
            load(dir, &l, methods[i], &m);
            char holds[256], want[64];
            dsc_infer_model_describe(m, holds, sizeof holds);
            int stage = dsc_comm_rank(world);
            snprintf(want, sizeof want, "stage %d of 2: layers %d-%d", stage, stage ? first[i] : 0,
                     stage ? 3 : first[i] - 1);
            if (strncmp(holds, want, strlen(want)) != 0)
                fail_msg("partition %s: rank %d holds \"%s\", expected \"%s\"", methods[i], stage, holds, want);
            dsc_infer_model_destroy(m);
            dsc_groups_free(l.groups);
        }
    }
    synth_dir(dir, sizeof dir, "pp5", &five);
    /* more micro-batches in flight than stages: the same tokens */
    split_micro_batches = dsc_comm_size(world) + 1;
    compare(world, dir, 1, NULL, "qwen2 5 layers");
    split_micro_batches = 0;
    /* outside [P, 4 P] is refused, naming the range */
    dsc_infer_model *m;
    layout l;
    make_layout(world, 1, &l);
    load(dir, &l, NULL, &m);
    dsc_infer_engine_config ec = dsc_infer_engine_config_default(m);
    ec.micro_batches = 4 * dsc_comm_size(world) + 1;
    dsc_infer_engine *e = NULL;
    char needle[128];
    snprintf(needle, sizeof needle, "it must be 0 (as many as stages) or in [%d, %d]", dsc_comm_size(world),
             4 * dsc_comm_size(world));
    assert_err(dsc_infer_engine_create(m, &ec, &e), DSC_ERR_CONFIG, needle);
    dsc_infer_model_destroy(m);
    dsc_groups_free(l.groups);
    dsc_comm_free(world);
}

static const char *dsc_ckpt_dir; /* argv[1]: test_dsc_moe's kept checkpoints */

static void test_dsc_checkpoint(void **state) {
    (void)state;
    if (!dsc_ckpt_dir) skip();
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    if (dsc_comm_size(world) == 2) {
        char dir[600];
        snprintf(dir, sizeof dir, "%s/gpt-moe", dsc_ckpt_dir);
        compare(world, dir, 1, NULL, "dsc gpt-moe");
    }
    dsc_comm_free(world);
}

/* ---- micro-batches in flight ------------------------------------------------------------------------ */

/* With 2 D requests of one prompt length and nothing preempted, the
 * pipeline is full in steady state: every step but the D - 1 that drain it
 * pushes a micro-batch (of 2 requests), and each request is in one
 * micro-batch per token — so D micro-batches are in flight at once, for D =
 * P (default) and D = P + 1. */
static void test_in_flight(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    int P = dsc_comm_size(world);
    char dir[512];
    synth four = {"LlamaForCausalLM", 32, 4, 2, 8, 48, 97, 4, false, false};
    synth_dir(dir, sizeof dir, "pp4", &four);
    layout l;
    make_layout(world, 1, &l);
    dsc_infer_model *m;
    load(dir, &l, NULL, &m);
    for (int32_t D = P; D <= P + 1; D++) {
        dsc_infer_engine_config ec = dsc_infer_engine_config_default(m);
        ec.micro_batches = P > 1 ? D : 0;
        dsc_infer_engine *e;
        assert_ok(dsc_infer_engine_create(m, &ec, &e));
        dsc_scheduler_config sc = dsc_scheduler_config_default(e);
        dsc_scheduler *s;
        assert_ok(dsc_scheduler_create(e, &sc, NULL, NULL, &s));
        enum { NEW = 5 };
        int32_t prompt[4] = {3, 1, 4, 1};
        for (int r = 0; r < 2 * D; r++) {
            dsc_gen_request req = {.uid = (uint64_t)r + 1,
                                   .prompt = prompt,
                                   .n_prompt = 4,
                                   .max_new_tokens = NEW,
                                   .sampling = dsc_sampling_params_greedy()};
            assert_ok(dsc_scheduler_submit(s, &req));
        }
        int64_t steps = 0;
        for (bool idle = false; !idle; steps++)
            assert_ok(dsc_scheduler_step(s, &idle));
        const dsc_scheduler_stats *st = dsc_scheduler_get_stats(s);
        printf("pp %d, %d micro-batches in flight: %lld steps, %lld forwards of %lld tokens, %lld preemptions\n",
               P, D, (long long)steps, (long long)st->forwards, (long long)st->tokens_forwarded,
               (long long)st->preemptions);
        assert_int_equal(st->preemptions, 0);
        assert_int_equal(st->forwards, (int64_t)D * NEW);
        assert_int_equal(steps - 1, st->forwards + D - 1); /* the last step only finds it idle */
        assert_int_equal(st->tokens_forwarded, 2 * D * (4 + NEW - 1));
        dsc_scheduler_destroy(s);
        dsc_infer_engine_destroy(e);
        if (P == 1) break;
    }
    dsc_infer_model_destroy(m);
    dsc_groups_free(l.groups);
    dsc_comm_free(world);
}

/* ---- OPT's projections ------------------------------------------------------------------------------ */

static int64_t aligned_bytes(int64_t floats) {
    int64_t a = DSC_MEM_ALIGN / (int64_t)sizeof(float);
    return (floats + a - 1) / a * a * (int64_t)sizeof(float);
}

static bool holds(const dsc_infer_model *m, dsc_param_role role) {
    dsc_tensor t;
    dsc_status s = dsc_infer_model_param(m, -1, role, &t);
    dsc_status_free(s);
    return s == NULL;
}

/* OPT with word_embed_proj_dim != hidden_size (the fixture: C 48, P 32, tied,
 * no final norm): project_in lives only on the first stage and project_out
 * only on the last, so each stage's weights are its layers plus its end's
 * parameters: first embed (V, P) + positions (POS + 2, C) + project_in
 * (C, P); last embed again (tied) + project_out (P, C). The layer size comes
 * from the one-process arena minus those. Tokens equal one process. */
static void test_opt_projections(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    if (dsc_comm_size(world) != 2) {
        dsc_comm_free(world);
        skip();
    }
    compare(world, FIXTURES "opt", 1, NULL, "hf opt (projected)");
    dsc_infer_model *one, *split;
    load(FIXTURES "opt", NULL, NULL, &one);
    layout l;
    make_layout(world, 1, &l);
    load(FIXTURES "opt", &l, NULL, &split);
    const dsc_infer_model_config *c = dsc_infer_model_get_config(one);
    int64_t C = c->d_model, P = c->d_embed, V = c->vocab_size, L = c->n_layer;
    assert_true(P > 0 && P != C && c->tie_embeddings && L == 2);
    int64_t embed = aligned_bytes(V * P), pos = aligned_bytes((c->max_positions + c->pos_offset) * C),
            proj = aligned_bytes(C * P);
    int64_t layer = ((int64_t)dsc_infer_model_arena_bytes(one) - embed - pos - 2 * proj) / L;
    int stage = dsc_comm_rank(world);
    int64_t want = layer + embed + (stage == 0 ? pos + proj : proj);
    int64_t got = (int64_t)dsc_infer_model_arena_bytes(split);
    printf("hf opt pp 2 stage %d: %lld bytes of weights (formula %lld; one process %zu)\n", stage, (long long)got,
           (long long)want, dsc_infer_model_arena_bytes(one));
    assert_int_equal(got, want);
    assert_true(holds(split, DSC_PARAM_ROLE_PROJ_IN) == (stage == 0));
    assert_true(holds(split, DSC_PARAM_ROLE_PROJ_OUT) == (stage == 1));
    dsc_infer_model_destroy(split);
    dsc_infer_model_destroy(one);
    dsc_groups_free(l.groups);
    dsc_comm_free(world);
}

/* ---- the weight budget ------------------------------------------------------------------------------ */

static void test_weight_budget(void **state) {
    (void)state;
    dsc_comm *world;
    assert_ok(dsc_comm_world(NULL, &world));
    int P = dsc_comm_size(world), stage = dsc_comm_rank(world);
    /* every size a multiple of 64 floats, so the 256-byte alignment adds nothing */
    synth s = {"LlamaForCausalLM", 64, 4, 2, 16, 128, 256, 4, false, false};
    char dir[512];
    synth_dir(dir, sizeof dir, "budget", &s);
    int64_t C = s.C, Q = (int64_t)s.NH * s.HS, KV = (int64_t)s.NKV * s.HS;
    int64_t layer = 2 * C + (Q + 2 * KV) * C + C * Q + 3 * (int64_t)s.F * C, embed = (int64_t)s.V * C;
    int64_t whole = 4 * (s.L * layer + embed + C + embed);
    int64_t budget = whole * 3 / 5; /* the whole model does not fit; a half plus the head does */
    dsc_infer_model *m = NULL;
    dsc_infer_pp alone = {.max_weight_bytes = budget};
    char needle[160];
    snprintf(needle, sizeof needle,
             "need %lld bytes of weights, over this rank's weight budget (max_weight_bytes) of %lld",
             (long long)whole, (long long)budget);
    assert_err(dsc_infer_model_load_parallel(dir, NULL, &alone, &m), DSC_ERR_CONFIG, needle);
    if (P < 2) {
        dsc_comm_free(world);
        return;
    }
    /* uniform: stage k holds layers [bounds[k], bounds[k+1]) */
    int bounds[8];
    dsc_pipe_partition_uniform(s.L, P, bounds);
    int64_t layers = bounds[stage + 1] - bounds[stage], widest = bounds[1] - bounds[0];
    int64_t want_w = 4 * (layers * layer + (stage == 0 ? embed : 0) + (stage == P - 1 ? C + embed : 0));
    int64_t kv_bytes = 1 << 16, block = 2 * 16 * KV * 4; /* per layer, block_size 16 */
    int64_t want_kv = kv_bytes / (widest * block) * layers * block;
    dsc_mem_stats before, after;
    dsc_mem_get_stats(&before);
    dsc_infer_pp pp = {.comm = world, .max_weight_bytes = budget};
    assert_ok(dsc_infer_model_load_parallel(dir, NULL, &pp, &m));
    dsc_infer_engine_config ec = dsc_infer_engine_config_default(m);
    ec.kv_cache_bytes = kv_bytes;
    dsc_infer_engine *e;
    assert_ok(dsc_infer_engine_create(m, &ec, &e));
    dsc_mem_get_stats(&after);
    double got_w = (double)(after.current[DSC_MEM_PARAMS] - before.current[DSC_MEM_PARAMS]);
    double got_kv = (double)(after.current[DSC_MEM_KV_CACHE] - before.current[DSC_MEM_KV_CACHE]);
    printf("pp %d stage %d: weights %.0f bytes (formula %lld, ratio %.4f; whole model %lld, budget %lld), KV %.0f "
           "bytes (formula %lld, ratio %.4f)\n",
           P, stage, got_w, (long long)want_w, got_w / (double)want_w, (long long)whole, (long long)budget, got_kv,
           (long long)want_kv, got_kv / (double)want_kv);
    assert_true(got_w >= 0.95 * (double)want_w && got_w <= 1.05 * (double)want_w);
    assert_true(got_kv >= 0.95 * (double)want_kv && got_kv <= 1.05 * (double)want_kv);
    assert_true(got_w <= (double)budget);
    dsc_infer_engine_destroy(e);
    dsc_infer_model_destroy(m);
    dsc_comm_free(world);
}

int main(int argc, char **argv) {
    dsc_ckpt_dir = argc > 1 ? argv[1] : NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures),        cmocka_unit_test(test_deeper),
        cmocka_unit_test(test_dsc_checkpoint),  cmocka_unit_test(test_weight_budget),
        cmocka_unit_test(test_opt_projections), cmocka_unit_test(test_in_flight),
    };
    return DSC_RUN_MPI_TESTS(tests);
}
