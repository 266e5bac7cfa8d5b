/* Reference kernels in double precision: the textbook formula for each
 * operation, written for obviousness rather than speed. */
#include "ref_kernels.h"

#include <math.h>
#include <stdlib.h>

void ref_gemm(double *out, const double *a, const double *b, const double *bias, int64_t batch, int64_t m,
              int64_t n, int64_t k, bool trans_a, bool trans_b, double alpha, double beta) {
    for (int64_t bt = 0; bt < batch; bt++) {
        const double *ab = a + bt * m * k, *bb = b + bt * k * n;
        double *ob = out + bt * m * n;
        for (int64_t i = 0; i < m; i++) {
            for (int64_t j = 0; j < n; j++) {
                double s = 0;
                for (int64_t p = 0; p < k; p++) {
                    double av = trans_a ? ab[p * m + i] : ab[i * k + p];
                    double bv = trans_b ? bb[j * k + p] : bb[p * n + j];
                    s += av * bv;
                }
                ob[i * n + j] = alpha * s + (beta != 0 ? beta * ob[i * n + j] : 0) + (bias ? bias[j] : 0);
            }
        }
    }
}

void ref_layernorm(double *out, double *mean, double *rstd, const double *x, const double *w, const double *b,
                   int64_t n, int64_t c, double eps) {
    for (int64_t r = 0; r < n; r++) {
        const double *xr = x + r * c;
        double mu = 0, var = 0;
        for (int64_t i = 0; i < c; i++)
            mu += xr[i];
        mu /= (double)c;
        for (int64_t i = 0; i < c; i++)
            var += (xr[i] - mu) * (xr[i] - mu);
        double s = 1.0 / sqrt(var / (double)c + eps);
        for (int64_t i = 0; i < c; i++)
            out[r * c + i] = (xr[i] - mu) * s * w[i] + (b ? b[i] : 0);
        if (mean) mean[r] = mu;
        if (rstd) rstd[r] = s;
    }
}

void ref_rmsnorm(double *out, double *rstd, const double *x, const double *w, int64_t n, int64_t c, double eps) {
    for (int64_t r = 0; r < n; r++) {
        const double *xr = x + r * c;
        double ms = 0;
        for (int64_t i = 0; i < c; i++)
            ms += xr[i] * xr[i];
        double s = 1.0 / sqrt(ms / (double)c + eps);
        for (int64_t i = 0; i < c; i++)
            out[r * c + i] = xr[i] * s * w[i];
        if (rstd) rstd[r] = s;
    }
}

void ref_gelu(double *out, const double *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        out[i] = 0.5 * x[i] *
                 (1 + tanh(0.7978845608028654 /* sqrt(2 / pi) */ * (x[i] + 0.044715 * x[i] * x[i] * x[i])));
}

void ref_silu(double *out, const double *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        out[i] = x[i] / (1 + exp(-x[i]));
}

void ref_swiglu(double *out, const double *gate, const double *up, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        out[i] = gate[i] / (1 + exp(-gate[i])) * up[i];
}

void ref_softmax(double *out, const double *x, int64_t n, int64_t c) {
    for (int64_t r = 0; r < n; r++) {
        double mx = -INFINITY, sum = 0;
        for (int64_t i = 0; i < c; i++)
            mx = fmax(mx, x[r * c + i]);
        for (int64_t i = 0; i < c; i++)
            sum += exp(x[r * c + i] - mx);
        for (int64_t i = 0; i < c; i++)
            out[r * c + i] = exp(x[r * c + i] - mx) / sum;
    }
}

void ref_attention(double *out, double *lse, const double *q, const double *k, const double *v, int64_t b,
                   int64_t t, int64_t nh, int64_t nkv, int64_t hs, ref_rounding round) {
    double *p = malloc((size_t)(t * t) * sizeof *p); /* (T, T) probabilities of one head, unnormalised */
    for (int64_t bi = 0; bi < b; bi++) {
        for (int64_t h = 0; h < nh; h++) {
            int64_t kvh = h / (nh / nkv);
            for (int64_t i = 0; i < t; i++) {
                const double *qi = q + ((bi * t + i) * nh + h) * hs;
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    const double *kj = k + ((bi * t + j) * nkv + kvh) * hs;
                    double s = 0;
                    for (int64_t d = 0; d < hs; d++)
                        s += qi[d] * kj[d];
                    p[i * t + j] = s / sqrt((double)hs);
                    mx = fmax(mx, p[i * t + j]);
                }
                for (int64_t j = 0; j <= i; j++) {
                    sum += (p[i * t + j] = exp(p[i * t + j] - mx));
                    p[i * t + j] = ref_rounded(round, p[i * t + j]);
                }
                if (lse) lse[(bi * nh + h) * t + i] = mx + log(sum);
                double *o = out + ((bi * t + i) * nh + h) * hs;
                for (int64_t d = 0; d < hs; d++) {
                    double acc = 0;
                    for (int64_t j = 0; j <= i; j++)
                        acc += p[i * t + j] * v[((bi * t + j) * nkv + kvh) * hs + d];
                    o[d] = ref_rounded(round, acc / sum);
                }
            }
        }
    }
    free(p);
}

void ref_rope(double *out, const double *x, const int32_t *pos, int64_t b, int64_t t, int64_t nh, int64_t hs,
              double theta, bool inverse) {
    int64_t half = hs / 2;
    for (int64_t bi = 0; bi < b; bi++)
        for (int64_t ti = 0; ti < t; ti++)
            for (int64_t h = 0; h < nh; h++) {
                const double *xr = x + ((bi * t + ti) * nh + h) * hs;
                double *o = out + ((bi * t + ti) * nh + h) * hs;
                for (int64_t i = 0; i < half; i++) {
                    double angle = pos[ti] / pow(theta, 2.0 * (double)i / (double)hs) * (inverse ? -1 : 1);
                    double x1 = xr[i], x2 = xr[i + half];
                    o[i] = x1 * cos(angle) - x2 * sin(angle);
                    o[i + half] = x2 * cos(angle) + x1 * sin(angle);
                }
            }
}

void ref_embedding(double *out, const int32_t *tokens, const double *wte, const double *wpe, int64_t n, int64_t t,
                   int64_t c) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < c; j++)
            out[i * c + j] = wte[tokens[i] * c + j] + (wpe ? wpe[(i % t) * c + j] : 0);
}

void ref_cross_entropy(double *losses, const double *logits, const int32_t *targets, int64_t n, int64_t v) {
    for (int64_t i = 0; i < n; i++) {
        if (targets[i] < 0) {
            losses[i] = 0;
            continue;
        }
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < v; j++)
            mx = fmax(mx, logits[i * v + j]);
        for (int64_t j = 0; j < v; j++)
            sum += exp(logits[i * v + j] - mx);
        losses[i] = log(sum) + mx - logits[i * v + targets[i]];
    }
}

void ref_adamw(double *p, const double *g, double *m, double *v, int64_t n, double lr, double beta1, double beta2,
               double eps, double wd, int64_t step) {
    for (int64_t i = 0; i < n; i++) {
        p[i] -= lr * wd * p[i];
        m[i] = beta1 * m[i] + (1 - beta1) * g[i];
        v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
        double mhat = m[i] / (1 - pow(beta1, (double)step)), vhat = v[i] / (1 - pow(beta2, (double)step));
        p[i] -= lr * mhat / (sqrt(vhat) + eps);
    }
}

void ref_sgd(double *p, const double *g, double *buf, int64_t n, double lr, double momentum, double wd,
             int64_t step) {
    for (int64_t i = 0; i < n; i++) {
        double d = g[i] + wd * p[i];
        if (momentum != 0) {
            buf[i] = step == 1 ? d : momentum * buf[i] + d;
            d = buf[i];
        }
        p[i] -= lr * d;
    }
}

void ref_lion(double *p, const double *g, double *m, int64_t n, double lr, double beta1, double beta2, double wd) {
    for (int64_t i = 0; i < n; i++) {
        double c = beta1 * m[i] + (1 - beta1) * g[i];
        p[i] = p[i] * (1 - lr * wd) - lr * (double)((c > 0) - (c < 0));
        m[i] = beta2 * m[i] + (1 - beta2) * g[i];
    }
}

void ref_lamb_direction(double *u, const double *p, const double *g, double *m, double *v, int64_t n, double beta1,
                        double beta2, double eps, double wd) {
    for (int64_t i = 0; i < n; i++) {
        double gi = g[i];
        m[i] = beta1 * m[i] + (1 - beta1) * gi;
        v[i] = beta2 * v[i] + (1 - beta2) * gi * gi;
        u[i] = m[i] / (sqrt(v[i]) + eps) + wd * p[i];
    }
}
