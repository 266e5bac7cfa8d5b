/* The weight-type option of a loaded model: re-stores its projection
 * weights (fused QKV, attention output, MLP in and out of every layer, the
 * untied LM head) as bf16, f16 or Q8_0 (dsc/kernels.h), so decode reads
 * half or about a quarter of the bytes per token; the kernels widen them in
 * registers. Norms, biases, embeddings (a row lookup) and MoE experts stay
 * f32. The arena is rebuilt with the narrow weights in place of the f32
 * ones (the f32 copy is freed), and a widening workspace for prompt-sized
 * batches is kept with the model. Not here: loading (model_build.c) or
 * using them (model_forward.c). */
#include <string.h>

#include "dsc/kernels.h"
#include "inference/model_internal.h"

static bool narrowed_role(dsc_param_role role) {
    return role == DSC_PARAM_ROLE_QKV_W || role == DSC_PARAM_ROLE_ATTN_OUT_W || role == DSC_PARAM_ROLE_MLP1_W ||
           role == DSC_PARAM_ROLE_MLP2_W || role == DSC_PARAM_ROLE_UNEMBED;
}

static size_t padded(size_t bytes) {
    return (bytes + DSC_MEM_ALIGN - 1) / DSC_MEM_ALIGN * DSC_MEM_ALIGN;
}

/* Bytes parameter t takes in the new arena (narrowed when `narrow`). */
static size_t new_bytes(const dsc_tensor *t, bool narrow, dsc_weight_format f) {
    return padded(narrow ? (size_t)t->shape[0] * dsc_weight_row_bytes(f, t->shape[1]) : dsc_tensor_nbytes(t));
}

dsc_status dsc_infer_model_set_weight_type(dsc_infer_model *m, dsc_weight_format f) {
    DSC_CHECK((unsigned)f < DSC_WEIGHT_FORMAT_COUNT, DSC_ERR_INVALID, "weight type %d is not a dsc_weight_format",
              (int)f);
    if (f == DSC_WEIGHT_F32) return NULL;
    DSC_CHECK(!m->widen, DSC_ERR_INVALID, "model %s: the weight type is already %s", m->policy->arch,
              dsc_weight_format_name(m->weight_format));
    size_t n = ((size_t)m->cfg.n_layer + 1) * DSC_PARAM_ROLE_COUNT, bytes = 0;
    int64_t max_cols = 0;
    for (size_t i = 0; i < n; i++) {
        const dsc_tensor *t = &m->params[i];
        if (!t->data) continue;
        bool narrow = narrowed_role((dsc_param_role)(i % DSC_PARAM_ROLE_COUNT)) && t->ndim == 2;
        if (narrow) {
            DSC_CHECK(dsc_weight_row_bytes(f, t->shape[1]) > 0, DSC_ERR_UNSUPPORTED,
                      "model %s: weight type %s needs rows of a multiple of 32 values; parameter of role %d in "
                      "container %zu has %lld",
                      m->policy->arch, dsc_weight_format_name(f), (int)(i % DSC_PARAM_ROLE_COUNT),
                      i / DSC_PARAM_ROLE_COUNT, (long long)t->shape[1]);
            max_cols = t->shape[1] > max_cols ? t->shape[1] : max_cols;
        }
        bytes += new_bytes(t, narrow, f);
    }
    int64_t widen_floats = dsc_kernel_linear_packed_workspace(f, max_cols, dsc_kernels_get_num_threads());
    size_t widen_bytes = (size_t)widen_floats * sizeof(float);
    void *arena = NULL, *widen = NULL;
    DSC_TRY(dsc_mem_alloc(&arena, bytes, DSC_MEM_PARAMS, DSC_CPU));
    dsc_status s = dsc_mem_alloc(&widen, widen_bytes, DSC_MEM_ACTIVATIONS, DSC_CPU);
    if (s) {
        dsc_mem_free(arena, bytes, DSC_MEM_PARAMS, DSC_CPU);
        return dsc_error_wrap(s, "model %s: %s weight workspace", m->policy->arch, dsc_weight_format_name(f));
    }
    /* Fill the new arena first, then move the views: a failure leaves the model as it was. */
    for (int pass = 0; pass < 2 && !s; pass++) {
        size_t off = 0;
        for (size_t i = 0; i < n && !s; i++) {
            dsc_tensor *t = &m->params[i];
            if (!t->data) continue;
            bool narrow = narrowed_role((dsc_param_role)(i % DSC_PARAM_ROLE_COUNT)) && t->ndim == 2;
            void *dst = (char *)arena + off;
            off += new_bytes(t, narrow, f);
            int64_t shape[2] = {t->shape[0], narrow ? dsc_weight_cols(f, t->shape[1]) : 0};
            if (pass == 0 && narrow)
                s = dsc_weight_pack(dst, f, t->data, t->shape[0], t->shape[1]);
            else if (pass == 0)
                memcpy(dst, t->data, dsc_tensor_nbytes(t));
            else if (narrow)
                *t = dsc_tensor_view(dst, dsc_weight_dtype(f), 2, shape, DSC_CPU);
            else
                t->data = dst;
        }
    }
    if (s) {
        dsc_mem_free(arena, bytes, DSC_MEM_PARAMS, DSC_CPU);
        dsc_mem_free(widen, widen_bytes, DSC_MEM_ACTIVATIONS, DSC_CPU);
        return dsc_error_wrap(s, "model %s: packing weights as %s", m->policy->arch, dsc_weight_format_name(f));
    }
    dsc_mem_free(m->arena, m->arena_bytes, DSC_MEM_PARAMS, DSC_CPU);
    m->arena = arena;
    m->arena_bytes = bytes;
    m->widen = widen;
    m->widen_floats = widen_floats;
    m->weight_format = f;
    return NULL;
}

dsc_weight_format dsc_infer_model_weight_type(const dsc_infer_model *m) {
    return m->weight_format;
}
