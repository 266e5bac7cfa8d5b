/* The mixed-precision optimizer: DeepSpeed's FP16_Optimizer / BF16_Optimizer
 * (and ZeRO's fp16 handling) as a wrapper around any dsc optimizer.
 *
 * Per step:
 *  - backward: a layer's contribution to a gradient (the scaled loss's: the
 *    runners seed the backward with the loss scale,
 *    dsc_precision_micro_loss_scale) is rounded to the reduced type, then
 *    added to the gradients the inner optimizer accumulates: f32
 *    accumulation of reduced-type contributions, DeepSpeed's default for
 *    bf16; data_types.grad_accum_dtype "fp32". The products' weight and bias
 *    gradients and the embedding's are rounded so by their kernels
 *    (dsc_kernels_set_grad_dtype, DSC_PARAM_USE_GRAD_ROUNDED_BY_KERNELS);
 *    for the others (norms, the MoE and tensor-parallel layers), the
 *    gradient views point into a zeroed scratch of one layer's size during
 *    its backward, and the contribution is rounded from there (with the
 *    plain optimizer, a first contribution after the step zeroed them is
 *    rounded where it landed instead);
 *  - reduction: the inner optimizer's, in communication_data_type;
 *  - step: overflow = an inf/nan in this rank's gradients, agreed by a MAX
 *    all-reduce over the groups that share the model (data, pipeline,
 *    expert); an overflow skips the step (gradients zeroed, parameters and
 *    optimizer state untouched, the loss scaler updated and the skip logged).
 *    Otherwise the gradients are unscaled and the inner optimizer steps
 *    (clipping included) on the fp32 master.
 *
 * Where the master lives:
 *  - the plain optimizer: the store's values are the master; each layer call
 *    reads them rounded to the reduced type from a scratch of one layer's
 *    size, so the working parameters take no second copy of the model (4
 *    bytes a parameter for both, where a rounded copy beside the master took
 *    8). A layer reads as they are the weights it uses only in products
 *    (DSC_PARAM_USE_ROUNDED_BY_KERNELS: the bf16 / fp16 products round their
 *    operands, to the same values) and, in its backward, those its backward
 *    does not read (DSC_PARAM_USE_FORWARD_ONLY);
 *  - ZeRO-1/2: the rank's range of the values, copied in for the step and
 *    out after it; the store's values are the rounded working copy (the
 *    other ranks' shares arrive rounded);
 *  - ZeRO-3: the inner optimizer's f32 parameter shards; the values gathered
 *    for each layer call are rounded there.
 * Checkpoints save it as optimizer state "master/<param>" beside the model
 * values, and the loss scaler as "loss_scale" and "loss_scaler". */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/kernels.h"
#include "dsc/log.h"
#include "dsc/precision.h"

typedef struct master_piece {
    dsc_param *param;
    int64_t offset; /* element offset inside the parameter */
    int64_t pos;    /* element offset inside the group's master */
    int64_t numel;
} master_piece;

/* One layer's parameter tensors (its values or its gradients) pointed into a scratch of one layer's
 * size, and the views they had, put back after the call. */
typedef struct layer_views {
    dsc_tensor scratch;
    dsc_tensor *saved;
    bool *swapped;
    const dsc_layer *layer; /* whose views are out, or NULL */
    bool grads;
} layer_views;

typedef struct mixed_optimizer {
    dsc_optimizer base;
    dsc_optimizer *inner;
    dsc_precision_options po;
    dsc_optimizer_options oo;
    dsc_tensor master[DSC_PARAM_GROUP_COUNT]; /* ZeRO-1/2: f32 [end - begin) of each group's range */
    master_piece *pieces;
    int n_pieces;
    dsc_loss_scaler scaler;
    int64_t skipped;
    bool last_skipped;
    /* checkpoint view of the scaler: "loss_scale" (f32) and "loss_scaler" (i64: iteration, last overflow,
     * hysteresis, skipped steps); a restore writes them, the next hook reads them back */
    float ck_scale;
    int64_t ck_counts[4];
    bool ck_handed;
    int64_t inner_steps;
    double last_scale;
    /* the layer whose backward runs now: its gradient views point into a zeroed scratch, but for
     * the parameters whose gradients it writes first (in_place) */
    layer_views grads;
    bool *in_place;
    /* the plain optimizer: per layer of oo.layers, whether its backward has not run since the
     * gradients were last zeroed (a step, a skipped step) */
    bool *untouched;
    int max_params; /* the most parameters a layer has */
    /* ZeRO-3: the inner optimizer's parameter shards are the fp32 master; the values a layer reads are
     * gathered for each call and rounded then */
    bool round_on_use;
    /* the plain optimizer: the layer being called reads its values rounded from a scratch */
    layer_views values;
    /* the calling thread's product and gradient types outside a layer call (inside: the reduced type) */
    dsc_dtype matmul_was, grad_was;
} mixed_optimizer;

static mixed_optimizer *self_of(dsc_optimizer *opt) {
    return (mixed_optimizer *)opt;
}

static const dsc_optimizer_ops mixed_ops;

/* After the checkpoint view was handed out (a save or a restore), the scaler takes its values. */
static void sync_scaler(mixed_optimizer *m) {
    if (!m->ck_handed) return;
    m->scaler.cur_scale = m->ck_scale;
    m->scaler.cur_iter = m->ck_counts[0];
    m->scaler.last_overflow_iter = m->ck_counts[1];
    m->scaler.cur_hysteresis = (int)m->ck_counts[2];
    m->skipped = m->ck_counts[3];
    m->ck_handed = false;
}

static bool seen_before(const dsc_layer *layer, int j) {
    for (int k = 0; k < j; k++)
        if (layer->params[k] == layer->params[j]) return true;
    return false;
}

static dsc_tensor *viewed(const layer_views *v, dsc_param *p) {
    return v->grads ? &p->grad : &p->value;
}

static dsc_status views_reserve(layer_views *v, bool grads, int64_t numel, int max_params, dsc_mem_category kind) {
    v->grads = grads;
    DSC_TRY(dsc_tensor_alloc(&v->scratch, DSC_DTYPE_F32, 1, &numel, DSC_CPU, kind));
    v->saved = calloc((size_t)max_params, sizeof *v->saved);
    v->swapped = calloc((size_t)max_params, sizeof *v->swapped);
    DSC_CHECK(v->saved && v->swapped, DSC_ERR_NOMEM, "mixed precision: %d %s views", max_params,
              grads ? "gradient" : "value");
    return NULL;
}

static void views_free(layer_views *v) {
    dsc_tensor_free(&v->scratch);
    free(v->saved);
    free(v->swapped);
}

/* Starts a layer's views: none out yet. */
static float *views_begin(layer_views *v, const dsc_layer *layer) {
    for (int j = 0; j < layer->n_params; j++)
        v->swapped[j] = false;
    v->layer = layer;
    return v->scratch.data;
}

/* Points parameter j's tensor at `at`; returns where the next one goes. */
static float *view_out(layer_views *v, int j, float *at) {
    dsc_param *p = v->layer->params[j];
    dsc_tensor *t = viewed(v, p);
    v->saved[j] = *t;
    *t = dsc_tensor_view(at, DSC_DTYPE_F32, t->ndim, t->shape, t->device);
    v->swapped[j] = true;
    return at + dsc_param_numel(p);
}

/* The views back (a no-op when none are out). */
static void views_put_back(layer_views *v) {
    for (int j = 0; v->layer && j < v->layer->n_params; j++)
        if (v->swapped[j]) *viewed(v, v->layer->params[j]) = v->saved[j];
    v->layer = NULL;
}

/* Whether the call reads parameter j's master as it is: the layer's bf16 / fp16 products round it
 * (the kernels multiply in the reduced type), or its backward does not read it at all; every use of
 * it in the layer must say so. */
static bool read_as_is(const dsc_layer *layer, int j, bool backward) {
    uint32_t as_is = DSC_PARAM_USE_ROUNDED_BY_KERNELS | (backward ? DSC_PARAM_USE_FORWARD_ONLY : 0);
    for (int k = 0; k < layer->n_params; k++)
        if (layer->params[k] == layer->params[j] && !(layer->param_uses[k] & as_is)) return false;
    return true;
}

/* The layer reads the master rounded: each parameter's value view points into the values' scratch
 * (but those it reads as they are). */
static void read_rounded(mixed_optimizer *m, dsc_layer *layer, bool backward) {
    float *at = views_begin(&m->values, layer);
    for (int j = 0; j < layer->n_params; j++) {
        dsc_param *p = layer->params[j];
        if (seen_before(layer, j) || !p->value.data || read_as_is(layer, j, backward)) continue;
        dsc_round_to_dtype_from(at, p->value.data, dsc_param_numel(p), m->po.dtype);
        at = view_out(&m->values, j, at);
    }
}

/* Whether the layer's kernels round what they add to parameter j's gradient (every use says so):
 * its contribution needs no scratch. */
static bool grad_rounded_by_kernels(const dsc_layer *layer, int j) {
    for (int k = 0; k < layer->n_params; k++)
        if (layer->params[k] == layer->params[j] &&
            !(layer->param_uses[k] & DSC_PARAM_USE_GRAD_ROUNDED_BY_KERNELS))
            return false;
    return true;
}

static int layer_index(const mixed_optimizer *m, const dsc_layer *layer) {
    for (int l = 0; l < m->oo.n_layers; l++)
        if (m->oo.layers[l] == layer) return l;
    return -1;
}

/* Whether no layer that reads the parameter ran its backward since the gradients were zeroed: this
 * backward's contribution to it is the first, and is rounded where it lands, without the scratch
 * (zeroed, then added from). A tied weight's first contribution is the later layer's. */
static bool grads_untouched(const mixed_optimizer *m, const dsc_param *p) {
    for (int o = 0; o < m->oo.n_layers; o++)
        for (int j = 0; j < m->oo.layers[o]->n_params; j++)
            if (m->oo.layers[o]->params[j] == p && !m->untouched[o]) return false;
    return true;
}

static void all_untouched(mixed_optimizer *m) {
    for (int l = 0; m->untouched && l < m->oo.n_layers; l++)
        m->untouched[l] = true;
}

static dsc_status mixed_before_layer(dsc_optimizer *opt, dsc_layer *layer, bool backward) {
    mixed_optimizer *m = self_of(opt);
    sync_scaler(m);
    views_put_back(&m->values);
    views_put_back(&m->grads); /* a failed backward's, its contribution dropped */
    DSC_TRY(dsc_optimizer_before_layer(m->inner, layer, backward));
    DSC_CHECK(layer->n_params <= m->max_params, DSC_ERR_INVALID,
              "mixed precision: layer %s has %d parameters, more than the layers given to the optimizer",
              layer->name, layer->n_params);
    /* bf16 / fp16 products in the layer's GEMMs, as autocast and a GPU's fp16 GEMM multiply */
    m->matmul_was = dsc_kernels_set_matmul_dtype(m->po.dtype);
    m->grad_was = dsc_kernels_set_grad_dtype(m->po.dtype);
    for (int j = 0; m->round_on_use && j < layer->n_params; j++) {
        dsc_param *p = layer->params[j];
        if (p->value.data) dsc_round_to_dtype(p->value.data, dsc_param_numel(p), m->po.dtype);
    }
    if (m->po.whole) read_rounded(m, layer, backward);
    if (!backward) return NULL;
    const int l = layer_index(m, layer);
    float *at = views_begin(&m->grads, layer);
    for (int j = 0; j < layer->n_params; j++) {
        dsc_param *p = layer->params[j];
        m->in_place[j] = false;
        if (seen_before(layer, j) || !p->grad.data || grad_rounded_by_kernels(layer, j)) continue;
        m->in_place[j] = l >= 0 && m->untouched && m->untouched[l] && grads_untouched(m, p);
        if (m->in_place[j]) continue;
        at = view_out(&m->grads, j, at);
        DSC_TRY(dsc_kernel_zero(&p->grad));
    }
    if (l >= 0 && m->untouched) m->untouched[l] = false;
    return NULL;
}

static dsc_status mixed_after_layer(dsc_optimizer *opt, dsc_layer *layer, bool backward) {
    mixed_optimizer *m = self_of(opt);
    dsc_kernels_set_matmul_dtype(m->matmul_was);
    dsc_kernels_set_grad_dtype(m->grad_was);
    views_put_back(&m->values);
    if (backward && m->grads.layer == layer) {
        for (int j = 0; j < layer->n_params; j++) {
            const dsc_tensor *part = &layer->params[j]->grad;
            if (m->in_place[j])
                dsc_round_to_dtype(part->data, dsc_tensor_numel(part), m->po.dtype);
            else if (m->grads.swapped[j])
                dsc_precision_add_rounded(m->grads.saved[j].data, part->data, dsc_tensor_numel(part), m->po.dtype);
        }
        views_put_back(&m->grads);
    }
    return dsc_optimizer_after_layer(m->inner, layer, backward);
}

static dsc_status mixed_grads_ready(dsc_optimizer *opt, dsc_layer *layer) {
    return dsc_optimizer_grads_ready(self_of(opt)->inner, layer);
}

static dsc_status mixed_reduce_grads(dsc_optimizer *opt) {
    return dsc_optimizer_reduce_grads(self_of(opt)->inner);
}

static float *group_values(mixed_optimizer *m, int g, int64_t *numel) {
    dsc_tensor values;
    dsc_params_flat(m->oo.params, (dsc_param_group)g, &values, NULL);
    *numel = dsc_tensor_numel(&values);
    return values.data;
}

/* Whether any rank sharing the model saw an inf / nan gradient. */
static dsc_status agree_overflow(mixed_optimizer *m, bool *overflow) {
    float flag = 0;
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++) {
        const dsc_tensor *t = &m->po.ranges[g].grads;
        if (!t->data || dsc_tensor_numel(t) == 0) continue;
        bool finite = true;
        DSC_TRY(dsc_kernel_all_finite(&finite, t));
        if (!finite) flag = 1;
    }
    dsc_comm *groups[4] = {m->oo.dp, m->oo.expert_dp, m->oo.ep, m->oo.pipe};
    for (int i = 0; i < 4; i++) {
        if (!groups[i] || dsc_comm_size(groups[i]) == 1) continue;
        int64_t one = 1;
        dsc_tensor t = dsc_tensor_view(&flag, DSC_DTYPE_F32, 1, &one, DSC_CPU);
        DSC_TRY(dsc_comm_allreduce(groups[i], &t, DSC_REDUCE_OP_MAX));
    }
    *overflow = flag > 0;
    return NULL;
}

static dsc_status skip_step(mixed_optimizer *m, dsc_optim_stats *stats) {
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++)
        if (m->po.ranges[g].grads.data && dsc_tensor_numel(&m->po.ranges[g].grads) > 0)
            DSC_TRY(dsc_kernel_zero(&m->po.ranges[g].grads));
    DSC_TRY(dsc_params_zero_grads(m->oo.params));
    char msg[200];
    double attempted = m->scaler.cur_scale;
    DSC_TRY(dsc_loss_scaler_update(&m->scaler, true, msg, sizeof msg));
    m->skipped++;
    all_untouched(m);
    if (m->po.log) dsc_log_rank0(DSC_LOG_WARN, "%s: %s", m->po.dtype == DSC_DTYPE_F16 ? "fp16" : "bf16", msg);
    *stats = (dsc_optim_stats){.grad_norm = 0, .clip_coef = 1, .step = m->inner_steps};
    m->last_skipped = true;
    m->last_scale = attempted;
    return NULL;
}

static dsc_status copy_range(float *dst, const float *src, int64_t n) {
    if (n > 0) memcpy(dst, src, (size_t)n * sizeof *dst);
    return NULL;
}

/* The inner optimizer steps on the values of its ranges: the master put there, stepped, taken back,
 * and rounded again (ZeRO-1/2, whose step also gathers the other ranks' shares there). */
static dsc_status step_on_copy(mixed_optimizer *m, double lr, dsc_optim_stats *stats) {
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++) {
        const dsc_precision_range *r = &m->po.ranges[g];
        int64_t n;
        float *values = group_values(m, g, &n);
        if (values) copy_range(values + r->begin, m->master[g].data, r->end - r->begin);
    }
    DSC_TRY(dsc_optimizer_step(m->inner, lr, stats));
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++) {
        const dsc_precision_range *r = &m->po.ranges[g];
        int64_t n;
        float *values = group_values(m, g, &n);
        if (!values) continue;
        copy_range(m->master[g].data, values + r->begin, r->end - r->begin);
        /* the other ranks' shares arrived in the 2-byte type (ZeRO gathers in the parameters' dtype) */
        dsc_round_to_dtype(values + r->begin, r->end - r->begin, m->po.dtype);
    }
    return NULL;
}

static dsc_status mixed_step(dsc_optimizer *opt, double lr, dsc_optim_stats *stats) {
    mixed_optimizer *m = self_of(opt);
    sync_scaler(m);
    bool overflow = false;
    if (m->po.check_overflow) DSC_TRY(agree_overflow(m, &overflow));
    if (overflow) return skip_step(m, stats);
    double scale = m->scaler.cur_scale;
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++) {
        dsc_precision_range *r = &m->po.ranges[g];
        if (scale != 1.0 && r->grads.data && dsc_tensor_numel(&r->grads) > 0)
            DSC_TRY(dsc_kernel_scale(&r->grads, (float)(1.0 / scale)));
    }
    views_put_back(&m->values);
    views_put_back(&m->grads);
    DSC_TRY(m->po.whole ? dsc_optimizer_step(m->inner, lr, stats) : step_on_copy(m, lr, stats));
    all_untouched(m); /* the plain optimizer's step zeroes the gradients */
    DSC_TRY(dsc_loss_scaler_update(&m->scaler, false, NULL, 0));
    m->inner_steps = stats->step;
    m->last_skipped = false;
    m->last_scale = scale;
    return NULL;
}

static int mixed_state_count(const dsc_optimizer *opt) {
    const mixed_optimizer *m = (const mixed_optimizer *)opt;
    return dsc_optimizer_state_count(m->inner) + m->n_pieces + 2;
}

static void mixed_state_at(dsc_optimizer *opt, int index, dsc_optim_state *out) {
    mixed_optimizer *m = self_of(opt);
    int inner = dsc_optimizer_state_count(m->inner);
    if (index < inner) {
        dsc_optimizer_state_at(m->inner, index, out);
        return;
    }
    memset(out, 0, sizeof *out);
    if (index - inner >= m->n_pieces) { /* the scaler's two entries */
        if (!m->ck_handed) {
            m->ck_scale = (float)m->scaler.cur_scale;
            m->ck_counts[0] = m->scaler.cur_iter;
            m->ck_counts[1] = m->scaler.last_overflow_iter;
            m->ck_counts[2] = m->scaler.cur_hysteresis;
            m->ck_counts[3] = m->skipped;
            m->ck_handed = true;
        }
        bool scale = index - inner == m->n_pieces;
        int64_t n = scale ? 1 : 4;
        snprintf(out->name, sizeof out->name, "%s", scale ? "loss_scale" : "loss_scaler");
        out->local = scale ? dsc_tensor_view(&m->ck_scale, DSC_DTYPE_F32, 1, &n, DSC_CPU)
                           : dsc_tensor_view(m->ck_counts, DSC_DTYPE_I64, 1, &n, DSC_CPU);
        return;
    }
    const master_piece *pc = &m->pieces[index - inner];
    snprintf(out->name, sizeof out->name, "master/%s", pc->param->name);
    out->param = pc->param;
    out->offset = pc->offset;
    views_put_back(&m->values);
    int64_t n;
    float *master = m->po.whole ? group_values(m, pc->param->group, &n) : m->master[pc->param->group].data;
    out->local = dsc_tensor_view(master + pc->pos, DSC_DTYPE_F32, 1, &pc->numel, DSC_CPU);
}

static void mixed_destroy(dsc_optimizer *opt) {
    mixed_optimizer *m = self_of(opt);
    dsc_optimizer_destroy(m->inner);
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++)
        dsc_tensor_free(&m->master[g]);
    views_free(&m->grads);
    free(m->in_place);
    free(m->untouched);
    views_free(&m->values);
    free(m->pieces);
    free(m);
}

static void mixed_set_betas(dsc_optimizer *opt, float beta1, float beta2) {
    dsc_optimizer_set_betas(self_of(opt)->inner, beta1, beta2);
}

static const dsc_optimizer_ops mixed_ops = {
    .name = "mixed",
    .before_layer = mixed_before_layer,
    .after_layer = mixed_after_layer,
    .grads_ready = mixed_grads_ready,
    .reduce_grads = mixed_reduce_grads,
    .step = mixed_step,
    .state_count = mixed_state_count,
    .state_at = mixed_state_at,
    .destroy = mixed_destroy,
    .set_betas = mixed_set_betas,
};

/* The master pieces: each parameter's overlap with its group's range. */
static dsc_status find_pieces(mixed_optimizer *m) {
    int n = dsc_params_count(m->oo.params);
    m->pieces = calloc((size_t)(n > 0 ? n : 1), sizeof *m->pieces);
    DSC_CHECK(m->pieces, DSC_ERR_NOMEM, "mixed precision: %d master pieces", n);
    for (int i = 0; i < n; i++) {
        dsc_param *p = dsc_params_at(m->oo.params, i);
        const dsc_precision_range *r = &m->po.ranges[p->group];
        int64_t lo = p->offset > r->begin ? p->offset : r->begin;
        int64_t end = p->offset + dsc_param_numel(p);
        int64_t hi = end < r->end ? end : r->end;
        if (hi <= lo) continue;
        m->pieces[m->n_pieces++] = (master_piece){p, lo - p->offset, lo - r->begin, hi - lo};
    }
    return NULL;
}

static dsc_status setup(mixed_optimizer *m) {
    int n_params = dsc_params_count(m->oo.params);
    DSC_CHECK(n_params == 0 || dsc_params_at(m->oo.params, 0)->value.device.type == DSC_DEVICE_CPU,
              DSC_ERR_UNSUPPORTED,
              "mixed precision: the parameters are not in host memory; fp16 / bf16 training is implemented for "
              "CPU jobs (dsc trains on the CPU)");
    /* one layer's gradients its kernels do not round, and the values it reads rounded */
    int64_t most = 1, most_rounded = 1;
    m->max_params = 1;
    for (int l = 0; l < m->oo.n_layers; l++) {
        const dsc_layer *layer = m->oo.layers[l];
        int64_t n = 0, rounded = 0;
        for (int j = 0; j < layer->n_params; j++) {
            if (!grad_rounded_by_kernels(layer, j)) n += dsc_param_numel(layer->params[j]);
            if (!seen_before(layer, j) && !read_as_is(layer, j, false)) /* a forward rounds the most */
                rounded += dsc_param_numel(layer->params[j]);
        }
        if (n > most) most = n;
        if (rounded > most_rounded) most_rounded = rounded;
        if (layer->n_params > m->max_params) m->max_params = layer->n_params;
    }
    DSC_TRY(views_reserve(&m->grads, true, most, m->max_params, DSC_MEM_GRADS));
    m->in_place = calloc((size_t)m->max_params, sizeof *m->in_place);
    DSC_CHECK(m->in_place, DSC_ERR_NOMEM, "mixed precision: %d gradient flags", m->max_params);
    if (m->po.whole) { /* untouched: false until the first step, the gradients' contents are the caller's */
        m->untouched = calloc((size_t)(m->oo.n_layers > 0 ? m->oo.n_layers : 1), sizeof *m->untouched);
        DSC_CHECK(m->untouched, DSC_ERR_NOMEM, "mixed precision: %d layer flags", m->oo.n_layers);
        DSC_TRY(views_reserve(&m->values, false, most_rounded, m->max_params, DSC_MEM_PARAMS));
    }
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++) {
        dsc_precision_range *r = &m->po.ranges[g];
        int64_t n;
        float *values = group_values(m, g, &n);
        DSC_CHECK(r->begin >= 0 && r->begin <= r->end && r->end <= n, DSC_ERR_INVALID,
                  "mixed precision: range [%lld, %lld) outside the %s group's %lld elements", (long long)r->begin,
                  (long long)r->end, g == DSC_PARAM_GROUP_EXPERT ? "expert" : "dense", (long long)n);
        if (!values && n > 0) { /* ZeRO-3: no flat values; the inner optimizer's f32 shards are the master */
            DSC_CHECK(r->begin == r->end, DSC_ERR_INVALID,
                      "mixed precision: the %s group's values are released, so it can keep no master range",
                      g == DSC_PARAM_GROUP_EXPERT ? "expert" : "dense");
            m->round_on_use = true;
        }
        DSC_CHECK(
            !m->po.whole || (values && r->begin == 0 && r->end == n), DSC_ERR_INVALID,
            "mixed precision: the %s group's master is to be its whole value buffer, but the range is [%lld, "
            "%lld) of %lld elements%s",
            g == DSC_PARAM_GROUP_EXPERT ? "expert" : "dense", (long long)r->begin, (long long)r->end, (long long)n,
            values ? "" : " (released)");
        if (m->po.whole) continue; /* the values are the master */
        int64_t len = r->end - r->begin;
        DSC_TRY(dsc_tensor_alloc(&m->master[g], DSC_DTYPE_F32, 1, &len, DSC_CPU, DSC_MEM_OPTIM));
        if (values) {
            copy_range(m->master[g].data, values + r->begin, len);
            dsc_round_to_dtype(values, n, m->po.dtype);
        }
    }
    return find_pieces(m);
}

dsc_status dsc_precision_wrap(const dsc_precision_options *po, dsc_optimizer *inner, dsc_optimizer **out) {
    *out = NULL;
    mixed_optimizer *m = NULL;
    dsc_status s = NULL;
    if (!po->opt || !po->opt->params)
        s = dsc_error(DSC_ERR_INVALID, "mixed precision: no optimizer options / parameter store");
    else if (po->dtype != DSC_DTYPE_BF16 && po->dtype != DSC_DTYPE_F16)
        s = dsc_error(DSC_ERR_INVALID, "mixed precision: dtype %s is not bf16 or f16", dsc_dtype_name(po->dtype));
    else if (!(m = calloc(1, sizeof *m)))
        s = dsc_error(DSC_ERR_NOMEM, "mixed precision: out of memory");
    if (s) {
        dsc_optimizer_destroy(inner);
        return s;
    }
    m->base.ops = &mixed_ops;
    m->inner = inner;
    m->po = *po;
    m->oo = *po->opt;
    m->po.opt = &m->oo;
    dsc_loss_scaler_init(&m->scaler, &po->scaler);
    s = setup(m);
    if (s) {
        mixed_destroy(&m->base);
        return dsc_error_wrap(s, "creating the %s mixed-precision optimizer", dsc_dtype_name(po->dtype));
    }
    *out = &m->base;
    return NULL;
}

double dsc_precision_loss_scale(dsc_optimizer *opt) {
    if (!opt || opt->ops != &mixed_ops) return 1.0;
    mixed_optimizer *m = self_of(opt);
    sync_scaler(m);
    return m->scaler.cur_scale;
}

float dsc_precision_micro_loss_scale(dsc_optimizer *opt, int micro_batches) {
    return (float)dsc_precision_loss_scale(opt) * (1.0f / (float)micro_batches);
}

int64_t dsc_precision_skipped_steps(const dsc_optimizer *opt) {
    return opt && opt->ops == &mixed_ops ? ((const mixed_optimizer *)opt)->skipped : 0;
}

bool dsc_precision_last_step(const dsc_optimizer *opt, double *loss_scale) {
    bool mixed = opt && opt->ops == &mixed_ops;
    *loss_scale = mixed ? ((const mixed_optimizer *)opt)->last_scale : 0.0;
    return mixed && ((const mixed_optimizer *)opt)->last_skipped;
}

dsc_dtype dsc_precision_dtype(const dsc_optimizer *opt) {
    return opt && opt->ops == &mixed_ops ? ((const mixed_optimizer *)opt)->po.dtype : DSC_DTYPE_F32;
}

void dsc_precision_store_between(dsc_optimizer *opt, const dsc_tensor *t) {
    if (!opt || opt->ops != &mixed_ops || !t->data || t->dtype != DSC_DTYPE_F32) return;
    dsc_round_to_dtype(t->data, dsc_tensor_numel(t), self_of(opt)->po.dtype);
}
