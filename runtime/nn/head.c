/* The LM head, last layer of every model: final norm, the vocabulary
 * projection (its own "head.weight", or the embedding's "embed.wte.weight"
 * when tied), and the fused softmax cross-entropy.
 *
 * Under mixed precision on the CPU (dsc_layer_set_saved_dtype bf16 / fp16)
 * the logits are stored in that type, as a bf16 / fp16 model's are: the
 * product rounds each sum once into them, the cross-entropy reads them
 * widened and writes their gradient rounded in their place, which the
 * backward's products read as the operand they would round it to anyway.
 *
 * The (B, T, V) logits are the largest activation of a model, so one buffer
 * serves all slots: backward recomputes a slot's logits from its saved normed
 * input when another slot's forward has overwritten them (with deterministic
 * kernels the recomputed values are bitwise the same), and the gradient
 * overwrites them in place. Without targets the forward computes logits only
 * (generation). It does not sample or pick last tokens. */
#include <stdio.h>
#include <stdlib.h>

#include "dsc/kernels.h"
#include "dsc/precision.h"
#include "runtime/nn/nn_internal.h"

typedef struct head_slot {
    int64_t b, t;    /* micro-batch of the pending forward; b = 0 when none */
    int64_t n_valid; /* targets >= 0 */
} head_slot;

typedef struct head_layer {
    dsc_layer base;
    nn_norm norm;
    dsc_param *w; /* (V, C) */
    int64_t C, V;
    dsc_device device;
    dsc_dtype saved; /* the type the logits are stored in (f32; bf16 / fp16 under mixed precision) */
    int nslots;
    head_slot *state;        /* [slots] */
    dsc_tensor *x;           /* [slots] (B, T, C) copy of the input */
    dsc_tensor *normed;      /* [slots] (B, T, C) */
    dsc_tensor *din;         /* [slots] (B, T, C) */
    dsc_tensor *losses;      /* [slots] (B, T) per-token loss */
    dsc_tensor *targets;     /* [slots] (B, T) i32 */
    dsc_tensor logits;       /* (B, T, V) shared; holds logits_slot's logits, or its gradient after backward */
    int logits_slot;         /* -1 when the buffer holds no slot's logits */
    int64_t logits_bt[2];    /* (b, t) of those logits */
    dsc_tensor host_targets; /* (B, T) i32 on the CPU, for validation and counting */
    dsc_tensor dnormed;      /* (B, T, C) backward scratch */
} head_layer;

static void free_table(dsc_tensor **t, int n) {
    for (int i = 0; *t && i < n; i++)
        dsc_tensor_free(&(*t)[i]);
    free(*t);
    *t = NULL;
}

static void release(head_layer *h) {
    free(h->state);
    h->state = NULL;
    dsc_buffers_free(&h->x, h->nslots);
    dsc_buffers_free(&h->normed, h->nslots);
    dsc_buffers_free(&h->din, h->nslots);
    dsc_buffers_free(&h->losses, h->nslots);
    free_table(&h->targets, h->nslots);
    dsc_tensor_free(&h->logits);
    dsc_tensor_free(&h->host_targets);
    dsc_tensor_free(&h->dnormed);
    nn_norm_free(&h->norm);
    h->logits_slot = -1;
    h->nslots = 0;
}

static dsc_status head_reserve(dsc_layer *self, int slots, int64_t B, int64_t T) {
    head_layer *h = (head_layer *)self;
    release(h);
    const int64_t c_shape[3] = {B, T, h->C}, bt[2] = {B, T};
    h->nslots = slots;
    h->state = calloc((size_t)slots, sizeof *h->state);
    h->targets = calloc((size_t)slots, sizeof *h->targets);
    dsc_status s = h->state && h->targets ? NULL : dsc_error(DSC_ERR_NOMEM, "slot tables of %d entries", slots);
    for (int i = 0; i < slots && !s; i++)
        s = dsc_tensor_alloc(&h->targets[i], DSC_DTYPE_I32, 2, bt, h->device, DSC_MEM_ACTIVATIONS);
    if (!s) s = dsc_buffers_alloc(&h->x, slots, 3, c_shape, h->device);
    if (!s) s = dsc_buffers_alloc(&h->normed, slots, 3, c_shape, h->device);
    if (!s) s = dsc_buffers_alloc(&h->din, slots, 3, c_shape, h->device);
    if (!s) s = dsc_buffers_alloc(&h->losses, slots, 2, bt, h->device);
    if (!s) s = dsc_tensor_alloc(&h->logits, h->saved, 3, (int64_t[]){B, T, h->V}, h->device, DSC_MEM_ACTIVATIONS);
    if (!s) s = dsc_tensor_alloc(&h->host_targets, DSC_DTYPE_I32, 2, bt, DSC_CPU, DSC_MEM_OTHER);
    if (!s) s = dsc_tensor_alloc(&h->dnormed, DSC_DTYPE_F32, 3, c_shape, h->device, DSC_MEM_ACTIVATIONS);
    if (!s) s = nn_norm_reserve(&h->norm, slots, B, T, h->device);
    if (s) release(h);
    return s;
}

/* logits (b, t, V) = normed @ w^T into the shared buffer, marked as `slot`'s. */
static dsc_status compute_logits(head_layer *h, int slot, const dsc_tensor *normed, dsc_tensor *logits) {
    *logits = nn_view(&h->logits, 3, (int64_t[]){normed->shape[0], normed->shape[1], h->V});
    h->logits_slot = -1;
    DSC_TRY(dsc_param_linear_forward(logits, normed, h->w, NULL));
    dsc_round_to_product_type(logits); /* stored in 2 bytes, they are rounded already */
    h->logits_slot = slot;
    h->logits_bt[0] = normed->shape[0];
    h->logits_bt[1] = normed->shape[1];
    return NULL;
}

/* Copies the targets to the CPU to check them against V and count the valid ones. */
static dsc_status load_targets(head_layer *h, int slot, const dsc_tensor *targets, int64_t b, int64_t t) {
    DSC_TRY(dsc_tensor_expect(targets, "targets", DSC_DTYPE_I32, 2, (int64_t[]){b, t}));
    dsc_tensor host = nn_view(&h->host_targets, 2, targets->shape);
    DSC_TRY(dsc_tensor_copy(&host, targets));
    const int32_t *ids = host.data;
    int64_t n_valid = 0;
    for (int64_t i = 0; i < b * t; i++) {
        DSC_CHECK(ids[i] < h->V, DSC_ERR_INVALID, "target id %d at (%lld, %lld) is >= vocab_size %lld", ids[i],
                  (long long)(i / t), (long long)(i % t), (long long)h->V);
        n_valid += ids[i] >= 0;
    }
    dsc_tensor dev = nn_view(&h->targets[slot], 2, targets->shape);
    DSC_TRY(dsc_tensor_copy(&dev, &host));
    h->state[slot].n_valid = n_valid;
    return NULL;
}

static dsc_status head_forward(dsc_layer *self, int slot, const dsc_tensor *in, dsc_tensor *out,
                               dsc_micro_ctx *ctx) {
    head_layer *h = (head_layer *)self;
    DSC_TRY(nn_check_input(self, in, h->C));
    const int64_t b = in->shape[0], t = in->shape[1];
    head_slot *st = &h->state[slot];
    st->b = 0;
    const bool has_targets = ctx && ctx->targets;
    if (has_targets) DSC_TRY(load_targets(h, slot, ctx->targets, b, t));
    dsc_tensor x = nn_view(&h->x[slot], 3, in->shape), normed = nn_view(&h->normed[slot], 3, in->shape);
    DSC_TRY(dsc_tensor_copy(&x, in));
    DSC_TRY(nn_norm_forward(&h->norm, slot, &x, &normed));
    dsc_tensor logits;
    DSC_TRY(compute_logits(h, slot, &normed, &logits));
    if (!has_targets) {
        *out = logits; /* no pending backward: st->b stays 0 */
        return NULL;
    }
    dsc_tensor losses = nn_view(&h->losses[slot], 1, (int64_t[]){b * t});
    dsc_tensor logits2 = nn_rows(&logits), targets = nn_view(&h->targets[slot], 1, (int64_t[]){b * t});
    DSC_TRY(dsc_kernel_cross_entropy_forward(&losses, &logits2, &targets));
    double sum = 0;
    DSC_TRY(dsc_kernel_sum(&sum, &losses));
    /* Mean over the tokens that count; a micro-batch with none contributes 0. */
    ctx->loss = st->n_valid ? sum / (double)st->n_valid : 0.0;
    st->b = b;
    st->t = t;
    *out = nn_view(&h->losses[slot], 2, (int64_t[]){b, t});
    return NULL;
}

static dsc_status head_backward(dsc_layer *self, int slot, const dsc_tensor *dout, dsc_tensor *din,
                                dsc_micro_ctx *ctx) {
    (void)dout;
    head_layer *h = (head_layer *)self;
    head_slot *st = &h->state[slot];
    DSC_CHECK(st->b > 0, DSC_ERR_INVALID,
              "backward without a pending forward with targets (a forward without targets computes logits only)");
    DSC_CHECK(ctx, DSC_ERR_INVALID, "no micro-batch context (loss_scale)");
    const int64_t shape[3] = {st->b, st->t, h->C}, N = st->b * st->t;
    dsc_tensor x = nn_view(&h->x[slot], 3, shape), normed = nn_view(&h->normed[slot], 3, shape);
    dsc_tensor logits = nn_view(&h->logits, 3, (int64_t[]){st->b, st->t, h->V});
    if (h->logits_slot != slot) DSC_TRY(compute_logits(h, slot, &normed, &logits));
    h->logits_slot = -1; /* the gradient overwrites the logits */
    dsc_tensor dlogits = nn_rows(&logits), targets = nn_view(&h->targets[slot], 1, (int64_t[]){N});
    const float dloss = st->n_valid ? ctx->loss_scale / (float)st->n_valid : 0.0f;
    DSC_TRY(dsc_kernel_cross_entropy_backward(&dlogits, &dlogits, &targets, dloss));
    dsc_tensor dnormed = nn_view(&h->dnormed, 3, shape), dx = nn_view(&h->din[slot], 3, shape);
    DSC_TRY(dsc_param_linear_backward(&dnormed, false, h->w, NULL, &logits, &normed));
    DSC_TRY(nn_norm_backward(&h->norm, slot, &x, &dnormed, &dx));
    st->b = 0;
    *din = dx;
    return NULL;
}

static void head_destroy(dsc_layer *self) {
    release((head_layer *)self);
    free(self);
}

static void head_set_saved_dtype(dsc_layer *self, dsc_dtype dtype) {
    head_layer *h = (head_layer *)self;
    h->saved = nn_saved_dtype(dtype, h->device);
}

static const dsc_layer_ops head_ops = {.type = "lm_head",
                                       .reserve = head_reserve,
                                       .forward = head_forward,
                                       .backward = head_backward,
                                       .destroy = head_destroy,
                                       .set_saved_dtype = head_set_saved_dtype};

dsc_status dsc_head_logits(dsc_layer *head, int slot, dsc_tensor *logits) {
    DSC_CHECK(head && head->ops == &head_ops, DSC_ERR_INVALID, "layer %s is not an lm_head",
              head ? head->name : "(null)");
    head_layer *h = (head_layer *)head;
    DSC_CHECK(slot >= 0 && slot < h->nslots, DSC_ERR_INVALID, "layer %s: slot %d outside [0, %d)", head->name,
              slot, h->nslots);
    DSC_CHECK(
        h->logits_slot == slot, DSC_ERR_INVALID,
        "layer %s: the logits of slot %d are gone (backward ran or another slot's forward reused the buffer)",
        head->name, slot);
    *logits = nn_view(&h->logits, 3, (int64_t[]){h->logits_bt[0], h->logits_bt[1], h->V});
    return NULL;
}

dsc_status dsc_logits_row(const dsc_tensor *logits, int64_t row, float *out) {
    const int64_t V = logits->ndim ? logits->shape[logits->ndim - 1] : 0,
                  rows = V ? dsc_tensor_numel(logits) / V : 0;
    DSC_CHECK(logits->dtype == DSC_DTYPE_F32 || logits->dtype == DSC_DTYPE_BF16 || logits->dtype == DSC_DTYPE_F16,
              DSC_ERR_INVALID, "logits of dtype %s (f32, bf16 or f16 expected)", dsc_dtype_name(logits->dtype));
    DSC_CHECK(row >= 0 && row < rows, DSC_ERR_INVALID, "logits row %lld outside [0, %lld)", (long long)row,
              (long long)rows);
    const size_t size = dsc_dtype_size(logits->dtype);
    const void *at = (const char *)logits->data + (size_t)(row * V) * size;
    if (logits->dtype != DSC_DTYPE_F32) { /* 2-byte: the CPU's */
        dsc_precision_unpack(out, at, V, logits->dtype);
        return NULL;
    }
    dsc_tensor src = dsc_tensor_view((void *)at, DSC_DTYPE_F32, 1, &V, logits->device),
               dst = dsc_tensor_view(out, DSC_DTYPE_F32, 1, &V, DSC_CPU);
    return dsc_tensor_copy(&dst, &src);
}

dsc_status nn_head_create(const dsc_layer_spec *spec, const dsc_build_ctx *ctx, dsc_layer **out) {
    (void)spec;
    *out = NULL;
    const dsc_model_config *mc = ctx->model;
    head_layer *h = calloc(1, sizeof *h);
    DSC_CHECK(h, DSC_ERR_NOMEM, "lm_head layer");
    h->base.ops = &head_ops;
    snprintf(h->base.name, sizeof h->base.name, "head");
    h->C = mc->d_model;
    h->V = mc->vocab_size;
    h->device = ctx->device;
    h->logits_slot = -1;
    h->saved = DSC_DTYPE_F32;
    nn_param_list list = {.n = 0};
    const int64_t shape[2] = {h->V, h->C};
    dsc_status s = nn_norm_init(&h->norm, &list, ctx->params, "head.norm", mc);
    /* tied or not: the head reads it only in products, and its gradient comes from the linear backward */
    const uint32_t w = DSC_PARAM_USE_ROUNDED_BY_KERNELS | DSC_PARAM_USE_GRAD_ROUNDED_BY_KERNELS;
    if (!s && mc->tie_embeddings)
        s = nn_declare_used(&list, ctx->params, "embed", "wte.weight", 2, shape, DSC_PARAM_TIED, w,
                            DSC_INIT_NORMAL, mc->init_std, &h->w);
    else if (!s)
        s = nn_declare_used(&list, ctx->params, "head", "weight", 2, shape, 0, w, DSC_INIT_NORMAL, mc->init_std,
                            &h->w);
    if (!s) s = nn_set_params(&h->base, &list);
    if (s) {
        dsc_layer_destroy(&h->base);
        return s;
    }
    h->base.activation_bytes_per_token =
        (int64_t)sizeof(float) * (3 * h->C + nn_norm_saved_floats_per_token(&h->norm) + 1) +
        (int64_t)sizeof(int32_t);
    *out = &h->base;
    return NULL;
}
