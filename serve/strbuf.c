/* serve_buf: append-only byte strings with a sticky out-of-memory flag;
 * serve_grow: doubling arrays. */
#include "serve/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void serve_buf_add(serve_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void serve_buf_puts(serve_buf *b, const char *s) {
    serve_buf_add(b, s, strlen(s));
}

void serve_buf_printf(serve_buf *b, const char *fmt, ...) {
    char small[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = true;
        return;
    }
    if ((size_t)n < sizeof small) {
        serve_buf_add(b, small, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    serve_buf_add(b, big, (size_t)n);
    free(big);
}

void serve_buf_free(serve_buf *b) {
    free(b->p);
    *b = (serve_buf){0};
}

bool serve_grow(void **buf, int64_t *cap, int64_t need, size_t size) {
    if (need <= *cap) return true;
    int64_t c = *cap ? *cap : 16;
    while (c < need)
        c *= 2;
    void *p = realloc(*buf, (size_t)c * size);
    if (!p) return false;
    *buf = p;
    *cap = c;
    return true;
}
