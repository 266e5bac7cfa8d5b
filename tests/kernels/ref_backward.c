/* Naive reference gradients of the kernels, in double, for the op table
 * (test_kernel_ops.c): each is the textbook derivative of the forward in
 * ref_kernels.c, written out loop by loop. Accumulate-or-overwrite follows
 * dsc/kernels.h: parameter gradients add into their buffer, input gradients
 * are overwritten. */
#include <math.h>
#include <stdlib.h>

#include "ref_kernels.h"

void ref_bias_grad(double *dbias, const double *dy, int64_t n, int64_t oc) {
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < oc; c++)
            dbias[c] += dy[r * oc + c];
}

/* Shared by LayerNorm (mean given) and RMSNorm (mean NULL, so nothing is centred). */
static void norm_backward(double *dx, double *dw, double *db, const double *dout, const double *x, const double *w,
                          const double *mean, const double *rstd, int64_t n, int64_t c) {
    for (int64_t r = 0; r < n; r++) {
        const double *xr = x + r * c, *dr = dout + r * c;
        double mu = mean ? mean[r] : 0, s = rstd[r], sum_g = 0, sum_gx = 0;
        for (int64_t i = 0; i < c; i++) {
            double xhat = (xr[i] - mu) * s, g = dr[i] * w[i];
            sum_g += g;
            sum_gx += g * xhat;
            if (dw) dw[i] += dr[i] * xhat;
            if (db) db[i] += dr[i];
        }
        for (int64_t i = 0; i < c; i++) {
            double xhat = (xr[i] - mu) * s, g = dr[i] * w[i];
            dx[r * c + i] = s * (g - (mean ? sum_g / (double)c : 0) - xhat * sum_gx / (double)c);
        }
    }
}

void ref_layernorm_backward(double *dx, double *dw, double *db, const double *dout, const double *x,
                            const double *w, const double *mean, const double *rstd, int64_t n, int64_t c) {
    norm_backward(dx, dw, db, dout, x, w, mean, rstd, n, c);
}

void ref_rmsnorm_backward(double *dx, double *dw, const double *dout, const double *x, const double *w,
                          const double *rstd, int64_t n, int64_t c) {
    norm_backward(dx, dw, NULL, dout, x, w, NULL, rstd, n, c);
}

void ref_gelu_backward(double *dx, const double *dout, const double *x, int64_t n) {
    const double k = 0.7978845608028654; /* sqrt(2 / pi) */
    for (int64_t i = 0; i < n; i++) {
        double u = k * (x[i] + 0.044715 * x[i] * x[i] * x[i]), th = tanh(u);
        double du = k * (1 + 3 * 0.044715 * x[i] * x[i]);
        dx[i] = dout[i] * (0.5 * (1 + th) + 0.5 * x[i] * (1 - th * th) * du);
    }
}

static double dsilu(double x) {
    double s = 1 / (1 + exp(-x));
    return s * (1 + x * (1 - s));
}

void ref_silu_backward(double *dx, const double *dout, const double *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        dx[i] = dout[i] * dsilu(x[i]);
}

void ref_swiglu_backward(double *dgate, double *dup, const double *dout, const double *gate, const double *up,
                         int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        dgate[i] = dout[i] * up[i] * dsilu(gate[i]);
        dup[i] = dout[i] * gate[i] / (1 + exp(-gate[i]));
    }
}

void ref_attention_backward(double *dq, double *dk, double *dv, const double *dout, const double *q,
                            const double *k, const double *v, int64_t b, int64_t t, int64_t nh, int64_t nkv,
                            int64_t hs, ref_rounding round) {
    double *p = malloc((size_t)t * sizeof *p), *dp = malloc((size_t)t * sizeof *dp);
    double *out = malloc((size_t)(b * t * nh * hs) * sizeof *out); /* D = dout . out, out as the forward's */
    ref_attention(out, NULL, q, k, v, b, t, nh, nkv, hs, round);
    double scale = 1 / sqrt((double)hs);
    for (int64_t i = 0; i < b * t * nh * hs; i++)
        dq[i] = 0;
    for (int64_t i = 0; i < b * t * nkv * hs; i++)
        dk[i] = dv[i] = 0;
    for (int64_t bi = 0; bi < b; bi++)
        for (int64_t h = 0; h < nh; h++) {
            int64_t kvh = h / (nh / nkv);
            for (int64_t i = 0; i < t; i++) {
                int64_t row = ((bi * t + i) * nh + h) * hs;
                const double *qi = q + row, *gi = dout + row;
                double mx = -INFINITY, sum = 0, dot = 0;
                for (int64_t d = 0; d < hs; d++)
                    dot += gi[d] * out[row + d];
                for (int64_t j = 0; j <= i; j++) {
                    const double *kj = k + ((bi * t + j) * nkv + kvh) * hs,
                                 *vj = v + ((bi * t + j) * nkv + kvh) * hs;
                    p[j] = dp[j] = 0;
                    for (int64_t d = 0; d < hs; d++) {
                        p[j] += qi[d] * kj[d] * scale;
                        dp[j] += gi[d] * vj[d];
                    }
                    mx = fmax(mx, p[j]);
                }
                for (int64_t j = 0; j <= i; j++)
                    sum += (p[j] = exp(p[j] - mx));
                for (int64_t j = 0; j <= i; j++) {
                    p[j] /= sum;
                    double ds = ref_rounded(round, p[j] * (dp[j] - dot)) * scale, pj = ref_rounded(round, p[j]);
                    int64_t kv = ((bi * t + j) * nkv + kvh) * hs;
                    for (int64_t d = 0; d < hs; d++) {
                        dq[row + d] += ds * k[kv + d];
                        dk[kv + d] += ds * qi[d];
                        dv[kv + d] += pj * gi[d];
                    }
                }
            }
        }
    free(p), free(dp), free(out);
}

void ref_embedding_backward(double *dwte, double *dwpe, const double *dout, const int32_t *tokens, int64_t n,
                            int64_t t, int64_t c) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < c; j++) {
            dwte[tokens[i] * c + j] += dout[i * c + j];
            if (dwpe) dwpe[(i % t) * c + j] += dout[i * c + j];
        }
}

void ref_cross_entropy_backward(double *dlogits, const double *logits, const int32_t *targets, int64_t n,
                                int64_t v, double dloss) {
    ref_softmax(dlogits, logits, n, v);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < v; j++)
            dlogits[i * v + j] = targets[i] < 0 ? 0 : (dlogits[i * v + j] - (j == targets[i])) * dloss;
}
