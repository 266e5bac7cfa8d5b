/* Strict parsing of OpenAI request bodies (/v1/completions and
 * /v1/chat/completions) into serve_params. Every field is either
 * implemented or refused: an unknown field, a wrong type or a value out of
 * range is a 400 whose `param` names the field; a field OpenAI has but dsc
 * does not implement is accepted only with its neutral value
 * (presence_penalty 0, n 1, ...). Tokenizing and limits that need the model
 * are the HTTP side's (http.c). vLLM's extensions top_k,
 * repetition_penalty, stop_token_ids and return_token_ids are accepted. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/serve_internal.h"

void serve_error_set(serve_error *e, int http, const char *param, const char *fmt, ...) {
    e->http = http;
    e->type = http == 401   ? "authentication_error"
              : http == 404 ? "not_found_error"
              : http == 429 ? "rate_limit_error"
              : http >= 500 ? "server_error"
                            : "invalid_request_error";
    e->code = NULL;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

typedef struct field {
    const char *name;
    bool chat, completion; /* which endpoints take it */
} field;

static const field fields[] = {
    {"model", true, true},
    {"prompt", false, true},
    {"messages", true, false},
    {"max_tokens", true, true},
    {"max_completion_tokens", true, false},
    {"temperature", true, true},
    {"top_p", true, true},
    {"top_k", true, true},
    {"seed", true, true},
    {"stop", true, true},
    {"stop_token_ids", true, true},
    {"n", true, true},
    {"echo", false, true},
    {"logprobs", true, true},
    {"top_logprobs", true, false},
    {"stream", true, true},
    {"stream_options", true, true},
    {"presence_penalty", true, true},
    {"frequency_penalty", true, true},
    {"repetition_penalty", true, true},
    {"return_token_ids", true, true},
    {"user", true, true},
};

static bool known(const char *name, serve_kind kind) {
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        if (strcmp(fields[i].name, name) == 0)
            return kind == SERVE_KIND_CHAT ? fields[i].chat : fields[i].completion;
    return false;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

/* A number that is an integer in [lo, hi]. */
static bool get_int(const cJSON *v, const char *name, double lo, double hi, int64_t *out, serve_error *err) {
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble)) {
        serve_error_set(err, 400, name, "'%s' must be an integer", name);
        return false;
    }
    if (v->valuedouble < lo || v->valuedouble > hi) {
        serve_error_set(err, 400, name, "'%s' is %.17g; it must be in [%.17g, %.17g]", name, v->valuedouble, lo,
                        hi);
        return false;
    }
    *out = (int64_t)v->valuedouble;
    return true;
}

static bool get_num(const cJSON *v, const char *name, double lo, double hi, bool lo_open, double *out,
                    serve_error *err) {
    if (!cJSON_IsNumber(v)) {
        serve_error_set(err, 400, name, "'%s' must be a number", name);
        return false;
    }
    double x = v->valuedouble;
    if (!(x <= hi && (lo_open ? x > lo : x >= lo))) {
        serve_error_set(err, 400, name, "'%s' is %g; it must be in %s%g, %g]", name, x, lo_open ? "(" : "[", lo,
                        hi);
        return false;
    }
    *out = x;
    return true;
}

static bool get_bool(const cJSON *v, const char *name, bool *out, serve_error *err) {
    if (!cJSON_IsBool(v)) {
        serve_error_set(err, 400, name, "'%s' must be true or false", name);
        return false;
    }
    *out = cJSON_IsTrue(v);
    return true;
}

/* A token-id array; empty arrays are refused. */
static bool get_ids(const cJSON *v, const char *name, int32_t **ids, int32_t *n, serve_error *err) {
    int count = cJSON_GetArraySize(v);
    if (count < 1) {
        serve_error_set(err, 400, name, "'%s' is an empty token list", name);
        return false;
    }
    *ids = malloc((size_t)count * sizeof **ids);
    if (!*ids) {
        serve_error_set(err, 500, name, "out of memory for %d token ids", count);
        return false;
    }
    *n = 0;
    for (const cJSON *e = v->child; e; e = e->next) {
        int64_t id;
        if (!get_int(e, name, 0, INT32_MAX, &id, err)) return false;
        (*ids)[(*n)++] = (int32_t)id;
    }
    return true;
}

static bool is_id_array(const cJSON *v) {
    return cJSON_IsArray(v) && v->child && cJSON_IsNumber(v->child);
}

/* prompt: "text" | [ids] | ["text", ...] | [[ids], ...] */
static bool parse_prompt(const cJSON *v, serve_params *p, serve_error *err) {
    const char *name = "prompt";
    int count = cJSON_IsArray(v) && !is_id_array(v) ? cJSON_GetArraySize(v) : 1;
    if (!cJSON_IsString(v) && !cJSON_IsArray(v)) {
        serve_error_set(err, 400, name, "'prompt' must be a string, a token-id array or a list of either");
        return false;
    }
    if (cJSON_IsArray(v) && !v->child) {
        serve_error_set(err, 400, name, "'prompt' is empty");
        return false;
    }
    if (count < 1 || count > SERVE_MAX_PROMPTS) {
        serve_error_set(err, 400, name, "'prompt' holds %d prompts; 1 to %d are accepted", count,
                        SERVE_MAX_PROMPTS);
        return false;
    }
    p->prompts = calloc((size_t)count, sizeof *p->prompts);
    if (!p->prompts) {
        serve_error_set(err, 500, name, "out of memory");
        return false;
    }
    p->n_prompts = count;
    for (int i = 0; i < count; i++) {
        const cJSON *e = cJSON_IsString(v) || is_id_array(v) ? v : cJSON_GetArrayItem(v, i);
        serve_prompt *q = &p->prompts[i];
        if (cJSON_IsString(e)) {
            if (!(q->text = dup_str(e->valuestring))) {
                serve_error_set(err, 500, name, "out of memory");
                return false;
            }
        } else if (cJSON_IsArray(e)) {
            if (!get_ids(e, name, &q->ids, &q->n_ids, err)) return false;
        } else {
            serve_error_set(err, 400, name, "'prompt'[%d] must be a string or a token-id array", i);
            return false;
        }
    }
    return true;
}

/* content: "text" | [{"type": "text", "text": "..."}, ...] */
static bool parse_content(const cJSON *v, int32_t i, char **out, serve_error *err) {
    char name[64];
    snprintf(name, sizeof name, "messages[%d].content", i);
    if (cJSON_IsString(v)) {
        *out = dup_str(v->valuestring);
    } else if (cJSON_IsArray(v)) {
        size_t total = 1;
        for (const cJSON *part = v->child; part; part = part->next) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") != 0 || !cJSON_IsString(text) ||
                cJSON_GetArraySize(part) != 2) {
                serve_error_set(err, 400, name,
                                "'%s': only parts {\"type\": \"text\", \"text\": ...} are supported", name);
                return false;
            }
            total += strlen(text->valuestring);
        }
        if ((*out = calloc(1, total)))
            for (const cJSON *part = v->child; part; part = part->next)
                strcat(*out, cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring);
    } else {
        serve_error_set(err, 400, name, "'%s' must be a string or a list of text parts", name);
        return false;
    }
    if (!*out) serve_error_set(err, 500, name, "out of memory");
    return *out != NULL;
}

static bool parse_messages(const cJSON *v, serve_params *p, serve_error *err) {
    int count = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (count < 1 || count > SERVE_MAX_MESSAGES) {
        serve_error_set(err, 400, "messages", "'messages' must be a list of 1 to %d messages", SERVE_MAX_MESSAGES);
        return false;
    }
    if (!(p->messages = calloc((size_t)count, sizeof *p->messages))) {
        serve_error_set(err, 500, "messages", "out of memory");
        return false;
    }
    p->n_messages = count;
    int32_t i = 0;
    for (const cJSON *m = v->child; m; m = m->next, i++) {
        char name[64];
        snprintf(name, sizeof name, "messages[%d]", i);
        if (!cJSON_IsObject(m)) {
            serve_error_set(err, 400, name, "'%s' must be an object", name);
            return false;
        }
        for (const cJSON *f = m->child; f; f = f->next)
            if (strcmp(f->string, "role") != 0 && strcmp(f->string, "content") != 0) {
                snprintf(name, sizeof name, "messages[%d].%s", i, f->string);
                serve_error_set(err, 400, name, "unknown field '%s'", name);
                return false;
            }
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(role)) {
            snprintf(name, sizeof name, "messages[%d].role", i);
            serve_error_set(err, 400, name, "'%s' must be a string", name);
            return false;
        }
        if (!(p->messages[i].role = dup_str(role->valuestring))) {
            serve_error_set(err, 500, name, "out of memory");
            return false;
        }
        if (!parse_content(content, i, &p->messages[i].content, err)) return false;
    }
    return true;
}

static bool parse_stop(const cJSON *v, serve_params *p, serve_error *err) {
    if (cJSON_IsNull(v)) return true;
    int count = cJSON_IsString(v) ? 1 : cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (count < 0 || count > SERVE_MAX_STOP) {
        serve_error_set(err, 400, "stop", "'stop' must be a string or a list of at most %d strings",
                        SERVE_MAX_STOP);
        return false;
    }
    for (int i = 0; i < count; i++) {
        const cJSON *e = cJSON_IsString(v) ? v : cJSON_GetArrayItem(v, i);
        size_t len = cJSON_IsString(e) ? strlen(e->valuestring) : 0;
        if (len < 1 || len > SERVE_MAX_STOP_LEN) {
            serve_error_set(err, 400, "stop", "'stop' strings must be non-empty strings of at most %d bytes",
                            SERVE_MAX_STOP_LEN);
            return false;
        }
        if (!(p->stop[p->n_stop++] = dup_str(e->valuestring))) {
            serve_error_set(err, 500, "stop", "out of memory");
            return false;
        }
    }
    return true;
}

/* One field of the request object. */
static bool parse_field(const cJSON *f, serve_kind kind, const char *model_name, serve_params *p,
                        serve_error *err) {
    const char *k = f->string;
    int64_t i64;
    double x;
    if (strcmp(k, "model") == 0) {
        if (!cJSON_IsString(f)) {
            serve_error_set(err, 400, k, "'model' must be a string");
            return false;
        }
        if (strcmp(f->valuestring, model_name) != 0) {
            serve_error_set(err, 404, k, "The model '%s' does not exist; this server serves '%s'", f->valuestring,
                            model_name);
            err->code = "model_not_found";
            return false;
        }
        return true;
    }
    if (strcmp(k, "prompt") == 0) return parse_prompt(f, p, err);
    if (strcmp(k, "messages") == 0) return parse_messages(f, p, err);
    if (strcmp(k, "max_tokens") == 0 || strcmp(k, "max_completion_tokens") == 0) {
        if (cJSON_IsNull(f)) return true;
        if (!get_int(f, k, 1, INT32_MAX, &i64, err)) return false;
        p->max_tokens = (int32_t)i64;
        return true;
    }
    if (strcmp(k, "temperature") == 0) {
        if (!get_num(f, k, 0, 2, false, &x, err)) return false;
        p->sampling.temperature = (float)x;
        return true;
    }
    if (strcmp(k, "top_p") == 0) {
        if (!get_num(f, k, 0, 1, true, &x, err)) return false;
        p->sampling.top_p = (float)x;
        return true;
    }
    if (strcmp(k, "top_k") == 0) { /* vLLM: -1 (or 0) is off */
        if (!get_int(f, k, -1, INT32_MAX, &i64, err)) return false;
        p->sampling.top_k = i64 < 0 ? 0 : (int32_t)i64;
        return true;
    }
    if (strcmp(k, "repetition_penalty") == 0) {
        if (!get_num(f, k, 0, 10, true, &x, err)) return false;
        p->sampling.repetition_penalty = (float)x;
        return true;
    }
    if (strcmp(k, "seed") == 0) {
        if (cJSON_IsNull(f)) return true;
        if (!get_int(f, k, 0, 9007199254740991.0, &i64, err)) return false;
        p->has_seed = true;
        p->seed = (uint64_t)i64;
        return true;
    }
    if (strcmp(k, "stop") == 0) return parse_stop(f, p, err);
    if (strcmp(k, "stop_token_ids") == 0) {
        int count = cJSON_IsArray(f) ? cJSON_GetArraySize(f) : -1;
        if (count < 0 || count > SERVE_MAX_STOP_IDS) {
            serve_error_set(err, 400, k, "'stop_token_ids' must be a list of at most %d token ids",
                            SERVE_MAX_STOP_IDS);
            return false;
        }
        for (const cJSON *e = f->child; e; e = e->next) {
            if (!get_int(e, k, 0, INT32_MAX, &i64, err)) return false;
            p->stop_ids[p->n_stop_ids++] = (int32_t)i64;
        }
        return true;
    }
    if (strcmp(k, "n") == 0) {
        if (!get_int(f, k, 1, 1, &i64, err)) {
            serve_error_set(err, 400, k, "'n' must be 1: dsc-serve returns one choice per prompt");
            return false;
        }
        return true;
    }
    if (strcmp(k, "presence_penalty") == 0 || strcmp(k, "frequency_penalty") == 0) {
        if (!get_num(f, k, 0, 0, false, &x, err)) {
            serve_error_set(err, 400, k, "'%s' is not implemented; only 0 is accepted (see repetition_penalty)",
                            k);
            return false;
        }
        return true;
    }
    if (strcmp(k, "echo") == 0) return get_bool(f, k, &p->echo, err);
    if (strcmp(k, "stream") == 0) return get_bool(f, k, &p->stream, err);
    if (strcmp(k, "return_token_ids") == 0) return get_bool(f, k, &p->return_token_ids, err);
    if (strcmp(k, "stream_options") == 0) {
        if (cJSON_IsNull(f)) return true;
        const cJSON *u = cJSON_GetObjectItemCaseSensitive(f, "include_usage");
        if (!cJSON_IsObject(f) || cJSON_GetArraySize(f) != (u ? 1 : 0)) {
            serve_error_set(err, 400, k, "'stream_options' takes only include_usage");
            return false;
        }
        return !u || get_bool(u, "stream_options.include_usage", &p->include_usage, err);
    }
    if (strcmp(k, "logprobs") == 0) {
        if (cJSON_IsNull(f)) return true;
        if (kind == SERVE_KIND_CHAT) return get_bool(f, k, &p->chat_logprobs, err); /* how many: top_logprobs */
        if (!get_int(f, k, 0, SERVE_MAX_LOGPROBS, &i64, err)) return false;
        p->logprobs = (int32_t)i64;
        return true;
    }
    if (strcmp(k, "top_logprobs") == 0) {
        if (cJSON_IsNull(f)) return true;
        if (!get_int(f, k, 0, SERVE_MAX_LOGPROBS, &i64, err)) return false;
        p->top_logprobs = (int32_t)i64;
        return true;
    }
    if (strcmp(k, "user") == 0) { /* an end-user id for the client's own records; it changes nothing */
        if (!cJSON_IsString(f)) {
            serve_error_set(err, 400, k, "'user' must be a string");
            return false;
        }
        return true;
    }
    serve_error_set(err, 400, k, "unknown field '%s'", k);
    return false;
}

bool serve_params_parse(const char *body, size_t len, serve_kind kind, const char *model_name, serve_params *p,
                        serve_error *err) {
    *p = (serve_params){.kind = kind,
                        .max_tokens = -1,
                        .sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .repetition_penalty = 1.0f},
                        .logprobs = -1,
                        .top_logprobs = -1};
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        serve_error_set(err, 400, NULL, "malformed JSON body (at byte %lld)",
                        at && at >= body && at <= body + len ? (long long)(at - body) : -1LL);
        return false;
    }
    bool ok = cJSON_IsObject(root);
    if (!ok) serve_error_set(err, 400, NULL, "the request body must be a JSON object");
    for (const cJSON *f = ok ? root->child : NULL; f && ok; f = f->next) {
        ok = known(f->string, kind);
        if (!ok)
            serve_error_set(err, 400, f->string, "unknown field '%s'", f->string);
        else
            ok = parse_field(f, kind, model_name, p, err);
    }
    if (ok && kind == SERVE_KIND_CHAT && p->top_logprobs >= 0 && !p->chat_logprobs) {
        serve_error_set(err, 400, "top_logprobs", "'top_logprobs' needs logprobs: true");
        ok = false;
    }
    if (kind == SERVE_KIND_CHAT) p->logprobs = p->chat_logprobs ? (p->top_logprobs > 0 ? p->top_logprobs : 0) : -1;
    const char *required = kind == SERVE_KIND_CHAT ? "messages" : "prompt";
    if (ok && !cJSON_GetObjectItemCaseSensitive(root, required)) {
        serve_error_set(err, 400, required, "'%s' is required", required);
        ok = false;
    }
    if (ok && !p->stream && cJSON_GetObjectItemCaseSensitive(root, "stream_options") &&
        !cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(root, "stream_options"))) {
        serve_error_set(err, 400, "stream_options", "'stream_options' needs stream: true");
        ok = false;
    }
    if (ok && p->echo && p->logprobs >= 0) {
        serve_error_set(
            err, 400, "echo",
            "'echo' with 'logprobs' is not supported: the engine returns no logprobs of prompt tokens");
        ok = false;
    }
    cJSON_Delete(root);
    return ok;
}

void serve_params_free(serve_params *p) {
    for (int32_t i = 0; i < p->n_prompts; i++) {
        free(p->prompts[i].text);
        free(p->prompts[i].ids);
    }
    free(p->prompts);
    for (int32_t i = 0; i < p->n_messages; i++) {
        free(p->messages[i].role);
        free(p->messages[i].content);
    }
    free(p->messages);
    for (int32_t i = 0; i < p->n_stop; i++)
        free(p->stop[i]);
    *p = (serve_params){0};
}
