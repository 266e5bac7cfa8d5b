/* The vocabulary-parallel LM head (Megatron-LM's parallel LM logits and
 * vocab_parallel_cross_entropy): the replicated final norm, this rank's
 * logits columns [v0, v0 + nv) from its rows of the head (or tied
 * embedding) weight, and the cross-entropy from three numbers per token
 * summed over the tensor group — the row max (an all-reduce of maxima),
 * then the sum of exponentials and the target's logit (one all-reduce of
 * both) — so a training token's (V) logits row never exists on one rank.
 * Backward: the local softmax minus the local one-hot gives this rank's
 * logits gradient; the input gradient's partial sums are all-reduced once.
 * With sequence parallelism (sequence.c) the input is first gathered along
 * t and the final norm runs on every position (so its gradient is whole on
 * every rank); backward keeps this rank's positions of the input gradient.
 * The head keeps its input whole: one (B, T, C) per micro-batch for the
 * model, where a block's activations are per layer.
 *
 * Without targets (generation) the forward gathers the full (b, t, V)
 * logits on every rank. CPU tensors only. Not here: sampling. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/kernels.h"
#include "tp/tp_internal.h"

typedef struct tp_head {
    dsc_layer base;
    const dsc_tp_build_extra *tp;
    dsc_param *norm_w, *norm_b; /* (C) replicated; norm_b NULL for RMSNorm */
    dsc_param *w;               /* (nv, C) */
    int64_t C, V, NV;
    float eps;
    dsc_device device;
    int slots;
    int64_t (*bt)[2];        /* [slots] (b, t) of the pending forward with targets; b = 0 when none */
    int64_t *n_valid;        /* [slots] targets >= 0 */
    int32_t *targets;        /* (slots, B, T) */
    dsc_tensor *x, *normed;  /* [slots] (B, T, C) */
    dsc_tensor *mean, *rstd; /* [slots] (B*T) norm statistics */
    dsc_tensor *logits;      /* [slots] (B, T, nv); its gradient after backward */
    dsc_tensor *stats;       /* [slots] (3, B*T): row max, sum of exponentials, target logit */
    dsc_tensor *losses;      /* [slots] (B, T) */
    dsc_tensor *din;         /* [slots] (B, T, C); (B, T / tp, C) under sequence parallelism */
    dsc_tensor dnormed;      /* (B, T, C) backward scratch */
    dsc_tensor gathered;     /* (B*T*V) generation only: every rank's logits, rank after rank */
    dsc_tensor full;         /* (B, T, V) generation only */
    tp_seq seq;              /* sequence parallelism's buffers */
} tp_head;

static void release(tp_head *h) {
    free(h->bt);
    free(h->n_valid);
    free(h->targets);
    h->bt = NULL, h->n_valid = NULL, h->targets = NULL;
    dsc_tensor **bufs[] = {&h->x, &h->normed, &h->mean, &h->rstd, &h->logits, &h->stats, &h->losses, &h->din};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        dsc_buffers_free(bufs[i], h->slots);
    dsc_tensor_free(&h->dnormed);
    dsc_tensor_free(&h->gathered);
    dsc_tensor_free(&h->full);
    tp_seq_release(&h->seq);
    h->slots = 0;
}

static dsc_status head_reserve(dsc_layer *self, int slots, int64_t B, int64_t T) {
    tp_head *h = (tp_head *)self;
    release(h);
    h->slots = slots;
    const int64_t c_shape[3] = {B, T, h->C}, N = B * T;
    h->bt = calloc((size_t)slots, sizeof *h->bt);
    h->n_valid = calloc((size_t)slots, sizeof *h->n_valid);
    h->targets = calloc((size_t)(slots * N), sizeof *h->targets);
    dsc_status s =
        h->bt && h->n_valid && h->targets ? NULL : dsc_error(DSC_ERR_NOMEM, "tables of %d slots", slots);
    if (!s) s = dsc_buffers_alloc(&h->x, slots, 3, c_shape, h->device);
    if (!s) s = dsc_buffers_alloc(&h->normed, slots, 3, c_shape, h->device);
    if (!s) s = dsc_buffers_alloc(&h->mean, slots, 1, &N, h->device);
    if (!s) s = dsc_buffers_alloc(&h->rstd, slots, 1, &N, h->device);
    if (!s) s = dsc_buffers_alloc(&h->logits, slots, 3, (int64_t[]){B, T, h->NV}, h->device);
    if (!s) s = dsc_buffers_alloc(&h->stats, slots, 2, (int64_t[]){3, N}, h->device);
    if (!s) s = dsc_buffers_alloc(&h->losses, slots, 2, (int64_t[]){B, T}, h->device);
    if (!s) s = dsc_buffers_alloc(&h->din, slots, 3, (int64_t[]){B, tp_seq_local(h->tp, T), h->C}, h->device);
    if (!s) s = dsc_tensor_alloc(&h->dnormed, DSC_DTYPE_F32, 3, c_shape, h->device, DSC_MEM_ACTIVATIONS);
    if (!s) s = tp_seq_reserve(&h->seq, h->tp, B, T, h->C, h->device);
    if (s) release(h);
    return s;
}

static dsc_status norm_forward(tp_head *h, int slot, const dsc_tensor *x, dsc_tensor *out) {
    const int64_t N = x->shape[0] * x->shape[1], rows[2] = {N, h->C};
    dsc_tensor x2 = tp_view(x, 2, rows), o2 = tp_view(out, 2, rows);
    dsc_tensor mean = tp_view(&h->mean[slot], 1, &N), rstd = tp_view(&h->rstd[slot], 1, &N);
    if (!h->norm_b) return dsc_kernel_rmsnorm_forward(&o2, &rstd, &x2, &h->norm_w->value, h->eps);
    return dsc_kernel_layernorm_forward(&o2, &mean, &rstd, &x2, &h->norm_w->value, &h->norm_b->value, h->eps);
}

static dsc_status norm_backward(tp_head *h, int slot, const dsc_tensor *x, const dsc_tensor *dout,
                                dsc_tensor *dx) {
    const int64_t N = x->shape[0] * x->shape[1], rows[2] = {N, h->C};
    dsc_tensor x2 = tp_view(x, 2, rows), d2 = tp_view(dout, 2, rows), dx2 = tp_view(dx, 2, rows);
    dsc_tensor mean = tp_view(&h->mean[slot], 1, &N), rstd = tp_view(&h->rstd[slot], 1, &N);
    if (!h->norm_b) return dsc_kernel_rmsnorm_backward(&dx2, &h->norm_w->grad, &d2, &x2, &h->norm_w->value, &rstd);
    return dsc_kernel_layernorm_backward(&dx2, &h->norm_w->grad, &h->norm_b->grad, &d2, &x2, &h->norm_w->value,
                                         &mean, &rstd);
}

/* Generation: every rank's (b, t, nv) columns gathered into the full (b, t, V) logits. */
static dsc_status gather_logits(tp_head *h, const dsc_tensor *local, dsc_tensor *out) {
    const int64_t N = local->shape[0] * local->shape[1];
    if (!h->full.data) {
        const int64_t n = h->base.max_B * h->base.max_T;
        DSC_TRY(dsc_tensor_alloc(&h->gathered, DSC_DTYPE_F32, 1, (int64_t[]){n * h->V}, h->device, DSC_MEM_OTHER));
        DSC_TRY(dsc_tensor_alloc(&h->full, DSC_DTYPE_F32, 1, (int64_t[]){n * h->V}, h->device, DSC_MEM_OTHER));
    }
    int64_t counts[64], starts[64];
    DSC_CHECK(h->tp->size <= 64, DSC_ERR_UNSUPPORTED, "generation gathers logits over at most 64 tensor ranks");
    for (int r = 0; r < h->tp->size; r++) {
        int64_t v0, nv;
        DSC_TRY(dsc_tp_split_width(h->V, h->tp->size, h->tp->grain, r, "the vocabulary", &v0, &nv));
        DSC_CHECK(r != h->tp->rank || (v0 == h->tp->shard.v0 && nv == h->NV), DSC_ERR_INTERNAL,
                  "vocabulary split disagrees with the shard");
        starts[r] = v0;
        counts[r] = N * nv;
    }
    dsc_tensor send = tp_view(local, 1, (int64_t[]){N * h->NV});
    dsc_tensor recv = tp_view(&h->gathered, 1, (int64_t[]){N * h->V});
    if (h->tp->size > 1)
        DSC_TRY(dsc_comm_allgather(h->tp->group, &send, &recv, counts));
    else
        memcpy(recv.data, send.data, (size_t)(N * h->V) * sizeof(float));
    const float *g = recv.data;
    float *f = h->full.data;
    for (int r = 0, at = 0; r < h->tp->size; at += (int)counts[r], r++) {
        const int64_t nv = counts[r] / N;
        for (int64_t i = 0; i < N; i++)
            memcpy(f + i * h->V + starts[r], g + at + i * nv, (size_t)nv * sizeof *f);
    }
    *out = tp_view(&h->full, 3, (int64_t[]){local->shape[0], local->shape[1], h->V});
    return NULL;
}

/* Per row: max, sum of exp(logit - max) and the target's logit over the whole vocabulary. */
static dsc_status row_stats(tp_head *h, int slot, int64_t N) {
    const float *l = h->logits[slot].data;
    const int32_t *tgt = h->targets + (size_t)slot * (size_t)(h->base.max_B * h->base.max_T);
    const int64_t nv = h->NV, v0 = h->tp->shard.v0;
    float *mx = h->stats[slot].data, *sum = mx + N, *tl = sum + N;
    for (int64_t i = 0; i < N; i++) {
        float m = -FLT_MAX;
        for (int64_t v = 0; v < nv; v++)
            m = fmaxf(m, l[i * nv + v]);
        mx[i] = m;
    }
    dsc_tensor mt = dsc_tensor_view(mx, DSC_DTYPE_F32, 1, &N, h->device);
    if (h->tp->size > 1) DSC_TRY(dsc_comm_allreduce(h->tp->group, &mt, DSC_REDUCE_OP_MAX));
    for (int64_t i = 0; i < N; i++) {
        double s = 0;
        for (int64_t v = 0; v < nv; v++)
            s += exp((double)(l[i * nv + v] - mx[i]));
        sum[i] = (float)s;
        const int64_t r = (int64_t)tgt[i] - v0;
        tl[i] = tgt[i] >= 0 && r >= 0 && r < nv ? l[i * nv + r] : 0.0f;
    }
    dsc_tensor st = dsc_tensor_view(sum, DSC_DTYPE_F32, 1, (int64_t[]){2 * N}, h->device);
    return tp_allreduce(h->tp, &st);
}

static dsc_status head_forward(dsc_layer *self, int slot, const dsc_tensor *local, dsc_tensor *out,
                               dsc_micro_ctx *ctx) {
    tp_head *h = (tp_head *)self;
    DSC_TRY(dsc_tensor_expect(local, "input", DSC_DTYPE_F32, 3, (const int64_t[]){-1, -1, h->C}));
    dsc_tensor gathered;
    DSC_TRY(tp_seq_gather_input(h->tp, local, &gathered));
    const dsc_tensor *in = &gathered;
    const int64_t b = in->shape[0], t = in->shape[1], N = b * t;
    DSC_CHECK(b <= self->max_B && t <= self->max_T, DSC_ERR_INVALID, "input (%lld, %lld) exceeds the reserve",
              (long long)b, (long long)t);
    h->bt[slot][0] = 0;
    dsc_tensor x = tp_view(&h->x[slot], 3, in->shape), normed = tp_view(&h->normed[slot], 3, in->shape);
    DSC_TRY(dsc_tensor_copy(&x, in));
    DSC_TRY(norm_forward(h, slot, &x, &normed));
    dsc_tensor logits = tp_view(&h->logits[slot], 3, (int64_t[]){b, t, h->NV});
    DSC_TRY(dsc_param_linear_forward(&logits, &normed, h->w, NULL));
    if (!ctx || !ctx->targets) return gather_logits(h, &logits, out);
    DSC_TRY(dsc_tensor_expect(ctx->targets, "targets", DSC_DTYPE_I32, 2, (int64_t[]){b, t}));
    int32_t *tgt = h->targets + (size_t)slot * (size_t)(self->max_B * self->max_T);
    memcpy(tgt, ctx->targets->data, (size_t)N * sizeof *tgt);
    int64_t n_valid = 0;
    for (int64_t i = 0; i < N; i++) {
        DSC_CHECK(tgt[i] < h->V, DSC_ERR_INVALID, "target id %d at (%lld, %lld) is >= vocab_size %lld", tgt[i],
                  (long long)(i / t), (long long)(i % t), (long long)h->V);
        n_valid += tgt[i] >= 0;
    }
    DSC_TRY(row_stats(h, slot, N));
    const float *mx = h->stats[slot].data, *sum = mx + N, *tl = sum + N;
    float *loss = h->losses[slot].data;
    double total = 0;
    for (int64_t i = 0; i < N; i++) {
        loss[i] = tgt[i] >= 0 ? logf(sum[i]) + mx[i] - tl[i] : 0.0f;
        total += loss[i];
    }
    ctx->loss = n_valid ? total / (double)n_valid : 0.0;
    h->n_valid[slot] = n_valid;
    h->bt[slot][0] = b;
    h->bt[slot][1] = t;
    *out = tp_view(&h->losses[slot], 2, (int64_t[]){b, t});
    return NULL;
}

static dsc_status head_backward(dsc_layer *self, int slot, const dsc_tensor *dout, dsc_tensor *din,
                                dsc_micro_ctx *ctx) {
    (void)dout;
    tp_head *h = (tp_head *)self;
    const int64_t b = h->bt[slot][0], t = h->bt[slot][1], N = b * t, nv = h->NV, v0 = h->tp->shard.v0;
    DSC_CHECK(b > 0, DSC_ERR_INVALID, "backward without a pending forward with targets");
    DSC_CHECK(ctx, DSC_ERR_INVALID, "no micro-batch context (loss_scale)");
    const int32_t *tgt = h->targets + (size_t)slot * (size_t)(self->max_B * self->max_T);
    const float *mx = h->stats[slot].data, *sum = mx + N;
    const float dloss = h->n_valid[slot] ? ctx->loss_scale / (float)h->n_valid[slot] : 0.0f;
    float *l = h->logits[slot].data; /* becomes its gradient */
    for (int64_t i = 0; i < N; i++) {
        const int64_t r = (int64_t)tgt[i] - v0;
        for (int64_t v = 0; v < nv; v++) {
            const float p = tgt[i] >= 0 ? expf(l[i * nv + v] - mx[i]) / sum[i] : 0.0f;
            l[i * nv + v] = (p - (v == r ? 1.0f : 0.0f)) * dloss;
        }
    }
    const int64_t shape[3] = {b, t, h->C};
    dsc_tensor dlogits = tp_view(&h->logits[slot], 3, (int64_t[]){b, t, nv});
    dsc_tensor x = tp_view(&h->x[slot], 3, shape), normed = tp_view(&h->normed[slot], 3, shape);
    dsc_tensor dnormed = tp_view(&h->dnormed, 3, shape);
    DSC_TRY(dsc_param_linear_backward(&dnormed, false, h->w, NULL, &dlogits, &normed));
    DSC_TRY(tp_allreduce(h->tp, &dnormed));
    dsc_tensor dx;
    DSC_TRY(tp_seq_partial(h->tp, &h->din[slot], shape, &dx));
    DSC_TRY(norm_backward(h, slot, &x, &dnormed, &dx));
    tp_seq_take(h->tp, &dx, &h->din[slot], din);
    h->bt[slot][0] = 0;
    return NULL;
}

static void head_destroy(dsc_layer *self) {
    release((tp_head *)self);
    free(self);
}

static const dsc_layer_ops head_ops = {.type = "tp_lm_head",
                                       .reserve = head_reserve,
                                       .forward = head_forward,
                                       .backward = head_backward,
                                       .destroy = head_destroy};

/* The dense head's names and initialisation (runtime/nn/head.c); the weight as this rank's vocabulary rows. */
static dsc_status declare(tp_head *h, const dsc_model_config *mc, dsc_param_store *store) {
    tp_param_list list = {.n = 0};
    const uint32_t nd = DSC_PARAM_NO_DECAY;
    const int64_t c[1] = {h->C}, shape[2] = {h->V, h->C}, v0 = h->tp->shard.v0;
    const bool llama = mc->arch == DSC_ARCH_LLAMA || mc->arch == DSC_ARCH_MIXTRAL;
    DSC_TRY(tp_declare(&list, store, "head.norm", "weight", 1, c, -1, 0, 0, nd, DSC_INIT_ONES, 0, &h->norm_w));
    if (!llama)
        DSC_TRY(tp_declare(&list, store, "head.norm", "bias", 1, c, -1, 0, 0, nd, DSC_INIT_ZEROS, 0, &h->norm_b));
    if (mc->tie_embeddings)
        DSC_TRY(tp_declare(&list, store, "embed", "wte.weight", 2, shape, 0, v0, h->NV, DSC_PARAM_TIED,
                           DSC_INIT_NORMAL, mc->init_std, &h->w));
    else
        DSC_TRY(tp_declare(&list, store, "head", "weight", 2, shape, 0, v0, h->NV, 0, DSC_INIT_NORMAL,
                           mc->init_std, &h->w));
    return dsc_layer_set_params(&h->base, list.items, NULL, list.n);
}

dsc_status tp_head_create(const dsc_layer_spec *spec, const dsc_build_ctx *ctx, dsc_layer **out) {
    (void)spec;
    *out = NULL;
    const dsc_tp_build_extra *x;
    DSC_TRY(tp_extra_of(ctx, "tp_lm_head", &x));
    const dsc_model_config *mc = ctx->model;
    tp_head *h = calloc(1, sizeof *h);
    DSC_CHECK(h, DSC_ERR_NOMEM, "lm_head layer");
    h->base.ops = &head_ops;
    snprintf(h->base.name, sizeof h->base.name, "head");
    h->tp = x;
    h->C = mc->d_model;
    h->V = mc->vocab_size;
    h->NV = x->shard.nv;
    h->eps = mc->norm_eps;
    h->device = ctx->device;
    h->base.activation_bytes_per_token =
        (int64_t)sizeof(float) * (3 * h->C + 2 + h->NV + 3 + 1) + (int64_t)sizeof(int32_t);
    dsc_status s = declare(h, mc, ctx->params);
    if (s) {
        dsc_layer_destroy(&h->base);
        return s;
    }
    *out = &h->base;
    return NULL;
}
