/* The CUDA backend's kernel table: each entry points at the operation's CUDA
 * implementation in this folder. */
#include "kernels/cuda/cuda_kernels.h"

extern "C" const struct dsc_kernel_ops dsc_cuda_kernel_ops = {
    .gemm = dsc_cuda_gemm,
    .linear_backward_bias = dsc_cuda_linear_backward_bias,
    .linear_grads_rounded = NULL,      /* reduced-type gradients (dsc_kernels_set_grad_dtype) are the CPU's */
    .linear_narrow_y = NULL,           /* as are the 2-byte tensors of mixed precision's head */
    .linear_backward_narrow_dy = NULL, /* likewise */
    .linear_gelu = dsc_cuda_linear_gelu,
    .linear_packed = NULL, /* narrow weights are a CPU decode feature; the wrapper reports it unsupported */
    .layernorm_forward = dsc_cuda_layernorm_forward,
    .layernorm_backward = dsc_cuda_layernorm_backward,
    .rmsnorm_forward = dsc_cuda_rmsnorm_forward,
    .rmsnorm_backward = dsc_cuda_rmsnorm_backward,
    .gelu_forward = dsc_cuda_gelu_forward,
    .gelu_backward = dsc_cuda_gelu_backward,
    .silu_forward = dsc_cuda_silu_forward,
    .silu_backward = dsc_cuda_silu_backward,
    .swiglu_forward = dsc_cuda_swiglu_forward,
    .swiglu_backward = dsc_cuda_swiglu_backward,
    .softmax = dsc_cuda_softmax,
    .attention_forward = dsc_cuda_attention_forward,
    .attention_backward = dsc_cuda_attention_backward,
    .rope = dsc_cuda_rope,
    .embedding_forward = dsc_cuda_embedding_forward,
    .embedding_backward = dsc_cuda_embedding_backward,
    .embedding_backward_rounded = NULL, /* as linear_grads_rounded */
    .cross_entropy_forward = dsc_cuda_cross_entropy_forward,
    .cross_entropy_backward = dsc_cuda_cross_entropy_backward,
    .cross_entropy_forward_narrow = NULL,  /* as linear_narrow_y */
    .cross_entropy_backward_narrow = NULL, /* likewise */
    .adamw = dsc_cuda_adamw,
    .sgd = dsc_cuda_sgd,
    .lion = dsc_cuda_lion,
    .lamb_direction = dsc_cuda_lamb_direction,
    .sum_squares = dsc_cuda_sum_squares,
    .sum = dsc_cuda_sum,
    .scale = dsc_cuda_scale,
    .axpy = dsc_cuda_axpy,
    .add = dsc_cuda_add,
    .all_finite = dsc_cuda_all_finite,
    .zero = dsc_cuda_zero,
    .moe_scatter = dsc_cuda_moe_scatter,
    .moe_gather = dsc_cuda_moe_gather,
    .moe_combine_backward = dsc_cuda_moe_combine_backward,
};
