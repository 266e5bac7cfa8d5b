/* Reading safetensors checkpoints: memory-map each file, parse and validate
 * its JSON header with cJSON, resolve sharded sets through their index, and
 * look tensors up by name as zero-copy views or f32 copies.
 *
 * Validation happens once, at open, so a lookup never meets a bad offset.
 * It does not know parameter names or model layouts (the policy maps names),
 * and does not count mapped file pages as allocated memory: the kernel pages
 * them in and out, and callers that copy into their own tensors count those. */
#define _POSIX_C_SOURCE 200809L /* mmap, fstat, strdup */
#include "dsc/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef enum st_kind { ST_FLOAT, ST_INT, ST_UINT, ST_BOOL, ST_OTHER } st_kind;

typedef struct st_dtype {
    const char *name;
    size_t size;
    st_kind kind;
    dsc_dtype dsc; /* DSC_DTYPE_COUNT when dsc has no such dtype */
} st_dtype;

static const st_dtype DTYPES[] = {
    {"F64", 8, ST_FLOAT, DSC_DTYPE_COUNT},     {"F32", 4, ST_FLOAT, DSC_DTYPE_F32},
    {"F16", 2, ST_FLOAT, DSC_DTYPE_F16},       {"BF16", 2, ST_FLOAT, DSC_DTYPE_BF16},
    {"I64", 8, ST_INT, DSC_DTYPE_I64},         {"I32", 4, ST_INT, DSC_DTYPE_I32},
    {"I16", 2, ST_INT, DSC_DTYPE_COUNT},       {"I8", 1, ST_INT, DSC_DTYPE_COUNT},
    {"U64", 8, ST_OTHER, DSC_DTYPE_COUNT},     {"U32", 4, ST_OTHER, DSC_DTYPE_COUNT},
    {"U16", 2, ST_OTHER, DSC_DTYPE_COUNT},     {"U8", 1, ST_UINT, DSC_DTYPE_U8},
    {"BOOL", 1, ST_BOOL, DSC_DTYPE_COUNT},     {"F8_E4M3", 1, ST_OTHER, DSC_DTYPE_COUNT},
    {"F8_E5M2", 1, ST_OTHER, DSC_DTYPE_COUNT},
};
#define N_DTYPES ((int)(sizeof DTYPES / sizeof DTYPES[0]))

typedef struct st_file {
    char *path;
    void *map; /* the whole file, read-only */
    size_t size;
    const uint8_t *data; /* first byte after the header */
    cJSON *metadata;     /* "__metadata__" object or NULL */
} st_file;

typedef struct st_entry {
    char *name;
    int file;
    int dtype; /* index into DTYPES */
    int ndim;
    int64_t shape[DSC_MAX_DIMS];
    int64_t numel;
    uint64_t begin, end;
} st_entry;

struct dsc_safetensors {
    st_file *files;
    int n_files;
    st_entry *entries; /* sorted by name once loading is done */
    int64_t n_entries;
    int64_t cap_entries;
};

/* ---- files ---------------------------------------------------------------------- */

static dsc_status map_file(const char *path, st_file *f) {
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY);
    DSC_CHECK(fd >= 0, DSC_ERR_IO, "safetensors %s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return dsc_error(DSC_ERR_IO, "safetensors %s: fstat failed: %s", path, strerror(e));
    }
    f->size = (size_t)sb.st_size;
    f->path = strdup(path);
    if (f->size > 0) {
        f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            int e = errno;
            f->map = NULL;
            close(fd);
            return dsc_error(DSC_ERR_IO, "safetensors %s: mmap of %zu bytes failed: %s", path, f->size,
                             strerror(e));
        }
    }
    close(fd); /* the mapping stays valid */
    DSC_CHECK(f->path, DSC_ERR_NOMEM, "safetensors %s: out of memory", path);
    return NULL;
}

static void unmap_file(st_file *f) {
    if (f->map) munmap(f->map, f->size);
    cJSON_Delete(f->metadata);
    free(f->path);
}

static dsc_status push_entry(dsc_safetensors *st, const st_entry *e) {
    if (st->n_entries == st->cap_entries) {
        int64_t cap = st->cap_entries ? 2 * st->cap_entries : 64;
        st_entry *p = realloc(st->entries, (size_t)cap * sizeof *p);
        DSC_CHECK(p, DSC_ERR_NOMEM, "safetensors: out of memory for %lld tensor entries", (long long)cap);
        st->entries = p;
        st->cap_entries = cap;
    }
    st->entries[st->n_entries++] = *e;
    return NULL;
}

/* ---- header parsing ---------------------------------------------------------------- */

/* A JSON number that is a non-negative integer below 2^53 (exact in a double). */
static bool get_uint(const cJSON *item, uint64_t *out) {
    if (!cJSON_IsNumber(item)) return false;
    double d = item->valuedouble;
    if (!(d >= 0 && d <= 9007199254740992.0) || d != (double)(uint64_t)d) return false;
    *out = (uint64_t)d;
    return true;
}

static dsc_status parse_metadata(st_file *f, cJSON *meta) {
    DSC_CHECK(cJSON_IsObject(meta), DSC_ERR_CORRUPT, "safetensors %s: __metadata__ is not an object", f->path);
    for (cJSON *kv = meta->child; kv; kv = kv->next)
        DSC_CHECK(cJSON_IsString(kv), DSC_ERR_CORRUPT,
                  "safetensors %s: __metadata__ value of \"%s\" is not a string", f->path, kv->string);
    f->metadata = meta;
    return NULL;
}

static dsc_status parse_entry(const st_file *f, int file_idx, const cJSON *item, uint64_t data_size, st_entry *e) {
    const char *name = item->string;
    DSC_CHECK(cJSON_IsObject(item), DSC_ERR_CORRUPT, "safetensors %s: tensor %s: entry is not an object", f->path,
              name);
    memset(e, 0, sizeof *e);
    e->file = file_idx;
    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(item, "dtype");
    DSC_CHECK(cJSON_IsString(dtype), DSC_ERR_CORRUPT, "safetensors %s: tensor %s: missing dtype", f->path, name);
    e->dtype = -1;
    for (int i = 0; i < N_DTYPES; i++)
        if (strcmp(DTYPES[i].name, dtype->valuestring) == 0) e->dtype = i;
    DSC_CHECK(e->dtype >= 0, DSC_ERR_CORRUPT, "safetensors %s: tensor %s: unknown dtype \"%s\"", f->path, name,
              dtype->valuestring);

    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(item, "shape");
    DSC_CHECK(cJSON_IsArray(shape), DSC_ERR_CORRUPT, "safetensors %s: tensor %s: missing shape", f->path, name);
    int ndim = cJSON_GetArraySize(shape);
    DSC_CHECK(ndim <= DSC_MAX_DIMS, DSC_ERR_UNSUPPORTED,
              "safetensors %s: tensor %s: %d dimensions (dsc allows %d)", f->path, name, ndim, DSC_MAX_DIMS);
    e->ndim = ndim;
    uint64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        uint64_t extent;
        DSC_CHECK(get_uint(cJSON_GetArrayItem(shape, d), &extent), DSC_ERR_CORRUPT,
                  "safetensors %s: tensor %s: shape[%d] is not a non-negative integer", f->path, name, d);
        DSC_CHECK(extent == 0 || numel <= (UINT64_MAX / 16) / extent, DSC_ERR_CORRUPT,
                  "safetensors %s: tensor %s: shape overflows", f->path, name);
        e->shape[d] = (int64_t)extent;
        numel *= extent;
    }
    e->numel = (int64_t)numel;

    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(item, "data_offsets");
    DSC_CHECK(cJSON_IsArray(offs) && cJSON_GetArraySize(offs) == 2 &&
                  get_uint(cJSON_GetArrayItem(offs, 0), &e->begin) &&
                  get_uint(cJSON_GetArrayItem(offs, 1), &e->end),
              DSC_ERR_CORRUPT, "safetensors %s: tensor %s: data_offsets must be two non-negative integers",
              f->path, name);
    DSC_CHECK(e->begin <= e->end && e->end <= data_size, DSC_ERR_CORRUPT,
              "safetensors %s: tensor %s: data_offsets [%llu, %llu] out of range of the %llu data bytes", f->path,
              name, (unsigned long long)e->begin, (unsigned long long)e->end, (unsigned long long)data_size);
    uint64_t want = numel * DTYPES[e->dtype].size;
    DSC_CHECK(e->end - e->begin == want, DSC_ERR_CORRUPT,
              "safetensors %s: tensor %s: data_offsets span %llu bytes but shape and dtype %s need %llu", f->path,
              name, (unsigned long long)(e->end - e->begin), DTYPES[e->dtype].name, (unsigned long long)want);
    e->name = strdup(name);
    DSC_CHECK(e->name, DSC_ERR_NOMEM, "safetensors %s: out of memory", f->path);
    return NULL;
}

static dsc_status parse_header(dsc_safetensors *st, int file_idx) {
    st_file *f = &st->files[file_idx];
    DSC_CHECK(f->size >= 8, DSC_ERR_CORRUPT, "safetensors %s: file of %zu bytes is too short for a header length",
              f->path, f->size);
    const uint8_t *p = f->map;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | p[i];
    DSC_CHECK(n <= f->size - 8, DSC_ERR_CORRUPT, "safetensors %s: header length %llu is beyond the file size %zu",
              f->path, (unsigned long long)n, f->size);
    f->data = p + 8 + n;
    uint64_t data_size = f->size - 8 - n;
    /* The JSON must fill the header (writers pad it with spaces): bytes after
     * the object would be a second reading of the same header. */
    const char *end = NULL, *header_end = (const char *)p + 8 + n;
    cJSON *root = cJSON_ParseWithLengthOpts((const char *)p + 8, (size_t)n, &end, false);
    DSC_CHECK(root, DSC_ERR_CORRUPT, "safetensors %s: header is not valid JSON", f->path);
    while (end < header_end && (*end == ' ' || *end == '\n' || *end == '\t' || *end == '\r' || *end == '\0'))
        end++;
    dsc_status s = NULL;
    if (end != header_end) {
        s = dsc_error(DSC_ERR_CORRUPT, "safetensors %s: %lld bytes after the header's JSON", f->path,
                      (long long)(header_end - end));
        goto done;
    }
    if (!cJSON_IsObject(root)) {
        s = dsc_error(DSC_ERR_CORRUPT, "safetensors %s: header is not a JSON object", f->path);
        goto done;
    }
    for (cJSON *item = root->child; item; item = item->next) {
        if (strcmp(item->string, "__metadata__") == 0) {
            DSC_TRY_GOTO(s, parse_metadata(f, item), done);
            continue;
        }
        st_entry e;
        DSC_TRY_GOTO(s, parse_entry(f, file_idx, item, data_size, &e), done);
        s = push_entry(st, &e);
        if (s) {
            free(e.name);
            goto done;
        }
    }
    if (f->metadata) cJSON_DetachItemViaPointer(root, f->metadata);
done:
    if (s) f->metadata = NULL;
    cJSON_Delete(root);
    return s;
}

/* ---- set-level checks and lookup ----------------------------------------------------- */

static int by_file_offset(const void *pa, const void *pb) {
    const st_entry *a = pa, *b = pb;
    if (a->file != b->file) return a->file < b->file ? -1 : 1;
    return (a->begin > b->begin) - (a->begin < b->begin);
}

static int by_name(const void *pa, const void *pb) {
    return strcmp(((const st_entry *)pa)->name, ((const st_entry *)pb)->name);
}

static dsc_status check_entries(dsc_safetensors *st) {
    if (st->n_entries == 0) return NULL; /* qsort and bsearch take no NULL array, even empty */
    qsort(st->entries, (size_t)st->n_entries, sizeof(st_entry), by_file_offset);
    uint64_t prev_end = 0;
    const st_entry *prev = NULL;
    for (int64_t i = 0; i < st->n_entries; i++) {
        const st_entry *e = &st->entries[i];
        if (prev && prev->file != e->file) prev = NULL;
        if (e->begin == e->end) continue; /* empty tensors occupy no bytes */
        DSC_CHECK(!prev || e->begin >= prev_end, DSC_ERR_CORRUPT,
                  "safetensors %s: tensors %s [%llu, %llu) and %s [%llu, %llu) overlap", st->files[e->file].path,
                  prev->name, (unsigned long long)prev->begin, (unsigned long long)prev_end, e->name,
                  (unsigned long long)e->begin, (unsigned long long)e->end);
        prev = e;
        prev_end = e->end;
    }
    qsort(st->entries, (size_t)st->n_entries, sizeof(st_entry), by_name);
    for (int64_t i = 1; i < st->n_entries; i++)
        DSC_CHECK(strcmp(st->entries[i - 1].name, st->entries[i].name) != 0, DSC_ERR_CORRUPT,
                  "safetensors: tensor %s appears in both %s and %s", st->entries[i].name,
                  st->files[st->entries[i - 1].file].path, st->files[st->entries[i].file].path);
    return NULL;
}

static const st_entry *lookup(const dsc_safetensors *st, const char *name) {
    st_entry key = {.name = (char *)name};
    if (st->n_entries == 0) return NULL;
    return bsearch(&key, st->entries, (size_t)st->n_entries, sizeof(st_entry), by_name);
}

/* ---- opening ------------------------------------------------------------------------------ */

static dsc_status add_file(dsc_safetensors *st, const char *path) {
    st_file *files = realloc(st->files, (size_t)(st->n_files + 1) * sizeof *files);
    DSC_CHECK(files, DSC_ERR_NOMEM, "safetensors %s: out of memory", path);
    st->files = files;
    dsc_status s = map_file(path, &st->files[st->n_files]);
    st->n_files++; /* even on failure, so close() releases what map_file got */
    DSC_TRY(s);
    return parse_header(st, st->n_files - 1);
}

static dsc_status read_text(const char *path, char **out) {
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    DSC_CHECK(fp, DSC_ERR_IO, "safetensors index %s: cannot open: %s", path, strerror(errno));
    dsc_status s = NULL;
    long size = -1;
    if (fseek(fp, 0, SEEK_END) == 0) size = ftell(fp);
    char *text = size >= 0 ? malloc((size_t)size + 1) : NULL;
    if (!text || fseek(fp, 0, SEEK_SET) != 0 || fread(text, 1, (size_t)size, fp) != (size_t)size) {
        s = dsc_error(DSC_ERR_IO, "safetensors index %s: cannot read", path);
        free(text);
    } else {
        text[size] = '\0';
        *out = text;
    }
    fclose(fp);
    return s;
}

static bool file_index_of(const dsc_safetensors *st, const char *path, int *idx) {
    for (int i = 0; i < st->n_files; i++)
        if (strcmp(st->files[i].path, path) == 0) {
            *idx = i;
            return true;
        }
    return false;
}

/* Opens every shard the index's weight_map names, then checks that each
 * mapped tensor is really in the shard the map says. */
static dsc_status open_index(dsc_safetensors *st, const char *index_path) {
    char *text;
    DSC_TRY(read_text(index_path, &text));
    cJSON *root = cJSON_Parse(text);
    free(text);
    DSC_CHECK(root, DSC_ERR_CORRUPT, "safetensors index %s: not valid JSON", index_path);
    dsc_status s = NULL;
    const char *slash = strrchr(index_path, '/');
    int dir_len = slash ? (int)(slash - index_path + 1) : 0;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(map)) {
        s = dsc_error(DSC_ERR_CORRUPT, "safetensors index %s: missing weight_map object", index_path);
        goto done;
    }
    for (int pass = 0; pass < 2 && !s; pass++) {
        for (const cJSON *kv = map->child; kv && !s; kv = kv->next) {
            if (!cJSON_IsString(kv)) {
                s = dsc_error(DSC_ERR_CORRUPT, "safetensors index %s: weight_map value of %s is not a file name",
                              index_path, kv->string);
                break;
            }
            /* Shards live beside the index: a name with a directory in it
             * ("../../x", "/etc/x") would open any file the user can read. */
            if (strchr(kv->valuestring, '/') || strcmp(kv->valuestring, "..") == 0) {
                s = dsc_error(DSC_ERR_CORRUPT,
                              "safetensors index %s: shard \"%s\" of %s is not a file beside the index",
                              index_path, kv->valuestring, kv->string);
                break;
            }
            char path[4096];
            if (snprintf(path, sizeof path, "%.*s%s", dir_len, index_path, kv->valuestring) >= (int)sizeof path) {
                s = dsc_error(DSC_ERR_IO, "safetensors index %s: shard path too long", index_path);
                break;
            }
            int idx = -1;
            bool known = file_index_of(st, path, &idx);
            if (pass == 0 && !known) {
                s = dsc_error_wrap(add_file(st, path), "safetensors index %s", index_path);
            } else if (pass == 1) {
                const st_entry *e = lookup(st, kv->string);
                if (!e || e->file != idx)
                    s = dsc_error(
                        DSC_ERR_CORRUPT,
                        "safetensors index %s: weight_map puts tensor %s in %s, which has no such tensor",
                        index_path, kv->string, path);
            }
        }
        if (pass == 0 && !s) s = check_entries(st);
    }
done:
    cJSON_Delete(root);
    return s;
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

dsc_status dsc_safetensors_open(dsc_safetensors **out, const char *path) {
    *out = NULL;
    dsc_safetensors *st = calloc(1, sizeof *st);
    DSC_CHECK(st, DSC_ERR_NOMEM, "safetensors %s: out of memory", path);
    dsc_status s = NULL;
    struct stat sb;
    char buf[4096];
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(buf, sizeof buf, "%s/model.safetensors.index.json", path);
        if (access(buf, F_OK) == 0) {
            s = open_index(st, buf);
        } else {
            snprintf(buf, sizeof buf, "%s/model.safetensors", path);
            s = access(buf, F_OK) == 0 ? add_file(st, buf)
                                       : dsc_error(DSC_ERR_IO,
                                                   "safetensors: directory %s has neither "
                                                   "model.safetensors.index.json nor model.safetensors",
                                                   path);
            if (!s) s = check_entries(st);
        }
    } else if (ends_with(path, ".json")) {
        s = open_index(st, path);
    } else {
        s = add_file(st, path);
        if (!s) s = check_entries(st);
    }
    if (s) {
        dsc_safetensors_close(st);
        return s;
    }
    *out = st;
    return NULL;
}

void dsc_safetensors_close(dsc_safetensors *st) {
    if (!st) return;
    for (int64_t i = 0; i < st->n_entries; i++)
        free(st->entries[i].name);
    for (int i = 0; i < st->n_files; i++)
        unmap_file(&st->files[i]);
    free(st->entries);
    free(st->files);
    free(st);
}

/* ---- access ----------------------------------------------------------------------------------- */

int64_t dsc_safetensors_count(const dsc_safetensors *st) {
    return st->n_entries;
}

static void describe(const dsc_safetensors *st, const st_entry *e, dsc_safetensors_tensor *out) {
    const st_file *f = &st->files[e->file];
    *out = (dsc_safetensors_tensor){.name = e->name,
                                    .file = f->path,
                                    .dtype_name = DTYPES[e->dtype].name,
                                    .dtype = DTYPES[e->dtype].dsc,
                                    .ndim = e->ndim,
                                    .numel = e->numel,
                                    .data = f->data + e->begin,
                                    .nbytes = (size_t)(e->end - e->begin)};
    memcpy(out->shape, e->shape, sizeof e->shape);
}

void dsc_safetensors_at(const dsc_safetensors *st, int64_t i, dsc_safetensors_tensor *out) {
    describe(st, &st->entries[i], out);
}

bool dsc_safetensors_find(const dsc_safetensors *st, const char *name, dsc_safetensors_tensor *out) {
    const st_entry *e = lookup(st, name);
    if (e) describe(st, e, out);
    return e != NULL;
}

const char *dsc_safetensors_metadata(const dsc_safetensors *st, const char *key) {
    if (st->n_files == 0 || !st->files[0].metadata) return NULL;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(st->files[0].metadata, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

dsc_status dsc_safetensors_view(const dsc_safetensors *st, const char *name, dsc_tensor *out) {
    dsc_safetensors_tensor t;
    DSC_CHECK(dsc_safetensors_find(st, name, &t), DSC_ERR_INVALID, "safetensors: no tensor named %s", name);
    DSC_CHECK(t.dtype != DSC_DTYPE_COUNT, DSC_ERR_UNSUPPORTED,
              "safetensors %s: tensor %s has dtype %s, which dsc lacks", t.file, name, t.dtype_name);
    *out = dsc_tensor_view((void *)t.data, t.dtype, t.ndim, t.shape, DSC_CPU);
    return NULL;
}

/* Element i of little-endian raw data of dtype d, as a double. memcpy because
 * tensors inside a file need not be aligned. */
static double load_element(const uint8_t *p, const st_dtype *d) {
    switch (d->size * 16 + (size_t)d->kind) {
    case 8 * 16 + ST_FLOAT: {
        double x;
        memcpy(&x, p, 8);
        return x;
    }
    case 4 * 16 + ST_FLOAT: {
        float x;
        memcpy(&x, p, 4);
        return x;
    }
    case 8 * 16 + ST_INT: {
        int64_t x;
        memcpy(&x, p, 8);
        return (double)x;
    }
    case 4 * 16 + ST_INT: {
        int32_t x;
        memcpy(&x, p, 4);
        return x;
    }
    case 2 * 16 + ST_INT: {
        int16_t x;
        memcpy(&x, p, 2);
        return x;
    }
    case 1 * 16 + ST_INT:
        return (int8_t)p[0];
    case 1 * 16 + ST_UINT:
        return p[0];
    case 1 * 16 + ST_BOOL:
        return p[0] != 0;
    }
    uint16_t h;
    memcpy(&h, p, 2);
    return d->dsc == DSC_DTYPE_BF16 ? dsc_bf16_to_f32(h) : dsc_f16_to_f32(h);
}

dsc_status dsc_safetensors_read_f32_range(const dsc_safetensors *st, const char *name, int64_t offset,
                                          int64_t count, float *dst) {
    const st_entry *e = lookup(st, name);
    DSC_CHECK(e, DSC_ERR_INVALID, "safetensors: no tensor named %s", name);
    const st_dtype *d = &DTYPES[e->dtype];
    const char *file = st->files[e->file].path;
    DSC_CHECK(offset >= 0 && count >= 0 && offset <= e->numel && count <= e->numel - offset, DSC_ERR_INVALID,
              "safetensors %s: elements [%lld, +%lld) are outside tensor %s of %lld", file, (long long)offset,
              (long long)count, name, (long long)e->numel);
    DSC_CHECK(d->kind != ST_OTHER, DSC_ERR_UNSUPPORTED, "safetensors %s: tensor %s: no f32 conversion from %s",
              file, name, d->name);
    const uint8_t *src = st->files[e->file].data + e->begin + (size_t)offset * d->size;
    if (d->dsc == DSC_DTYPE_F32) {
        memcpy(dst, src, (size_t)count * sizeof(float));
        return NULL;
    }
    for (int64_t i = 0; i < count; i++)
        dst[i] = (float)load_element(src + (size_t)i * d->size, d);
    return NULL;
}

dsc_status dsc_safetensors_read_f32(const dsc_safetensors *st, const char *name, float *dst, int64_t numel) {
    const st_entry *e = lookup(st, name);
    DSC_CHECK(e, DSC_ERR_INVALID, "safetensors: no tensor named %s", name);
    DSC_CHECK(numel == e->numel, DSC_ERR_INVALID, "safetensors %s: tensor %s has %lld elements, destination %lld",
              st->files[e->file].path, name, (long long)e->numel, (long long)numel);
    return dsc_safetensors_read_f32_range(st, name, 0, numel, dst);
}
