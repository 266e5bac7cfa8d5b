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

/* Every problem found while checking one config, so that one run reports all
 * of them. Each is "source: message"; the combined status lists them. */
typedef struct dsc_config_issues {
    const char *source;
    char *text; /* "\n  - message" per problem, source prefix removed */
    size_t len;
    int count;
    dsc_status first; /* the only problem, returned unchanged when it is alone */
} dsc_config_issues;

/* Records `problem` (consumed; NULL records nothing). */
void dsc_config_issue(dsc_config_issues *is, dsc_status problem);
/* NULL when nothing was recorded, else one DSC_ERR_CONFIG status naming every
 * problem; resets `is`. */
dsc_status dsc_config_issues_finish(dsc_config_issues *is);

/* ---- DeepSpeed's keys that are not in the schema (deepspeed_keys.c) ---- */
typedef enum dsc_ds_status {
    DSC_DS_IMPLEMENTED = 0, /* in the schema, with DeepSpeed's meaning */
    DSC_DS_BY_DESIGN,       /* accepted: dsc already does what the key asks, or the key only tunes DeepSpeed's
                               own buffers; noted once in the log with the reason */
    DSC_DS_REFUSED          /* supported by DeepSpeed, not by dsc; accepted only with the value `off` */
} dsc_ds_status;

typedef struct dsc_ds_key {
    const char *path; /* DeepSpeed's spelling; a section's entry covers the keys inside it */
    dsc_ds_status status;
    /* DSC_DS_REFUSED: the values that ask for nothing, so dsc's behaviour is DeepSpeed's:
     * "false|null" (JSON alternatives), or for a section "enabled=false" (the section's member is
     * missing or one of the values; "auto" counts as the HF Trainer's default, false). NULL:
     * refused whenever present. */
    const char *off;
    const char *children; /* a section's known keys, space-separated; NULL: not checked */
    const char *reason;   /* why (refused) or how dsc meets it (by design) */
    const char *instead;  /* what to use in dsc; may be NULL */
} dsc_ds_key;

const dsc_ds_key *dsc_config_deepspeed_keys(size_t *count);
/* The entry for `path` or the nearest section above it; NULL when DeepSpeed has no such key. */
const dsc_ds_key *dsc_config_deepspeed_find(const char *path);
/* Checks a key of the config that is not in the schema but is DeepSpeed's;
 * records a problem when it asks for what dsc does not do. */
void dsc_config_check_deepspeed(const dsc_ds_key *key, const char *path, const cJSON *value, const char *source,
                                dsc_config_issues *is);

/* A key of the config under `parent` that the schema lacks: one of
 * DeepSpeed's (checked as above) or unknown (a problem with a hint). */
void dsc_config_check_not_in_schema(const char *parent, const cJSON *value, const char *source,
                                    dsc_config_issues *is);

/* Replaces the Hugging Face Trainer's "auto" values in `root` (a copy the
 * caller owns) by what the Trainer would derive, or records that dsc cannot
 * derive them. Logs each replacement once. */
void dsc_config_resolve_hf_auto(cJSON *root, const char *source, dsc_config_issues *is);

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

/* Edit distance of two key names (case-insensitive, adjacent swaps count
 * one) and how many edits still count as a typo of a name `len` long. */
size_t dsc_config_name_distance(const char *a, const char *b);
size_t dsc_config_typo_budget(size_t len);

/* The node at a dotted path, or NULL when any part is missing. */
const cJSON *dsc_config_lookup(const cJSON *root, const char *path);

/* Fills *cfg from the tree: unknown keys, types, ranges, defaults, then the
 * rules; every problem is reported at once. On error *cfg holds nothing to free. */
dsc_status dsc_config_build(const cJSON *root, const char *source, dsc_config *cfg);

/* Checks one value (type, range, and for a section its keys) on its own,
 * as an override does before it joins the tree. */
dsc_status dsc_config_check_value(const char *source, const dsc_config_key *key, const cJSON *value);

/* Fills "auto" (null) values and checks rules that span several keys,
 * recording every violation. */
void dsc_config_apply_rules(const cJSON *root, const char *source, dsc_config *cfg, dsc_config_issues *is);
/* The Muon optimizer's defaults and refusals (rules_muon.c). */
void dsc_config_muon_rules(const cJSON *root, const char *source, dsc_config *cfg, dsc_config_issues *is);

/* Frees the owned strings of the struct (not source / json). */
void dsc_config_free_fields(dsc_config *cfg);

/* Human form of the kind ("an integer", "one of \"a\", \"b\"") and of a value
 * ("string \"two\""), for messages and the reference table. */
void dsc_config_describe_kind(const dsc_config_key *key, char *out, size_t len);
void dsc_config_describe_value(const cJSON *value, char *out, size_t len);

#endif
