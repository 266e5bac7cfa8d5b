/* Private to inference/: reading a Hugging Face config.json (policy_hf*.c):
 * the bounds every size is checked against, and range-checked readers of
 * integer, real, boolean and activation-name keys that name the file and
 * key in their errors, and the parse-then-free step of a configure(). Static inline so each policy file reads keys
 * the same way with one definition. Not here: any architecture's keys. */
#ifndef DSC_INFERENCE_HF_CONFIG_H
#define DSC_INFERENCE_HF_CONFIG_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#include <string.h>

#include <cjson/cJSON.h>

#include "dsc/inference.h"
#include "dsc/status.h"

/* Bounds on sizes read from config.json: generous beside real models
 * (hidden sizes reach 16k, vocabularies 256k, experts 256), small enough that
 * a product of two stays far inside int64 and every count fits int32. */
enum {
    MAX_DIM = 1 << 20,   /* hidden_size, intermediate_size, heads x head_dim */
    MAX_VOCAB = 1 << 24, /* vocab_size */
    MAX_COUNT = 1 << 16, /* layers, heads, head_dim, experts */
};

/* One JSON object of config.json; `prefix` names it in messages ("rope_scaling."). */
typedef struct json_reader {
    const cJSON *obj;
    const char *source, *prefix;
} json_reader;

/* An integer key in [lo, hi], checked on the double before any conversion
 * (a cast of 1e300, or of 4294967328 to int32, is not a number dsc may use). */
static inline dsc_status get_int(const json_reader *r, const char *key, bool required, int64_t dflt, int64_t lo,
                                 int64_t hi, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->obj, key);
    if (!v || cJSON_IsNull(v)) {
        DSC_CHECK(!required, DSC_ERR_CONFIG, "%s: missing key %s%s", r->source, r->prefix, key);
        *out = dflt;
        return NULL;
    }
    DSC_CHECK(cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble == floor(v->valuedouble),
              DSC_ERR_CONFIG, "%s: %s%s must be an integer", r->source, r->prefix, key);
    DSC_CHECK(v->valuedouble >= (double)lo && v->valuedouble <= (double)hi, DSC_ERR_CONFIG,
              "%s: %s%s = %.17g is outside [%lld, %lld]", r->source, r->prefix, key, v->valuedouble, (long long)lo,
              (long long)hi);
    *out = (int64_t)v->valuedouble;
    return NULL;
}

static inline dsc_status get_i32(const json_reader *r, const char *key, bool required, int64_t dflt, int64_t lo,
                                 int64_t hi, int32_t *out) {
    int64_t v;
    DSC_TRY(get_int(r, key, required, dflt, lo, hi, &v));
    *out = (int32_t)v; /* hi <= INT32_MAX at every call */
    return NULL;
}

/* A finite number in (lo, hi] (lo exclusive: every real key here must be positive). */
static inline dsc_status get_num(const json_reader *r, const char *key, double dflt, double lo, double hi,
                                 double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->obj, key);
    if (!v || cJSON_IsNull(v)) {
        *out = dflt;
        return NULL;
    }
    DSC_CHECK(cJSON_IsNumber(v) && isfinite(v->valuedouble), DSC_ERR_CONFIG, "%s: %s%s must be a finite number",
              r->source, r->prefix, key);
    DSC_CHECK(v->valuedouble > lo && v->valuedouble <= hi, DSC_ERR_CONFIG, "%s: %s%s = %.17g is outside (%g, %g]",
              r->source, r->prefix, key, v->valuedouble, lo, hi);
    *out = v->valuedouble;
    return NULL;
}

static inline bool get_bool(const cJSON *obj, const char *key, bool dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

/* A non-gated MLP's activation by its transformers name (ACT2FN): gelu_new
 * and gelu_pytorch_tanh are GELU's tanh form, gelu the exact one, relu;
 * any other name is refused, naming it. */
static inline dsc_status get_activation(const json_reader *r, const char *key, const char *dflt,
                                        dsc_infer_activation *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->obj, key);
    const char *name = !v || cJSON_IsNull(v) ? dflt : cJSON_IsString(v) ? v->valuestring : "(not a string)";
    static const struct {
        const char *name;
        dsc_infer_activation act;
    } known[] = {{"gelu_new", DSC_INFER_ACT_GELU_TANH},
                 {"gelu_pytorch_tanh", DSC_INFER_ACT_GELU_TANH},
                 {"gelu", DSC_INFER_ACT_GELU_ERF},
                 {"relu", DSC_INFER_ACT_RELU}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(name, known[i].name) == 0) {
            *out = known[i].act;
            return NULL;
        }
    return dsc_error(DSC_ERR_UNSUPPORTED,
                     "%s: %s%s '%s' is not supported (gelu_new, gelu_pytorch_tanh, gelu, relu)", r->source,
                     r->prefix, key, name);
}

/* A policy's configure(): config.json parsed, handed to `parse`, freed. */
static inline dsc_status parse_config_json(dsc_infer_model_config *mc, const char *json, const char *source,
                                           dsc_status (*parse)(dsc_infer_model_config *, const cJSON *,
                                                               const char *)) {
    cJSON *root = cJSON_Parse(json);
    dsc_status s = cJSON_IsObject(root) ? parse(mc, root, source)
                                        : dsc_error(DSC_ERR_CORRUPT, "%s: not a JSON object", source);
    cJSON_Delete(root);
    return s;
}

#endif
