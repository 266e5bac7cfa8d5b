/* Megatron-LM indexed datasets (megatron.h). The index, little-endian:
 *   9 bytes magic "MMIDIDX\0\0", u64 version (1), u8 dtype code,
 *   u64 sequence count N, u64 document count D,
 *   i32 sizes[N] (tokens per sequence), i64 pointers[N] (byte offset of
 *   each sequence in .bin), i64 doc_idx[D] (first sequence of each
 *   document, 0 first and N last).
 * Dtype codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16
 * (6 float64 and 7 float32 are not token ids). The arrays follow the
 * header unaligned, so they are read with memcpy. Newer Megatron-LM
 * writes a per-sequence i8 mode array after doc_idx for multimodal data;
 * dsc refuses it (text only). Nothing here allocates per token: the
 * cumulative sequence starts (N + 1 i64) are the only copy. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include "runtime/data/megatron.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAGIC "MMIDIDX\0\0"
enum { MAGIC_BYTES = 9, HEADER_BYTES = MAGIC_BYTES + 8 + 1 + 8 + 8 };

typedef struct mapped {
    char path[1100];
    const unsigned char *data;
    size_t bytes;
} mapped;

struct dsc_megatron {
    mapped idx, bin;
    int code, item;                /* dtype code and bytes per token */
    int64_t n_seq;                 /* N */
    int64_t *start;                /* (N + 1) stream position of each sequence's first token */
    const unsigned char *pointers; /* (N) i64, unaligned */
};

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

bool dsc_megatron_detect(const char *path, char *prefix, size_t len) {
    size_t n = strlen(path);
    bool ext = n > 4 && (strcmp(path + n - 4, ".bin") == 0 || strcmp(path + n - 4, ".idx") == 0);
    size_t keep = ext ? n - 4 : n;
    if (keep + 5 > len) return false;
    memcpy(prefix, path, keep);
    prefix[keep] = '\0';
    char idx[1100];
    snprintf(idx, sizeof idx, "%s.idx", prefix);
    return exists(idx);
}

static dsc_status map_file(const char *path, mapped *m) {
    snprintf(m->path, sizeof m->path, "%s", path);
    int fd = open(path, O_RDONLY);
    DSC_CHECK(fd >= 0, DSC_ERR_IO, "Megatron dataset %s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        close(fd);
        return dsc_error(DSC_ERR_IO, "Megatron dataset %s: fstat: %s", path, strerror(err));
    }
    m->bytes = (size_t)st.st_size;
    m->data = NULL;
    if (m->bytes > 0) {
        void *p = mmap(NULL, m->bytes, PROT_READ, MAP_SHARED, fd, 0);
        int err = errno;
        close(fd);
        DSC_CHECK(p != MAP_FAILED, DSC_ERR_IO, "Megatron dataset %s: mmap: %s", path, strerror(err));
        m->data = p;
        return NULL;
    }
    close(fd);
    return NULL;
}

static void unmap(mapped *m) {
    if (m->data) munmap((void *)m->data, m->bytes);
    m->data = NULL;
}

static uint64_t u64_at(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

static int64_t i64_at(const unsigned char *p, int64_t i) {
    int64_t v;
    memcpy(&v, p + 8 * i, sizeof v);
    return v;
}

static int item_bytes(int code) {
    static const int bytes[] = {0, 1, 1, 2, 4, 8, 0, 0, 2};
    return code >= 1 && code <= 8 ? bytes[code] : 0;
}

/* Header and array sizes against the .idx file's size. */
static dsc_status check_index(dsc_megatron *m, int64_t *n_doc) {
    const mapped *x = &m->idx;
    DSC_CHECK(x->bytes >= HEADER_BYTES, DSC_ERR_CORRUPT,
              "Megatron index %s: %zu bytes is shorter than the %d-byte header", x->path, x->bytes, HEADER_BYTES);
    DSC_CHECK(memcmp(x->data, MAGIC, MAGIC_BYTES) == 0, DSC_ERR_CORRUPT,
              "Megatron index %s: bad magic (expected \"MMIDIDX\\0\\0\" of an MMapIndexedDataset)", x->path);
    uint64_t version = u64_at(x->data + MAGIC_BYTES);
    DSC_CHECK(version == 1, DSC_ERR_CORRUPT, "Megatron index %s: version %llu, dsc reads version 1", x->path,
              (unsigned long long)version);
    m->code = x->data[MAGIC_BYTES + 8];
    DSC_CHECK(m->code != 6 && m->code != 7, DSC_ERR_UNSUPPORTED,
              "Megatron index %s: dtype code %d is a float type, not token ids", x->path, m->code);
    m->item = item_bytes(m->code);
    DSC_CHECK(m->item > 0, DSC_ERR_CORRUPT, "Megatron index %s: unknown dtype code %d (1-5, 8 are token types)",
              x->path, m->code);
    uint64_t n = u64_at(x->data + MAGIC_BYTES + 9), d = u64_at(x->data + MAGIC_BYTES + 17);
    size_t room = x->bytes - HEADER_BYTES;
    DSC_CHECK(n <= room / 12 && d <= (room - n * 12) / 8, DSC_ERR_CORRUPT,
              "Megatron index %s: %llu sequences and %llu documents need more than its %zu bytes", x->path,
              (unsigned long long)n, (unsigned long long)d, x->bytes);
    size_t need = HEADER_BYTES + n * 12 + d * 8;
    DSC_CHECK(n == 0 || need + n != x->bytes, DSC_ERR_UNSUPPORTED,
              "Megatron index %s: has per-sequence modes (a multimodal dataset); dsc reads text datasets",
              x->path);
    DSC_CHECK(need == x->bytes, DSC_ERR_CORRUPT,
              "Megatron index %s: header says %llu sequences and %llu documents (%zu bytes) but the file has %zu",
              x->path, (unsigned long long)n, (unsigned long long)d, need, x->bytes);
    m->n_seq = (int64_t)n;
    *n_doc = (int64_t)d;
    return NULL;
}

/* Every sequence inside .bin, the token count without overflow, documents in order. */
static dsc_status check_sequences(dsc_megatron *m, int64_t n_doc) {
    const unsigned char *sizes = m->idx.data + HEADER_BYTES;
    m->pointers = sizes + 4 * m->n_seq;
    const unsigned char *docs = m->pointers + 8 * m->n_seq;
    m->start = malloc((size_t)(m->n_seq + 1) * sizeof *m->start);
    DSC_CHECK(m->start, DSC_ERR_NOMEM, "Megatron index %s: %lld sequences", m->idx.path, (long long)m->n_seq);
    m->start[0] = 0;
    for (int64_t i = 0; i < m->n_seq; i++) {
        int32_t size;
        memcpy(&size, sizes + 4 * i, sizeof size);
        int64_t ptr = i64_at(m->pointers, i);
        uint64_t limit = m->bin.bytes;
        DSC_CHECK(size >= 0 && ptr >= 0 && (uint64_t)ptr <= limit &&
                      (uint64_t)size <= (limit - (uint64_t)ptr) / (uint64_t)m->item,
                  DSC_ERR_CORRUPT,
                  "Megatron dataset %s: sequence %lld (%d tokens at byte %lld) lies outside %s (%zu bytes)",
                  m->idx.path, (long long)i, size, (long long)ptr, m->bin.path, m->bin.bytes);
        DSC_CHECK(m->start[i] <= INT64_MAX - size, DSC_ERR_CORRUPT, "Megatron index %s: token count overflows",
                  m->idx.path);
        m->start[i + 1] = m->start[i] + size;
    }
    for (int64_t j = 0; j < n_doc; j++) {
        int64_t first = i64_at(docs, j), prev = j ? i64_at(docs, j - 1) : 0;
        DSC_CHECK(first >= prev && first <= m->n_seq && (j > 0 || first == 0), DSC_ERR_CORRUPT,
                  "Megatron index %s: doc_idx[%lld] = %lld is not in [%lld, %lld] (documents start at sequence 0 "
                  "and go up to the sequence count)",
                  m->idx.path, (long long)j, (long long)first, (long long)prev, (long long)m->n_seq);
    }
    DSC_CHECK(n_doc == 0 || i64_at(docs, n_doc - 1) == m->n_seq, DSC_ERR_CORRUPT,
              "Megatron index %s: the last doc_idx is %lld, not the sequence count %lld", m->idx.path,
              (long long)(n_doc ? i64_at(docs, n_doc - 1) : 0), (long long)m->n_seq);
    return NULL;
}

dsc_status dsc_megatron_open(const char *prefix, dsc_megatron **out) {
    *out = NULL;
    dsc_megatron *m = calloc(1, sizeof *m);
    DSC_CHECK(m, DSC_ERR_NOMEM, "Megatron dataset %s: out of memory", prefix);
    char path[1100];
    snprintf(path, sizeof path, "%s.idx", prefix);
    dsc_status s = map_file(path, &m->idx);
    snprintf(path, sizeof path, "%s.bin", prefix);
    if (!s) s = map_file(path, &m->bin);
    int64_t n_doc = 0;
    if (!s) s = check_index(m, &n_doc);
    if (!s) s = check_sequences(m, n_doc);
    if (s) {
        dsc_megatron_close(m);
        return s;
    }
    *out = m;
    return NULL;
}

void dsc_megatron_close(dsc_megatron *m) {
    if (!m) return;
    unmap(&m->idx);
    unmap(&m->bin);
    free(m->start);
    free(m);
}

int64_t dsc_megatron_count(const dsc_megatron *m) {
    return m->start[m->n_seq];
}
int dsc_megatron_item_bytes(const dsc_megatron *m) {
    return m->item;
}

/* The sequence holding stream position pos: the last i with start[i] <= pos. */
static int64_t sequence_of(const dsc_megatron *m, int64_t pos) {
    int64_t lo = 0, hi = m->n_seq - 1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo + 1) / 2;
        if (m->start[mid] <= pos)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static int64_t token_at(const dsc_megatron *m, const unsigned char *p) {
    switch (m->code) {
    case 1:
        return *p;
    case 2:
        return (int8_t)*p;
    case 3: {
        int16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case 4: {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case 5: {
        int64_t v;
        memcpy(&v, p, 8);
        return v;
    }
    default: {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    }
}

dsc_status dsc_megatron_read(const dsc_megatron *m, int64_t pos, int64_t n, int64_t vocab_limit, int32_t *out) {
    DSC_CHECK(pos >= 0 && n >= 0 && pos <= dsc_megatron_count(m) - n, DSC_ERR_INVALID,
              "Megatron dataset %s: read of [%lld, %lld) is outside its %lld tokens", m->idx.path, (long long)pos,
              (long long)(pos + n), (long long)dsc_megatron_count(m));
    int64_t seq = n > 0 ? sequence_of(m, pos) : 0;
    for (int64_t i = 0; i < n; i++) {
        while (pos + i >= m->start[seq + 1])
            seq++; /* empty sequences are skipped */
        const unsigned char *p = m->bin.data + i64_at(m->pointers, seq) + (pos + i - m->start[seq]) * m->item;
        int64_t id = token_at(m, p);
        DSC_CHECK(id >= 0 && id < vocab_limit, DSC_ERR_CORRUPT,
                  "Megatron dataset %s: token id %lld (sequence %lld, stream position %lld) is outside [0, %lld)",
                  m->bin.path, (long long)id, (long long)seq, (long long)(pos + i), (long long)vocab_limit);
        out[i] = (int32_t)id;
    }
    return NULL;
}
