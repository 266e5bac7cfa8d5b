/* Paged attention on the CPU: causal grouped-query attention of a ragged
 * batch over the blocked KV cache.
 *
 * Each token's new key/value is first written into its sequence's cache slot
 * (found through the block table), then every (token, query head) pair walks
 * its sequence's cached positions 0..pos with an online softmax, so prompt
 * chunks and decode tokens of many sequences share one call and no score
 * matrix exists. The cache holds f32 or bf16 (converted on the fly; the
 * arithmetic is f32). It does not apply rotary embeddings (the caller rotates
 * q and k first). */
#include <math.h>
#include <string.h>

#include "dsc/kv_cache.h"

static dsc_status check_f32_cpu(const dsc_tensor *t, const char *what) {
    DSC_CHECK(t->dtype == DSC_DTYPE_F32 && t->device.type == DSC_DEVICE_CPU, DSC_ERR_UNSUPPORTED,
              "paged attention: %s must be f32 on cpu, got %s", what, dsc_dtype_name(t->dtype));
    return NULL;
}

static dsc_status check_args(const dsc_tensor *out, const dsc_tensor *q, const dsc_tensor *k, const dsc_tensor *v,
                             const dsc_ragged_batch *b, const dsc_tensor *cache) {
    DSC_TRY(check_f32_cpu(out, "out"));
    DSC_TRY(check_f32_cpu(q, "q"));
    DSC_TRY(check_f32_cpu(k, "k"));
    DSC_TRY(check_f32_cpu(v, "v"));
    DSC_CHECK((cache->dtype == DSC_DTYPE_F32 || cache->dtype == DSC_DTYPE_BF16) &&
                  cache->device.type == DSC_DEVICE_CPU,
              DSC_ERR_UNSUPPORTED, "paged attention: layer_cache must be f32 or bf16 on cpu, got %s",
              dsc_dtype_name(cache->dtype));
    DSC_CHECK(cache->ndim == 5 && cache->shape[1] == 2, DSC_ERR_INVALID,
              "paged attention: layer_cache must be (NB, 2, BS, NKV, HS)");
    int64_t ntok = b->n_tokens, nkv = cache->shape[3], hs = cache->shape[4];
    DSC_CHECK(q->ndim == 3, DSC_ERR_INVALID, "paged attention: q must be (Ntok, NH, HS)");
    int64_t nh = q->shape[1];
    DSC_TRY(dsc_tensor_expect(q, "paged attention q", DSC_DTYPE_F32, 3, (int64_t[]){ntok, nh, hs}));
    DSC_TRY(dsc_tensor_expect(out, "paged attention out", DSC_DTYPE_F32, 3, (int64_t[]){ntok, nh, hs}));
    DSC_TRY(dsc_tensor_expect(k, "paged attention k", DSC_DTYPE_F32, 3, (int64_t[]){ntok, nkv, hs}));
    DSC_TRY(dsc_tensor_expect(v, "paged attention v", DSC_DTYPE_F32, 3, (int64_t[]){ntok, nkv, hs}));
    DSC_CHECK(nh % nkv == 0, DSC_ERR_INVALID, "paged attention: NH %lld is not a multiple of NKV %lld",
              (long long)nh, (long long)nkv);
    int64_t nb = cache->shape[0], bs = cache->shape[2];
    for (int32_t i = 0; i < b->n_seqs; i++) {
        const dsc_ragged_seq *s = &b->seqs[i];
        DSC_CHECK((int64_t)s->num_blocks * bs >= s->n_cached + s->n_new, DSC_ERR_INVALID,
                  "paged attention: sequence %llu has %d blocks of %lld for %lld tokens",
                  (unsigned long long)s->uid, s->num_blocks, (long long)bs, (long long)(s->n_cached + s->n_new));
        for (int32_t j = 0; j < s->num_blocks; j++)
            DSC_CHECK(s->block_table[j] >= 0 && s->block_table[j] < nb, DSC_ERR_INVALID,
                      "paged attention: sequence %llu block %d is id %d, outside [0, %lld)",
                      (unsigned long long)s->uid, j, s->block_table[j], (long long)nb);
    }
    return NULL;
}

/* Element offset of the K (kv = 0) or V (kv = 1) row of (position pos, kv head g) of a sequence. */
static inline int64_t cache_row(const int32_t *table, int64_t pos, int kv, int64_t g, int64_t bs, int64_t nkv,
                                int64_t hs) {
    int64_t block = table[pos / bs];
    return (((block * 2 + kv) * bs + pos % bs) * nkv + g) * hs;
}

/* A cache of either element type; rows are addressed by element offset. */
typedef struct cache_ref {
    void *data;
    bool bf16;
} cache_ref;

static inline float bf16_value(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void store_row(cache_ref c, int64_t off, const float *src, int64_t hs) {
    if (!c.bf16) {
        memcpy((float *)c.data + off, src, sizeof(float) * (size_t)hs);
        return;
    }
    uint16_t *dst = (uint16_t *)c.data + off;
    for (int64_t i = 0; i < hs; i++)
        dst[i] = dsc_f32_to_bf16(src[i]);
}

/* q . row, with 8 partial sums so the loop vectorises. */
static inline float dot_row(const float *q, cache_ref c, int64_t off, int64_t n) {
    float part[8] = {0}, s = 0.0f;
    int64_t i = 0;
    if (c.bf16) {
        const uint16_t *r = (const uint16_t *)c.data + off;
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++)
                part[j] += q[i + j] * bf16_value(r[i + j]);
        for (; i < n; i++)
            s += q[i] * bf16_value(r[i]);
    } else {
        const float *r = (const float *)c.data + off;
        for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; j++)
                part[j] += q[i + j] * r[i + j];
        for (; i < n; i++)
            s += q[i] * r[i];
    }
    for (int j = 0; j < 8; j++)
        s += part[j];
    return s;
}

/* out += w * row */
static inline void axpy_row(float *out, float w, cache_ref c, int64_t off, int64_t n) {
    if (c.bf16) {
        const uint16_t *r = (const uint16_t *)c.data + off;
        for (int64_t i = 0; i < n; i++)
            out[i] += w * bf16_value(r[i]);
    } else {
        const float *r = (const float *)c.data + off;
        for (int64_t i = 0; i < n; i++)
            out[i] += w * r[i];
    }
}

/* Keys per tile: scores of a tile are computed first (vectorisable dot
 * products), then the running max moves once per tile, not once per key. */
enum { TILE = 64 };

/* out (HS) = softmax(q . K[0..pos] * scale) @ V[0..pos] for one query row
 * against KV head g of one sequence; out doubles as the accumulator. */
static void attend_one(float *out, const float *q, cache_ref cache, const int32_t *table, int64_t pos, int64_t g,
                       int64_t bs, int64_t nkv, int64_t hs, float scale) {
    float scores[TILE];
    float m = -INFINITY, l = 0.0f;
    memset(out, 0, sizeof(float) * (size_t)hs);
    for (int64_t p0 = 0; p0 <= pos; p0 += TILE) {
        int64_t n = pos + 1 - p0 < TILE ? pos + 1 - p0 : TILE;
        float tile_max = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
            scores[j] = dot_row(q, cache, cache_row(table, p0 + j, 0, g, bs, nkv, hs), hs) * scale;
            if (scores[j] > tile_max) tile_max = scores[j];
        }
        if (tile_max > m) {
            float c = expf(m - tile_max);
            l *= c;
            for (int64_t i = 0; i < hs; i++)
                out[i] *= c;
            m = tile_max;
        }
        for (int64_t j = 0; j < n; j++) {
            float w = expf(scores[j] - m);
            l += w;
            axpy_row(out, w, cache, cache_row(table, p0 + j, 1, g, bs, nkv, hs), hs);
        }
    }
    for (int64_t i = 0; i < hs; i++)
        out[i] /= l;
}

dsc_status dsc_paged_attention_forward(dsc_tensor *out, const dsc_tensor *q, const dsc_tensor *k,
                                       const dsc_tensor *v, const dsc_ragged_batch *b, dsc_tensor *layer_cache) {
    DSC_TRY(check_args(out, q, k, v, b, layer_cache));
    const int64_t ntok = b->n_tokens, nh = q->shape[1], nkv = layer_cache->shape[3], hs = layer_cache->shape[4];
    const int64_t bs = layer_cache->shape[2], group = nh / nkv;
    const cache_ref cache = {layer_cache->data, layer_cache->dtype == DSC_DTYPE_BF16}; /* (NB, 2, BS, NKV, HS) */
    const float *qd = q->data;                                                         /* (Ntok, NH, HS) */
    const float *kd = k->data, *vd = v->data;                                          /* (Ntok, NKV, HS) */
    float *od = out->data;                                                             /* (Ntok, NH, HS) */
    const float scale = 1.0f / sqrtf((float)hs);

#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < ntok; t++) {
        const int32_t *table = b->seqs[b->token_seq[t]].block_table;
        for (int64_t g = 0; g < nkv; g++) {
            store_row(cache, cache_row(table, b->positions[t], 0, g, bs, nkv, hs), kd + (t * nkv + g) * hs, hs);
            store_row(cache, cache_row(table, b->positions[t], 1, g, bs, nkv, hs), vd + (t * nkv + g) * hs, hs);
        }
    }

    /* All writes land before any read: a token attends to keys written by
     * earlier tokens of its own chunk. */
#pragma omp parallel for collapse(2) schedule(dynamic, 8)
    for (int64_t t = 0; t < ntok; t++)
        for (int64_t h = 0; h < nh; h++)
            attend_one(od + (t * nh + h) * hs, qd + (t * nh + h) * hs, cache, b->seqs[b->token_seq[t]].block_table,
                       b->positions[t], h / group, bs, nkv, hs, scale);
    return NULL;
}
