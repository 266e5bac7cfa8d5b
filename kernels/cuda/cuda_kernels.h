/* The CUDA implementations behind dsc_cuda_kernel_ops. Arguments are
 * validated by the public wrappers; these functions see raw device pointers
 * and extents, launch on the compute stream of the backend object they are
 * given, and allocate nothing beyond its context (cuda_common.cuh). */
#ifndef DSC_KERNELS_CUDA_KERNELS_H
#define DSC_KERNELS_CUDA_KERNELS_H

#include "core/backend.h"
#include "dsc/kernels.h"

/* Error naming the first id >= limit (or < 0 unless allow_negative) and its
 * flat position, or NULL; copies one small struct back (a synchronisation). */
dsc_status dsc_cuda_check_ids(const dsc_backend *backend, const int32_t *ids, int64_t n, int64_t limit,
                              bool allow_negative, const char *what);

dsc_status dsc_cuda_gemm(const dsc_backend *backend, float *out, const float *a, const float *b, const float *bias,
                         int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, float alpha,
                         float beta);
dsc_status dsc_cuda_linear_backward_bias(const dsc_backend *backend, float *dbias, const float *dy, int64_t n,
                                         int64_t oc);

dsc_status dsc_cuda_layernorm_forward(const dsc_backend *backend, float *out, float *mean, float *rstd,
                                      const float *x, const float *w, const float *b, int64_t n, int64_t c,
                                      float eps);
dsc_status dsc_cuda_layernorm_backward(const dsc_backend *backend, float *dx, float *dw, float *db,
                                       const float *dout, const float *x, const float *w, const float *mean,
                                       const float *rstd, int64_t n, int64_t c);
dsc_status dsc_cuda_rmsnorm_forward(const dsc_backend *backend, float *out, float *rstd, const float *x,
                                    const float *w, int64_t n, int64_t c, float eps);
dsc_status dsc_cuda_rmsnorm_backward(const dsc_backend *backend, float *dx, float *dw, const float *dout,
                                     const float *x, const float *w, const float *rstd, int64_t n, int64_t c);

dsc_status dsc_cuda_linear_gelu(const dsc_backend *backend, float *act, float *y, const float *x, const float *w,
                                const float *bias, int64_t n, int64_t oc, int64_t c);
dsc_status dsc_cuda_gelu_forward(const dsc_backend *backend, float *out, const float *x, int64_t n);
dsc_status dsc_cuda_gelu_backward(const dsc_backend *backend, float *dx, const float *dout, const float *x,
                                  int64_t n);
dsc_status dsc_cuda_silu_forward(const dsc_backend *backend, float *out, const float *x, int64_t n);
dsc_status dsc_cuda_silu_backward(const dsc_backend *backend, float *dx, const float *dout, const float *x,
                                  int64_t n);
dsc_status dsc_cuda_swiglu_forward(const dsc_backend *backend, float *out, const float *gate, const float *up,
                                   int64_t n);
dsc_status dsc_cuda_swiglu_backward(const dsc_backend *backend, float *dgate, float *dup, const float *dout,
                                    const float *gate, const float *up, int64_t n);
dsc_status dsc_cuda_softmax(const dsc_backend *backend, float *out, const float *x, int64_t n, int64_t c);

dsc_status dsc_cuda_attention_forward(const dsc_backend *backend, float *out, float *lse, const float *q,
                                      const float *k, const float *v, int64_t b, int64_t t, int64_t nh,
                                      int64_t nkv, int64_t hs);
dsc_status dsc_cuda_attention_backward(const dsc_backend *backend, float *dq, float *dk, float *dv,
                                       const float *dout, const float *q, const float *k, const float *v,
                                       const float *out, const float *lse, int64_t b, int64_t t, int64_t nh,
                                       int64_t nkv, int64_t hs);
/* Tiled attention for head sizes 64 and 128 (cuda_flash_attention.cu); *done
 * is false when it does not apply and the caller must use its fallback. */
dsc_status dsc_cuda_flash_attention_forward(const dsc_backend *backend, float *out, float *lse, const float *q,
                                            const float *k, const float *v, int64_t b, int64_t t, int64_t nh,
                                            int64_t nkv, int64_t hs, bool *done);
dsc_status dsc_cuda_flash_attention_backward(const dsc_backend *backend, float *dq, float *dk, float *dv,
                                             const float *dout, const float *q, const float *k, const float *v,
                                             const float *out, const float *lse, int64_t b, int64_t t, int64_t nh,
                                             int64_t nkv, int64_t hs, bool *done);
dsc_status dsc_cuda_rope(const dsc_backend *backend, float *out, const float *x, const int32_t *pos, int64_t b,
                         int64_t t, int64_t nh, int64_t hs, float theta, bool inverse);

dsc_status dsc_cuda_embedding_forward(const dsc_backend *backend, float *out, const int32_t *tokens,
                                      const float *wte, const float *wpe, int64_t n, int64_t t, int64_t v,
                                      int64_t c);
dsc_status dsc_cuda_embedding_backward(const dsc_backend *backend, float *dwte, float *dwpe, const float *dout,
                                       const int32_t *tokens, int64_t n, int64_t t, int64_t v, int64_t c);
dsc_status dsc_cuda_cross_entropy_forward(const dsc_backend *backend, float *losses, const float *logits,
                                          const int32_t *targets, int64_t n, int64_t v);
dsc_status dsc_cuda_cross_entropy_backward(const dsc_backend *backend, float *dlogits, const float *logits,
                                           const int32_t *targets, int64_t n, int64_t v, float dloss);

dsc_status dsc_cuda_adamw(const dsc_backend *backend, float *p, const float *g, float *m, float *v, int64_t n,
                          float lr, float beta1, float beta2, float eps, float wd, int64_t step);
dsc_status dsc_cuda_sgd(const dsc_backend *backend, float *p, const float *g, float *buf, int64_t n, float lr,
                        float momentum, float wd, int64_t step);
dsc_status dsc_cuda_lion(const dsc_backend *backend, float *p, const float *g, float *m, int64_t n, float lr,
                         float beta1, float beta2, float wd);
dsc_status dsc_cuda_lamb_direction(const dsc_backend *backend, float *u, const float *p, const float *g, float *m,
                                   float *v, int64_t n, float beta1, float beta2, float eps, float wd);

dsc_status dsc_cuda_sum_squares(const dsc_backend *backend, double *out, const float *x, int64_t n);
dsc_status dsc_cuda_sum(const dsc_backend *backend, double *out, const float *x, int64_t n);
dsc_status dsc_cuda_scale(const dsc_backend *backend, float *x, float s, int64_t n);
dsc_status dsc_cuda_axpy(const dsc_backend *backend, float *y, float a, const float *x, int64_t n);
dsc_status dsc_cuda_add(const dsc_backend *backend, float *out, const float *a, const float *b, int64_t n);
dsc_status dsc_cuda_all_finite(const dsc_backend *backend, bool *out, const float *x, int64_t n);
dsc_status dsc_cuda_zero(const dsc_backend *backend, float *x, int64_t n);

dsc_status dsc_cuda_moe_scatter(const dsc_backend *backend, float *buf, int64_t rows, const float *x,
                                const int32_t *dest, int64_t s, int64_t k, int64_t m);
dsc_status dsc_cuda_moe_gather(const dsc_backend *backend, float *out, const float *y, int64_t rows,
                               const int32_t *dest, const float *w, int64_t s, int64_t k, int64_t m,
                               bool accumulate);
dsc_status dsc_cuda_moe_combine_backward(const dsc_backend *backend, float *dy, float *dw, int64_t rows,
                                         const float *dout, const float *y, const int32_t *dest, const float *w,
                                         int64_t s, int64_t k, int64_t m);

#endif
