/* The HTTP side of dsc-serve on libmicrohttpd, one thread per connection:
 * routing, the API key, body and request limits, tokenizing prompts (chat
 * through its template), queueing jobs for the step loop, and answering —
 * a JSON body, or server-sent events produced as the job's tokens arrive.
 * A waiting thread checks every 20 ms whether its client has closed the
 * connection; if so (or when a write fails) the job is cancelled, which
 * frees its KV blocks at the step loop's next iteration.
 * Not here: the engine (loop.c) or response shapes (response.c). */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "serve/chat_template.h"
#include "serve/response.h"
#include "serve/serve_internal.h"
#include "serve/strbuf.h"

enum { SEND_BUFFER_BYTES = 64 * 1024, POLL_MS = 20 };

/* job: a non-streaming answer's, held until the response has been sent, so
 * that a drain does not stop the daemon with the answer still unsent. */
typedef struct conn_ctx {
    serve_buf body;
    bool too_large;
    serve_job *job;
} conn_ctx;

typedef struct stream_ctx {
    dsc_server *srv;
    serve_job *job;
    struct MHD_Connection *conn;
    serve_buf out;
    size_t sent;
    int32_t next_event;
    bool begun, ended;
} stream_ctx;

/* ---- answering -------------------------------------------------------------------------------- */
static void count_status(dsc_server *srv, int status) {
    pthread_mutex_lock(&srv->mu);
    serve_metrics_count_status(&srv->metrics, status);
    pthread_mutex_unlock(&srv->mu);
}

/* Sends body (malloc'd, taken; NULL: out of memory -> 500). */
static enum MHD_Result send_body(dsc_server *srv, struct MHD_Connection *c, int status, const char *type,
                                 char *body, const char *retry_after) {
    if (!body) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\","
                                  "\"param\":null,\"code\":null}}";
        body = strdup(oom);
        status = 500;
        if (!body) return MHD_NO;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    if (retry_after) MHD_add_response_header(r, "Retry-After", retry_after);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    count_status(srv, status);
    return ret;
}

static enum MHD_Result send_error(dsc_server *srv, struct MHD_Connection *c, const serve_error *e) {
    return send_body(srv, c, e->http, "application/json", serve_json_error(e), e->http == 429 ? "1" : NULL);
}

static enum MHD_Result fail(dsc_server *srv, struct MHD_Connection *c, int status, const char *param,
                            const char *message) {
    serve_error e;
    serve_error_set(&e, status, param, "%s", message);
    if (status == 401) e.code = "invalid_api_key";
    return send_error(srv, c, &e);
}

/* ---- waiting on a job ---------------------------------------------------------------------------- */
static bool client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return false;
    char b;
    ssize_t r = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* Under the mutex: waits up to POLL_MS for the job to change. */
static void wait_a_little(dsc_server *srv, serve_job *job) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += POLL_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&job->cond, &srv->mu, &ts);
}

/* Under the mutex: the client left; the step loop cancels the job. */
static void cancel(dsc_server *srv, serve_job *job) {
    if (job->done) return;
    job->cancel = true;
    pthread_cond_signal(&srv->wake);
}

/* Under the mutex: waits until done(job) or the client leaves (false, job cancelled). */
static bool wait_for(dsc_server *srv, serve_job *job, struct MHD_Connection *c, bool admission_only) {
    while (admission_only ? job->admission == SERVE_ADMISSION_PENDING : !job->done) {
        wait_a_little(srv, job);
        pthread_mutex_unlock(&srv->mu);
        bool gone = client_gone(c);
        pthread_mutex_lock(&srv->mu);
        if (gone) {
            cancel(srv, job);
            return false;
        }
    }
    return true;
}

/* ---- streaming ------------------------------------------------------------------------------------- */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream_ctx *s = cls;
    dsc_server *srv = s->srv;
    for (;;) {
        if (s->sent < s->out.len) {
            size_t n = s->out.len - s->sent < max ? s->out.len - s->sent : max;
            memcpy(buf, s->out.p + s->sent, n);
            s->sent += n;
            if (s->sent == s->out.len) s->sent = s->out.len = 0;
            return (ssize_t)n;
        }
        if (s->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        if (s->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
        pthread_mutex_lock(&srv->mu);
        serve_job *job = s->job;
        if (!s->begun) {
            serve_sse_begin(srv, job, &s->out);
            s->begun = true;
        } else if (s->next_event < job->n_events) {
            serve_sse_events(srv, job, s->next_event, job->n_events, &s->out);
            s->next_event = job->n_events;
        } else if (job->done) {
            serve_sse_end(srv, job, &s->out);
            s->ended = true;
        } else {
            wait_a_little(srv, job);
            pthread_mutex_unlock(&srv->mu);
            if (!client_gone(s->conn)) continue;
            pthread_mutex_lock(&srv->mu);
            cancel(srv, job);
            pthread_mutex_unlock(&srv->mu);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        pthread_mutex_unlock(&srv->mu);
    }
}

/* The response is gone (sent, or the connection broke): cancel what still runs. */
static void stream_free(void *cls) {
    stream_ctx *s = cls;
    pthread_mutex_lock(&s->srv->mu);
    cancel(s->srv, s->job);
    serve_job_unref(s->srv, s->job);
    pthread_mutex_unlock(&s->srv->mu);
    serve_buf_free(&s->out);
    free(s);
}

/* Takes over the caller's reference to job. */
static enum MHD_Result send_stream(dsc_server *srv, struct MHD_Connection *c, serve_job *job) {
    stream_ctx *s = calloc(1, sizeof *s);
    struct MHD_Response *r = NULL;
    if (s) {
        *s = (stream_ctx){.srv = srv, .job = job, .conn = c};
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, s, stream_free);
    }
    if (!r) {
        if (s)
            stream_free(s);
        else {
            pthread_mutex_lock(&srv->mu);
            cancel(srv, job);
            serve_job_unref(srv, job);
            pthread_mutex_unlock(&srv->mu);
        }
        return fail(srv, c, 500, NULL, "out of memory for the event stream");
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    count_status(srv, 200);
    return ret;
}

/* ---- generation requests ------------------------------------------------------------------------- */
static bool tokenize(dsc_server *srv, const char *text, bool bos, serve_prompt *q, serve_error *err) {
    size_t len = strlen(text);
    int64_t cap = (int64_t)len + 3, n = 0;
    for (int attempt = 0; attempt < 2; attempt++) {
        free(q->ids);
        q->ids = malloc((size_t)cap * sizeof *q->ids);
        if (!q->ids) break;
        int64_t at = bos ? 1 : 0;
        if (bos) q->ids[0] = srv->cfg.bos;
        dsc_status s = dsc_tokenizer_encode(srv->tok, text, len, q->ids + at, cap - at, &n);
        if (!s) {
            q->n_ids = (int32_t)(n + at);
            return true;
        }
        dsc_status_free(s);
        cap = n + at; /* the ids the text needs */
    }
    serve_error_set(err, 500, "prompt", "could not tokenize the prompt");
    return false;
}

/* Text prompts -> ids, checks ids, the chat template; fills *max_tokens. */
static bool prepare(dsc_server *srv, serve_params *p, int32_t *max_tokens, serve_error *err) {
    if (p->kind == SERVE_KIND_CHAT) {
        if (!srv->chat) {
            serve_error_set(
                err, 400, "messages",
                "model '%s' has no chat template: start dsc-serve with --chat-template NAME (%s), or use "
                "/v1/completions",
                srv->model_name, serve_chat_template_names());
            return false;
        }
        char *text;
        dsc_status s = serve_chat_render(srv->chat, p->messages, p->n_messages, &text);
        if (s) {
            serve_error_set(err, 400, "messages", "%s", dsc_status_message(s));
            dsc_status_free(s);
            return false;
        }
        p->prompts = calloc(1, sizeof *p->prompts);
        if (!p->prompts) {
            free(text);
            serve_error_set(err, 500, NULL, "out of memory");
            return false;
        }
        p->n_prompts = 1;
        p->prompts[0].text = text;
        if (srv->chat_end_id < 0 && p->n_stop < SERVE_MAX_STOP) { /* the end of turn is plain text here */
            p->stop[p->n_stop] = strdup(srv->chat_end);
            if (p->stop[p->n_stop]) p->n_stop++;
        }
    }
    int32_t longest = 0;
    for (int32_t i = 0; i < p->n_prompts; i++) {
        serve_prompt *q = &p->prompts[i];
        if (q->text) {
            if (!srv->tok) {
                serve_error_set(err, 400, "prompt", "model '%s' has no tokenizer: send prompts as token-id arrays",
                                srv->model_name);
                return false;
            }
            if (!tokenize(srv, q->text, p->kind == SERVE_KIND_COMPLETION && srv->cfg.bos >= 0, q, err))
                return false;
        }
        for (int32_t k = 0; k < q->n_ids; k++)
            if (q->ids[k] >= srv->vocab) {
                serve_error_set(err, 400, "prompt", "token id %d is outside the vocabulary [0, %d)", q->ids[k],
                                srv->vocab);
                return false;
            }
        if (q->n_ids < 1) {
            serve_error_set(err, 400, "prompt", "the prompt is empty");
            return false;
        }
        if (q->n_ids > srv->cfg.max_prompt_tokens) {
            serve_error_set(err, 400, "prompt", "the prompt has %d tokens; this server accepts at most %d",
                            q->n_ids, srv->cfg.max_prompt_tokens);
            return false;
        }
        if (q->n_ids > longest) longest = q->n_ids;
    }
    for (int32_t k = 0; k < p->n_stop_ids; k++)
        if (p->stop_ids[k] >= srv->vocab) {
            serve_error_set(err, 400, "stop_token_ids", "token id %d is outside the vocabulary [0, %d)",
                            p->stop_ids[k], srv->vocab);
            return false;
        }
    /* The last generated token is never fed back: a prompt of P leaves max_context - P + 1. */
    int64_t room = (int64_t)srv->max_context - longest + 1;
    int32_t m = p->max_tokens;
    if (m < 0) {
        m = p->kind == SERVE_KIND_COMPLETION ? 16 : srv->cfg.max_tokens; /* OpenAI's defaults */
        if (m > room) m = room > 0 ? (int32_t)room : 1;
    }
    if (m > srv->cfg.max_tokens) {
        serve_error_set(err, 400, "max_tokens", "'max_tokens' is %d; this server allows at most %d", m,
                        srv->cfg.max_tokens);
        return false;
    }
    if (m > room) {
        serve_error_set(err, 400, "max_tokens",
                        "This model's maximum context length is %d tokens. However, you requested %lld tokens (%d "
                        "in the prompt, %d in the completion).",
                        srv->max_context, (long long)longest + m - 1, longest, m);
        return false;
    }
    *max_tokens = m;
    return true;
}

static enum MHD_Result generate(dsc_server *srv, struct MHD_Connection *c, serve_kind kind, conn_ctx *ctx) {
    serve_params p;
    serve_error err = {0};
    int32_t max_tokens = 0;
    if (!serve_params_parse(ctx->body.p ? ctx->body.p : "", ctx->body.len, kind, srv->model_name, &p, &err)) {
        serve_params_free(&p);
        return send_error(srv, c, &err);
    }
    if (!prepare(srv, &p, &max_tokens, &err)) {
        serve_params_free(&p);
        return send_error(srv, c, &err);
    }
    serve_job *job = serve_job_new(srv, &p, max_tokens);
    if (!job) {
        serve_params_free(&p);
        return fail(srv, c, 500, NULL, "out of memory for the request");
    }
    pthread_mutex_lock(&srv->mu);
    if (srv->draining || srv->in_flight >= srv->cfg.max_concurrent) {
        if (srv->draining)
            serve_error_set(&err, 503, NULL, "the server is shutting down");
        else
            serve_error_set(&err, 429, NULL, "the server is busy: %d requests in flight (limit %d); retry later",
                            srv->in_flight, srv->cfg.max_concurrent);
        serve_job_unref(srv, job);
        pthread_mutex_unlock(&srv->mu);
        return send_error(srv, c, &err);
    }
    srv->in_flight++;
    job->counted = true;
    job->refs++; /* the step loop's */
    if (srv->inbox_tail)
        srv->inbox_tail->next = job;
    else
        srv->inbox = job;
    srv->inbox_tail = job;
    pthread_cond_signal(&srv->wake);
    bool here = wait_for(srv, job, c, true);
    if (here && job->admission == SERVE_ADMISSION_FAILED) {
        err = job->error;
        serve_job_unref(srv, job);
        pthread_mutex_unlock(&srv->mu);
        return send_error(srv, c, &err);
    }
    if (here && p.stream) {
        pthread_mutex_unlock(&srv->mu);
        return send_stream(srv, c, job);
    }
    if (here) here = wait_for(srv, job, c, false);
    char *body = here && !job->error.http ? serve_json_final(srv, job) : NULL;
    err = job->error;
    ctx->job = job; /* on_completed lets it go */
    pthread_mutex_unlock(&srv->mu);
    if (!here) return MHD_NO; /* the client left: close */
    if (err.http) {
        free(body);
        return send_error(srv, c, &err);
    }
    return send_body(srv, c, 200, "application/json", body, NULL);
}

/* ---- routing ------------------------------------------------------------------------------------------ */
static bool authorized(const dsc_server *srv, struct MHD_Connection *c) {
    if (!srv->api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0) return false;
    h += 7;
    size_t n = strlen(srv->api_key), m = strlen(h);
    unsigned diff = (unsigned)(n ^ m);
    for (size_t i = 0; i < m; i++) /* time independent of where the key differs */
        diff |= (unsigned)(h[i] ^ srv->api_key[i % (n ? n : 1)]);
    return diff == 0;
}

static enum MHD_Result route(dsc_server *srv, struct MHD_Connection *c, const char *url, const char *method,
                             conn_ctx *ctx) {
    bool get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
    bool is_completions = strcmp(url, "/v1/completions") == 0, is_chat = strcmp(url, "/v1/chat/completions") == 0;
    bool is_models = strcmp(url, "/v1/models") == 0, is_metrics = strcmp(url, "/metrics") == 0;
    if (strcmp(url, "/health") == 0) {
        if (!get) return fail(srv, c, 405, NULL, "/health takes GET");
        pthread_mutex_lock(&srv->mu);
        bool draining = srv->draining;
        pthread_mutex_unlock(&srv->mu);
        if (draining) return fail(srv, c, 503, NULL, "the server is shutting down");
        return send_body(srv, c, 200, "application/json", strdup("{}"), NULL);
    }
    if (!is_completions && !is_chat && !is_models && !is_metrics)
        return fail(srv, c, 404, NULL,
                    "no such route; dsc-serve has /v1/completions, /v1/chat/completions, "
                    "/v1/models, /health and /metrics");
    if (!authorized(srv, c))
        return fail(srv, c, 401, NULL, "Incorrect API key provided (Authorization: Bearer KEY)");
    if ((is_models || is_metrics) && !get) return fail(srv, c, 405, NULL, "this route takes GET");
    if ((is_completions || is_chat) && !post) return fail(srv, c, 405, NULL, "this route takes POST");
    if (ctx->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body exceeds %zu bytes", srv->cfg.max_body_bytes);
        return fail(srv, c, 413, NULL, msg);
    }
    if (is_models) {
        pthread_mutex_lock(&srv->mu);
        char *body = serve_json_models(srv);
        pthread_mutex_unlock(&srv->mu);
        return send_body(srv, c, 200, "application/json", body, NULL);
    }
    if (is_metrics) {
        serve_buf b = {0};
        pthread_mutex_lock(&srv->mu);
        srv->metrics.in_flight = srv->in_flight;
        serve_metrics_render(&srv->metrics, srv->model_name, &b);
        pthread_mutex_unlock(&srv->mu);
        if (b.oom) serve_buf_free(&b);
        return send_body(srv, c, 200, "text/plain; version=0.0.4", b.p, NULL);
    }
    return generate(srv, c, is_chat ? SERVE_KIND_CHAT : SERVE_KIND_COMPLETION, ctx);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    dsc_server *srv = cls;
    conn_ctx *ctx = *con_cls;
    if (!ctx) {
        if (!(ctx = calloc(1, sizeof *ctx))) return MHD_NO;
        *con_cls = ctx;
        return MHD_YES;
    }
    if (*upload_size) {
        if (ctx->body.len + *upload_size > srv->cfg.max_body_bytes)
            ctx->too_large = true;
        else
            serve_buf_add(&ctx->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (ctx->body.oom) return fail(srv, c, 500, NULL, "out of memory for the request body");
    return route(srv, c, url, method, ctx);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)c;
    (void)toe;
    dsc_server *srv = cls;
    conn_ctx *ctx = *con_cls;
    if (!ctx) return;
    if (ctx->job) {
        pthread_mutex_lock(&srv->mu);
        serve_job_unref(srv, ctx->job);
        pthread_mutex_unlock(&srv->mu);
    }
    serve_buf_free(&ctx->body);
    free(ctx);
    *con_cls = NULL;
}

/* A small send buffer so that a client that stops reading holds its stream
 * back (and its slot among the requests in flight) instead of the kernel
 * buffering megabytes of events. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode toe) {
    (void)cls;
    (void)socket_ctx;
    if (toe != MHD_CONNECTION_NOTIFY_STARTED) return;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    int bytes = SEND_BUFFER_BYTES;
    if (ci) setsockopt(ci->connect_fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
}

dsc_status serve_http_start(dsc_server *srv) {
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)srv->cfg.port)};
    DSC_CHECK(inet_pton(AF_INET, srv->cfg.host, &addr.sin_addr) == 1, DSC_ERR_CONFIG,
              "--host %s: not an IPv4 address (e.g. 127.0.0.1, or 0.0.0.0 for every interface)", srv->cfg.host);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC;
    srv->mhd =
        MHD_start_daemon(flags, 0, NULL, NULL, on_request, srv, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                         MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv, MHD_OPTION_NOTIFY_CONNECTION,
                         on_connection, srv, MHD_OPTION_CONNECTION_LIMIT, (unsigned)srv->cfg.max_concurrent + 64u,
                         MHD_OPTION_CONNECTION_TIMEOUT, 120u, MHD_OPTION_END);
    DSC_CHECK(srv->mhd, DSC_ERR_IO, "cannot listen on %s:%d (%s)", srv->cfg.host, srv->cfg.port,
              errno ? strerror(errno) : "libmicrohttpd refused the options");
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->mhd, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = di ? (int)di->port : srv->cfg.port;
    return NULL;
}

void serve_http_quiesce(dsc_server *srv) {
    if (!srv->mhd) return;
    MHD_socket fd = MHD_quiesce_daemon(srv->mhd);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void serve_http_stop(dsc_server *srv) {
    if (srv->mhd) MHD_stop_daemon(srv->mhd);
    srv->mhd = NULL;
}
