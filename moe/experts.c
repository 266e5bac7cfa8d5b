/* Expert banks: `count` feed-forward networks of one shape computed as
 * batched GEMMs over a (count, R, M) buffer, one GEMM per projection for the
 * whole bank instead of one small product per expert.
 *
 * A batched GEMM wants each projection of the bank as one (count, rows, cols)
 * tensor, but parameters are separate tensors (one global name per expert).
 * They are declared kind by kind, so when each tensor's size is a multiple of
 * the store's alignment the bank's tensors lie back to back in the flat
 * buffer and the GEMM reads (and accumulates gradients into) them in place;
 * otherwise (small biases, odd widths, or values that ZeRO-2/3 keep
 * elsewhere between calls) the bank packs them into a scratch copy at each
 * call and adds the packed gradient back. Per-expert biases are
 * applied as a rank-1 batched GEMM with a ones vector, since the GEMM's own
 * bias is shared by all batch entries.
 *
 * With expert tensor parallelism a bank holds its rank's piece of every
 * FFN's hidden width (row pieces in, column pieces out, declared as pieces
 * of the global tensors so checkpoints reshard); its output is a partial sum.
 *
 * Not here: which rows belong to which token, the all-reduce of the partial
 * sums over the tensor group (the MoE layer). */
#include <stdio.h>
#include <stdlib.h>

#include "dsc/kernels.h"
#include "dsc/moe.h"

enum { MAX_PROJ = 5 };

/* One projection of every FFN in the bank, e.g. all fc.weight: (count, rows, cols). */
typedef struct proj_bank {
    dsc_param **p; /* [count] */
    int64_t rows, cols;
    bool packed;      /* not back to back in the flat buffer: use the copies below */
    dsc_tensor value; /* (count, rows, cols) packed copy of the values */
    dsc_tensor grad;  /* (count, rows, cols) packed gradient of one call */
} proj_bank;

struct dsc_moe_experts {
    dsc_moe_experts_options o;
    dsc_device device;
    proj_bank w_in, b_in, w_up, w_out, b_out; /* b_in, b_out: GELU only; w_up: SwiGLU only */
    dsc_param **params;                       /* [n_params] in declaration order */
    int n_params;
    int nslots;
    int64_t max_rows;
    dsc_tensor *in;  /* [slots] views of the input the caller keeps */
    dsc_dtype saved; /* the type pre, up and act are kept in (f32; bf16 / f16 under mixed precision) */
    dsc_tensor *pre; /* [slots] (count, R, F): fc output, or SwiGLU gate */
    dsc_tensor *up;  /* [slots] (count, R, F): SwiGLU only */
    dsc_tensor *act; /* [slots] (count, R, F): gelu(pre) or silu(gate) * up */
    /* (count, R, F): dact, dpre, dup; where the slots keep 2 bytes, also where a forward computes act,
     * pre and up and a backward widens act (into dpre), then pre and up (into dpre and dup, which
     * the activation's backward overwrites in place) */
    dsc_tensor scratch[3];
    dsc_tensor ones; /* (count * R) of 1.0: bias GEMMs (GELU only) */
};

static bool gated(const dsc_moe_experts *x) {
    return x->o.kind == DSC_MOE_EXPERT_KIND_SWIGLU;
}

static proj_bank *banks(dsc_moe_experts *x, int i) {
    proj_bank *all[MAX_PROJ] = {&x->w_in, &x->b_in, &x->w_up, &x->w_out, &x->b_out};
    return all[i];
}

/* split_axis: the axis of (rows, cols) (of (cols) for a bias) cut by expert
 * tensor parallelism, -1 when the tensor stays whole. */
static dsc_status declare_bank(dsc_moe_experts *x, proj_bank *b, const char *prefix, const char *leaf,
                               int64_t rows, int64_t cols, bool bias, int split_axis, dsc_param_store *store,
                               float std) {
    const dsc_moe_experts_options *o = &x->o;
    b->rows = rows;
    b->cols = cols;
    b->p = calloc((size_t)o->count, sizeof *b->p);
    DSC_CHECK(b->p, DSC_ERR_NOMEM, "expert bank %s: %d %s tensors", prefix, o->count, leaf);
    for (int e = 0; e < o->count; e++) {
        char name[DSC_PARAM_NAME_MAX];
        int len = o->first < 0 ? snprintf(name, sizeof name, "%s.%s", prefix, leaf)
                               : snprintf(name, sizeof name, "%s.%d.%s", prefix, o->first + e, leaf);
        DSC_CHECK(len > 0 && (size_t)len < sizeof name, DSC_ERR_INVALID,
                  "parameter name %s...%s is longer than %d", prefix, leaf, DSC_PARAM_NAME_MAX - 1);
        const int ndim = bias ? 1 : 2;
        int64_t global[2] = {bias ? cols : rows, cols};
        uint32_t flags = o->flags | (bias ? DSC_PARAM_NO_DECAY : 0);
        const dsc_param_init init = bias ? DSC_INIT_ZEROS : DSC_INIT_NORMAL;
        if (o->ff_global > 0 && split_axis >= 0) {
            global[split_axis] = o->ff_global;
            DSC_TRY(dsc_params_declare_shard(store, name, ndim, global, split_axis, o->ff_start, o->d_ff, flags,
                                             init, bias ? 0.0f : std, &b->p[e]));
        } else {
            DSC_TRY(dsc_params_declare(store, name, ndim, global, flags, init, bias ? 0.0f : std, &b->p[e]));
        }
        x->params[x->n_params++] = b->p[e];
    }
    return NULL;
}

static dsc_status declare(dsc_moe_experts *x, const char *prefix, dsc_param_store *store) {
    const int64_t M = x->o.d_model, F = x->o.d_ff;
    const float std = x->o.init_std, std_out = x->o.init_std_out;
    if (gated(x)) {
        DSC_TRY(declare_bank(x, &x->w_in, prefix, "gate.weight", F, M, false, 0, store, std));
        DSC_TRY(declare_bank(x, &x->w_up, prefix, "up.weight", F, M, false, 0, store, std));
        return declare_bank(x, &x->w_out, prefix, "down.weight", M, F, false, 1, store, std_out);
    }
    DSC_TRY(declare_bank(x, &x->w_in, prefix, "fc.weight", F, M, false, 0, store, std));
    DSC_TRY(declare_bank(x, &x->b_in, prefix, "fc.bias", 1, F, true, 0, store, 0));
    DSC_TRY(declare_bank(x, &x->w_out, prefix, "proj.weight", M, F, false, 1, store, std_out));
    return declare_bank(x, &x->b_out, prefix, "proj.bias", 1, M, true, -1, store, 0);
}

static void release(dsc_moe_experts *x) {
    for (int i = 0; i < MAX_PROJ; i++) {
        dsc_tensor_free(&banks(x, i)->value);
        dsc_tensor_free(&banks(x, i)->grad);
    }
    for (int s = 0; s < x->nslots; s++) {
        dsc_tensor_free(&x->pre[s]);
        if (x->up) dsc_tensor_free(&x->up[s]);
        dsc_tensor_free(&x->act[s]);
    }
    free(x->in);
    free(x->pre);
    free(x->up);
    free(x->act);
    x->in = x->pre = x->up = x->act = NULL;
    for (int i = 0; i < 3; i++)
        dsc_tensor_free(&x->scratch[i]);
    dsc_tensor_free(&x->ones);
    x->nslots = 0;
    x->max_rows = 0;
}

void dsc_moe_experts_destroy(dsc_moe_experts *x) {
    if (!x) return;
    release(x);
    for (int i = 0; i < MAX_PROJ; i++)
        free(banks(x, i)->p);
    free(x->params);
    free(x);
}

dsc_status dsc_moe_experts_create(const dsc_moe_experts_options *o, const char *prefix, dsc_param_store *store,
                                  dsc_device device, dsc_moe_experts **out) {
    *out = NULL;
    DSC_CHECK(o->count >= 1 && o->d_model >= 1 && o->d_ff >= 1, DSC_ERR_INVALID,
              "expert bank %s: needs count, d_model, d_ff >= 1 (got %d, %lld, %lld)", prefix, o->count,
              (long long)o->d_model, (long long)o->d_ff);
    DSC_CHECK(o->kind == DSC_MOE_EXPERT_KIND_GELU || o->kind == DSC_MOE_EXPERT_KIND_SWIGLU, DSC_ERR_INVALID,
              "expert bank %s: unknown expert kind %d", prefix, (int)o->kind);
    DSC_CHECK(o->ff_global == 0 || (o->ff_start >= 0 && o->ff_start + o->d_ff <= o->ff_global), DSC_ERR_INVALID,
              "expert bank %s: hidden columns [%lld, %lld) outside the FFN width %lld", prefix,
              (long long)o->ff_start, (long long)(o->ff_start + o->d_ff), (long long)o->ff_global);
    dsc_moe_experts *x = calloc(1, sizeof *x);
    DSC_CHECK(x, DSC_ERR_NOMEM, "expert bank %s", prefix);
    x->o = *o;
    x->device = device;
    x->params = calloc((size_t)(4 * o->count), sizeof *x->params);
    dsc_status s = x->params ? declare(x, prefix, store) : dsc_error(DSC_ERR_NOMEM, "expert bank %s", prefix);
    if (s) {
        dsc_moe_experts_destroy(x);
        return s;
    }
    *out = x;
    return NULL;
}

int dsc_moe_experts_param_count(const dsc_moe_experts *x) {
    return x->n_params;
}
dsc_param *const *dsc_moe_experts_params(const dsc_moe_experts *x) {
    return x->params;
}

/* True when the bank's tensors lie back to back (values and grads alike). */
static bool contiguous(const proj_bank *b, int count) {
    const int64_t n = b->rows * b->cols;
    for (int e = 1; e < count; e++)
        if ((float *)b->p[e]->value.data != (float *)b->p[0]->value.data + e * n ||
            (float *)b->p[e]->grad.data != (float *)b->p[0]->grad.data + e * n)
            return false;
    return true;
}

static dsc_status reserve_bank(dsc_moe_experts *x, proj_bank *b) {
    if (!b->p) return NULL;
    /* Values released by ZeRO-3 (data NULL until it gathers them around each call, wherever its pool puts
     * them): packed copies, filled at each call. */
    b->packed = !b->p[0]->value.data || !contiguous(b, x->o.count);
    if (!b->packed) return NULL;
    const int64_t shape[3] = {x->o.count, b->rows, b->cols};
    DSC_TRY(dsc_tensor_alloc(&b->value, DSC_DTYPE_F32, 3, shape, x->device, DSC_MEM_PARAMS));
    return dsc_tensor_alloc(&b->grad, DSC_DTYPE_F32, 3, shape, x->device, DSC_MEM_GRADS);
}

static dsc_status alloc_slots(dsc_tensor **bufs, int slots, const int64_t *shape, dsc_device device,
                              dsc_dtype dtype) {
    *bufs = calloc((size_t)slots, sizeof **bufs);
    DSC_CHECK(*bufs, DSC_ERR_NOMEM, "expert activations for %d slots", slots);
    for (int s = 0; s < slots; s++)
        DSC_TRY(dsc_tensor_alloc(&(*bufs)[s], dtype, 3, shape, device, DSC_MEM_ACTIVATIONS));
    return NULL;
}

dsc_dtype dsc_moe_experts_set_saved_dtype(dsc_moe_experts *x, dsc_dtype dtype) {
    const bool narrow = dtype == DSC_DTYPE_BF16 || dtype == DSC_DTYPE_F16;
    return x->saved = narrow && x->device.type == DSC_DEVICE_CPU ? dtype : DSC_DTYPE_F32;
}

static dsc_status reserve(dsc_moe_experts *x, int slots, int64_t rows) {
    for (int i = 0; i < MAX_PROJ; i++)
        DSC_TRY(reserve_bank(x, banks(x, i)));
    const int64_t f_shape[3] = {x->o.count, rows, x->o.d_ff};
    x->nslots = slots;
    x->max_rows = rows;
    x->in = calloc((size_t)slots, sizeof *x->in);
    DSC_CHECK(x->in, DSC_ERR_NOMEM, "expert input views for %d slots", slots);
    DSC_TRY(alloc_slots(&x->pre, slots, f_shape, x->device, x->saved));
    if (gated(x)) DSC_TRY(alloc_slots(&x->up, slots, f_shape, x->device, x->saved));
    DSC_TRY(alloc_slots(&x->act, slots, f_shape, x->device, x->saved));
    for (int i = 0; i < (gated(x) ? 3 : 2); i++)
        DSC_TRY(dsc_tensor_alloc(&x->scratch[i], DSC_DTYPE_F32, 3, f_shape, x->device, DSC_MEM_ACTIVATIONS));
    if (gated(x)) return NULL;
    const int64_t n = x->o.count * rows;
    DSC_TRY(dsc_tensor_alloc(&x->ones, DSC_DTYPE_F32, 1, &n, x->device, DSC_MEM_ACTIVATIONS));
    float *host = malloc((size_t)(n > 0 ? n : 1) * sizeof *host);
    DSC_CHECK(host, DSC_ERR_NOMEM, "ones vector of %lld floats", (long long)n);
    for (int64_t i = 0; i < n; i++)
        host[i] = 1.0f;
    dsc_tensor src = dsc_tensor_view(host, DSC_DTYPE_F32, 1, &n, DSC_CPU);
    dsc_status s = dsc_tensor_copy(&x->ones, &src);
    free(host);
    return s;
}

dsc_status dsc_moe_experts_reserve(dsc_moe_experts *x, int slots, int64_t rows) {
    release(x);
    DSC_CHECK(slots >= 1 && rows >= 0, DSC_ERR_INVALID, "expert bank: reserve needs slots >= 1 and rows >= 0");
    dsc_status s = reserve(x, slots, rows);
    if (s) release(x);
    return s;
}

/* FFNs [first, first + n) of a (count, R, C) tensor. */
typedef struct ffn_range {
    int first, n;
} ffn_range;

static dsc_tensor part_of(const dsc_tensor *t, ffn_range r) {
    const int64_t per = t->shape[1] * t->shape[2];
    return dsc_tensor_view((char *)t->data + (size_t)(r.first * per) * dsc_dtype_size(t->dtype), t->dtype, 3,
                           (int64_t[]){r.n, t->shape[1], t->shape[2]}, t->device);
}

/* The range of a bank's (count, rows, cols) values or gradients that start at `data`. */
static dsc_tensor bank_part(const dsc_moe_experts *x, const proj_bank *b, void *data, ffn_range r) {
    const dsc_tensor whole =
        dsc_tensor_view(data, DSC_DTYPE_F32, 3, (int64_t[]){x->o.count, b->rows, b->cols}, x->device);
    return part_of(&whole, r);
}

/* The range's values as one (n, rows, cols) tensor: the flat buffer itself or a fresh packed copy. */
static dsc_status bank_values(const dsc_moe_experts *x, proj_bank *b, ffn_range r, dsc_tensor *out) {
    if (!b->packed) {
        DSC_CHECK(contiguous(b, x->o.count), DSC_ERR_INVALID,
                  "expert bank %s: parameters moved since reserve; reserve the layer again", b->p[0]->name);
        *out = bank_part(x, b, b->p[0]->value.data, r);
        return NULL;
    }
    const int64_t n = b->rows * b->cols;
    for (int e = r.first; e < r.first + r.n; e++) {
        dsc_tensor dst = dsc_tensor_view((float *)b->value.data + e * n, DSC_DTYPE_F32, 1, &n, x->device);
        dsc_tensor src = dsc_tensor_view(b->p[e]->value.data, DSC_DTYPE_F32, 1, &n, x->device);
        DSC_TRY(dsc_tensor_copy(&dst, &src));
    }
    *out = bank_part(x, b, b->value.data, r);
    return NULL;
}

/* Where a GEMM accumulates the range's gradient: the flat gradient buffer with
 * beta 1, or the packed scratch with beta 0 (added back by bank_grad_end). */
static dsc_tensor bank_grad(const dsc_moe_experts *x, const proj_bank *b, ffn_range r, float *beta) {
    *beta = b->packed ? 0.0f : 1.0f;
    return bank_part(x, b, b->packed ? b->grad.data : b->p[0]->grad.data, r);
}

static dsc_status bank_grad_end(const dsc_moe_experts *x, const proj_bank *b, ffn_range r) {
    if (!b->packed) return NULL;
    const int64_t n = b->rows * b->cols;
    for (int e = r.first; e < r.first + r.n; e++) {
        dsc_tensor piece = dsc_tensor_view((float *)b->grad.data + e * n, DSC_DTYPE_F32, 1, &n, x->device);
        dsc_tensor dst = dsc_tensor_view(b->p[e]->grad.data, DSC_DTYPE_F32, 1, &n, x->device);
        DSC_TRY(dsc_kernel_axpy(&dst, 1.0f, &piece));
    }
    return NULL;
}

/* y (n, R, OC) = x (n, R, IC) @ w^T (+ bias per FFN); w (n, OC, IC), the range r of the bank. */
static dsc_status project(dsc_moe_experts *x, dsc_tensor *y, const dsc_tensor *in, proj_bank *w, proj_bank *bias,
                          ffn_range r) {
    dsc_tensor wv;
    DSC_TRY(bank_values(x, w, r, &wv));
    DSC_TRY(dsc_kernel_gemm(y, in, &wv, NULL, false, true, 1.0f, 0.0f));
    if (!bias) return NULL;
    dsc_tensor bv;
    DSC_TRY(bank_values(x, bias, r, &bv));
    const int64_t R = in->shape[1];
    dsc_tensor ones = dsc_tensor_view(x->ones.data, DSC_DTYPE_F32, 3, (int64_t[]){r.n, R, 1}, x->device);
    return dsc_kernel_gemm(y, &ones, &bv, NULL, false, false, 1.0f, 1.0f); /* y[e] += 1 (R, 1) @ b[e] (1, OC) */
}

/* Gradients of project(): dw (+ dbias) += scale * ..., and din = dy @ w (added when `accumulate`). */
static dsc_status project_backward(dsc_moe_experts *x, dsc_tensor *din, bool accumulate, const dsc_tensor *dy,
                                   const dsc_tensor *in, proj_bank *w, proj_bank *bias, ffn_range r, float scale) {
    float beta;
    dsc_tensor dw = bank_grad(x, w, r, &beta);
    DSC_TRY(dsc_kernel_gemm(&dw, dy, in, NULL, true, false, scale, beta)); /* dw[e] += dy[e]^T @ in[e] */
    DSC_TRY(bank_grad_end(x, w, r));
    if (bias) {
        const int64_t R = in->shape[1];
        dsc_tensor ones = dsc_tensor_view(x->ones.data, DSC_DTYPE_F32, 3, (int64_t[]){r.n, 1, R}, x->device);
        dsc_tensor db = bank_grad(x, bias, r, &beta);
        DSC_TRY(dsc_kernel_gemm(&db, &ones, dy, NULL, false, false, scale, beta)); /* db[e] += 1 (1, R) @ dy[e] */
        DSC_TRY(bank_grad_end(x, bias, r));
    }
    dsc_tensor wv;
    DSC_TRY(bank_values(x, w, r, &wv));
    return dsc_kernel_gemm(din, dy, &wv, NULL, false, false, 1.0f, accumulate ? 1.0f : 0.0f);
}

static dsc_status check_call(const dsc_moe_experts *x, int slot, int first, int n, const dsc_tensor *t,
                             const char *what) {
    DSC_CHECK(slot >= 0 && slot < x->nslots, DSC_ERR_INVALID, "expert bank: slot %d outside the %d reserved", slot,
              x->nslots);
    DSC_CHECK(first >= 0 && n >= 0 && n <= x->o.count - first, DSC_ERR_INVALID,
              "expert bank: FFNs [%d, %d + %d) outside the bank's %d", first, first, n, x->o.count);
    DSC_TRY(dsc_tensor_expect(t, what, DSC_DTYPE_F32, 3, (const int64_t[]){x->o.count, -1, x->o.d_model}));
    DSC_CHECK(t->shape[1] <= x->max_rows, DSC_ERR_INVALID,
              "expert bank: %lld rows per expert exceed the %lld reserved", (long long)t->shape[1],
              (long long)x->max_rows);
    return NULL;
}

/* FFNs r of a slot's (count, R, F) activation buffer. */
static dsc_tensor f_part(const dsc_moe_experts *x, const dsc_tensor *buf, int64_t R, ffn_range r) {
    dsc_tensor whole = dsc_tensor_view(buf->data, buf->dtype, 3, (int64_t[]){x->o.count, R, x->o.d_ff}, x->device);
    return part_of(&whole, r);
}

/* Where a forward computes a slot buffer's part `kept` in f32: itself, or scratch buffer `i`'s part
 * where the slot keeps 2 bytes. */
static dsc_tensor computed_at(const dsc_moe_experts *x, const dsc_tensor *kept, int i, int64_t R, ffn_range r) {
    return kept->dtype == DSC_DTYPE_F32 ? *kept : f_part(x, &x->scratch[i], R, r);
}

/* f32 `value` into the slot's part `kept` where that is 2-byte (rounded); where it is f32 it is value. */
static void keep(dsc_tensor *kept, const dsc_tensor *value) {
    if (kept->dtype != DSC_DTYPE_F32) dsc_activations_convert(kept, value);
}

/* What the slot's part `kept` holds, in f32: itself, or widened into scratch buffer `i`'s part. */
static dsc_tensor widened(const dsc_moe_experts *x, const dsc_tensor *kept, int i, int64_t R, ffn_range r) {
    if (kept->dtype == DSC_DTYPE_F32) return *kept;
    dsc_tensor into = f_part(x, &x->scratch[i], R, r);
    dsc_activations_convert(&into, kept);
    return into;
}

dsc_status dsc_moe_experts_forward_part(dsc_moe_experts *x, int slot, int first, int n, const dsc_tensor *in,
                                        dsc_tensor *out) {
    DSC_TRY(check_call(x, slot, first, n, in, "expert input"));
    DSC_TRY(dsc_tensor_expect(out, "expert output", DSC_DTYPE_F32, 3, in->shape));
    const int64_t R = in->shape[1];
    const ffn_range r = {first, n};
    x->in[slot] = *in;
    if (R == 0 || n == 0) return NULL;
    dsc_tensor xin = part_of(in, r), y = part_of(out, r);
    dsc_tensor pre_kept = f_part(x, &x->pre[slot], R, r), act_kept = f_part(x, &x->act[slot], R, r);
    dsc_tensor pre = computed_at(x, &pre_kept, 1, R, r), act = computed_at(x, &act_kept, 0, R, r);
    DSC_TRY(project(x, &pre, &xin, &x->w_in, x->b_in.p ? &x->b_in : NULL, r));
    dsc_round_to_product_type(&pre); /* what the activation reads, as the dense MLP's */
    if (gated(x)) {
        dsc_tensor up_kept = f_part(x, &x->up[slot], R, r), up = computed_at(x, &up_kept, 2, R, r);
        DSC_TRY(project(x, &up, &xin, &x->w_up, NULL, r));
        dsc_round_to_product_type(&up);
        DSC_TRY(dsc_kernel_swiglu_forward(&act, &pre, &up));
        keep(&up_kept, &up);
    } else {
        DSC_TRY(dsc_kernel_gelu_forward(&act, &pre));
    }
    keep(&pre_kept, &pre);
    keep(&act_kept, &act);
    /* Under expert tensor parallelism the group's sum adds the bias once, from rank 0. */
    const bool out_bias = x->b_out.p && (x->o.ff_global == 0 || x->o.tp_rank == 0);
    return project(x, &y, &act, &x->w_out, out_bias ? &x->b_out : NULL, r);
}

dsc_status dsc_moe_experts_forward(dsc_moe_experts *x, int slot, const dsc_tensor *in, dsc_tensor *out) {
    return dsc_moe_experts_forward_part(x, slot, 0, x->o.count, in, out);
}

dsc_status dsc_moe_experts_backward_part(dsc_moe_experts *x, int slot, int first, int n, const dsc_tensor *dout,
                                         dsc_tensor *din, float grad_scale) {
    DSC_TRY(check_call(x, slot, first, n, dout, "expert output gradient"));
    const dsc_tensor *in = &x->in[slot];
    DSC_CHECK(in->ndim == 3, DSC_ERR_INVALID, "expert bank: backward without a forward on slot %d", slot);
    DSC_TRY(dsc_tensor_expect(dout, "expert output gradient", DSC_DTYPE_F32, 3, in->shape));
    DSC_TRY(dsc_tensor_expect(din, "expert input gradient", DSC_DTYPE_F32, 3, in->shape));
    const int64_t R = in->shape[1];
    const ffn_range r = {first, n};
    if (R == 0 || n == 0) return NULL;
    dsc_tensor xin = part_of(in, r), dy = part_of(dout, r), dx = part_of(din, r);
    const dsc_tensor pre_kept = f_part(x, &x->pre[slot], R, r), act_kept = f_part(x, &x->act[slot], R, r);
    dsc_tensor dact = f_part(x, &x->scratch[0], R, r), dpre = f_part(x, &x->scratch[1], R, r);
    const dsc_tensor act = widened(x, &act_kept, 1, R, r);
    DSC_TRY(project_backward(x, &dact, false, &dy, &act, &x->w_out, x->b_out.p ? &x->b_out : NULL, r, grad_scale));
    const dsc_tensor pre = widened(x, &pre_kept, 1, R, r); /* act is read: dpre is free again */
    if (gated(x)) {
        const dsc_tensor up_kept = f_part(x, &x->up[slot], R, r), up = widened(x, &up_kept, 2, R, r);
        dsc_tensor dup = f_part(x, &x->scratch[2], R, r);
        DSC_TRY(dsc_kernel_swiglu_backward(&dpre, &dup, &dact, &pre, &up));
        DSC_TRY(project_backward(x, &dx, false, &dpre, &xin, &x->w_in, NULL, r, grad_scale));
        return project_backward(x, &dx, true, &dup, &xin, &x->w_up, NULL, r, grad_scale);
    }
    DSC_TRY(dsc_kernel_gelu_backward(&dpre, &dact, &pre));
    return project_backward(x, &dx, false, &dpre, &xin, &x->w_in, &x->b_in, r, grad_scale);
}

dsc_status dsc_moe_experts_backward(dsc_moe_experts *x, int slot, const dsc_tensor *dout, dsc_tensor *din,
                                    float grad_scale) {
    return dsc_moe_experts_backward_part(x, slot, 0, x->o.count, dout, din, grad_scale);
}
