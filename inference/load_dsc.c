/* Loading a dsc training checkpoint for inference: the HDF5 file's "config"
 * attribute (the training config; model.arch picks the policy "gpt",
 * "llama", "gpt-moe" or "mixtral") and its model/<name> datasets, read
 * whole through the tensor file layer with MPI_COMM_SELF. Optimizer, RNG
 * and engine state are never read. Not here: name mapping (model_build.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "dsc/tensor_file.h"
#include "inference/load.h"

typedef struct h5_source {
    dsc_tfile *f;
    dsc_tfile_entry *entries;
    int64_t count, cap;
} h5_source;

static dsc_status collect(const dsc_tfile_entry *e, void *user) {
    h5_source *h = user;
    if (h->count == h->cap) {
        int64_t cap = h->cap ? 2 * h->cap : 64;
        dsc_tfile_entry *grown = realloc(h->entries, (size_t)cap * sizeof *grown);
        DSC_CHECK(grown, DSC_ERR_NOMEM, "listing %s", dsc_tfile_name(h->f));
        h->entries = grown;
        h->cap = cap;
    }
    h->entries[h->count++] = *e;
    return NULL;
}

static void h5_describe(void *impl, int64_t i, const char **name, int *ndim, int64_t *shape) {
    const dsc_tfile_entry *e = &((h5_source *)impl)->entries[i];
    *name = e->path + strlen("model/");
    *ndim = e->ndim;
    memcpy(shape, e->shape, (size_t)e->ndim * sizeof *shape);
}

static dsc_status h5_read_span(void *impl, int64_t i, int64_t offset, int64_t count, float *dst) {
    h5_source *h = impl;
    const dsc_tfile_entry *e = &h->entries[i];
    if (e->dtype == DSC_DTYPE_F32) return dsc_tfile_read_range(h->f, e->path, offset, count, dst);
    DSC_CHECK(e->dtype == DSC_DTYPE_BF16 || e->dtype == DSC_DTYPE_F16, DSC_ERR_UNSUPPORTED,
              "%s: tensor %s has dtype %s", dsc_tfile_name(h->f), e->path, dsc_dtype_name(e->dtype));
    uint16_t *half = malloc((size_t)(count > 0 ? count : 1) * sizeof *half);
    DSC_CHECK(half, DSC_ERR_NOMEM, "reading %s", e->path);
    dsc_status s = dsc_tfile_read_range(h->f, e->path, offset, count, half);
    for (int64_t k = 0; !s && k < count; k++)
        dst[k] = e->dtype == DSC_DTYPE_BF16 ? dsc_bf16_to_f32(half[k]) : dsc_f16_to_f32(half[k]);
    free(half);
    return s;
}

static dsc_status h5_read(void *impl, int64_t i, float *dst, int64_t numel) {
    return h5_read_span(impl, i, 0, numel, dst);
}

/* model.arch of the training config. */
static dsc_status config_arch(const char *json, const char *source, char *arch, size_t len) {
    cJSON *root = cJSON_Parse(json);
    DSC_CHECK(root, DSC_ERR_CORRUPT, "%s: attribute config is not JSON (cJSON_Parse failed)", source);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(model, "arch");
    dsc_status s = NULL;
    if (cJSON_IsString(a))
        snprintf(arch, len, "%s", a->valuestring);
    else
        s = dsc_error(DSC_ERR_CORRUPT, "%s: attribute config lacks model.arch", source);
    cJSON_Delete(root);
    return s;
}

dsc_status dsc_load_dsc(const char *file, const dsc_load_request *req) {
    h5_source h = {0};
    DSC_TRY(dsc_tfile_open(MPI_COMM_SELF, file, &h.f));
    char *json = NULL, arch[64];
    const dsc_policy *policy = NULL;
    dsc_infer_model_config mc;
    dsc_status s = dsc_tfile_get_attr_string(h.f, "config", &json);
    if (!s) s = config_arch(json, file, arch, sizeof arch);
    if (!s) s = dsc_policy_find(arch, &policy);
    if (!s) s = policy->configure(&mc, json, file);
    if (!s) s = dsc_tfile_list(h.f, "model", collect, &h);
    if (!s) {
        dsc_tensor_source src = {&h, h.count, h5_describe, h5_read, h5_read_span};
        s = dsc_error_wrap(dsc_load_finish(policy, &mc, &src, NULL, file, req), "loading %s", file);
    }
    free(json);
    free(h.entries);
    dsc_status closed = dsc_tfile_close(h.f);
    if (s) {
        dsc_status_free(closed);
        return s;
    }
    return closed;
}
