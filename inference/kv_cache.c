/* KV-cache configuration checks and the cache memory: one arena (f32 or
 * bf16) for all layers, sized from a byte budget, plus the block allocator.
 *
 * It hands out per-layer views; writing keys/values into blocks and reading
 * them back is the paged attention kernel's job, and which sequence owns
 * which block is the state manager's. */
#include "dsc/kv_cache.h"

struct dsc_kv_cache {
    dsc_kv_config cfg;
    dsc_device device;
    int32_t num_blocks;
    size_t bytes;
    void *arena; /* (L, NB, 2, BS, NKV, HS) of cfg.dtype */
    dsc_kv_blocks *blocks;
};

#define CHECK_POSITIVE(field)                                                                                     \
    DSC_CHECK(cfg->field > 0, DSC_ERR_CONFIG, "kv_cache config: %s must be > 0, got %lld", #field,                \
              (long long)cfg->field)

dsc_status dsc_kv_config_validate(const dsc_kv_config *cfg) {
    CHECK_POSITIVE(num_layers);
    CHECK_POSITIVE(num_kv_heads);
    CHECK_POSITIVE(head_size);
    CHECK_POSITIVE(block_size);
    CHECK_POSITIVE(kv_cache_bytes);
    CHECK_POSITIVE(max_sequences);
    CHECK_POSITIVE(max_context);
    CHECK_POSITIVE(max_tokens_per_forward);
    CHECK_POSITIVE(max_batch_sequences);
    DSC_CHECK(cfg->max_batch_sequences <= cfg->max_sequences &&
                  cfg->max_batch_sequences <= cfg->max_tokens_per_forward,
              DSC_ERR_CONFIG,
              "kv_cache config: max_batch_sequences (%d) must be <= max_sequences (%d) and <= "
              "max_tokens_per_forward (%d)",
              cfg->max_batch_sequences, cfg->max_sequences, cfg->max_tokens_per_forward);
    DSC_CHECK(cfg->dtype == DSC_DTYPE_F32 || cfg->dtype == DSC_DTYPE_BF16, DSC_ERR_CONFIG,
              "kv_cache config: dtype must be f32 or bf16, got %s", dsc_dtype_name(cfg->dtype));
    DSC_CHECK(cfg->max_context / cfg->block_size < INT32_MAX, DSC_ERR_CONFIG,
              "kv_cache config: max_context %lld / block_size %d does not fit a block table",
              (long long)cfg->max_context, cfg->block_size);
    return NULL;
}

size_t dsc_kv_config_block_bytes(const dsc_kv_config *cfg) {
    return (size_t)cfg->num_layers * 2 * (size_t)cfg->block_size * (size_t)cfg->num_kv_heads *
           (size_t)cfg->head_size * dsc_dtype_size(cfg->dtype);
}

int32_t dsc_kv_config_max_blocks_per_sequence(const dsc_kv_config *cfg) {
    return (int32_t)((cfg->max_context + cfg->block_size - 1) / cfg->block_size);
}

dsc_status dsc_kv_cache_create(dsc_kv_cache **out, const dsc_kv_config *cfg, dsc_device device) {
    *out = NULL;
    DSC_TRY(dsc_kv_config_validate(cfg));
    size_t block_bytes = dsc_kv_config_block_bytes(cfg);
    int64_t num_blocks = cfg->kv_cache_bytes / (int64_t)block_bytes;
    DSC_CHECK(num_blocks >= 1, DSC_ERR_CONFIG,
              "kv_cache config: kv_cache_bytes %lld is less than one block (%zu bytes = %d layers x 2 x %d tokens "
              "x %d kv heads x %d x %zu)",
              (long long)cfg->kv_cache_bytes, block_bytes, cfg->num_layers, cfg->block_size, cfg->num_kv_heads,
              cfg->head_size, dsc_dtype_size(cfg->dtype));
    DSC_CHECK(num_blocks <= INT32_MAX, DSC_ERR_CONFIG,
              "kv_cache config: kv_cache_bytes %lld gives %lld blocks (> 2^31)", (long long)cfg->kv_cache_bytes,
              (long long)num_blocks);
    dsc_kv_cache *c = NULL;
    dsc_status st = NULL;
    DSC_TRY(dsc_mem_alloc((void **)&c, sizeof *c, DSC_MEM_OTHER, DSC_CPU));
    c->cfg = *cfg;
    c->device = device;
    c->num_blocks = (int32_t)num_blocks;
    c->bytes = block_bytes * (size_t)num_blocks;
    DSC_TRY_GOTO(st, dsc_mem_alloc((void **)&c->arena, c->bytes, DSC_MEM_KV_CACHE, device), fail);
    DSC_TRY_GOTO(st, dsc_kv_blocks_create(&c->blocks, c->num_blocks), fail);
    *out = c;
    return NULL;
fail:
    dsc_kv_cache_destroy(c);
    return dsc_error_wrap(st, "creating kv cache of %lld blocks", (long long)num_blocks);
}

void dsc_kv_cache_destroy(dsc_kv_cache *c) {
    if (!c) return;
    dsc_kv_blocks_destroy(c->blocks);
    dsc_mem_free(c->arena, c->bytes, DSC_MEM_KV_CACHE, c->device);
    dsc_mem_free(c, sizeof *c, DSC_MEM_OTHER, DSC_CPU);
}

int32_t dsc_kv_cache_num_blocks(const dsc_kv_cache *c) {
    return c->num_blocks;
}

dsc_kv_blocks *dsc_kv_cache_blocks(dsc_kv_cache *c) {
    return c->blocks;
}

dsc_status dsc_kv_cache_layer(dsc_kv_cache *c, int32_t layer, dsc_tensor *out) {
    DSC_CHECK(layer >= 0 && layer < c->cfg.num_layers, DSC_ERR_INVALID, "kv cache: layer %d out of range [0, %d)",
              layer, c->cfg.num_layers);
    int64_t shape[5] = {c->num_blocks, 2, c->cfg.block_size, c->cfg.num_kv_heads, c->cfg.head_size};
    size_t layer_bytes = c->bytes / (size_t)c->cfg.num_layers;
    *out = dsc_tensor_view((char *)c->arena + (size_t)layer * layer_bytes, c->cfg.dtype, 5, shape, c->device);
    return NULL;
}
