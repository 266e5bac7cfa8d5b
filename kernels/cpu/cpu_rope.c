/* Rotary position embedding on the CPU, rotate-half pairing (i, i + HS/2):
 *   out[i]        = x[i] cos(a) - x[i + HS/2] sin(a)
 *   out[i + HS/2] = x[i + HS/2] cos(a) + x[i] sin(a),  a = pos * theta^(-2i/HS)
 * Angles are computed in double (positions reach 1e5 and more) once per
 * (position, pair block) and reused for every batch row and head. */
#include <math.h>

#include "kernels/cpu/cpu_kernels.h"

#define PAIR_BLOCK 64

dsc_status dsc_cpu_rope(const dsc_backend *backend, float *out, const float *x, const int32_t *pos, int64_t b,
                        int64_t t, int64_t nh, int64_t hs, float theta, bool inverse) {
    (void)backend;
    int nt = dsc_kernels_get_num_threads();
    int64_t half = hs / 2;
    double sign = inverse ? -1.0 : 1.0;
#pragma omp parallel for num_threads(nt) if (dsc_cpu_parallel(b * t * nh * hs)) schedule(static)
    for (int64_t ti = 0; ti < t; ti++) {
        for (int64_t i0 = 0; i0 < half; i0 += PAIR_BLOCK) {
            int64_t len = half - i0 < PAIR_BLOCK ? half - i0 : PAIR_BLOCK;
            float cs[PAIR_BLOCK], sn[PAIR_BLOCK];
            for (int64_t i = 0; i < len; i++) {
                double angle = (double)pos[ti] * pow((double)theta, -2.0 * (double)(i0 + i) / (double)hs);
                cs[i] = (float)cos(angle);
                sn[i] = (float)(sign * sin(angle));
            }
            for (int64_t bi = 0; bi < b; bi++) {
                for (int64_t h = 0; h < nh; h++) {
                    int64_t row = ((bi * t + ti) * nh + h) * hs;
                    const float *x1 = x + row + i0, *x2 = x + row + half + i0; /* may alias out */
                    float *o1 = out + row + i0, *o2 = out + row + half + i0;
                    for (int64_t i = 0; i < len; i++) {
                        float a = x1[i], c = x2[i];
                        o1[i] = a * cs[i] - c * sn[i];
                        o2[i] = c * cs[i] + a * sn[i];
                    }
                }
            }
        }
    }
    return NULL;
}
