/* The KV-cache block allocator: a fixed pool of block ids with a free stack.
 *
 * Allocation and free are all-or-nothing, so a failed request never leaves a
 * half-updated pool behind (the engine relies on this to reject a batch
 * without repairing state). It knows nothing about what a block holds; the
 * cache memory and the per-sequence block tables live elsewhere. */
#include "dsc/kv_cache.h"

enum { BLOCK_FREE = 0, BLOCK_USED = 1, BLOCK_MARKED = 2 };

struct dsc_kv_blocks {
    int32_t num_blocks;
    int32_t free_count;
    int32_t *free_stack; /* (num_blocks); [0, free_count) are free ids, top = last */
    uint8_t *state;      /* (num_blocks) BLOCK_FREE / BLOCK_USED; MARKED only inside free() */
};

dsc_status dsc_kv_blocks_create(dsc_kv_blocks **out, int32_t num_blocks) {
    *out = NULL;
    DSC_CHECK(num_blocks > 0, DSC_ERR_INVALID, "kv blocks: num_blocks must be > 0, got %d", num_blocks);
    dsc_kv_blocks *b = NULL;
    dsc_status st = NULL;
    DSC_TRY(dsc_mem_alloc((void **)&b, sizeof *b, DSC_MEM_OTHER, DSC_CPU));
    b->num_blocks = num_blocks;
    DSC_TRY_GOTO(
        st, dsc_mem_alloc((void **)&b->free_stack, sizeof(int32_t) * (size_t)num_blocks, DSC_MEM_OTHER, DSC_CPU),
        fail);
    DSC_TRY_GOTO(st, dsc_mem_alloc((void **)&b->state, (size_t)num_blocks, DSC_MEM_OTHER, DSC_CPU), fail);
    /* Highest id at the bottom so that a fresh pool hands out 0, 1, 2, ... */
    for (int32_t i = 0; i < num_blocks; i++)
        b->free_stack[i] = num_blocks - 1 - i;
    b->free_count = num_blocks;
    *out = b;
    return NULL;
fail:
    dsc_kv_blocks_destroy(b);
    return dsc_error_wrap(st, "creating a pool of %d kv blocks", num_blocks);
}

void dsc_kv_blocks_destroy(dsc_kv_blocks *b) {
    if (!b) return;
    dsc_mem_free(b->free_stack, sizeof(int32_t) * (size_t)b->num_blocks, DSC_MEM_OTHER, DSC_CPU);
    dsc_mem_free(b->state, (size_t)b->num_blocks, DSC_MEM_OTHER, DSC_CPU);
    dsc_mem_free(b, sizeof *b, DSC_MEM_OTHER, DSC_CPU);
}

dsc_status dsc_kv_blocks_allocate(dsc_kv_blocks *b, int32_t n, int32_t *ids_out) {
    DSC_CHECK(n >= 0, DSC_ERR_INVALID, "kv blocks: cannot allocate %d blocks", n);
    DSC_CHECK(n <= b->free_count, DSC_ERR_NOMEM, "kv blocks: requested %d blocks but only %d of %d are free", n,
              b->free_count, b->num_blocks);
    for (int32_t i = 0; i < n; i++) {
        int32_t id = b->free_stack[--b->free_count];
        b->state[id] = BLOCK_USED;
        ids_out[i] = id;
    }
    return NULL;
}

dsc_status dsc_kv_blocks_free(dsc_kv_blocks *b, const int32_t *ids, int32_t n) {
    DSC_CHECK(n >= 0, DSC_ERR_INVALID, "kv blocks: cannot free %d blocks", n);
    /* Validate everything first, marking ids to catch repeats within the call;
     * on error, unmark what was marked so that nothing changes. */
    dsc_status st = NULL;
    int32_t i = 0;
    for (; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= b->num_blocks) {
            st = dsc_error(DSC_ERR_INVALID, "kv blocks: free of block id %d out of range [0, %d)", id,
                           b->num_blocks);
            break;
        }
        if (b->state[id] == BLOCK_MARKED) {
            st = dsc_error(DSC_ERR_INVALID, "kv blocks: block id %d appears twice in one free", id);
            break;
        }
        if (b->state[id] == BLOCK_FREE) {
            st = dsc_error(DSC_ERR_INVALID, "kv blocks: double free of block id %d (it is not allocated)", id);
            break;
        }
        b->state[id] = BLOCK_MARKED;
    }
    if (st) {
        for (int32_t j = 0; j < i; j++)
            b->state[ids[j]] = BLOCK_USED;
        return st;
    }
    for (i = 0; i < n; i++) {
        b->state[ids[i]] = BLOCK_FREE;
        b->free_stack[b->free_count++] = ids[i];
    }
    return NULL;
}

int32_t dsc_kv_blocks_free_count(const dsc_kv_blocks *b) {
    return b->free_count;
}

int32_t dsc_kv_blocks_total(const dsc_kv_blocks *b) {
    return b->num_blocks;
}

bool dsc_kv_blocks_is_used(const dsc_kv_blocks *b, int32_t id) {
    return id >= 0 && id < b->num_blocks && b->state[id] == BLOCK_USED;
}
