/* Muon as DeepSpeed's MuonWithAuxAdam: the hidden matrices of the model get
 * Nesterov momentum orthogonalised by five Newton-Schulz iterations (Keller
 * Jordan's quintic, coefficients 3.4445, -4.7750, 2.0315), scaled by
 * max(1, rows / cols)^0.5; every other parameter (embeddings, the LM head,
 * norms, biases) gets Adam. A parameter of three dimensions is a bank of
 * expert matrices, each orthogonalised on its own (DeepSpeed's expert path).
 *
 * The iterations work on X = U / ||U|| when U is wide and on X = U^T when it
 * is tall; rather than transposing, each product is taken in U's own
 * orientation (X X^T is U^T U for a tall U, and M X is U M^T), so U is
 * updated in place. "gram" (DeepSpeed's default) iterates on the small
 * square R = X X^T and applies the accumulated polynomial Q to X at the
 * restart and the end; "standard" multiplies X itself every step. Both run
 * in f32 with the backend's GEMM, so they run wherever the tensors live.
 *
 * A matrix spread over ranks (dsc_optim_muon_piece: ZeRO's pieces of it,
 * tensor parallelism's slices) takes the momentum on each piece, which is
 * elementwise, then is assembled whole for Newton-Schulz as DeepSpeed's
 * ZeRO does (stage 1/2 all-reduce the matrices that straddle partitions,
 * stage 3 all-gathers them): the pieces are all-gathered where they lie back
 * to back in rank order (ZeRO's cuts), or each rank writes its piece into
 * zeros and the group sums, exactly; under tensor parallelism the local
 * slice is placed in the global matrix and summed over the tensor group the
 * same way. Then one rank of the group (the caller's `owner`: ZeRO-3
 * assigns matrices round-robin, as DeepSpeed's stage 3 does) orthogonalises
 * the whole matrix and broadcasts it, or every rank that holds a piece
 * orthogonalises it (the same arithmetic on the same data, so the same
 * result); each applies its piece.
 *
 * Not here: which schedule sets the learning rates (hparams_from_config),
 * or which pieces a rank holds (plain.c, zero/). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/kernels.h"
#include "dsc/optimizer.h"

enum { NS_STEPS = 5, GRAM_RESTART = 2 };
static const float NS_A = 3.4445f, NS_B = -4.7750f, NS_C = 2.0315f;

bool dsc_optim_uses_muon(const dsc_param *param) {
    /* deepspeed.set_optimizer_flags: ndim >= 2 and no "embed" / "lm_head"; dsc's head is "head.weight" */
    return param->value.ndim >= 2 && !strstr(param->name, "embed") && !strstr(param->name, "lm_head") &&
           strcmp(param->name, "head.weight") != 0;
}

/* One matrix's scratch: square n x n buffers and one more of U's shape. */
typedef struct ns_work {
    dsc_tensor sq[6]; /* standard: A, B; gram: R, Z, Q, T, RZ, I */
    dsc_tensor t;     /* U-shaped product */
    int64_t rows, cols, n;
    bool tall;
} ns_work;

static void work_free(ns_work *w) {
    for (int i = 0; i < 6; i++)
        dsc_tensor_free(&w->sq[i]);
    dsc_tensor_free(&w->t);
}

static dsc_status identity(dsc_tensor *out) {
    int64_t n = out->shape[0];
    float *host = calloc((size_t)(n * n), sizeof *host);
    DSC_CHECK(host, DSC_ERR_NOMEM, "muon: %lld x %lld identity", (long long)n, (long long)n);
    for (int64_t i = 0; i < n; i++)
        host[i * n + i] = 1.0f;
    int64_t shape[2] = {n, n};
    dsc_tensor h = dsc_tensor_view(host, DSC_DTYPE_F32, 2, shape, DSC_CPU);
    dsc_status s = dsc_tensor_copy(out, &h);
    free(host);
    return s;
}

static dsc_status work_alloc(ns_work *w, int64_t rows, int64_t cols, dsc_device device) {
    memset(w, 0, sizeof *w);
    w->rows = rows, w->cols = cols, w->tall = rows > cols;
    w->n = w->tall ? cols : rows;
    int64_t sq[2] = {w->n, w->n}, u[2] = {rows, cols};
    dsc_status s = dsc_tensor_alloc(&w->t, DSC_DTYPE_F32, 2, u, device, DSC_MEM_OPTIM);
    for (int i = 0; i < 6 && !s; i++)
        s = dsc_tensor_alloc(&w->sq[i], DSC_DTYPE_F32, 2, sq, device, DSC_MEM_OPTIM);
    if (!s) s = identity(&w->sq[5]);
    if (s) work_free(w);
    return s;
}

/* out = X X^T, the n x n Gram matrix of X (U or U^T). */
static dsc_status gram(const ns_work *w, dsc_tensor *out, const dsc_tensor *u) {
    return dsc_kernel_gemm(out, u, u, NULL, w->tall, !w->tall, 1.0f, 0.0f);
}

/* out = M X in U's orientation: M U, or U M^T for a tall U. */
static dsc_status left_mul(const ns_work *w, dsc_tensor *out, const dsc_tensor *m, const dsc_tensor *u) {
    return w->tall ? dsc_kernel_gemm(out, u, m, NULL, false, true, 1.0f, 0.0f)
                   : dsc_kernel_gemm(out, m, u, NULL, false, false, 1.0f, 0.0f);
}

/* out = b S + c S S, the iteration's polynomial part. */
static dsc_status poly(dsc_tensor *out, const dsc_tensor *s) {
    DSC_TRY(dsc_kernel_gemm(out, s, s, NULL, false, false, NS_C, 0.0f));
    return dsc_kernel_axpy(out, NS_B, s);
}

/* out = a X + P X, where P X is already in out. */
static dsc_status add_scaled(dsc_tensor *out, const dsc_tensor *x) {
    return dsc_kernel_axpy(out, NS_A, x);
}

static void swap(dsc_tensor **a, dsc_tensor **b) {
    dsc_tensor *t = *a;
    *a = *b;
    *b = t;
}

/* X <- a X + (b A + c A^2) X, NS_STEPS times, ping-ponging between *x and *y. */
static dsc_status ns_standard(ns_work *w, dsc_tensor **x, dsc_tensor **y) {
    dsc_tensor *a = &w->sq[0], *b = &w->sq[1];
    for (int i = 0; i < NS_STEPS; i++) {
        DSC_TRY(gram(w, a, *x));
        DSC_TRY(poly(b, a));
        DSC_TRY(left_mul(w, *y, b, *x));
        DSC_TRY(add_scaled(*y, *x));
        swap(x, y);
    }
    return NULL;
}

/* The Gram iteration: R = X X^T evolves as X would, Q accumulates the
 * polynomial applied to X, X itself is multiplied only at the restart (which
 * keeps rounding from compounding in R) and at the end. */
static dsc_status ns_gram(ns_work *w, dsc_tensor **x, dsc_tensor **y) {
    dsc_tensor *r = &w->sq[0], *z = &w->sq[1], *q = &w->sq[2], *t = &w->sq[3], *rz = &w->sq[4];
    const dsc_tensor *eye = &w->sq[5];
    bool have_q = false;
    DSC_TRY(gram(w, r, *x));
    for (int i = 0; i < NS_STEPS; i++) {
        if (i == GRAM_RESTART) {
            DSC_TRY(left_mul(w, *y, q, *x));
            swap(x, y);
            DSC_TRY(gram(w, r, *x));
            have_q = false;
        }
        DSC_TRY(poly(z, r));
        if (!have_q) { /* Q = Z + a I */
            DSC_TRY(dsc_tensor_copy(q, z));
            DSC_TRY(dsc_kernel_axpy(q, NS_A, eye));
            have_q = true;
        } else { /* Q = a Q + Z Q */
            DSC_TRY(dsc_kernel_gemm(t, z, q, NULL, false, false, 1.0f, 0.0f));
            DSC_TRY(add_scaled(t, q));
            swap(&q, &t);
        }
        if (i < NS_STEPS - 1 && i + 1 != GRAM_RESTART) { /* R = a (a R + Z R) + Z (a R + Z R) */
            DSC_TRY(dsc_kernel_gemm(rz, z, r, NULL, false, false, 1.0f, 0.0f));
            DSC_TRY(add_scaled(rz, r));
            DSC_TRY(dsc_kernel_gemm(r, z, rz, NULL, false, false, 1.0f, 0.0f));
            DSC_TRY(add_scaled(r, rz));
        }
    }
    DSC_TRY(left_mul(w, *y, q, *x));
    swap(x, y);
    return NULL;
}

/* Orthogonalises the matrix in *u; *u then points at the buffer (the
 * matrix's own or w->t) that holds the result. */
static dsc_status orthogonalise(const dsc_optim_hparams *hp, ns_work *w, dsc_tensor **u) {
    double sq;
    DSC_TRY(dsc_kernel_sum_squares(&sq, *u));
    DSC_TRY(dsc_kernel_scale(*u, (float)(1.0 / (sqrt(sq) + 1e-7))));
    dsc_tensor *other = &w->t;
    /* a square matrix gains nothing from the Gram form; DeepSpeed iterates it directly */
    if (hp->ns_method == DSC_MUON_NS_GRAM && w->rows != w->cols) return ns_gram(w, u, &other);
    return ns_standard(w, u, &other);
}

/* m = beta m + (1 - beta) g, then g = (1 - beta) g + beta m (Nesterov):
 * elementwise, so any piece of a matrix takes it on its own. */
static dsc_status nesterov(const dsc_optim_hparams *hp, dsc_tensor *grad, dsc_tensor *momentum) {
    float beta = hp->momentum;
    DSC_TRY(dsc_kernel_scale(momentum, beta));
    DSC_TRY(dsc_kernel_axpy(momentum, 1.0f - beta, grad));
    DSC_TRY(dsc_kernel_scale(grad, 1.0f - beta));
    return dsc_kernel_axpy(grad, beta, momentum);
}

/* The i-th matrix of a contiguous bank of (rows, cols) matrices. */
static dsc_tensor matrix_at(const dsc_tensor *t, int64_t i, int64_t rows, int64_t cols) {
    int64_t shape[2] = {rows, cols};
    return dsc_tensor_view((float *)t->data + i * rows * cols, DSC_DTYPE_F32, 2, shape, t->device);
}

/* Orthogonalises each of the `count` (rows, cols) matrices of `bank` in place. */
static dsc_status orthogonalise_bank(const dsc_optim_hparams *hp, dsc_tensor *bank, int64_t count, int64_t rows,
                                     int64_t cols) {
    if (count == 0) return NULL;
    ns_work w;
    DSC_TRY(work_alloc(&w, rows, cols, bank->device));
    dsc_status s = NULL;
    for (int64_t i = 0; i < count && !s; i++) {
        dsc_tensor m = matrix_at(bank, i, rows, cols), *u = &m;
        s = orthogonalise(hp, &w, &u);
        if (!s && u != &m) s = dsc_tensor_copy(&m, u);
    }
    work_free(&w);
    return s;
}

/* value <- value (1 - lr wd) - lr max(1, rows / cols)^0.5 O, on any piece. */
static dsc_status apply(dsc_tensor *value, const dsc_tensor *o, float lr, float wd, int64_t rows, int64_t cols) {
    if (wd != 0.0f) DSC_TRY(dsc_kernel_scale(value, 1.0f - lr * wd));
    double scale = rows > cols ? sqrt((double)rows / (double)cols) : 1.0;
    return dsc_kernel_axpy(value, (float)(-lr * scale), o);
}

static float muon_decay(const dsc_optim_hparams *hp, const dsc_param *param) {
    return (param->flags & DSC_PARAM_NO_DECAY) ? 0.0f : hp->weight_decay;
}

/* Muon on a whole parameter this rank holds alone. The gradient is scratch afterwards. */
static dsc_status muon_param(const dsc_optim_hparams *hp, dsc_param *param, dsc_tensor *momentum, float lr) {
    const dsc_tensor *v = &param->value;
    int64_t rows = v->shape[v->ndim - 2], cols = v->shape[v->ndim - 1];
    int64_t count = rows * cols > 0 ? dsc_tensor_numel(v) / (rows * cols) : 0;
    if (count == 0) return NULL;
    DSC_TRY(nesterov(hp, &param->grad, momentum));
    DSC_TRY(orthogonalise_bank(hp, &param->grad, count, rows, cols));
    return apply(&param->value, &param->grad, lr, muon_decay(hp, param), rows, cols);
}

/* ---- matrices spread over ranks ------------------------------------------------------ */

/* Whether tensor parallelism cuts the parameter's matrices themselves (its
 * rows or columns); a cut along a leading axis (a bank of expert matrices)
 * leaves every matrix whole. */
static bool tp_cuts_matrices(const dsc_param *param, const dsc_comm *tensor) {
    const dsc_tensor *v = &param->value;
    return tensor && dsc_comm_size(tensor) > 1 && param->shard.axis >= 0 && param->shard.axis >= v->ndim - 2;
}

bool dsc_optim_muon_needs_tensor_group(const dsc_param *param, const dsc_comm *tensor) {
    return dsc_optim_uses_muon(param) && tp_cuts_matrices(param, tensor);
}

/* Copies between a rank's slice (local) and the global tensor along the shard
 * axis: local is [outer][n][inner], global [outer][N][inner], the slice at
 * `start` of the N. */
static dsc_status slice_copy(const dsc_param *param, dsc_tensor *local, dsc_tensor *global, bool to_global) {
    const dsc_param_shard *sh = &param->shard;
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < sh->axis; d++)
        outer *= sh->global[d];
    for (int d = sh->axis + 1; d < param->value.ndim; d++)
        inner *= sh->global[d];
    int64_t n = param->value.shape[sh->axis], N = sh->global[sh->axis], len = n * inner;
    for (int64_t o = 0; o < outer; o++) {
        dsc_tensor a = dsc_tensor_view((float *)local->data + o * len, DSC_DTYPE_F32, 1, &len, local->device);
        dsc_tensor b = dsc_tensor_view((float *)global->data + (o * N + sh->start) * inner, DSC_DTYPE_F32, 1, &len,
                                       global->device);
        DSC_TRY(to_global ? dsc_tensor_copy(&b, &a) : dsc_tensor_copy(&a, &b));
    }
    return NULL;
}

/* Sums a buffer over a group in which every rank contributed zeros outside
 * its own elements: the result is every rank's elements in place, exactly. */
static dsc_status assemble(dsc_comm *c, dsc_tensor *t, const char *what, const dsc_param *param) {
    if (!c || dsc_comm_size(c) == 1) return NULL;
    dsc_status s = dsc_comm_allreduce(c, t, DSC_REDUCE_OP_SUM);
    return s ? dsc_error_wrap(s, "Muon: gathering %s's update over the %s", param->name, what) : NULL;
}

/* Orthogonalises the whole update of `param` (the local parameter in `local`,
 * assembled), gathering it over the tensor group first when tensor
 * parallelism cuts its matrices; `local` holds this rank's orthogonalised
 * slice afterwards. *rows, *cols: the matrices' global extents. */
static dsc_status orthogonalise_spread(const dsc_optim_hparams *hp, const dsc_param *param, dsc_comm *tensor,
                                       dsc_tensor *local, bool compute, int64_t *rows, int64_t *cols) {
    const dsc_tensor *v = &param->value;
    if (!tp_cuts_matrices(param, tensor)) {
        *rows = v->shape[v->ndim - 2], *cols = v->shape[v->ndim - 1];
        int64_t count = *rows * *cols > 0 ? dsc_tensor_numel(v) / (*rows * *cols) : 0;
        return compute ? orthogonalise_bank(hp, local, count, *rows, *cols) : NULL;
    }
    const int64_t *gshape = param->shard.global;
    *rows = gshape[v->ndim - 2], *cols = gshape[v->ndim - 1];
    int64_t numel = 1;
    for (int d = 0; d < v->ndim; d++)
        numel *= gshape[d];
    dsc_tensor global;
    DSC_TRY(dsc_tensor_alloc(&global, DSC_DTYPE_F32, 1, &numel, v->device, DSC_MEM_OPTIM));
    dsc_status s = slice_copy(param, local, &global, true);
    if (!s) s = assemble(tensor, &global, "tensor-parallel group", param);
    int64_t count = *rows * *cols > 0 ? numel / (*rows * *cols) : 0;
    if (!s && compute) s = orthogonalise_bank(hp, &global, count, *rows, *cols);
    if (!s && compute) s = slice_copy(param, local, &global, false);
    dsc_tensor_free(&global);
    return s;
}

dsc_status dsc_optim_muon_piece(const dsc_optim_hparams *hp, dsc_param *param, const dsc_muon_piece *pc,
                                float lr) {
    lr *= hp->muon_lr_scale;
    int64_t n = dsc_tensor_numel(pc->value), total = dsc_param_numel(param);
    DSC_CHECK(pc->offset >= 0 && n <= total - pc->offset && dsc_tensor_numel(pc->grad) == n &&
                  dsc_tensor_numel(pc->momentum) == n,
              DSC_ERR_INVALID, "Muon: piece [%lld, +%lld) of %s (%lld elements) with unequal state",
              (long long)pc->offset, (long long)n, param->name, (long long)total);
    if (n > 0) DSC_TRY(nesterov(hp, pc->grad, pc->momentum));
    bool spread = (pc->shard && dsc_comm_size(pc->shard) > 1) || tp_cuts_matrices(param, pc->tensor);
    if (!spread) {
        if (n == 0) return NULL; /* another rank of the group holds all of it */
        DSC_CHECK(n == total && pc->offset == 0, DSC_ERR_INVALID,
                  "Muon: %s: a piece of %lld of its %lld elements without the group holding the rest", param->name,
                  (long long)n, (long long)total);
        const dsc_tensor *v = &param->value;
        int64_t rows = v->shape[v->ndim - 2], cols = v->shape[v->ndim - 1];
        int64_t count = rows * cols > 0 ? total / (rows * cols) : 0;
        DSC_TRY(orthogonalise_bank(hp, pc->grad, count, rows, cols));
        return apply(pc->value, pc->grad, lr, muon_decay(hp, param), rows, cols);
    }
    /* The whole local update: this rank's piece in place, zeros elsewhere, summed over the ZeRO group. */
    dsc_tensor local;
    DSC_TRY(dsc_tensor_alloc(&local, DSC_DTYPE_F32, 1, &total, pc->value->device, DSC_MEM_OPTIM));
    dsc_tensor mine = dsc_tensor_view((float *)local.data + pc->offset, DSC_DTYPE_F32, 1, &n, local.device);
    dsc_status s = n > 0 ? dsc_tensor_copy(&mine, pc->grad) : NULL;
    if (!s && pc->counts && pc->shard && dsc_comm_size(pc->shard) > 1) {
        s = dsc_comm_allgather(pc->shard, &mine, &local, pc->counts); /* in place: mine is this rank's piece */
        if (s) s = dsc_error_wrap(s, "Muon: all-gathering %s's update over the ZeRO group", param->name);
    } else if (!s) {
        s = assemble(pc->shard, &local, "ZeRO group", param);
    }
    int64_t rows = 0, cols = 0;
    /* a rank holding none of it only helps assemble the tensor-parallel whole */
    bool owned = pc->owner >= 0 && pc->shard && dsc_comm_size(pc->shard) > 1;
    bool compute = owned ? dsc_comm_rank(pc->shard) == pc->owner : n > 0;
    if (!s) s = orthogonalise_spread(hp, param, pc->tensor, &local, compute, &rows, &cols);
    if (!s && owned) {
        s = dsc_comm_broadcast(pc->shard, &local, pc->owner);
        if (s) s = dsc_error_wrap(s, "Muon: sharing %s's update from rank %d", param->name, pc->owner);
    }
    if (!s && n > 0) s = apply(pc->value, &mine, lr, muon_decay(hp, param), rows, cols);
    dsc_tensor_free(&local);
    return s;
}

/* The Adam group's rule of Muon (MuonWithAuxAdam's adam_update), on any piece. */
static dsc_status aux_adam(const dsc_optim_hparams *hp, dsc_tensor *value, dsc_tensor *grad, dsc_tensor *exp_avg,
                           dsc_tensor *exp_avg_sq, float lr, bool decay, int64_t step) {
    return dsc_kernel_adamw(value, grad, exp_avg, exp_avg_sq, lr * hp->adam_lr_scale, hp->beta1, hp->beta2,
                            hp->eps, decay ? hp->weight_decay : 0.0f, step);
}

dsc_status dsc_optim_update_param(const dsc_optim_hparams *hp, dsc_param *param, dsc_tensor *state0,
                                  dsc_tensor *state1, float lr, int64_t step) {
    bool decay = !(param->flags & DSC_PARAM_NO_DECAY);
    if (hp->type != DSC_OPTIMIZER_TYPE_MUON)
        return dsc_optim_update(hp, &param->value, &param->grad, state0, state1, lr, decay, step);
    if (dsc_optim_uses_muon(param)) return muon_param(hp, param, state0, lr * hp->muon_lr_scale);
    return aux_adam(hp, &param->value, &param->grad, state0, state1, lr, decay, step);
}

dsc_status dsc_optim_muon_adam(const dsc_optim_hparams *hp, dsc_tensor *value, dsc_tensor *grad,
                               dsc_tensor *exp_avg, dsc_tensor *exp_avg_sq, float lr, bool decay, int64_t step) {
    return aux_adam(hp, value, grad, exp_avg, exp_avg_sq, lr, decay, step);
}
