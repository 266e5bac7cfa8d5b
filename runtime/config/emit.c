/* The way back out of a dsc_config: the complete effective configuration as
 * JSON (what checkpoints store; parsing it again gives the same struct), and
 * the Markdown reference table of the schema that docs/config.md carries.
 * Both walk the schema; neither checks anything. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/config/config_impl.h"

static cJSON *emit_value(const dsc_config_key *key, const dsc_config *cfg) {
    const char *field = (const char *)cfg + key->offset;
    switch (key->kind) {
    case DSC_CONFIG_KIND_OBJECT:
        return cJSON_CreateObject();
    case DSC_CONFIG_KIND_BOOL:
        return cJSON_CreateBool(*(const bool *)field);
    case DSC_CONFIG_KIND_INT: {
        double v = key->size == sizeof(int64_t) ? (double)*(const int64_t *)field : (double)*(const int *)field;
        /* Only the batch sizes can still be unset (0) after the rules ran. */
        if (v == 0 && (key->flags & DSC_CONFIG_NULLABLE)) return cJSON_CreateNull();
        return cJSON_CreateNumber(v);
    }
    case DSC_CONFIG_KIND_FLOAT: {
        double v = *(const double *)field;
        if (v == 0 && (key->flags & DSC_CONFIG_NULLABLE)) return cJSON_CreateNull(); /* Muon's rates, unused */
        return cJSON_CreateNumber(v);
    }
    case DSC_CONFIG_KIND_FLOATS:
        return cJSON_CreateDoubleArray((const double *)field, (int)(key->size / sizeof(double)));
    case DSC_CONFIG_KIND_STRING:
        return cJSON_CreateString(*(char *const *)field);
    case DSC_CONFIG_KIND_ENUM: {
        int v = *(const int *)field;
        if (v == 0 && (key->flags & DSC_CONFIG_NULLABLE)) return cJSON_CreateNull();
        return cJSON_CreateString(key->choices[v]);
    }
    }
    return NULL;
}

dsc_status dsc_config_to_json(const dsc_config *cfg, char **json) {
    *json = NULL;
    size_t count;
    const dsc_config_key *keys = dsc_config_schema(&count);
    cJSON *root = cJSON_CreateObject();
    DSC_CHECK(root, DSC_ERR_NOMEM, "writing the config as JSON");
    for (size_t i = 0; i < count; i++) {
        size_t plen = dsc_config_parent_len(keys[i].path);
        char parent_path[256];
        snprintf(parent_path, sizeof parent_path, "%.*s", (int)plen, keys[i].path);
        /* Sections precede their keys in the schema, so the parent exists. */
        cJSON *parent = plen ? (cJSON *)dsc_config_lookup(root, parent_path) : root;
        cJSON *value = emit_value(&keys[i], cfg);
        const char *name = keys[i].path + plen + (plen > 0);
        if (!parent || !value || !cJSON_AddItemToObject(parent, name, value)) {
            cJSON_Delete(value);
            cJSON_Delete(root);
            return dsc_error(DSC_ERR_NOMEM, "writing config key \"%s\" as JSON", keys[i].path);
        }
    }
    *json = cJSON_Print(root);
    cJSON_Delete(root);
    DSC_CHECK(*json, DSC_ERR_NOMEM, "printing the config as JSON");
    return NULL;
}

/* Appends printf-style text to a growing buffer. */
static int append(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int append(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (*len + (size_t)n + 1 > *cap) {
        size_t want = 2 * *cap + (size_t)n + 1;
        char *grown = realloc(*buf, want);
        if (!grown) return 0;
        *buf = grown;
        *cap = want;
    }
    va_start(ap, fmt);
    vsnprintf(*buf + *len, *cap - *len, fmt, ap);
    va_end(ap);
    *len += (size_t)n;
    return 1;
}

/* The allowed range for the table: ">= 1", "> 0", "[0, 1)"; upper bounds
 * that only reflect the storage type (int, exact doubles) are left out. */
static void describe_range(const dsc_config_key *key, char *out, size_t len) {
    *out = '\0';
    int numeric = key->kind == DSC_CONFIG_KIND_INT || key->kind == DSC_CONFIG_KIND_FLOAT ||
                  key->kind == DSC_CONFIG_KIND_FLOATS;
    if (!numeric) return;
    if (key->flags & DSC_CONFIG_LISTED) {
        snprintf(out, len, "%g..%g", key->min, key->max);
        return;
    }
    int has_max = key->max < 2147483647.0;
    int min_open = (key->flags & DSC_CONFIG_MIN_EXCLUSIVE) != 0,
        max_open = (key->flags & DSC_CONFIG_MAX_EXCLUSIVE) != 0;
    if (has_max)
        snprintf(out, len, "%s%g, %g%s", min_open ? "(" : "[", key->min, key->max, max_open ? ")" : "]");
    else if (isfinite(key->min))
        snprintf(out, len, "%s %g", min_open ? ">" : ">=", key->min);
}

dsc_status dsc_config_reference_markdown(char **markdown) {
    size_t count, len = 0, cap = 0;
    const dsc_config_key *keys = dsc_config_schema(&count);
    char *buf = NULL;
    int ok = append(&buf, &len, &cap, "| key | type | range | default | meaning |\n|---|---|---|---|---|\n");
    for (size_t i = 0; ok && i < count; i++) {
        char kind[256], range[64];
        dsc_config_describe_kind(&keys[i], kind, sizeof kind);
        describe_range(&keys[i], range, sizeof range);
        if (keys[i].kind == DSC_CONFIG_KIND_OBJECT)
            ok = append(&buf, &len, &cap, "| **`%s`** | section | | | %s |\n", keys[i].path, keys[i].doc);
        else
            ok = append(&buf, &len, &cap, "| `%s` | %s | %s | `%s` | %s |\n", keys[i].path, kind, range,
                        keys[i].def, keys[i].doc);
    }
    if (!ok) {
        free(buf);
        return dsc_error(DSC_ERR_NOMEM, "writing the config reference");
    }
    *markdown = buf;
    return NULL;
}
