/* DeepSpeed's inference config keys that dsc implements (dsc/inference.h,
 * dsc_infer_ds_config): tensor_parallel (tp_size, tp_grain_size,
 * partition_config as DeepSpeed's layer_specs), max_out_tokens and
 * min_out_tokens. Strict: every other key is refused by name, so a config
 * written for DeepSpeed never half-applies. Not here: what the values do
 * (the loader, the engine, dsc-generate). */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "inference/load.h"

static dsc_status only_keys(const cJSON *obj, const char *where, const char *source, const char *const *allowed) {
    const cJSON *item;
    cJSON_ArrayForEach(item, obj) {
        bool ok = false;
        for (const char *const *a = allowed; *a && !ok; a++)
            ok = strcmp(item->string, *a) == 0;
        DSC_CHECK(ok, DSC_ERR_UNSUPPORTED, "%s: %s%s is not supported by dsc's inference engine", source, where,
                  item->string);
    }
    return NULL;
}

static dsc_status get_count(const cJSON *obj, const char *key, const char *source, int64_t min, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return NULL;
    DSC_CHECK(cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) && v->valuedouble >= (double)min &&
                  v->valuedouble < 9.0e15,
              DSC_ERR_CONFIG, "%s: %s must be an integer >= %lld", source, key, (long long)min);
    *out = (int64_t)v->valuedouble;
    return NULL;
}

static dsc_status parse_specs(const cJSON *pc, const char *source, dsc_infer_ds_config *c) {
    static const char *const pc_keys[] = {"use_default_specs", "layer_specs", NULL};
    static const char *const spec_keys[] = {"patterns", "partition_type", NULL};
    DSC_CHECK(cJSON_IsObject(pc), DSC_ERR_CONFIG, "%s: tensor_parallel.partition_config must be an object",
              source);
    DSC_TRY(only_keys(pc, "tensor_parallel.partition_config.", source, pc_keys));
    const cJSON *defaults = cJSON_GetObjectItemCaseSensitive(pc, "use_default_specs");
    DSC_CHECK(!defaults || cJSON_IsBool(defaults), DSC_ERR_CONFIG,
              "%s: partition_config.use_default_specs must be true or false", source);
    c->tp.no_name_rules = defaults && cJSON_IsFalse(defaults);
    const cJSON *specs = cJSON_GetObjectItemCaseSensitive(pc, "layer_specs"), *spec;
    if (!specs) return NULL;
    DSC_CHECK(cJSON_IsArray(specs), DSC_ERR_CONFIG, "%s: partition_config.layer_specs must be a list", source);
    int n = 0, i = 0;
    cJSON_ArrayForEach(spec, specs) {
        const cJSON *pats = cJSON_GetObjectItemCaseSensitive(spec, "patterns");
        DSC_CHECK(cJSON_IsObject(spec) && cJSON_IsArray(pats), DSC_ERR_CONFIG,
                  "%s: layer_specs[%d] needs \"patterns\": [regex, ...]", source, i);
        DSC_TRY(only_keys(spec, "partition_config.layer_specs[].", source, spec_keys));
        n += cJSON_GetArraySize(pats);
        i++;
    }
    c->owned_rules = calloc((size_t)n + 1, sizeof *c->owned_rules);
    c->owned_patterns = calloc((size_t)n + 1, sizeof *c->owned_patterns);
    DSC_CHECK(c->owned_rules && c->owned_patterns, DSC_ERR_NOMEM, "%s: partition_config", source);
    i = 0;
    cJSON_ArrayForEach(spec, specs) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(spec, "partition_type"), *pat;
        const char *t = cJSON_IsString(type) ? type->valuestring : "";
        dsc_tp_kind k = strcmp(t, "column") == 0 ? DSC_TP_KIND_COLUMN
                        : strcmp(t, "row") == 0  ? DSC_TP_KIND_ROW
                        : strcmp(t, "skip") == 0 ? DSC_TP_KIND_REPLICATE
                                                 : DSC_TP_KIND_UNDECLARED;
        DSC_CHECK(k != DSC_TP_KIND_UNDECLARED, DSC_ERR_CONFIG,
                  "%s: layer_specs[%d].partition_type must be \"column\", \"row\" or \"skip\"", source, i);
        cJSON_ArrayForEach(pat, cJSON_GetObjectItemCaseSensitive(spec, "patterns")) {
            DSC_CHECK(cJSON_IsString(pat), DSC_ERR_CONFIG, "%s: layer_specs[%d].patterns must be strings", source,
                      i);
            char *copy = strdup(pat->valuestring);
            DSC_CHECK(copy, DSC_ERR_NOMEM, "%s: partition_config pattern", source);
            c->owned_patterns[c->tp.n_rules] = copy;
            c->owned_rules[c->tp.n_rules++] = (dsc_tp_rule){copy, k};
        }
        i++;
    }
    c->tp.rules = c->owned_rules;
    return NULL;
}

static dsc_status parse(const cJSON *root, const char *source, dsc_infer_ds_config *c) {
    static const char *const top[] = {"tensor_parallel", "max_out_tokens", "min_out_tokens", NULL};
    static const char *const tp_keys[] = {"tp_size", "tp_grain_size", "partition_config", "enabled", NULL};
    DSC_CHECK(cJSON_IsObject(root), DSC_ERR_CONFIG, "%s: not a JSON object", source);
    DSC_TRY(only_keys(root, "", source, top));
    DSC_TRY(get_count(root, "max_out_tokens", source, 1, &c->max_out_tokens));
    DSC_TRY(get_count(root, "min_out_tokens", source, 1, &c->min_out_tokens));
    DSC_CHECK(c->min_out_tokens <= c->max_out_tokens, DSC_ERR_CONFIG,
              "%s: min_out_tokens (%lld) exceeds max_out_tokens (%lld)", source, (long long)c->min_out_tokens,
              (long long)c->max_out_tokens);
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(root, "tensor_parallel");
    if (!tp) return NULL;
    DSC_CHECK(cJSON_IsObject(tp), DSC_ERR_CONFIG, "%s: tensor_parallel must be an object", source);
    DSC_TRY(only_keys(tp, "tensor_parallel.", source, tp_keys));
    const cJSON *enabled = cJSON_GetObjectItemCaseSensitive(tp, "enabled");
    DSC_CHECK(!enabled || cJSON_IsBool(enabled), DSC_ERR_CONFIG, "%s: tensor_parallel.enabled must be a boolean",
              source);
    int64_t size = 1;
    DSC_TRY(get_count(tp, "tp_size", source, 1, &size));
    DSC_TRY(get_count(tp, "tp_grain_size", source, 1, &c->tp.grain));
    c->tp.tp_size = enabled && cJSON_IsFalse(enabled) ? 1 : (int)size;
    const cJSON *pc = cJSON_GetObjectItemCaseSensitive(tp, "partition_config");
    return pc ? parse_specs(pc, source, c) : NULL;
}

dsc_status dsc_infer_ds_config_parse(const char *json, const char *source, dsc_infer_ds_config *out) {
    *out = (dsc_infer_ds_config){.tp = {.tp_size = 1, .grain = 64}, .max_out_tokens = 1024, .min_out_tokens = 1};
    cJSON *root = cJSON_Parse(json);
    DSC_CHECK(root, DSC_ERR_CONFIG, "%s: invalid JSON (cJSON_Parse failed)", source);
    dsc_status s = parse(root, source, out);
    cJSON_Delete(root);
    if (s) dsc_infer_ds_config_free(out);
    return s;
}

dsc_status dsc_infer_ds_config_load(const char *path, dsc_infer_ds_config *out) {
    *out = (dsc_infer_ds_config){0};
    if (!path) return dsc_infer_ds_config_parse("{}", "defaults", out);
    char *json;
    DSC_TRY(dsc_load_read_text(path, &json));
    dsc_status s = dsc_infer_ds_config_parse(json, path, out);
    free(json);
    return s;
}

void dsc_infer_ds_config_free(dsc_infer_ds_config *c) {
    for (int i = 0; c->owned_patterns && i < c->tp.n_rules; i++)
        free(c->owned_patterns[i]);
    free(c->owned_patterns);
    free(c->owned_rules);
    c->owned_patterns = NULL;
    c->owned_rules = NULL;
    c->tp.rules = NULL;
    c->tp.n_rules = 0;
}
