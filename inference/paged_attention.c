/* Paged attention on the CPU: causal grouped-query attention of a ragged
 * batch over the blocked KV cache.
 *
 * Each token's new key/value is first written into its sequence's cache slot
 * (found through the block table); then, for every sequence, query head and
 * tile of up to 128 of its new tokens, the keys and values the tile can see
 * are taken a tile at a time, the batch's own in place, earlier ones gathered
 * from the cache (a bf16 cache's widened, and then the batch's own read from
 * it too, rounded as later tokens will see them), and attended with two single-threaded GEMMs per key tile
 * (scores = Q K^T, out += P V) and an online softmax whose exponentials are
 * vectorised (kernels/cpu/cpu_simd.c), as the training path's attention
 * does (kernels/cpu/cpu_attention.c). So a prompt runs at GEMM speed, prompt
 * chunks and decode tokens of many sequences share one call, and no score
 * matrix larger than one tile exists. It does not apply rotary embeddings
 * (the caller rotates q and k first). */
#include <cblas.h>
#include <math.h>
#include <string.h>

#include "dsc/kernels.h"
#include "dsc/kv_cache.h"
#include "kernels/cpu/cpu_pool.h"
#include "kernels/cpu/cpu_simd.h"

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

/* Query rows per tile, most keys per key tile, and the floats one gathered key (or value) tile may
 * hold. 128 x 256 score tiles (with the row max and exponentials vectorised) took a 512-token
 * prompt's attention, 12 heads of 64, from 4.4 to 3.3 ms on two threads against 64 x 64; the
 * tile's buffers, 256 KB, live on the stack of the pool's threads (8 MB by default). */
enum { QTILE = 128, KTILE = 256, KV_TILE_FLOATS = 16384 };

/* dst (n, HS) = rows p0 .. p0 + n - 1 of K (kv = 0) or V (kv = 1) of kv head g, in f32. */
static void gather(float *dst, cache_ref c, const int32_t *table, int64_t p0, int64_t n, int kv, int64_t g,
                   int64_t bs, int64_t nkv, int64_t hs) {
    for (int64_t j = 0; j < n; j++) {
        int64_t off = cache_row(table, p0 + j, kv, g, bs, nkv, hs);
        if (c.bf16) {
            const uint16_t *r = (const uint16_t *)c.data + off;
            for (int64_t i = 0; i < hs; i++)
                dst[j * hs + i] = bf16_value(r[i]);
        } else {
            memcpy(dst + j * hs, (const float *)c.data + off, sizeof(float) * (size_t)hs);
        }
    }
}

/* One query tile against its keys. */
typedef struct tile_job {
    float *out;         /* first row of the tile, row stride `stride` */
    const float *q;     /* likewise */
    const int64_t *pos; /* (ni) each row's position: it sees keys 0..pos */
    int64_t ni, stride, g, bs, nkv, hs;
    const int32_t *table; /* the sequence's block table */
    cache_ref cache;
    /* The keys and values of the batch's own tokens of this sequence, positions n_cached on
     * (row stride NKV * HS), read in place where the cache holds them unrounded (f32); NULL:
     * every key is gathered from the cache. */
    const float *k_new, *v_new;
    int64_t n_cached;
    float scale;
} tile_job;

/* Keys [p0, p0 + n) of the tile's kv head as (n, HS) matrices *k, *v with row stride *ld:
 * the batch's own rows in place, or gathered from the cache into kbuf, vbuf (a tile that
 * starts in the cache and runs into the batch's rows finds those stored there already). */
static void key_tile(const tile_job *J, int64_t p0, int64_t n, float *kbuf, float *vbuf, const float **k,
                     const float **v, int64_t *ld) {
    if (J->k_new && p0 >= J->n_cached) {
        *ld = J->nkv * J->hs;
        *k = J->k_new + (p0 - J->n_cached) * *ld;
        *v = J->v_new + (p0 - J->n_cached) * *ld;
        return;
    }
    gather(kbuf, J->cache, J->table, p0, n, 0, J->g, J->bs, J->nkv, J->hs);
    gather(vbuf, J->cache, J->table, p0, n, 1, J->g, J->bs, J->nkv, J->hs);
    *k = kbuf, *v = vbuf, *ld = J->hs;
}

static void attend_tile(const tile_job *J) {
    const int64_t ni = J->ni, hs = J->hs, ld = J->stride;
    const int64_t kt = KV_TILE_FLOATS / hs < KTILE ? KV_TILE_FLOATS / hs : KTILE; /* keys per tile */
    float kbuf[KV_TILE_FLOATS], vbuf[KV_TILE_FLOATS];                             /* (kt, HS) */
    float s[QTILE * KTILE]; /* (ni, kt) scores, then probabilities */
    float m[QTILE], l[QTILE];
    int64_t last = 0;
    for (int64_t r = 0; r < ni; r++) {
        m[r] = -INFINITY, l[r] = 0.0f;
        last = J->pos[r] > last ? J->pos[r] : last;
    }
    /* Key tile 0 is every row's first (each sees key 0): its P V sets out, later ones add to it. */
    for (int64_t p0 = 0; p0 <= last; p0 += kt) {
        const float *k, *v;
        int64_t nj = last + 1 - p0 < kt ? last + 1 - p0 : kt, ldkv;
        key_tile(J, p0, nj, kbuf, vbuf, &k, &v, &ldkv);
        /* s (ni, nj) = scale * q tile (ni, HS) @ k tile^T */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)ni, (int)nj, (int)hs, J->scale, J->q, (int)ld, k,
                    (int)ldkv, 0.0f, s, (int)kt);
        for (int64_t r = 0; r < ni; r++) {
            float *sr = s + r * kt;
            int64_t keys = J->pos[r] - p0 + 1; /* causal: keys p <= pos */
            keys = keys < 0 ? 0 : keys > nj ? nj : keys;
            for (int64_t j = keys; j < nj; j++)
                sr[j] = 0.0f;
            if (keys == 0) continue;
            float tile_max = dsc_cpu_max(sr, keys);
            float m_new = tile_max > m[r] ? tile_max : m[r], corr = expf(m[r] - m_new);
            l[r] = l[r] * corr + dsc_cpu_exp_shift_sum(sr, keys, m_new);
            m[r] = m_new;
            if (corr != 1.0f && p0 > 0)
                for (int64_t i = 0; i < hs; i++)
                    J->out[r * ld + i] *= corr;
        }
        /* out tile (ni, HS) += p (ni, nj) @ v tile (nj, HS) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)ni, (int)hs, (int)nj, 1.0f, s, (int)kt, v,
                    (int)ldkv, p0 > 0 ? 1.0f : 0.0f, J->out, (int)ld);
    }
    for (int64_t r = 0; r < ni; r++) {
        float inv = 1.0f / l[r];
        for (int64_t i = 0; i < hs; i++)
            J->out[r * ld + i] *= inv;
    }
}

/* The whole call's arguments, for the pool's chunks. */
typedef struct attn_job {
    const dsc_ragged_batch *b;
    cache_ref cache;
    const float *qd, *kd, *vd; /* (Ntok, NH, HS), (Ntok, NKV, HS) twice */
    float *od;                 /* (Ntok, NH, HS) */
    int64_t nh, nkv, hs, bs, group, max_tiles;
    float scale;
} attn_job;

/* Chunk t: token t's new key and value rows into its sequence's cache slots. */
static void store_token(void *arg, int64_t t) {
    const attn_job *A = arg;
    const int32_t *table = A->b->seqs[A->b->token_seq[t]].block_table;
    for (int64_t g = 0; g < A->nkv; g++) {
        int64_t p = A->b->positions[t];
        store_row(A->cache, cache_row(table, p, 0, g, A->bs, A->nkv, A->hs), A->kd + (t * A->nkv + g) * A->hs,
                  A->hs);
        store_row(A->cache, cache_row(table, p, 1, g, A->bs, A->nkv, A->hs), A->vd + (t * A->nkv + g) * A->hs,
                  A->hs);
    }
}

/* Chunk it: (sequence, query tile, head) = it / NH / max_tiles, it / NH % max_tiles, it % NH. */
static void attend_item(void *arg, int64_t it) {
    const attn_job *A = arg;
    const int64_t nh = A->nh, hs = A->hs, h = it % nh, tile = it / nh % A->max_tiles, si = it / nh / A->max_tiles;
    const dsc_ragged_seq *seq = &A->b->seqs[si];
    const int64_t t0 = seq->start + tile * QTILE;
    if (tile * QTILE >= seq->n_new) return;
    const int64_t ni = seq->start + seq->n_new - t0 < QTILE ? seq->start + seq->n_new - t0 : QTILE;
    tile_job J = {.out = A->od + (t0 * nh + h) * hs,
                  .q = A->qd + (t0 * nh + h) * hs,
                  .pos = A->b->positions + t0,
                  .ni = ni,
                  .stride = nh * hs,
                  .g = h / A->group,
                  .bs = A->bs,
                  .nkv = A->nkv,
                  .hs = hs,
                  .table = seq->block_table,
                  .cache = A->cache,
                  .k_new = A->cache.bf16 ? NULL : A->kd + (seq->start * A->nkv + h / A->group) * hs,
                  .v_new = A->cache.bf16 ? NULL : A->vd + (seq->start * A->nkv + h / A->group) * hs,
                  .n_cached = seq->n_cached,
                  .scale = A->scale};
    attend_tile(&J);
}

dsc_status dsc_paged_attention_forward(dsc_tensor *out, const dsc_tensor *q, const dsc_tensor *k,
                                       const dsc_tensor *v, const dsc_ragged_batch *b, dsc_tensor *layer_cache) {
    DSC_TRY(check_args(out, q, k, v, b, layer_cache));
    const int64_t ntok = b->n_tokens, nh = q->shape[1], nkv = layer_cache->shape[3], hs = layer_cache->shape[4];
    DSC_CHECK(hs <= KV_TILE_FLOATS, DSC_ERR_UNSUPPORTED, "paged attention: head size %lld exceeds %d",
              (long long)hs, KV_TILE_FLOATS);
    int64_t max_tiles = 0;
    for (int32_t i = 0; i < b->n_seqs; i++) {
        int64_t tiles = (b->seqs[i].n_new + QTILE - 1) / QTILE;
        max_tiles = tiles > max_tiles ? tiles : max_tiles;
    }
    attn_job A = {.b = b,
                  .cache = {layer_cache->data, layer_cache->dtype == DSC_DTYPE_BF16}, /* (NB, 2, BS, NKV, HS) */
                  .qd = q->data,
                  .kd = k->data,
                  .vd = v->data,
                  .od = out->data,
                  .nh = nh,
                  .nkv = nkv,
                  .hs = hs,
                  .bs = layer_cache->shape[2],
                  .group = nh / nkv,
                  .max_tiles = max_tiles,
                  .scale = 1.0f / sqrtf((float)hs)};
    /* Through the pool (kernels/cpu/cpu_pool.h), as the decode GEMVs: per
     * token a few short loops, none waiting for a thread that is late. */
    if (ntok * nkv * hs > 32768)
        dsc_cpu_pool_run(store_token, &A, ntok);
    else
        for (int64_t t = 0; t < ntok; t++)
            store_token(&A, t);
    /* All writes land before any read: a token attends to keys written by
     * earlier tokens of its own chunk. */
    dsc_cpu_pool_run(attend_item, &A, (int64_t)b->n_seqs * max_tiles * nh);
    return NULL;
}
