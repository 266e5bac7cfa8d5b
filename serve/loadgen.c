/* The load generator of loadgen.h: worker threads over serve_client. */
#include "serve/loadgen.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsc/rng.h"
#include "serve/client.h"

typedef struct samples {
    double *v;
    int64_t n, cap;
} samples;

typedef struct shared {
    const serve_load_config *cfg;
    atomic_int_fast64_t next;
    double t0;
    pthread_mutex_t mu;
    serve_load_result res;
    samples ttft, itl;
} shared;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void add_sample(samples *s, double x) {
    if (s->n == s->cap) {
        int64_t cap = s->cap ? 2 * s->cap : 1024;
        double *v = realloc(s->v, (size_t)cap * sizeof *v);
        if (!v) return;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = x;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void percentiles(samples *s, double out[3]) {
    static const double q[3] = {0.50, 0.90, 0.99};
    qsort(s->v, (size_t)s->n, sizeof *s->v, by_value);
    for (int i = 0; i < 3; i++)
        out[i] = s->n ? s->v[(int64_t)(q[i] * (double)(s->n - 1) + 0.5)] : 0.0;
}

static void note_error(shared *sh, const char *what) {
    if (!sh->res.first_error[0]) snprintf(sh->res.first_error, sizeof sh->res.first_error, "%s", what);
    sh->res.failed++;
}

/* Request i of the mix: the body, and after how many tokens to leave (0: never). */
static char *make_request(const serve_load_config *c, int64_t i, int *leave_after) {
    dsc_rng rng;
    dsc_rng_init(&rng, c->seed, (uint64_t)i, DSC_RNG_DATA);
    int32_t n = c->prompt_min + (int32_t)dsc_rng_below(&rng, (uint64_t)(c->prompt_max - c->prompt_min + 1));
    int32_t m = c->tokens_min + (int32_t)dsc_rng_below(&rng, (uint64_t)(c->tokens_max - c->tokens_min + 1));
    bool leave = (double)dsc_rng_below(&rng, 1000000) < c->disconnect_fraction * 1e6;
    *leave_after = leave ? 1 + (int)dsc_rng_below(&rng, 4) : 0;
    size_t cap = (size_t)n * 12 + 128;
    char *body = malloc(cap);
    if (!body) return NULL;
    size_t at = (size_t)snprintf(body, cap, "{\"prompt\":[");
    for (int32_t t = 0; t < n; t++)
        at +=
            (size_t)snprintf(body + at, cap - at, t ? ",%d" : "%d", (int)dsc_rng_below(&rng, (uint64_t)c->vocab));
    snprintf(body + at, cap - at, "],\"max_tokens\":%d,\"temperature\":0,\"stream\":true}", m);
    return body;
}

static void *worker(void *arg) {
    shared *sh = arg;
    const serve_load_config *c = sh->cfg;
    samples ttft = {0}, itl = {0};
    int64_t completed = 0, disconnected = 0, rejected = 0, tokens = 0, sent = 0;
    for (;;) {
        int64_t i = atomic_fetch_add(&sh->next, 1);
        if (i >= c->requests || now_s() - sh->t0 > c->time_limit_s) break;
        int leave_after;
        char *body = make_request(c, i, &leave_after);
        if (!body) break;
        double start = now_s(), last = 0;
        serve_client *cl = NULL;
        dsc_status s = serve_client_open(c->port, "POST", "/v1/completions", c->headers, body, 60.0, 0, &cl);
        free(body);
        sent++;
        int n_tok = 0;
        bool ok = !s && serve_client_status(cl) == 200, left = false, failed = false;
        if (!s && serve_client_status(cl) == 429)
            rejected++;
        else if (!ok) {
            pthread_mutex_lock(&sh->mu);
            char msg[256];
            snprintf(msg, sizeof msg, "request %lld: %s", (long long)i,
                     s ? dsc_status_message(s) : "HTTP status other than 200");
            note_error(sh, msg);
            pthread_mutex_unlock(&sh->mu);
        }
        while (ok) {
            const char *data;
            s = serve_client_event(cl, &data);
            if (s || !data) {
                failed = true;
                break;
            }
            if (strcmp(data, "[DONE]") == 0) break;
            if (strstr(data, "\"error\"")) {
                failed = true;
                break;
            }
            double t = now_s();
            if (n_tok == 0)
                add_sample(&ttft, t - start);
            else
                add_sample(&itl, t - last);
            last = t;
            n_tok++;
            if (leave_after && n_tok == leave_after) {
                left = true;
                break;
            }
        }
        tokens += n_tok;
        if (ok && failed) {
            pthread_mutex_lock(&sh->mu);
            note_error(sh, s ? dsc_status_message(s) : "the stream ended without [DONE] or carried an error");
            pthread_mutex_unlock(&sh->mu);
        }
        completed += ok && !failed && !left;
        disconnected += left;
        dsc_status_free(s);
        serve_client_close(cl);
    }
    pthread_mutex_lock(&sh->mu);
    sh->res.sent += sent;
    sh->res.completed += completed;
    sh->res.disconnected += disconnected;
    sh->res.rejected += rejected;
    sh->res.tokens += tokens;
    for (int64_t k = 0; k < ttft.n; k++)
        add_sample(&sh->ttft, ttft.v[k]);
    for (int64_t k = 0; k < itl.n; k++)
        add_sample(&sh->itl, itl.v[k]);
    pthread_mutex_unlock(&sh->mu);
    free(ttft.v);
    free(itl.v);
    return NULL;
}

dsc_status serve_load_run(const serve_load_config *cfg, serve_load_result *out) {
    DSC_CHECK(cfg->concurrency >= 1 && cfg->concurrency <= 1024 && cfg->requests >= 0 && cfg->vocab >= 1 &&
                  cfg->prompt_min >= 1 && cfg->prompt_max >= cfg->prompt_min && cfg->tokens_min >= 1 &&
                  cfg->tokens_max >= cfg->tokens_min && cfg->time_limit_s > 0,
              DSC_ERR_INVALID, "load generator: bad configuration");
    shared *sh = calloc(1, sizeof *sh);
    pthread_t *th = calloc((size_t)cfg->concurrency, sizeof *th);
    if (!sh || !th) {
        free(sh);
        free(th);
        return dsc_error(DSC_ERR_NOMEM, "load generator");
    }
    sh->cfg = cfg;
    atomic_init(&sh->next, 0);
    pthread_mutex_init(&sh->mu, NULL);
    sh->t0 = now_s();
    int started = 0;
    for (; started < cfg->concurrency; started++)
        if (pthread_create(&th[started], NULL, worker, sh) != 0) break;
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    sh->res.elapsed_s = now_s() - sh->t0;
    percentiles(&sh->ttft, sh->res.ttft);
    percentiles(&sh->itl, sh->res.itl);
    *out = sh->res;
    free(sh->ttft.v);
    free(sh->itl.v);
    pthread_mutex_destroy(&sh->mu);
    free(sh);
    free(th);
    DSC_CHECK(started == cfg->concurrency, DSC_ERR_NOMEM, "load generator: %d of %d threads started", started,
              cfg->concurrency);
    return NULL;
}
