/* Writing safetensors files: a JSON header built with cJSON, padded with
 * spaces to a multiple of 8 bytes (as the reference writer does, so that
 * the data section starts aligned), then the tensors' bytes back to back.
 *
 * Used by tests and by model export. It writes one file; sharding a large
 * export and writing its index is the exporter's decision. */
#include "dsc/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *st_dtype_name(dsc_dtype d) {
    switch (d) {
    case DSC_DTYPE_F32:
        return "F32";
    case DSC_DTYPE_BF16:
        return "BF16";
    case DSC_DTYPE_F16:
        return "F16";
    case DSC_DTYPE_I32:
        return "I32";
    case DSC_DTYPE_I64:
        return "I64";
    case DSC_DTYPE_U8:
        return "U8";
    default:
        return NULL;
    }
}

#define JSON_TRY(st, expr, what, label)                                                                           \
    do {                                                                                                          \
        if (!(expr)) {                                                                                            \
            (st) = dsc_error(DSC_ERR_NOMEM, "safetensors %s: cJSON failed building %s", path, what);              \
            goto label;                                                                                           \
        }                                                                                                         \
    } while (0)

static dsc_status build_header(const char *path, int64_t n, const char *const *names, const dsc_tensor *tensors,
                               int n_meta, const char *const *meta, char **out) {
    *out = NULL;
    dsc_status s = NULL;
    cJSON *root = cJSON_CreateObject();
    JSON_TRY(s, root, "the header", done);
    if (n_meta > 0) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        JSON_TRY(s, m, "__metadata__", done);
        for (int j = 0; j < n_meta; j++)
            JSON_TRY(s, cJSON_AddStringToObject(m, meta[2 * j], meta[2 * j + 1]), "metadata", done);
    }
    uint64_t offset = 0;
    for (int64_t i = 0; i < n; i++) {
        const dsc_tensor *t = &tensors[i];
        const char *dt = st_dtype_name(t->dtype);
        if (!dt || t->device.type != DSC_DEVICE_CPU || strcmp(names[i], "__metadata__") == 0 ||
            cJSON_GetObjectItemCaseSensitive(root, names[i])) {
            s = dsc_error(
                DSC_ERR_INVALID,
                "safetensors %s: tensor %s: needs a distinct name and a cpu tensor of f32, bf16, f16, i32, "
                "i64 or u8 (got %s)",
                path, names[i], dsc_dtype_name(t->dtype));
            goto done;
        }
        cJSON *e = cJSON_AddObjectToObject(root, names[i]);
        JSON_TRY(s, e && cJSON_AddStringToObject(e, "dtype", dt), names[i], done);
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        JSON_TRY(s, shape, names[i], done);
        for (int d = 0; d < t->ndim; d++)
            JSON_TRY(s, cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d])), names[i], done);
        uint64_t end = offset + dsc_tensor_nbytes(t);
        cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
        JSON_TRY(s,
                 offs && cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)offset)) &&
                     cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)end)),
                 names[i], done);
        offset = end;
    }
    *out = cJSON_PrintUnformatted(root);
    JSON_TRY(s, *out, "the header text", done);
done:
    cJSON_Delete(root);
    return s;
}

dsc_status dsc_safetensors_write(const char *path, int64_t n, const char *const *names, const dsc_tensor *tensors,
                                 int n_meta, const char *const *meta) {
    char *header;
    DSC_TRY(build_header(path, n, names, tensors, n_meta, meta, &header));
    size_t len = strlen(header), padded = (len + 7) / 8 * 8;
    char tmp[4096];
    dsc_status s = NULL;
    FILE *fp = NULL;
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
        s = dsc_error(DSC_ERR_IO, "safetensors %s: path too long", path);
        goto done;
    }
    fp = fopen(tmp, "wb");
    if (!fp) {
        s = dsc_error(DSC_ERR_IO, "safetensors %s: cannot create: %s", tmp, strerror(errno));
        goto done;
    }
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    bool ok = fwrite(le, 1, 8, fp) == 8 && fwrite(header, 1, len, fp) == len;
    for (size_t i = len; ok && i < padded; i++)
        ok = fputc(' ', fp) != EOF;
    for (int64_t i = 0; ok && i < n; i++) {
        size_t bytes = dsc_tensor_nbytes(&tensors[i]);
        ok = bytes == 0 || fwrite(tensors[i].data, 1, bytes, fp) == bytes;
    }
    if (fclose(fp) != 0) ok = false;
    if (!ok || rename(tmp, path) != 0) {
        s = dsc_error(DSC_ERR_IO, "safetensors %s: write failed: %s", path, strerror(errno));
        remove(tmp);
    }
done:
    free(header);
    return s;
}
