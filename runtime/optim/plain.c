/* The plain data-parallel optimizer: every rank holds full parameters,
 * gradients and optimizer state; gradients are averaged over the
 * data-parallel group (dense) or the expert-data-parallel group (experts) in
 * buckets of contiguous elements of the flat gradient buffers.
 *
 * A bucket is reduced as soon as every parameter overlapping it has reported
 * its gradient final through grads_ready (a parameter used by several layers,
 * such as a tied embedding, after the last of them), so reduction starts
 * during backward; reduce_grads reduces whatever is left. The order is the
 * same on every rank because every rank runs the same layers in the same
 * order. Without overlap_comm each bucket's all-reduce blocks there and then
 * (reduction interleaves with backward); with it the all-reduce is posted,
 * every later grads_ready tests the buckets in flight (that is when MPI moves
 * them on) and reduce_grads waits for them, so the reduction runs while the
 * next layers' backward computes. Either way every bucket is reduced by the
 * same algorithm on the same data: the results are bitwise equal.
 *
 * With reduce_dtype bf16 / fp16 (communication_data_type) a bucket is packed
 * into 2-byte values in place, reduced so, and widened back after its wait.
 *
 * Not here: sharding (zero/), learning-rate schedules (engine), and tied
 * gradients across pipeline stages (pipe/). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/kernels.h"
#include "dsc/log.h"
#include "dsc/optimizer.h"
#include "dsc/precision.h"

enum { SECOND_ALIGN = 64 }; /* elements: packed second states start aligned as the store's parameters do */

typedef struct bucket {
    dsc_param_group group;
    int64_t begin, end; /* element range of the group's flat gradient buffer */
    int params;         /* parameters overlapping the range */
    int pending;        /* of those, not yet final in this batch; -1 once reduced or posted */
    bool packed;        /* posted packed in reduce_dtype (overlap_comm): unpacked after the wait */
} bucket;

typedef struct plain_optimizer {
    dsc_optimizer base;
    dsc_optimizer_options o;
    int n_params;
    dsc_tensor
        state[2][DSC_PARAM_GROUP_COUNT]; /* exp_avg, exp_avg_sq (or momentum_buffer, unused): flat like grads */
    int n_state_kinds;                   /* 2 for AdamW, 1 for SGD */
    /* [n_params] where each parameter's second state (exp_avg_sq) sits in state[1][group]: its flat offset, or
     * for Muon, whose matrices keep only a momentum, packed over the rest; -1 for a parameter without one */
    int64_t *second_at;
    int n_second; /* parameters with a second state */
    int64_t step;
    bucket *buckets;
    dsc_comm_request **reqs; /* [n_buckets] overlap_comm: each bucket's all-reduce in flight */
    int n_buckets;
    int *uses;                       /* [n_params] layers reading each parameter */
    int *uses_left;                  /* [n_params] of those, not yet reported in this batch */
    int *first_bucket, *last_bucket; /* [n_params] bucket index range overlapping each parameter */
} plain_optimizer;

static plain_optimizer *self_of(dsc_optimizer *opt) {
    return (plain_optimizer *)opt;
}

static dsc_comm *group_comm(const plain_optimizer *p, dsc_param_group g) {
    return g == DSC_PARAM_GROUP_EXPERT ? p->o.expert_dp : p->o.dp;
}

static int param_index(plain_optimizer *p, const dsc_param *param) {
    for (int i = 0; i < p->n_params; i++)
        if (dsc_params_at(p->o.params, i) == param) return i;
    return -1;
}

static dsc_status bucket_error(const bucket *b, dsc_status s) {
    return dsc_error_wrap(s, "averaging gradients [%lld, %lld) of the %s group", (long long)b->begin,
                          (long long)b->end, b->group == DSC_PARAM_GROUP_EXPERT ? "expert" : "dense");
}

/* Reduces the bucket, or with overlap_comm posts its reduction. */
static dsc_status reduce_bucket(plain_optimizer *p, int k) {
    bucket *b = &p->buckets[k];
    b->pending = -1;
    dsc_comm *c = group_comm(p, b->group);
    if (!c || dsc_comm_size(c) == 1) return NULL;
    dsc_tensor values, grads;
    dsc_params_flat(p->o.params, b->group, &values, &grads);
    int64_t n = b->end - b->begin;
    float *data = (float *)grads.data + b->begin;
    /* communication_data_type bf16 / fp16: reduced packed in place, half the bytes */
    dsc_dtype dt = p->o.reduce_dtype;
    bool narrow = dsc_precision_is_narrow(dt);
    if (narrow) dsc_precision_pack(data, n, dt);
    dsc_tensor piece = dsc_tensor_view(data, narrow ? dt : DSC_DTYPE_F32, 1, &n, grads.device);
    dsc_status s = p->o.overlap_comm ? dsc_comm_iallreduce(c, &piece, DSC_REDUCE_OP_AVG, &p->reqs[k])
                                     : dsc_comm_allreduce(c, &piece, DSC_REDUCE_OP_AVG);
    if (s) return bucket_error(b, s);
    b->packed = narrow && p->o.overlap_comm;
    if (narrow && !p->o.overlap_comm) dsc_precision_unpack(data, data, n, dt);
    return NULL;
}

/* Moves the buckets in flight on (overlap_comm): MPI progresses them only while they are tested. */
static dsc_status progress(plain_optimizer *p) {
    for (int k = 0; k < p->n_buckets; k++) {
        bool done;
        dsc_status s = dsc_comm_test(&p->reqs[k], &done);
        if (s) return bucket_error(&p->buckets[k], s);
    }
    return NULL;
}

static dsc_status plain_progress(dsc_optimizer *opt) {
    return progress(self_of(opt));
}

static void reset_batch(plain_optimizer *p) {
    memcpy(p->uses_left, p->uses, (size_t)p->n_params * sizeof *p->uses);
    for (int i = 0; i < p->n_buckets; i++)
        p->buckets[i].pending = p->buckets[i].params;
}

static dsc_status plain_grads_ready(dsc_optimizer *opt, dsc_layer *layer) {
    plain_optimizer *p = self_of(opt);
    DSC_TRY(progress(p));
    for (int j = 0; j < layer->n_params; j++) {
        int i = param_index(p, layer->params[j]);
        if (i < 0 || --p->uses_left[i] != 0) continue;
        for (int k = p->first_bucket[i]; k <= p->last_bucket[i]; k++)
            if (--p->buckets[k].pending == 0) DSC_TRY(reduce_bucket(p, k));
    }
    return NULL;
}

static dsc_status plain_reduce_grads(dsc_optimizer *opt) {
    plain_optimizer *p = self_of(opt);
    for (int k = 0; k < p->n_buckets; k++)
        if (p->buckets[k].pending >= 0) DSC_TRY(reduce_bucket(p, k));
    /* together: every bucket in flight moves on while any is waited for */
    dsc_status s = dsc_comm_waitall(p->reqs, p->n_buckets);
    if (s) return dsc_error_wrap(s, "averaging gradients over %d buckets", p->n_buckets);
    for (int k = 0; k < p->n_buckets; k++) {
        bucket *b = &p->buckets[k];
        if (!b->packed) continue;
        dsc_tensor grads;
        dsc_params_flat(p->o.params, b->group, NULL, &grads);
        float *data = (float *)grads.data + b->begin;
        dsc_precision_unpack(data, data, b->end - b->begin, p->o.reduce_dtype);
        b->packed = false;
    }
    reset_batch(p);
    return NULL;
}

/* The view of one parameter's slice of a flat state buffer. */
static dsc_tensor state_view(const dsc_tensor *flat, const dsc_param *param) {
    return dsc_tensor_view((float *)flat->data + param->offset, DSC_DTYPE_F32, param->value.ndim,
                           param->value.shape, flat->device);
}

/* Parameter i's second state (it has one). */
static dsc_tensor second_view(const plain_optimizer *p, int i) {
    dsc_param *param = dsc_params_at(p->o.params, i);
    const dsc_tensor *buf = &p->state[1][param->group];
    return dsc_tensor_view((float *)buf->data + p->second_at[i], DSC_DTYPE_F32, param->value.ndim,
                           param->value.shape, buf->device);
}

static dsc_status plain_step(dsc_optimizer *opt, double lr, dsc_optim_stats *stats) {
    plain_optimizer *p = self_of(opt);
    double sq[DSC_PARAM_GROUP_COUNT] = {0, 0};
    for (int i = 0; i < p->n_params; i++) {
        dsc_param *param = dsc_params_at(p->o.params, i);
        if (p->o.counts_in_norm && !p->o.counts_in_norm(param, p->o.counts_in_norm_ctx)) continue;
        double s;
        DSC_TRY(dsc_kernel_sum_squares(&s, &param->grad));
        sq[param->group] += s;
    }
    double norm;
    DSC_TRY(
        dsc_optim_global_norm(sq[DSC_PARAM_GROUP_DENSE], sq[DSC_PARAM_GROUP_EXPERT], p->o.ep, p->o.pipe, &norm));
    DSC_CHECK(isfinite(norm), DSC_ERR_NUMERIC,
              "step %lld: the global gradient norm is %g; stopping with the parameters of step %lld",
              (long long)(p->step + 1), norm, (long long)p->step);

    double coef = dsc_optim_clip_coef(norm, p->o.hparams.clip_norm);
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT && coef < 1.0; g++) {
        dsc_tensor values, grads;
        dsc_params_flat(p->o.params, (dsc_param_group)g, &values, &grads);
        if (dsc_tensor_numel(&grads) > 0) DSC_TRY(dsc_kernel_scale(&grads, (float)coef));
    }
    p->step++;
    for (int i = 0; i < p->n_params; i++) {
        dsc_param *param = dsc_params_at(p->o.params, i);
        dsc_tensor s0 = state_view(&p->state[0][param->group], param);
        dsc_tensor s1 = p->second_at[i] >= 0 ? second_view(p, i) : s0;
        dsc_status s;
        if (p->o.hparams.type == DSC_OPTIMIZER_TYPE_MUON &&
            dsc_optim_muon_needs_tensor_group(param, p->o.tensor)) { /* a slice: assembled over the tensor group */
            int64_t n = dsc_param_numel(param);
            dsc_tensor v = dsc_tensor_view(param->value.data, DSC_DTYPE_F32, 1, &n, param->value.device);
            dsc_tensor g = dsc_tensor_view(param->grad.data, DSC_DTYPE_F32, 1, &n, param->grad.device);
            dsc_tensor m = dsc_tensor_view(s0.data, DSC_DTYPE_F32, 1, &n, s0.device);
            s = dsc_optim_muon_piece(&p->o.hparams, param,
                                     &(dsc_muon_piece){&v, &g, &m, 0, NULL, p->o.tensor, -1, NULL}, (float)lr);
        } else {
            s = dsc_optim_update_param(&p->o.hparams, param, &s0, &s1, (float)lr, p->step);
        }
        if (s) return dsc_error_wrap(s, "step %lld: updating %s", (long long)p->step, param->name);
    }
    DSC_TRY(dsc_params_zero_grads(p->o.params));
    *stats = (dsc_optim_stats){norm, coef, p->step};
    return NULL;
}

/* Entries: every parameter's first state, then the second state of those that have one, then "step". */
static int plain_state_count(const dsc_optimizer *opt) {
    const plain_optimizer *p = (const plain_optimizer *)opt;
    return p->n_params + p->n_second + 1;
}

static void plain_state_at(dsc_optimizer *opt, int index, dsc_optim_state *out) {
    plain_optimizer *p = self_of(opt);
    memset(out, 0, sizeof *out);
    if (index == p->n_params + p->n_second) {
        int64_t one = 1;
        snprintf(out->name, sizeof out->name, "step");
        out->local = dsc_tensor_view(&p->step, DSC_DTYPE_I64, 1, &one, DSC_CPU);
        return;
    }
    int kind = index >= p->n_params, i = index;
    if (kind) /* the (index - n_params)-th parameter with a second state */
        for (int left = index - p->n_params, j = 0; j < p->n_params; j++)
            if (p->second_at[j] >= 0 && left-- == 0) i = j;
    dsc_param *param = dsc_params_at(p->o.params, i);
    const char *kind_name = dsc_optim_state_name(p->o.hparams.type, kind);
    snprintf(out->name, sizeof out->name, "%s/%s", kind_name, param->name);
    out->param = param;
    out->offset = 0;
    out->local = kind ? second_view(p, i) : state_view(&p->state[0][param->group], param);
}

static void plain_destroy(dsc_optimizer *opt) {
    plain_optimizer *p = self_of(opt);
    for (int k = 0; k < 2; k++)
        for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++)
            dsc_tensor_free(&p->state[k][g]);
    free(p->buckets);
    free(p->reqs);
    free(p->uses);
    free(p->uses_left);
    free(p->first_bucket);
    free(p->last_bucket);
    free(p->second_at);
    free(p);
}

static void plain_set_betas(dsc_optimizer *opt, float beta1, float beta2) {
    self_of(opt)->o.hparams.beta1 = beta1;
    self_of(opt)->o.hparams.beta2 = beta2;
}

static const dsc_optimizer_ops plain_ops = {
    .name = "plain",
    .before_layer = NULL,
    .after_layer = NULL,
    .grads_ready = plain_grads_ready,
    .reduce_grads = plain_reduce_grads,
    .step = plain_step,
    .state_count = plain_state_count,
    .state_at = plain_state_at,
    .destroy = plain_destroy,
    .set_betas = plain_set_betas,
    .progress = plain_progress,
};

/* Elements per bucket of a group of `numel` elements: `size`, or the whole
 * group when size <= 0. */
static int64_t bucket_len(int64_t numel, int64_t size) {
    return size > 0 ? size : (numel > 0 ? numel : 1);
}

/* Cuts each group's flat buffer into buckets of at most `size` elements and
 * records which buckets every parameter overlaps. */
static dsc_status make_buckets(plain_optimizer *p, int64_t size) {
    int64_t numel[DSC_PARAM_GROUP_COUNT], per[DSC_PARAM_GROUP_COUNT];
    int count = 0;
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++) {
        numel[g] = dsc_params_numel(p->o.params, (dsc_param_group)g);
        per[g] = bucket_len(numel[g], size);
        count += (int)((numel[g] + per[g] - 1) / per[g]);
    }
    p->buckets = calloc((size_t)(count > 0 ? count : 1), sizeof *p->buckets);
    p->reqs = calloc((size_t)(count > 0 ? count : 1), sizeof *p->reqs);
    DSC_CHECK(p->buckets && p->reqs, DSC_ERR_NOMEM, "plain optimizer: %d buckets", count);
    int first_of_group[DSC_PARAM_GROUP_COUNT];
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++) {
        first_of_group[g] = p->n_buckets;
        for (int64_t b = 0; b < numel[g]; b += per[g])
            p->buckets[p->n_buckets++] =
                (bucket){(dsc_param_group)g, b, b + per[g] < numel[g] ? b + per[g] : numel[g], 0, 0, false};
    }
    for (int i = 0; i < p->n_params; i++) {
        const dsc_param *param = dsc_params_at(p->o.params, i);
        int64_t n = dsc_param_numel(param), len = per[param->group];
        p->first_bucket[i] = first_of_group[param->group] + (int)(param->offset / len);
        /* an empty parameter overlaps no bucket: last < first */
        p->last_bucket[i] =
            n > 0 ? first_of_group[param->group] + (int)((param->offset + n - 1) / len) : p->first_bucket[i] - 1;
        for (int k = p->first_bucket[i]; k <= p->last_bucket[i]; k++)
            p->buckets[k].params++;
    }
    return NULL;
}

static dsc_status setup(plain_optimizer *p) {
    p->n_params = dsc_params_count(p->o.params);
    size_t n = (size_t)(p->n_params > 0 ? p->n_params : 1);
    p->uses = calloc(n, sizeof *p->uses);
    p->uses_left = calloc(n, sizeof *p->uses_left);
    p->first_bucket = calloc(n, sizeof *p->first_bucket);
    p->last_bucket = calloc(n, sizeof *p->last_bucket);
    p->second_at = calloc(n, sizeof *p->second_at);
    DSC_CHECK(p->uses && p->uses_left && p->first_bucket && p->last_bucket && p->second_at, DSC_ERR_NOMEM,
              "plain optimizer: bookkeeping for %d parameters", p->n_params);
    for (int l = 0; l < p->o.n_layers; l++) {
        const dsc_layer *layer = p->o.layers[l];
        for (int j = 0; j < layer->n_params; j++) {
            int i = param_index(p, layer->params[j]);
            DSC_CHECK(i >= 0, DSC_ERR_INVALID,
                      "plain optimizer: layer %s reads %s, which is not in the parameter store", layer->name,
                      layer->params[j]->name);
            p->uses[i]++;
        }
    }
    DSC_CHECK(!dsc_precision_is_narrow(p->o.reduce_dtype) || p->n_params == 0 ||
                  dsc_params_at(p->o.params, 0)->value.device.type == DSC_DEVICE_CPU,
              DSC_ERR_UNSUPPORTED, "plain optimizer: reducing gradients in %s is implemented for host memory only",
              dsc_dtype_name(p->o.reduce_dtype));
    DSC_TRY(make_buckets(p, p->o.reduce_bucket_size));
    p->n_state_kinds = dsc_optim_state_kinds(p->o.hparams.type);
    int64_t second_len[DSC_PARAM_GROUP_COUNT] = {0, 0};
    for (int i = 0; i < p->n_params; i++) {
        const dsc_param *param = dsc_params_at(p->o.params, i);
        p->second_at[i] = -1;
        if (dsc_optim_param_state_kinds(p->o.hparams.type, param) < 2) continue;
        p->n_second++;
        if (p->o.hparams.type != DSC_OPTIMIZER_TYPE_MUON) { /* the flat layout */
            p->second_at[i] = param->offset;
            continue;
        }
        int64_t *len = &second_len[param->group];
        p->second_at[i] = *len;
        *len += (dsc_param_numel(param) + SECOND_ALIGN - 1) / SECOND_ALIGN * SECOND_ALIGN;
    }
    for (int k = 0; k < p->n_state_kinds; k++) {
        for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++) {
            dsc_tensor values, grads;
            dsc_params_flat(p->o.params, (dsc_param_group)g, &values, &grads);
            int64_t len =
                k == 1 && p->o.hparams.type == DSC_OPTIMIZER_TYPE_MUON ? second_len[g] : dsc_tensor_numel(&values);
            DSC_TRY(dsc_tensor_alloc(&p->state[k][g], DSC_DTYPE_F32, 1, &len, values.device, DSC_MEM_OPTIM));
        }
    }
    reset_batch(p);
    return NULL;
}

dsc_status dsc_optimizer_create_plain(const dsc_optimizer_options *opts, dsc_optimizer **out) {
    *out = NULL;
    DSC_CHECK(opts->params, DSC_ERR_INVALID, "plain optimizer: no parameter store");
    plain_optimizer *p = calloc(1, sizeof *p);
    DSC_CHECK(p, DSC_ERR_NOMEM, "plain optimizer: out of memory");
    p->base.ops = &plain_ops;
    p->o = *opts;
    dsc_status s = setup(p);
    if (s) {
        plain_destroy(&p->base);
        return s;
    }
    DSC_LOG_DEBUG("plain optimizer: %d parameters, %d buckets", p->n_params, p->n_buckets);
    *out = &p->base;
    return NULL;
}
