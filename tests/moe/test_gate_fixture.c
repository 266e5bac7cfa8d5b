/* Reads the JSON gate fixtures written by tests/ref/moe_gate_ref.py into
 * plain arrays. Test-only: it trusts the layout the script writes and
 * reports only unreadable files, bad JSON and wrong matrix sizes. */
#define _POSIX_C_SOURCE 200809L
#include "test_gate_fixture.h"

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

char **gate_fixture_paths(int *count) {
    glob_t g;
    *count = 0;
    if (glob(GATE_FIXTURE_DIR "/*.json", 0, NULL, &g) != 0) return NULL;
    char **paths = calloc(g.gl_pathc, sizeof *paths);
    for (size_t i = 0; paths && i < g.gl_pathc; i++)
        paths[(*count)++] = strdup(g.gl_pathv[i]);
    globfree(&g);
    return paths;
}

void gate_fixture_free_paths(char **paths, int count) {
    for (int i = 0; i < count; i++)
        free(paths[i]);
    free(paths);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)n + 1);
    if (text && fread(text, 1, (size_t)n, f) != (size_t)n) {
        free(text);
        text = NULL;
    }
    if (text) text[n] = '\0';
    fclose(f);
    return text;
}

static const cJSON *item(const cJSON *obj, const char *key) {
    return cJSON_GetObjectItemCaseSensitive(obj, key);
}

/* Reads a rows x cols matrix of numbers into doubles. */
static dsc_status matrix(const cJSON *m, const char *what, int64_t rows, int64_t cols, double *out) {
    DSC_CHECK(cJSON_IsArray(m) && cJSON_GetArraySize(m) == rows, DSC_ERR_CORRUPT, "fixture %s: expected %lld rows",
              what, (long long)rows);
    for (int64_t r = 0; r < rows; r++) {
        const cJSON *row = cJSON_GetArrayItem(m, (int)r);
        DSC_CHECK(cJSON_IsArray(row) && cJSON_GetArraySize(row) == cols, DSC_ERR_CORRUPT,
                  "fixture %s: row %lld is not %lld long", what, (long long)r, (long long)cols);
        for (int64_t c = 0; c < cols; c++)
            out[r * cols + c] = cJSON_GetArrayItem(row, (int)c)->valuedouble;
    }
    return NULL;
}

static dsc_status counts(const cJSON *a, const char *what, int64_t n, int64_t *out) {
    DSC_CHECK(cJSON_IsArray(a) && cJSON_GetArraySize(a) == n, DSC_ERR_CORRUPT, "fixture %s: expected %lld counts",
              what, (long long)n);
    for (int64_t i = 0; i < n; i++)
        out[i] = (int64_t)cJSON_GetArrayItem(a, (int)i)->valuedouble;
    return NULL;
}

static dsc_status parse(const cJSON *root, gate_fixture *fx) {
    const cJSON *cfg = item(root, "config"), *exp = item(root, "expected"), *bwd = item(root, "backward");
    const cJSON *logits = item(root, "logits");
    DSC_CHECK(cfg && exp && bwd && cJSON_IsArray(logits) && cJSON_IsString(item(root, "name")), DSC_ERR_CORRUPT,
              "fixture: missing name, config, logits, expected or backward");
    snprintf(fx->name, sizeof fx->name, "%s", item(root, "name")->valuestring);
    fx->cfg = dsc_moe_gate_config_default();
    fx->cfg.use_rts = false;
    fx->cfg.top2_2nd_expert_sampling = false;
    fx->cfg.k = fx->k = (int)item(cfg, "k")->valuedouble;
    fx->cfg.capacity_factor = item(cfg, "capacity_factor")->valuedouble;
    fx->cfg.eval_capacity_factor = item(cfg, "eval_capacity_factor")->valuedouble;
    fx->cfg.min_capacity = (int64_t)item(cfg, "min_capacity")->valuedouble;
    fx->cfg.drop_tokens = cJSON_IsTrue(item(cfg, "drop_tokens"));
    fx->cfg.drop_policy = !strcmp(item(cfg, "drop_policy")->valuestring, "probs") ? DSC_MOE_DROP_POLICY_PROBS
                                                                                  : DSC_MOE_DROP_POLICY_POSITION;
    fx->cfg.aux_loss_coef = item(cfg, "aux_loss_coef")->valuedouble;
    fx->cfg.z_loss_coef = item(cfg, "z_loss_coef")->valuedouble;
    fx->training = cJSON_IsTrue(item(cfg, "training"));
    const int64_t S = fx->S = cJSON_GetArraySize(logits);
    const int64_t E = fx->E = cJSON_GetArraySize(cJSON_GetArrayItem(logits, 0));
    const int K = fx->k;

    double *tmp = malloc(sizeof(double) * (size_t)(S * E));
    fx->expert = malloc(sizeof(int32_t) * (size_t)(S * K));
    fx->slot = malloc(sizeof(int32_t) * (size_t)(S * K));
    fx->weight = malloc(sizeof(double) * (size_t)(S * K));
    fx->exp_counts = malloc(sizeof(int64_t) * (size_t)E);
    fx->kept_counts = malloc(sizeof(int64_t) * (size_t)E);
    fx->d_logits = malloc(sizeof(double) * (size_t)(S * E));
    DSC_CHECK(tmp && fx->expert && fx->slot && fx->weight && fx->exp_counts && fx->kept_counts && fx->d_logits,
              DSC_ERR_NOMEM, "fixture: out of memory");
    dsc_status st = NULL;
    DSC_TRY_GOTO(
        st, dsc_tensor_alloc(&fx->logits, DSC_DTYPE_F32, 2, (const int64_t[]){S, E}, DSC_CPU, DSC_MEM_OTHER), out);
    DSC_TRY_GOTO(
        st, dsc_tensor_alloc(&fx->d_weight, DSC_DTYPE_F32, 2, (const int64_t[]){S, K}, DSC_CPU, DSC_MEM_OTHER),
        out);
    DSC_TRY_GOTO(st, matrix(logits, "logits", S, E, tmp), out);
    for (int64_t i = 0; i < S * E; i++)
        ((float *)fx->logits.data)[i] = (float)tmp[i];
    DSC_TRY_GOTO(st, matrix(item(bwd, "d_weight"), "d_weight", S, K, tmp), out);
    for (int64_t i = 0; i < S * K; i++)
        ((float *)fx->d_weight.data)[i] = (float)tmp[i];
    DSC_TRY_GOTO(st, matrix(item(bwd, "d_logits"), "d_logits", S, E, fx->d_logits), out);
    const cJSON *routes = item(exp, "routes");
    for (int64_t s = 0; s < S; s++) {
        const cJSON *token = cJSON_GetArrayItem(routes, (int)s);
        for (int r = 0; r < K; r++) {
            const cJSON *route = cJSON_GetArrayItem(token, r);
            if (cJSON_GetArraySize(route) != 3) {
                st = dsc_error(DSC_ERR_CORRUPT, "fixture: route %lld/%d is not [expert, slot, weight]",
                               (long long)s, r);
                goto out;
            }
            fx->expert[s * K + r] = (int32_t)cJSON_GetArrayItem(route, 0)->valuedouble;
            fx->slot[s * K + r] = (int32_t)cJSON_GetArrayItem(route, 1)->valuedouble;
            fx->weight[s * K + r] = cJSON_GetArrayItem(route, 2)->valuedouble;
        }
    }
    DSC_TRY_GOTO(st, counts(item(exp, "exp_counts"), "exp_counts", E, fx->exp_counts), out);
    DSC_TRY_GOTO(st, counts(item(exp, "kept_counts"), "kept_counts", E, fx->kept_counts), out);
    fx->capacity = (int64_t)item(exp, "capacity")->valuedouble;
    fx->l_aux = item(exp, "l_aux")->valuedouble;
    fx->z_loss = item(exp, "z_loss")->valuedouble;
out:
    free(tmp);
    return st;
}

dsc_status gate_fixture_load(const char *path, gate_fixture *fx) {
    memset(fx, 0, sizeof *fx);
    snprintf(fx->path, sizeof fx->path, "%s", path);
    char *text = slurp(path);
    DSC_CHECK(text, DSC_ERR_IO, "fixture %s: cannot read", path);
    cJSON *root = cJSON_Parse(text);
    free(text);
    DSC_CHECK(root, DSC_ERR_CORRUPT, "fixture %s: cJSON_Parse failed", path);
    dsc_status st = dsc_error_wrap(parse(root, fx), "fixture %s", path);
    cJSON_Delete(root);
    if (st) gate_fixture_free(fx);
    return st;
}

void gate_fixture_free(gate_fixture *fx) {
    dsc_tensor_free(&fx->logits);
    dsc_tensor_free(&fx->d_weight);
    free(fx->expert);
    free(fx->slot);
    free(fx->weight);
    free(fx->exp_counts);
    free(fx->kept_counts);
    free(fx->d_logits);
    memset(fx, 0, sizeof *fx);
}
