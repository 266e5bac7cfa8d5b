/* The CPU implementations behind dsc_cpu_kernel_ops. Arguments are validated
 * by the public wrappers; these functions see raw pointers and extents, use
 * OpenMP over dsc_kernels_get_num_threads() threads and never allocate. */
#ifndef DSC_KERNELS_CPU_KERNELS_H
#define DSC_KERNELS_CPU_KERNELS_H

#include "core/backend.h"
#include "dsc/kernels.h"
#include "kernels/cpu/cpu_pool.h"

/* Work (elements touched) below which a loop stays on the calling thread. */
#define DSC_CPU_PARALLEL_MIN 32768

/* Whether an OpenMP loop over `work` elements runs in parallel: above
 * DSC_CPU_PARALLEL_MIN, and not inside the pool scope (cpu_pool.h), where
 * the pool owns the cores. */
static inline bool dsc_cpu_parallel(int64_t work) {
    return work > DSC_CPU_PARALLEL_MIN && !dsc_cpu_pool_scope();
}

/* Error naming the first id >= limit (or < 0 unless allow_negative) and its
 * flat position, or NULL. `what` is "token" or "target". */
dsc_status dsc_cpu_check_ids(const int32_t *ids, int64_t n, int64_t limit, bool allow_negative, const char *what);

dsc_status dsc_cpu_gemm(const dsc_backend *backend, float *out, const float *a, const float *b, const float *bias,
                        int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, float alpha,
                        float beta);
/* y (n, oc) = x (n, c) @ W^T (+ bias), W (oc, c) in format f, the threads splitting W's rows and
 * each streaming its share once (any n; meant for n <= DSC_CPU_STREAM_MAX_ROWS). */
void dsc_cpu_stream_rows(float *y, const float *x, const void *w, dsc_weight_format f, const float *bias,
                         int64_t n, int64_t oc, int64_t c);
/* The SwiGLU MLP's first half with its activation fused: act (n, F) = silu(x @ Wg^T) * (x @ Wu^T)
 * for W (2F, c) in format f with rows gate | up, streamed once (n <= DSC_CPU_STREAM_MAX_ROWS):
 * each chunk of rows applies the activation to its own gate and up values, so neither is stored. */
void dsc_cpu_stream_swiglu(float *act, const float *x, const void *w, dsc_weight_format f, int64_t n, int64_t F,
                           int64_t c);
/* Most rows of x a linear layer over a weight in format f streams (dsc_cpu_stream_rows,
 * dsc_cpu_stream_swiglu) before it multiplies as a GEMM: DSC_CPU_STREAM_MAX_ROWS, or fewer where
 * the Q8_0 or bf16 dot's GEMM runs (cpu_q8_gemm.h, cpu_bf16_gemm.h). */
int64_t dsc_cpu_stream_max_rows(dsc_weight_format f);
dsc_status dsc_cpu_linear_packed(const dsc_backend *backend, float *y, const float *x, const void *w, int format,
                                 const float *bias, int64_t n, int64_t oc, int64_t c, float *workspace,
                                 int64_t workspace_floats);
dsc_status dsc_cpu_linear_gelu(const dsc_backend *backend, float *act, float *y, const float *x, const float *w,
                               const float *bias, int64_t n, int64_t oc, int64_t c);
dsc_status dsc_cpu_linear_backward_bias(const dsc_backend *backend, float *dbias, const float *dy, int64_t n,
                                        int64_t oc);
/* y (n, oc) = x @ w^T (+ bias) stored in 2 bytes (y_type bf16 / f16), in the thread's products:
 * each sum rounded once. */
dsc_status dsc_cpu_linear_narrow_y(const dsc_backend *backend, void *y, dsc_dtype y_type, const float *x,
                                   const float *w, const float *bias, int64_t n, int64_t oc, int64_t c);
/* The linear backward from dy (n, oc) stored in 2 bytes (dy_type), read widened, in the thread's
 * products: dx = dy @ w (NULL: skip) and dw += round(dy^T @ x) to grad_dtype (f32: as summed; NULL:
 * skip). */
dsc_status dsc_cpu_linear_backward_narrow_dy(const dsc_backend *backend, float *dx, float *dw, const void *dy,
                                             dsc_dtype dy_type, const float *x, const float *w, int64_t n,
                                             int64_t oc, int64_t c, dsc_dtype grad_dtype);
dsc_status dsc_cpu_linear_grads_rounded(const dsc_backend *backend, float *dw, float *dbias, const float *dy,
                                        const float *x, int64_t n, int64_t oc, int64_t c, dsc_dtype dtype);

dsc_status dsc_cpu_layernorm_forward(const dsc_backend *backend, float *out, float *mean, float *rstd,
                                     const float *x, const float *w, const float *b, int64_t n, int64_t c,
                                     float eps);
dsc_status dsc_cpu_layernorm_backward(const dsc_backend *backend, float *dx, float *dw, float *db,
                                      const float *dout, const float *x, const float *w, const float *mean,
                                      const float *rstd, int64_t n, int64_t c);
dsc_status dsc_cpu_rmsnorm_forward(const dsc_backend *backend, float *out, float *rstd, const float *x,
                                   const float *w, int64_t n, int64_t c, float eps);
dsc_status dsc_cpu_rmsnorm_backward(const dsc_backend *backend, float *dx, float *dw, const float *dout,
                                    const float *x, const float *w, const float *rstd, int64_t n, int64_t c);

dsc_status dsc_cpu_gelu_forward(const dsc_backend *backend, float *out, const float *x, int64_t n);
dsc_status dsc_cpu_gelu_backward(const dsc_backend *backend, float *dx, const float *dout, const float *x,
                                 int64_t n);
dsc_status dsc_cpu_silu_forward(const dsc_backend *backend, float *out, const float *x, int64_t n);
dsc_status dsc_cpu_silu_backward(const dsc_backend *backend, float *dx, const float *dout, const float *x,
                                 int64_t n);
dsc_status dsc_cpu_swiglu_forward(const dsc_backend *backend, float *out, const float *gate, const float *up,
                                  int64_t n);
dsc_status dsc_cpu_swiglu_backward(const dsc_backend *backend, float *dgate, float *dup, const float *dout,
                                   const float *gate, const float *up, int64_t n);
dsc_status dsc_cpu_softmax(const dsc_backend *backend, float *out, const float *x, int64_t n, int64_t c);

dsc_status dsc_cpu_attention_forward(const dsc_backend *backend, float *out, float *lse, const float *q,
                                     const float *k, const float *v, int64_t b, int64_t t, int64_t nh, int64_t nkv,
                                     int64_t hs);
dsc_status dsc_cpu_attention_backward(const dsc_backend *backend, float *dq, float *dk, float *dv,
                                      const float *dout, const float *q, const float *k, const float *v,
                                      const float *out, const float *lse, int64_t b, int64_t t, int64_t nh,
                                      int64_t nkv, int64_t hs);
dsc_status dsc_cpu_rope(const dsc_backend *backend, float *out, const float *x, const int32_t *pos, int64_t b,
                        int64_t t, int64_t nh, int64_t hs, float theta, bool inverse);

dsc_status dsc_cpu_embedding_forward(const dsc_backend *backend, float *out, const int32_t *tokens,
                                     const float *wte, const float *wpe, int64_t n, int64_t t, int64_t v,
                                     int64_t c);
dsc_status dsc_cpu_embedding_backward(const dsc_backend *backend, float *dwte, float *dwpe, const float *dout,
                                      const int32_t *tokens, int64_t n, int64_t t, int64_t v, int64_t c);
dsc_status dsc_cpu_embedding_backward_rounded(const dsc_backend *backend, float *dwte, float *dwpe,
                                              const float *dout, const int32_t *tokens, int64_t n, int64_t t,
                                              int64_t v, int64_t c, dsc_dtype dtype);
dsc_status dsc_cpu_cross_entropy_forward(const dsc_backend *backend, float *losses, const float *logits,
                                         const int32_t *targets, int64_t n, int64_t v);
dsc_status dsc_cpu_cross_entropy_backward(const dsc_backend *backend, float *dlogits, const float *logits,
                                          const int32_t *targets, int64_t n, int64_t v, float dloss);
dsc_status dsc_cpu_cross_entropy_forward_narrow(const dsc_backend *backend, float *losses, const void *logits,
                                                dsc_dtype type, const int32_t *targets, int64_t n, int64_t v);
dsc_status dsc_cpu_cross_entropy_backward_narrow(const dsc_backend *backend, void *dlogits, const void *logits,
                                                 dsc_dtype type, const int32_t *targets, int64_t n, int64_t v,
                                                 float dloss);

dsc_status dsc_cpu_adamw(const dsc_backend *backend, float *p, const float *g, float *m, float *v, int64_t n,
                         float lr, float beta1, float beta2, float eps, float wd, int64_t step);
dsc_status dsc_cpu_sgd(const dsc_backend *backend, float *p, const float *g, float *buf, int64_t n, float lr,
                       float momentum, float wd, int64_t step);
dsc_status dsc_cpu_lion(const dsc_backend *backend, float *p, const float *g, float *m, int64_t n, float lr,
                        float beta1, float beta2, float wd);
dsc_status dsc_cpu_lamb_direction(const dsc_backend *backend, float *u, const float *p, const float *g, float *m,
                                  float *v, int64_t n, float beta1, float beta2, float eps, float wd);

dsc_status dsc_cpu_sum_squares(const dsc_backend *backend, double *out, const float *x, int64_t n);
dsc_status dsc_cpu_sum(const dsc_backend *backend, double *out, const float *x, int64_t n);
dsc_status dsc_cpu_scale(const dsc_backend *backend, float *x, float s, int64_t n);
dsc_status dsc_cpu_axpy(const dsc_backend *backend, float *y, float a, const float *x, int64_t n);
dsc_status dsc_cpu_add(const dsc_backend *backend, float *out, const float *a, const float *b, int64_t n);
dsc_status dsc_cpu_all_finite(const dsc_backend *backend, bool *out, const float *x, int64_t n);
dsc_status dsc_cpu_zero(const dsc_backend *backend, float *x, int64_t n);

dsc_status dsc_cpu_moe_scatter(const dsc_backend *backend, float *buf, int64_t rows, const float *x,
                               const int32_t *dest, int64_t s, int64_t k, int64_t m);
dsc_status dsc_cpu_moe_gather(const dsc_backend *backend, float *out, const float *y, int64_t rows,
                              const int32_t *dest, const float *w, int64_t s, int64_t k, int64_t m,
                              bool accumulate);
dsc_status dsc_cpu_moe_combine_backward(const dsc_backend *backend, float *dy, float *dw, int64_t rows,
                                        const float *dout, const float *y, const int32_t *dest, const float *w,
                                        int64_t s, int64_t k, int64_t m);

#endif
