/* dsc/kernels.h — the compute operations shared by training and inference.
 *
 * One function per operation over dsc_tensors. Each public function checks
 * dtypes and shapes once (errors name the operation and the argument), then
 * calls the backend of the tensors' device (its operation table is private,
 * core/backend.h); backends see raw pointers and extents only. All tensors of one call must
 * live on the same device. Kernels never allocate: scratch space, when an
 * operation needs it, is passed in by the caller.
 *
 * Conventions (llm.c's): activations are f32, row-major; a parameter gradient
 * ACCUMULATES (+=) into its buffer, so gradient accumulation over micro-batches
 * needs no extra pass; an input gradient is OVERWRITTEN unless the function
 * says otherwise. Linear weights are stored (out_features, in_features), as
 * PyTorch stores them, so fixtures and checkpoints map one to one.
 *
 * Dimension letters: N rows (B*T tokens), C channels, OC output channels,
 * B batch, T sequence, NH query heads, NKV key/value heads, HS head size,
 * V vocabulary, BT batch count of a batched GEMM.
 *
 * Thread-safety: calls on distinct tensors may come from several threads.
 * On a CUDA device every call is queued on that device's one compute stream
 * (in the order the calls are made); results that come back to the host
 * (sums, finiteness, id errors) synchronise it. dsc_kernels_set_num_threads
 * sets one process-global count: call it before starting threads. */
#ifndef DSC_KERNELS_H
#define DSC_KERNELS_H

#include "dsc/api.h"
#include <stdbool.h>
#include <stdint.h>

#include "dsc/status.h"
#include "dsc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Threads used by CPU kernels: DSC_NUM_THREADS, else OMP_NUM_THREADS, else all cores. */
DSC_API void dsc_kernels_set_num_threads(int n);
/* Floating-point operations the GEMM, linear and attention kernels have been
 * asked to do since the process started (2 per multiply-add; elementwise
 * kernels are not counted). Differences of two reads count a region. */
DSC_API int64_t dsc_kernel_flop_count(void);
DSC_API int dsc_kernels_get_num_threads(void);
/* A callback run at the start of every kernel call made by the thread that
 * installed it (other threads never see it); NULL removes it. The training
 * runner installs one for the last micro-batch's backward that moves the
 * optimizer's gradient reductions in flight on (MPI progresses them only
 * while they are tested). It runs with itself removed, so kernels it calls
 * do not call it again; what it fails at is for it to keep and report. */
typedef void (*dsc_kernels_progress_fn)(void *arg);
DSC_API void dsc_kernels_set_progress(dsc_kernels_progress_fn fn, void *arg);
/* The calling thread's callback and argument (NULL when none), for a caller that installs its own
 * for a while and chains to it (the MoE layer, inside the runner's backward). */
DSC_API void dsc_kernels_get_progress(dsc_kernels_progress_fn *fn, void **arg);
/* The type the calling thread's f32 matrix products multiply in (its own setting; other threads
 * keep theirs), as torch.autocast's bf16 matmuls and a GPU's fp16 GEMM with f32 accumulation:
 * DSC_DTYPE_BF16 / DSC_DTYPE_F16 round both operands of every dsc_kernel_gemm and linear product
 * to the type (nearest even; fp16 overflows to inf) and sum the products, exact in f32, in f32.
 * A gradient operand is rounded as it is: under fp16 it carries the loss scale already (the loss
 * was scaled). The CPU uses AVX-512 BF16's dot for prompt-sized bf16 products where it has it and
 * DSC_CPU_SIMD is "avx512bf16", or unset on AMD's cores (where the dot issues as often as an FMA),
 * and sgemm over rounded copies otherwise; the CUDA backend keeps f32. Under either type the CPU's
 * embedding lookup (dsc_kernel_embedding_forward) reads the rows it gathers rounded too, and its
 * attention (dsc_kernel_attention_forward / _backward) computes as a bf16 / fp16 flash attention:
 * q, k, v, the output gradient, each tile's probabilities and score gradients rounded before they
 * multiply, the output rounded. Any other dtype (the default): f32. Mixed-precision training sets
 * it for its layers' calls. Returns the previous setting. */
DSC_API dsc_dtype dsc_kernels_set_matmul_dtype(dsc_dtype dtype);
/* The calling thread's product type (f32, bf16 or f16), as dsc_kernels_set_matmul_dtype left it: for a
 * layer that rounds what its products compute as a bf16 / fp16 model's layer stores it. */
DSC_API dsc_dtype dsc_kernels_get_matmul_dtype(void);
/* The type the calling thread's parameter-gradient contributions are rounded to before they are
 * added (its own setting), as the gradient of a bf16 / fp16 parameter in autograd: DSC_DTYPE_BF16 /
 * DSC_DTYPE_F16 make dsc_kernel_linear_backward add round(dy^T @ x) to dw and round(sum_rows dy) to
 * dbias, and dsc_kernel_embedding_backward add each table row's sum of dout rounded; the sums
 * themselves are f32, what is added to the accumulator is in the type. Mixed-precision training
 * sets it for its layers' calls, so a layer whose parameters' gradients come only from these
 * (DSC_PARAM_USE_GRAD_ROUNDED_BY_KERNELS) needs no scratch to round its contribution in. Only the
 * CPU backend implements it; elsewhere those calls fail while it is set. Any other dtype (the
 * default): f32, added as summed. Returns the previous setting. */
DSC_API dsc_dtype dsc_kernels_set_grad_dtype(dsc_dtype dtype);

/* ---- matrix products ------------------------------------------------------
 * out = alpha * op(a) @ op(b) + beta * out (+ bias broadcast over rows).
 * 2-D: a (M, K) or (K, M) when trans_a; b (K, N) or (N, K) when trans_b; out (M, N).
 * 3-D: the same per leading batch index (BT, ., .) — a batched GEMM; bias (N) or NULL.
 * beta = 1 accumulates into out. */
DSC_API dsc_status dsc_kernel_gemm(dsc_tensor *out, const dsc_tensor *a, const dsc_tensor *b,
                                   const dsc_tensor *bias, bool trans_a, bool trans_b, float alpha, float beta);

/* Linear layer, y = x @ w^T + bias: x (N, C), w (OC, C), bias (OC) or NULL, y (N, OC).
 * x and y may also be (..., C) and (..., OC) with equal leading dimensions. On the CPU y may be
 * bf16 / f16 (mixed precision's logits): the operands multiply in the thread's product type and each
 * sum is rounded once into y, which never exists in f32 (an f32 panel of 4 MB at a time). */
DSC_API dsc_status dsc_kernel_linear_forward(dsc_tensor *y, const dsc_tensor *x, const dsc_tensor *w,
                                             const dsc_tensor *bias);
/* ---- narrow weights --------------------------------------------------------
 * A linear layer's weight (OC, C) may stay narrow in memory and be widened
 * in registers (inference: half or a quarter of the bytes per token):
 *   DSC_WEIGHT_BF16, DSC_WEIGHT_F16  2 bytes a value; tensor dtype bf16 / f16, shape (OC, C);
 *   DSC_WEIGHT_Q8_0  llama.cpp's Q8_0: per block of 32 values along C an f16
 *                    scale d and 32 int8 q (value d * q), 34 bytes a block;
 *                    tensor dtype u8, shape (OC, C / 32 * 34); C % 32 == 0.
 * The format follows from the tensor's dtype (f32, bf16, f16, u8 = Q8_0). */
typedef enum dsc_weight_format {
    DSC_WEIGHT_F32 = 0,
    DSC_WEIGHT_BF16,
    DSC_WEIGHT_F16,
    DSC_WEIGHT_Q8_0,
    DSC_WEIGHT_FORMAT_COUNT
} dsc_weight_format;

/* "f32", "bf16", "f16", "q8_0"; from_name is DSC_ERR_INVALID naming the choices. */
DSC_API const char *dsc_weight_format_name(dsc_weight_format format);
DSC_API dsc_status dsc_weight_format_from_name(const char *name, dsc_weight_format *out);
/* Bytes of one row of c values; 0 when c does not fit the format (Q8_0: c % 32 != 0). */
DSC_API size_t dsc_weight_row_bytes(dsc_weight_format format, int64_t c);
/* The dtype and column count of the tensor that holds an (OC, c) weight in `format`. */
DSC_API dsc_dtype dsc_weight_dtype(dsc_weight_format format);
DSC_API int64_t dsc_weight_cols(dsc_weight_format format, int64_t c);
/* Packs src (rows, c) f32 into dst (rows * row_bytes bytes) on the host: bf16 / f16 round to
 * nearest even; Q8_0 takes d = max|x| / 127 per block (rounded to f16) and q = round(x / d). */
DSC_API dsc_status dsc_weight_pack(void *dst, dsc_weight_format format, const float *src, int64_t rows, int64_t c);
/* Floats of workspace dsc_kernel_linear_forward_packed needs for `threads` threads when x has
 * more rows than one weight pass serves (0 for f32, which needs none). */
DSC_API int64_t dsc_kernel_linear_packed_workspace(dsc_weight_format format, int64_t c, int threads);
/* y (N, OC) = x (N, C) @ w^T + bias with w in any weight format (see above). Up to a few rows
 * (decode) the weight is streamed once for all of them, widened in registers; beyond, row
 * panels are widened into `workspace` (f32, dsc_kernel_linear_packed_workspace floats; NULL
 * for f32 weights) and multiplied as GEMMs, except bf16 weights on a CPU with AVX-512 BF16
 * (and DSC_CPU_SIMD unset), whose panels are packed there and multiplied by x rounded to bf16,
 * and Q8_0 weights on AVX-512 VNNI, multiplied by x quantised to Q8_0 as decode does. */
DSC_API dsc_status dsc_kernel_linear_forward_packed(dsc_tensor *y, const dsc_tensor *x, const dsc_tensor *w,
                                                    const dsc_tensor *bias, dsc_tensor *workspace);
/* The GELU MLP's first layer with its epilogue fused: y (N, OC) = x (N, C) @ w^T + bias (NULL:
 * none) and act = gelu(y) (dsc_kernel_gelu_forward's tanh form), computed from each block of y
 * while it is in cache (CPU) or in the one pass that adds the bias (CUDA). y is kept for the
 * backward (dsc_kernel_gelu_backward reads it). Under bf16 / fp16 products
 * (dsc_kernels_set_matmul_dtype, CPU) y is rounded to the type after the bias, before the GELU,
 * as a bf16 / fp16 linear's output is: act and the kept y are those of the rounded y. */
DSC_API dsc_status dsc_kernel_linear_gelu_forward(dsc_tensor *act, dsc_tensor *y, const dsc_tensor *x,
                                                  const dsc_tensor *w, const dsc_tensor *bias);
/* dx (N, C) = dy @ w (overwritten; NULL to skip), dw (OC, C) += dy^T @ x (NULL to skip, e.g. frozen),
 * dbias (OC) += sum_rows dy (NULL to skip); the two sums rounded under dsc_kernels_set_grad_dtype.
 * On the CPU dy may be bf16 / f16 (the logits' gradient), read widened; dbias then is refused. */
DSC_API dsc_status dsc_kernel_linear_backward(dsc_tensor *dx, dsc_tensor *dw, dsc_tensor *dbias,
                                              const dsc_tensor *dy, const dsc_tensor *x, const dsc_tensor *w);

/* ---- normalisation --------------------------------------------------------
 * x, out (N, C) (or (..., C), N = numel / C); weight (C); bias (C) or NULL;
 * mean, rstd (N) saved for backward (may be NULL in forward when no backward
 * follows). In backward dx is overwritten; dweight, dbias accumulate (NULL to skip). */
DSC_API dsc_status dsc_kernel_layernorm_forward(dsc_tensor *out, dsc_tensor *mean, dsc_tensor *rstd,
                                                const dsc_tensor *x, const dsc_tensor *weight,
                                                const dsc_tensor *bias, float eps);
DSC_API dsc_status dsc_kernel_layernorm_backward(dsc_tensor *dx, dsc_tensor *dweight, dsc_tensor *dbias,
                                                 const dsc_tensor *dout, const dsc_tensor *x,
                                                 const dsc_tensor *weight, const dsc_tensor *mean,
                                                 const dsc_tensor *rstd);
/* RMSNorm: out = x * rstd * weight; rstd (N) saved. */
DSC_API dsc_status dsc_kernel_rmsnorm_forward(dsc_tensor *out, dsc_tensor *rstd, const dsc_tensor *x,
                                              const dsc_tensor *weight, float eps);
DSC_API dsc_status dsc_kernel_rmsnorm_backward(dsc_tensor *dx, dsc_tensor *dweight, const dsc_tensor *dout,
                                               const dsc_tensor *x, const dsc_tensor *weight,
                                               const dsc_tensor *rstd);

/* ---- activations (elementwise, any shape) ----------------------------------
 * GELU is the tanh approximation (GPT-2's). SwiGLU: out = silu(gate) * up. Each output may be
 * the buffer of the input at its place (dx = x; dgate = gate and dup = up): a backward can
 * widen kept inputs into the buffers its gradients then overwrite. */
DSC_API dsc_status dsc_kernel_gelu_forward(dsc_tensor *out, const dsc_tensor *x);
DSC_API dsc_status dsc_kernel_gelu_backward(dsc_tensor *dx, const dsc_tensor *dout, const dsc_tensor *x);
DSC_API dsc_status dsc_kernel_silu_forward(dsc_tensor *out, const dsc_tensor *x);
DSC_API dsc_status dsc_kernel_silu_backward(dsc_tensor *dx, const dsc_tensor *dout, const dsc_tensor *x);
DSC_API dsc_status dsc_kernel_swiglu_forward(dsc_tensor *out, const dsc_tensor *gate, const dsc_tensor *up);
DSC_API dsc_status dsc_kernel_swiglu_backward(dsc_tensor *dgate, dsc_tensor *dup, const dsc_tensor *dout,
                                              const dsc_tensor *gate, const dsc_tensor *up);

/* Row softmax over the last dimension: x, out (N, C); out may alias x. */
DSC_API dsc_status dsc_kernel_softmax(dsc_tensor *out, const dsc_tensor *x);

/* ---- attention --------------------------------------------------------------
 * Causal self-attention with online softmax over key blocks, so no more than a
 * block of the (T, T) score matrix ever exists. Grouped-query: NH % NKV == 0,
 * query head h reads key/value head h / (NH / NKV).
 * q, out (B, T, NH, HS); k, v (B, T, NKV, HS); lse (B, NH, T) log-sum-exp of
 * each query row, saved for backward. Scale is 1/sqrt(HS). */
DSC_API dsc_status dsc_kernel_attention_forward(dsc_tensor *out, dsc_tensor *lse, const dsc_tensor *q,
                                                const dsc_tensor *k, const dsc_tensor *v);
/* dq (B, T, NH, HS), dk, dv (B, T, NKV, HS) are overwritten. */
DSC_API dsc_status dsc_kernel_attention_backward(dsc_tensor *dq, dsc_tensor *dk, dsc_tensor *dv,
                                                 const dsc_tensor *dout, const dsc_tensor *q, const dsc_tensor *k,
                                                 const dsc_tensor *v, const dsc_tensor *out,
                                                 const dsc_tensor *lse);

/* ---- rotary position embedding ----------------------------------------------
 * x, out (B, T, NH, HS) with HS even; positions (T) i32; rotate-half pairing
 * (i, i + HS/2) as Llama / Hugging Face do; freq_i = theta^(-2i/HS).
 * `inverse` rotates by the negative angle, which is RoPE's backward.
 * out may alias x. */
DSC_API dsc_status dsc_kernel_rope(dsc_tensor *out, const dsc_tensor *x, const dsc_tensor *positions, float theta,
                                   bool inverse);

/* ---- embeddings ---------------------------------------------------------------
 * tokens (B, T) i32; wte (V, C); wpe (Tmax, C) or NULL; out (B, T, C).
 * Token ids outside [0, V) are an error naming the first bad id. */
DSC_API dsc_status dsc_kernel_embedding_forward(dsc_tensor *out, const dsc_tensor *tokens, const dsc_tensor *wte,
                                                const dsc_tensor *wpe);
/* dwte (V, C) and dwpe (Tmax, C) (NULL to skip) accumulate by scatter-add; under
 * dsc_kernels_set_grad_dtype each row's sum over the positions that read it is rounded first. */
DSC_API dsc_status dsc_kernel_embedding_backward(dsc_tensor *dwte, dsc_tensor *dwpe, const dsc_tensor *dout,
                                                 const dsc_tensor *tokens);

/* ---- fused softmax + cross-entropy ------------------------------------------------
 * logits (N, V); targets (N) i32, a target < 0 is ignored (loss 0, no gradient);
 * losses (N) per-row loss.
 * Backward: dlogits (N, V) = (softmax(logits) - onehot(target)) * dloss; dlogits
 * may alias logits (saves a (N, V) buffer). On the CPU logits (and dlogits, of the
 * same type) may be bf16 / f16: read widened, the gradient written rounded. */
DSC_API dsc_status dsc_kernel_cross_entropy_forward(dsc_tensor *losses, const dsc_tensor *logits,
                                                    const dsc_tensor *targets);
DSC_API dsc_status dsc_kernel_cross_entropy_backward(dsc_tensor *dlogits, const dsc_tensor *logits,
                                                     const dsc_tensor *targets, float dloss);

/* ---- optimizer updates (flat f32 vectors of equal length) ------------------------
 * AdamW with bias correction at `step` (1-based); decoupled weight decay. */
DSC_API dsc_status dsc_kernel_adamw(dsc_tensor *param, const dsc_tensor *grad, dsc_tensor *exp_avg,
                                    dsc_tensor *exp_avg_sq, float lr, float beta1, float beta2, float eps,
                                    float weight_decay, int64_t step);
/* SGD with momentum (PyTorch semantics: buf = momentum*buf + grad (+wd*param);
 * first step buf = grad); momentum 0 is plain SGD. */
DSC_API dsc_status dsc_kernel_sgd(dsc_tensor *param, const dsc_tensor *grad, dsc_tensor *momentum_buf, float lr,
                                  float momentum, float weight_decay, int64_t step);

/* Lion (Chen et al. 2023, DeepSpeed's FusedLion): c = b1*m + (1-b1)*g;
 * p = p*(1 - lr*wd) - lr*sign(c); m = b2*m + (1-b2)*g. */
DSC_API dsc_status dsc_kernel_lion(dsc_tensor *param, const dsc_tensor *grad, dsc_tensor *exp_avg, float lr,
                                   float beta1, float beta2, float weight_decay);
/* The first half of LAMB as DeepSpeed's FusedLamb computes it: m and v
 * updated as in Adam (no bias correction here), then
 * update = m / (sqrt(v) + eps) + wd * p. `update` may alias `grad`. The
 * caller scales update by the trust ratio ||p|| / ||update|| of the whole
 * parameter (which may span ranks) and applies it with dsc_kernel_axpy. */
DSC_API dsc_status dsc_kernel_lamb_direction(dsc_tensor *update, const dsc_tensor *param, const dsc_tensor *grad,
                                             dsc_tensor *exp_avg, dsc_tensor *exp_avg_sq, float beta1, float beta2,
                                             float eps, float weight_decay);

/* ---- reductions and elementwise helpers (f32, any shape) --------------------------- */
/* Sum of squares in double precision (the global gradient norm is sqrt of the sum over tensors). */
DSC_API dsc_status dsc_kernel_sum_squares(double *out, const dsc_tensor *x);
DSC_API dsc_status dsc_kernel_sum(double *out, const dsc_tensor *x);
DSC_API dsc_status dsc_kernel_scale(dsc_tensor *x, float s);                                  /* x *= s */
DSC_API dsc_status dsc_kernel_axpy(dsc_tensor *y, float a, const dsc_tensor *x);              /* y += a*x */
DSC_API dsc_status dsc_kernel_add(dsc_tensor *out, const dsc_tensor *a, const dsc_tensor *b); /* out = a + b */
DSC_API dsc_status dsc_kernel_zero(dsc_tensor *x);
/* True when every element is finite. */
DSC_API dsc_status dsc_kernel_all_finite(bool *out, const dsc_tensor *x);

/* ---- MoE row movement (moe/dispatch.c) ------------------------------------------------
 * dest (S, K) int32: for route j of token s the row of the expert buffer it
 * occupies, -1 when dropped; no two routes share a row. Rows are moved whole
 * (copies; combine as fused multiply-adds over rows), parallel over tokens.
 * The scatters write only the rows routes name: the caller zeroes padding. */
/* buf[dest[s, j]] = x[s] for every kept route; buf (R, M), x (S, M). */
DSC_API dsc_status dsc_kernel_moe_scatter(dsc_tensor *buf, const dsc_tensor *x, const dsc_tensor *dest);
/* out[s] (+)= sum over kept j of w[s, j] * y[dest[s, j]] (w NULL: weight 1); out (S, M), y (R, M), w (S, K).
 * Without `accumulate` a token with no kept route gets a zero row. */
DSC_API dsc_status dsc_kernel_moe_gather(dsc_tensor *out, const dsc_tensor *y, const dsc_tensor *dest,
                                         const dsc_tensor *w, bool accumulate);
/* Backward of the weighted gather: dy[dest[s, j]] = w[s, j] * dout[s], dy (R, M);
 * dw (S, K) = dout[s] . y[dest[s, j]] for kept routes, 0 for dropped ones. */
DSC_API dsc_status dsc_kernel_moe_combine_backward(dsc_tensor *dy, dsc_tensor *dw, const dsc_tensor *dout,
                                                   const dsc_tensor *y, const dsc_tensor *dest,
                                                   const dsc_tensor *w);

#ifdef __cplusplus
}
#endif
#endif
