/* The loopback HTTP client of client.h. */
#include "serve/client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

struct serve_client {
    int fd;
    int status;
    char *headers; /* the header block, NUL-terminated */
    char *in;      /* received, not yet decoded */
    size_t n_in, cap_in;
    char *body; /* decoded */
    size_t n_body, cap_body, event_at;
    char *event; /* the last event's data */
    bool chunked, eof, ended;
    long long remaining; /* content-length left, or the current chunk's bytes left; -1 unknown */
    char header_value[512];
};

static bool reserve(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 4096;
    while (c < need)
        c *= 2;
    char *p = realloc(*buf, c);
    if (!p) return false;
    *buf = p;
    *cap = c;
    return true;
}

/* Reads more bytes into c->in; sets eof at the connection's end. */
static dsc_status fill(serve_client *c) {
    DSC_CHECK(reserve(&c->in, &c->cap_in, c->n_in + 65536 + 1), DSC_ERR_NOMEM, "client buffer");
    ssize_t n;
    do
        n = recv(c->fd, c->in + c->n_in, 65536, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return dsc_error(DSC_ERR_TIMEOUT, "client: no answer from the server in time");
    if (n <= 0) {
        c->eof = true;
        return NULL;
    }
    c->n_in += (size_t)n;
    c->in[c->n_in] = '\0';
    return NULL;
}

static void consume(serve_client *c, size_t n) {
    memmove(c->in, c->in + n, c->n_in - n);
    c->n_in -= n;
}

static dsc_status add_body(serve_client *c, const char *s, size_t n) {
    DSC_CHECK(reserve(&c->body, &c->cap_body, c->n_body + n + 1), DSC_ERR_NOMEM, "client body");
    memcpy(c->body + c->n_body, s, n);
    c->n_body += n;
    c->body[c->n_body] = '\0';
    return NULL;
}

/* Moves what can be decoded from in to body; ended when the body is complete. */
static dsc_status decode(serve_client *c) {
    while (!c->ended) {
        if (!c->chunked) {
            size_t n = c->remaining >= 0 && (long long)c->n_in > c->remaining ? (size_t)c->remaining : c->n_in;
            DSC_TRY(add_body(c, c->in, n));
            consume(c, n);
            if (c->remaining >= 0) c->remaining -= (long long)n;
            if (c->remaining == 0 || (c->eof && c->n_in == 0)) c->ended = true;
            return NULL;
        }
        if (c->remaining > 0) { /* inside a chunk */
            size_t n = (long long)c->n_in < c->remaining ? c->n_in : (size_t)c->remaining;
            DSC_TRY(add_body(c, c->in, n));
            consume(c, n);
            c->remaining -= (long long)n;
            if (c->remaining > 0) return NULL;
            c->remaining = -2; /* the CRLF after the chunk */
        }
        if (c->remaining == -2) {
            if (c->n_in < 2) return NULL;
            consume(c, 2);
            c->remaining = 0;
        }
        char *eol = c->n_in ? memchr(c->in, '\n', c->n_in) : NULL;
        if (!eol) return NULL;
        long long size = strtoll(c->in, NULL, 16);
        consume(c, (size_t)(eol - c->in) + 1);
        if (size == 0) {
            c->ended = true;
            return NULL;
        }
        c->remaining = size;
    }
    return NULL;
}

dsc_status serve_client_open(int port, const char *method, const char *path, const char *headers, const char *body,
                             double timeout_s, int rcvbuf, serve_client **out) {
    serve_client *c = calloc(1, sizeof *c);
    DSC_CHECK(c, DSC_ERR_NOMEM, "client");
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    c->remaining = -1;
    if (c->fd < 0) {
        free(c);
        return dsc_error(DSC_ERR_IO, "client: socket: %s", strerror(errno));
    }
    struct timeval tv = {.tv_sec = (time_t)timeout_s,
                         .tv_usec = (suseconds_t)((timeout_s - (time_t)timeout_s) * 1e6)};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (rcvbuf > 0) setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    dsc_status s = NULL;
    if (connect(c->fd, (struct sockaddr *)&addr, sizeof addr) != 0)
        s = dsc_error(DSC_ERR_IO, "client: connect to 127.0.0.1:%d: %s", port, strerror(errno));
    size_t n_body = body ? strlen(body) : 0;
    char *req = NULL;
    int n_req = 0;
    if (!s) {
        n_req = asprintf(&req,
                         "%s %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n%s%s"
                         "Content-Length: %zu\r\n\r\n",
                         method, path, port, body ? "Content-Type: application/json\r\n" : "",
                         headers ? headers : "", n_body);
        if (n_req < 0) s = dsc_error(DSC_ERR_NOMEM, "client request");
    }
    for (int part = 0; !s && part < 2; part++) {
        const char *p = part == 0 ? req : body;
        size_t left = part == 0 ? (size_t)n_req : n_body;
        while (!s && left > 0) {
            ssize_t w = send(c->fd, p, left, MSG_NOSIGNAL);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0) s = dsc_error(DSC_ERR_IO, "client: send: %s", strerror(errno));
            if (w > 0) {
                p += w;
                left -= (size_t)w;
            }
        }
    }
    free(req);
    char *end = NULL;
    while (!s && !(end = strstr(c->in ? c->in : "", "\r\n\r\n"))) {
        s = fill(c);
        if (!s && c->eof) s = dsc_error(DSC_ERR_IO, "client: the server closed the connection before answering");
    }
    if (!s) {
        size_t n = (size_t)(end - c->in) + 4;
        c->headers = malloc(n + 1);
        if (!c->headers) s = dsc_error(DSC_ERR_NOMEM, "client headers");
    }
    if (!s) {
        size_t n = (size_t)(end - c->in) + 4;
        memcpy(c->headers, c->in, n);
        c->headers[n] = '\0';
        consume(c, n);
        if (sscanf(c->headers, "HTTP/1.%*d %d", &c->status) != 1)
            s = dsc_error(DSC_ERR_CORRUPT, "client: bad status line");
        const char *te = serve_client_header(c, "Transfer-Encoding");
        c->chunked = te && strcasestr(te, "chunked");
        const char *cl = serve_client_header(c, "Content-Length");
        if (cl && !c->chunked) c->remaining = strtoll(cl, NULL, 10);
    }
    if (s) {
        serve_client_close(c);
        return s;
    }
    *out = c;
    return NULL;
}

int serve_client_status(const serve_client *c) {
    return c->status;
}

const char *serve_client_header(const serve_client *c, const char *name) {
    size_t n = strlen(name);
    for (const char *line = strstr(c->headers, "\r\n"); line && line[2]; line = strstr(line + 2, "\r\n")) {
        const char *h = line + 2;
        if (strncasecmp(h, name, n) == 0 && h[n] == ':') {
            h += n + 1;
            while (*h == ' ')
                h++;
            const char *e = strstr(h, "\r\n");
            size_t len = e ? (size_t)(e - h) : strlen(h);
            if (len >= sizeof c->header_value) len = sizeof c->header_value - 1;
            memcpy((char *)c->header_value, h, len);
            ((char *)c->header_value)[len] = '\0';
            return c->header_value;
        }
    }
    return NULL;
}

dsc_status serve_client_body(serve_client *c, const char **body, size_t *len) {
    DSC_TRY(decode(c));
    while (!c->ended) {
        DSC_TRY(fill(c));
        DSC_TRY(decode(c));
        DSC_CHECK(!c->eof || c->ended || !c->chunked, DSC_ERR_IO, "client: the stream ended inside a chunk");
    }
    if (!c->body) DSC_TRY(add_body(c, "", 0));
    *body = c->body;
    *len = c->n_body;
    return NULL;
}

dsc_status serve_client_event(serve_client *c, const char **data) {
    *data = NULL;
    for (;;) {
        DSC_TRY(decode(c));
        char *sep = c->body ? strstr(c->body + c->event_at, "\n\n") : NULL;
        if (sep) {
            const char *e = c->body + c->event_at;
            size_t n = (size_t)(sep - e);
            free(c->event);
            c->event = malloc(n + 1);
            DSC_CHECK(c->event, DSC_ERR_NOMEM, "client event");
            size_t skip = strncmp(e, "data: ", 6) == 0 ? 6 : 0;
            memcpy(c->event, e + skip, n - skip);
            c->event[n - skip] = '\0';
            c->event_at += n + 2;
            *data = c->event;
            return NULL;
        }
        if (c->ended || c->eof) return NULL;
        DSC_TRY(fill(c));
    }
}

void serve_client_close(serve_client *c) {
    if (!c) return;
    if (c->fd >= 0) close(c->fd);
    free(c->headers);
    free(c->in);
    free(c->body);
    free(c->event);
    free(c);
}

dsc_status serve_client_fetch(int port, const char *method, const char *path, const char *headers,
                              const char *body, double timeout_s, int *status, char **body_out) {
    serve_client *c;
    DSC_TRY(serve_client_open(port, method, path, headers, body, timeout_s, 0, &c));
    const char *b;
    size_t n;
    dsc_status s = serve_client_body(c, &b, &n);
    if (!s) {
        *status = c->status;
        *body_out = strdup(b);
        if (!*body_out) s = dsc_error(DSC_ERR_NOMEM, "client body");
    }
    serve_client_close(c);
    return s;
}
