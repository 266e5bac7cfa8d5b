/* Helpers the dense layers share: declaring parameters under a prefix,
 * per-slot activation buffers (f32, or 2 bytes for what a backward reads only
 * as a product operand) and views into them, linear layers on dsc_params,
 * and the input check every layer runs.
 *
 * No layer logic lives here; each helper is used by at least two layers. */
#include <stdio.h>
#include <stdlib.h>

#include "dsc/kernels.h"
#include "dsc/precision.h"
#include "kernels/cpu/cpu_round.h"
#include "kernels/cpu/cpu_simd.h"
#include "runtime/nn/nn_internal.h"

dsc_status nn_declare(nn_param_list *list, dsc_param_store *store, const char *prefix, const char *leaf, int ndim,
                      const int64_t *shape, uint32_t flags, dsc_param_init init, float init_std, dsc_param **out) {
    return nn_declare_used(list, store, prefix, leaf, ndim, shape, flags, 0, init, init_std, out);
}

dsc_status nn_declare_used(nn_param_list *list, dsc_param_store *store, const char *prefix, const char *leaf,
                           int ndim, const int64_t *shape, uint32_t flags, uint32_t uses, dsc_param_init init,
                           float init_std, dsc_param **out) {
    char name[DSC_PARAM_NAME_MAX];
    int len = snprintf(name, sizeof name, "%s.%s", prefix, leaf);
    DSC_CHECK(len > 0 && (size_t)len < sizeof name, DSC_ERR_INVALID, "parameter name %s.%s is longer than %d",
              prefix, leaf, DSC_PARAM_NAME_MAX - 1);
    DSC_ASSERT(list->n < NN_MAX_LAYER_PARAMS);
    DSC_TRY(dsc_params_declare(store, name, ndim, shape, flags, init, init_std, out));
    list->uses[list->n] = uses;
    list->items[list->n++] = *out;
    return NULL;
}

dsc_status nn_set_params(dsc_layer *layer, const nn_param_list *list) {
    return dsc_layer_set_params(layer, list->items, list->uses, list->n);
}

dsc_status dsc_buffers_alloc(dsc_tensor **bufs, int count, int ndim, const int64_t *shape, dsc_device device) {
    return nn_buffers_alloc_as(bufs, count, ndim, shape, device, DSC_DTYPE_F32);
}

dsc_status nn_buffers_alloc_as(dsc_tensor **bufs, int count, int ndim, const int64_t *shape, dsc_device device,
                               dsc_dtype dtype) {
    *bufs = calloc((size_t)count, sizeof **bufs);
    DSC_CHECK(*bufs, DSC_ERR_NOMEM, "activation buffer table of %d entries", count);
    for (int i = 0; i < count; i++) {
        dsc_status s = dsc_tensor_alloc(&(*bufs)[i], dtype, ndim, shape, device, DSC_MEM_ACTIVATIONS);
        if (s) {
            dsc_buffers_free(bufs, i);
            return s;
        }
    }
    return NULL;
}

void dsc_buffers_free(dsc_tensor **bufs, int count) {
    if (!*bufs) return;
    for (int i = 0; i < count; i++)
        dsc_tensor_free(&(*bufs)[i]);
    free(*bufs);
    *bufs = NULL;
}

dsc_dtype nn_saved_dtype(dsc_dtype dtype, dsc_device device) {
    bool narrow = dtype == DSC_DTYPE_BF16 || dtype == DSC_DTYPE_F16;
    return narrow && device.type == DSC_DEVICE_CPU ? dtype : DSC_DTYPE_F32;
}

enum { SAVED_CHUNK = 1 << 14 }; /* values a thread packs or widens at a time */

/* to = from, one of them f32 and the other 2-byte: packed (rounded) or widened, over the kernels'
 * threads. */
static void convert(dsc_tensor *to, const dsc_tensor *from) {
    const int64_t n = dsc_tensor_numel(from), chunks = (n + SAVED_CHUNK - 1) / SAVED_CHUNK;
    const bool pack = to->dtype != DSC_DTYPE_F32;
    DSC_ASSERT(dsc_tensor_numel(to) == n && (pack ? from->dtype == DSC_DTYPE_F32 : from->dtype != DSC_DTYPE_F32));
#pragma omp parallel for num_threads(dsc_kernels_get_num_threads()) if (chunks >= 4) schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t b = c * SAVED_CHUNK, len = n - b < SAVED_CHUNK ? n - b : SAVED_CHUNK;
        if (pack)
            dsc_cpu_pack_span((uint16_t *)to->data + b, (const float *)from->data + b, len, to->dtype);
        else /* one row of len values, as the narrow weight formats widen */
            dsc_cpu_widen_rows((float *)to->data + b, (const uint16_t *)from->data + b,
                               from->dtype == DSC_DTYPE_BF16 ? DSC_WEIGHT_BF16 : DSC_WEIGHT_F16, len, 0, 1);
    }
}

void dsc_activations_convert(dsc_tensor *to, const dsc_tensor *from) {
    convert(to, from);
}

void nn_saved_store(dsc_tensor *saved, const dsc_tensor *value) {
    convert(saved, value);
}

void nn_keep(dsc_tensor kept, const dsc_tensor *value) {
    if (kept.dtype != DSC_DTYPE_F32) convert(&kept, value);
}

dsc_tensor nn_widened(const dsc_tensor *kept, dsc_tensor into) {
    if (kept->dtype == DSC_DTYPE_F32) return *kept;
    convert(&into, kept);
    return into;
}

void nn_saved_load(dsc_tensor *value, const dsc_tensor *saved) {
    convert(value, saved);
}

/* Process-wide, not per thread: a model's layers are reserved and run by one thread at a time. */
static struct {
    dsc_tensor buf[NN_WORK_COUNT];
    int holds;
} work;

void nn_work_hold(void) {
    work.holds++;
}

dsc_status nn_work_grow(int first, int count, int64_t numel, dsc_device device) {
    DSC_ASSERT(work.holds > 0 && first >= 0 && count >= 0 && first + count <= NN_WORK_COUNT);
    for (int i = 0; i < NN_WORK_COUNT; i++) {
        const dsc_device held = work.buf[i].device;
        char name[32];
        DSC_CHECK(!work.buf[i].data || (held.type == device.type && held.index == device.index),
                  DSC_ERR_UNSUPPORTED, "layer workspace: held for layers on another device than %s",
                  dsc_device_name(device, name, sizeof name));
    }
    for (int i = first; i < first + count; i++) {
        if (work.buf[i].data && dsc_tensor_numel(&work.buf[i]) >= numel) continue;
        dsc_tensor grown;
        DSC_TRY(dsc_tensor_alloc(&grown, DSC_DTYPE_F32, 1, (int64_t[]){numel}, device, DSC_MEM_ACTIVATIONS));
        dsc_tensor_free(&work.buf[i]);
        work.buf[i] = grown;
    }
    return NULL;
}

void nn_work_drop(void) {
    DSC_ASSERT(work.holds > 0);
    if (--work.holds > 0) return;
    for (int i = 0; i < NN_WORK_COUNT; i++)
        dsc_tensor_free(&work.buf[i]);
}

dsc_tensor nn_work_at(int which, int ndim, const int64_t *shape) {
    DSC_ASSERT(which >= 0 && which < NN_WORK_COUNT);
    return nn_view(&work.buf[which], ndim, shape);
}

dsc_tensor nn_view(const dsc_tensor *buf, int ndim, const int64_t *shape) {
    dsc_tensor v = dsc_tensor_view(buf->data, buf->dtype, ndim, shape, buf->device);
    DSC_ASSERT(dsc_tensor_numel(&v) <= dsc_tensor_numel(buf));
    return v;
}

dsc_tensor nn_rows(const dsc_tensor *t) {
    return nn_matrix(t, t->ndim ? t->shape[t->ndim - 1] : 1);
}

dsc_tensor nn_matrix(const dsc_tensor *t, int64_t cols) {
    const int64_t n = dsc_tensor_numel(t);
    DSC_ASSERT(cols > 0 && n % cols == 0);
    return dsc_tensor_view(t->data, t->dtype, 2, (int64_t[]){n / cols, cols}, t->device);
}

/* Linear operands as matrices: rows of in_features (C) and out_features (OC) from w (OC, C). */
dsc_status dsc_param_linear_forward(dsc_tensor *y, const dsc_tensor *x, const dsc_param *w,
                                    const dsc_param *bias) {
    const int64_t OC = w->value.shape[0], C = w->value.shape[1];
    dsc_tensor y2 = nn_matrix(y, OC), x2 = nn_matrix(x, C);
    return dsc_kernel_linear_forward(&y2, &x2, &w->value, bias ? &bias->value : NULL);
}

dsc_status dsc_param_linear_gelu_forward(dsc_tensor *act, dsc_tensor *y, const dsc_tensor *x, const dsc_param *w,
                                         const dsc_param *bias) {
    const int64_t OC = w->value.shape[0], C = w->value.shape[1];
    dsc_tensor act2 = nn_matrix(act, OC), y2 = nn_matrix(y, OC), x2 = nn_matrix(x, C);
    return dsc_kernel_linear_gelu_forward(&act2, &y2, &x2, &w->value, bias ? &bias->value : NULL);
}

/* The type dsc_round_to_product_type rounds t to, or f32 where it leaves t as it is. */
static dsc_dtype product_rounding(const dsc_tensor *t) {
    const dsc_dtype products = dsc_kernels_get_matmul_dtype();
    return t->dtype == DSC_DTYPE_F32 && t->device.type == DSC_DEVICE_CPU ? products : DSC_DTYPE_F32;
}

void dsc_round_to_product_type(dsc_tensor *t) {
    const dsc_dtype to = product_rounding(t);
    if (to != DSC_DTYPE_F32) dsc_round_to_dtype(t->data, dsc_tensor_numel(t), to);
}

dsc_status nn_copy_rounded(dsc_tensor *dst, const dsc_tensor *src) {
    const dsc_dtype to = product_rounding(dst);
    if (to == DSC_DTYPE_F32 || src->dtype != DSC_DTYPE_F32 || src->device.type != DSC_DEVICE_CPU ||
        dsc_tensor_numel(dst) != dsc_tensor_numel(src)) {
        DSC_TRY(dsc_tensor_copy(dst, src)); /* names a count mismatch */
        dsc_round_to_product_type(dst);
        return NULL;
    }
    dsc_round_to_dtype_from(dst->data, src->data, dsc_tensor_numel(src), to); /* copied and rounded in one pass */
    return NULL;
}

dsc_status dsc_param_linear_backward(dsc_tensor *dx, bool accumulate, dsc_param *w, dsc_param *bias,
                                     const dsc_tensor *dy, const dsc_tensor *x) {
    const int64_t OC = w->value.shape[0], C = w->value.shape[1];
    dsc_tensor dx2 = nn_matrix(dx, C), dy2 = nn_matrix(dy, OC), x2 = nn_matrix(x, C);
    dsc_tensor *dw = &w->grad, *db = bias ? &bias->grad : NULL;
    if (!accumulate) return dsc_kernel_linear_backward(&dx2, dw, db, &dy2, &x2, &w->value);
    DSC_TRY(dsc_kernel_linear_backward(NULL, dw, db, &dy2, &x2, &w->value));
    /* dx += dy (N, OC) @ w (OC, C) */
    return dsc_kernel_gemm(&dx2, &dy2, &w->value, NULL, false, false, 1.0f, 1.0f);
}

dsc_status nn_check_input(const dsc_layer *layer, const dsc_tensor *in, int64_t C) {
    DSC_CHECK(in, DSC_ERR_INVALID, "no input tensor");
    DSC_TRY(dsc_tensor_expect(in, "input", DSC_DTYPE_F32, 3, (const int64_t[]){-1, -1, C}));
    DSC_CHECK(in->shape[0] >= 1 && in->shape[0] <= layer->max_B && in->shape[1] >= 1 &&
                  in->shape[1] <= layer->max_T,
              DSC_ERR_INVALID, "input (%lld, %lld, %lld) exceeds the reserved micro-batch (%lld, %lld)",
              (long long)in->shape[0], (long long)in->shape[1], (long long)C, (long long)layer->max_B,
              (long long)layer->max_T);
    return NULL;
}

bool nn_arch_is_llama(const dsc_model_config *mc) {
    return mc->arch == DSC_ARCH_LLAMA || mc->arch == DSC_ARCH_MIXTRAL;
}
