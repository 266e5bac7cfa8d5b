/* Rounding f32 values to bf16 / fp16 and back, in place: what storing a
 * value in the reduced type and reading it again gives. Round to nearest
 * even as torch's .to(torch.bfloat16) / .half() (c10::BFloat16's
 * round_to_nearest_even, c10::Half's fp16_ieee_from_fp32_value): overflow to
 * inf, fp16 subnormals kept, NaN stays NaN.
 *
 * bf16 is integer arithmetic on the f32 bits, which the compiler vectorises;
 * fp16 takes F16C's vcvtps2ph / vcvtph2ps (the hardware rounds to nearest
 * even) when the CPU has it (kernels/cpu/cpu_simd.h decides, once, at run
 * time), else the portable conversion of core/tensor.c. */
#include <math.h>
#include <string.h>

#include "dsc/kernels.h"
#include "dsc/precision.h"
#include "kernels/cpu/cpu_simd.h"

#if defined(__x86_64__) || defined(__i386__)
#define DSC_HAVE_F16C_BUILD 1
#include <immintrin.h>
#endif

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

/* dst[i] = x[i] rounded, for dst == x or buffers that do not overlap. */
static void round_bf16(float *dst, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) { /* memcpy: the bits of a float without aliasing it (vectorises) */
        uint32_t v;
        memcpy(&v, &x[i], 4);
        uint32_t r = (v + 0x7fffu + ((v >> 16) & 1u)) & 0xffff0000u;
        r = (v & 0x7fffffffu) > 0x7f800000u ? 0x7fc00000u : r;
        memcpy(&dst[i], &r, 4);
    }
}

#ifdef DSC_HAVE_F16C_BUILD
__attribute__((target("avx2,f16c"))) static int64_t round_f16_f16c(float *dst, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    return i;
}
#endif

static void round_f16(float *dst, const float *x, int64_t n) {
    int64_t i = 0;
#ifdef DSC_HAVE_F16C_BUILD
    if (dsc_cpu_simd()) i = round_f16_f16c(dst, x, n);
#endif
    for (; i < n; i++)
        dst[i] = dsc_f16_to_f32(dsc_f32_to_f16(x[i]));
}

static void round_span(float *dst, const float *src, int64_t n, dsc_dtype dtype) {
    if (dtype == DSC_DTYPE_BF16)
        round_bf16(dst, src, n);
    else if (dtype == DSC_DTYPE_F16)
        round_f16(dst, src, n);
    else if (dst != src && n > 0)
        memcpy(dst, src, (size_t)n * sizeof *dst);
}

/* Passes over a model's values or a layer's gradients split into chunks over the kernels' threads
 * (one thread streamed 124M values at a third of the machine's rate: 2.5 % of a GPT-2 step). */
enum { CHUNK = 1 << 14 };

void dsc_round_to_dtype_from(float *dst, const float *src, int64_t n, dsc_dtype dtype) {
    const int64_t chunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for num_threads(dsc_kernels_get_num_threads()) if (chunks >= 4) schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t b = c * CHUNK, len = n - b < CHUNK ? n - b : CHUNK;
        round_span(dst + b, src + b, len, dtype);
    }
}

void dsc_precision_add_rounded(float *acc, const float *part, int64_t n, float scale, dsc_dtype dtype) {
    enum { BLOCK = 1024 }; /* scaled and rounded in L1, then added */
    const int64_t chunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for num_threads(dsc_kernels_get_num_threads()) if (chunks >= 4) schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        float v[BLOCK];
        for (int64_t b = c * CHUNK, end = n < b + CHUNK ? n : b + CHUNK; b < end; b += BLOCK) {
            int64_t len = end - b < BLOCK ? end - b : BLOCK;
            for (int64_t i = 0; i < len; i++)
                v[i] = part[b + i] * scale;
            round_span(v, v, len, dtype);
            for (int64_t i = 0; i < len; i++)
                acc[b + i] += v[i];
        }
    }
}

void dsc_precision_scale_rounded(float *x, int64_t n, float scale, dsc_dtype dtype) {
    const int64_t chunks = (n + CHUNK - 1) / CHUNK;
#pragma omp parallel for num_threads(dsc_kernels_get_num_threads()) if (chunks >= 4) schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t b = c * CHUNK, len = n - b < CHUNK ? n - b : CHUNK;
        for (int64_t i = b; i < b + len; i++)
            x[i] *= scale;
        round_span(x + b, x + b, len, dtype);
    }
}

void dsc_round_to_dtype(float *x, int64_t n, dsc_dtype dtype) {
    dsc_round_to_dtype_from(x, x, n, dtype);
}

bool dsc_round_scaled(float *x, int64_t n, float scale, dsc_dtype dtype) {
    if (scale != 1.0f)
        for (int64_t i = 0; i < n; i++)
            x[i] *= scale;
    dsc_round_to_dtype(x, n, dtype);
    bool finite = true;
    for (int64_t i = 0; i < n; i++)
        finite &= isfinite(x[i]) != 0;
    return finite;
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
