/* Token files: writing them and reading them through a read-only memory map.
 *
 * The header layout is documented in dsc/data.h. Reading validates the header
 * and the file size once at open, and token ids against the vocabulary on
 * every read (so a bad id is reported with its position, however large the
 * file). A Megatron indexed dataset (PREFIX.bin + PREFIX.idx) opens behind
 * the same handle through megatron.c. Not here: tokenizing text
 * (tokenizer.c) or choosing positions (loader.c). */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include "dsc/data.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/data/megatron.h"

struct dsc_token_file {
    char *path;
    void *map; /* the whole file */
    size_t map_bytes;
    const void *tokens; /* (count) u16 or u32, after the header */
    int64_t count;
    dsc_token_dtype dtype;
    uint32_t vocab;
    dsc_megatron *megatron; /* non-NULL: a Megatron dataset, read through it */
};

typedef struct token_header {
    uint32_t magic;
    uint32_t version;
    uint32_t bytes_per_token;
    uint32_t vocab_size;
    uint64_t count;
    uint64_t reserved;
} token_header;

_Static_assert(sizeof(token_header) == DSC_TOKEN_FILE_HEADER_BYTES, "token file header is 32 bytes");

dsc_status dsc_token_file_write(const char *path, const uint32_t *tokens, int64_t count, dsc_token_dtype dtype,
                                uint32_t vocab_size) {
    DSC_CHECK(dtype == DSC_TOKEN_DTYPE_U16 || dtype == DSC_TOKEN_DTYPE_U32, DSC_ERR_INVALID,
              "token file %s: dtype must be 2 (uint16) or 4 (uint32) bytes, got %d", path, (int)dtype);
    DSC_CHECK(count >= 0, DSC_ERR_INVALID, "token file %s: negative token count %lld", path, (long long)count);
    uint64_t limit = dtype == DSC_TOKEN_DTYPE_U16 ? 65536u : 4294967296ull;
    if (vocab_size > 0 && vocab_size < limit) limit = vocab_size;
    for (int64_t i = 0; i < count; i++)
        DSC_CHECK(tokens[i] < limit, DSC_ERR_INVALID, "token file %s: token id %u at position %lld is >= %llu",
                  path, tokens[i], (long long)i, (unsigned long long)limit);

    FILE *fp = fopen(path, "wb");
    DSC_CHECK(fp, DSC_ERR_IO, "token file %s: cannot create: %s", path, strerror(errno));
    token_header h = {DSC_TOKEN_FILE_MAGIC, DSC_TOKEN_FILE_VERSION, (uint32_t)dtype,
                      vocab_size,           (uint64_t)count,        0};
    bool ok = fwrite(&h, sizeof h, 1, fp) == 1;
    /* Converted in chunks so a large corpus needs no second full-size buffer. */
    enum { CHUNK = 1 << 16 };
    uint16_t buf16[CHUNK];
    for (int64_t i = 0; ok && i < count; i += CHUNK) {
        size_t n = (size_t)(count - i < CHUNK ? count - i : CHUNK);
        if (dtype == DSC_TOKEN_DTYPE_U32) {
            ok = fwrite(tokens + i, 4, n, fp) == n;
        } else {
            for (size_t j = 0; j < n; j++)
                buf16[j] = (uint16_t)tokens[i + (int64_t)j];
            ok = fwrite(buf16, 2, n, fp) == n;
        }
    }
    int err = errno;
    if (fclose(fp) != 0) ok = false;
    DSC_CHECK(ok, DSC_ERR_IO, "token file %s: write failed: %s", path, strerror(err));
    return NULL;
}

static dsc_status validate_header(const char *path, const token_header *h, size_t file_bytes) {
    DSC_CHECK(
        h->magic == DSC_TOKEN_FILE_MAGIC, DSC_ERR_CORRUPT,
        "token file %s: not a dsc token file (bad magic 0x%08x; make one with dsc-train --prepare, or give a "
        "Megatron dataset as PREFIX with PREFIX.bin and PREFIX.idx)",
        path, h->magic);
    DSC_CHECK(h->version == DSC_TOKEN_FILE_VERSION, DSC_ERR_CORRUPT,
              "token file %s: version %u, this dsc reads version %u", path, h->version, DSC_TOKEN_FILE_VERSION);
    DSC_CHECK(h->bytes_per_token == 2 || h->bytes_per_token == 4, DSC_ERR_CORRUPT,
              "token file %s: %u bytes per token, expected 2 or 4", path, h->bytes_per_token);
    /* count * bytes_per_token may wrap (2^63 x 2 = 0) and then "match" a header-only file. */
    uint64_t expect;
    DSC_CHECK(!__builtin_mul_overflow(h->count, (uint64_t)h->bytes_per_token, &expect) &&
                  !__builtin_add_overflow(expect, (uint64_t)DSC_TOKEN_FILE_HEADER_BYTES, &expect),
              DSC_ERR_CORRUPT, "token file %s: header says %llu tokens, more than 2^64 bytes (the file has %zu)",
              path, (unsigned long long)h->count, file_bytes);
    DSC_CHECK(expect == file_bytes, DSC_ERR_CORRUPT,
              "token file %s: header says %llu tokens (%llu bytes) but the file has %zu bytes", path,
              (unsigned long long)h->count, (unsigned long long)expect, file_bytes);
    return NULL;
}

static dsc_status open_megatron(const char *path, const char *prefix, dsc_token_file **out) {
    dsc_megatron *m;
    DSC_TRY(dsc_megatron_open(prefix, &m));
    dsc_token_file *f = calloc(1, sizeof *f);
    char *path_copy = f ? strdup(path) : NULL;
    if (!path_copy) {
        free(f);
        dsc_megatron_close(m);
        return dsc_error(DSC_ERR_NOMEM, "Megatron dataset %s: out of memory", path);
    }
    dsc_token_dtype dtype = dsc_megatron_item_bytes(m) <= 2 ? DSC_TOKEN_DTYPE_U16 : DSC_TOKEN_DTYPE_U32;
    *f = (dsc_token_file){.path = path_copy, .count = dsc_megatron_count(m), .dtype = dtype, .megatron = m};
    *out = f;
    return NULL;
}

dsc_status dsc_token_file_open(const char *path, dsc_token_file **out) {
    *out = NULL;
    char prefix[1024];
    if (dsc_megatron_detect(path, prefix, sizeof prefix)) return open_megatron(path, prefix, out);
    int fd = open(path, O_RDONLY);
    DSC_CHECK(fd >= 0, DSC_ERR_IO, "data file %s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return dsc_error(DSC_ERR_IO, "data file %s: fstat: %s", path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return dsc_error(DSC_ERR_IO,
                         "data file %s is %s, not a token file (dsc-train --prepare TEXT OUT makes one)", path,
                         S_ISDIR(st.st_mode) ? "a directory" : "not a regular file");
    }
    size_t bytes = (size_t)st.st_size;
    if (bytes < DSC_TOKEN_FILE_HEADER_BYTES) {
        close(fd);
        return dsc_error(DSC_ERR_CORRUPT, "token file %s: %zu bytes is shorter than the %d-byte header", path,
                         bytes, DSC_TOKEN_FILE_HEADER_BYTES);
    }
    void *map = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    DSC_CHECK(map != MAP_FAILED, DSC_ERR_IO, "token file %s: mmap: %s", path, strerror(err));

    token_header h;
    memcpy(&h, map, sizeof h);
    dsc_status s = validate_header(path, &h, bytes);
    dsc_token_file *f = s ? NULL : calloc(1, sizeof *f);
    char *path_copy = f ? strdup(path) : NULL;
    if (!s && !path_copy) s = dsc_error(DSC_ERR_NOMEM, "token file %s: out of memory", path);
    if (s) {
        free(f);
        munmap(map, bytes);
        return s;
    }
    *f = (dsc_token_file){path_copy,
                          map,
                          bytes,
                          (const char *)map + DSC_TOKEN_FILE_HEADER_BYTES,
                          (int64_t)h.count,
                          (dsc_token_dtype)h.bytes_per_token,
                          h.vocab_size,
                          NULL};
    *out = f;
    return NULL;
}

void dsc_token_file_close(dsc_token_file *f) {
    if (!f) return;
    dsc_megatron_close(f->megatron);
    if (f->map) munmap(f->map, f->map_bytes);
    free(f->path);
    free(f);
}

int64_t dsc_token_file_count(const dsc_token_file *f) {
    return f->count;
}
dsc_token_dtype dsc_token_file_dtype(const dsc_token_file *f) {
    return f->dtype;
}
uint32_t dsc_token_file_vocab(const dsc_token_file *f) {
    return f->vocab;
}
const char *dsc_token_file_path(const dsc_token_file *f) {
    return f->path;
}

dsc_status dsc_token_file_read(const dsc_token_file *f, int64_t pos, int64_t n, int64_t vocab_limit,
                               int32_t *out) {
    if (f->megatron) return dsc_megatron_read(f->megatron, pos, n, vocab_limit, out);
    DSC_CHECK(pos >= 0 && n >= 0 && pos + n <= f->count, DSC_ERR_INVALID,
              "token file %s: read of [%lld, %lld) is outside its %lld tokens", f->path, (long long)pos,
              (long long)(pos + n), (long long)f->count);
    for (int64_t i = 0; i < n; i++) {
        uint32_t id = f->dtype == DSC_TOKEN_DTYPE_U16 ? ((const uint16_t *)f->tokens)[pos + i]
                                                      : ((const uint32_t *)f->tokens)[pos + i];
        DSC_CHECK((int64_t)id < vocab_limit, DSC_ERR_CORRUPT,
                  "token file %s: token id %u at position %lld is >= vocab size %lld", f->path, id,
                  (long long)(pos + i), (long long)vocab_limit);
        out[i] = (int32_t)id;
    }
    return NULL;
}
