/* tp/ private: what the tensor-parallel layers share — buffer
 * views, parameter declaration (whole or as a piece of the global tensor)
 * and the all-reduce over the tensor group.
 *
 * Dimension letters: B, T reserved batch and sequence; b, t the running
 * micro-batch; C channels; HS head size; nq, nkv this rank's query and KV
 * heads; nf this rank's feed-forward width; nv its vocabulary rows. */
#ifndef DSC_TP_INTERNAL_H
#define DSC_TP_INTERNAL_H

#include "dsc/model.h"
#include "dsc/tp_layers.h"

/* Enough for attention (8), an MLP (5) or a head (3). */
#define TP_MAX_LAYER_PARAMS 16

typedef struct tp_param_list {
    dsc_param *items[TP_MAX_LAYER_PARAMS];
    int n;
} tp_param_list;

/* Declares "<prefix>.<leaf>": the piece [start, start + count) along `axis`
 * of the global `shape`, or (axis -1) the whole tensor, replicated. */
dsc_status tp_declare(tp_param_list *list, dsc_param_store *store, const char *prefix, const char *leaf, int ndim,
                      const int64_t *shape, int axis, int64_t start, int64_t count, uint32_t flags,
                      dsc_param_init init, float init_std, dsc_param **out);

/* The leading elements of `buf` seen with `shape`. */
dsc_tensor tp_view(const dsc_tensor *buf, int ndim, const int64_t *shape);

/* Sums `t` over the tensor group in place (a no-op for one rank). */
dsc_status tp_allreduce(const dsc_tp_build_extra *x, dsc_tensor *t);
/* The build context's wiring, or an error naming the layer type. */
dsc_status tp_extra_of(const dsc_build_ctx *ctx, const char *type, const dsc_tp_build_extra **out);

/* ---- sequence parallelism (sequence.c) ----
 * A region's hold on the workspace every region shares for what it gathers
 * (four (B, T, C) buffers, alive during one call); without
 * sequence_parallel nothing (every call below is the plain layout's). */
typedef struct tp_seq {
    bool held;
} tp_seq;

/* Holds the shared workspace for (B, T, C) gathered tensors (T: the whole sequence). */
dsc_status tp_seq_reserve(tp_seq *q, const dsc_tp_build_extra *x, int64_t B, int64_t T, int64_t C,
                          dsc_device device);
void tp_seq_release(tp_seq *q);
/* *full = local (b, tl, C) of every rank as (b, tl * tp, C) in the
 * workspace, one buffer for a region's input and one for an output gradient
 * (valid until the next call of the same kind); without sequence
 * parallelism *full = *local. */
dsc_status tp_seq_gather_input(const dsc_tp_build_extra *x, const dsc_tensor *local, dsc_tensor *full);
dsc_status tp_seq_gather_grad(const dsc_tp_build_extra *x, const dsc_tensor *local, dsc_tensor *full);
/* Where a region computes its (b, t, C) partial sum: `own` (the buffer the
 * plain layout sums in place) or, with sequence parallelism, the workspace. */
dsc_status tp_seq_partial(const dsc_tp_build_extra *x, const dsc_tensor *own, const int64_t *shape,
                          dsc_tensor *out);
/* *out = the sum over the group of `partial`: in place (all-reduce), or this
 * rank's (b, t / tp, C) positions of it in `buf` (reduce-scatter). */
dsc_status tp_seq_sum(const dsc_tp_build_extra *x, dsc_tensor *partial, const dsc_tensor *buf, dsc_tensor *out);
/* *local = this rank's positions of a complete full (b, t, C) (copied into
 * `buf`), or *full itself without sequence parallelism. */
void tp_seq_take(const dsc_tp_build_extra *x, const dsc_tensor *full, const dsc_tensor *buf, dsc_tensor *local);
/* The positions a rank holds of T (T / tp with sequence parallelism), and
 * the whole sequence of a rank's T (T x tp). */
int64_t tp_seq_local(const dsc_tp_build_extra *x, int64_t T);
int64_t tp_seq_full(const dsc_tp_build_extra *x, int64_t T);

/* The MLP of block `block` split by width (tp_block's feed-forward part). */
dsc_status tp_mlp_create(const dsc_build_ctx *ctx, int block, dsc_layer **out);
/* "tp_block": the pre-norm block around the split attention and MLP (with
 * sequence parallelism, a wrapper summing the norms' gradients; layer_block.c). */
dsc_status tp_block_create(const dsc_layer_spec *spec, const dsc_build_ctx *ctx, dsc_layer **out);
dsc_status tp_embedding_create(const dsc_layer_spec *spec, const dsc_build_ctx *ctx, dsc_layer **out);
dsc_status tp_head_create(const dsc_layer_spec *spec, const dsc_build_ctx *ctx, dsc_layer **out);

#endif
