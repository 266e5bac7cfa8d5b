/* dsc training checkpoint -> Hugging Face model directory (dsc/hf.h):
 * every model/ tensor of state.h5 is renamed by hf_names.c's rules and
 * re-laid-out where GPT-2 wants it (Conv1D transposes, fused c_attn), then
 * config.json is written for the target class and the tensors go to
 * model.safetensors as f32. One process; the whole model is held in memory
 * once. Not here: tokenizers (dsc models use the byte tokenizer, which has
 * no tokenizer.json) or sharded output. */
#include "dsc/hf.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dsc/safetensors.h"
#include "dsc/tensor_file.h"
#include "inference/hf_names.h"

typedef struct out_tensor {
    char name[256];
    int ndim;
    int64_t shape[2];
    float *data;
} out_tensor;

typedef struct exporter {
    dsc_tfile *in;
    const dsc_config *cfg;
    const dsc_hf_rule *rules;
    int n_rules;
    out_tensor *items;
    int count, cap;
} exporter;

static int64_t numel_of(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

/* The output tensor `name`, created zero-filled with `shape` when new; an
 * existing one must have that shape. */
static dsc_status output(exporter *x, const char *name, int ndim, const int64_t *shape, out_tensor **out) {
    for (int i = 0; i < x->count; i++) {
        if (strcmp(x->items[i].name, name) != 0) continue;
        DSC_CHECK(x->items[i].ndim == ndim && numel_of(ndim, shape) == numel_of(ndim, x->items[i].shape),
                  DSC_ERR_CORRUPT, "export: %s is built from tensors of inconsistent shapes", name);
        *out = &x->items[i];
        return NULL;
    }
    if (x->count == x->cap) {
        int cap = x->cap ? 2 * x->cap : 64;
        out_tensor *grown = realloc(x->items, (size_t)cap * sizeof *grown);
        DSC_CHECK(grown, DSC_ERR_NOMEM, "export: tensor list");
        x->items = grown;
        x->cap = cap;
    }
    out_tensor *t = &x->items[x->count];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    t->data = calloc((size_t)numel_of(ndim, shape) + 1, sizeof *t->data);
    DSC_CHECK(t->data, DSC_ERR_NOMEM, "export: %s (%lld floats)", name, (long long)numel_of(ndim, shape));
    x->count++;
    *out = t;
    return NULL;
}

/* Reads a checkpoint tensor as f32 (parameters are stored f32; bf16/f16 are widened). */
static dsc_status read_f32(dsc_tfile *f, const dsc_tfile_entry *e, float *dst) {
    int64_t n = numel_of(e->ndim, e->shape);
    if (e->dtype == DSC_DTYPE_F32) return dsc_tfile_read_range(f, e->path, 0, n, dst);
    DSC_CHECK(e->dtype == DSC_DTYPE_BF16 || e->dtype == DSC_DTYPE_F16, DSC_ERR_UNSUPPORTED,
              "export: %s has dtype %s (f32, bf16 or f16 expected)", e->path, dsc_dtype_name(e->dtype));
    uint16_t *raw = malloc((size_t)(n ? n : 1) * sizeof *raw);
    DSC_CHECK(raw, DSC_ERR_NOMEM, "export: %s", e->path);
    dsc_status s = dsc_tfile_read_range(f, e->path, 0, n, raw);
    for (int64_t i = 0; !s && i < n; i++)
        dst[i] = e->dtype == DSC_DTYPE_BF16 ? dsc_bf16_to_f32(raw[i]) : dsc_f16_to_f32(raw[i]);
    free(raw);
    return s;
}

static dsc_status convert_entry(const dsc_tfile_entry *e, void *user) {
    exporter *x = user;
    const char *name = e->path + strlen("model/");
    char hf[256];
    const dsc_hf_rule *r = dsc_hf_to_hf(x->rules, x->n_rules, name, hf, sizeof hf);
    DSC_CHECK(r, DSC_ERR_UNSUPPORTED, "export: %s: parameter %s has no Hugging Face name for model.arch %s",
              dsc_tfile_name(x->in), name, dsc_model_arch_name(x->cfg->model.arch));
    const int64_t rows = e->shape[0], cols = e->ndim == 2 ? e->shape[1] : 1;
    DSC_CHECK(r->layout == DSC_HF_LAYOUT_SAME || e->ndim <= 2, DSC_ERR_CORRUPT,
              "export: %s has %d dimensions, a linear layer's has 2", name, e->ndim);
    float *src = malloc((size_t)(numel_of(e->ndim, e->shape) + 1) * sizeof *src);
    DSC_CHECK(src, DSC_ERR_NOMEM, "export: %s", name);
    dsc_status s = read_f32(x->in, e, src);
    out_tensor *t = NULL;
    if (!s && r->layout == DSC_HF_LAYOUT_SAME) {
        s = output(x, hf, e->ndim, e->shape, &t);
        if (!s) memcpy(t->data, src, (size_t)numel_of(e->ndim, e->shape) * sizeof *src);
    } else if (!s && r->layout == DSC_HF_LAYOUT_TRANSPOSED) {
        s = output(x, hf, 2, (int64_t[]){cols, rows}, &t);
        for (int64_t i = 0; !s && i < rows; i++)
            for (int64_t j = 0; j < cols; j++)
                t->data[j * rows + i] = src[i * cols + j];
    } else if (!s && e->ndim == 2) { /* q, k or v weight (C, C) -> columns of c_attn (C, 3C) */
        DSC_CHECK(rows == cols, DSC_ERR_UNSUPPORTED, "export: %s is (%lld, %lld); GPT-2's c_attn needs (C, C)",
                  name, (long long)rows, (long long)cols);
        s = output(x, hf, 2, (int64_t[]){cols, 3 * rows}, &t);
        for (int64_t i = 0; !s && i < rows; i++)
            for (int64_t j = 0; j < cols; j++)
                t->data[j * 3 * rows + r->part * rows + i] = src[i * cols + j];
    } else if (!s) { /* q, k or v bias (C) -> a third of c_attn's (3C) */
        s = output(x, hf, 1, (int64_t[]){3 * rows}, &t);
        if (!s) memcpy(t->data + r->part * rows, src, (size_t)rows * sizeof *src);
    }
    free(src);
    return s;
}

/* GPT-2's c_attn always has a bias; a dsc gpt without qkv_bias exports zeros. */
static dsc_status gpt_zero_biases(exporter *x) {
    const int64_t C = x->cfg->model.d_model;
    for (int i = 0; i < x->cfg->model.n_layer; i++) {
        char name[96];
        snprintf(name, sizeof name, "transformer.h.%d.attn.c_attn.bias", i);
        out_tensor *t;
        DSC_TRY(output(x, name, 1, (int64_t[]){3 * C}, &t));
    }
    return NULL;
}

/* What the target class cannot express, named. */
static dsc_status check_exportable(const dsc_config *cfg, const char *source) {
    const dsc_config_model *m = &cfg->model;
    DSC_CHECK(m->arch != DSC_ARCH_GPT_MOE, DSC_ERR_UNSUPPORTED,
              "export: %s: model.arch gpt-moe has no Hugging Face class (GPT-2 has no MoE variant)", source);
    DSC_CHECK(m->arch != DSC_ARCH_GPT || m->n_kv_head == m->n_head, DSC_ERR_UNSUPPORTED,
              "export: %s: GPT-2 has no grouped-query attention (model.n_kv_head %d != model.n_head %d)", source,
              m->n_kv_head, m->n_head);
    if (m->arch != DSC_ARCH_MIXTRAL) return NULL;
    const dsc_config_moe *e = &cfg->moe;
    DSC_CHECK(e->layer_freq == 1, DSC_ERR_UNSUPPORTED,
              "export: %s: Mixtral has MoE in every layer (moe.layer_freq is %d)", source, e->layer_freq);
    DSC_CHECK(!e->use_residual, DSC_ERR_UNSUPPORTED,
              "export: %s: Mixtral has no PR-MoE residual (moe.use_residual)", source);
    DSC_CHECK(e->k >= 2, DSC_ERR_UNSUPPORTED,
              "export: %s: Mixtral renormalises top-1 weights to 1 where dsc's top-1 gate weights by the router "
              "probability (moe.k is 1)",
              source);
    DSC_CHECK(!m->qkv_bias, DSC_ERR_UNSUPPORTED, "export: %s: Mixtral has no q/k/v biases (model.qkv_bias)",
              source);
    return NULL;
}

static const char *hf_class(const dsc_config_model *m, const char **model_type) {
    if (m->arch == DSC_ARCH_GPT) return *model_type = "gpt2", "GPT2LMHeadModel";
    if (m->arch == DSC_ARCH_MIXTRAL) return *model_type = "mixtral", "MixtralForCausalLM";
    if (m->qkv_bias) return *model_type = "qwen2", "Qwen2ForCausalLM";
    return *model_type = "llama", "LlamaForCausalLM";
}

/* config.json of the target class, from the training config. */
static dsc_status config_json(const dsc_config *cfg, char **out) {
    const dsc_config_model *m = &cfg->model;
    const char *model_type, *cls = hf_class(m, &model_type);
    cJSON *root = cJSON_CreateObject();
    cJSON *archs = cJSON_AddArrayToObject(root, "architectures");
    bool ok = root && archs && cJSON_AddItemToArray(archs, cJSON_CreateString(cls)) &&
              cJSON_AddStringToObject(root, "model_type", model_type) &&
              cJSON_AddNumberToObject(root, "vocab_size", m->vocab_size) &&
              cJSON_AddBoolToObject(root, "tie_word_embeddings", m->tie_embeddings) &&
              cJSON_AddStringToObject(root, "torch_dtype", "float32") &&
              cJSON_AddNullToObject(root, "bos_token_id") && /* the byte tokenizer has no special tokens */
              cJSON_AddNullToObject(root, "eos_token_id");
    if (ok && m->arch == DSC_ARCH_GPT) {
        ok = cJSON_AddNumberToObject(root, "n_embd", m->d_model) &&
             cJSON_AddNumberToObject(root, "n_layer", m->n_layer) &&
             cJSON_AddNumberToObject(root, "n_head", m->n_head) &&
             cJSON_AddNumberToObject(root, "n_inner", m->d_ff) &&
             cJSON_AddNumberToObject(root, "n_positions", m->seq_len) &&
             cJSON_AddNumberToObject(root, "layer_norm_epsilon", m->norm_eps) &&
             cJSON_AddStringToObject(root, "activation_function", "gelu_new") && /* tanh GELU, as dsc's */
             cJSON_AddNumberToObject(root, "resid_pdrop", 0) && cJSON_AddNumberToObject(root, "embd_pdrop", 0) &&
             cJSON_AddNumberToObject(root, "attn_pdrop", 0);
    } else if (ok) {
        ok = cJSON_AddNumberToObject(root, "hidden_size", m->d_model) &&
             cJSON_AddNumberToObject(root, "intermediate_size", m->d_ff) &&
             cJSON_AddNumberToObject(root, "num_hidden_layers", m->n_layer) &&
             cJSON_AddNumberToObject(root, "num_attention_heads", m->n_head) &&
             cJSON_AddNumberToObject(root, "num_key_value_heads", m->n_kv_head) &&
             cJSON_AddNumberToObject(root, "head_dim", m->d_model / m->n_head) &&
             cJSON_AddNumberToObject(root, "max_position_embeddings", m->seq_len) &&
             cJSON_AddNumberToObject(root, "rms_norm_eps", m->norm_eps) &&
             cJSON_AddNumberToObject(root, "rope_theta", (float)m->rope_theta) && /* training's RoPE is f32 */
             cJSON_AddStringToObject(root, "hidden_act", "silu") &&
             cJSON_AddBoolToObject(root, "attention_bias", false) &&
             cJSON_AddBoolToObject(root, "mlp_bias", false);
        if (ok && m->arch == DSC_ARCH_MIXTRAL)
            ok = cJSON_AddNumberToObject(root, "num_local_experts", cfg->moe.num_experts) &&
                 cJSON_AddNumberToObject(root, "num_experts_per_tok", cfg->moe.k) &&
                 cJSON_AddNullToObject(root, "sliding_window");
        if (ok && m->qkv_bias) ok = cJSON_AddBoolToObject(root, "use_sliding_window", false);
    }
    *out = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    DSC_CHECK(*out, DSC_ERR_NOMEM, "export: building config.json");
    return NULL;
}

static dsc_status write_text(const char *path, const char *text) {
    FILE *fp = fopen(path, "wx");
    DSC_CHECK(fp, DSC_ERR_IO, "export: cannot create %s: %s", path, strerror(errno));
    bool ok = fputs(text, fp) >= 0 && fputc('\n', fp) != EOF;
    ok = fclose(fp) == 0 && ok;
    DSC_CHECK(ok, DSC_ERR_IO, "export: writing %s failed", path);
    return NULL;
}

static dsc_status prepare_dir(const char *dir, char *config_path, char *weights_path, size_t len) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return dsc_error(DSC_ERR_IO, "export: cannot create directory %s: %s", dir, strerror(errno));
    snprintf(config_path, len, "%s/config.json", dir);
    snprintf(weights_path, len, "%s/model.safetensors", dir);
    struct stat st;
    DSC_CHECK(stat(config_path, &st) != 0 && stat(weights_path, &st) != 0, DSC_ERR_IO,
              "export: %s already holds a model (config.json or model.safetensors); nothing is overwritten", dir);
    return NULL;
}

static dsc_status write_model(exporter *x, const char *out_dir) {
    char config_path[2048], weights_path[2048], *json = NULL;
    DSC_TRY(prepare_dir(out_dir, config_path, weights_path, sizeof config_path));
    const char **names = malloc((size_t)(x->count + 1) * sizeof *names);
    dsc_tensor *tensors = malloc((size_t)(x->count + 1) * sizeof *tensors);
    dsc_status s = names && tensors ? NULL : dsc_error(DSC_ERR_NOMEM, "export: tensor list");
    for (int i = 0; !s && i < x->count; i++) {
        names[i] = x->items[i].name;
        tensors[i] =
            dsc_tensor_view(x->items[i].data, DSC_DTYPE_F32, x->items[i].ndim, x->items[i].shape, DSC_CPU);
    }
    static const char *const meta[] = {"format", "pt"}; /* transformers refuses files without it */
    if (!s) s = dsc_safetensors_write(weights_path, x->count, names, tensors, 1, meta);
    if (!s) s = config_json(x->cfg, &json);
    if (!s) s = write_text(config_path, json);
    free(json);
    free(names);
    free(tensors);
    return s;
}

dsc_status dsc_hf_export(const char *ckpt_file, const char *out_dir, int64_t *n_tensors) {
    exporter x = {0};
    DSC_TRY(dsc_tfile_open(MPI_COMM_SELF, ckpt_file, &x.in));
    char *json = NULL;
    dsc_config cfg;
    bool have_cfg = false;
    dsc_status s = dsc_tfile_get_attr_string(x.in, "config", &json);
    if (!s)
        s = dsc_error_wrap(dsc_config_parse_string(json, ckpt_file, NULL, 0, &cfg), "export: the saved config");
    have_cfg = !s;
    if (!s) s = check_exportable(&cfg, ckpt_file);
    if (!s) {
        x.cfg = &cfg;
        x.rules = dsc_hf_rules(cfg.model.arch, &x.n_rules);
        s = dsc_tfile_list(x.in, "model", convert_entry, &x);
    }
    if (!s && cfg.model.arch == DSC_ARCH_GPT) s = gpt_zero_biases(&x);
    if (!s) s = write_model(&x, out_dir);
    if (!s && n_tensors) *n_tensors = x.count;
    for (int i = 0; i < x.count; i++)
        free(x.items[i].data);
    free(x.items);
    free(json);
    if (have_cfg) dsc_config_free(&cfg);
    dsc_status closed = dsc_tfile_close(x.in);
    if (s) dsc_status_free(closed);
    return s ? s : closed;
}
