/* dsc/nn.h — parameters and layers: the plug-in point between the runtime
 * and everything that computes (dense blocks here, MoE blocks in moe/, the
 * pipeline executor in pipe/, sharded optimizers in zero/).
 *
 * Parameters live in a parameter store: each has a global name and global
 * shape (what checkpoints record), and after dsc_params_finalize its value
 * and gradient are views into ONE flat f32 buffer per group (dense, expert),
 * as llm.c carves named views out of one allocation. Flat buffers make
 * bucketed all-reduce and ZeRO partitioning a matter of offsets.
 *
 * A layer is a vtable (reserve, forward, backward, destroy) plus the list of
 * parameters it uses. Activations are saved per in-flight micro-batch slot
 * (the pipeline's buffer id), so one layer can hold several micro-batches at
 * once. Layers read parameter tensors through their dsc_param at every call
 * (never cache data pointers): ZeRO-3 swaps them in and out around a call. */
#ifndef DSC_NN_H
#define DSC_NN_H

#include "dsc/api.h"
#include <stdbool.h>
#include <stdint.h>

#include "dsc/rng.h"
#include "dsc/status.h"
#include "dsc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSC_PARAM_NAME_MAX 128

typedef enum dsc_param_flag {
    DSC_PARAM_EXPERT = 1u << 0,   /* reduced over the expert-data-parallel group */
    DSC_PARAM_NO_DECAY = 1u << 1, /* excluded from weight decay (norms, biases) */
    DSC_PARAM_TIED = 1u << 2      /* held by several pipeline stages; grads summed across them */
} dsc_param_flag;

/* How one layer reads a parameter's value and writes its gradient (dsc_layer.param_uses): what
 * mixed precision need not round for that layer's calls. A tied weight has one use per layer that reads it. */
typedef enum dsc_param_use {
    /* read only by kernels that round what they read under bf16 products (dsc_kernels_set_matmul_dtype):
     * the matrix products (dsc_kernel_linear_*, dsc_kernel_gemm) and the embedding lookup */
    DSC_PARAM_USE_ROUNDED_BY_KERNELS = 1u << 0,
    /* not read by the layer's backward (an embedding lookup's gradient is a scatter of dout) */
    DSC_PARAM_USE_FORWARD_ONLY = 1u << 1,
    /* its gradient is added to only by kernels that round what they add under
     * dsc_kernels_set_grad_dtype (dsc_kernel_linear_backward's dw and dbias, the embedding's
     * scatter), one call per backward: mixed precision then needs no scratch to round the layer's
     * contribution in */
    DSC_PARAM_USE_GRAD_ROUNDED_BY_KERNELS = 1u << 2
} dsc_param_use;

typedef enum dsc_param_group {
    DSC_PARAM_GROUP_DENSE = 0,
    DSC_PARAM_GROUP_EXPERT = 1,
    DSC_PARAM_GROUP_COUNT
} dsc_param_group;

typedef enum dsc_param_init {
    DSC_INIT_NORMAL = 0, /* N(0, std^2) from a stream seeded by (seed, global name) */
    DSC_INIT_ZEROS,
    DSC_INIT_ONES
} dsc_param_init;

/* Where a tensor-parallel rank's piece sits in the global tensor: this rank
 * holds [start, start + value.shape[axis]) along `axis` of a tensor of shape
 * `global` (every other extent equal). axis -1: the whole tensor (global ==
 * value's shape). Checkpoints store the global tensor and this rank's ranges
 * of it, so any tensor-parallel degree restores any other. */
typedef struct dsc_param_shard {
    int axis;
    int64_t start;
    int64_t global[DSC_MAX_DIMS];
} dsc_param_shard;

typedef struct dsc_param {
    char name[DSC_PARAM_NAME_MAX]; /* global name, e.g. "layers.7.attn.qkv.weight" */
    dsc_tensor value;              /* f32, this rank's copy (a view into the flat buffer) */
    dsc_tensor grad;               /* f32, same shape; accumulates over micro-batches */
    uint32_t flags;                /* dsc_param_flag bits */
    dsc_param_group group;
    int64_t offset; /* element offset of value/grad inside the group's flat buffer */
    dsc_param_init init;
    float init_std;
    dsc_param_shard shard; /* axis -1 unless declared with dsc_params_declare_shard */
} dsc_param;

typedef struct dsc_param_store dsc_param_store;

DSC_API dsc_status dsc_params_create(dsc_param_store **out, dsc_device device, uint64_t seed);
DSC_API void dsc_params_destroy(dsc_param_store *store);

/* Declares a parameter. Declaring an existing name with the same shape returns
 * the same parameter (that is how tied weights are shared inside one stage);
 * a different shape is an error naming the parameter. Views are valid only
 * after dsc_params_finalize. */
DSC_API dsc_status dsc_params_declare(dsc_param_store *store, const char *name, int ndim, const int64_t *shape,
                                      uint32_t flags, dsc_param_init init, float init_std, dsc_param **out);
/* Declares this rank's piece [start, start + count) along `axis` of a global
 * tensor of shape `global` (tensor parallelism). Its initial values are that
 * piece of the values the whole tensor gets, so a sharded model starts from
 * the weights of the unsharded one. Redeclaring the same piece returns the
 * same parameter (tied weights); another piece is an error. */
DSC_API dsc_status dsc_params_declare_shard(dsc_param_store *store, const char *name, int ndim,
                                            const int64_t *global, int axis, int64_t start, int64_t count,
                                            uint32_t flags, dsc_param_init init, float init_std, dsc_param **out);
/* Elements of the global tensor a (possibly sharded) parameter is part of. */
DSC_API int64_t dsc_param_global_numel(const dsc_param *param);
/* Allocates the flat buffers (params and grads categories), points every
 * parameter at its slice, and initialises values. Initial values depend only
 * on (seed, name), never on the parallel layout. */
DSC_API dsc_status dsc_params_finalize(dsc_param_store *store);

DSC_API int dsc_params_count(const dsc_param_store *store);
DSC_API dsc_param *dsc_params_at(dsc_param_store *store, int index); /* declaration order */
DSC_API dsc_param *dsc_params_find(dsc_param_store *store, const char *name);
/* Flat views of one group's values and grads (numel 0 when the group is empty).
 * Each parameter starts at a multiple of 64 elements (256 bytes, aligned for
 * vector loads on every backend); the gaps are zero in values and grads and
 * stay zero under any elementwise optimizer, so the flat buffers can be
 * reduced and partitioned as a whole. */
DSC_API void dsc_params_flat(dsc_param_store *store, dsc_param_group group, dsc_tensor *values, dsc_tensor *grads);
DSC_API int64_t dsc_params_numel(const dsc_param_store *store,
                                 dsc_param_group group); /* flat length, gaps included */
DSC_API int64_t dsc_param_numel(const dsc_param *param); /* elements of one parameter */
/* Elements of the whole model this store is one rank's part of: each
 * parameter's global size (a tensor-parallel piece counts its whole tensor),
 * each DSC_PARAM_EXPERT one counted ep_size times (the ep_size ranks of an
 * expert-parallel group hold disjoint experts of the same shapes). */
DSC_API int64_t dsc_params_model_numel(const dsc_param_store *store, int ep_size);
/* Elements the store itself holds (pieces as held, gaps excluded). */
DSC_API int64_t dsc_params_held_numel(const dsc_param_store *store);
DSC_API dsc_status dsc_params_zero_grads(dsc_param_store *store);
/* Frees a group's flat value and/or gradient buffer after finalize, for an
 * optimizer that keeps them elsewhere (ZeRO-2 keeps gradient shards, ZeRO-3
 * parameter shards too). The parameters' views of a released buffer get data
 * NULL, which the optimizer repoints around layer calls; dsc_params_flat then
 * returns data NULL for it and dsc_params_zero_grads skips it. */
DSC_API dsc_status dsc_params_release(dsc_param_store *store, dsc_param_group group, bool values, bool grads);

/* ---- layers -------------------------------------------------------------------------- */

/* What a layer call needs besides its input: the micro-batch's labels, the
 * scale of its loss in the step objective, and where to report losses. */
typedef struct dsc_micro_ctx {
    const dsc_tensor *tokens;  /* (B, T) i32 inputs of this micro-batch (first stage) */
    const dsc_tensor *targets; /* (B, T) i32 labels, -1 = ignore (stage with the loss layer) */
    float loss_scale;          /* d(step objective) / d(this micro-batch's mean loss), e.g. 1/M */
    bool training;
    double loss;     /* out: mean cross-entropy of the micro-batch (loss layer) */
    double aux_loss; /* out: auxiliary losses already multiplied by their coefficients */
    dsc_rng *rng;    /* per-rank stream for stochastic layers (gate noise), may be NULL */
} dsc_micro_ctx;

typedef struct dsc_layer dsc_layer;

typedef struct dsc_layer_ops {
    const char *type;
    /* Allocates activation storage for `slots` micro-batches of (B, T) tokens. */
    dsc_status (*reserve)(dsc_layer *self, int slots, int64_t B, int64_t T);
    /* Runs micro-batch `slot`; *out becomes a view of the layer's output buffer
     * for that slot, valid until the slot's next forward. The embedding layer
     * reads ctx->tokens and ignores `in`; the loss layer writes its per-token
     * losses to *out and ctx->loss. The caller may reuse `in` once forward
     * returns: a layer copies what its backward needs. */
    dsc_status (*forward)(dsc_layer *self, int slot, const dsc_tensor *in, dsc_tensor *out, dsc_micro_ctx *ctx);
    /* Accumulates parameter gradients and sets *din (a view, empty for the
     * first layer). The loss layer ignores dout and uses ctx->loss_scale.
     * *din is a per-slot buffer: it stays valid until the slot's next backward,
     * so a pipeline stage can still send it after later backwards ran. */
    dsc_status (*backward)(dsc_layer *self, int slot, const dsc_tensor *dout, dsc_tensor *din, dsc_micro_ctx *ctx);
    void (*destroy)(dsc_layer *self);
    /* Optional: frees what reserve allocated (no forward pending); reserve
     * again before the next forward. A checkpointed block holds its
     * feed-forward layer's activations only while it runs (runtime/nn/block.c). */
    void (*release)(dsc_layer *self);
    /* Optional: the type (bf16 / fp16) to keep, from the next reserve on, the
     * activations the backward reads only as operands of matrix products, in
     * a layer whose products round to that type (mixed precision: such a
     * tensor is exact in it, so the backward's results stay bit for bit);
     * f32 keeps them in f32. A layer without it keeps f32. */
    void (*set_saved_dtype)(dsc_layer *self, dsc_dtype dtype);
} dsc_layer_ops;

/* Implementations embed this as their first member. */
struct dsc_layer {
    const dsc_layer_ops *ops;
    char name[64];        /* "layers.3", "embed", "head" */
    dsc_param **params;   /* the parameters this layer reads (owned array) */
    uint32_t *param_uses; /* how it reads each (dsc_param_use bits; owned, n_params entries) */
    int n_params;
    int64_t activation_bytes_per_token; /* for partition summaries and memory estimates */
    /* Its backward reads its input only as an operand of matrix products, which round it to the
     * mixed-precision type anyway: a caller may keep the input in 2 bytes and widen it back into
     * the same memory just before the backward (the dense MLP; not the MoE layer, whose router
     * reads its input in f32). */
    bool input_read_by_products_only;
    /* Set by dsc_layer_reserve: slot count and the largest micro-batch (B, T) a
     * forward accepts; a forward may run a smaller (b <= B, t <= T) batch. */
    int slots;
    int64_t max_B, max_T;
};

/* One layer's share of a profiled region (the FLOPs profiler): its local
 * parameters, and the wall time and kernel FLOPs (dsc_kernel_flop_count) of
 * its forward and backward calls, children included; depth 0 for a layer
 * the runner calls, 1 for one a layer calls, and so on. */
typedef struct dsc_layer_profile {
    const dsc_layer *layer;
    char name[64];
    const char *type;
    int depth;
    int64_t params;
    double fwd_s, bwd_s;
    int64_t fwd_flops, bwd_flops;
    int fwd_calls, bwd_calls;
} dsc_layer_profile;

/* Opens a profile: until dsc_layer_profile_end, every dsc_layer_forward and
 * dsc_layer_backward of this process is recorded. Not thread-safe: one
 * profile at a time, layers run on one thread. */
DSC_API void dsc_layer_profile_begin(void);
/* Closes the profile and hands over its rows (in first-call order; the
 * caller frees *rows). */
DSC_API dsc_status dsc_layer_profile_end(dsc_layer_profile **rows, int *n);

/* ops->set_saved_dtype when the layer has it (runners: the mixed-precision dtype, before reserve). */
DSC_API void dsc_layer_set_saved_dtype(dsc_layer *layer, dsc_dtype dtype);

/* `count` f32 activation buffers of one shape, for a layer's slots
 * (released with dsc_buffers_free, which also takes a partial table). */
DSC_API dsc_status dsc_buffers_alloc(dsc_tensor **bufs, int count, int ndim, const int64_t *shape,
                                     dsc_device device);
DSC_API void dsc_buffers_free(dsc_tensor **bufs, int count);

/* y (N, OC) = x (N, C) @ w^T + bias with w (OC, C); bias may be NULL. Tensors of any
 * shape are read as matrices with C (x, dx) or OC (y, dy) columns. */
DSC_API dsc_status dsc_param_linear_forward(dsc_tensor *y, const dsc_tensor *x, const dsc_param *w,
                                            const dsc_param *bias);
/* The same with GELU fused into its epilogue (dsc_kernel_linear_gelu_forward): y as above and
 * act = gelu(y), both shaped like y. */
DSC_API dsc_status dsc_param_linear_gelu_forward(dsc_tensor *act, dsc_tensor *y, const dsc_tensor *x,
                                                 const dsc_param *w, const dsc_param *bias);
/* t (f32) rounded in place to the calling thread's product type (dsc_kernels_get_matmul_dtype) where
 * the kernels compute in it (a CPU tensor): a value a bf16 / fp16 model stores, as the layers store
 * what their products compute before the next operation reads it (the feed-forward's fc, gate and
 * up outputs: dsc_param_linear_gelu_forward's kernel rounds its own; the head's logits) and the
 * block its input and residual sum. Unchanged under f32 products, on other devices, whose products
 * keep f32, and for a tensor stored in 2 bytes, whose values are of the type already. */
DSC_API void dsc_round_to_product_type(dsc_tensor *t);
/* to = from element for element, one of them f32 and the other bf16 / f16 (CPU tensors of one
 * element count): rounded to nearest even, or widened, over the kernels' threads. How layers keep
 * activations in 2 bytes (dsc_layer_set_saved_dtype) and read them back. */
DSC_API void dsc_activations_convert(dsc_tensor *to, const dsc_tensor *from);
/* Parameter gradients of a linear, and dx = dy @ w: overwritten, or added to dx
 * when `accumulate` (how one input feeding several linears sums its gradient). */
DSC_API dsc_status dsc_param_linear_backward(dsc_tensor *dx, bool accumulate, dsc_param *w, dsc_param *bias,
                                             const dsc_tensor *dy, const dsc_tensor *x);

DSC_API dsc_status dsc_layer_reserve(dsc_layer *layer, int slots, int64_t B, int64_t T);
/* Frees the layer's reserved activations when its type can (ops->release);
 * returns whether it did. */
DSC_API bool dsc_layer_release(dsc_layer *layer);
DSC_API dsc_status dsc_layer_forward(dsc_layer *layer, int slot, const dsc_tensor *in, dsc_tensor *out,
                                     dsc_micro_ctx *ctx);
DSC_API dsc_status dsc_layer_backward(dsc_layer *layer, int slot, const dsc_tensor *dout, dsc_tensor *din,
                                      dsc_micro_ctx *ctx);
DSC_API void dsc_layer_destroy(dsc_layer *layer);
/* Records the parameters a layer reads and how (dsc_param_use bits per parameter; NULL: all 0, read in
 * every way); both arrays are copied. */
DSC_API dsc_status dsc_layer_set_params(dsc_layer *layer, dsc_param *const *params, const uint32_t *uses, int n);
DSC_API int64_t dsc_layer_param_numel(const dsc_layer *layer);

#ifdef __cplusplus
}
#endif
#endif
