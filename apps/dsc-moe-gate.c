/* apps/dsc-moe-gate.c — runs the MoE gate on a matrix of router logits and
 * prints the routing as JSON, for inspection and for checking dsc against
 * DeepSpeed-derived references.
 *
 * Every random element (random token selection, RSample, second-expert
 * sampling, jitter) is off, so the output is a pure function of the input.
 * It does not compute logits from a model, move tokens, or use MPI.
 *
 *   dsc-moe-gate --k K --capacity-factor F --min-capacity C [--eval]
 *                [--eval-capacity-factor F] [--no-drop-tokens]
 *                [--drop-policy probs|position] LOGITS.json
 *
 * LOGITS.json is an S x E matrix: a JSON list of rows, or an object whose key
 * "logits" holds that list. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "dsc/cli.h"
#include "dsc/moe_gate.h"

static void usage(FILE *fp) {
    fputs("usage: dsc-moe-gate --k K --capacity-factor F --min-capacity C [--eval]\n"
          "                    [--eval-capacity-factor F] [--no-drop-tokens]\n"
          "                    [--drop-policy probs|position] LOGITS.json\n",
          fp);
}

typedef struct options {
    dsc_moe_gate_config cfg;
    bool eval;
    const char *path;
} options;

static dsc_status parse_options(int argc, char **argv, options *opt) {
    opt->cfg = dsc_moe_gate_config_default();
    opt->cfg.use_rts = false;
    opt->cfg.top2_2nd_expert_sampling = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const bool has_value = i + 1 < argc;
        int64_t n;
        if (!strcmp(a, "--eval")) {
            opt->eval = true;
        } else if (!strcmp(a, "--no-drop-tokens")) {
            opt->cfg.drop_tokens = false;
        } else if (!strcmp(a, "--k") && has_value) {
            DSC_TRY(dsc_cli_int(a, argv[++i], 1, 1 << 20, &n));
            opt->cfg.k = (int)n;
        } else if (!strcmp(a, "--min-capacity") && has_value) {
            DSC_TRY(dsc_cli_int(a, argv[++i], 0, INT64_MAX, &n));
            opt->cfg.min_capacity = n;
        } else if (!strcmp(a, "--capacity-factor") && has_value) {
            DSC_TRY(dsc_cli_double(a, argv[++i], 0, 1e9, &opt->cfg.capacity_factor));
        } else if (!strcmp(a, "--eval-capacity-factor") && has_value) {
            DSC_TRY(dsc_cli_double(a, argv[++i], 0, 1e9, &opt->cfg.eval_capacity_factor));
        } else if (!strcmp(a, "--drop-policy") && has_value) {
            const char *p = argv[++i];
            DSC_CHECK(!strcmp(p, "probs") || !strcmp(p, "position"), DSC_ERR_INVALID,
                      "--drop-policy: expected probs or position, got \"%s\"", p);
            opt->cfg.drop_policy = !strcmp(p, "probs") ? DSC_MOE_DROP_POLICY_PROBS : DSC_MOE_DROP_POLICY_POSITION;
        } else if (a[0] != '-' && !opt->path) {
            opt->path = a;
        } else {
            return dsc_error(DSC_ERR_INVALID, "unexpected argument \"%s\"", a);
        }
    }
    DSC_CHECK(opt->path, DSC_ERR_INVALID, "no LOGITS.json given");
    return NULL;
}

static dsc_status read_file(const char *path, char **text) {
    FILE *f = fopen(path, "rb");
    DSC_CHECK(f, DSC_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    dsc_status st = NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0, got;
    do {
        if (len + 4096 + 1 > cap) {
            cap = 2 * cap + 4096 + 1;
            char *grown = realloc(buf, cap);
            if (!grown) {
                st = dsc_error(DSC_ERR_NOMEM, "%s: out of memory reading %zu bytes", path, cap);
                goto out;
            }
            buf = grown;
        }
        got = fread(buf + len, 1, cap - len - 1, f);
        len += got;
    } while (got > 0);
    if (ferror(f)) st = dsc_error(DSC_ERR_IO, "%s: read error", path);
out:
    fclose(f);
    if (st) {
        free(buf);
        return st;
    }
    buf[len] = '\0';
    *text = buf;
    return NULL;
}

/* Fills `logits` (S, E) f32 from the parsed matrix. */
static dsc_status logits_from_json(const char *path, const cJSON *root, dsc_tensor *logits) {
    const cJSON *rows = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "logits") : root;
    DSC_CHECK(cJSON_IsArray(rows) && cJSON_GetArraySize(rows) > 0, DSC_ERR_CORRUPT,
              "%s: expected a non-empty list of rows, or an object with key \"logits\" holding one", path);
    const int64_t S = cJSON_GetArraySize(rows);
    const cJSON *first = cJSON_GetArrayItem(rows, 0);
    const int64_t E = cJSON_IsArray(first) ? cJSON_GetArraySize(first) : 0;
    DSC_CHECK(E > 0, DSC_ERR_CORRUPT, "%s: row 0 is not a non-empty list of numbers", path);
    DSC_TRY(dsc_tensor_alloc(logits, DSC_DTYPE_F32, 2, (const int64_t[]){S, E}, DSC_CPU, DSC_MEM_ACTIVATIONS));
    float *z = logits->data; // (S, E)
    int64_t s = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, rows) {
        DSC_CHECK(cJSON_IsArray(row) && cJSON_GetArraySize(row) == E, DSC_ERR_CORRUPT,
                  "%s: row %lld is not a list of %lld numbers", path, (long long)s, (long long)E);
        int64_t e = 0;
        const cJSON *v;
        cJSON_ArrayForEach(v, row) {
            DSC_CHECK(cJSON_IsNumber(v), DSC_ERR_CORRUPT, "%s: logits[%lld][%lld] is not a number", path,
                      (long long)s, (long long)e);
            z[s * E + e++] = (float)v->valuedouble;
        }
        s++;
    }
    return NULL;
}

/* Adds `item` to an object (key) or array (key NULL), turning cJSON's
 * allocation failures into statuses. */
static dsc_status attach(cJSON *parent, const char *key, cJSON *item) {
    DSC_CHECK(item, DSC_ERR_NOMEM, "cJSON_Create* failed for \"%s\"", key ? key : "array item");
    cJSON_bool ok = key ? cJSON_AddItemToObject(parent, key, item) : cJSON_AddItemToArray(parent, item);
    if (!ok) {
        cJSON_Delete(item);
        return dsc_error(DSC_ERR_NOMEM, "cJSON_AddItemTo* failed for \"%s\"", key ? key : "array item");
    }
    return NULL;
}

static cJSON *count_array(const int64_t *v, int64_t n) {
    cJSON *a = cJSON_CreateArray();
    for (int64_t i = 0; a && i < n; i++) {
        if (!cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[i]))) {
            cJSON_Delete(a);
            return NULL;
        }
    }
    return a;
}

/* Per token: kept routes as [expert, slot, weight] into `tokens`, experts of
 * dropped routes into `dropped`. */
static dsc_status routes_to_json(const dsc_moe_gate_result *res, cJSON *tokens, cJSON *dropped) {
    const int K = res->k;
    for (int64_t s = 0; s < res->num_tokens; s++) {
        cJSON *kept = cJSON_CreateArray(), *lost = cJSON_CreateArray();
        DSC_TRY(attach(tokens, NULL, kept));
        DSC_TRY(attach(dropped, NULL, lost));
        for (int r = 0; r < K; r++) {
            const int64_t i = s * K + r;
            if (res->slot[i] < 0) {
                DSC_TRY(attach(lost, NULL, cJSON_CreateNumber(res->expert[i])));
                continue;
            }
            cJSON *route = cJSON_CreateArray();
            DSC_TRY(attach(kept, NULL, route));
            DSC_TRY(attach(route, NULL, cJSON_CreateNumber(res->expert[i])));
            DSC_TRY(attach(route, NULL, cJSON_CreateNumber(res->slot[i])));
            DSC_TRY(attach(route, NULL, cJSON_CreateNumber(res->weight[i])));
        }
    }
    return NULL;
}

static dsc_status result_to_json(const dsc_moe_gate_result *res, cJSON *out) {
    DSC_TRY(attach(out, "k", cJSON_CreateNumber(res->k)));
    DSC_TRY(attach(out, "num_tokens", cJSON_CreateNumber((double)res->num_tokens)));
    DSC_TRY(attach(out, "num_experts", cJSON_CreateNumber((double)res->num_experts)));
    DSC_TRY(attach(out, "capacity", cJSON_CreateNumber((double)res->capacity)));
    cJSON *tokens = cJSON_CreateArray(), *dropped = cJSON_CreateArray();
    DSC_TRY(attach(out, "tokens", tokens));
    DSC_TRY(attach(out, "dropped", dropped));
    DSC_TRY(routes_to_json(res, tokens, dropped));
    DSC_TRY(attach(out, "exp_counts", count_array(res->exp_counts, res->num_experts)));
    DSC_TRY(attach(out, "kept_counts", count_array(res->kept_counts, res->num_experts)));
    DSC_TRY(attach(out, "l_aux", cJSON_CreateNumber(res->l_aux)));
    return NULL;
}

static dsc_status run(const options *opt) {
    char *text = NULL;
    cJSON *root = NULL, *out = NULL;
    char *printed = NULL;
    dsc_tensor logits = {0};
    dsc_moe_gate_result res = {0};
    dsc_status st;
    DSC_TRY_GOTO(st, read_file(opt->path, &text), done);
    root = cJSON_Parse(text);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        st = dsc_error(DSC_ERR_CORRUPT, "%s: cJSON_Parse failed near \"%.20s\"", opt->path, at ? at : "");
        goto done;
    }
    DSC_TRY_GOTO(st, logits_from_json(opt->path, root, &logits), done);
    DSC_TRY_GOTO(st, dsc_moe_gate_config_validate(&opt->cfg, logits.shape[1]), done);
    DSC_TRY_GOTO(st, dsc_moe_gate_result_alloc(&res, logits.shape[0], logits.shape[1], opt->cfg.k), done);
    DSC_TRY_GOTO(st, dsc_moe_gate_forward(&opt->cfg, &logits, !opt->eval, NULL, NULL, &res), done);
    out = cJSON_CreateObject();
    DSC_TRY_GOTO(st, out ? NULL : dsc_error(DSC_ERR_NOMEM, "cJSON_CreateObject failed"), done);
    DSC_TRY_GOTO(st, result_to_json(&res, out), done);
    printed = cJSON_Print(out);
    DSC_TRY_GOTO(st, printed ? NULL : dsc_error(DSC_ERR_NOMEM, "cJSON_Print failed"), done);
    if (puts(printed) == EOF) st = dsc_error(DSC_ERR_IO, "writing the result to stdout failed");
done:
    free(printed);
    cJSON_Delete(out);
    cJSON_Delete(root);
    free(text);
    dsc_moe_gate_result_free(&res);
    dsc_tensor_free(&logits);
    return st;
}

int main(int argc, char **argv) {
    if (dsc_cli_info(argc, argv, argc - 1, "dsc-moe-gate", usage)) return 0;
    options opt = {0};
    dsc_status st = parse_options(argc, argv, &opt);
    if (st) {
        fprintf(stderr, "dsc-moe-gate: %s\n", dsc_status_message(st));
        usage(stderr);
        dsc_status_free(st);
        return 2;
    }
    st = run(&opt);
    if (st) {
        fprintf(stderr, "dsc-moe-gate: %s\n", dsc_status_message(st));
        dsc_status_free(st);
        return 1;
    }
    return 0;
}
