/* Loading a job config: reading the file, parsing JSON (syntax errors with
 * line and column), applying "--set a.b.c=value" overrides to the tree, and
 * owning the result. The checks themselves live in build.c and rules.c; the
 * way back to JSON in emit.c. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/config/config_impl.h"

/* Line and column (both from 1) of `at` within `text`. */
static void line_col(const char *text, const char *at, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (const char *p = text; p < at && *p; p++) {
        if (*p == '\n') {
            ++*line;
            *col = 1;
        } else {
            ++*col;
        }
    }
}

static dsc_status parse_json(const char *text, const char *source, cJSON **root) {
    const char *end = NULL;
    *root = cJSON_ParseWithOpts(text, &end, 1);
    if (!*root) {
        if (!end) end = text;
        int line, col;
        line_col(text, end, &line, &col);
        if (!*end)
            return dsc_error(DSC_ERR_CONFIG, "%s:%d:%d: malformed JSON: unexpected end of input", source, line,
                             col);
        /* cJSON stops just past the offending character, so show what leads up to it. */
        const char *from = end - (col - 1 > 24 ? 24 : col - 1);
        int after = (int)strcspn(end, "\n");
        return dsc_error(DSC_ERR_CONFIG, "%s:%d:%d: malformed JSON near `%.*s`", source, line, col,
                         (int)(end - from) + (after > 8 ? 8 : after), from);
    }
    if (cJSON_IsObject(*root)) return NULL;
    char got[128];
    dsc_config_describe_value(*root, got, sizeof got);
    cJSON_Delete(*root);
    *root = NULL;
    return dsc_error(DSC_ERR_CONFIG, "%s: the top level must be a JSON object, got %s", source, got);
}

/* Checks that every part of `path` is a known key and that only the last
 * one may be a value; returns the key for the whole path, or NULL for a key
 * inside one of DeepSpeed's sections (deepspeed_keys.c), which the build checks. */
static dsc_status check_path(const char *source, const char *path, const dsc_config_key **key) {
    char prefix[256];
    size_t parent = 0;
    *key = NULL;
    DSC_CHECK(*path && strlen(path) < sizeof prefix, DSC_ERR_CONFIG, "%s: bad key \"%s\"", source, path);
    for (size_t i = 0;; i++) {
        if (path[i] != '.' && path[i] != '\0') continue;
        memcpy(prefix, path, i);
        prefix[i] = '\0';
        DSC_CHECK(!*key || (*key)->kind == DSC_CONFIG_KIND_OBJECT, DSC_ERR_CONFIG,
                  "%s: \"%s\" is a value, not a section, so \"%s\" does not exist", source, (*key)->path, path);
        *key = dsc_config_schema_find(prefix);
        if (!*key && dsc_config_deepspeed_find(prefix))
            return NULL; /* DeepSpeed's: checked when the tree is built */
        if (!*key) {
            char hint[512], parent_path[256];
            snprintf(parent_path, sizeof parent_path, "%.*s", (int)parent, path);
            dsc_config_suggest(parent_path, prefix + parent + (parent > 0), hint, sizeof hint);
            return dsc_error(DSC_ERR_CONFIG, "%s: unknown key \"%s\"%s", source, prefix, hint);
        }
        if (!path[i]) return NULL;
        parent = i;
    }
}

/* Sets `value` (consumed) at `path` in the tree, creating sections. */
static dsc_status tree_set(cJSON *root, const char *path, cJSON *value) {
    char part[256];
    cJSON *node = root;
    for (;;) {
        size_t n = strcspn(path, ".");
        snprintf(part, sizeof part, "%.*s", (int)n, path);
        if (!path[n]) break;
        cJSON *next = cJSON_GetObjectItemCaseSensitive(node, part);
        if (!cJSON_IsObject(next)) { /* the override wins over a malformed section */
            cJSON_DeleteItemFromObjectCaseSensitive(node, part);
            next = cJSON_CreateObject();
            if (!next || !cJSON_AddItemToObject(node, part, next)) {
                cJSON_Delete(next);
                cJSON_Delete(value);
                return dsc_error(DSC_ERR_NOMEM, "creating config section \"%s\"", part);
            }
        }
        node = next;
        path += n + 1;
    }
    cJSON_DeleteItemFromObjectCaseSensitive(node, part);
    if (!cJSON_AddItemToObject(node, part, value)) {
        cJSON_Delete(value);
        return dsc_error(DSC_ERR_NOMEM, "setting config key \"%s\"", part);
    }
    return NULL;
}

/* Applies one "a.b.c=value" to the tree; `who` is the prefix for messages,
 * e.g. config.json: --set "a.b.c=value". */
static dsc_status override_tree(cJSON *root, const char *who, const char *assignment) {
    const char *eq = strchr(assignment, '=');
    DSC_CHECK(eq && eq > assignment, DSC_ERR_CONFIG, "%s: expected KEY=VALUE", who);
    char path[256];
    DSC_CHECK((size_t)(eq - assignment) < sizeof path, DSC_ERR_CONFIG, "%s: key too long", who);
    snprintf(path, sizeof path, "%.*s", (int)(eq - assignment), assignment);
    const dsc_config_key *key;
    DSC_TRY(check_path(who, path, &key));
    cJSON *value = cJSON_ParseWithOpts(eq + 1, NULL, 1);
    if (!value) value = cJSON_CreateString(eq + 1);
    DSC_CHECK(value, DSC_ERR_NOMEM, "%s: parsing the value", who);
    dsc_status st = key ? dsc_config_check_value(who, key, value) : NULL;
    if (st) {
        cJSON_Delete(value);
        return st;
    }
    return tree_set(root, path, value);
}

/* Builds the struct from the tree and makes it own the tree and its name. */
static dsc_status adopt(cJSON *root, const char *source, const char *who, dsc_config *cfg) {
    dsc_config built;
    dsc_status st = dsc_config_build(root, who, &built);
    if (!st) {
        built.source = strdup(source);
        built.json = malloc(sizeof *built.json);
        if (!built.source || !built.json) {
            free(built.source);
            free(built.json);
            dsc_config_free_fields(&built);
            st = dsc_error(DSC_ERR_NOMEM, "%s: keeping the config", source);
        }
    }
    if (st) {
        cJSON_Delete(root);
        return st;
    }
    built.json->root = root;
    *cfg = built;
    return NULL;
}

static void describe_override(char *who, size_t len, const char *source, const char *assignment) {
    snprintf(who, len, "%s: --set \"%s\"", source, assignment);
}

dsc_status dsc_config_parse_string(const char *json, const char *source, const char *const *overrides,
                                   int n_overrides, dsc_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cJSON *root;
    DSC_TRY(parse_json(json, source, &root));
    for (int i = 0; i < n_overrides; i++) {
        char who[512];
        describe_override(who, sizeof who, source, overrides[i]);
        dsc_status st = override_tree(root, who, overrides[i]);
        if (st) {
            cJSON_Delete(root);
            return st;
        }
    }
    return adopt(root, source, source, cfg);
}

dsc_status dsc_config_load_file(const char *path, const char *const *overrides, int n_overrides, dsc_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    FILE *f = fopen(path, "rb");
    DSC_CHECK(f, DSC_ERR_CONFIG, "%s: cannot open: %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            cap = 2 * cap + 4096 + 1;
            char *grown = realloc(text, cap);
            if (!grown) {
                free(text);
                fclose(f);
                return dsc_error(DSC_ERR_NOMEM, "%s: reading", path);
            }
            text = grown;
        }
        size_t got = fread(text + len, 1, 4096, f);
        len += got;
        if (got < 4096) break;
    }
    int failed = ferror(f);
    fclose(f);
    text[len] = '\0';
    dsc_status st = failed ? dsc_error(DSC_ERR_CONFIG, "%s: read error", path)
                           : dsc_config_parse_string(text, path, overrides, n_overrides, cfg);
    free(text);
    return st;
}

dsc_status dsc_config_apply_override(dsc_config *cfg, const char *assignment) {
    DSC_CHECK(cfg->json, DSC_ERR_INVALID, "applying --set \"%s\" to a config that was not loaded", assignment);
    char who[512];
    describe_override(who, sizeof who, cfg->source, assignment);
    cJSON *root = cJSON_Duplicate(cfg->json->root, 1);
    DSC_CHECK(root, DSC_ERR_NOMEM, "%s: copying the config", who);
    dsc_status st = override_tree(root, who, assignment);
    if (st) {
        cJSON_Delete(root);
        return st;
    }
    dsc_config updated;
    DSC_TRY(adopt(root, cfg->source, who, &updated));
    dsc_config_free(cfg);
    *cfg = updated;
    return NULL;
}

void dsc_config_free(dsc_config *cfg) {
    if (!cfg) return;
    dsc_config_free_fields(cfg);
    free(cfg->source);
    if (cfg->json) cJSON_Delete(cfg->json->root);
    free(cfg->json);
    memset(cfg, 0, sizeof *cfg);
}
