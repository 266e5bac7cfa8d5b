/* dsc/moe.h — Mixture-of-Experts: expert feed-forward banks, the MoE layer
 * with expert parallelism, and the "moe_block" layer type.
 *
 * The MoE layer maps (b, t, M) to (b, t, M) as DeepSpeed's MOELayer does:
 * router logits x @ Wg^T, the gate (dsc/moe_gate.h) picks K experts per
 * token, the kept routes are dispatched into an (E, Cap, M) buffer, an
 * all-to-all over the expert-parallel group brings every rank the rows of
 * its E_loc = E / ep experts, the experts run as batched GEMMs, a second
 * all-to-all returns the rows, and the combine weights mix them back into
 * token order. Backward runs the same path in reverse, with the same two
 * all-to-alls; the gate loss (aux_loss_coef * l_aux + z_loss_coef * z_loss)
 * is added to the micro-batch objective and reported in ctx->aux_loss.
 * docs/moe.md has the data flow, the gradient scaling rule for experts and
 * the requirements (every rank of an expert-parallel group runs the same
 * number of MoE forwards with the same token count S).
 *
 * Parameter names use GLOBAL expert indices
 * ("layers.3.moe.experts.5.fc.weight"), so a checkpoint written with one
 * ep_size restores into another by name; expert parameters carry
 * DSC_PARAM_EXPERT, the router ("layers.3.moe.gate.weight") and the residual
 * MLP are dense.
 *
 * Not here: the gate's routing rules (dsc/moe_gate.h), which ranks form the
 * groups (dsc/topology.h), the gradient reduction (dsc/optimizer.h).
 *
 * Dimension letters: S tokens of a forward (b*t), M model width, F expert
 * hidden width, E experts, E_loc experts on this rank, ep expert-parallel
 * size, K routes per token, Cap slots per expert, R rows per expert. */
#ifndef DSC_MOE_H
#define DSC_MOE_H

#include "dsc/api.h"
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "dsc/comm.h"
#include "dsc/config.h"
#include "dsc/model.h"
#include "dsc/moe_gate.h"
#include "dsc/nn.h"
#include "dsc/status.h"
#include "dsc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsc_moe_expert_kind {
    DSC_MOE_EXPERT_KIND_GELU = 0, /* fc (F, M) + bias, GELU, proj (M, F) + bias: GPT's MLP */
    DSC_MOE_EXPERT_KIND_SWIGLU    /* gate, up (F, M), down (M, F), no biases: Llama / Mixtral */
} dsc_moe_expert_kind;

/* ---- expert banks ------------------------------------------------------------------
 * `count` feed-forward networks of one shape, run together as batched GEMMs
 * over an (count, R, M) input: row block e goes through FFN e. The MoE layer
 * holds one bank of E_loc experts; its residual MLP is a bank of one. */

typedef struct dsc_moe_experts_options {
    dsc_moe_expert_kind kind;
    int64_t d_model;    /* M */
    int64_t d_ff;       /* F */
    int count;          /* FFNs in the bank (E_loc) */
    int first;          /* global index of the first ("<prefix>.<first + i>.<leaf>"); -1: one unnumbered FFN */
    uint32_t flags;     /* DSC_PARAM_EXPERT for experts; 0 for a dense FFN */
    float init_std;     /* input projections */
    float init_std_out; /* output projection */
    /* Expert tensor parallelism (DeepSpeed's enable_expert_tensor_parallelism):
     * ff_global > 0 makes d_ff this bank's hidden columns [ff_start, ff_start +
     * d_ff) of each FFN's ff_global: the input projections (and fc's bias) are
     * declared as row pieces of the global tensors, the output projection as a
     * column piece, its bias whole. The output is then one rank's part of a sum
     * over the tensor group, so only tp_rank 0 adds the output bias; its
     * gradient is the whole one on every rank. ff_global 0: whole FFNs. */
    int64_t ff_global, ff_start;
    int tp_rank;
} dsc_moe_experts_options;

typedef struct dsc_moe_experts dsc_moe_experts;

/* Declares the parameters "<prefix>[.<index>].{fc,proj}.{weight,bias}" (GELU)
 * or "...{gate,up,down}.weight" (SwiGLU), kind by kind so that a kind's
 * tensors of consecutive experts lie back to back in the flat buffer. */
DSC_API dsc_status dsc_moe_experts_create(const dsc_moe_experts_options *o, const char *prefix,
                                          dsc_param_store *store, dsc_device device, dsc_moe_experts **out);
DSC_API void dsc_moe_experts_destroy(dsc_moe_experts *x);
/* The type the bank keeps each FFN's pre-activation (fc, or gate and up) and
 * activation in between a forward and its backward: bf16 / f16 on the CPU
 * under mixed precision (values of that type: the products round the
 * activation, dsc_round_to_product_type the others), else f32. Call before
 * dsc_moe_experts_reserve. */
DSC_API dsc_dtype dsc_moe_experts_set_saved_dtype(dsc_moe_experts *x, dsc_dtype dtype); /* returns that type */
/* Activation storage for `slots` pending calls of at most `rows` rows per FFN.
 * Call after dsc_params_finalize. */
DSC_API dsc_status dsc_moe_experts_reserve(dsc_moe_experts *x, int slots, int64_t rows);
/* out (count, R, M) = FFN_e(in (count, R, M)) for every e. `in` must stay
 * unchanged until the slot's backward (the bank keeps a view). */
DSC_API dsc_status dsc_moe_experts_forward(dsc_moe_experts *x, int slot, const dsc_tensor *in, dsc_tensor *out);
/* din (count, R, M) is overwritten; parameter gradients accumulate
 * grad_scale times the gradient of sum(dout * out). */
DSC_API dsc_status dsc_moe_experts_backward(dsc_moe_experts *x, int slot, const dsc_tensor *dout, dsc_tensor *din,
                                            float grad_scale);
/* The same for FFNs [first, first + n) of the bank only, `in` / `dout` and
 * `out` / `din` still the whole (count, R, M) tensors (only the range's rows
 * are read and written): a slot's FFNs computed in several calls, in any
 * grouping, each range once per pass (the MoE layer overlaps its
 * all-to-alls with them). */
DSC_API dsc_status dsc_moe_experts_forward_part(dsc_moe_experts *x, int slot, int first, int n,
                                                const dsc_tensor *in, dsc_tensor *out);
DSC_API dsc_status dsc_moe_experts_backward_part(dsc_moe_experts *x, int slot, int first, int n,
                                                 const dsc_tensor *dout, dsc_tensor *din, float grad_scale);
DSC_API int dsc_moe_experts_param_count(const dsc_moe_experts *x);
DSC_API dsc_param *const *dsc_moe_experts_params(const dsc_moe_experts *x);

/* ---- the MoE layer ---------------------------------------------------------------- */

typedef struct dsc_moe_options {
    int num_experts; /* E */
    dsc_moe_gate_config gate;
    bool use_residual; /* PR-MoE: out = a * moe(x) + b * mlp(x), (a, b) = softmax(x @ Wc^T + bc) */
    dsc_moe_expert_kind expert_kind;
    /* DeepSpeed's enable_expert_tensor_parallelism: every expert split by
     * width over `expert_tp` (the tensor-parallel group, whose ranks see the
     * same tokens), this rank holding hidden columns [tp_f0, tp_f0 + tp_nf) of
     * d_ff; the experts' output and input gradient are all-reduced over it
     * (Megatron's MLP inside each expert). NULL: experts whole. The residual
     * MLP and the router stay whole. Not set by dsc_moe_options_from_config:
     * the caller that forms the groups fills it. */
    dsc_comm *expert_tp;
    int64_t tp_f0, tp_nf;
    /* The exchanges with the expert-parallel group as point-to-point messages
     * in flight while this rank's own share of the tokens runs through its
     * experts (half before the other ranks' shares, half after), instead of
     * two blocking all-to-alls each way; bitwise the same results. */
    bool overlap_alltoall;
} dsc_moe_options;

/* The config's moe section as layer options: GELU experts for gpt-moe,
 * SwiGLU for mixtral; errors name the config key (moe.k > moe.num_experts,
 * moe.capacity_factor <= 0, ...). */
DSC_API dsc_status dsc_moe_options_from_config(const dsc_config_moe *cfg, dsc_model_arch arch,
                                               dsc_moe_options *out);

/* Checks an expert-parallel layout before any group exists: ep_size >= 1
 * dividing both the number of experts and the ranks that share experts
 * (`ranks`: the world, or one pipeline stage). */
DSC_API dsc_status dsc_moe_check_parallel(int num_experts, int ep_size, int ranks);

/* The MoE feed-forward layer of block `block`, named "layers.<block>.moe",
 * with the experts of this rank's position in `ep` (NULL or size 1: all E
 * experts local). Widths and initialisation come from `mc` (d_model, d_ff,
 * init_std, n_layer). */
DSC_API dsc_status dsc_moe_layer_create(const dsc_moe_options *o, const dsc_model_config *mc, int block,
                                        dsc_param_store *store, dsc_device device, dsc_comm *ep, dsc_layer **out);

/* Where the layer's time goes (forward and backward together). */
typedef enum dsc_moe_phase {
    DSC_MOE_PHASE_GATE = 0, /* router GEMM, routing, gate backward */
    DSC_MOE_PHASE_DISPATCH, /* token rows into expert slots (and their gradient back) */
    DSC_MOE_PHASE_ALLTOALL, /* the all-to-alls over the expert-parallel group */
    DSC_MOE_PHASE_EXPERTS,  /* the expert GEMMs */
    DSC_MOE_PHASE_COMBINE,  /* weighted sum back to tokens, residual MLP, their gradients */
    DSC_MOE_PHASE_COUNT
} dsc_moe_phase;

DSC_API const char *dsc_moe_phase_name(dsc_moe_phase phase); /* "gate", "dispatch", ... */

/* Per-expert load of the layer's forwards (training and eval) on THIS rank's
 * tokens since the last reset, and the time per phase; the arrays are the
 * layer's and stay valid until the next forward or reset. */
typedef struct dsc_moe_stats {
    int num_experts;
    int64_t forwards;
    int64_t tokens;         /* tokens gated */
    int64_t dropped_tokens; /* tokens left with no kept route (only the residual carries them) */
    const int64_t *routed;  /* (E) routes chosen before dropping (DeepSpeed's exp_counts), summed */
    const int64_t *kept;    /* (E) */
    const int64_t *dropped; /* (E) */
    double l_aux;           /* sum over forwards */
    double z_loss;          /* sum over forwards */
    int64_t capacity;       /* Cap of the last forward */
    double seconds[DSC_MOE_PHASE_COUNT];
} dsc_moe_stats;

/* `layer` is a MoE layer or a block whose feed-forward part is one (what the
 * "moe_block" factory builds); anything else is DSC_ERR_INVALID. */
DSC_API dsc_status dsc_moe_stats_get(const dsc_layer *layer, dsc_moe_stats *out);
DSC_API dsc_status dsc_moe_stats_reset(dsc_layer *layer);

/* Collective over `world`: sums the per-expert stats (routes chosen, kept,
 * dropped) of the MoE layers among `layers` (this rank's, any others are
 * skipped) over every rank and prints one line per MoE layer of the L-block
 * model on rank 0: "layers.i:  e0 chosen/kept/dropped (share%) ...". The
 * ranks of `tensor_group` (this rank's tensor-parallel group, NULL without
 * one) gate the same tokens: only its rank 0's counts are added. */
DSC_API dsc_status dsc_moe_report_load(dsc_comm *world, dsc_comm *tensor_group, int L, int E,
                                       dsc_layer *const *layers, int n, FILE *out);

/* ---- the "moe_block" layer type ------------------------------------------------------ */

/* What the "moe_block" factory reads from dsc_build_ctx.extra. */
typedef struct dsc_moe_build_extra {
    dsc_moe_options options;
    dsc_comm *ep; /* this rank's expert-parallel group (of its pipeline stage); NULL: every expert local */
} dsc_moe_build_extra;

/* Registers "moe_block": a pre-norm block (dsc_block_create) whose
 * feed-forward part is the MoE layer. Idempotent. */
DSC_API dsc_status dsc_moe_register_layers(void);

#ifdef __cplusplus
}
#endif
#endif
