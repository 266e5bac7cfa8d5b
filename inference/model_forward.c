/* The inference forward of one ragged batch, for every supported
 * architecture: embedding (plus learned positions for GPT), then per layer
 * pre-norm attention (q, k, v from row views of the fused QKV parameter,
 * RoPE at each token's own position, paged attention that also writes the
 * KV cache) and pre-norm MLP (GELU, SwiGLU from the fused gate|up
 * parameter, or the MoE feed-forward), and finally the norm and unembedding
 * of each sequence's last token only. Compute goes through the shared
 * kernels; this file only wires views together. Not here: KV bookkeeping
 * (the engine) or MoE routing (model_moe.c). */
#include <stdlib.h>
#include <string.h>

#include "dsc/kernels.h"
#include "inference/model_internal.h"

static dsc_status alloc_f32(float **p, int64_t n, size_t *bytes) {
    *bytes += (size_t)(n > 0 ? n : 1) * sizeof(float);
    return dsc_mem_alloc((void **)p, (size_t)(n > 0 ? n : 1) * sizeof(float), DSC_MEM_ACTIVATIONS, DSC_CPU);
}

/* Every scratch buffer and its element count, in one table for init and free. */
#define SCRATCH_BUFFERS(s, mc, N, S)                                                                         \
    {(float **)&(s)->x, (N) * (mc)->d_model}, {(float **)&(s)->h, (N) * (mc)->d_model},                    \
        {(float **)&(s)->y, (N) * (mc)->d_model}, {(float **)&(s)->q, (N) * (mc)->n_head * (mc)->head_size}, \
        {(float **)&(s)->k, (N) * (mc)->n_kv_head * (mc)->head_size},                                       \
        {(float **)&(s)->v, (N) * (mc)->n_kv_head * (mc)->head_size},                                       \
        {(float **)&(s)->att, (N) * (mc)->n_head * (mc)->head_size}, {(float **)&(s)->ff1, (N) * (mc)->d_ff}, \
        {(float **)&(s)->ff2, (N) * (mc)->d_ff}, {(float **)&(s)->moe, (N) * (mc)->d_model},                \
        {(float **)&(s)->router, (N) * ((mc)->n_experts + 1)},                                              \
        {(float **)&(s)->routes, (N) * ((mc)->top_k + 1)}, {(float **)&(s)->weights, (N) * ((mc)->top_k + 1)}, \
        {(float **)&(s)->rows, (N)}, {(float **)&(s)->pos, (N)}, {(float **)&(s)->last, (S) * (mc)->d_model}

typedef struct scratch_entry {
    float **p;
    int64_t n;
} scratch_entry;

dsc_status dsc_forward_scratch_init(dsc_forward_scratch *s, const dsc_infer_model_config *mc, int64_t max_tokens,
                                    int64_t max_seqs) {
    *s = (dsc_forward_scratch){.max_tokens = max_tokens, .max_seqs = max_seqs, .cfg = *mc};
    scratch_entry e[] = {SCRATCH_BUFFERS(s, mc, max_tokens, max_seqs)};
    for (size_t i = 0; i < sizeof e / sizeof e[0]; i++) {
        dsc_status st = alloc_f32(e[i].p, e[i].n, &s->bytes);
        if (st) {
            dsc_forward_scratch_free(s);
            return dsc_error_wrap(st, "inference scratch for %lld tokens", (long long)max_tokens);
        }
    }
    return NULL;
}

void dsc_forward_scratch_free(dsc_forward_scratch *s) {
    const dsc_infer_model_config *mc = &s->cfg;
    scratch_entry e[] = {SCRATCH_BUFFERS(s, mc, s->max_tokens, s->max_seqs)};
    for (size_t i = 0; i < sizeof e / sizeof e[0]; i++)
        if (*e[i].p) dsc_mem_free(*e[i].p, (size_t)(e[i].n > 0 ? e[i].n : 1) * sizeof(float), DSC_MEM_ACTIVATIONS,
                                  DSC_CPU);
    *s = (dsc_forward_scratch){0};
}

dsc_tensor dsc_model_view2(float *p, int64_t rows, int64_t cols) {
    return dsc_tensor_view(p, DSC_DTYPE_F32, 2, (int64_t[]){rows, cols}, DSC_CPU);
}

static const dsc_tensor *param(const dsc_infer_model *m, int32_t c, dsc_param_role role) {
    const dsc_tensor *t = &m->params[(size_t)c * DSC_PARAM_ROLE_COUNT + role];
    return t->data ? t : NULL;
}

dsc_status dsc_model_project(float *y, const float *x, int64_t n, const dsc_tensor *w, const dsc_tensor *b, int64_t row0,
                          int64_t rows) {
    int64_t cols = w->shape[1];
    dsc_tensor wv = dsc_model_view2((float *)w->data + row0 * cols, rows, cols);
    dsc_tensor bv = b ? dsc_tensor_view((float *)b->data + row0, DSC_DTYPE_F32, 1, &rows, DSC_CPU) : (dsc_tensor){0};
    dsc_tensor xv = dsc_model_view2((float *)x, n, cols), yv = dsc_model_view2(y, n, rows);
    return dsc_kernel_linear_forward(&yv, &xv, &wv, b ? &bv : NULL);
}

static dsc_status norm(const dsc_infer_model *m, float *out, const float *x, int64_t n, const dsc_tensor *w,
                       const dsc_tensor *b) {
    dsc_tensor xv = dsc_model_view2((float *)x, n, m->cfg.d_model), ov = dsc_model_view2(out, n, m->cfg.d_model);
    if (m->cfg.family == DSC_INFER_FAMILY_GPT)
        return dsc_kernel_layernorm_forward(&ov, NULL, NULL, &xv, w, b, m->cfg.norm_eps);
    return dsc_kernel_rmsnorm_forward(&ov, NULL, &xv, w, m->cfg.norm_eps);
}

static dsc_status embed(const dsc_infer_model *m, const dsc_ragged_batch *batch, float *x, int32_t *pos) {
    const dsc_infer_model_config *mc = &m->cfg;
    const dsc_tensor *wte = param(m, mc->n_layer, DSC_PARAM_ROLE_EMBED);
    const dsc_tensor *wpe = param(m, mc->n_layer, DSC_PARAM_ROLE_POS_EMBED);
    int64_t C = mc->d_model;
    for (int32_t t = 0; t < batch->n_tokens; t++) {
        int32_t id = batch->tokens[t];
        int64_t p = batch->positions[t];
        DSC_CHECK(id >= 0 && id < mc->vocab_size, DSC_ERR_INVALID, "token id %d outside the vocabulary [0, %d)", id,
                  mc->vocab_size);
        DSC_CHECK(p < mc->max_positions, DSC_ERR_INVALID, "position %lld beyond the model's %lld positions",
                  (long long)p, (long long)mc->max_positions);
        pos[t] = (int32_t)p;
        memcpy(x + t * C, (const float *)wte->data + (int64_t)id * C, (size_t)C * sizeof *x);
        if (wpe) {
            const float *row = (const float *)wpe->data + p * C;
            for (int64_t i = 0; i < C; i++) x[t * C + i] += row[i];
        }
    }
    return NULL;
}

static dsc_status attention(const dsc_infer_model *m, int32_t l, const dsc_ragged_batch *batch, dsc_kv_cache *cache,
                            dsc_forward_scratch *s) {
    const dsc_infer_model_config *mc = &m->cfg;
    int64_t N = batch->n_tokens, Q = (int64_t)mc->n_head * mc->head_size, KV = (int64_t)mc->n_kv_head * mc->head_size;
    const dsc_tensor *w = param(m, l, DSC_PARAM_ROLE_QKV_W), *b = param(m, l, DSC_PARAM_ROLE_QKV_B);
    DSC_TRY(dsc_model_project(s->q, s->h, N, w, b, 0, Q));
    DSC_TRY(dsc_model_project(s->k, s->h, N, w, b, Q, KV));
    DSC_TRY(dsc_model_project(s->v, s->h, N, w, b, Q + KV, KV));
    if (mc->family == DSC_INFER_FAMILY_LLAMA) {
        dsc_model_rope(m, s->q, N, mc->n_head, s->pos);
        dsc_model_rope(m, s->k, N, mc->n_kv_head, s->pos);
    }
    int64_t qs[3] = {N, mc->n_head, mc->head_size}, ks[3] = {N, mc->n_kv_head, mc->head_size};
    dsc_tensor q = dsc_tensor_view(s->q, DSC_DTYPE_F32, 3, qs, DSC_CPU);
    dsc_tensor k = dsc_tensor_view(s->k, DSC_DTYPE_F32, 3, ks, DSC_CPU);
    dsc_tensor v = dsc_tensor_view(s->v, DSC_DTYPE_F32, 3, ks, DSC_CPU);
    dsc_tensor out = dsc_tensor_view(s->att, DSC_DTYPE_F32, 3, qs, DSC_CPU);
    dsc_tensor layer_cache;
    DSC_TRY(dsc_kv_cache_layer(cache, l, &layer_cache));
    DSC_TRY(dsc_paged_attention_forward(&out, &q, &k, &v, batch, &layer_cache));
    const dsc_tensor *wo = param(m, l, DSC_PARAM_ROLE_ATTN_OUT_W);
    return dsc_model_project(s->y, s->att, N, wo, param(m, l, DSC_PARAM_ROLE_ATTN_OUT_B), 0, mc->d_model);
}

/* h (N, C) -> y (N, C). */
static dsc_status mlp(const dsc_infer_model *m, int32_t l, int64_t N, dsc_forward_scratch *s) {
    const dsc_infer_model_config *mc = &m->cfg;
    if (mc->n_experts > 0) return dsc_model_moe(m, l, N, s->h, s->y, s);
    const dsc_tensor *w1 = param(m, l, DSC_PARAM_ROLE_MLP1_W), *b1 = param(m, l, DSC_PARAM_ROLE_MLP1_B);
    dsc_tensor a = dsc_model_view2(s->ff1, N, mc->d_ff), g = dsc_model_view2(s->ff2, N, mc->d_ff);
    if (mc->family == DSC_INFER_FAMILY_GPT) {
        DSC_TRY(dsc_model_project(s->ff2, s->h, N, w1, b1, 0, mc->d_ff));
        DSC_TRY(dsc_kernel_gelu_forward(&a, &g));
    } else {
        DSC_TRY(dsc_model_project(s->ff1, s->h, N, w1, NULL, 0, mc->d_ff));
        DSC_TRY(dsc_model_project(s->ff2, s->h, N, w1, NULL, mc->d_ff, mc->d_ff));
        dsc_tensor gate = dsc_model_view2(s->ff1, N, mc->d_ff);
        DSC_TRY(dsc_kernel_swiglu_forward(&a, &gate, &g));
    }
    return dsc_model_project(s->y, s->ff1, N, param(m, l, DSC_PARAM_ROLE_MLP2_W), param(m, l, DSC_PARAM_ROLE_MLP2_B), 0,
                   mc->d_model);
}

dsc_status dsc_model_forward(const dsc_infer_model *m, const dsc_ragged_batch *batch, dsc_kv_cache *cache,
                             dsc_forward_scratch *s, float *logits) {
    const dsc_infer_model_config *mc = &m->cfg;
    int64_t N = batch->n_tokens, S = batch->n_seqs, C = mc->d_model;
    DSC_CHECK(N <= s->max_tokens && S <= s->max_seqs, DSC_ERR_INVALID,
              "batch of %lld tokens / %lld sequences exceeds the scratch (%lld / %lld)", (long long)N, (long long)S,
              (long long)s->max_tokens, (long long)s->max_seqs);
    DSC_TRY(embed(m, batch, s->x, s->pos));
    dsc_tensor xv = dsc_model_view2(s->x, N, C), yv = dsc_model_view2(s->y, N, C);
    for (int32_t l = 0; l < mc->n_layer; l++) {
        DSC_TRY(norm(m, s->h, s->x, N, param(m, l, DSC_PARAM_ROLE_ATTN_NORM_W), param(m, l, DSC_PARAM_ROLE_ATTN_NORM_B)));
        DSC_TRY(attention(m, l, batch, cache, s));
        DSC_TRY(dsc_kernel_axpy(&xv, 1.0f, &yv));
        DSC_TRY(norm(m, s->h, s->x, N, param(m, l, DSC_PARAM_ROLE_MLP_NORM_W), param(m, l, DSC_PARAM_ROLE_MLP_NORM_B)));
        DSC_TRY(mlp(m, l, N, s));
        DSC_TRY(dsc_kernel_axpy(&xv, 1.0f, &yv));
    }
    for (int64_t i = 0; i < S; i++) memcpy(s->last + i * C, s->x + (int64_t)batch->last_token[i] * C, (size_t)C * sizeof(float));
    int32_t L = mc->n_layer;
    DSC_TRY(norm(m, s->h, s->last, S, param(m, L, DSC_PARAM_ROLE_FINAL_NORM_W), param(m, L, DSC_PARAM_ROLE_FINAL_NORM_B)));
    const dsc_tensor *unembed = param(m, L, DSC_PARAM_ROLE_UNEMBED);
    if (!unembed) unembed = param(m, L, DSC_PARAM_ROLE_EMBED);
    return dsc_model_project(logits, s->h, S, unembed, NULL, 0, mc->vocab_size);
}
