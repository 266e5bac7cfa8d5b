/* Rotary position embedding for inference: a frequency table computed once
 * per model (theta^(-2i/D) over the D rotated dims of each head, with
 * Llama-3's frequency-dependent rescaling when the config asks for it)
 * applied at each token's own position of the ragged batch. D is the whole
 * head for Llama-family models and GPT-NeoX's rotary_pct share of it, the
 * rest of the head passing through. The shared kernel dsc_kernel_rope
 * derives its frequencies from theta alone over whole heads and so can
 * express neither; this table path serves every RoPE model instead of
 * keeping two. Rotate-half pairing (i, i + D/2), angles in double, as the
 * training kernel; their cosines and sines once per forward (every layer
 * rotates at the same positions). */
#include <math.h>
#include <stdlib.h>

#include "inference/model_internal.h"

int32_t dsc_model_rope_dims(const dsc_infer_model_config *mc) {
    if (mc->family == DSC_INFER_FAMILY_LLAMA && mc->rope_dims == 0) return mc->head_size;
    return mc->rope_dims;
}

dsc_status dsc_model_rope_init(dsc_infer_model *m) {
    const dsc_infer_model_config *mc = &m->cfg;
    int32_t dims = dsc_model_rope_dims(mc), half = dims / 2;
    m->inv_freq = malloc((size_t)half * sizeof *m->inv_freq);
    DSC_CHECK(m->inv_freq, DSC_ERR_NOMEM, "RoPE table (%d)", half);
    for (int32_t i = 0; i < half; i++) {
        double f = pow(mc->rope_theta, -2.0 * i / dims);
        if (mc->rope_scaling == DSC_ROPE_SCALING_LLAMA3) {
            /* Hugging Face's _compute_llama3_parameters: long wavelengths are
             * divided by the factor, short ones kept, the band between blended. */
            double old = (double)mc->rope_original_max_positions, wavelen = 2.0 * 3.14159265358979323846 / f;
            double low_wavelen = old / mc->rope_low_freq_factor, high_wavelen = old / mc->rope_high_freq_factor;
            if (wavelen > low_wavelen) {
                f /= mc->rope_factor;
            } else if (wavelen >= high_wavelen) {
                double smooth = (old / wavelen - mc->rope_low_freq_factor) /
                                (mc->rope_high_freq_factor - mc->rope_low_freq_factor);
                f = (1.0 - smooth) * f / mc->rope_factor + smooth * f;
            }
        }
        m->inv_freq[i] = (float)f;
    }
    return NULL;
}

void dsc_model_rope_angles(const dsc_infer_model *m, float *cs, int64_t n, const int32_t *pos) {
    int32_t half = dsc_model_rope_dims(&m->cfg) / 2;
    for (int64_t t = 0; t < n; t++)
        for (int32_t i = 0; i < half; i++) {
            double angle = (double)pos[t] * (double)m->inv_freq[i];
            cs[t * 2 * half + i] = (float)cos(angle);
            cs[t * 2 * half + half + i] = (float)sin(angle);
        }
}

void dsc_model_rope(const dsc_infer_model *m, float *x, int64_t n, int32_t heads, const float *cs) {
    int32_t hs = m->cfg.head_size, half = dsc_model_rope_dims(&m->cfg) / 2;
    for (int64_t t = 0; t < n; t++) {
        const float *c = cs + t * 2 * half, *s = c + half;
        for (int32_t h = 0; h < heads; h++) {
            float *row = x + (t * heads + h) * hs;
#pragma omp simd
            for (int32_t i = 0; i < half; i++) {
                float a = row[i], b = row[i + half];
                row[i] = a * c[i] - b * s[i];
                row[i + half] = b * c[i] + a * s[i];
            }
        }
    }
}
