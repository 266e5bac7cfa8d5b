/* The activation of the GPT family's non-gated MLP: GELU's tanh form
 * (GPT-2's gelu_new, dsc's gpt) through the shared kernel, and the two the
 * kernels do not have because no training path uses them: exact GELU
 * (0.5 x (1 + erf(x / sqrt 2)), GPT-NeoX's "gelu") and ReLU (OPT). The
 * inference forward runs on the CPU, so these are plain loops. Not here:
 * SwiGLU (the Llama family's gated MLP, a kernel). */
#include <math.h>

#include "dsc/kernels.h"
#include "inference/model_internal.h"

dsc_status dsc_model_activation(const dsc_infer_model_config *mc, dsc_tensor *out, const dsc_tensor *x) {
    if (mc->activation == DSC_INFER_ACT_GELU_TANH) return dsc_kernel_gelu_forward(out, x);
    const float *in = x->data;
    float *o = out->data;
    int64_t n = dsc_tensor_numel(x);
    bool relu = mc->activation == DSC_INFER_ACT_RELU;
    int nt = dsc_kernels_get_num_threads();
#pragma omp parallel for num_threads(nt) if (n > 4096) schedule(static)
    for (int64_t i = 0; i < n; i++)
        o[i] = relu ? (in[i] > 0.0f ? in[i] : 0.0f) : 0.5f * in[i] * (1.0f + erff(in[i] * 0.70710678118654752f));
    return NULL;
}
