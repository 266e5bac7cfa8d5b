/* Narrow weight formats (dsc/kernels.h): their names, sizes and tensor
 * shapes, and packing f32 weights into them on the host (done once, when a
 * model is loaded). The arithmetic that reads them lives in the backends
 * (kernels/cpu/cpu_simd.c); the public wrapper is in matmul.c. */
#include <math.h>
#include <string.h>

#include "core/backend.h"
#include "dsc/kernels.h"

static const char *const names[DSC_WEIGHT_FORMAT_COUNT] = {"f32", "bf16", "f16", "q8_0"};

enum { Q8_BLOCK = 32, Q8_BLOCK_BYTES = 34 };

const char *dsc_weight_format_name(dsc_weight_format format) {
    return (unsigned)format < DSC_WEIGHT_FORMAT_COUNT ? names[format] : "invalid";
}

dsc_status dsc_weight_format_from_name(const char *name, dsc_weight_format *out) {
    for (int f = 0; f < DSC_WEIGHT_FORMAT_COUNT; f++)
        if (strcmp(name, names[f]) == 0) {
            *out = (dsc_weight_format)f;
            return NULL;
        }
    return dsc_error(DSC_ERR_INVALID, "unknown weight type \"%s\" (expected f32, bf16, f16 or q8_0)", name);
}

size_t dsc_weight_row_bytes(dsc_weight_format format, int64_t c) {
    if (c < 0) return 0;
    switch (format) {
    case DSC_WEIGHT_F32:
        return (size_t)c * 4;
    case DSC_WEIGHT_BF16:
    case DSC_WEIGHT_F16:
        return (size_t)c * 2;
    case DSC_WEIGHT_Q8_0:
        return c % Q8_BLOCK ? 0 : (size_t)(c / Q8_BLOCK) * Q8_BLOCK_BYTES;
    default:
        return 0;
    }
}

dsc_dtype dsc_weight_dtype(dsc_weight_format format) {
    static const dsc_dtype dtypes[DSC_WEIGHT_FORMAT_COUNT] = {DSC_DTYPE_F32, DSC_DTYPE_BF16, DSC_DTYPE_F16,
                                                              DSC_DTYPE_U8};
    return (unsigned)format < DSC_WEIGHT_FORMAT_COUNT ? dtypes[format] : DSC_DTYPE_COUNT;
}

int64_t dsc_weight_cols(dsc_weight_format format, int64_t c) {
    size_t elt = dsc_dtype_size(dsc_weight_dtype(format));
    return elt ? (int64_t)(dsc_weight_row_bytes(format, c) / elt) : 0;
}

static void pack_q8_0(uint8_t *dst, const float *src, int64_t c) {
    for (int64_t b = 0; b < c / Q8_BLOCK; b++, dst += Q8_BLOCK_BYTES) {
        const float *x = src + b * Q8_BLOCK;
        float amax = 0.0f;
        for (int j = 0; j < Q8_BLOCK; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
        uint16_t dh = dsc_f32_to_f16(d);
        memcpy(dst, &dh, sizeof dh);
        for (int j = 0; j < Q8_BLOCK; j++)
            ((int8_t *)(dst + 2))[j] = (int8_t)lrintf(fmaxf(-127.0f, fminf(127.0f, roundf(x[j] * id))));
    }
}

dsc_status dsc_weight_pack(void *dst, dsc_weight_format format, const float *src, int64_t rows, int64_t c) {
    size_t rb = dsc_weight_row_bytes(format, c);
    DSC_CHECK(rb > 0 || c == 0, DSC_ERR_INVALID, "weight pack: %lld columns do not fit format %s%s", (long long)c,
              dsc_weight_format_name(format), format == DSC_WEIGHT_Q8_0 ? " (needs a multiple of 32)" : "");
    DSC_CHECK(rows >= 0, DSC_ERR_INVALID, "weight pack: %lld rows", (long long)rows);
    for (int64_t r = 0; r < rows; r++) {
        const float *x = src + r * c;
        uint8_t *out = (uint8_t *)dst + (size_t)r * rb;
        uint16_t *h = (uint16_t *)out;
        switch (format) {
        case DSC_WEIGHT_F32:
            memcpy(out, x, rb);
            break;
        case DSC_WEIGHT_BF16:
            for (int64_t j = 0; j < c; j++)
                h[j] = dsc_f32_to_bf16(x[j]);
            break;
        case DSC_WEIGHT_F16:
            for (int64_t j = 0; j < c; j++)
                h[j] = dsc_f32_to_f16(x[j]);
            break;
        default:
            pack_q8_0(out, x, c);
            break;
        }
    }
    return NULL;
}

int64_t dsc_kernel_linear_packed_workspace(dsc_weight_format format, int64_t c, int threads) {
    if (format == DSC_WEIGHT_F32) return 0;
    return (int64_t)(threads > 0 ? threads : 1) * DSC_LINEAR_PACKED_PANEL * c;
}
