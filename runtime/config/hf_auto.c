/* The Hugging Face Trainer's "auto" values. HF's integration fills them from
 * TrainingArguments; dsc has no TrainingArguments, so each is filled the way
 * the Trainer fills it with its defaults, or derived from the rest of the
 * config where the Trainer derives it (batch sizes from each other, the
 * warmup peak from the optimizer's lr, bucket sizes from the hidden size,
 * total steps from train.steps). Each replacement is logged once, so the
 * effective value is never a surprise; --set KEY=VALUE overrides it.
 *
 * Not here: "auto" on dsc's own nullable keys (build.c treats it as null),
 * fp16.enabled / bf16.enabled included: null is off, as the Trainer's
 * args.fp16 / args.bf16 default. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "dsc/log.h"
#include "runtime/config/config_impl.h"

static bool is_auto(const cJSON *v) {
    return cJSON_IsString(v) && strcmp(v->valuestring, "auto") == 0;
}

/* A number at `path` in the tree, else the schema's default for it. */
static double number_or_default(const cJSON *root, const char *path) {
    const cJSON *v = dsc_config_lookup(root, path);
    if (cJSON_IsNumber(v)) return v->valuedouble;
    const dsc_config_key *key = dsc_config_schema_find(path);
    cJSON *def = key && key->def ? cJSON_Parse(key->def) : NULL;
    double d = cJSON_IsNumber(def) ? def->valuedouble : 0.0;
    cJSON_Delete(def);
    return d;
}

/* Replaces the "auto" at `path` (if any) by `json`, logging `why`. */
static void replace(cJSON *root, const char *source, const char *path, const char *json, const char *why,
                    dsc_config_issues *is) {
    size_t parent_len = dsc_config_parent_len(path);
    char parent[256];
    snprintf(parent, sizeof parent, "%.*s", (int)parent_len, path);
    cJSON *section = parent_len ? (cJSON *)dsc_config_lookup(root, parent) : root;
    const char *name = path + parent_len + (parent_len > 0);
    if (!cJSON_IsObject(section) || !is_auto(cJSON_GetObjectItemCaseSensitive(section, name))) return;
    cJSON *value = cJSON_Parse(json);
    if (!value || !cJSON_ReplaceItemInObjectCaseSensitive(section, name, value)) {
        cJSON_Delete(value);
        dsc_config_issue(is, dsc_error(DSC_ERR_NOMEM, "%s: resolving \"%s\" \"auto\"", source, path));
        return;
    }
    dsc_log_rank0(DSC_LOG_INFO, "%s: \"%s\" \"auto\" -> %s (%s)", source, path, json, why);
}

void dsc_config_resolve_hf_auto(cJSON *root, const char *source, dsc_config_issues *is) {
    char num[64];
    const cJSON *global = dsc_config_lookup(root, "train_batch_size");
    replace(root, source, "train_batch_size", "null", "micro batch * accumulation * data-parallel size", is);
    replace(root, source, "train_micro_batch_size_per_gpu", cJSON_IsNumber(global) ? "null" : "8",
            cJSON_IsNumber(global) ? "from train_batch_size" : "the Trainer's per_device_train_batch_size default",
            is);
    replace(root, source, "gradient_accumulation_steps", "null",
            "from the batch sizes, else 1 as the Trainer's default", is);
    replace(root, source, "gradient_clipping", "1.0", "the Trainer's max_grad_norm default", is);
    replace(root, source, "optimizer.params.lr", "5e-05", "the Trainer's learning_rate default", is);
    replace(root, source, "optimizer.params.betas", "[0.9, 0.999]",
            "the Trainer's adam_beta1, adam_beta2 defaults", is);
    replace(root, source, "optimizer.params.eps", "1e-08", "the Trainer's adam_epsilon default", is);
    replace(root, source, "optimizer.params.weight_decay", "0.0", "the Trainer's weight_decay default", is);
    replace(root, source, "scheduler.params.warmup_min_lr", "0", "as the Trainer sets it", is);
    snprintf(num, sizeof num, "%.9g", number_or_default(root, "optimizer.params.lr"));
    replace(root, source, "scheduler.params.warmup_max_lr", num, "optimizer.params.lr", is);
    replace(root, source, "scheduler.params.warmup_num_steps", "0", "the Trainer's warmup_steps default", is);
    replace(root, source, "scheduler.params.total_num_steps", "null", "train.steps", is);
    double d = number_or_default(root, "model.d_model");
    snprintf(num, sizeof num, "%.0f", d * d);
    replace(root, source, "zero_optimization.reduce_bucket_size", num, "model.d_model squared, as the Trainer",
            is);
    snprintf(num, sizeof num, "%.0f", floor(0.9 * d * d));
    replace(root, source, "zero_optimization.stage3_prefetch_bucket_size", num,
            "0.9 * model.d_model squared, as the Trainer", is);
    snprintf(num, sizeof num, "%.0f", 10 * d);
    replace(root, source, "zero_optimization.stage3_param_persistence_threshold", num,
            "10 * model.d_model, as the Trainer", is);
}
