/* From a JSON tree to a typed dsc_config, driven by the schema: rejects
 * unknown and duplicate keys, checks each value's type and range, fills
 * defaults, then hands over to the rules (auto values, cross-field checks).
 * It does not read files or apply overrides (config.c does). */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "runtime/config/config_impl.h"

static void format_number(double v, char *out, size_t len) {
    if (v == floor(v) && fabs(v) < 1e16)
        snprintf(out, len, "%.0f", v);
    else
        snprintf(out, len, "%g", v);
}

void dsc_config_describe_kind(const dsc_config_key *key, char *out, size_t len) {
    const char *null_too =
        (key->flags & DSC_CONFIG_NULLABLE) && key->kind != DSC_CONFIG_KIND_ENUM ? " or null" : "";
    switch (key->kind) {
    case DSC_CONFIG_KIND_OBJECT:
        snprintf(out, len, "an object");
        return;
    case DSC_CONFIG_KIND_BOOL:
        snprintf(out, len, *null_too ? "true, false or null" : "true or false");
        return;
    case DSC_CONFIG_KIND_INT:
        snprintf(out, len, "an integer%s", null_too);
        return;
    case DSC_CONFIG_KIND_FLOAT:
        snprintf(out, len, "a number%s", null_too);
        return;
    case DSC_CONFIG_KIND_STRING:
        snprintf(out, len, "a string%s", null_too);
        return;
    case DSC_CONFIG_KIND_FLOATS:
        snprintf(out, len, "an array of %zu numbers%s", key->size / sizeof(double), null_too);
        return;
    case DSC_CONFIG_KIND_ENUM: {
        size_t used = (size_t)snprintf(out, len, "one of");
        for (int i = 0; key->choices[i] && used < len; i++) {
            int is_null = i == 0 && (key->flags & DSC_CONFIG_NULLABLE);
            used += (size_t)snprintf(out + used, len - used, is_null ? "%s %s" : "%s \"%s\"", i ? "," : "",
                                     key->choices[i]);
        }
        return;
    }
    }
}

void dsc_config_describe_value(const cJSON *value, char *out, size_t len) {
    char num[64];
    if (cJSON_IsString(value)) {
        const char *s = value->valuestring;
        size_t n = strlen(s);
        if (n > 40)
            snprintf(out, len, "string \"%.37s...\"", s);
        else
            snprintf(out, len, "string \"%s\"", s);
    } else if (cJSON_IsNumber(value)) {
        format_number(value->valuedouble, num, sizeof num);
        snprintf(out, len, "number %s", num);
    } else if (cJSON_IsBool(value)) {
        snprintf(out, len, "%s", cJSON_IsTrue(value) ? "true" : "false");
    } else if (cJSON_IsNull(value)) {
        snprintf(out, len, "null");
    } else if (cJSON_IsObject(value)) {
        snprintf(out, len, "an object");
    } else {
        snprintf(out, len, "an array");
    }
}

static dsc_status type_error(const char *source, const dsc_config_key *key, const cJSON *got) {
    char want[256], have[128];
    dsc_config_describe_kind(key, want, sizeof want);
    dsc_config_describe_value(got, have, sizeof have);
    return dsc_error(DSC_ERR_CONFIG, "%s: \"%s\" must be %s, got %s", source, key->path, want, have);
}

const cJSON *dsc_config_lookup(const cJSON *root, const char *path) {
    char part[128];
    const cJSON *node = root;
    while (node && *path) {
        size_t n = strcspn(path, ".");
        if (n >= sizeof part || !cJSON_IsObject(node)) return NULL;
        memcpy(part, path, n);
        part[n] = '\0';
        node = cJSON_GetObjectItemCaseSensitive(node, part);
        path += n + (path[n] == '.');
    }
    return node;
}

/* Unknown keys, duplicated keys and sections that are not objects, all
 * recorded. A key the schema lacks may be one of DeepSpeed's (deepspeed.c). */
static void check_keys(const cJSON *object, const char *path, const char *source, dsc_config_issues *is) {
    for (const cJSON *child = object->child; child; child = child->next) {
        char full[256];
        snprintf(full, sizeof full, "%s%s%s", path, *path ? "." : "", child->string);
        bool duplicate = false;
        for (const cJSON *prev = object->child; prev != child && !duplicate; prev = prev->next)
            duplicate = strcmp(prev->string, child->string) == 0;
        if (duplicate) {
            dsc_config_issue(is, dsc_error(DSC_ERR_CONFIG, "%s: duplicate key \"%s\"", source, full));
            continue;
        }
        const dsc_config_key *key = dsc_config_schema_find(full);
        if (!key) {
            dsc_config_check_not_in_schema(path, child, source, is);
            continue;
        }
        if (key->kind != DSC_CONFIG_KIND_OBJECT) continue;
        if (!cJSON_IsObject(child)) {
            dsc_config_issue(is, type_error(source, key, child));
            continue;
        }
        check_keys(child, full, source, is);
    }
}

static dsc_status check_range(const char *source, const dsc_config_key *key, const char *index, double v) {
    char bound[64], got[64];
    format_number(v, got, sizeof got);
    int below = (key->flags & DSC_CONFIG_MIN_EXCLUSIVE) ? v <= key->min : v < key->min;
    int above = (key->flags & DSC_CONFIG_MAX_EXCLUSIVE) ? v >= key->max : v > key->max;
    if (!below && !above) return NULL;
    if (key->flags & DSC_CONFIG_LISTED) {
        char list[128];
        size_t used = 0;
        for (double x = key->min; x <= key->max && used < sizeof list; x++)
            used += (size_t)snprintf(list + used, sizeof list - used, "%s%.0f", x > key->min ? ", " : "", x);
        return dsc_error(DSC_ERR_CONFIG, "%s: \"%s\" must be one of %s, got %s", source, key->path, list, got);
    }
    const char *op = below ? ((key->flags & DSC_CONFIG_MIN_EXCLUSIVE) ? ">" : ">=")
                           : ((key->flags & DSC_CONFIG_MAX_EXCLUSIVE) ? "<" : "<=");
    format_number(below ? key->min : key->max, bound, sizeof bound);
    return dsc_error(DSC_ERR_CONFIG, "%s: \"%s%s\" must be %s %s, got %s", source, key->path, index, op, bound,
                     got);
}

static dsc_status set_enum(const char *source, const dsc_config_key *key, const cJSON *value, int *field) {
    int first = (key->flags & DSC_CONFIG_NULLABLE) ? 1 : 0;
    if (!cJSON_IsString(value)) return type_error(source, key, value);
    for (int i = first; key->choices[i]; i++) {
        if (strcasecmp(key->choices[i], value->valuestring) == 0) {
            *field = i;
            return NULL;
        }
    }
    return type_error(source, key, value);
}

static dsc_status set_value(const char *source, const dsc_config_key *key, const cJSON *value, dsc_config *cfg) {
    char *field = (char *)cfg + key->offset;
    bool is_auto = cJSON_IsString(value) && strcmp(value->valuestring, "auto") == 0;
    if ((cJSON_IsNull(value) || is_auto) && (key->flags & DSC_CONFIG_NULLABLE)) return NULL; /* zero = auto */
    if (is_auto && key->kind != DSC_CONFIG_KIND_STRING && key->kind != DSC_CONFIG_KIND_ENUM)
        return dsc_error(DSC_ERR_CONFIG,
                         "%s: \"%s\" is \"auto\", which dsc cannot derive for this key (no Hugging Face "
                         "TrainingArguments here); give a value",
                         source, key->path);
    switch (key->kind) {
    case DSC_CONFIG_KIND_OBJECT:
        return NULL;
    case DSC_CONFIG_KIND_BOOL:
        if (!cJSON_IsBool(value)) return type_error(source, key, value);
        *(bool *)field = cJSON_IsTrue(value);
        return NULL;
    case DSC_CONFIG_KIND_INT: {
        double v = value->valuedouble;
        if (!cJSON_IsNumber(value) || v != floor(v)) return type_error(source, key, value);
        DSC_TRY(check_range(source, key, "", v));
        if (key->size == sizeof(int64_t))
            *(int64_t *)field = (int64_t)v;
        else
            *(int *)field = (int)v;
        return NULL;
    }
    case DSC_CONFIG_KIND_FLOAT:
        if (!cJSON_IsNumber(value)) return type_error(source, key, value);
        DSC_TRY(check_range(source, key, "", value->valuedouble));
        *(double *)field = value->valuedouble;
        return NULL;
    case DSC_CONFIG_KIND_FLOATS: {
        size_t n = key->size / sizeof(double);
        if (!cJSON_IsArray(value) || (size_t)cJSON_GetArraySize(value) != n) return type_error(source, key, value);
        size_t i = 0;
        for (const cJSON *item = value->child; item; item = item->next, i++) {
            char index[32];
            snprintf(index, sizeof index, "[%zu]", i);
            if (!cJSON_IsNumber(item)) return type_error(source, key, value);
            DSC_TRY(check_range(source, key, index, item->valuedouble));
            ((double *)field)[i] = item->valuedouble;
        }
        return NULL;
    }
    case DSC_CONFIG_KIND_STRING: {
        if (!cJSON_IsString(value)) return type_error(source, key, value);
        char *copy = strdup(value->valuestring);
        DSC_CHECK(copy, DSC_ERR_NOMEM, "%s: copying \"%s\"", source, key->path);
        *(char **)field = copy;
        return NULL;
    }
    case DSC_CONFIG_KIND_ENUM:
        return set_enum(source, key, value, (int *)field);
    }
    return NULL;
}

void dsc_config_free_fields(dsc_config *cfg) {
    size_t count;
    const dsc_config_key *keys = dsc_config_schema(&count);
    for (size_t i = 0; i < count; i++) {
        if (keys[i].kind != DSC_CONFIG_KIND_STRING) continue;
        char **field = (char **)((char *)cfg + keys[i].offset);
        free(*field);
        *field = NULL;
    }
}

dsc_status dsc_config_check_value(const char *source, const dsc_config_key *key, const cJSON *value) {
    if (key->kind == DSC_CONFIG_KIND_OBJECT) {
        if (!cJSON_IsObject(value)) return type_error(source, key, value);
        dsc_config_issues is = {.source = source};
        check_keys(value, key->path, source, &is);
        return dsc_config_issues_finish(&is);
    }
    dsc_config scratch;
    memset(&scratch, 0, sizeof scratch);
    dsc_status st = set_value(source, key, value, &scratch);
    dsc_config_free_fields(&scratch);
    return st;
}

static dsc_status set_default(const dsc_config_key *key, dsc_config *cfg) {
    cJSON *def = cJSON_Parse(key->def);
    DSC_CHECK(def, DSC_ERR_INTERNAL, "default of config key \"%s\" is not JSON: %s", key->path, key->def);
    dsc_status st = set_value("the schema", key, def, cfg);
    cJSON_Delete(def);
    return st;
}

/* Every value, or its default when missing or wrong (so the rules still see a
 * consistent struct and report their own problems). */
static void set_all(const cJSON *root, const char *source, dsc_config *cfg, dsc_config_issues *is) {
    size_t count;
    const dsc_config_key *keys = dsc_config_schema(&count);
    for (size_t i = 0; i < count; i++) {
        if (keys[i].kind == DSC_CONFIG_KIND_OBJECT) continue;
        const cJSON *value = dsc_config_lookup(root, keys[i].path);
        dsc_status st = value ? set_value(source, &keys[i], value, cfg) : NULL;
        if (!value || st) {
            dsc_config_issue(is, st);
            dsc_config_issue(is, set_default(&keys[i], cfg));
        }
    }
}

dsc_status dsc_config_build(const cJSON *root, const char *source, dsc_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    dsc_config_issues is = {.source = source};
    cJSON *tree = cJSON_Duplicate(root, 1);
    DSC_CHECK(tree, DSC_ERR_NOMEM, "%s: copying the config", source);
    dsc_config_resolve_hf_auto(tree, source, &is);
    check_keys(tree, "", source, &is);
    set_all(tree, source, cfg, &is);
    dsc_config_apply_rules(tree, source, cfg, &is);
    cJSON_Delete(tree);
    dsc_status st = dsc_config_issues_finish(&is);
    if (st) dsc_config_free_fields(cfg);
    return st;
}
