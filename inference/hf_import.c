/* Hugging Face Llama-family directory -> dsc training model (dsc/hf.h):
 * config.json is parsed by the inference policy of its architecture (one
 * strict parser of Hugging Face configs), turned into the dsc model
 * section, and every tensor of the safetensors is matched to a dsc
 * parameter by hf_names.c's rules before training starts, so no weight of
 * the checkpoint is silently left out. Values are read on demand, in the
 * ranges each rank holds (dsc_checkpoint_load_params). Not here: GPT-2
 * checkpoints (export only) or tokenizers. */
#include "dsc/hf.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/safetensors.h"
#include "inference/hf_names.h"
#include "inference/load.h"

enum { MAX_OVERRIDES = 16, OVERRIDE_LEN = 96 };

struct dsc_hf_import {
    char dir[1024];
    dsc_infer_model_config mc;
    dsc_model_arch arch;
    dsc_safetensors *st;
    const dsc_hf_rule *rules;
    int n_rules;
    char overrides[MAX_OVERRIDES][OVERRIDE_LEN];
    int n_overrides;
};

/* What dsc training builds exactly; anything else is refused by name. */
static dsc_status check_trainable(const dsc_infer_model_config *mc, const char *dir) {
    DSC_CHECK(mc->family == DSC_INFER_FAMILY_LLAMA, DSC_ERR_UNSUPPORTED,
              "%s: only Llama-family checkpoints (Llama, Mistral, Qwen2, Mixtral) initialise training", dir);
    DSC_CHECK(mc->rope_scaling == DSC_ROPE_SCALING_NONE, DSC_ERR_UNSUPPORTED,
              "%s/config.json: rope_scaling is not implemented by dsc training (its RoPE is unscaled)", dir);
    DSC_CHECK(mc->head_size * mc->n_head == mc->d_model, DSC_ERR_UNSUPPORTED,
              "%s/config.json: head_dim %d * num_attention_heads %d != hidden_size %d; dsc training derives the "
              "head size from hidden_size",
              dir, mc->head_size, mc->n_head, mc->d_model);
    DSC_CHECK(mc->n_experts == 0 || mc->top_k >= 2, DSC_ERR_UNSUPPORTED,
              "%s/config.json: num_experts_per_tok 1: Mixtral renormalises a top-1 weight to 1 where dsc's top-1 "
              "gate (DeepSpeed's) weights by the router probability",
              dir);
    return NULL;
}

static void add_override(dsc_hf_import *imp, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add_override(dsc_hf_import *imp, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(imp->overrides[imp->n_overrides++], OVERRIDE_LEN, fmt, ap);
    va_end(ap);
}

static void make_overrides(dsc_hf_import *imp) {
    const dsc_infer_model_config *mc = &imp->mc;
    add_override(imp, "model.arch=%s", dsc_model_arch_name(imp->arch));
    add_override(imp, "model.n_layer=%d", mc->n_layer);
    add_override(imp, "model.d_model=%d", mc->d_model);
    add_override(imp, "model.n_head=%d", mc->n_head);
    add_override(imp, "model.n_kv_head=%d", mc->n_kv_head);
    add_override(imp, "model.d_ff=%d", mc->d_ff);
    add_override(imp, "model.vocab_size=%d", mc->vocab_size);
    add_override(imp, "model.rope_theta=%.17g", mc->rope_theta);
    add_override(imp, "model.norm_eps=%.7g", (double)mc->norm_eps);
    add_override(imp, "model.qkv_bias=%s", mc->qkv_bias ? "true" : "false");
    add_override(imp, "model.tie_embeddings=%s", mc->tie_embeddings ? "true" : "false");
    if (!mc->n_experts) return;
    add_override(imp, "moe.num_experts=%d", mc->n_experts);
    add_override(imp, "moe.k=%d", mc->top_k);
    add_override(imp, "moe.layer_freq=1");
}

/* Whether the dsc model of imp's config declares parameter `name`. */
static bool declared(const dsc_hf_import *imp, const char *name) {
    const dsc_infer_model_config *mc = &imp->mc;
    int layer = -1, expert = -1;
    if (sscanf(name, "layers.%d.", &layer) == 1 && (layer < 0 || layer >= mc->n_layer)) return false;
    const char *e = strstr(name, ".experts.");
    if (e && (sscanf(e, ".experts.%d.", &expert) != 1 || expert < 0 || expert >= mc->n_experts)) return false;
    if (strstr(name, ".moe.") && !mc->n_experts) return false;
    if (strstr(name, ".mlp.") && mc->n_experts) return false;
    if (strstr(name, ".bias") && !mc->qkv_bias) return false;
    return strcmp(name, "head.weight") != 0 || !mc->tie_embeddings;
}

static dsc_status check_every_tensor(const dsc_hf_import *imp) {
    for (int64_t i = 0; i < dsc_safetensors_count(imp->st); i++) {
        dsc_safetensors_tensor t;
        dsc_safetensors_at(imp->st, i, &t);
        if (strstr(t.name, ".rotary_emb.inv_freq")) continue; /* recomputed from rope_theta */
        char name[256];
        DSC_CHECK(dsc_hf_from_hf(imp->rules, imp->n_rules, t.name, name, sizeof name) && declared(imp, name),
                  DSC_ERR_UNSUPPORTED, "%s: tensor %s has no place in the dsc %s model config.json describes",
                  t.file, t.name, dsc_model_arch_name(imp->arch));
    }
    return NULL;
}

dsc_status dsc_hf_import_open(const char *dir, dsc_hf_import **out) {
    *out = NULL;
    dsc_hf_import *imp = calloc(1, sizeof *imp);
    DSC_CHECK(imp, DSC_ERR_NOMEM, "%s: out of memory", dir);
    snprintf(imp->dir, sizeof imp->dir, "%s", dir);
    const dsc_policy *policy;
    dsc_status s = dsc_load_hf_config(dir, &policy, &imp->mc, NULL);
    if (!s) s = check_trainable(&imp->mc, dir);
    if (!s) {
        imp->arch = imp->mc.n_experts ? DSC_ARCH_MIXTRAL : DSC_ARCH_LLAMA;
        imp->rules = dsc_hf_rules(imp->arch, &imp->n_rules);
        make_overrides(imp);
        s = dsc_safetensors_open(&imp->st, dir);
    }
    if (!s) s = check_every_tensor(imp);
    if (s) {
        dsc_hf_import_close(imp);
        return s;
    }
    *out = imp;
    return NULL;
}

void dsc_hf_import_close(dsc_hf_import *imp) {
    if (!imp) return;
    dsc_safetensors_close(imp->st);
    free(imp);
}

/* The value of "a.b" in the JSON object root, or NULL. */
static const cJSON *lookup(const cJSON *root, const char *key) {
    char head[64];
    const char *dot = strchr(key, '.');
    if (!dot || (size_t)(dot - key) >= sizeof head) return NULL;
    memcpy(head, key, (size_t)(dot - key));
    head[dot - key] = '\0';
    const cJSON *section = cJSON_GetObjectItemCaseSensitive(root, head);
    return cJSON_IsObject(section) ? cJSON_GetObjectItemCaseSensitive(section, dot + 1) : NULL;
}

/* Whether JSON value v says the same as the override's text. */
static bool same_value(const cJSON *v, const char *text) {
    if (cJSON_IsString(v)) return strcmp(v->valuestring, text) == 0;
    if (cJSON_IsBool(v)) return strcmp(text, cJSON_IsTrue(v) ? "true" : "false") == 0;
    if (!cJSON_IsNumber(v)) return false;
    char *end;
    double x = strtod(text, &end);
    return *end == '\0' && fabs(x - v->valuedouble) <= 1e-6 * fabs(x);
}

/* A key of the checkpoint's model section that the file or an override sets differently. */
static dsc_status check_conflicts(const dsc_hf_import *imp, const char *path, const char *const *overrides,
                                  int n_overrides) {
    char *text;
    DSC_TRY(dsc_load_read_text(path, &text));
    cJSON *root = cJSON_Parse(text);
    free(text);
    dsc_status s = NULL;
    for (int i = 0; !s && i < imp->n_overrides; i++) {
        const char *ours = imp->overrides[i], *eq = strchr(ours, '=');
        size_t klen = (size_t)(eq - ours);
        char key[OVERRIDE_LEN];
        memcpy(key, ours, klen);
        key[klen] = '\0';
        const cJSON *v = root ? lookup(root, key) : NULL;
        if (v && !same_value(v, eq + 1)) {
            char *shown = cJSON_PrintUnformatted(v);
            s = dsc_error(DSC_ERR_CONFIG,
                          "%s: \"%s\" is %s but the Hugging Face checkpoint %s has %s (drop the key "
                          "or make it agree)",
                          path, key, shown ? shown : "?", imp->dir, eq + 1);
            free(shown);
        }
        for (int j = 0; !s && j < n_overrides; j++) {
            if (strncmp(overrides[j], key, klen) != 0 || overrides[j][klen] != '=') continue;
            cJSON *given = cJSON_Parse(overrides[j] + klen + 1);
            bool same = given ? same_value(given, eq + 1) : strcmp(overrides[j] + klen + 1, eq + 1) == 0;
            cJSON_Delete(given);
            if (!same)
                s = dsc_error(DSC_ERR_CONFIG, "--set %s: the Hugging Face checkpoint %s has %s=%s", overrides[j],
                              imp->dir, key, eq + 1);
        }
    }
    cJSON_Delete(root);
    return s;
}

dsc_status dsc_hf_import_config(const dsc_hf_import *imp, const char *path, const char *const *overrides,
                                int n_overrides, dsc_config *cfg) {
    DSC_TRY(check_conflicts(imp, path, overrides, n_overrides));
    const char *all[64 + MAX_OVERRIDES];
    DSC_CHECK(n_overrides <= 64, DSC_ERR_INVALID, "--init-from-hf: at most 64 --set overrides (got %d)",
              n_overrides);
    for (int i = 0; i < n_overrides; i++)
        all[i] = overrides[i];
    for (int i = 0; i < imp->n_overrides; i++)
        all[n_overrides + i] = imp->overrides[i];
    DSC_TRY(dsc_config_load_file(path, all, n_overrides + imp->n_overrides, cfg));
    if (cfg->model.seq_len > imp->mc.max_positions) {
        dsc_status s =
            dsc_error(DSC_ERR_CONFIG,
                      "%s: model.seq_len %d exceeds the Hugging Face checkpoint's context of %lld tokens "
                      "(%s/config.json: max_position_embeddings or sliding_window)",
                      path, cfg->model.seq_len, (long long)imp->mc.max_positions, imp->dir);
        dsc_config_free(cfg);
        return s;
    }
    return NULL;
}

static void shape_text(int ndim, const int64_t *shape, char *buf, size_t len) {
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (used < len) snprintf(buf + used, len - used, ")");
}

dsc_status dsc_hf_import_read(void *ctx, const char *name, int ndim, const int64_t *shape, int64_t begin,
                              int64_t count, float *dst) {
    dsc_hf_import *imp = ctx;
    char hf[256];
    dsc_safetensors_tensor t;
    DSC_CHECK(dsc_hf_to_hf(imp->rules, imp->n_rules, name, hf, sizeof hf), DSC_ERR_UNSUPPORTED,
              "%s: dsc parameter %s has no Hugging Face name", imp->dir, name);
    DSC_CHECK(dsc_safetensors_find(imp->st, hf, &t), DSC_ERR_CORRUPT,
              "%s: tensor %s (dsc parameter %s) is missing", imp->dir, hf, name);
    bool same = t.ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = t.shape[i] == shape[i];
    if (!same) {
        char theirs[96], ours[96];
        shape_text(t.ndim, t.shape, theirs, sizeof theirs);
        shape_text(ndim, shape, ours, sizeof ours);
        return dsc_error(DSC_ERR_CORRUPT, "%s: tensor %s is %s where dsc parameter %s is %s", t.file, hf, theirs,
                         name, ours);
    }
    DSC_CHECK(begin >= 0 && count >= 0 && begin + count <= t.numel, DSC_ERR_INVALID,
              "%s: range [%lld, %lld) is outside tensor %s (%lld elements)", imp->dir, (long long)begin,
              (long long)(begin + count), hf, (long long)t.numel);
    if (begin == 0 && count == t.numel) return dsc_safetensors_read_f32(imp->st, hf, dst, count);
    float *all = malloc((size_t)(t.numel ? t.numel : 1) * sizeof *all);
    DSC_CHECK(all, DSC_ERR_NOMEM, "%s: reading %s", imp->dir, hf);
    dsc_status s = dsc_safetensors_read_f32(imp->st, hf, all, t.numel);
    if (!s) memcpy(dst, all + begin, (size_t)count * sizeof *dst);
    free(all);
    return s;
}
