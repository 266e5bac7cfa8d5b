/* runtime/nn private: the pieces the dense layers are assembled from.
 *
 * Norm and attention are components, not layers: they own per-slot saved
 * activations and shared backward scratch, but their backward is handed the
 * component's input again by the owning layer (the block keeps it), so no
 * activation is stored twice. The dense MLP is a full layer because the
 * block treats its feed-forward part as a pluggable layer (moe/ swaps in its
 * own). Nothing here is visible outside runtime/nn.
 *
 * Dimension letters: B, T reserved batch and sequence; b, t the running
 * micro-batch (b <= B, t <= T); N = b*t rows; C channels; NH, NKV heads;
 * HS head size; KV = NKV*HS; F MLP width; V vocabulary. */
#ifndef DSC_RUNTIME_NN_INTERNAL_H
#define DSC_RUNTIME_NN_INTERNAL_H

#include "dsc/model.h"
#include "dsc/nn.h"

/* Enough for a block: 2 norms (2 each), q/k/v/o (2 each) and a 3-matrix MLP. */
#define NN_MAX_LAYER_PARAMS 48

/* ---- the FLOPs profiler's recorder (layer_profile.c) ------------------------------------ */

/* Where a profiled layer call started; row -1 when no profile is open. */
typedef struct nn_profile_mark {
    int row;
    double t0;
    int64_t flops0;
} nn_profile_mark;

/* Around every layer forward / backward: records the call's time and FLOPs. */
nn_profile_mark nn_profile_enter(const dsc_layer *layer);
void nn_profile_leave(nn_profile_mark mark, bool backward);

/* ---- shared helpers (layer.c) --------------------------------------------------------- */

/* The parameters a layer is collecting while it declares them. */
typedef struct nn_param_list {
    dsc_param *items[NN_MAX_LAYER_PARAMS];
    uint32_t uses[NN_MAX_LAYER_PARAMS]; /* how the layer reads each (dsc_param_use) */
    int n;
} nn_param_list;

/* Declares a parameter named "<prefix>.<leaf>" and appends it to `list`, read in every way. */
dsc_status nn_declare(nn_param_list *list, dsc_param_store *store, const char *prefix, const char *leaf, int ndim,
                      const int64_t *shape, uint32_t flags, dsc_param_init init, float init_std, dsc_param **out);
/* The same for a weight the layer reads only as `uses` says (dsc_param_use bits). */
dsc_status nn_declare_used(nn_param_list *list, dsc_param_store *store, const char *prefix, const char *leaf,
                           int ndim, const int64_t *shape, uint32_t flags, uint32_t uses, dsc_param_init init,
                           float init_std, dsc_param **out);
/* The layer's parameters and their uses from `list`. */
dsc_status nn_set_params(dsc_layer *layer, const nn_param_list *list);

/* The leading elements of `buf` seen with another (smaller or equal) shape. */
dsc_tensor nn_view(const dsc_tensor *buf, int ndim, const int64_t *shape);
/* `t` as a matrix (numel / cols, cols); nn_rows keeps the last dimension as cols. */
dsc_tensor nn_matrix(const dsc_tensor *t, int64_t cols);
dsc_tensor nn_rows(const dsc_tensor *t);

/* ---- saved activations in 2 bytes (dsc_layer_ops.set_saved_dtype) ------------------------- */

/* The saved type a layer keeps: `dtype` when it is bf16 / fp16 and the layer runs on the CPU
 * (whose products round to it under mixed precision), else f32. */
dsc_dtype nn_saved_dtype(dsc_dtype dtype, dsc_device device);
/* dsc_buffers_alloc in `dtype` (f32, bf16 or f16). */
dsc_status nn_buffers_alloc_as(dsc_tensor **bufs, int count, int ndim, const int64_t *shape, dsc_device device,
                               dsc_dtype dtype);
/* saved (2-byte) = value (f32, same element count) rounded, over the kernels' threads. */
void nn_saved_store(dsc_tensor *saved, const dsc_tensor *value);
/* value (f32) = saved widened, over the kernels' threads; the inverse of nn_saved_store. */
void nn_saved_load(dsc_tensor *value, const dsc_tensor *saved);
/* The f32 `value` a slot keeps in `kept` (a view of the same element count): stored rounded where
 * kept is 2-byte; nothing where it is f32, as value is then kept itself. */
void nn_keep(dsc_tensor kept, const dsc_tensor *value);
/* dst = src rounded to the product type as dsc_round_to_product_type rounds dst (a copy where it
 * does not round), in one pass. */
dsc_status nn_copy_rounded(dsc_tensor *dst, const dsc_tensor *src);
/* What `kept` holds, in f32: itself, or widened into `into` (f32, the same element count). */
dsc_tensor nn_widened(const dsc_tensor *kept, dsc_tensor into);

/* ---- the layers' workspace: per-call temporaries one process shares -------------------- */

/* f32 buffers a layer uses only during one of its calls (a backward's input-gradient pieces, a
 * forward's values before they are stored), shared by every layer of a kind: layers run one at a
 * time, and a kind never runs inside itself, so each kind has its own range. One layer's worth for
 * the whole model, where each layer kept its own (GPT-2 small: 264 of 677 MB of activations). */
enum {
    NN_WORK_BLOCK = 0,     /* 2 of (B, T, C): the attention's output or dh; dresid */
    NN_WORK_ATTN = 2,      /* 4 of (B, T, C): datt, dq, dk, dv; then 4 more: q, k, v, att widened */
    NN_WORK_MLP = 10,      /* 3 of (B, T, F): dact, dpre, dup */
    NN_WORK_MLP_IO = 13,   /* 2 of (B, T, C): the MLP's output and input gradient, which the block reads at once */
    NN_WORK_BLOCK_IN = 15, /* (B, T, C): norm1's or norm2's output in f32 where the block keeps it in 2 bytes */
    NN_WORK_COUNT = 16
};
/* One hold on the workspace, taken before growing it; the last hold dropped frees it. */
void nn_work_hold(void);
void nn_work_drop(void);
/* Buffers [first, first + count) grown to at least `numel` floats on `device` (counted as
 * activations). Fails on memory, or when the workspace is on another device. */
dsc_status nn_work_grow(int first, int count, int64_t numel, dsc_device device);
/* Buffer `which` seen as `shape` (it must fit: the caller's hold said so). */
dsc_tensor nn_work_at(int which, int ndim, const int64_t *shape);

/* Checks that `in` is (b, t, C) f32 with b <= max_B, t <= max_T. */
dsc_status nn_check_input(const dsc_layer *layer, const dsc_tensor *in, int64_t C);

/* True for the Llama family (RMSNorm, RoPE, SwiGLU, no linear biases). */
bool nn_arch_is_llama(const dsc_model_config *mc);

/* ---- norm component (norm.c): LayerNorm (GPT) or RMSNorm (Llama) ------------------------ */

typedef struct nn_norm {
    dsc_param *weight; /* (C) */
    dsc_param *bias;   /* (C), NULL for RMSNorm */
    float eps;
    int64_t C;
    int slots;
    dsc_tensor *mean; /* [slots] (B*T), LayerNorm only */
    dsc_tensor *rstd; /* [slots] (B*T) */
} nn_norm;

dsc_status nn_norm_init(nn_norm *n, nn_param_list *list, dsc_param_store *store, const char *prefix,
                        const dsc_model_config *mc);
dsc_status nn_norm_reserve(nn_norm *n, int slots, int64_t B, int64_t T, dsc_device device);
/* x, out (b, t, C). */
dsc_status nn_norm_forward(nn_norm *n, int slot, const dsc_tensor *x, dsc_tensor *out);
/* dx (b, t, C) overwritten; x is the same input the slot's forward saw. */
dsc_status nn_norm_backward(nn_norm *n, int slot, const dsc_tensor *x, const dsc_tensor *dout, dsc_tensor *dx);
void nn_norm_free(nn_norm *n);
int64_t nn_norm_saved_floats_per_token(const nn_norm *n);

/* ---- causal self-attention component (attention.c) ------------------------------------- */

typedef struct nn_attention {
    dsc_param *wq, *wk, *wv, *wo; /* (C, C), (KV, C), (KV, C), (C, C) */
    dsc_param *bq, *bk, *bv, *bo; /* NULL when the config has no such bias */
    int64_t C, NH, NKV, HS;
    bool rope;
    float rope_theta;
    int slots;
    dsc_tensor *q, *k, *v; /* [slots] (B, T, NH, HS), (B, T, NKV, HS) x2; after RoPE */
    dsc_tensor *att;       /* [slots] (B, T, NH, HS) attention output before the o projection */
    dsc_tensor *lse;       /* [slots] (B, NH, T) */
    bool holds_work;       /* a hold on the workspace's NN_WORK_ATTN buffers (nn_work_hold) */
    dsc_dtype saved;       /* the type q, k, v, att are kept in (f32; bf16 / fp16 under mixed precision) */
    dsc_tensor positions;  /* (T) i32: 0..T-1, RoPE only */
} nn_attention;

dsc_status nn_attention_init(nn_attention *a, nn_param_list *list, dsc_param_store *store, const char *prefix,
                             const dsc_model_config *mc);
/* Reserves `slots` slots of (B, T), the saved tensors in a->saved (nn_saved_dtype). */
dsc_status nn_attention_reserve(nn_attention *a, int slots, int64_t B, int64_t T, dsc_device device);
/* x, y (b, t, C). */
dsc_status nn_attention_forward(nn_attention *a, int slot, const dsc_tensor *x, dsc_tensor *y);
/* dx (b, t, C) overwritten; x is the input the slot's forward saw. */
dsc_status nn_attention_backward(nn_attention *a, int slot, const dsc_tensor *x, const dsc_tensor *dy,
                                 dsc_tensor *dx);
void nn_attention_free(nn_attention *a);
int64_t nn_attention_saved_bytes_per_token(const nn_attention *a);

/* ---- dense MLP layer (mlp.c): GELU fc/proj (GPT) or SwiGLU gate/up/down (Llama) -------- */

/* Builds the MLP of block `block` (parameters "layers.<block>.mlp.*"). */
dsc_status nn_mlp_create(const dsc_model_config *mc, dsc_param_store *store, dsc_device device, int block,
                         dsc_layer **out);

/* ---- layer factories registered by models.c ------------------------------------------ */

dsc_status nn_embedding_create(const dsc_layer_spec *spec, const dsc_build_ctx *ctx, dsc_layer **out);
dsc_status nn_head_create(const dsc_layer_spec *spec, const dsc_build_ctx *ctx, dsc_layer **out);

#endif
