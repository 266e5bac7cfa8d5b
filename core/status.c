/* Error objects: formatted once at the failure site, prefixed with the rank.
 * Allocation failure while reporting an error falls back to a static status
 * so that an out-of-memory condition is still reported, never lost. */
#include "dsc/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dsc_status_s {
    dsc_code code;
    char message[];
};

static int current_rank = -1;

static struct {
    dsc_code code;
    char message[64];
} out_of_memory_status = {DSC_ERR_NOMEM, "out of memory while reporting an error"};

static dsc_status static_status(void) {
    return (dsc_status)&out_of_memory_status;
}

void dsc_set_rank(int rank) {
    current_rank = rank;
}
int dsc_get_rank(void) {
    return current_rank;
}

static dsc_status make_status(dsc_code code, const char *prefix, const char *body) {
    size_t len = strlen(prefix) + strlen(body) + 1;
    dsc_status s = malloc(sizeof *s + len);
    if (!s) return static_status();
    s->code = code;
    snprintf(s->message, len, "%s%s", prefix, body);
    return s;
}

dsc_status dsc_verror(dsc_code code, const char *fmt, va_list ap) {
    /* Measured first: a config with many problems reports them all in one message. */
    va_list again;
    va_copy(again, ap);
    int n = vsnprintf(NULL, 0, fmt, again);
    va_end(again);
    char *body = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!body) return static_status();
    vsnprintf(body, (size_t)n + 1, fmt, ap);
    char prefix[32] = "";
    if (current_rank >= 0) snprintf(prefix, sizeof prefix, "rank %d: ", current_rank);
    dsc_status s = make_status(code == DSC_OK ? DSC_ERR_INTERNAL : code, prefix, body);
    free(body);
    return s;
}

dsc_status dsc_error(dsc_code code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    dsc_status s = dsc_verror(code, fmt, ap);
    va_end(ap);
    return s;
}

dsc_status dsc_error_wrap(dsc_status inner, const char *fmt, ...) {
    if (!inner) return NULL;
    char context[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(context, sizeof context, fmt, ap);
    va_end(ap);
    /* Keep the rank prefix at the front: "rank 3: context: inner-body". */
    const char *body = inner->message;
    char prefix[64] = "";
    if (current_rank >= 0) {
        snprintf(prefix, sizeof prefix, "rank %d: ", current_rank);
        size_t plen = strlen(prefix);
        if (strncmp(body, prefix, plen) == 0) body += plen;
    }
    char head[1100];
    snprintf(head, sizeof head, "%s%s: ", prefix, context);
    dsc_status s = make_status(inner->code, head, body);
    dsc_status_free(inner);
    return s;
}

dsc_code dsc_status_code(dsc_status s) {
    return s ? s->code : DSC_OK;
}

const char *dsc_status_message(dsc_status s) {
    return s ? s->message : "ok";
}

const char *dsc_code_name(dsc_code code) {
    static const char *names[] = {
        [DSC_OK] = "ok",
        [DSC_ERR_INVALID] = "invalid argument",
        [DSC_ERR_CONFIG] = "configuration error",
        [DSC_ERR_IO] = "I/O error",
        [DSC_ERR_CORRUPT] = "corrupt data",
        [DSC_ERR_NOMEM] = "out of memory",
        [DSC_ERR_COMM] = "communication error",
        [DSC_ERR_TIMEOUT] = "timeout",
        [DSC_ERR_PEER] = "peer failure",
        [DSC_ERR_NUMERIC] = "numerical error",
        [DSC_ERR_UNSUPPORTED] = "unsupported",
        [DSC_ERR_BACKEND] = "backend error",
        [DSC_ERR_INTERNAL] = "internal error",
    };
    if ((unsigned)code >= sizeof names / sizeof names[0]) return "unknown";
    return names[code];
}

void dsc_status_free(dsc_status s) {
    if (s && s != static_status()) free(s);
}

void dsc_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "[rank %d] dsc internal error: assertion `%s` failed at %s:%d\n", current_rank, expr, file,
            line);
    abort();
}
