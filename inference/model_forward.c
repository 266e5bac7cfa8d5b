/* The inference forward of one ragged batch, for every supported
 * architecture: embedding (plus learned positions, and OPT's projection
 * from a narrower embedding), then per layer attention (q, k, v from row
 * views of the fused QKV parameter, RoPE on each head's rotated dims at
 * each token's own position, paged attention that also writes the KV
 * cache) and MLP (GELU / ReLU, SwiGLU from the fused gate|up parameter, or
 * the MoE feed-forward), arranged as the config says: pre-norm (Llama,
 * GPT-2, OPT), post-norm (OPT-350m) or GPT-NeoX's parallel residual; and
 * finally the norm and unembedding of each sequence's last token only. The
 * projection weights may be narrow (bf16, f16, Q8_0: model_weights.c); for
 * a single token q|k|v and gate|up are one pass each over the fused weight.
 * Under tensor parallelism the widths are the rank's shard (m->shard), the
 * attention output and the MLP are summed over the group (row-parallel; a
 * parallel-residual block sums both in one all-reduce), and the logits are
 * the rank's vocabulary slice. A pipeline stage runs its layers only:
 * after the embedding when it is the first, else on the residual stream
 * the caller received into s->x; and it ends with the logits when it is the
 * last, else leaving its output in s->x. Compute goes through the shared
 * kernels; this file only wires views together. Not here: KV bookkeeping
 * (the engine) or MoE routing (model_moe.c). */
#include <stdlib.h>
#include <string.h>

#include "dsc/kernels.h"
#include "inference/model_internal.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/cpu_pool.h"
#include "kernels/cpu/cpu_simd.h"

/* Every scratch buffer and its size in bytes, one table for init and free. */
typedef struct scratch_entry {
    void **p;
    size_t bytes;
} scratch_entry;

static int scratch_table(dsc_forward_scratch *s, scratch_entry *e) {
    const dsc_infer_model_config *mc = &s->cfg;
    int64_t N = s->max_tokens, S = s->max_seqs, C = mc->d_model, Q = (int64_t)mc->n_head * mc->head_size;
    int64_t KV = (int64_t)mc->n_kv_head * mc->head_size, E = mc->n_experts;
    int64_t F = mc->d_ff > mc->d_ff_expert ? mc->d_ff : mc->d_ff_expert; /* the widest MLP the scratch serves */
    F = F > mc->d_ff_shared ? F : mc->d_ff_shared;
    int64_t Y2 = mc->parallel_residual ? N * C : 0, P = mc->d_embed && mc->d_embed != C ? mc->d_embed : 0;
    const scratch_entry table[] = {
        {(void **)&s->x, N * C * sizeof(float)},
        {(void **)&s->h, N * C * sizeof(float)},
        {(void **)&s->y, N * C * sizeof(float)},
        {(void **)&s->qkv, N * (Q + 2 * KV) * sizeof(float)},
        {(void **)&s->att, N * Q * sizeof(float)},
        {(void **)&s->ff1, N * 2 * F * sizeof(float)},
        {(void **)&s->moe, N * C * sizeof(float)},
        {(void **)&s->y2, Y2 * sizeof(float)},
        {(void **)&s->emb, N * P * sizeof(float)},
        {(void **)&s->router, N * E * sizeof(float)},
        {(void **)&s->pos, N * sizeof(int32_t)},
        {(void **)&s->last, S * C * sizeof(float)},
        {(void **)&s->rope, N * dsc_model_rope_dims(mc) * sizeof(float)},
    };
    int n = (int)(sizeof table / sizeof table[0]);
    for (int i = 0; i < n; i++)
        e[i] = (scratch_entry){table[i].p, table[i].bytes ? table[i].bytes : sizeof(float)};
    return n;
}

dsc_status dsc_forward_scratch_init(dsc_forward_scratch *s, const dsc_infer_model *m, int64_t max_tokens,
                                    int64_t max_seqs) {
    const dsc_infer_model_config *mc = &m->shard;
    *s = (dsc_forward_scratch){.max_tokens = max_tokens, .max_seqs = max_seqs, .cfg = *mc};
    if (mc->n_experts > 0) {
        dsc_moe_dropless_options o = {.num_experts = mc->n_experts,
                                      .k = mc->top_k,
                                      .width = mc->d_model,
                                      .max_tokens = max_tokens,
                                      .weighting = mc->moe_weighting,
                                      .ep = m->ep_comm};
        DSC_TRY(dsc_error_wrap(dsc_moe_dropless_create(&o, &s->moe_route), "inference MoE routing"));
    }
    scratch_entry e[32];
    int n = scratch_table(s, e);
    for (int i = 0; i < n; i++) {
        dsc_status st = dsc_mem_alloc(e[i].p, e[i].bytes, DSC_MEM_ACTIVATIONS, DSC_CPU);
        if (st) {
            dsc_forward_scratch_free(s);
            return dsc_error_wrap(st, "inference scratch for %lld tokens", (long long)max_tokens);
        }
        s->bytes += e[i].bytes;
    }
    s->ff2 = s->ff1 + max_tokens * mc->d_ff;
    return NULL;
}

void dsc_forward_scratch_free(dsc_forward_scratch *s) {
    scratch_entry e[32];
    int n = scratch_table(s, e);
    for (int i = 0; i < n; i++)
        if (*e[i].p) dsc_mem_free(*e[i].p, e[i].bytes, DSC_MEM_ACTIVATIONS, DSC_CPU);
    dsc_moe_dropless_destroy(s->moe_route);
    *s = (dsc_forward_scratch){0};
}

dsc_tensor dsc_model_view2(float *p, int64_t rows, int64_t cols) {
    return dsc_tensor_view(p, DSC_DTYPE_F32, 2, (int64_t[]){rows, cols}, DSC_CPU);
}

static const dsc_tensor *param(const dsc_infer_model *m, int32_t c, dsc_param_role role) {
    const dsc_tensor *t = &m->params[(size_t)c * DSC_PARAM_ROLE_COUNT + role];
    return t->data ? t : NULL;
}

dsc_status dsc_model_project(float *y, const float *x, int64_t n, const dsc_tensor *w, const dsc_tensor *b,
                             int64_t row0, int64_t rows) {
    int64_t cols = w->shape[1];
    dsc_tensor wv = dsc_model_view2((float *)w->data + row0 * cols, rows, cols);
    dsc_tensor bv =
        b ? dsc_tensor_view((float *)b->data + row0, DSC_DTYPE_F32, 1, &rows, DSC_CPU) : (dsc_tensor){0};
    dsc_tensor xv = dsc_model_view2((float *)x, n, cols), yv = dsc_model_view2(y, n, rows);
    return dsc_kernel_linear_forward(&yv, &xv, &wv, b ? &bv : NULL);
}

/* dsc_model_project for the dense projections, whose weights may be narrow
 * (model_weights.c): rows [row0, row0 + rows) of w through the packed kernel,
 * with the model's widening workspace for prompt-sized batches. */
static dsc_status project(const dsc_infer_model *m, float *y, const float *x, int64_t n, int64_t c,
                          const dsc_tensor *w, const dsc_tensor *b, int64_t row0, int64_t rows) {
    if (w->dtype == DSC_DTYPE_F32) return dsc_model_project(y, x, n, w, b, row0, rows);
    int64_t cols = w->shape[1];
    size_t row_bytes = (size_t)cols * dsc_dtype_size(w->dtype);
    dsc_tensor wv =
        dsc_tensor_view((char *)w->data + (size_t)row0 * row_bytes, w->dtype, 2, (int64_t[]){rows, cols}, DSC_CPU);
    dsc_tensor bv =
        b ? dsc_tensor_view((float *)b->data + row0, DSC_DTYPE_F32, 1, &rows, DSC_CPU) : (dsc_tensor){0};
    dsc_tensor xv = dsc_model_view2((float *)x, n, c), yv = dsc_model_view2(y, n, rows);
    dsc_tensor ws = dsc_tensor_view(m->widen, DSC_DTYPE_F32, 1, &(int64_t){m->widen_floats}, DSC_CPU);
    return dsc_kernel_linear_forward_packed(&yv, &xv, &wv, b ? &bv : NULL, &ws);
}

static dsc_status norm(const dsc_infer_model *m, float *out, const float *x, int64_t n, const dsc_tensor *w,
                       const dsc_tensor *b) {
    dsc_tensor xv = dsc_model_view2((float *)x, n, m->cfg.d_model), ov = dsc_model_view2(out, n, m->cfg.d_model);
    if (m->cfg.family == DSC_INFER_FAMILY_GPT)
        return dsc_kernel_layernorm_forward(&ov, NULL, NULL, &xv, w, b, m->cfg.norm_eps);
    return dsc_kernel_rmsnorm_forward(&ov, NULL, &xv, w, m->cfg.norm_eps);
}

/* Every token's position as i32 (RoPE reads them on every stage). */
static dsc_status positions(const dsc_infer_model *m, const dsc_ragged_batch *batch, int32_t *pos) {
    for (int32_t t = 0; t < batch->n_tokens; t++) {
        int64_t p = batch->positions[t];
        DSC_CHECK(p < m->cfg.max_positions, DSC_ERR_INVALID, "position %lld beyond the model's %lld positions",
                  (long long)p, (long long)m->cfg.max_positions);
        pos[t] = (int32_t)p;
    }
    return NULL;
}

/* Token rows (vocabulary-parallel under TP: the rank holding a token's row
 * writes it, the others zeros, and the sum is the row), projected to C when
 * the embedding is narrower (OPT's project_in), then learned positions. */
static dsc_status embed(dsc_infer_model *m, const dsc_ragged_batch *batch, dsc_forward_scratch *s) {
    const dsc_infer_model_config *mc = &m->cfg;
    int32_t L = mc->n_layer;
    const dsc_tensor *wte = param(m, L, DSC_PARAM_ROLE_EMBED), *wpe = param(m, L, DSC_PARAM_ROLE_POS_EMBED);
    const dsc_tensor *proj_in = param(m, L, DSC_PARAM_ROLE_PROJ_IN);
    int64_t C = mc->d_model, P = wte->shape[1], v0 = m->vocab0, nv = m->shard.vocab_size, N = batch->n_tokens;
    float *e = proj_in ? s->emb : s->x; /* (N, P) */
    for (int32_t t = 0; t < N; t++) {
        int32_t id = batch->tokens[t];
        DSC_CHECK(id >= 0 && id < mc->vocab_size, DSC_ERR_INVALID, "token id %d outside the vocabulary [0, %d)",
                  id, mc->vocab_size);
        if (id >= v0 && id < v0 + nv)
            memcpy(e + t * P, (const float *)wte->data + (id - v0) * P, (size_t)P * sizeof *e);
        else
            memset(e + t * P, 0, (size_t)P * sizeof *e);
    }
    DSC_TRY(dsc_model_tp_allreduce_rows(m, e, N, P));
    if (proj_in) DSC_TRY(dsc_model_project(s->x, e, N, proj_in, NULL, 0, C));
    for (int32_t t = 0; wpe && t < N; t++) {
        const float *row = (const float *)wpe->data + ((int64_t)batch->positions[t] + mc->pos_offset) * C;
        for (int64_t i = 0; i < C; i++)
            s->x[t * C + i] += row[i];
    }
    return NULL;
}

typedef struct rope_job {
    const dsc_infer_model *m;
    float *q, *k;
    const float *cs; /* (n, D) */
    int64_t n;
} rope_job;

/* A chunk is ROPE_TOKENS tokens' q and k heads. */
enum { ROPE_TOKENS = 8 };

static void rope_chunk(void *arg, int64_t ch) {
    const rope_job *R = arg;
    const dsc_infer_model_config *mc = &R->m->shard;
    int64_t t0 = ch * ROPE_TOKENS, n = R->n - t0 < ROPE_TOKENS ? R->n - t0 : ROPE_TOKENS;
    const float *cs = R->cs + t0 * dsc_model_rope_dims(mc);
    dsc_model_rope(R->m, R->q + t0 * mc->n_head * mc->head_size, n, mc->n_head, cs);
    dsc_model_rope(R->m, R->k + t0 * mc->n_kv_head * mc->head_size, n, mc->n_kv_head, cs);
}

/* RoPE on q (N, NH, HS) and k (N, NKV, HS) through the decode pool (kernels/cpu/cpu_pool.h), so a
 * forward's short loops never wait for a late thread, as its GEMVs and attention do not. */
static void rope_qk(const dsc_infer_model *m, float *q, float *k, int64_t n, const float *cs) {
    rope_job R = {.m = m, .q = q, .k = k, .cs = cs, .n = n};
    dsc_cpu_pool_run(rope_chunk, &R, (n + ROPE_TOKENS - 1) / ROPE_TOKENS);
}

/* s->att (N, Q) = attention of layer l over s->h, before the output projection. */
static dsc_status attention(const dsc_infer_model *m, int32_t l, const dsc_ragged_batch *batch,
                            dsc_kv_cache *cache, dsc_forward_scratch *s) {
    const dsc_infer_model_config *mc = &m->shard;
    int64_t N = batch->n_tokens, Q = (int64_t)mc->n_head * mc->head_size,
            KV = (int64_t)mc->n_kv_head * mc->head_size;
    const dsc_tensor *w = param(m, l, DSC_PARAM_ROLE_QKV_W), *b = param(m, l, DSC_PARAM_ROLE_QKV_B);
    /* q, k, v packed back to back, so for one token they are the fused row: one pass over the weight. */
    float *q = s->qkv, *k = q + N * Q, *v = k + N * KV;
    int64_t C = mc->d_model;
    if (N == 1) {
        DSC_TRY(project(m, q, s->h, N, C, w, b, 0, Q + 2 * KV));
    } else {
        DSC_TRY(project(m, q, s->h, N, C, w, b, 0, Q));
        DSC_TRY(project(m, k, s->h, N, C, w, b, Q, KV));
        DSC_TRY(project(m, v, s->h, N, C, w, b, Q + KV, KV));
    }
    if (dsc_model_rope_dims(mc) > 0) rope_qk(m, q, k, N, s->rope);
    int64_t qs[3] = {N, mc->n_head, mc->head_size}, ks[3] = {N, mc->n_kv_head, mc->head_size};
    dsc_tensor qv = dsc_tensor_view(q, DSC_DTYPE_F32, 3, qs, DSC_CPU);
    dsc_tensor kv = dsc_tensor_view(k, DSC_DTYPE_F32, 3, ks, DSC_CPU);
    dsc_tensor vv = dsc_tensor_view(v, DSC_DTYPE_F32, 3, ks, DSC_CPU);
    dsc_tensor out = dsc_tensor_view(s->att, DSC_DTYPE_F32, 3, qs, DSC_CPU);
    dsc_tensor layer_cache; /* the stage's cache holds its layers only */
    DSC_TRY(dsc_kv_cache_layer(cache, l - m->layer0, &layer_cache));
    return dsc_paged_attention_forward(&out, &qv, &kv, &vv, batch, &layer_cache);
}

/* s->ff1 (N, F) = the dense MLP's activation of h, before the down projection. */
static dsc_status mlp_hidden(const dsc_infer_model *m, int32_t l, int64_t N, const float *h,
                             dsc_forward_scratch *s) {
    const dsc_infer_model_config *mc = &m->shard;
    const dsc_tensor *w1 = param(m, l, DSC_PARAM_ROLE_MLP1_W), *b1 = param(m, l, DSC_PARAM_ROLE_MLP1_B);
    int64_t C = mc->d_model, F = mc->d_ff;
    dsc_tensor a = dsc_model_view2(s->ff1, N, F);
    if (mc->family == DSC_INFER_FAMILY_GPT) {
        dsc_tensor g = dsc_model_view2(s->ff2, N, F);
        DSC_TRY(project(m, s->ff2, h, N, C, w1, b1, 0, F));
        DSC_TRY(dsc_model_activation(mc, &a, &g));
    } else {
        dsc_weight_format f = DSC_WEIGHT_FORMAT_COUNT;
        for (int i = 0; i < DSC_WEIGHT_FORMAT_COUNT; i++)
            if (dsc_weight_dtype((dsc_weight_format)i) == w1->dtype) f = (dsc_weight_format)i;
        float *up = s->ff1 + N * F; /* right after N rows of gate: for one token gate | up is the fused row */
        if (f != DSC_WEIGHT_FORMAT_COUNT && N <= dsc_cpu_stream_max_rows(f) && !b1) {
            /* Decode: gate | up streamed once with SwiGLU in the same pass (cpu_linear.c). */
            dsc_cpu_stream_swiglu(s->ff1, h, w1->data, f, N, F, C);
        } else {
            DSC_TRY(project(m, s->ff1, h, N, C, w1, NULL, 0, F));
            DSC_TRY(project(m, up, h, N, C, w1, NULL, F, F));
            dsc_tensor gate = dsc_model_view2(s->ff1, N, F), u = dsc_model_view2(up, N, F);
            DSC_TRY(dsc_kernel_swiglu_forward(&a, &gate, &u));
        }
    }
    return NULL;
}

dsc_status dsc_model_dense_mlp(const dsc_infer_model *m, int32_t l, int64_t N, const float *h, float *out,
                               dsc_forward_scratch *s) {
    DSC_TRY(mlp_hidden(m, l, N, h, s));
    return project(m, out, s->ff1, N, m->shard.d_ff, param(m, l, DSC_PARAM_ROLE_MLP2_W),
                   dsc_model_row_bias(m, param(m, l, DSC_PARAM_ROLE_MLP2_B)), 0, m->shard.d_model);
}

/* h (N, C) -> out (N, C). */
static dsc_status mlp(const dsc_infer_model *m, int32_t l, int64_t N, float *out, dsc_forward_scratch *s) {
    if (dsc_model_is_moe_layer(&m->cfg, l)) return dsc_model_moe(m, l, N, s->h, out, s);
    return dsc_model_dense_mlp(m, l, N, s->h, out, s);
}

/* s->x (N, C) += in (N, K) @ w^T + b, the projection that ends a sublayer. On one rank with
 * f32 weights and a prompt-sized batch the GEMM adds into x itself (beta 1: neither a pass of
 * its own for the add nor the zeroing of an output); otherwise through s->y, summed over the
 * tensor-parallel ranks first (decode's GEMVs stream into an output they overwrite). */
static dsc_status project_residual(dsc_infer_model *m, const float *in, int64_t N, int64_t K, const dsc_tensor *w,
                                   const dsc_tensor *b, dsc_forward_scratch *s) {
    int64_t C = m->shard.d_model;
    dsc_tensor xv = dsc_model_view2(s->x, N, C);
    b = dsc_model_row_bias(m, b);
    if (!m->tp_comm && w->dtype == DSC_DTYPE_F32 && N > DSC_CPU_STREAM_MAX_ROWS) {
        dsc_tensor iv = dsc_model_view2((float *)in, N, K), wv = dsc_model_view2(w->data, C, K);
        return dsc_kernel_gemm(&xv, &iv, &wv, b, false, true, 1.0f, 1.0f);
    }
    DSC_TRY(project(m, s->y, in, N, K, w, b, 0, C));
    DSC_TRY(dsc_model_tp_allreduce(m, s->y, N));
    dsc_tensor yv = dsc_model_view2(s->y, N, C);
    return dsc_kernel_axpy(&xv, 1.0f, &yv);
}

/* s->x += mlp(s->h). */
static dsc_status mlp_residual(dsc_infer_model *m, int32_t l, int64_t N, dsc_forward_scratch *s) {
    if (dsc_model_is_moe_layer(&m->cfg, l)) {
        DSC_TRY(dsc_model_moe(m, l, N, s->h, s->y, s));
        DSC_TRY(dsc_model_tp_allreduce(m, s->y, N));
        dsc_tensor xv = dsc_model_view2(s->x, N, m->shard.d_model),
                   yv = dsc_model_view2(s->y, N, m->shard.d_model);
        return dsc_kernel_axpy(&xv, 1.0f, &yv);
    }
    DSC_TRY(mlp_hidden(m, l, N, s->h, s));
    return project_residual(m, s->ff1, N, m->shard.d_ff, param(m, l, DSC_PARAM_ROLE_MLP2_W),
                            param(m, l, DSC_PARAM_ROLE_MLP2_B), s);
}

static dsc_status layer_norm(const dsc_infer_model *m, int32_t l, int64_t N, bool mlp_norm, float *out,
                             const float *x) {
    dsc_param_role w = mlp_norm ? DSC_PARAM_ROLE_MLP_NORM_W : DSC_PARAM_ROLE_ATTN_NORM_W;
    dsc_param_role b = mlp_norm ? DSC_PARAM_ROLE_MLP_NORM_B : DSC_PARAM_ROLE_ATTN_NORM_B;
    return norm(m, out, x, N, param(m, l, w), param(m, l, b));
}

/* One block on x (N, C): pre-norm x += attn(norm1(x)); x += mlp(norm2(x));
 * post-norm x = norm1(x + attn(x)); x = norm2(x + mlp(x)); parallel
 * x += attn(norm1(x)) + mlp(norm2(x)). */
static dsc_status block(dsc_infer_model *m, int32_t l, const dsc_ragged_batch *batch, dsc_kv_cache *cache,
                        dsc_forward_scratch *s) {
    const dsc_infer_model_config *mc = &m->cfg;
    int64_t N = batch->n_tokens, C = mc->d_model;
    dsc_tensor xv = dsc_model_view2(s->x, N, C), yv = dsc_model_view2(s->y, N, C);
    if (mc->post_norm)
        memcpy(s->h, s->x, (size_t)(N * C) * sizeof *s->h);
    else
        DSC_TRY(layer_norm(m, l, N, false, s->h, s->x));
    DSC_TRY(attention(m, l, batch, cache, s));
    const dsc_tensor *wo = param(m, l, DSC_PARAM_ROLE_ATTN_OUT_W), *bo = param(m, l, DSC_PARAM_ROLE_ATTN_OUT_B);
    int64_t Q = (int64_t)m->shard.n_head * m->shard.head_size;
    if (mc->parallel_residual) {
        DSC_TRY(project(m, s->y, s->att, N, Q, wo, dsc_model_row_bias(m, bo), 0, C));
        DSC_TRY(layer_norm(m, l, N, true, s->h, s->x));
        DSC_TRY(mlp(m, l, N, s->y2, s));
        dsc_tensor y2 = dsc_model_view2(s->y2, N, C);
        DSC_TRY(dsc_kernel_axpy(&yv, 1.0f, &y2));
        DSC_TRY(dsc_model_tp_allreduce(m, s->y, N));
        return dsc_kernel_axpy(&xv, 1.0f, &yv);
    }
    DSC_TRY(project_residual(m, s->att, N, Q, wo, bo, s));
    /* Post-norm: the normed sum is both the residual and the MLP's input. */
    DSC_TRY(layer_norm(m, l, N, !mc->post_norm, s->h, s->x));
    if (mc->post_norm) memcpy(s->x, s->h, (size_t)(N * C) * sizeof *s->x);
    DSC_TRY(mlp_residual(m, l, N, s));
    if (!mc->post_norm) return NULL;
    DSC_TRY(layer_norm(m, l, N, true, s->h, s->x));
    memcpy(s->x, s->h, (size_t)(N * C) * sizeof *s->x);
    return NULL;
}

static dsc_status forward(dsc_infer_model *m, const dsc_ragged_batch *batch, dsc_kv_cache *cache,
                          dsc_forward_scratch *s, float *logits);

/* The whole forward in the pool scope (kernels/cpu/cpu_pool.h): its GEMMs, GEMVs, attention and
 * RoPE run on the pool, its smaller elementwise passes on this thread, none in OpenMP regions
 * (whose idle threads would spin on the cores the pool's threads need). */
dsc_status dsc_model_forward(dsc_infer_model *m, const dsc_ragged_batch *batch, dsc_kv_cache *cache,
                             dsc_forward_scratch *s, float *logits) {
    bool was = dsc_cpu_pool_set_scope(true);
    dsc_status st = forward(m, batch, cache, s, logits);
    dsc_cpu_pool_set_scope(was);
    return st;
}

static dsc_status forward(dsc_infer_model *m, const dsc_ragged_batch *batch, dsc_kv_cache *cache,
                          dsc_forward_scratch *s, float *logits) {
    const dsc_infer_model_config *mc = &m->cfg;
    int64_t N = batch->n_tokens, S = batch->n_seqs, C = mc->d_model;
    DSC_CHECK(N <= s->max_tokens && S <= s->max_seqs, DSC_ERR_INVALID,
              "batch of %lld tokens / %lld sequences exceeds the scratch (%lld / %lld)", (long long)N,
              (long long)S, (long long)s->max_tokens, (long long)s->max_seqs);
    DSC_TRY(positions(m, batch, s->pos));
    if (dsc_model_rope_dims(mc) > 0) dsc_model_rope_angles(m, s->rope, N, s->pos);
    if (m->first) DSC_TRY(embed(m, batch, s));
    for (int32_t l = m->layer0; l < m->layer1; l++)
        DSC_TRY(block(m, l, batch, cache, s));
    if (!m->last) return NULL; /* s->x goes to the next stage */
    for (int64_t i = 0; i < S; i++)
        memcpy(s->last + i * C, s->x + (int64_t)batch->last_token[i] * C, (size_t)C * sizeof(float));
    int32_t L = mc->n_layer;
    const float *h = s->last; /* (S, C), then (S, P) after project_out */
    if (param(m, L, DSC_PARAM_ROLE_FINAL_NORM_W)) {
        DSC_TRY(norm(m, s->h, s->last, S, param(m, L, DSC_PARAM_ROLE_FINAL_NORM_W),
                     param(m, L, DSC_PARAM_ROLE_FINAL_NORM_B)));
        h = s->h;
    }
    const dsc_tensor *proj_out = param(m, L, DSC_PARAM_ROLE_PROJ_OUT);
    if (proj_out) {
        DSC_TRY(dsc_model_project(s->emb, h, S, proj_out, NULL, 0, proj_out->shape[0]));
        h = s->emb;
    }
    const dsc_tensor *unembed = param(m, L, DSC_PARAM_ROLE_UNEMBED);
    if (!unembed) unembed = param(m, L, DSC_PARAM_ROLE_EMBED);
    return project(m, logits, h, S, proj_out ? proj_out->shape[0] : mc->d_model, unembed, NULL, 0,
                   m->shard.vocab_size);
}
