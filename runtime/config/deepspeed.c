/* Checking the DeepSpeed keys of a config that dsc's schema does not hold
 * (the table is deepspeed_keys.c): a key dsc meets by design is accepted and
 * noted once; a refused one is accepted only when its value asks for nothing
 * ("enabled": false, DeepSpeed's default), else it is a problem naming the
 * reason and what to use instead. Also the Markdown of the table for
 * docs/config.md. Not here: keys of the schema (build.c). */
#define _POSIX_C_SOURCE 200809L /* strndup */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/log.h"
#include "runtime/config/config_impl.h"

const dsc_ds_key *dsc_config_deepspeed_find(const char *path) {
    size_t count;
    const dsc_ds_key *keys = dsc_config_deepspeed_keys(&count);
    for (size_t i = 0; i < count; i++)
        if (strcmp(keys[i].path, path) == 0) return &keys[i];
    return NULL;
}

/* True when `value` equals one of the '|'-separated JSON texts in `alts`. */
static bool matches_any(const cJSON *value, const char *alts) {
    while (*alts) {
        size_t n = strcspn(alts, "|");
        char *text = strndup(alts, n);
        cJSON *alt = text ? cJSON_Parse(text) : NULL;
        bool same = alt && cJSON_Compare(alt, value, 1);
        cJSON_Delete(alt);
        free(text);
        if (same) return true;
        alts += n + (alts[n] == '|');
    }
    return false;
}

static bool is_auto(const cJSON *v) {
    return cJSON_IsString(v) && strcmp(v->valuestring, "auto") == 0;
}

/* A switch member ("enabled") is off when missing, one of `alts`, or "auto"
 * (the HF Trainer resolves its switches from TrainingArguments, all false by default). */
static bool member_off(const cJSON *section, const char *member, const char *alts) {
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(section, member);
    return !m || is_auto(m) || matches_any(m, alts);
}

/* Every `member` at any depth is off (compression_training's many "enabled"s). */
static bool deep_off(const cJSON *node, const char *member, const char *alts) {
    for (const cJSON *c = node ? node->child : NULL; c; c = c->next) {
        if (c->string && strcmp(c->string, member) == 0 && !(is_auto(c) || matches_any(c, alts))) return false;
        if (cJSON_IsObject(c) && !deep_off(c, member, alts)) return false;
    }
    return true;
}

static bool asks_for_nothing(const dsc_ds_key *key, const cJSON *value) {
    if (!key->off) return false;
    const char *eq = strchr(key->off, '=');
    if (!eq) return matches_any(value, key->off);
    if (!cJSON_IsObject(value)) return false;
    char member[64];
    bool deep = strncmp(key->off, "**", 2) == 0;
    const char *name = key->off + (deep ? 2 : 0);
    snprintf(member, sizeof member, "%.*s", (int)(eq - name), name);
    return deep ? deep_off(value, member, eq + 1) : member_off(value, member, eq + 1);
}

/* Is `name` one of the space-separated words of `list`? */
static bool in_list(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        size_t w = strcspn(p, " ");
        if (w == n && strncmp(p, name, n) == 0) return true;
        p += w + (p[w] == ' ');
    }
    return false;
}

/* The member of `list` nearest to `name`, for a hint; "" when none is close. */
static void nearest_in_list(const char *list, const char *name, char *out, size_t len) {
    size_t best = (size_t)-1;
    out[0] = '\0';
    for (const char *p = list; *p;) {
        size_t w = strcspn(p, " ");
        char word[64];
        snprintf(word, sizeof word, "%.*s", (int)w, p);
        size_t d = dsc_config_name_distance(name, word);
        if (d <= dsc_config_typo_budget(strlen(name)) && d < best) {
            best = d;
            snprintf(out, len, "%s", word);
        }
        p += w + (p[w] == ' ');
    }
}

static void check_children(const char *path, const cJSON *value, const char *children, const char *source,
                           dsc_config_issues *is) {
    for (const cJSON *c = value->child; c; c = c->next) {
        char full[256];
        snprintf(full, sizeof full, "%s.%s", path, c->string);
        if (children) {
            if (in_list(children, c->string)) continue;
            char near[64];
            nearest_in_list(children, c->string, near, sizeof near);
            if (*near)
                dsc_config_issue(is, dsc_error(DSC_ERR_CONFIG, "%s: unknown key \"%s\" (did you mean \"%s.%s\"?)",
                                               source, full, path, near));
            else
                dsc_config_issue(is, dsc_error(DSC_ERR_CONFIG, "%s: unknown key \"%s\" (known keys in \"%s\": %s)",
                                               source, full, path, children));
            continue;
        }
        dsc_config_check_not_in_schema(path, c, source, is);
    }
}

void dsc_config_check_not_in_schema(const char *parent, const cJSON *value, const char *source,
                                    dsc_config_issues *is) {
    char full[256];
    snprintf(full, sizeof full, "%s%s%s", parent, *parent ? "." : "", value->string);
    const dsc_ds_key *k = dsc_config_deepspeed_find(full);
    if (k) {
        dsc_config_check_deepspeed(k, full, value, source, is);
        return;
    }
    char hint[512];
    dsc_config_suggest(parent, value->string, hint, sizeof hint);
    dsc_config_issue(is, dsc_error(DSC_ERR_CONFIG, "%s: unknown key \"%s\"%s", source, full, hint));
}

/* Whether the table has entries inside `path` (a section whose keys are listed one by one). */
static bool has_entries_under(const char *path) {
    size_t count, n = strlen(path);
    const dsc_ds_key *keys = dsc_config_deepspeed_keys(&count);
    for (size_t i = 0; i < count; i++)
        if (strncmp(keys[i].path, path, n) == 0 && keys[i].path[n] == '.') return true;
    return false;
}

void dsc_config_check_deepspeed(const dsc_ds_key *key, const char *path, const cJSON *value, const char *source,
                                dsc_config_issues *is) {
    switch (key->status) {
    case DSC_DS_IMPLEMENTED:
        dsc_config_issue(is, dsc_error(DSC_ERR_INTERNAL,
                                       "%s: \"%s\" is listed as implemented but is not in the "
                                       "schema",
                                       source, path));
        return;
    case DSC_DS_BY_DESIGN:
        if (key->reason) dsc_log_rank0(DSC_LOG_INFO, "%s: \"%s\" accepted: %s", source, path, key->reason);
        if (cJSON_IsObject(value) && has_entries_under(path)) check_children(path, value, NULL, source, is);
        return;
    case DSC_DS_REFUSED:
        if (asks_for_nothing(key, value)) {
            if (key->children && cJSON_IsObject(value)) check_children(path, value, key->children, source, is);
            return;
        }
        break;
    }
    /* name the switch that asks for the feature ("fp16.enabled" true), not the whole section */
    char what[256], got[128];
    snprintf(what, sizeof what, "%s", path);
    const char *eq = key->off ? strchr(key->off, '=') : NULL;
    if (eq && key->off[0] != '*' && cJSON_IsObject(value)) {
        char member[64];
        snprintf(member, sizeof member, "%.*s", (int)(eq - key->off), key->off);
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(value, member);
        if (m) {
            snprintf(what, sizeof what, "%s.%s", path, member);
            value = m;
        }
    }
    dsc_config_describe_value(value, got, sizeof got);
    dsc_config_issue(is, dsc_error(DSC_ERR_CONFIG, "%s: \"%s\" (%s) is supported by DeepSpeed, not by dsc: %s%s%s",
                                   source, what, got, key->reason, key->instead ? "; use " : "",
                                   key->instead ? key->instead : ""));
}

static const char *status_name(dsc_ds_status s) {
    return s == DSC_DS_IMPLEMENTED ? "implemented" : s == DSC_DS_BY_DESIGN ? "implemented (by design)" : "refused";
}

dsc_status dsc_config_deepspeed_markdown(char **markdown) {
    size_t count;
    const dsc_ds_key *keys = dsc_config_deepspeed_keys(&count);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    DSC_CHECK(f, DSC_ERR_NOMEM, "writing the DeepSpeed key table");
    fprintf(f, "| DeepSpeed key | dsc | why | use instead |\n|---|---|---|---|\n");
    for (size_t i = 0; i < count; i++) {
        const dsc_ds_key *k = &keys[i];
        if (k->status == DSC_DS_BY_DESIGN && !k->reason) continue; /* a plain section */
        const char *why = k->status == DSC_DS_IMPLEMENTED ? "see the reference above" : k->reason;
        fprintf(f, "| `%s` | %s", k->path, status_name(k->status));
        if (k->status == DSC_DS_REFUSED && k->off) { /* '|' would end the cell */
            fputs(" (accepted: `", f);
            for (const char *c = k->off; *c; c++)
                fputs(*c == '|' ? "` or `" : (char[2]){*c, 0}, f);
            fputs("`)", f);
        }
        fprintf(f, " | %s | %s |\n", why, k->instead ? k->instead : "");
    }
    if (fclose(f) != 0 || !buf) {
        free(buf);
        return dsc_error(DSC_ERR_NOMEM, "writing the DeepSpeed key table");
    }
    *markdown = buf;
    return NULL;
}
