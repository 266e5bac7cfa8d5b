/* Private to runtime/config: the schema table's shape and the steps that
 * turn a JSON tree into a dsc_config (build, rules, emit). Nothing outside
 * runtime/config includes this; the rest of dsc reads struct dsc_config. */
#ifndef DSC_RUNTIME_CONFIG_IMPL_H
#define DSC_RUNTIME_CONFIG_IMPL_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "dsc/config.h"

typedef enum dsc_config_kind {
    DSC_CONFIG_KIND_OBJECT = 0, /* a section; its keys are the entries below it */
    DSC_CONFIG_KIND_BOOL,       /* stored as bool */
    DSC_CONFIG_KIND_INT,        /* stored as int or int64_t (by field size) */
    DSC_CONFIG_KIND_FLOAT,      /* stored as double */
    DSC_CONFIG_KIND_STRING,     /* stored as an owned char * */
    DSC_CONFIG_KIND_ENUM,       /* stored as int: the index in `choices` */
    DSC_CONFIG_KIND_FLOATS      /* fixed-length array, stored as double[n] */
} dsc_config_kind;

enum {
    DSC_CONFIG_NULLABLE = 1u << 0,      /* null is allowed: "auto", resolved by the rules */
    DSC_CONFIG_MIN_EXCLUSIVE = 1u << 1, /* value must be > min, not >= */
    DSC_CONFIG_MAX_EXCLUSIVE = 1u << 2,
    DSC_CONFIG_LISTED = 1u << 3 /* small integer range reported as "one of 0, 1, 2" */
};

typedef struct dsc_config_key {
    const char *path; /* "optimizer.params.lr" */
    dsc_config_kind kind;
    size_t offset;              /* of the field in dsc_config */
    size_t size;                /* of the field */
    const char *def;            /* default as JSON text; NULL for sections */
    double min, max;            /* inclusive unless flagged; +-INFINITY when open */
    const char *const *choices; /* enum names, NULL-terminated; index = C enum value */
    unsigned flags;
    const char *doc;
} dsc_config_key;

/* What dsc_config.json points at: the tree as given, overrides applied. */
struct dsc_config_source {
    cJSON *root;
};

/* The schema, in the order the reference table and to_json list it. */
const dsc_config_key *dsc_config_schema(size_t *count);
const dsc_config_key *dsc_config_schema_find(const char *path);

/* Length of the parent part of `path` ("optimizer.params.lr" -> 16, "seed" -> 0). */
size_t dsc_config_parent_len(const char *path);

/* A hint for an unknown key `name` under `parent` ("" for the top level):
 * " (did you mean \"optimizer.params\"?)" or " (known keys: ...)". */
void dsc_config_suggest(const char *parent, const char *name, char *hint, size_t len);

/* The node at a dotted path, or NULL when any part is missing. */
const cJSON *dsc_config_lookup(const cJSON *root, const char *path);

/* Fills *cfg from the tree: unknown keys, types, ranges, defaults, then the
 * rules. On error *cfg holds nothing to free. */
dsc_status dsc_config_build(const cJSON *root, const char *source, dsc_config *cfg);

/* Checks one value (type, range, and for a section its keys) on its own,
 * as an override does before it joins the tree. */
dsc_status dsc_config_check_value(const char *source, const dsc_config_key *key, const cJSON *value);

/* Fills "auto" (null) values and checks rules that span several keys. */
dsc_status dsc_config_apply_rules(const cJSON *root, const char *source, dsc_config *cfg);

/* Frees the owned strings of the struct (not source / json). */
void dsc_config_free_fields(dsc_config *cfg);

/* Human form of the kind ("an integer", "one of \"a\", \"b\"") and of a value
 * ("string \"two\""), for messages and the reference table. */
void dsc_config_describe_kind(const dsc_config_key *key, char *out, size_t len);
void dsc_config_describe_value(const cJSON *value, char *out, size_t len);

#endif
