/* Naive reference implementations of the kernels, in double precision, for
 * the tests: plain loops, softmax attention with the whole (T, T) score
 * matrix, no blocking, no threads. Shapes follow dsc/kernels.h. */
#ifndef DSC_TESTS_REF_KERNELS_H
#define DSC_TESTS_REF_KERNELS_H

#include <stdbool.h>
#include <stdint.h>

/* out (BT, M, N) = alpha op(a) op(b) + beta out (+ bias (N)). */
void ref_gemm(double *out, const double *a, const double *b, const double *bias, int64_t batch, int64_t m,
              int64_t n, int64_t k, bool trans_a, bool trans_b, double alpha, double beta);
/* mean, rstd may be NULL; b may be NULL. */
void ref_layernorm(double *out, double *mean, double *rstd, const double *x, const double *w, const double *b,
                   int64_t n, int64_t c, double eps);
void ref_rmsnorm(double *out, double *rstd, const double *x, const double *w, int64_t n, int64_t c, double eps);
void ref_gelu(double *out, const double *x, int64_t n);
void ref_silu(double *out, const double *x, int64_t n);
void ref_swiglu(double *out, const double *gate, const double *up, int64_t n);
void ref_softmax(double *out, const double *x, int64_t n, int64_t c);
/* A rounding applied inside the attention references (NULL: none): a bf16 flash attention rounds
 * the unnormalised probabilities before they multiply v and the output once normalised, and in the
 * backward the probabilities before dv and the score gradients P (dP - D) before dq, dk; its q, k, v
 * and output gradient are the caller's to round. */
typedef double (*ref_rounding)(double);
static inline double ref_rounded(ref_rounding round, double x) {
    return round ? round(x) : x;
}
/* lse may be NULL. */
void ref_attention(double *out, double *lse, const double *q, const double *k, const double *v, int64_t b,
                   int64_t t, int64_t nh, int64_t nkv, int64_t hs, ref_rounding round);
void ref_rope(double *out, const double *x, const int32_t *pos, int64_t b, int64_t t, int64_t nh, int64_t hs,
              double theta, bool inverse);
/* wpe may be NULL; n = B*T rows, position = row % t. */
void ref_embedding(double *out, const int32_t *tokens, const double *wte, const double *wpe, int64_t n, int64_t t,
                   int64_t c);
void ref_cross_entropy(double *losses, const double *logits, const int32_t *targets, int64_t n, int64_t v);
/* One optimizer step on double state. */
void ref_adamw(double *p, const double *g, double *m, double *v, int64_t n, double lr, double beta1, double beta2,
               double eps, double wd, int64_t step);
void ref_sgd(double *p, const double *g, double *buf, int64_t n, double lr, double momentum, double wd,
             int64_t step);
/* Lion step; LAMB's update direction (u may alias g). */
void ref_lion(double *p, const double *g, double *m, int64_t n, double lr, double beta1, double beta2, double wd);
void ref_lamb_direction(double *u, const double *p, const double *g, double *m, double *v, int64_t n, double beta1,
                        double beta2, double eps, double wd);

/* Gradients (ref_backward.c): dbias, dw, db, dwte, dwpe accumulate; the others are overwritten. */
void ref_bias_grad(double *dbias, const double *dy, int64_t n, int64_t oc);
void ref_layernorm_backward(double *dx, double *dw, double *db, const double *dout, const double *x,
                            const double *w, const double *mean, const double *rstd, int64_t n, int64_t c);
void ref_rmsnorm_backward(double *dx, double *dw, const double *dout, const double *x, const double *w,
                          const double *rstd, int64_t n, int64_t c);
void ref_gelu_backward(double *dx, const double *dout, const double *x, int64_t n);
void ref_silu_backward(double *dx, const double *dout, const double *x, int64_t n);
void ref_swiglu_backward(double *dgate, double *dup, const double *dout, const double *gate, const double *up,
                         int64_t n);
void ref_attention_backward(double *dq, double *dk, double *dv, const double *dout, const double *q,
                            const double *k, const double *v, int64_t b, int64_t t, int64_t nh, int64_t nkv,
                            int64_t hs, ref_rounding round);
void ref_embedding_backward(double *dwte, double *dwpe, const double *dout, const int32_t *tokens, int64_t n,
                            int64_t t, int64_t c);
void ref_cross_entropy_backward(double *dlogits, const double *logits, const int32_t *targets, int64_t n,
                                int64_t v, double dloss);

#endif
