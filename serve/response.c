/* OpenAI response bodies from a job's events: the non-streaming completion
 * and chat completion objects, server-sent event chunks (one per token, then
 * `data: [DONE]`), error objects and the model list. Token strings for
 * logprobs are the token's own decoded text ("token_id:N" without a
 * tokenizer, as vLLM's return_tokens_as_token_ids). Callers hold the
 * server's mutex. Not here: when chunks are sent (http.c). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve/response.h"
#include "serve/strbuf.h"

static const char *finish_name(serve_finish f) {
    return f == SERVE_FINISH_STOP ? "stop" : f == SERVE_FINISH_LENGTH ? "length" : "abort";
}

/* Adds s[0..n) as a UTF-8 clean JSON string. */
static void add_text(cJSON *obj, const char *key, const char *s, size_t n) {
    char *clean = serve_utf8_clean(s ? s : "", s ? n : 0);
    cJSON_AddStringToObject(obj, key, clean ? clean : "");
    free(clean);
}

static char *print_free(cJSON *root) {
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

/* The raw bytes of one token (NUL-terminated, *n without the NUL). */
static void token_bytes(const dsc_server *srv, int32_t id, char *buf, size_t cap, size_t *n) {
    if (!srv->tok || dsc_tokenizer_decode(srv->tok, &id, 1, buf, cap, n)) {
        *n = (size_t)snprintf(buf, cap, "token_id:%d", id);
        if (*n >= cap) *n = cap - 1;
    }
}

static cJSON *bytes_array(const char *s, size_t n) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)s[i]));
    return a;
}

/* Chat: one entry of logprobs.content. */
static cJSON *chat_logprob(const dsc_server *srv, const serve_job *job, const serve_event *ev) {
    const serve_logprob *lp = job->tops + ev->top;
    char buf[512];
    size_t n;
    cJSON *entry = cJSON_CreateObject();
    token_bytes(srv, ev->token, buf, sizeof buf, &n);
    add_text(entry, "token", buf, n);
    cJSON_AddNumberToObject(entry, "logprob", lp[0].logprob);
    cJSON_AddItemToObject(entry, "bytes", bytes_array(buf, n));
    cJSON *tops = cJSON_AddArrayToObject(entry, "top_logprobs");
    for (int32_t k = 1; k <= job->p.logprobs; k++) {
        cJSON *t = cJSON_CreateObject();
        token_bytes(srv, lp[k].id, buf, sizeof buf, &n);
        add_text(t, "token", buf, n);
        cJSON_AddNumberToObject(t, "logprob", lp[k].logprob);
        cJSON_AddItemToObject(t, "bytes", bytes_array(buf, n));
        cJSON_AddItemToArray(tops, t);
    }
    return entry;
}

/* Completions: appends one token to the four parallel arrays of `logprobs`. */
static void completion_logprob(const dsc_server *srv, const serve_job *job, const serve_event *ev, cJSON *logprobs,
                               size_t text_offset) {
    const serve_logprob *lp = job->tops + ev->top;
    char buf[512];
    size_t n;
    token_bytes(srv, ev->token, buf, sizeof buf, &n);
    char *clean = serve_utf8_clean(buf, n);
    cJSON_AddItemToArray(cJSON_GetObjectItem(logprobs, "tokens"), cJSON_CreateString(clean ? clean : ""));
    free(clean);
    cJSON_AddItemToArray(cJSON_GetObjectItem(logprobs, "token_logprobs"), cJSON_CreateNumber(lp[0].logprob));
    cJSON *top = cJSON_CreateObject();
    for (int32_t k = 1; k <= job->p.logprobs; k++) {
        token_bytes(srv, lp[k].id, buf, sizeof buf, &n);
        clean = serve_utf8_clean(buf, n);
        cJSON_AddNumberToObject(top, clean ? clean : "", lp[k].logprob);
        free(clean);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItem(logprobs, "top_logprobs"), top);
    cJSON_AddItemToArray(cJSON_GetObjectItem(logprobs, "text_offset"), cJSON_CreateNumber((double)text_offset));
}

static cJSON *completion_logprobs_new(void) {
    cJSON *l = cJSON_CreateObject();
    cJSON_AddArrayToObject(l, "tokens");
    cJSON_AddArrayToObject(l, "token_logprobs");
    cJSON_AddArrayToObject(l, "top_logprobs");
    cJSON_AddArrayToObject(l, "text_offset");
    return l;
}

static cJSON *chat_logprobs_new(void) {
    cJSON *l = cJSON_CreateObject();
    cJSON_AddArrayToObject(l, "content");
    return l;
}

static cJSON *ids_array(const int32_t *ids, int32_t n) {
    cJSON *a = cJSON_CreateArray();
    for (int32_t i = 0; i < n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

/* The prompt as echoed: its text, or its ids decoded. */
static void echo_text(const dsc_server *srv, const serve_job *job, int32_t seq, serve_buf *out) {
    const serve_prompt *q = &job->p.prompts[seq];
    if (q->text) {
        serve_buf_puts(out, q->text);
        return;
    }
    for (int32_t i = 0; i < q->n_ids && srv->tok; i++) {
        char buf[512];
        size_t n;
        if (!dsc_tokenizer_decode(srv->tok, &q->ids[i], 1, buf, sizeof buf, &n)) serve_buf_add(out, buf, n);
    }
}

static cJSON *envelope(const dsc_server *srv, const serve_job *job, bool chunk) {
    cJSON *root = cJSON_CreateObject();
    bool chat = job->p.kind == SERVE_KIND_CHAT;
    cJSON_AddStringToObject(root, "id", job->id);
    cJSON_AddStringToObject(root, "object",
                            chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion");
    cJSON_AddNumberToObject(root, "created", (double)job->created);
    cJSON_AddStringToObject(root, "model", srv->model_name);
    return root;
}

static cJSON *usage(const serve_job *job) {
    int32_t gen = 0;
    for (int32_t i = 0; i < job->n_seqs; i++)
        gen += job->seqs[i].n_gen;
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", job->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", gen);
    cJSON_AddNumberToObject(u, "total_tokens", job->prompt_tokens + gen);
    return u;
}

char *serve_json_final(const dsc_server *srv, const serve_job *job) {
    cJSON *root = envelope(srv, job, false);
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    bool chat = job->p.kind == SERVE_KIND_CHAT;
    for (int32_t i = 0; i < job->n_seqs; i++) {
        const serve_seq *q = &job->seqs[i];
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", i);
        serve_buf text = {0};
        if (job->p.echo) echo_text(srv, job, i, &text);
        size_t echo_len = text.len;
        serve_buf_add(&text, q->text.all ? q->text.all : "", q->text.visible);
        if (chat) {
            cJSON *m = cJSON_AddObjectToObject(c, "message");
            cJSON_AddStringToObject(m, "role", "assistant");
            add_text(m, "content", text.p, text.len);
        } else {
            add_text(c, "text", text.p, text.len);
        }
        serve_buf_free(&text);
        if (job->p.logprobs >= 0) {
            cJSON *l = chat ? chat_logprobs_new() : completion_logprobs_new();
            for (int32_t e = 0; e < job->n_events; e++) {
                const serve_event *ev = &job->events[e];
                if (ev->seq != i || ev->token < 0) continue;
                if (chat)
                    cJSON_AddItemToArray(cJSON_GetObjectItem(l, "content"), chat_logprob(srv, job, ev));
                else
                    completion_logprob(srv, job, ev, l, echo_len + ev->off);
            }
            cJSON_AddItemToObject(c, "logprobs", l);
        } else {
            cJSON_AddNullToObject(c, "logprobs");
        }
        cJSON_AddStringToObject(c, "finish_reason", finish_name(q->finish));
        if (job->p.return_token_ids) {
            cJSON_AddItemToObject(c, "prompt_token_ids",
                                  ids_array(job->p.prompts[i].ids, job->p.prompts[i].n_ids));
            cJSON_AddItemToObject(c, "token_ids", ids_array(q->gen, q->n_gen));
        }
        cJSON_AddItemToArray(choices, c);
    }
    cJSON_AddItemToObject(root, "usage", usage(job));
    return print_free(root);
}

static void add_event(serve_buf *out, cJSON *root) {
    char *s = print_free(root);
    if (!s) {
        out->oom = true;
        return;
    }
    serve_buf_printf(out, "data: %s\n\n", s);
    free(s);
}

/* One chunk for seq carrying text, and optionally a token (ev) and a finish
 * reason; `role` starts chat's assistant message. */
static void chunk(const dsc_server *srv, const serve_job *job, int32_t seq, const char *text, size_t len,
                  const serve_event *ev, bool role, serve_buf *out) {
    bool chat = job->p.kind == SERVE_KIND_CHAT;
    cJSON *root = envelope(srv, job, true);
    cJSON *c = cJSON_CreateObject();
    cJSON_AddNumberToObject(c, "index", seq);
    if (chat) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        add_text(d, "content", text, len);
    } else {
        add_text(c, "text", text, len);
    }
    if (ev && ev->token >= 0 && job->p.logprobs >= 0) {
        cJSON *l = chat ? chat_logprobs_new() : completion_logprobs_new();
        if (chat)
            cJSON_AddItemToArray(cJSON_GetObjectItem(l, "content"), chat_logprob(srv, job, ev));
        else
            completion_logprob(srv, job, ev, l, ev->off);
        cJSON_AddItemToObject(c, "logprobs", l);
    } else {
        cJSON_AddNullToObject(c, "logprobs");
    }
    if (ev && ev->finish != SERVE_FINISH_NONE)
        cJSON_AddStringToObject(c, "finish_reason", finish_name(ev->finish));
    else
        cJSON_AddNullToObject(c, "finish_reason");
    if (job->p.return_token_ids && ev) {
        if (ev->first)
            cJSON_AddItemToObject(c, "prompt_token_ids",
                                  ids_array(job->p.prompts[seq].ids, job->p.prompts[seq].n_ids));
        cJSON_AddItemToObject(c, "token_ids", ids_array(&ev->token, ev->token >= 0 ? 1 : 0));
    }
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    cJSON_AddItemToArray(choices, c);
    add_event(out, root);
}

/* Chat's role and an echoed prompt come before the tokens, one chunk per sequence. */
void serve_sse_begin(const dsc_server *srv, const serve_job *job, serve_buf *out) {
    for (int32_t i = 0; i < job->n_seqs; i++) {
        serve_buf text = {0};
        if (job->p.echo) echo_text(srv, job, i, &text);
        if (job->p.kind == SERVE_KIND_CHAT || job->p.echo)
            chunk(srv, job, i, text.p, text.len, NULL, job->p.kind == SERVE_KIND_CHAT, out);
        serve_buf_free(&text);
    }
}

void serve_sse_events(const dsc_server *srv, const serve_job *job, int32_t from, int32_t to, serve_buf *out) {
    for (int32_t e = from; e < to; e++) {
        const serve_event *ev = &job->events[e];
        const serve_seq *q = &job->seqs[ev->seq];
        chunk(srv, job, ev->seq, q->text.all + ev->off, ev->len, ev, false, out);
    }
}

void serve_sse_end(const dsc_server *srv, const serve_job *job, serve_buf *out) {
    if (job->engine_failed || job->error.http) {
        char *e = serve_json_error(&job->error);
        if (e) serve_buf_printf(out, "data: %s\n\n", e);
        free(e);
    }
    if (job->p.include_usage) {
        cJSON *root = envelope(srv, job, true);
        cJSON_AddArrayToObject(root, "choices");
        cJSON_AddItemToObject(root, "usage", usage(job));
        add_event(out, root);
    }
    serve_buf_puts(out, "data: [DONE]\n\n");
}

char *serve_json_error(const serve_error *e) {
    cJSON *root = cJSON_CreateObject();
    cJSON *o = cJSON_AddObjectToObject(root, "error");
    add_text(o, "message", e->message, strlen(e->message));
    cJSON_AddStringToObject(o, "type", e->type ? e->type : "invalid_request_error");
    if (e->param[0])
        cJSON_AddStringToObject(o, "param", e->param);
    else
        cJSON_AddNullToObject(o, "param");
    if (e->code)
        cJSON_AddStringToObject(o, "code", e->code);
    else
        cJSON_AddNullToObject(o, "code");
    return print_free(root);
}

char *serve_json_models(const dsc_server *srv) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", srv->model_name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)srv->created);
    cJSON_AddStringToObject(m, "owned_by", "dsc");
    cJSON_AddNumberToObject(m, "max_model_len", srv->max_context);
    cJSON_AddItemToArray(data, m);
    return print_free(root);
}
