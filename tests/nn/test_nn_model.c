/* Whole models on one process: activation checkpointing gives bitwise the
 * gradients of the plain path; under bf16 / fp16 products, the product
 * operands kept in 2 bytes give bitwise the gradients of keeping them in f32,
 * with the activation memory the formula says; the layers' per-call
 * temporaries are one workspace for the model; two micro-batches in flight (forward 0,
 * forward 1, backward 0, backward 1) give bitwise what running them one after
 * the other gives, and a slot's input gradient survives the other slot's
 * backward; logits-only forwards; and bad input is reported with the layer
 * and the offending value. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/kernels.h"
#include "nn_test_util.h"
#include "test_mpi.h"

#define B 2
#define T 8

typedef struct batch {
    int32_t tokens[B * T], targets[B * T];
    dsc_tensor tok, tgt;
} batch;

static void make_batch(batch *b, int vocab, uint64_t seed) {
    dsc_rng rng;
    dsc_rng_init(&rng, seed, 0, DSC_RNG_DATA);
    for (int i = 0; i < B * T; i++) {
        b->tokens[i] = (int32_t)dsc_rng_below(&rng, (uint64_t)vocab);
        b->targets[i] = (int32_t)dsc_rng_below(&rng, (uint64_t)vocab);
    }
    b->targets[5] = -1;
    b->tok = dsc_tensor_view(b->tokens, DSC_DTYPE_I32, 2, (int64_t[]){B, T}, DSC_CPU);
    b->tgt = dsc_tensor_view(b->targets, DSC_DTYPE_I32, 2, (int64_t[]){B, T}, DSC_CPU);
}

static void flat_grads(test_model *m, dsc_tensor *g) {
    dsc_params_flat(m->store, DSC_PARAM_GROUP_DENSE, NULL, g);
}

static void assert_same_grads(test_model *a, test_model *b) {
    dsc_tensor ga, gb;
    flat_grads(a, &ga);
    flat_grads(b, &gb);
    assert_int_equal(dsc_tensor_numel(&ga), dsc_tensor_numel(&gb));
    double norm;
    assert_ok(dsc_kernel_sum_squares(&norm, &ga));
    assert_true(norm > 0);
    assert_memory_equal(ga.data, gb.data, dsc_tensor_nbytes(&ga));
}

/* Checkpointed blocks against plain ones: bitwise, in f32 and (`mixed`) under bf16 products with the
 * activations kept in 2 bytes, where the recompute widens the kept input first. */
static void checkpointing_case(dsc_model_arch arch, bool mixed) {
    dsc_model_config mc;
    test_tiny_config(&mc, arch);
    test_model plain, ckpt;
    assert_ok(test_model_build(&plain, &mc, DSC_CPU, 3, 2, B, T));
    mc.activation_checkpointing = true;
    assert_ok(test_model_build(&ckpt, &mc, DSC_CPU, 3, 2, B, T));
    test_model *models[2] = {&plain, &ckpt};
    for (int k = 0; k < 2 && mixed; k++)
        for (int l = 0; l < models[k]->n; l++) {
            dsc_layer_set_saved_dtype(models[k]->layers[l], DSC_DTYPE_BF16);
            assert_ok(dsc_layer_reserve(models[k]->layers[l], 2, B, T));
        }
    batch b0, b1;
    make_batch(&b0, mc.vocab_size, 1);
    make_batch(&b1, mc.vocab_size, 2);
    double l_plain[2], l_ckpt[2];
    double *losses[2] = {l_plain, l_ckpt};
    const dsc_dtype was = dsc_kernels_set_matmul_dtype(mixed ? DSC_DTYPE_BF16 : DSC_DTYPE_F32);
    for (int k = 0; k < 2; k++) {
        assert_ok(test_model_forward(models[k], 0, &b0.tok, &b0.tgt, &losses[k][0]));
        assert_ok(test_model_forward(models[k], 1, &b1.tok, &b1.tgt, &losses[k][1]));
        assert_ok(test_model_backward(models[k], 0, 0.5f));
        assert_ok(test_model_backward(models[k], 1, 0.5f));
    }
    dsc_kernels_set_matmul_dtype(was);
    assert_true(l_plain[0] == l_ckpt[0] && l_plain[1] == l_ckpt[1]);
    assert_same_grads(&plain, &ckpt);
    /* Checkpointing keeps 3 (B, T, C) buffers per slot in a block instead of all intermediates (the
     * input in 2 bytes under mixed precision). */
    assert_true(ckpt.layers[1]->activation_bytes_per_token < plain.layers[1]->activation_bytes_per_token);
    assert_int_equal(ckpt.layers[1]->activation_bytes_per_token, (mixed ? 2 + 4 + 4 : 3 * 4) * mc.d_model);
    test_model_free(&plain);
    test_model_free(&ckpt);
}

static void test_checkpointing_is_bitwise(void **state) {
    (void)state;
    checkpointing_case(DSC_ARCH_GPT, false);
    checkpointing_case(DSC_ARCH_LLAMA, false);
    checkpointing_case(DSC_ARCH_GPT, true);
    checkpointing_case(DSC_ARCH_LLAMA, true);
}

/* The model's activation bytes now (every layer reserved once). */
static int64_t activation_bytes_now(void) {
    dsc_mem_stats st;
    dsc_mem_get_stats(&st);
    return st.current[DSC_MEM_ACTIVATIONS];
}

/* Two micro-batches through `m`, the thread's products in `products`: the losses; grads in m. */
static void run_two(test_model *m, dsc_dtype products, double loss[2]) {
    batch b0, b1;
    make_batch(&b0, m->mc.vocab_size, 5);
    make_batch(&b1, m->mc.vocab_size, 6);
    dsc_dtype was = dsc_kernels_set_matmul_dtype(products);
    assert_ok(test_model_forward(m, 0, &b0.tok, &b0.tgt, &loss[0]));
    assert_ok(test_model_forward(m, 1, &b1.tok, &b1.tgt, &loss[1]));
    assert_ok(test_model_backward(m, 0, 0.5f));
    assert_ok(test_model_backward(m, 1, 0.5f));
    dsc_kernels_set_matmul_dtype(was);
}

/* Keeping the MLP's activation and its inputs (fc's output; SwiGLU's gate and up), the attention's
 * q, k, v and output, the block's input, residual sum and norm1 and norm2 outputs and the head's
 * logits in 2 bytes
 * (dsc_layer_set_saved_dtype) changes no bit under products of that type, and takes 2 bytes a value fewer per
 * slot; under f32 products the same storage rounds them and the gradients move. */
static void saved_case(dsc_model_arch arch, dsc_dtype saved) {
    dsc_model_config mc;
    test_tiny_config(&mc, arch);
    test_model wide, narrow;
    assert_ok(test_model_build(&wide, &mc, DSC_CPU, 3, 2, B, T));
    assert_ok(test_model_build(&narrow, &mc, DSC_CPU, 3, 2, B, T));
    const int64_t before = activation_bytes_now();
    for (int l = 0; l < narrow.n; l++) {
        dsc_layer_set_saved_dtype(narrow.layers[l], saved);
        assert_ok(dsc_layer_reserve(narrow.layers[l], 2, B, T));
    }
    const int64_t kv = mc.n_kv_head * (mc.d_model / mc.n_head);
    const int64_t mlp = (arch == DSC_ARCH_LLAMA ? 3 : 2) * mc.d_ff;
    const int64_t per_block = (6 * mc.d_model + 2 * kv + mlp) * 2 * B * T * 2; /* 2 slots, 2 bytes less */
    /* ... and the workspace grows once, for the model, by the attention's four widened tensors and
     * the block's one */
    const int64_t widened = 5 * B * T * mc.d_model * (int64_t)sizeof(float);
    const int64_t logits = B * T * mc.vocab_size * 2; /* the head's one buffer, 2 bytes less a value */
    assert_true(activation_bytes_now() - before == -mc.n_layer * per_block - logits + widened);
    const dsc_layer *block = narrow.layers[1];
    assert_int_equal(wide.layers[1]->activation_bytes_per_token - block->activation_bytes_per_token,
                     per_block / (2 * B * T));
    double lw[2], ln[2];
    run_two(&wide, saved, lw);
    run_two(&narrow, saved, ln);
    assert_true(lw[0] == ln[0] && lw[1] == ln[1]);
    assert_same_grads(&wide, &narrow);
    test_model_free(&narrow);
    /* f32 products read the rounded operands as they are: the storage shows */
    assert_ok(test_model_build(&narrow, &mc, DSC_CPU, 3, 2, B, T));
    for (int l = 0; l < narrow.n; l++) {
        dsc_layer_set_saved_dtype(narrow.layers[l], saved);
        assert_ok(dsc_layer_reserve(narrow.layers[l], 2, B, T));
    }
    test_model_free(&wide);
    assert_ok(test_model_build(&wide, &mc, DSC_CPU, 3, 2, B, T));
    run_two(&wide, DSC_DTYPE_F32, lw);
    run_two(&narrow, DSC_DTYPE_F32, ln);
    dsc_tensor gw, gn;
    flat_grads(&wide, &gw);
    flat_grads(&narrow, &gn);
    assert_true(memcmp(gw.data, gn.data, dsc_tensor_nbytes(&gw)) != 0);
    test_model_free(&wide);
    test_model_free(&narrow);
}

/* The activation bytes a model of `n_layer` blocks reserves, built alone (2 slots). */
static int64_t model_activation_bytes(dsc_model_arch arch, int n_layer, int64_t *block_per_token) {
    dsc_model_config mc;
    test_tiny_config(&mc, arch);
    mc.n_layer = n_layer;
    const int64_t before = activation_bytes_now();
    test_model m;
    assert_ok(test_model_build(&m, &mc, DSC_CPU, 3, 2, B, T));
    const int64_t bytes = activation_bytes_now() - before;
    *block_per_token = m.layers[1]->activation_bytes_per_token;
    test_model_free(&m);
    assert_true(activation_bytes_now() == before); /* the workspace goes with the last layer */
    return bytes;
}

/* The layers' per-call temporaries are one workspace for the model: two more blocks reserve
 * exactly their slots' activations (activation_bytes_per_token), no scratch of their own. */
static void test_workspace_shared_by_layers(void **state) {
    (void)state;
    dsc_model_arch arches[2] = {DSC_ARCH_GPT, DSC_ARCH_LLAMA};
    for (int i = 0; i < 2; i++) {
        int64_t per_token, per_token4;
        const int64_t two = model_activation_bytes(arches[i], 2, &per_token);
        const int64_t four = model_activation_bytes(arches[i], 4, &per_token4);
        assert_int_equal(per_token, per_token4);
        const int64_t positions = arches[i] == DSC_ARCH_LLAMA ? T * (int64_t)sizeof(int32_t) : 0; /* RoPE's */
        assert_int_equal(four - two, 2 * (per_token * 2 * B * T + positions));
    }
}

static void test_saved_in_two_bytes_is_bitwise(void **state) {
    (void)state;
    saved_case(DSC_ARCH_GPT, DSC_DTYPE_BF16);
    saved_case(DSC_ARCH_LLAMA, DSC_DTYPE_BF16);
    saved_case(DSC_ARCH_GPT, DSC_DTYPE_F16);
    saved_case(DSC_ARCH_LLAMA, DSC_DTYPE_F16);
}

/* Backward of one slot through all layers, keeping a copy of the first block's input gradient. */
static void backward_keep(test_model *m, int slot, float scale, dsc_tensor *first_block_din) {
    dsc_micro_ctx ctx = {.loss_scale = scale, .training = true};
    dsc_tensor grad = {0}, din;
    for (int i = m->n - 1; i >= 0; i--) {
        assert_ok(dsc_layer_backward(m->layers[i], slot, &grad, &din, &ctx));
        if (i == 1) *first_block_din = din;
        grad = din;
    }
}

static void slots_case(dsc_model_arch arch, bool checkpointing) {
    dsc_model_config mc;
    test_tiny_config(&mc, arch);
    mc.activation_checkpointing = checkpointing;
    test_model seq, inflight;
    assert_ok(test_model_build(&seq, &mc, DSC_CPU, 9, 1, B, T));
    assert_ok(test_model_build(&inflight, &mc, DSC_CPU, 9, 2, B, T));
    batch b0, b1;
    make_batch(&b0, mc.vocab_size, 3);
    make_batch(&b1, mc.vocab_size, 4);
    const size_t din_bytes = (size_t)B * T * mc.d_model * sizeof(float);
    float *din0 = malloc(din_bytes), *din1 = malloc(din_bytes);

    double s0, s1, f0, f1;
    dsc_tensor d;
    assert_ok(test_model_forward(&seq, 0, &b0.tok, &b0.tgt, &s0));
    backward_keep(&seq, 0, 0.5f, &d);
    memcpy(din0, d.data, din_bytes);
    assert_ok(test_model_forward(&seq, 0, &b1.tok, &b1.tgt, &s1));
    backward_keep(&seq, 0, 0.5f, &d);
    memcpy(din1, d.data, din_bytes);

    dsc_tensor d0, d1, logits;
    assert_ok(test_model_forward(&inflight, 0, &b0.tok, &b0.tgt, &f0));
    assert_ok(dsc_head_logits(inflight.layers[inflight.n - 1], 0, &logits));
    assert_ok(test_model_forward(&inflight, 1, &b1.tok, &b1.tgt, &f1));
    /* One logits buffer serves all slots: slot 0's are gone, backward recomputes them. */
    assert_err(dsc_head_logits(inflight.layers[inflight.n - 1], 0, &logits), DSC_ERR_INVALID,
               "the logits of slot 0 are gone");
    backward_keep(&inflight, 0, 0.5f, &d0);
    backward_keep(&inflight, 1, 0.5f, &d1);
    assert_true(s0 == f0 && s1 == f1);
    assert_same_grads(&seq, &inflight);
    /* Slot 0's input gradient is still valid after slot 1's backward (a stage sends it later). */
    assert_memory_equal(d0.data, din0, din_bytes);
    assert_memory_equal(d1.data, din1, din_bytes);
    free(din0);
    free(din1);
    test_model_free(&seq);
    test_model_free(&inflight);
}

static void test_two_slots_in_flight_equal_sequential(void **state) {
    (void)state;
    slots_case(DSC_ARCH_GPT, false);
    slots_case(DSC_ARCH_LLAMA, true);
}

static void test_logits_only_forward(void **state) {
    (void)state;
    dsc_model_config mc;
    test_tiny_config(&mc, DSC_ARCH_LLAMA);
    test_model m;
    assert_ok(test_model_build(&m, &mc, DSC_CPU, 1, 1, B, T));
    batch b;
    make_batch(&b, mc.vocab_size, 5);
    double with_targets;
    assert_ok(test_model_forward(&m, 0, &b.tok, &b.tgt, &with_targets));
    dsc_tensor ref;
    assert_ok(dsc_head_logits(m.layers[m.n - 1], 0, &ref));
    float *copy = malloc(dsc_tensor_nbytes(&ref));
    memcpy(copy, ref.data, dsc_tensor_nbytes(&ref));
    assert_ok(test_model_backward(&m, 0, 1.0f));

    /* Generation: no targets, the head's output is the logits; no backward. */
    dsc_micro_ctx ctx = {.tokens = &b.tok};
    dsc_tensor cur = {0}, next;
    for (int i = 0; i < m.n; i++) {
        assert_ok(dsc_layer_forward(m.layers[i], 0, &cur, &next, &ctx));
        cur = next;
    }
    assert_int_equal(cur.ndim, 3);
    assert_int_equal(cur.shape[2], mc.vocab_size);
    assert_memory_equal(cur.data, copy, dsc_tensor_nbytes(&ref));
    dsc_tensor din;
    assert_err(dsc_layer_backward(m.layers[m.n - 1], 0, &cur, &din, &ctx), DSC_ERR_INVALID, "logits only");
    free(copy);
    test_model_free(&m);
}

/* Under mixed precision the head stores the logits in 2 bytes: a forward without targets (generation)
 * gives them in that type, and dsc_logits_row reads a row widened: the f32-storage model's logits under
 * the same products (rounded in place), bit for bit. */
static void test_logits_in_two_bytes(void **state) {
    (void)state;
    dsc_model_config mc;
    test_tiny_config(&mc, DSC_ARCH_LLAMA);
    test_model wide, narrow;
    assert_ok(test_model_build(&wide, &mc, DSC_CPU, 4, 1, B, T));
    assert_ok(test_model_build(&narrow, &mc, DSC_CPU, 4, 1, B, T));
    for (int l = 0; l < narrow.n; l++) {
        dsc_layer_set_saved_dtype(narrow.layers[l], DSC_DTYPE_BF16);
        assert_ok(dsc_layer_reserve(narrow.layers[l], 1, B, T));
    }
    batch b;
    make_batch(&b, mc.vocab_size, 8);
    dsc_tensor out[2];
    test_model *models[2] = {&wide, &narrow};
    const dsc_dtype was = dsc_kernels_set_matmul_dtype(DSC_DTYPE_BF16);
    for (int k = 0; k < 2; k++) {
        dsc_micro_ctx ctx = {.tokens = &b.tok};
        dsc_tensor cur = {0};
        for (int i = 0; i < models[k]->n; i++) {
            assert_ok(dsc_layer_forward(models[k]->layers[i], 0, &cur, &out[k], &ctx));
            cur = out[k];
        }
    }
    dsc_kernels_set_matmul_dtype(was);
    assert_int_equal(out[0].dtype, DSC_DTYPE_F32);
    assert_int_equal(out[1].dtype, DSC_DTYPE_BF16);
    float *got = malloc((size_t)mc.vocab_size * sizeof *got), *want = malloc((size_t)mc.vocab_size * sizeof *want);
    for (int64_t r = 0; r < B * T; r++) {
        assert_ok(dsc_logits_row(&out[1], r, got));
        assert_ok(dsc_logits_row(&out[0], r, want));
        assert_memory_equal(got, want, (size_t)mc.vocab_size * sizeof *got);
    }
    assert_err(dsc_logits_row(&out[1], B * T, got), DSC_ERR_INVALID, "outside");
    free(got);
    free(want);
    test_model_free(&wide);
    test_model_free(&narrow);
}

static void test_bad_input(void **state) {
    (void)state;
    dsc_model_config mc;
    test_tiny_config(&mc, DSC_ARCH_GPT);
    test_model m;
    assert_ok(test_model_build(&m, &mc, DSC_CPU, 1, 2, B, T));
    batch b;
    make_batch(&b, mc.vocab_size, 6);
    dsc_micro_ctx ctx = {.tokens = &b.tok, .targets = &b.tgt, .loss_scale = 1.0f};
    dsc_tensor out, din, none = {0};
    dsc_layer *embed = m.layers[0], *block = m.layers[1], *head = m.layers[m.n - 1];

    b.tokens[7] = mc.vocab_size;
    assert_err(dsc_layer_forward(embed, 0, &none, &out, &ctx), DSC_ERR_INVALID, "token id 29");
    assert_err(dsc_layer_forward(embed, 0, &none, &out, &ctx), DSC_ERR_INVALID, "layer embed (embedding)");
    b.tokens[7] = -3;
    assert_err(dsc_layer_forward(embed, 0, &none, &out, &ctx), DSC_ERR_INVALID, "token id -3");
    b.tokens[7] = 0;
    dsc_micro_ctx no_tokens = {0};
    assert_err(dsc_layer_forward(embed, 0, &none, &out, &no_tokens), DSC_ERR_INVALID, "no token ids");
    dsc_tensor long_tokens = dsc_tensor_view(b.tokens, DSC_DTYPE_I32, 2, (int64_t[]){1, 2 * T}, DSC_CPU);
    dsc_micro_ctx long_ctx = {.tokens = &long_tokens};
    assert_err(dsc_layer_forward(embed, 0, &none, &out, &long_ctx), DSC_ERR_INVALID,
               "token ids (1, 16) exceed the reserved micro-batch (2, 8)");

    dsc_tensor x;
    assert_ok(dsc_tensor_alloc(&x, DSC_DTYPE_F32, 3, (int64_t[]){B, T, mc.d_model + 1}, DSC_CPU, DSC_MEM_OTHER));
    assert_err(dsc_layer_forward(block, 0, &x, &out, &ctx), DSC_ERR_INVALID,
               "layer layers.0 (block) forward slot 0: input: expected shape (*, *, 16) f32, got (2, 8, 17) f32");
    dsc_tensor_free(&x);
    assert_ok(dsc_tensor_alloc(&x, DSC_DTYPE_F32, 3, (int64_t[]){B + 1, T, mc.d_model}, DSC_CPU, DSC_MEM_OTHER));
    assert_err(dsc_layer_forward(block, 0, &x, &out, &ctx), DSC_ERR_INVALID,
               "input (3, 8, 16) exceeds the reserved micro-batch (2, 8)");
    dsc_tensor_free(&x);
    assert_ok(dsc_tensor_alloc(&x, DSC_DTYPE_F32, 3, (int64_t[]){B, T, mc.d_model}, DSC_CPU, DSC_MEM_OTHER));
    assert_err(dsc_layer_forward(block, 2, &x, &out, &ctx), DSC_ERR_INVALID,
               "layer layers.0 (block) forward: slot 2 outside [0, 2)");
    assert_err(dsc_layer_backward(block, 1, &x, &din, &ctx), DSC_ERR_INVALID,
               "layer layers.0 (block) backward slot 1: backward without a pending forward");

    b.targets[2] = mc.vocab_size;
    assert_err(dsc_layer_forward(head, 0, &x, &out, &ctx), DSC_ERR_INVALID,
               "layer head (lm_head) forward slot 0: target id 29 at (0, 2) is >= vocab_size 29");
    b.targets[2] = 0;
    dsc_tensor short_targets = dsc_tensor_view(b.targets, DSC_DTYPE_I32, 2, (int64_t[]){B, T - 1}, DSC_CPU);
    dsc_micro_ctx short_ctx = {.targets = &short_targets};
    assert_err(dsc_layer_forward(head, 0, &x, &out, &short_ctx), DSC_ERR_INVALID,
               "targets: expected shape (2, 8) i32, got (2, 7) i32");
    dsc_tensor_free(&x);

    mc.seq_len = T - 1;
    dsc_param_store *store;
    assert_ok(dsc_params_create(&store, DSC_CPU, 1));
    dsc_build_ctx bctx = {.model = &mc, .params = store, .device = DSC_CPU};
    dsc_layer_spec spec = {.type = "embedding", .block = -1};
    dsc_layer *e;
    assert_ok(dsc_layer_build(&spec, &bctx, &e));
    assert_ok(dsc_params_finalize(store));
    assert_err(dsc_layer_reserve(e, 1, B, T), DSC_ERR_INVALID, "sequence length 8 exceeds model.seq_len 7");
    assert_err(dsc_layer_forward(e, 0, &none, &out, &ctx), DSC_ERR_INVALID, "no activation slots reserved");
    dsc_layer_destroy(e);
    dsc_params_destroy(store);
    test_model_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checkpointing_is_bitwise),
        cmocka_unit_test(test_saved_in_two_bytes_is_bitwise),
        cmocka_unit_test(test_logits_in_two_bytes),
        cmocka_unit_test(test_workspace_shared_by_layers),
        cmocka_unit_test(test_two_slots_in_flight_equal_sequential),
        cmocka_unit_test(test_logits_only_forward),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
