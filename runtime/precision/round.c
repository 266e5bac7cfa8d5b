/* Rounding f32 values to bf16 / fp16 and back over a model's values or a
 * layer's gradients (the spans themselves: kernels/cpu/cpu_round.c, which the
 * kernels' bf16 / fp16 products share), and packing them into 2-byte
 * buffers and back. */
#include <string.h>

#include "dsc/kernels.h"
#include "dsc/precision.h"
#include "kernels/cpu/cpu_round.h"

/* NaN: torch's tensor conversion (at::vec's cvtfp32_bf16) writes 0xffff for every NaN */
uint16_t dsc_precision_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0xffff;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* NaN: quieted, keeping the top payload bits (what F16C's vcvtps2ph and torch's .half() give) */
uint16_t dsc_precision_to_f16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)(((u >> 16) & 0x8000u) | 0x7e00u | ((u & 0x7fffffu) >> 13));
    return dsc_f32_to_f16(x);
}

/* Passes over a model's values or a layer's gradients split into chunks over the kernels' threads
 * (one thread streamed 124M values at a third of the machine's rate: 2.5 % of a GPT-2 step). */
enum { CHUNK = 1 << 14 };

void dsc_round_to_dtype_from(float *dst, const float *src, int64_t n, dsc_dtype dtype) {
    const int64_t chunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for num_threads(dsc_kernels_get_num_threads()) if (chunks >= 4) schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t b = c * CHUNK, len = n - b < CHUNK ? n - b : CHUNK;
        dsc_cpu_round_span(dst + b, src + b, len, dtype);
    }
}

void dsc_precision_add_rounded(float *acc, const float *part, int64_t n, dsc_dtype dtype) {
    enum { BLOCK = 1024 }; /* rounded in L1, then added */
    const int64_t chunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for num_threads(dsc_kernels_get_num_threads()) if (chunks >= 4) schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        float v[BLOCK];
        for (int64_t b = c * CHUNK, end = n < b + CHUNK ? n : b + CHUNK; b < end; b += BLOCK) {
            int64_t len = end - b < BLOCK ? end - b : BLOCK;
            dsc_cpu_round_span(v, part + b, len, dtype);
            for (int64_t i = 0; i < len; i++)
                acc[b + i] += v[i];
        }
    }
}

void dsc_round_to_dtype(float *x, int64_t n, dsc_dtype dtype) {
    dsc_round_to_dtype_from(x, x, n, dtype);
}

/* pack and unpack run in place over one buffer read as f32 and written as
 * 2-byte values (or the reverse): every access goes through memcpy on bytes,
 * so the compiler sees the overlap (no type-based aliasing assumption) and
 * keeps the order that makes it safe. */
void dsc_precision_pack_to(void *dst, const float *src, int64_t n, dsc_dtype dtype) {
    unsigned char *d = dst;
    const unsigned char *s = (const unsigned char *)src;
    /* ascending: in place, element i's 2 bytes land below every element not read yet */
    for (int64_t i = 0; i < n; i++) {
        float x;
        memcpy(&x, s + 4 * i, 4);
        uint16_t h = dtype == DSC_DTYPE_BF16 ? dsc_precision_to_bf16(x) : dsc_precision_to_f16(x);
        memcpy(d + 2 * i, &h, 2);
    }
}

void dsc_precision_pack(void *buf, int64_t n, dsc_dtype dtype) {
    dsc_precision_pack_to(buf, buf, n, dtype);
}

static inline float widen(uint16_t h, dsc_dtype dtype) {
    return dtype == DSC_DTYPE_BF16 ? dsc_bf16_to_f32(h) : dsc_f16_to_f32(h);
}

void dsc_precision_unpack(float *dst, const void *src, int64_t n, dsc_dtype dtype) {
    unsigned char *d = (unsigned char *)dst;
    const unsigned char *s = src;
    for (int64_t i = n - 1; i >= 0; i--) { /* descending: in place when dst starts at or after src */
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        float x = widen(h, dtype);
        memcpy(d + 4 * i, &x, 4);
    }
}

/* Ascending: f32 i takes bytes [4i, 4i + 4), which hold 2-byte values 2i - n and 2i + 1 - n of the upper
 * half, both at most i, so already read. */
void dsc_precision_widen_upper(float *buf, int64_t n, dsc_dtype dtype) {
    unsigned char *b = (unsigned char *)buf;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, b + 2 * n + 2 * i, 2);
        float x = widen(h, dtype);
        memcpy(b + 4 * i, &x, 4);
    }
}

void dsc_precision_unpack_add(float *dst, const void *src, int64_t n, dsc_dtype dtype) {
    const unsigned char *s = src;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, s + 2 * i, 2);
        dst[i] += widen(h, dtype);
    }
}
