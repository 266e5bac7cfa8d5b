/* The tensor-parallel sharding plan (tp/): DeepSpeed's qkv sharding cases
 * and worked width examples, the rule order (partition_config, then
 * base_model_tp_plan, then the policy, then names), refusals that name the
 * numbers or list the unplaced tensors, and a property test over thousands
 * of (heads, KV heads, head size, widths, tp_size, grain) combinations: the
 * spans of all ranks cover each tensor exactly once (KV replicas exactly
 * tp / NKV times), follow head boundaries, differ by at most one unit, and
 * the shards cut from a random tensor reassemble it bit-exactly; and the
 * plans of the GPT-NeoX, GPT-2 and OPT fixtures as their policies declare
 * them (ignored buffers replicated, never refused). */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "dsc/inference.h"
#include "dsc/safetensors.h"
#include "dsc/tp.h"
#include "test_mpi.h"

static dsc_tp_dims dims(int nh, int nkv, int hs, int64_t ff, int64_t v) {
    return (dsc_tp_dims){.n_head = nh, .n_kv_head = nkv, .head_size = hs, .d_ff = ff, .vocab_size = v};
}

/* DeepSpeed's test_qkv_sharding cases, as (q heads, kv heads) per rank. */
static void test_deepspeed_qkv_cases(void **state) {
    (void)state;
    const struct {
        int nh, nkv, tp;
    } ok[] = {{1, 1, 1}, {32, 32, 1}, {32, 32, 8}, {3, 3, 2}, {20, 20, 8},
              {4, 2, 1}, {8, 2, 1},   {64, 16, 8}, {4, 2, 4}, {20, 4, 8}};
    for (size_t c = 0; c < sizeof ok / sizeof ok[0]; c++) {
        dsc_tp_dims d = dims(ok[c].nh, ok[c].nkv, 4, 0, 0);
        int32_t q_total = 0;
        for (int r = 0; r < ok[c].tp; r++) {
            dsc_tp_shard s;
            assert_ok(dsc_tp_shard_of(&d, ok[c].tp, 64, r, &s));
            assert_true(s.nq >= 1 && s.nkv >= 1);
            /* every local query head's KV head is local */
            int32_t group = ok[c].nh / ok[c].nkv;
            assert_true(s.q0 / group >= s.kv0 && (s.q0 + s.nq - 1) / group < s.kv0 + s.nkv);
            q_total += s.nq;
        }
        assert_int_equal(q_total, ok[c].nh);
    }
    /* 4 q / 2 kv over 4 ranks: each KV head on two ranks, one query head each. */
    dsc_tp_dims d = dims(4, 2, 4, 0, 0);
    dsc_tp_shard s;
    assert_ok(dsc_tp_shard_of(&d, 4, 64, 3, &s));
    assert_int_equal(s.kv0, 1);
    assert_int_equal(s.q0, 3);
    /* 40q/10kv over 8 (DeepSpeed refuses): whole KV groups, 2,2,1,... */
    d = dims(40, 10, 4, 0, 0);
    assert_ok(dsc_tp_shard_of(&d, 8, 64, 0, &s));
    assert_int_equal(s.nkv, 2);
    assert_ok(dsc_tp_shard_of(&d, 8, 64, 7, &s));
    assert_int_equal(s.nkv, 1);
    assert_int_equal(s.kv0, 9);
    d = dims(6, 6, 4, 0, 0);
    assert_err(dsc_tp_shard_of(&d, 8, 64, 0, &s), DSC_ERR_CONFIG, "6 KV heads over 8 ranks");
    d = dims(5, 2, 4, 0, 0);
    assert_err(dsc_tp_shard_of(&d, 2, 64, 0, &s), DSC_ERR_CONFIG, "5 query heads");
    d = dims(30, 5, 4, 0, 0);
    assert_err(dsc_tp_shard_of(&d, 8, 64, 0, &s), DSC_ERR_CONFIG, "5 KV heads over 8 ranks");
    d = dims(2, 1, 4, 0, 0); /* one KV head, two query heads, four ranks */
    assert_err(dsc_tp_shard_of(&d, 4, 64, 0, &s), DSC_ERR_CONFIG, "2 query heads would be split over 4 ranks");
}

static void test_widths(void **state) {
    (void)state;
    int64_t st, n, want[3] = {1408, 1344, 1344};
    for (int r = 0; r < 3; r++) {
        assert_ok(dsc_tp_split_width(4096, 3, 64, r, "ff", &st, &n));
        assert_int_equal(n, want[r]);
    }
    /* 8 KV heads x 128 over 3 ranks: 384 / 384 / 256 */
    dsc_tp_dims d = dims(8, 8, 128, 0, 0);
    dsc_tp_shard s;
    assert_ok(dsc_tp_shard_of(&d, 3, 64, 2, &s));
    assert_int_equal(s.nkv * 128, 256);
    /* 100 over 2 with grain 64: too narrow for a grain each, so 50 / 50 (DeepSpeed: 64 / 36) */
    assert_ok(dsc_tp_split_width(100, 2, 64, 1, "ff", &st, &n));
    assert_int_equal(st, 50);
    /* 300 over 2 with grain 64: 4 whole grains, 2 each; the last rank also takes the 44 left over */
    assert_ok(dsc_tp_split_width(300, 2, 64, 1, "ff", &st, &n));
    assert_int_equal(st, 128);
    assert_int_equal(n, 172);
    assert_err(dsc_tp_split_width(3, 4, 64, 0, "the vocabulary", &st, &n), DSC_ERR_CONFIG,
               "the vocabulary of 3 cannot be split over 4 ranks");
}

typedef struct model {
    dsc_tp_param p[32];
    int n;
} model;

static void add(model *m, const char *name, int ndim, int64_t a, int64_t b) {
    m->p[m->n++] = (dsc_tp_param){.name = name, .ndim = ndim, .shape = {a, b}};
}

static const dsc_tp_entry *entry(const dsc_tp_plan *pl, const char *name) {
    int64_t i = dsc_tp_plan_find(pl, name);
    assert_true(i >= 0);
    return dsc_tp_plan_entry(pl, i);
}

/* A Llama layer's names with no declarations: AutoTP's name rules place all. */
static void test_name_rules(void **state) {
    (void)state;
    int64_t C = 16, HS = 4, NH = 4, NKV = 2, F = 24, V = 50;
    model m = {.n = 0};
    add(&m, "model.embed_tokens.weight", 2, V, C);
    add(&m, "model.layers.0.self_attn.q_proj.weight", 2, NH * HS, C);
    add(&m, "model.layers.0.self_attn.k_proj.weight", 2, NKV * HS, C);
    add(&m, "model.layers.0.self_attn.k_proj.bias", 1, NKV * HS, 0);
    add(&m, "model.layers.0.self_attn.o_proj.weight", 2, C, NH * HS);
    add(&m, "model.layers.0.self_attn.o_proj.bias", 1, C, 0);
    add(&m, "model.layers.0.mlp.gate_proj.weight", 2, F, C);
    add(&m, "model.layers.0.mlp.down_proj.weight", 2, C, F);
    add(&m, "model.layers.0.block_sparse_moe.gate.weight", 2, 4, C);
    add(&m, "model.layers.0.block_sparse_moe.experts.3.w2.weight", 2, C, F);
    add(&m, "model.layers.0.input_layernorm.weight", 1, C, 0);
    add(&m, "gpt_neox.layers.0.attention.query_key_value.weight", 2, (NH + 2 * NKV) * HS, C);
    add(&m, "gpt_neox.layers.0.attention.dense.weight", 2, C, NH * HS);
    add(&m, "gpt_neox.layers.0.mlp.dense_h_to_4h.weight", 2, F, C);
    add(&m, "model.layers.0.self_attn.qkv_proj.weight", 2, (NH + 2 * NKV) * HS, C);
    add(&m, "model.layers.0.mlp.gate_up_proj.weight", 2, 2 * F, C);
    add(&m, "lm_head.weight", 2, V, C);
    m.p[m.n] = (dsc_tp_param){
        .name = "transformer.h.0.attn.c_attn.weight", .ndim = 2, .shape = {C, 3 * C}, .transposed = true};
    m.n++;
    dsc_tp_dims d = dims((int)NH, (int)NKV, (int)HS, F, V);
    dsc_tp_options o = {.tp_size = 2, .grain = 8};
    dsc_tp_plan *pl;
    /* c_attn's 3C = 48 is (NH + 2 NKV) HS = 32 only in MHA models: refused here, listing the tensor. */
    assert_err(dsc_tp_plan_create(m.p, m.n, &d, &o, &pl), DSC_ERR_CONFIG, "transformer.h.0.attn.c_attn.weight");
    m.n--;
    assert_ok(dsc_tp_plan_create(m.p, m.n, &d, &o, &pl));
    struct {
        const char *name;
        dsc_tp_kind kind;
        dsc_tp_unit unit;
        int axis;
    } want[] = {
        {"model.embed_tokens.weight", DSC_TP_KIND_VOCAB, DSC_TP_UNIT_VOCAB, 0},
        {"model.layers.0.self_attn.q_proj.weight", DSC_TP_KIND_COLUMN, DSC_TP_UNIT_Q_HEADS, 0},
        {"model.layers.0.self_attn.k_proj.weight", DSC_TP_KIND_COLUMN, DSC_TP_UNIT_KV_HEADS, 0},
        {"model.layers.0.self_attn.k_proj.bias", DSC_TP_KIND_COLUMN, DSC_TP_UNIT_KV_HEADS, 0},
        {"model.layers.0.self_attn.o_proj.weight", DSC_TP_KIND_ROW, DSC_TP_UNIT_Q_HEADS, 1},
        {"model.layers.0.self_attn.o_proj.bias", DSC_TP_KIND_REPLICATE, DSC_TP_UNIT_NONE, -1},
        {"model.layers.0.mlp.gate_proj.weight", DSC_TP_KIND_COLUMN, DSC_TP_UNIT_FF, 0},
        {"model.layers.0.mlp.down_proj.weight", DSC_TP_KIND_ROW, DSC_TP_UNIT_FF, 1},
        {"model.layers.0.block_sparse_moe.gate.weight", DSC_TP_KIND_REPLICATE, DSC_TP_UNIT_NONE, -1},
        {"model.layers.0.block_sparse_moe.experts.3.w2.weight", DSC_TP_KIND_ROW, DSC_TP_UNIT_FF, 1},
        {"model.layers.0.input_layernorm.weight", DSC_TP_KIND_REPLICATE, DSC_TP_UNIT_NONE, -1},
        {"gpt_neox.layers.0.attention.query_key_value.weight", DSC_TP_KIND_COLUMN, DSC_TP_UNIT_QKV, 0},
        {"gpt_neox.layers.0.attention.dense.weight", DSC_TP_KIND_ROW, DSC_TP_UNIT_Q_HEADS, 1},
        {"gpt_neox.layers.0.mlp.dense_h_to_4h.weight", DSC_TP_KIND_COLUMN, DSC_TP_UNIT_FF, 0},
        {"model.layers.0.self_attn.qkv_proj.weight", DSC_TP_KIND_COLUMN, DSC_TP_UNIT_QKV, 0},
        {"model.layers.0.mlp.gate_up_proj.weight", DSC_TP_KIND_COLUMN, DSC_TP_UNIT_GATE_UP, 0},
        {"lm_head.weight", DSC_TP_KIND_VOCAB, DSC_TP_UNIT_VOCAB, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const dsc_tp_entry *e = entry(pl, want[i].name);
        if (e->kind != want[i].kind || e->unit != want[i].unit || e->axis != want[i].axis)
            fail_msg("%s: got %s / %s / axis %d", want[i].name, dsc_tp_kind_name(e->kind),
                     dsc_tp_unit_name(e->unit), e->axis);
    }
    /* fused q|k|v of rank 1: its q heads [2,4), kv head 1 in the k and in the v block */
    const dsc_tp_span *sp;
    assert_int_equal(
        dsc_tp_plan_spans(pl, dsc_tp_plan_find(pl, "model.layers.0.self_attn.qkv_proj.weight"), 1, &sp), 3);
    assert_int_equal(sp[0].start, 2 * HS);
    assert_int_equal(sp[1].start, NH * HS + HS);
    assert_int_equal(sp[2].start, (NH + NKV) * HS + HS);
    dsc_tp_plan_print(pl, stdout);
    dsc_tp_plan_destroy(pl);

    /* A GPT-2 MHA shape: the transposed Conv1D c_attn splits on axis 1. */
    model g = {.n = 0};
    g.p[g.n++] =
        (dsc_tp_param){.name = "h.0.attn.c_attn.weight", .ndim = 2, .shape = {C, 3 * C}, .transposed = true};
    g.p[g.n++] = (dsc_tp_param){.name = "h.0.attn.c_proj.weight", .ndim = 2, .shape = {C, C}, .transposed = true};
    g.p[g.n++] = (dsc_tp_param){.name = "h.0.mlp.c_proj.weight", .ndim = 2, .shape = {F, C}, .transposed = true};
    dsc_tp_dims gd = dims(4, 4, 4, F, V);
    assert_ok(dsc_tp_plan_create(g.p, g.n, &gd, &o, &pl));
    assert_int_equal(entry(pl, "h.0.attn.c_attn.weight")->axis, 1);
    assert_int_equal(entry(pl, "h.0.attn.c_proj.weight")->axis, 0);
    assert_int_equal(entry(pl, "h.0.mlp.c_proj.weight")->unit, DSC_TP_UNIT_FF);
    dsc_tp_plan_destroy(pl);
}

/* Rank r's spans of tensor `name` as "[a,b)+[c,d)@axis". */
static void spans_text(const dsc_tp_plan *pl, const char *name, int r, char *buf, size_t len) {
    int64_t i = dsc_tp_plan_find(pl, name);
    if (i < 0) fail_msg("the plan has no tensor %s", name);
    const dsc_tp_span *sp;
    int n = dsc_tp_plan_spans(pl, i, r, &sp);
    size_t used = 0;
    for (int k = 0; k < n && used < len; k++)
        used += (size_t)snprintf(buf + used, len - used, "%s[%lld,%lld)", k ? "+" : "", (long long)sp[k].start,
                                 (long long)(sp[k].start + sp[k].count));
    if (used < len) snprintf(buf + used, len - used, "@%d", dsc_tp_plan_entry(pl, i)->axis);
}

/* The plans of the GPT-NeoX, GPT-2 and OPT fixtures at TP 4 (6 heads of 8:
 * 2,2,1,1; F 50: 13,13,12,12; V 101: 26,25,25,25), as their policies declare
 * them: every tensor's kind and unit, and rank 3's spans (the last head, the
 * tail widths). GPT-NeoX's query_key_value by head triplets, GPT-2's
 * transposed Conv1D weights on the stored axis (1 for c_attn / c_fc, 0 for
 * the row-parallel c_proj), OPT's projections to and from its narrower
 * embedding replicated. */
static void test_family_plans(void **state) {
    (void)state;
    typedef struct {
        const char *name;
        dsc_tp_kind kind;
        dsc_tp_unit unit;
        const char *rank3;
    } expect;
    const dsc_tp_kind COL = DSC_TP_KIND_COLUMN, ROW = DSC_TP_KIND_ROW, VOC = DSC_TP_KIND_VOCAB,
                      REP = DSC_TP_KIND_REPLICATE;
    const expect neox[] = {
        {"gpt_neox.embed_in.weight", VOC, DSC_TP_UNIT_VOCAB, "[76,101)@0"},
        {"embed_out.weight", VOC, DSC_TP_UNIT_VOCAB, "[76,101)@0"},
        {"gpt_neox.layers.0.attention.query_key_value.weight", COL, DSC_TP_UNIT_QKV_INTERLEAVED, "[120,144)@0"},
        {"gpt_neox.layers.0.attention.query_key_value.bias", COL, DSC_TP_UNIT_QKV_INTERLEAVED, "[120,144)@0"},
        {"gpt_neox.layers.0.attention.dense.weight", ROW, DSC_TP_UNIT_Q_HEADS, "[40,48)@1"},
        {"gpt_neox.layers.0.attention.dense.bias", REP, DSC_TP_UNIT_NONE, "@-1"},
        {"gpt_neox.layers.0.mlp.dense_h_to_4h.weight", COL, DSC_TP_UNIT_FF, "[38,50)@0"},
        {"gpt_neox.layers.0.mlp.dense_h_to_4h.bias", COL, DSC_TP_UNIT_FF, "[38,50)@0"},
        {"gpt_neox.layers.0.mlp.dense_4h_to_h.weight", ROW, DSC_TP_UNIT_FF, "[38,50)@1"},
        {"gpt_neox.layers.1.input_layernorm.weight", REP, DSC_TP_UNIT_NONE, "@-1"},
        {NULL, 0, 0, NULL}};
    const expect gpt2[] = {
        {"transformer.wte.weight", VOC, DSC_TP_UNIT_VOCAB, "[76,101)@0"},
        {"transformer.wpe.weight", REP, DSC_TP_UNIT_NONE, "@-1"},
        {"transformer.h.0.attn.c_attn.weight", COL, DSC_TP_UNIT_QKV, "[40,48)+[88,96)+[136,144)@1"},
        {"transformer.h.0.attn.c_attn.bias", COL, DSC_TP_UNIT_QKV, "[40,48)+[88,96)+[136,144)@0"},
        {"transformer.h.0.attn.c_proj.weight", ROW, DSC_TP_UNIT_Q_HEADS, "[40,48)@0"},
        {"transformer.h.0.mlp.c_fc.weight", COL, DSC_TP_UNIT_FF, "[38,50)@1"},
        {"transformer.h.0.mlp.c_proj.weight", ROW, DSC_TP_UNIT_FF, "[38,50)@0"},
        {"transformer.h.1.mlp.c_proj.bias", REP, DSC_TP_UNIT_NONE, "@-1"},
        {"transformer.ln_f.weight", REP, DSC_TP_UNIT_NONE, "@-1"},
        {NULL, 0, 0, NULL}};
    const expect opt[] = {
        {"model.decoder.embed_tokens.weight", VOC, DSC_TP_UNIT_VOCAB, "[76,101)@0"},
        {"model.decoder.embed_positions.weight", REP, DSC_TP_UNIT_NONE, "@-1"},
        {"model.decoder.layers.0.self_attn.q_proj.weight", COL, DSC_TP_UNIT_Q_HEADS, "[40,48)@0"},
        {"model.decoder.layers.0.self_attn.k_proj.bias", COL, DSC_TP_UNIT_KV_HEADS, "[40,48)@0"},
        {"model.decoder.layers.0.self_attn.out_proj.weight", ROW, DSC_TP_UNIT_Q_HEADS, "[40,48)@1"},
        {"model.decoder.layers.0.fc1.weight", COL, DSC_TP_UNIT_FF, "[38,50)@0"},
        {"model.decoder.layers.1.fc2.weight", ROW, DSC_TP_UNIT_FF, "[38,50)@1"},
        {"model.decoder.layers.1.final_layer_norm.bias", REP, DSC_TP_UNIT_NONE, "@-1"},
        {NULL, 0, 0, NULL}};
    /* OPT-350m's shape (the 4.x fixture): the projections to and from the narrower embedding */
    const expect opt_proj[] = {{"model.decoder.project_in.weight", REP, DSC_TP_UNIT_NONE, "@-1"},
                               {"model.decoder.project_out.weight", REP, DSC_TP_UNIT_NONE, "@-1"},
                               {NULL, 0, 0, NULL}};
    const struct {
        const char *dir;
        const expect *want[2];
    } families[] = {{"gpt_neox", {neox, NULL}},
                    {"gpt_neox_tf5", {neox, NULL}},
                    {"gpt2_tf5", {gpt2, NULL}},
                    {"opt", {opt, opt_proj}},
                    {"opt_tf5", {opt, NULL}}};
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++) {
        char dir[512];
        snprintf(dir, sizeof dir, DSC_SOURCE_DIR "/tests/inference/fixtures/hf/%s", families[f].dir);
        dsc_infer_tp tp = {.tp_size = 4};
        dsc_tp_plan *pl;
        assert_ok(dsc_infer_model_plan(dir, &tp, &pl));
        for (int64_t i = 0; i < dsc_tp_plan_count(pl); i++)
            if (dsc_tp_plan_entry(pl, i)->source != DSC_TP_SOURCE_POLICY)
                fail_msg("%s: %s decided by %s, not the policy", families[f].dir, dsc_tp_plan_entry(pl, i)->name,
                         dsc_tp_source_name(dsc_tp_plan_entry(pl, i)->source));
        for (int k = 0; k < 2 && families[f].want[k]; k++)
            for (const expect *w = families[f].want[k]; w->name; w++) {
                const dsc_tp_entry *e = entry(pl, w->name);
                char got[160];
                spans_text(pl, w->name, 3, got, sizeof got);
                if (e->kind != w->kind || e->unit != w->unit || strcmp(got, w->rank3) != 0)
                    fail_msg("%s: %s is %s / %s, rank 3 %s; expected %s / %s, rank 3 %s", families[f].dir, w->name,
                             dsc_tp_kind_name(e->kind), dsc_tp_unit_name(e->unit), got, dsc_tp_kind_name(w->kind),
                             dsc_tp_unit_name(w->unit), w->rank3);
            }
        printf("%s at tp 4: %lld tensors planned as its policy declares\n", families[f].dir,
               (long long)dsc_tp_plan_count(pl));
        dsc_tp_plan_destroy(pl);
    }
}

/* A checkpoint that still carries GPT-2's causal-mask buffer (attn.bias, 4-D,
 * which the policy ignores) plans: the buffer is replicated (never read),
 * not refused as a matrix no rule places. */
static void test_ignored_buffers(void **state) {
    (void)state;
    char dir[] = "/tmp/dsc_tp_plan_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[512], src[512];
    snprintf(src, sizeof src, DSC_SOURCE_DIR "/tests/inference/fixtures/hf/gpt2_tf5/config.json");
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *in = fopen(src, "rb"), *out = fopen(path, "wb");
    assert_true(in && out);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        assert_int_equal(fwrite(buf, 1, n, out), n);
    fclose(in);
    fclose(out);
    static float mask[64 * 64], wte[101 * 48];
    const char *names[] = {"transformer.h.0.attn.bias", "transformer.wte.weight"};
    dsc_tensor t[] = {dsc_tensor_view(mask, DSC_DTYPE_F32, 4, (int64_t[]){1, 1, 64, 64}, DSC_CPU),
                      dsc_tensor_view(wte, DSC_DTYPE_F32, 2, (int64_t[]){101, 48}, DSC_CPU)};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_ok(dsc_safetensors_write(path, 2, names, t, 0, NULL));
    dsc_infer_tp tp = {.tp_size = 2};
    dsc_tp_plan *pl;
    assert_ok(dsc_infer_model_plan(dir, &tp, &pl));
    assert_int_equal(entry(pl, "transformer.h.0.attn.bias")->kind, DSC_TP_KIND_REPLICATE);
    assert_int_equal(entry(pl, "transformer.wte.weight")->kind, DSC_TP_KIND_VOCAB);
    dsc_tp_plan_destroy(pl);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

/* partition_config beats base_model_tp_plan beats the policy beats names. */
static void test_rule_order(void **state) {
    (void)state;
    int64_t C = 16;
    dsc_tp_param p[] = {
        {.name = "model.layers.0.mlp.fc_in.weight", .ndim = 2, .shape = {24, C}},
        {.name = "model.layers.1.mlp.fc_in.weight", .ndim = 2, .shape = {24, C}},
        {.name = "model.layers.0.mlp.fc_out.weight", .ndim = 2, .shape = {C, 24}, .declared = DSC_TP_KIND_ROW},
        {.name = "model.layers.0.mlp.up_proj.weight",
         .ndim = 2,
         .shape = {24, 24},
         .declared = DSC_TP_KIND_COLUMN,
         .unit = DSC_TP_UNIT_FF},
        {.name = "model.layers.0.mlp.mystery.weight", .ndim = 2, .shape = {C, C}},
    };
    dsc_tp_dims d = dims(4, 4, 4, 24, 50);
    dsc_tp_rule user[] = {{"layers\\.1\\.mlp\\.fc_in\\.weight$", DSC_TP_KIND_COLUMN}};
    dsc_tp_rule plan[] = {{"layers.*.mlp.fc_in", DSC_TP_KIND_COLUMN}, {"layers.*.mlp.up_proj", DSC_TP_KIND_ROW}};
    dsc_tp_options o = {
        .tp_size = 2, .grain = 1, .user = user, .n_user = 1, .model_plan = plan, .n_model_plan = 2};
    dsc_tp_plan *pl;
    /* the mystery matrix has no rule: refused, listed */
    assert_err(
        dsc_tp_plan_create(p, 5, &d, &o, &pl), DSC_ERR_CONFIG,
        "1 tensor(s) could not be placed: model.layers.0.mlp.mystery.weight (16, 16) as undeclared: no rule");
    assert_ok(dsc_tp_plan_create(p, 4, &d, &o, &pl));
    assert_int_equal(entry(pl, "model.layers.1.mlp.fc_in.weight")->source, DSC_TP_SOURCE_USER);
    assert_int_equal(entry(pl, "model.layers.0.mlp.fc_in.weight")->source, DSC_TP_SOURCE_MODEL_PLAN);
    assert_int_equal(entry(pl, "model.layers.0.mlp.fc_out.weight")->source, DSC_TP_SOURCE_POLICY);
    const dsc_tp_entry *up = entry(pl, "model.layers.0.mlp.up_proj.weight");
    assert_int_equal(up->source, DSC_TP_SOURCE_MODEL_PLAN); /* the model's plan wins over the policy */
    assert_int_equal(up->kind, DSC_TP_KIND_ROW);
    assert_int_equal(up->axis, 1);
    dsc_tp_plan_destroy(pl);
    /* use_default_specs = false: AutoTP's names no longer place an undeclared o_proj */
    dsc_tp_param o_proj = {.name = "model.layers.0.self_attn.o_proj.weight", .ndim = 2, .shape = {C, C}};
    dsc_tp_options bare = {.tp_size = 2, .no_name_rules = true};
    assert_err(dsc_tp_plan_create(&o_proj, 1, &d, &bare, &pl), DSC_ERR_CONFIG,
               "o_proj.weight (16, 16) as undeclared");
    bare.no_name_rules = false;
    assert_ok(dsc_tp_plan_create(&o_proj, 1, &d, &bare, &pl));
    dsc_tp_plan_destroy(pl);
    dsc_tp_rule bad[] = {{"(", DSC_TP_KIND_COLUMN}};
    o.user = bad;
    assert_err(dsc_tp_plan_create(p, 4, &d, &o, &pl), DSC_ERR_CONFIG, "pattern '(' is not a regex");
}

/* ---- property test ------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static int64_t rnd(int64_t lo, int64_t hi) { /* [lo, hi] */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return lo + (int64_t)(rng_state % (uint64_t)(hi - lo + 1));
}

/* Cuts rank's shard of a 2-D (rows, cols) tensor along `axis` by its spans, then writes it
 * back into `out`, counting how often each element was written. */
static void cut_and_place(const float *full, int64_t rows, int64_t cols, int axis, const dsc_tp_span *sp, int n,
                          float *out, int *hits) {
    int64_t local = 0;
    for (int k = 0; k < n; k++)
        local += sp[k].count;
    int64_t lr = axis == 0 ? local : rows, lc = axis == 0 ? cols : local;
    float *shard = malloc((size_t)(lr * lc + 1) * sizeof *shard);
    int64_t at = 0;
    for (int k = 0; k < n; at += sp[k].count, k++) /* cut, as the loader reads */
        for (int64_t i = 0; i < sp[k].count; i++) {
            int64_t g = sp[k].start + i;
            if (axis == 0)
                memcpy(shard + (at + i) * lc, full + g * cols, (size_t)cols * sizeof *full);
            else
                for (int64_t r = 0; r < rows; r++)
                    shard[r * lc + at + i] = full[r * cols + g];
        }
    for (int k = 0, off = 0; k < n; off += (int)sp[k].count, k++) /* reassemble */
        for (int64_t i = 0; i < sp[k].count; i++) {
            int64_t g = sp[k].start + i;
            for (int64_t o = 0; o < (axis == 0 ? cols : rows); o++) {
                int64_t src = axis == 0 ? (off + i) * lc + o : o * lc + off + i;
                int64_t dst = axis == 0 ? g * cols + o : o * cols + g;
                if (hits[dst]) assert_memory_equal(&out[dst], &shard[src], sizeof(float));
                out[dst] = shard[src];
                hits[dst]++;
            }
        }
    free(shard);
}

static int64_t unit_size(const dsc_tp_dims *d, dsc_tp_unit u) {
    switch (u) {
    case DSC_TP_UNIT_Q_HEADS:
    case DSC_TP_UNIT_KV_HEADS:
    case DSC_TP_UNIT_QKV:
        return d->head_size;
    case DSC_TP_UNIT_QKV_INTERLEAVED:
        return 3 * d->head_size;
    default:
        return 1;
    }
}

static void check_plan(const dsc_tp_plan *pl, const dsc_tp_dims *d, int tp) {
    int32_t minq = INT32_MAX, maxq = 0, minkv = INT32_MAX, maxkv = 0;
    for (int r = 0; r < tp; r++) {
        const dsc_tp_shard *s = dsc_tp_plan_shard(pl, r);
        minq = s->nq < minq ? s->nq : minq;
        maxq = s->nq > maxq ? s->nq : maxq;
        minkv = s->nkv < minkv ? s->nkv : minkv;
        maxkv = s->nkv > maxkv ? s->nkv : maxkv;
        assert_true(s->nq >= 1 && s->nf >= 1 && s->nv >= 1);
    }
    /* at most one unit apart: a KV group when KV heads are split, a query head when they are shared */
    if (d->n_kv_head >= tp)
        assert_true(maxkv - minkv <= 1);
    else
        assert_true(maxq - minq <= 1 && maxkv == 1);
    int replicas = d->n_kv_head >= tp ? 1 : tp / d->n_kv_head;
    for (int64_t i = 0; i < dsc_tp_plan_count(pl); i++) {
        const dsc_tp_entry *e = dsc_tp_plan_entry(pl, i);
        if (e->axis < 0) continue;
        int64_t rows = e->shape[0], cols = e->ndim == 2 ? e->shape[1] : 1, n = rows * cols;
        float *full = malloc((size_t)n * sizeof *full), *out = calloc((size_t)n, sizeof *out);
        int *hits = calloc((size_t)n, sizeof *hits);
        for (int64_t k = 0; k < n; k++)
            full[k] = (float)rnd(-1000000, 1000000) * 1e-3f;
        for (int r = 0; r < tp; r++) {
            const dsc_tp_span *sp;
            int ns = dsc_tp_plan_spans(pl, i, r, &sp);
            for (int k = 0; k < ns; k++) /* head boundaries */
                assert_true(sp[k].start % unit_size(d, e->unit) == 0 && sp[k].count % unit_size(d, e->unit) == 0);
            cut_and_place(full, rows, cols, e->ndim == 2 ? e->axis : 0, sp, ns, out, hits);
        }
        int64_t extent = e->shape[e->axis], kv_lo = -1, kv_hi = -1;
        if (e->unit == DSC_TP_UNIT_KV_HEADS) kv_lo = 0, kv_hi = extent;
        if (e->unit == DSC_TP_UNIT_QKV) kv_lo = (int64_t)d->n_head * d->head_size, kv_hi = extent;
        for (int64_t k = 0; k < n; k++) {
            int64_t along = e->axis == 0 || e->ndim == 1 ? k / cols : k % cols;
            int want = along >= kv_lo && along < kv_hi ? replicas : 1;
            if (hits[k] != want)
                fail_msg("%s element %lld written %d times, want %d", e->name, (long long)k, hits[k], want);
        }
        assert_memory_equal(full, out, (size_t)n * sizeof *full);
        free(full);
        free(out);
        free(hits);
    }
}

static void test_properties(void **state) {
    (void)state;
    int planned = 0, refused = 0;
    for (int trial = 0; trial < 4000; trial++) {
        int nkv = (int)rnd(1, 12), group = (int)rnd(1, 4), hs = (int)rnd(1, 6), tp = (int)rnd(1, 8);
        if (rnd(0, 3) == 0) group = 1; /* MHA often */
        int nh = nkv * group;
        int64_t grain = (int64_t[]){1, 4, 32, 64}[rnd(0, 3)], F = rnd(1, 300), V = rnd(1, 300), C = rnd(1, 6);
        dsc_tp_dims d = dims(nh, nkv, hs, F, V);
        int64_t Q = (int64_t)nh * hs, KV = (int64_t)nkv * hs;
        dsc_tp_param p[] = {
            {.name = "model.embed_tokens.weight", .ndim = 2, .shape = {V, C}},
            {.name = "l.0.self_attn.q_proj.weight", .ndim = 2, .shape = {Q, C}},
            {.name = "l.0.self_attn.q_proj.bias", .ndim = 1, .shape = {Q}},
            {.name = "l.0.self_attn.k_proj.weight", .ndim = 2, .shape = {KV, C}},
            {.name = "l.0.self_attn.v_proj.bias", .ndim = 1, .shape = {KV}},
            {.name = "l.0.self_attn.qkv_proj.weight", .ndim = 2, .shape = {Q + 2 * KV, C}},
            {.name = "l.0.self_attn.o_proj.weight", .ndim = 2, .shape = {C, Q}},
            {.name = "l.0.mlp.gate_up_proj.weight", .ndim = 2, .shape = {2 * F, C}},
            {.name = "l.0.mlp.down_proj.weight", .ndim = 2, .shape = {C, F}},
            {.name = "l.0.mlp.c_fc.weight", .ndim = 2, .shape = {C, F}, .transposed = true},
            {.name = "lm_head.weight", .ndim = 2, .shape = {V, C}},
            {.name = "l.0.attention.query_key_value.weight", .ndim = 2, .shape = {3 * Q, C}},
        };
        int np = (int)(sizeof p / sizeof p[0]) - (nkv == nh ? 0 : 1); /* interleaved QKV is MHA only */
        dsc_tp_options o = {.tp_size = tp, .grain = grain};
        dsc_tp_plan *pl = NULL;
        dsc_status s = dsc_tp_plan_create(p, np, &d, &o, &pl);
        if (s) {
            /* refused only for a reason the numbers give, and the message names them */
            bool heads = nkv < tp && (tp % nkv != 0 || group < tp / nkv);
            bool widths = F < tp || V < tp;
            if (!heads && !widths)
                fail_msg("refused nh %d nkv %d tp %d F %lld V %lld: %s", nh, nkv, tp, (long long)F, (long long)V,
                         dsc_status_message(s));
            char num[32];
            snprintf(num, sizeof num, "over %d ranks", tp);
            assert_non_null(strstr(dsc_status_message(s), num));
            dsc_status_free(s);
            refused++;
            continue;
        }
        check_plan(pl, &d, tp);
        for (int r = 0; r < tp; r++) { /* widths: whole grains, the last rank also takes the rest */
            const dsc_tp_shard *sh = dsc_tp_plan_shard(pl, r);
            int64_t g = F >= grain * tp ? grain : 1, body = sh->nf - (r == tp - 1 ? F % g : 0);
            assert_true(body % g == 0 && body / g >= F / g / tp && body / g <= F / g / tp + 1);
        }
        dsc_tp_plan_destroy(pl);
        planned++;
    }
    printf("plan properties: %d combinations planned and checked, %d refused with their numbers\n", planned,
           refused);
    assert_true(planned > 2000 && refused > 100);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deepspeed_qkv_cases), cmocka_unit_test(test_widths),
        cmocka_unit_test(test_name_rules),          cmocka_unit_test(test_rule_order),
        cmocka_unit_test(test_properties),          cmocka_unit_test(test_family_plans),
        cmocka_unit_test(test_ignored_buffers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
