/* Causal self-attention component: q, k, v projections (separate weights, so
 * grouped-query shapes and Hugging Face's q_proj/k_proj/v_proj map one to
 * one), optional RoPE on q and k, the attention kernel, and the output
 * projection.
 *
 * Per slot it saves q and k after RoPE, v, the attention output and the
 * log-sum-exp rows; the block keeps the input. RoPE's backward is the inverse
 * rotation applied to dq and dk. Masking beyond causality and dropout are
 * not supported.
 *
 * Under mixed precision (a->saved bf16 / fp16) q, k, v and the output are
 * kept in 2 bytes: the backward reads them only in products (the attention
 * kernel's, which round them, and the o projection's weight gradient), so
 * they are exact there. The forward computes them in the workspace and stores
 * them rounded; the backward widens them into more of it (nn_work_at). */
#include <math.h>
#include <stdlib.h>

#include "dsc/kernels.h"
#include "runtime/nn/nn_internal.h"

dsc_status nn_attention_init(nn_attention *a, nn_param_list *list, dsc_param_store *store, const char *prefix,
                             const dsc_model_config *mc) {
    *a = (nn_attention){.C = mc->d_model,
                        .NH = mc->n_head,
                        .NKV = mc->n_kv_head,
                        .HS = mc->d_model / mc->n_head,
                        .rope = nn_arch_is_llama(mc),
                        .rope_theta = mc->rope_theta,
                        .saved = DSC_DTYPE_F32};
    const int64_t C = a->C, KV = a->NKV * a->HS;
    const float std = mc->init_std;
    /* GPT-2's scaled init: the residual stream sums 2 projections per block. */
    const float std_o = mc->init_std / sqrtf(2.0f * (float)mc->n_layer);
    const uint32_t w = DSC_PARAM_USE_ROUNDED_BY_KERNELS | DSC_PARAM_USE_GRAD_ROUNDED_BY_KERNELS;
    DSC_TRY(nn_declare_used(list, store, prefix, "q.weight", 2, (int64_t[]){C, C}, 0, w, DSC_INIT_NORMAL, std,
                            &a->wq));
    DSC_TRY(nn_declare_used(list, store, prefix, "k.weight", 2, (int64_t[]){KV, C}, 0, w, DSC_INIT_NORMAL, std,
                            &a->wk));
    DSC_TRY(nn_declare_used(list, store, prefix, "v.weight", 2, (int64_t[]){KV, C}, 0, w, DSC_INIT_NORMAL, std,
                            &a->wv));
    DSC_TRY(nn_declare_used(list, store, prefix, "o.weight", 2, (int64_t[]){C, C}, 0, w, DSC_INIT_NORMAL, std_o,
                            &a->wo));
    const uint32_t nd = DSC_PARAM_NO_DECAY, b = DSC_PARAM_USE_GRAD_ROUNDED_BY_KERNELS;
    if (mc->qkv_bias) {
        DSC_TRY(
            nn_declare_used(list, store, prefix, "q.bias", 1, (int64_t[]){C}, nd, b, DSC_INIT_ZEROS, 0, &a->bq));
        DSC_TRY(
            nn_declare_used(list, store, prefix, "k.bias", 1, (int64_t[]){KV}, nd, b, DSC_INIT_ZEROS, 0, &a->bk));
        DSC_TRY(
            nn_declare_used(list, store, prefix, "v.bias", 1, (int64_t[]){KV}, nd, b, DSC_INIT_ZEROS, 0, &a->bv));
    }
    if (!nn_arch_is_llama(mc))
        DSC_TRY(
            nn_declare_used(list, store, prefix, "o.bias", 1, (int64_t[]){C}, nd, b, DSC_INIT_ZEROS, 0, &a->bo));
    return NULL;
}

void nn_attention_free(nn_attention *a) {
    dsc_buffers_free(&a->q, a->slots);
    dsc_buffers_free(&a->k, a->slots);
    dsc_buffers_free(&a->v, a->slots);
    dsc_buffers_free(&a->att, a->slots);
    dsc_buffers_free(&a->lse, a->slots);
    if (a->holds_work) nn_work_drop();
    a->holds_work = false;
    dsc_tensor_free(&a->positions);
    a->slots = 0;
}

static dsc_status reserve_positions(nn_attention *a, int64_t T, dsc_device device) {
    int32_t *host = malloc((size_t)T * sizeof *host);
    DSC_CHECK(host, DSC_ERR_NOMEM, "RoPE positions for %lld tokens", (long long)T);
    for (int64_t i = 0; i < T; i++)
        host[i] = (int32_t)i;
    dsc_tensor src = dsc_tensor_view(host, DSC_DTYPE_I32, 1, (int64_t[]){T}, DSC_CPU);
    dsc_status s = dsc_tensor_alloc(&a->positions, DSC_DTYPE_I32, 1, (int64_t[]){T}, device, DSC_MEM_ACTIVATIONS);
    if (!s) s = dsc_tensor_copy(&a->positions, &src);
    free(host);
    return s;
}

dsc_status nn_attention_reserve(nn_attention *a, int slots, int64_t B, int64_t T, dsc_device device) {
    nn_attention_free(a);
    a->slots = slots;
    const int64_t q_shape[4] = {B, T, a->NH, a->HS}, kv_shape[4] = {B, T, a->NKV, a->HS};
    nn_work_hold();
    a->holds_work = true;
    dsc_status s = nn_buffers_alloc_as(&a->q, slots, 4, q_shape, device, a->saved);
    if (!s) s = nn_buffers_alloc_as(&a->k, slots, 4, kv_shape, device, a->saved);
    if (!s) s = nn_buffers_alloc_as(&a->v, slots, 4, kv_shape, device, a->saved);
    if (!s) s = nn_buffers_alloc_as(&a->att, slots, 4, q_shape, device, a->saved);
    if (!s) s = dsc_buffers_alloc(&a->lse, slots, 3, (int64_t[]){B, a->NH, T}, device);
    /* datt and dq need (B, T, C); dk and dv fit in the same size since KV <= C; so do q, k, v, att
     * widened from 2 bytes. */
    if (!s) s = nn_work_grow(NN_WORK_ATTN, a->saved == DSC_DTYPE_F32 ? 4 : 8, B * T * a->C, device);
    if (!s && a->rope) s = reserve_positions(a, T, device);
    if (s) nn_attention_free(a);
    return s;
}

int64_t nn_attention_saved_bytes_per_token(const nn_attention *a) {
    const int64_t kept = a->saved == DSC_DTYPE_F32 ? 4 : 2;
    return kept * (2 * a->C + 2 * a->NKV * a->HS) + (int64_t)sizeof(float) * a->NH; /* q, att, k, v; lse */
}

/* Views of one slot's saved tensors for a (b, t) micro-batch. */
typedef struct attn_views {
    dsc_tensor q, k, v, att, lse, pos;
} attn_views;

static attn_views slot_views(const nn_attention *a, int slot, int64_t b, int64_t t) {
    const int64_t q_shape[4] = {b, t, a->NH, a->HS}, kv_shape[4] = {b, t, a->NKV, a->HS};
    attn_views w = {.q = nn_view(&a->q[slot], 4, q_shape),
                    .k = nn_view(&a->k[slot], 4, kv_shape),
                    .v = nn_view(&a->v[slot], 4, kv_shape),
                    .att = nn_view(&a->att[slot], 4, q_shape),
                    .lse = nn_view(&a->lse[slot], 3, (int64_t[]){b, a->NH, t})};
    if (a->rope) w.pos = nn_view(&a->positions, 1, (int64_t[]){t});
    return w;
}

/* Where the forward computes q, k, v, att: the slot's buffers, or under a 2-byte saved type the
 * workspace, stored rounded by store_saved. */
static attn_views computed_views(const nn_attention *a, const attn_views *slot, int64_t b, int64_t t) {
    if (a->saved == DSC_DTYPE_F32) return *slot;
    const int64_t q_shape[4] = {b, t, a->NH, a->HS}, kv_shape[4] = {b, t, a->NKV, a->HS};
    attn_views w = *slot;
    w.att = nn_work_at(NN_WORK_ATTN, 4, q_shape);
    w.q = nn_work_at(NN_WORK_ATTN + 1, 4, q_shape);
    w.k = nn_work_at(NN_WORK_ATTN + 2, 4, kv_shape);
    w.v = nn_work_at(NN_WORK_ATTN + 3, 4, kv_shape);
    return w;
}

static void store_saved(const nn_attention *a, attn_views *slot, const attn_views *computed) {
    if (a->saved == DSC_DTYPE_F32) return;
    nn_saved_store(&slot->q, &computed->q);
    nn_saved_store(&slot->k, &computed->k);
    nn_saved_store(&slot->v, &computed->v);
    nn_saved_store(&slot->att, &computed->att);
}

/* The slot's q, k, v, att widened into the workspace's second four buffers, in place of *w's. */
static void widen_saved(attn_views *w) {
    dsc_tensor *saved[4] = {&w->q, &w->k, &w->v, &w->att};
    for (int i = 0; i < 4; i++) {
        dsc_tensor wide = nn_work_at(NN_WORK_ATTN + 4 + i, saved[i]->ndim, saved[i]->shape);
        nn_saved_load(&wide, saved[i]);
        *saved[i] = wide;
    }
}

dsc_status nn_attention_forward(nn_attention *a, int slot, const dsc_tensor *x, dsc_tensor *y) {
    const int64_t b = x->shape[0], t = x->shape[1];
    attn_views kept = slot_views(a, slot, b, t), w = computed_views(a, &kept, b, t);
    DSC_TRY(dsc_param_linear_forward(&w.q, x, a->wq, a->bq));
    DSC_TRY(dsc_param_linear_forward(&w.k, x, a->wk, a->bk));
    DSC_TRY(dsc_param_linear_forward(&w.v, x, a->wv, a->bv));
    if (a->rope) {
        DSC_TRY(dsc_kernel_rope(&w.q, &w.q, &w.pos, a->rope_theta, false));
        DSC_TRY(dsc_kernel_rope(&w.k, &w.k, &w.pos, a->rope_theta, false));
    }
    DSC_TRY(dsc_kernel_attention_forward(&w.att, &w.lse, &w.q, &w.k, &w.v));
    store_saved(a, &kept, &w);
    return dsc_param_linear_forward(y, &w.att, a->wo, a->bo);
}

dsc_status nn_attention_backward(nn_attention *a, int slot, const dsc_tensor *x, const dsc_tensor *dy,
                                 dsc_tensor *dx) {
    const int64_t b = x->shape[0], t = x->shape[1];
    attn_views w = slot_views(a, slot, b, t);
    if (a->saved != DSC_DTYPE_F32) widen_saved(&w);
    const int64_t q_shape[4] = {b, t, a->NH, a->HS}, kv_shape[4] = {b, t, a->NKV, a->HS};
    dsc_tensor datt = nn_work_at(NN_WORK_ATTN, 4, q_shape);
    dsc_tensor dq = nn_work_at(NN_WORK_ATTN + 1, 4, q_shape);
    dsc_tensor dk = nn_work_at(NN_WORK_ATTN + 2, 4, kv_shape);
    dsc_tensor dv = nn_work_at(NN_WORK_ATTN + 3, 4, kv_shape);
    DSC_TRY(dsc_param_linear_backward(&datt, false, a->wo, a->bo, dy, &w.att));
    DSC_TRY(dsc_kernel_attention_backward(&dq, &dk, &dv, &datt, &w.q, &w.k, &w.v, &w.att, &w.lse));
    if (a->rope) {
        DSC_TRY(dsc_kernel_rope(&dq, &dq, &w.pos, a->rope_theta, true));
        DSC_TRY(dsc_kernel_rope(&dk, &dk, &w.pos, a->rope_theta, true));
    }
    DSC_TRY(dsc_param_linear_backward(dx, false, a->wq, a->bq, &dq, x));
    DSC_TRY(dsc_param_linear_backward(dx, true, a->wk, a->bk, &dk, x));
    return dsc_param_linear_backward(dx, true, a->wv, a->bv, &dv, x);
}
