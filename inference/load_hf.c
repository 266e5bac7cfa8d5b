/* Loading a Hugging Face model directory: config.json (architecture name ->
 * policy, which parses the rest) and model.safetensors or a sharded
 * model.safetensors.index.json, memory-mapped by dsc/safetensors.h and read
 * tensor by tensor as f32 (f32, bf16, f16). Not here: name mapping
 * (model_build.c) or dsc checkpoints (load_dsc.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "dsc/safetensors.h"
#include "inference/load.h"

static void st_describe(void *impl, int64_t i, const char **name, int *ndim, int64_t *shape) {
    dsc_safetensors_tensor t;
    dsc_safetensors_at(impl, i, &t);
    *name = t.name;
    *ndim = t.ndim;
    memcpy(shape, t.shape, (size_t)t.ndim * sizeof *shape);
}

static dsc_status st_read_span(void *impl, int64_t i, int64_t offset, int64_t count, float *dst) {
    dsc_safetensors_tensor t;
    dsc_safetensors_at(impl, i, &t);
    DSC_CHECK(t.dtype == DSC_DTYPE_F32 || t.dtype == DSC_DTYPE_BF16 || t.dtype == DSC_DTYPE_F16,
              DSC_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s (f32, bf16 and f16 are supported)", t.file, t.name,
              t.dtype_name);
    return dsc_safetensors_read_f32_range(impl, t.name, offset, count, dst);
}

static dsc_status st_read(void *impl, int64_t i, float *dst, int64_t numel) {
    dsc_safetensors_tensor t;
    dsc_safetensors_at(impl, i, &t);
    DSC_CHECK(numel == t.numel, DSC_ERR_INVALID, "%s: tensor %s has %lld elements, destination %lld", t.file,
              t.name, (long long)t.numel, (long long)numel);
    return st_read_span(impl, i, 0, numel, dst);
}

dsc_status dsc_load_read_text(const char *path, char **out) {
    FILE *f = fopen(path, "rb");
    DSC_CHECK(f, DSC_ERR_IO, "cannot open %s", path);
    dsc_status s = NULL;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) != 0) s = dsc_error(DSC_ERR_IO, "cannot seek %s", path);
    long n = s ? 0 : ftell(f);
    if (!s && (n < 0 || fseek(f, 0, SEEK_SET) != 0)) s = dsc_error(DSC_ERR_IO, "cannot size %s", path);
    if (!s && !(buf = malloc((size_t)n + 1))) s = dsc_error(DSC_ERR_NOMEM, "reading %s (%ld bytes)", path, n);
    if (!s && fread(buf, 1, (size_t)n, f) != (size_t)n) s = dsc_error(DSC_ERR_IO, "short read of %s", path);
    fclose(f);
    if (s) {
        free(buf);
        return s;
    }
    buf[n] = '\0';
    *out = buf;
    return NULL;
}

/* architectures[0] of config.json. */
static dsc_status hf_arch(const char *json, const char *source, char *arch, size_t len) {
    cJSON *root = cJSON_Parse(json);
    DSC_CHECK(root, DSC_ERR_CORRUPT, "%s: invalid JSON (cJSON_Parse failed)", source);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *first = cJSON_IsArray(list) ? cJSON_GetArrayItem(list, 0) : NULL;
    dsc_status s = NULL;
    if (cJSON_IsString(first))
        snprintf(arch, len, "%s", first->valuestring);
    else
        s = dsc_error(DSC_ERR_CORRUPT, "%s: missing \"architectures\": [name]", source);
    cJSON_Delete(root);
    return s;
}

dsc_status dsc_load_hf_config(const char *dir, const dsc_policy **policy, dsc_infer_model_config *mc,
                              char **json) {
    char path[2048], arch[128];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text;
    DSC_TRY(dsc_load_read_text(path, &text));
    dsc_status s = hf_arch(text, path, arch, sizeof arch);
    if (!s) s = dsc_policy_find(arch, policy);
    if (!s) s = (*policy)->configure(mc, text, path);
    if (s || !json)
        free(text);
    else
        *json = text;
    return s;
}

dsc_status dsc_load_hf(const char *dir, const dsc_load_request *req) {
    char path[2048], arch[128];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *json;
    DSC_TRY(dsc_load_read_text(path, &json));
    dsc_status s = hf_arch(json, path, arch, sizeof arch);
    const dsc_policy *policy = NULL;
    dsc_infer_model_config mc;
    dsc_safetensors *st = NULL;
    if (!s) s = dsc_policy_find(arch, &policy);
    /* A family with no policy can still be planned (name rules), not loaded. */
    bool plan_only = s && req->plan && dsc_status_code(s) == DSC_ERR_UNSUPPORTED;
    if (plan_only) {
        dsc_status_free(s);
        s = NULL;
    }
    if (!s && !plan_only) s = policy->configure(&mc, json, path);
    if (!s) s = dsc_safetensors_open(&st, dir);
    if (!s) {
        dsc_tensor_source src = {st, dsc_safetensors_count(st), st_describe, st_read, st_read_span};
        s = plan_only ? dsc_load_plan_by_names(&src, json, path, req)
                      : dsc_load_finish(policy, &mc, &src, json, path, req);
        s = dsc_error_wrap(s, "loading %s", dir);
    }
    free(json);
    dsc_safetensors_close(st);
    return s;
}
