/* Rounding f32 values to bf16 / fp16 and back: round to nearest even as torch's
 * .to(torch.bfloat16) / .half() (c10::BFloat16's round_to_nearest_even, c10::Half's
 * fp16_ieee_from_fp32_value): overflow to inf, fp16 subnormals kept, NaN stays NaN.
 *
 * bf16 is integer arithmetic on the f32 bits, which the compiler vectorises; fp16 takes F16C's
 * vcvtps2ph / vcvtph2ps (the hardware rounds to nearest even) when the CPU has it
 * (kernels/cpu/cpu_simd.h decides, once, at run time), else the portable conversion of
 * core/tensor.c. */
#include <string.h>

#include "kernels/cpu/cpu_round.h"
#include "kernels/cpu/cpu_simd.h"

#if defined(__x86_64__) || defined(__i386__)
#define DSC_X86_SIMD_BUILD 1
#include <immintrin.h>
#endif

#ifdef DSC_X86_SIMD_BUILD
/* The scalar loops below on 16 values at a time, in GCC's vector extensions, compiled for AVX-512
 * and for AVX2 (two 256-bit halves): the generic build vectorises them for SSE2 at best, and mixed
 * precision's products round every operand (a tenth of a bf16 GPT-2-small step). BF16_BITS: the
 * rounded f32 bit patterns (NaN: 0x7fc00000), as round_bf16. */
typedef uint32_t u32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
#define BF16_NAN(v) ((u32x16)((i32x16)((v)&0x7fffffffu) > 0x7f800000)) /* all ones where NaN */
#define BF16_BITS(v)                                                                                              \
    (((((v) + 0x7fffu + (((v) >> 16) & 1u)) & 0xffff0000u) & ~BF16_NAN(v)) | (BF16_NAN(v) & 0x7fc00000u))
/* name(dst, x, n): as many of the first values of x as the CPU's vector loops take (a multiple of
 * 16; 0 without AVX2) rounded (widened back: float dst) or packed (their upper halves: uint16_t
 * dst); returns how many. */
#define BF16_LOOP(store)                                                                                          \
    int64_t i = 0;                                                                                                \
    for (; i + 16 <= n; i += 16) {                                                                                \
        u32x16 v;                                                                                                 \
        memcpy(&v, x + i, sizeof v);                                                                              \
        store;                                                                                                    \
    }                                                                                                             \
    return i;
#define BF16_VECTORS(name, out_type, store)                                                                       \
    __attribute__((target("avx512f"))) static int64_t name##_avx512(out_type *dst, const float *x, int64_t n) {   \
        BF16_LOOP(store)                                                                                          \
    }                                                                                                             \
    __attribute__((target("avx2"))) static int64_t name##_avx2(out_type *dst, const float *x, int64_t n) {        \
        BF16_LOOP(store)                                                                                          \
    }                                                                                                             \
    static int64_t name(out_type *dst, const float *x, int64_t n) {                                               \
        return dsc_cpu_simd_avx512() ? name##_avx512(dst, x, n) : dsc_cpu_simd() ? name##_avx2(dst, x, n) : 0;    \
    }
#define ROUNDED                                                                                                   \
    u32x16 r = BF16_BITS(v);                                                                                      \
    memcpy(dst + i, &r, sizeof r)
#define PACKED                                                                                                    \
    u16x16 h = __builtin_convertvector(BF16_BITS(v) >> 16, u16x16);                                               \
    memcpy(dst + i, &h, sizeof h)
BF16_VECTORS(round_bf16_vectors, float, ROUNDED)
BF16_VECTORS(pack_bf16_vectors, uint16_t, PACKED)
#else
static int64_t round_bf16_vectors(float *dst, const float *x, int64_t n) {
    (void)dst, (void)x, (void)n;
    return 0;
}
static int64_t pack_bf16_vectors(uint16_t *dst, const float *x, int64_t n) {
    (void)dst, (void)x, (void)n;
    return 0;
}
#endif

/* dst[i] = x[i] rounded, for dst == x or buffers that do not overlap. */
static void round_bf16(float *dst, const float *x, int64_t n) {
    int64_t i = round_bf16_vectors(dst, x, n);
    for (; i < n; i++) { /* memcpy: the bits of a float without aliasing it */
        uint32_t v;
        memcpy(&v, &x[i], 4);
        uint32_t r = (v + 0x7fffu + ((v >> 16) & 1u)) & 0xffff0000u;
        r = (v & 0x7fffffffu) > 0x7f800000u ? 0x7fc00000u : r;
        memcpy(&dst[i], &r, 4);
    }
}

#ifdef DSC_X86_SIMD_BUILD
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
#ifdef DSC_X86_SIMD_BUILD
    if (dsc_cpu_simd()) i = round_f16_f16c(dst, x, n);
#endif
    for (; i < n; i++)
        dst[i] = dsc_f16_to_f32(dsc_f32_to_f16(x[i]));
}

void dsc_cpu_round_span(float *dst, const float *src, int64_t n, dsc_dtype dtype) {
    if (dtype == DSC_DTYPE_BF16)
        round_bf16(dst, src, n);
    else if (dtype == DSC_DTYPE_F16)
        round_f16(dst, src, n);
    else if (dst != src && n > 0)
        memcpy(dst, src, (size_t)n * sizeof *dst);
}

#ifdef DSC_X86_SIMD_BUILD
__attribute__((target("avx2,f16c"))) static int64_t pack_f16_f16c(uint16_t *dst, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    return i;
}
#endif

void dsc_cpu_pack_span(uint16_t *dst, const float *src, int64_t n, dsc_dtype dtype) {
    int64_t i = 0;
    if (dtype == DSC_DTYPE_BF16) {
        for (i = pack_bf16_vectors(dst, src, n); i < n; i++) { /* as round_bf16, keeping the upper half */
            uint32_t v;
            memcpy(&v, &src[i], 4);
            uint32_t r = (v & 0x7fffffffu) > 0x7f800000u ? 0x7fc00000u : v + 0x7fffu + ((v >> 16) & 1u);
            dst[i] = (uint16_t)(r >> 16);
        }
        return;
    }
#ifdef DSC_X86_SIMD_BUILD
    if (dsc_cpu_simd()) i = pack_f16_f16c(dst, src, n);
#endif
    for (; i < n; i++)
        dst[i] = dsc_f32_to_f16(src[i]);
}
