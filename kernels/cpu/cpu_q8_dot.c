/* The Q8_0 x Q8_0 dot products of cpu_q8_dot.h: the quantisation of x rows
 * (as llama.cpp's quantize_row_q8_0 and the gguf package's reference: d =
 * max|x| / 127, id = 1 / d, q = x * id rounded half away from zero, d
 * stored as f16) and the block-wise integer dot products against Q8_0
 * weight rows, portable and in AVX2 and AVX-512 VNNI versions chosen at run
 * time (the 256-bit loops of cpu_q8_dot_loops.h, compiled once per set). Every
 * version computes the same integer block sums; they differ only in the order
 * in which the scaled block sums are added in f32. */
#include <math.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/tensor.h"
#include "kernels/cpu/cpu_q8_dot.h"
#include "kernels/cpu/cpu_simd.h"

#if defined(__x86_64__) || defined(__i386__)
#define DSC_Q8_X86 1
#include <immintrin.h>
#endif

enum { Q8_BLOCK = 32, Q8_BLOCK_BYTES = 34 }; /* a weight block: f16 scale + 32 int8 */
/* How far ahead of the block in use the weight stream is prefetched: the hardware prefetcher alone
 * kept the 34-byte blocks at 14 GB/s on two threads (Sapphire Rapids, read rate 22-25 GB/s);
 * 1 KB ahead gave 17, 2 and 4 KB 19.7. */
enum { Q8_PREFETCH_BYTES = 2048 };

enum { LEVEL_UNKNOWN, LEVEL_SCALAR, LEVEL_AVX2, LEVEL_VNNI };
static _Atomic int q8_level_state;

static int q8_level(void) {
    int s = atomic_load(&q8_level_state);
    if (s) return s;
    s = LEVEL_SCALAR;
#ifdef DSC_Q8_X86
    if (dsc_cpu_simd()) { /* AVX2 + FMA + F16C, and DSC_CPU_SIMD is not "scalar" */
        const char *env = getenv("DSC_CPU_SIMD");
        bool avx2_only = env && strcmp(env, "avx2") == 0;
        __builtin_cpu_init();
        bool vnni = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                    __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
        s = vnni && !avx2_only ? LEVEL_VNNI : LEVEL_AVX2;
    }
#endif
    atomic_store(&q8_level_state, s);
    return s;
}

const char *dsc_cpu_q8_dot_level(void) {
    int s = q8_level();
    return s == LEVEL_VNNI ? "avx512vnni" : s == LEVEL_AVX2 ? "avx2" : "scalar";
}

/* ---- portable reference -------------------------------------------------------------------- */

/* The f32 scale of one block of 32 values and its inverse, as llama.cpp and gguf compute them. */
static inline float block_scale(float amax, float *id) {
    float d = amax / 127.0f;
    *id = d != 0.0f ? 1.0f / d : 0.0f;
    return dsc_f16_to_f32(dsc_f32_to_f16(d));
}

void dsc_cpu_q8_quantize_rows_scalar(void *dst, const float *x, int64_t n, int64_t c) {
    const size_t xrb = dsc_cpu_q8_act_row_bytes(c);
    for (int64_t i = 0; i < n; i++) {
        int8_t *q = (int8_t *)dst + (size_t)i * xrb;
        for (int64_t b = 0; b < c / Q8_BLOCK; b++) {
            const float *xb = x + i * c + b * Q8_BLOCK;
            float amax = 0.0f, id;
            for (int j = 0; j < Q8_BLOCK; j++)
                amax = fmaxf(amax, fabsf(xb[j]));
            float d = block_scale(amax, &id);
            memcpy(q + c + b * (int64_t)sizeof d, &d, sizeof d);
            for (int j = 0; j < Q8_BLOCK; j++)
                q[b * Q8_BLOCK + j] = (int8_t)roundf(xb[j] * id);
        }
    }
}

void dsc_cpu_q8_dot_rows_scalar(float *y, int64_t ldy, const void *xq, int64_t m, const void *w, int64_t c,
                                int64_t r0, int64_t r1) {
    const size_t rb = (size_t)(c / Q8_BLOCK) * Q8_BLOCK_BYTES, xrb = dsc_cpu_q8_act_row_bytes(c);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *row = (const uint8_t *)w + (size_t)r * rb;
        for (int64_t i = 0; i < m; i++) {
            const int8_t *xi = (const int8_t *)xq + (size_t)i * xrb;
            float acc = 0.0f;
            for (int64_t b = 0; b < c / Q8_BLOCK; b++) {
                const uint8_t *blk = row + b * Q8_BLOCK_BYTES;
                const int8_t *wb = (const int8_t *)(blk + 2), *xb = xi + b * Q8_BLOCK;
                int32_t s = 0;
                for (int j = 0; j < Q8_BLOCK; j++)
                    s += (int32_t)xb[j] * (int32_t)wb[j];
                uint16_t dh;
                float dx;
                memcpy(&dh, blk, sizeof dh);
                memcpy(&dx, xi + c + b * (int64_t)sizeof dx, sizeof dx);
                acc += dsc_f16_to_f32(dh) * dx * (float)s;
            }
            y[i * ldy + r] = acc;
        }
    }
}

/* ---- AVX2 and AVX-512 VNNI ----------------------------------------------------------------- */
#ifdef DSC_Q8_X86
#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Rounds half away from zero, as roundf: trunc(|v|) + (frac >= 0.5), with v's sign (frac is exact). */
AVX2 static inline __m256i round_away(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 a = _mm256_andnot_ps(sign, v), t = _mm256_round_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    t = _mm256_add_ps(t, _mm256_and_ps(_mm256_cmp_ps(_mm256_sub_ps(a, t), _mm256_set1_ps(0.5f), _CMP_GE_OQ),
                                       _mm256_set1_ps(1.0f)));
    return _mm256_cvttps_epi32(_mm256_or_ps(t, _mm256_and_ps(v, sign)));
}

AVX2 static void quantize_rows_avx2(void *dst, const float *x, int64_t n, int64_t c) {
    const size_t xrb = dsc_cpu_q8_act_row_bytes(c);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n; i++) {
        int8_t *q = (int8_t *)dst + (size_t)i * xrb;
        for (int64_t b = 0; b < c / Q8_BLOCK; b++) {
            const float *xb = x + i * c + b * Q8_BLOCK;
            __m256 v[4], mx = _mm256_setzero_ps();
            for (int g = 0; g < 4; g++) {
                v[g] = _mm256_loadu_ps(xb + 8 * g);
                mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[g]));
            }
            __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
            m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
            float id, d = block_scale(_mm_cvtss_f32(m4), &id);
            memcpy(q + c + b * (int64_t)sizeof d, &d, sizeof d);
            __m256 mul = _mm256_set1_ps(id);
            __m256i i0 = round_away(_mm256_mul_ps(v[0], mul)), i1 = round_away(_mm256_mul_ps(v[1], mul)),
                    i2 = round_away(_mm256_mul_ps(v[2], mul)), i3 = round_away(_mm256_mul_ps(v[3], mul));
            /* the packs interleave the 128-bit lanes; the permutation puts the 32 bytes back in order */
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
            p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(q + b * Q8_BLOCK), p);
        }
    }
}

/* AVX2: |w| (u8) times sign-applied x (s8), pairs summed to s16 (at most 2 * 127 * 127: no
 * saturation), then pairs of those to s32. */
#define Q8_NAME(s) q8_##s##_avx2
#define Q8_TARGET AVX2
#define Q8_PROD(aw, sx) _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1))
#include "kernels/cpu/cpu_q8_dot_loops.h"
#undef Q8_NAME
#undef Q8_TARGET
#undef Q8_PROD

/* AVX-512 VNNI (on 256-bit vectors, with AVX-512VL's 32 registers): four products summed to s32 in one. */
#define Q8_NAME(s) q8_##s##_vnni
#define Q8_TARGET __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512vnni")))
#define Q8_PROD(aw, sx) _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, sx)
#include "kernels/cpu/cpu_q8_dot_loops.h"
#undef Q8_NAME
#undef Q8_TARGET
#undef Q8_PROD

/* AVX-512 VNNI on 512-bit vectors, two blocks a step (rows of an even number of blocks): the
 * 256-bit loop spends 7 instructions per block and x row; this one 8 per two. AVX-512 has no
 * byte sign instruction: x is negated under the mask of w's negative bytes instead. */
#define VNNI512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))

VNNI512 __attribute__((always_inline)) static inline void
q8_row_vnni512(float *y, int64_t ldy, const int8_t *xq, size_t xrb, const uint8_t *row, int64_t c, const int M) {
    const __m512i pairs = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    __m512 acc[DSC_CPU_Q8_MAX_ROWS];
    for (int i = 0; i < M; i++)
        acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < c / Q8_BLOCK; b += 2) {
        const uint8_t *blk = row + b * Q8_BLOCK_BYTES;
        _mm_prefetch((const char *)blk + Q8_PREFETCH_BYTES, _MM_HINT_T0);
        uint16_t d0, d1;
        memcpy(&d0, blk, sizeof d0);
        memcpy(&d1, blk + Q8_BLOCK_BYTES, sizeof d1);
        const __m128 dw = _mm_cvtph_ps(_mm_cvtsi32_si128((int)((uint32_t)d1 << 16 | d0))); /* both scales */
        const __m512i wq =
            _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(blk + 2))),
                               _mm256_loadu_si256((const __m256i *)(blk + Q8_BLOCK_BYTES + 2)), 1);
        const __m512i aw = _mm512_abs_epi8(wq); /* |w|, a u8 operand */
        const __mmask64 neg = _mm512_movepi8_mask(wq);
        for (int i = 0; i < M; i++) {
            const int8_t *xi = xq + (size_t)i * xrb;
            __m512i xv = _mm512_loadu_si512((const void *)(xi + b * Q8_BLOCK));
            __m512i sx = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
            __m128 dx = _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(xi + c + b * (int64_t)sizeof(float))));
            /* the two blocks' products of scales, 8 lanes each */
            __m512 scale = _mm512_permutexvar_ps(pairs, _mm512_castps128_ps512(_mm_mul_ps(dw, dx)));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), aw, sx)),
                                     scale, acc[i]);
        }
    }
    for (int i = 0; i < M; i++)
        y[i * ldy] = _mm512_reduce_add_ps(acc[i]);
}

VNNI512 __attribute__((always_inline)) static inline void q8_rows_m_vnni512(float *y, int64_t ldy,
                                                                            const int8_t *xq, const uint8_t *w,
                                                                            int64_t c, int64_t r0, int64_t r1,
                                                                            const int M) {
    const size_t rb = (size_t)(c / Q8_BLOCK) * Q8_BLOCK_BYTES, xrb = dsc_cpu_q8_act_row_bytes(c);
    for (int64_t r = r0; r < r1; r++)
        q8_row_vnni512(y + r, ldy, xq, xrb, w + (size_t)r * rb, c, M);
}

VNNI512 static void q8_rows_vnni512(float *y, int64_t ldy, const void *xq, int64_t m, const void *w, int64_t c,
                                    int64_t r0, int64_t r1) {
    switch (m) { /* M a constant in each: the accumulators stay in registers */
#define Q8_ROWS_CASE(M)                                                                                           \
    case M:                                                                                                       \
        q8_rows_m_vnni512(y, ldy, xq, w, c, r0, r1, M);                                                           \
        break;
        Q8_ROWS_CASE(1)
        Q8_ROWS_CASE(2)
        Q8_ROWS_CASE(3)
        Q8_ROWS_CASE(4)
        Q8_ROWS_CASE(5)
        Q8_ROWS_CASE(6)
        Q8_ROWS_CASE(7)
#undef Q8_ROWS_CASE
    default:
        q8_rows_m_vnni512(y, ldy, xq, w, c, r0, r1, DSC_CPU_Q8_MAX_ROWS);
        break;
    }
}
#endif

/* ---- dispatch ---------------------------------------------------------------------------------- */

void dsc_cpu_q8_quantize_rows(void *dst, const float *x, int64_t n, int64_t c) {
#ifdef DSC_Q8_X86
    if (q8_level() >= LEVEL_AVX2) {
        quantize_rows_avx2(dst, x, n, c);
        return;
    }
#endif
    dsc_cpu_q8_quantize_rows_scalar(dst, x, n, c);
}

void dsc_cpu_q8_dot_rows(float *y, int64_t ldy, const void *xq, int64_t m, const void *w, int64_t c, int64_t r0,
                         int64_t r1) {
#ifdef DSC_Q8_X86
    int level = q8_level();
    if (level == LEVEL_VNNI && (c / Q8_BLOCK) % 2 == 0) {
        q8_rows_vnni512(y, ldy, xq, m, w, c, r0, r1);
        return;
    }
    if (level >= LEVEL_AVX2) { /* the 256-bit loops: DSC_CPU_GEMV_MAX_ROWS x rows a pass */
        const size_t xrb = dsc_cpu_q8_act_row_bytes(c);
        for (int64_t i0 = 0; i0 < m; i0 += DSC_CPU_GEMV_MAX_ROWS) {
            int64_t mi = m - i0 < DSC_CPU_GEMV_MAX_ROWS ? m - i0 : DSC_CPU_GEMV_MAX_ROWS;
            const int8_t *xi = (const int8_t *)xq + (size_t)i0 * xrb;
            if (level == LEVEL_VNNI)
                q8_rows_vnni(y + i0 * ldy, ldy, xi, mi, w, c, r0, r1);
            else
                q8_rows_avx2(y + i0 * ldy, ldy, xi, mi, w, c, r0, r1);
        }
        return;
    }
#endif
    dsc_cpu_q8_dot_rows_scalar(y, ldy, xq, m, w, c, r0, r1);
}
